package console

import (
	"context"
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
	Slot          int
	State         string
	Paused        bool
	PauseReason   string
	StopRequested bool
	StopReason    string
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

func newRow(li admin.LeaseInfo) row {
	return fillPause(row{
		Key: li.Key, TargetID: li.TargetID, Slot: li.Slot, State: string(li.State), MinHold: li.MinHold,
		Holder: li.Row.Holder, Generation: li.Row.Generation, Token: li.Row.LeaseToken.String(), Age: li.Age,
		Timeout: li.Timeout, HasTimeout: li.Row.TimeoutMS != nil, ExpiresIn: li.ExpiresIn,
		UpdatedAt: li.Row.UpdatedAt, ReleasedAt: li.Row.ReleasedAt,
		SavedGen: li.Row.SavedGeneration, SavedAt: li.Row.SavedAt, Failure: li.Row.Failure,
	}, li)
}

// listView is the list page's content.
type listView struct {
	Prefix, State string
	States        []string
	Limit         int
	Rows          []row
	// Next is the link to the next page, "" on the last: its query is
	// made by url.Values.Encode, so the template can take it as it is.
	Next    template.URL
	Actions bool
}

// listPage serves the list of lease rows: ?prefix, ?state, ?after and
// ?limit choose them, a page at a time.
func (h *handler) listPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := listView{Prefix: q.Get("prefix"), State: q.Get("state"), States: states, Limit: defaultPage, Actions: h.authorize != nil}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPage {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("limit %q: give 1 to %d rows per page", s, maxPage))
			return
		}
		v.Limit = n
	}
	if !validState(v.State) {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("state %q: give one of live, expired, released, paused, or none", v.State))
		return
	}
	ctx, cancel := dbContext(r)
	defer cancel()
	rows, after, err := h.list(ctx, v.Prefix, v.State, q.Get("after"), v.Limit)
	switch {
	case errors.Is(err, gormlease.ErrInvalidArgument):
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		h.logger.Error("console: list leases", "err", err)
		h.fail(w, r, http.StatusInternalServerError, "could not read the leases: "+err.Error())
		return
	}
	v.Rows = rows
	if after != "" {
		next := url.Values{"after": {after}}
		for k, val := range map[string]string{"prefix": v.Prefix, "state": v.State} {
			if val != "" {
				next.Set(k, val)
			}
		}
		if v.Limit != defaultPage {
			next.Set("limit", strconv.Itoa(v.Limit))
		}
		v.Next = template.URL("./?" + next.Encode())
	}
	if wantsJSON(r) {
		h.writeJSON(w, http.StatusOK, listJSON{Prefix: v.Prefix, State: v.State, Limit: v.Limit, Rows: jsonRows(rows), Next: after})
		return
	}
	h.render(w, http.StatusOK, listTmpl, "Leases", true, v)
}

var listTmpl = mustPage(`{{define "content"}}
<h1>Leases</h1>
<form class="filter" method="get" action="./">
<label>Target prefix <input name="prefix" value="{{.Prefix}}" size="30"></label>
<label>State <select name="state"><option value="">any</option>
{{- range .States}}<option{{if eq . $.State}} selected{{end}}>{{.}}</option>{{end}}</select></label>
{{if ne .Limit 200}}<input type="hidden" name="limit" value="{{.Limit}}">{{end}}
<button type="submit">Filter</button>
{{if or .Prefix .State}}<a href="./">clear</a>{{end}}
</form>
{{if not .Actions}}<p class="muted">Read-only: this console was built without an authorizer, so it takes no actions.</p>{{end}}
<div class="scroll"><table id="leases">
<thead><tr><th>Target</th><th>State</th><th>Holder</th><th>Generation</th><th>Heartbeat age / timeout</th><th>Expires in</th><th>Slot</th><th>Last save or failure</th></tr></thead>
<tbody>
{{range .Rows}}<tr data-key="{{.Key}}">
<td><a href="target?id={{.TargetID}}">{{.TargetID}}</a></td>
<td>{{template "state" .}}</td>
<td>{{.Holder}}</td>
<td class="num">{{.Generation}}</td>
<td>{{template "heartbeat" .}}</td>
<td>{{.Expires}}</td>
<td class="num">{{if .Slot}}{{.Slot}}{{else}}–{{end}}</td>
<td>{{template "outcome" .}}</td>
</tr>
{{else}}<tr><td colspan="8" class="muted">No lease rows{{if or .Prefix .State}} match{{end}}.</td></tr>
{{end}}</tbody></table></div>
{{if .Next}}<p><a id="next" href="{{.Next}}">Next {{.Limit}} rows →</a></p>{{end}}
{{end}}
`)

// paused is the state filter that keeps the paused targets' rows. A pause
// is not a state of List's (a paused row is also live, expired or
// released), so the console reads pages and keeps the paused rows.
const paused = "paused"

// states are the values of the list's state filter.
var states = []string{string(admin.StateLive), string(admin.StateExpired), string(admin.StateReleased), paused}

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

// fillPause sets r's pause and stop request from li.
func fillPause(r row, li admin.LeaseInfo) row {
	r.Paused, r.PauseReason = li.Paused, li.PauseReason
	r.StopRequested, r.StopReason = li.StopRequested, li.StopReason
	return r
}

const (
	// scanPage is the rows read at a time to find paused rows.
	scanPage = 1000
	// maxScan is the most rows one request reads to find paused rows;
	// the page then ends early, with a link to go on.
	maxScan = 20000
)

// list reads up to limit rows after the key after, and reports whether
// there may be more, and the key to go on after.
func (h *handler) list(ctx context.Context, prefix, state, after string, limit int) (rows []row, next string, err error) {
	if state != paused {
		page, err := h.op.List(ctx, admin.ListOptions{Prefix: prefix, State: admin.LeaseState(state), After: after, Limit: limit})
		if err != nil {
			return nil, "", err
		}
		for _, li := range page {
			rows = append(rows, newRow(li))
		}
		if len(page) == limit {
			next = page[len(page)-1].Key
		}
		return rows, next, nil
	}
	for scanned := 0; scanned < maxScan; {
		page, err := h.op.List(ctx, admin.ListOptions{Prefix: prefix, After: after, Limit: scanPage})
		if err != nil {
			return nil, "", err
		}
		for _, li := range page {
			if !li.Paused {
				continue
			}
			rows = append(rows, newRow(li))
			if len(rows) == limit {
				return rows, li.Key, nil
			}
		}
		if len(page) < scanPage {
			return rows, "", nil
		}
		scanned += len(page)
		after = page[len(page)-1].Key
	}
	return rows, after, nil
}
