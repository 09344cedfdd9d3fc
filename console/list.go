package console

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

const (
	// defaultPage is the rows a list page shows without ?limit.
	defaultPage = 200
	// maxPage is the largest ?limit.
	maxPage = 1000
)

// row is one lease row as the pages show it.
type row struct {
	Key, TargetID string
	// Cursor is the row's place in the list's order, for ?after.
	Cursor        string
	Slot          int
	State         string
	Paused        bool
	PauseReason   string
	PausedBy      string
	StopRequested bool
	StopReason    string
	StopBy        string
	MinHold       bool
	Holder        string
	Generation    int64
	Token         string
	Age           time.Duration
	// Timeout is the recorded timeout; HasTimeout is false for a row
	// that records none.
	Timeout    time.Duration
	HasTimeout bool
	ExpiresIn  time.Duration
	// AcquiredAt is when the current generation was acquired, nil when
	// the row does not record it; HeldFor is the time since, for a lease
	// not released.
	AcquiredAt *time.Time
	HeldFor    time.Duration
	UpdatedAt  time.Time
	ReleasedAt *time.Time
	SavedGen   *int64
	SavedAt    *time.Time
	Failure    *string
}

// Heartbeat says whether the row's heartbeat age is measured against a
// timeout: a lease not released, whose timeout is recorded.
func (r row) Heartbeat() bool { return r.HasTimeout && r.State != string(admin.StateReleased) }

// AgeSeconds and the rest are the heartbeat meter's values, in seconds.
func (r row) AgeSeconds() float64 { return r.Age.Seconds() }

// TimeoutSeconds is the meter's maximum.
func (r row) TimeoutSeconds() float64 { return r.Timeout.Seconds() }

// LowSeconds is where the meter turns from fresh to ageing: half the
// timeout.
func (r row) LowSeconds() float64 { return r.Timeout.Seconds() / 2 }

// HighSeconds is where it turns to about to expire.
func (r row) HighSeconds() float64 { return r.Timeout.Seconds() * 0.8 }

// Expires writes how long the lease lives without another heartbeat.
func (r row) Expires() string {
	switch {
	case r.State == string(admin.StateReleased):
		return "–"
	case !r.HasTimeout:
		return "unknown"
	case r.ExpiresIn < 0:
		return "expired " + duration(-r.ExpiresIn) + " ago"
	case r.MinHold:
		return "hold ends in " + duration(r.ExpiresIn)
	}
	return duration(r.ExpiresIn)
}

// Held says whether the row's holding time is known: a lease not
// released whose acquisition the row records.
func (r row) Held() bool { return r.AcquiredAt != nil && r.State != string(admin.StateReleased) }

func newRow(li admin.LeaseInfo) row {
	return row{
		Key: li.Key, TargetID: li.TargetID, Cursor: li.Cursor, Slot: li.Slot, State: string(li.State), MinHold: li.MinHold,
		Paused: li.Paused, PauseReason: li.PauseReason, PausedBy: li.PausedBy,
		StopRequested: li.StopRequested, StopReason: li.StopReason, StopBy: li.StopBy,
		Holder: li.Row.Holder, Generation: li.Row.Generation, Token: li.Row.LeaseToken.String(), Age: li.Age,
		Timeout: li.Timeout, HasTimeout: li.Row.TimeoutMS != nil, ExpiresIn: li.ExpiresIn,
		AcquiredAt: li.Row.AcquiredAt, HeldFor: li.HeldFor,
		UpdatedAt: li.Row.UpdatedAt, ReleasedAt: li.Row.ReleasedAt,
		SavedGen: li.Row.SavedGeneration, SavedAt: li.Row.SavedAt, Failure: li.Row.Failure,
	}
}

// listView is the list page's content.
type listView struct {
	Prefix, State, Order, Holder string
	States                       []string
	Orders                       []orderChoice
	Limit                        int
	Counts                       admin.Counts
	Rows                         []row
	// Next is the link to the next page, "" on the last: its query is
	// made by url.Values.Encode, so the template can take it as it is.
	Next    template.URL
	Actions bool
}

// Filtered reports whether a filter is set.
func (v listView) Filtered() bool {
	return v.Prefix != "" || v.State != "" || v.Holder != "" || v.Order != ""
}

// Link is the list's link with state set to state (and the page's other
// filters, but not its place): the links of the counts.
func (v listView) Link(state string) template.URL {
	return v.link(map[string]string{"state": state})
}

// ExpiredLink is the link to the expired rows, the longest expired first.
func (v listView) ExpiredLink() template.URL {
	return v.link(map[string]string{"state": string(admin.StateExpired), "order": string(admin.OrderExpiry)})
}

// link is the list's link with the page's filters, and set over them.
func (v listView) link(set map[string]string) template.URL {
	q := url.Values{}
	for k, val := range map[string]string{"prefix": v.Prefix, "state": v.State, "order": v.Order, "holder": v.Holder} {
		if val != "" {
			q.Set(k, val)
		}
	}
	for k, val := range set {
		if val == "" {
			q.Del(k)
		} else {
			q.Set(k, val)
		}
	}
	if v.Limit != defaultPage {
		q.Set("limit", strconv.Itoa(v.Limit))
	}
	if len(q) == 0 {
		return "./"
	}
	return template.URL("./?" + q.Encode())
}

// orderChoice is an order of the list's order menu.
type orderChoice struct{ Value, Label string }

// orders are the list's orders: ?order= and what the menu says.
var orders = []orderChoice{
	{"", "target"},
	{string(admin.OrderAge), "heartbeat age, oldest first"},
	{string(admin.OrderHeldSince), "held since, longest first"},
	{string(admin.OrderExpiry), "expiry, soonest first"},
}

// validOrder reports whether s is one of orders.
func validOrder(s string) bool {
	for _, o := range orders {
		if s == o.Value {
			return true
		}
	}
	return false
}

// listPage serves the list of lease rows: ?prefix, ?state, ?holder,
// ?order, ?after and ?limit choose them, a page at a time, with the
// counts of the rows under the prefix in each state.
func (h *handler) listPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := listView{Prefix: q.Get("prefix"), State: q.Get("state"), Order: q.Get("order"), Holder: q.Get("holder"),
		States: states, Orders: orders, Limit: defaultPage, Actions: h.authorize != nil}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPage {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("limit %q: give 1 to %d rows per page", s, maxPage))
			return
		}
		v.Limit = n
	}
	if v.Order == "key" {
		v.Order = ""
	}
	switch {
	case !validState(v.State):
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("state %q: give one of live, expired, released, paused, or none", v.State))
		return
	case !validOrder(v.Order):
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("order %q: give one of key (the default), age, held, expiry", v.Order))
		return
	}
	ctx, cancel := dbContext(r)
	defer cancel()
	// The counts and the page are two statements, read at once on two
	// connections: the page takes as long as the slower, not the sum.
	var countErr error
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		v.Counts, countErr = h.op.Count(ctx, v.Prefix)
	}()
	page, err := h.op.List(ctx, admin.ListOptions{Prefix: v.Prefix, State: admin.LeaseState(v.State), Holder: v.Holder,
		Order: admin.Order(v.Order), After: q.Get("after"), Limit: v.Limit})
	<-counted
	if err == nil {
		err = countErr
	}
	switch {
	case errors.Is(err, gormlease.ErrInvalidArgument):
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		h.logger.Error("console: list leases", "err", err)
		h.fail(w, r, http.StatusInternalServerError, "could not read the leases: "+err.Error())
		return
	}
	v.Rows = make([]row, len(page))
	for i, li := range page {
		v.Rows[i] = newRow(li)
	}
	after := ""
	if len(page) == v.Limit {
		after = page[len(page)-1].Cursor
		v.Next = v.link(map[string]string{"after": after})
	}
	if wantsJSON(r) {
		h.writeJSON(w, http.StatusOK, listJSON{Prefix: v.Prefix, State: v.State, Order: v.Order, Holder: v.Holder, Limit: v.Limit,
			Counts: countsJSON(v.Counts), Rows: jsonRows(v.Rows), Next: after})
		return
	}
	h.render(w, http.StatusOK, listTmpl, "Leases", true, v)
}

var listTmpl = mustPage(`{{define "content"}}
<h1>Leases</h1>
<p class="counts" id="counts">{{with .Counts}}<a href="{{$.Link ""}}"{{if not $.State}} class="current"{{end}}>all <b>{{.Total}}</b></a>
· <a href="{{$.Link "live"}}"{{if eq $.State "live"}} class="current"{{end}}><span class="state live">live</span> <b id="count-live">{{.Live}}</b></a>
· <a href="{{$.Link "expired"}}"{{if eq $.State "expired"}} class="current"{{end}}><span class="state expired">expired</span> <b id="count-expired">{{.Expired}}</b></a>
· <a href="{{$.Link "released"}}"{{if eq $.State "released"}} class="current"{{end}}><span class="state released">released</span> <b id="count-released">{{.Released}}</b></a>
· <a href="{{$.Link "paused"}}"{{if eq $.State "paused"}} class="current"{{end}}><span class="state paused">paused</span> <b id="count-paused">{{.Paused}}</b></a>
· <span class="state stopping">stop requested</span> <b id="count-stop">{{.StopRequested}}</b>{{end}}
{{if .Prefix}}<span class="muted">(under the prefix)</span>{{end}}</p>
{{if and .Counts.Expired (ne .State "expired")}}<p class="warn" id="expired-banner"><strong>{{.Counts.Expired}} expired</strong>:
{{if eq .Counts.Expired 1}}a holder stopped{{else}}holders stopped{{end}} renewing without releasing (a crash, a pause, a lost database); the next acquire takes each over.
<a href="{{.ExpiredLink}}">Show them, the longest expired first</a>.</p>{{end}}
<form class="filter" method="get" action="./">
<label>Target prefix <input name="prefix" value="{{.Prefix}}" size="24"></label>
<label>State <select name="state"><option value="">any</option>
{{- range .States}}<option{{if eq . $.State}} selected{{end}}>{{.}}</option>{{end}}</select></label>
<label>Holder <input name="holder" value="{{.Holder}}" size="16" placeholder="exact name"></label>
<label>Order <select name="order">
{{- range .Orders}}<option value="{{.Value}}"{{if eq .Value $.Order}} selected{{end}}>{{.Label}}</option>{{end}}</select></label>
{{if ne .Limit 200}}<input type="hidden" name="limit" value="{{.Limit}}">{{end}}
<button type="submit">Filter</button>
{{if .Filtered}}<a href="./">clear</a>{{end}}
</form>
{{if not .Actions}}<p class="muted">Read-only: this console was built without an authorizer, so it takes no actions.</p>{{end}}
<div class="scroll"><table id="leases">
<thead><tr><th>Target</th><th>State</th><th>Holder</th><th>Held for</th><th>Generation</th><th>Heartbeat age / timeout</th><th>Expires in</th><th>Slot</th><th>Last save or failure</th></tr></thead>
<tbody>
{{range .Rows}}<tr data-key="{{.Key}}">
<td><a href="target?id={{.TargetID}}">{{.TargetID}}</a></td>
<td>{{template "state" .}}</td>
<td>{{.Holder}}</td>
<td>{{template "held" .}}</td>
<td class="num">{{.Generation}}</td>
<td>{{template "heartbeat" .}}</td>
<td>{{.Expires}}</td>
<td class="num">{{if .Slot}}{{.Slot}}{{else}}–{{end}}</td>
<td>{{template "outcome" .}}</td>
</tr>
{{else}}<tr><td colspan="9" class="muted">No lease rows{{if .Filtered}} match{{end}}.</td></tr>
{{end}}</tbody></table></div>
{{if .Next}}<p><a id="next" href="{{.Next}}">Next {{.Limit}} rows →</a></p>{{end}}
{{end}}
`)

// states are the values of the list's state filter.
var states = []string{string(admin.StateLive), string(admin.StateExpired), string(admin.StateReleased), string(admin.StatePaused)}

// validState reports whether s is a state filter: one of states, or "".
func validState(s string) bool {
	if s == "" {
		return true
	}
	for _, st := range states {
		if s == st {
			return true
		}
	}
	return false
}
