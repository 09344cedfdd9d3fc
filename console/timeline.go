package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// historyPage is the most events that the target page shows at a time:
// it reads one more, to know whether there are older ones.
const historyPage = 100

// timeline is the target page's history of one of the target's rows (its
// own, or a slot's): its events, newest first, grouped by generation.
type timeline struct {
	TargetID string
	// Slot is the row whose history it is: 0 for the target's own row,
	// else that slot's.
	Slot int
	// Slots are the target's slots, whose histories the page links to.
	Slots []int
	// Kept is false when the lease table keeps no history
	// (admin.ErrNoHistory); Err is the history's read error, "" for none.
	Kept bool
	Err  string
	// Before is the page's ?before= (0: the newest events); Older is the
	// ?before= of the next, older page (0: none).
	Before, Older int64
	// Events are the events shown, newest first; Entries are the same
	// events as the page shows them.
	Events  []admin.Event
	Entries []entry
	// row is the row whose history it is, when it has one: it tells a
	// generation that has not ended whether it is held now.
	row *row
}

// entry is one item of the timeline: a generation, or an operator's
// action (a pause, a resume, a stop request) outside any generation.
type entry struct {
	Gen    *generation
	Action *admin.Event
}

// generation is the timeline's entry of one generation: how it began,
// its saves, the operator's actions while it was held, and how it ended.
type generation struct {
	Generation int64
	Holder     string
	// Began and Ended are its acquired and ended events, nil when they
	// are not on the page (before the history kept, on an older page) or,
	// for Ended, when it has not ended.
	Began, Ended *admin.Event
	// Saves are its saves that kept the lease (gormlease's Save,
	// CommitIfOwner); LastSave is when the newest was.
	Saves    int
	LastSave time.Time
	// During are the operator's actions while it was held, newest first.
	During []admin.Event
	// Now is the row's state when the generation is the row's current one
	// and has not ended ("live" or "expired"), else "".
	Now string
	// heldNow is how long it has been held, when Now is "live".
	heldNow time.Duration
	// Seq is the position in the history of its newest event on the page.
	Seq int64
}

// HeldFor is how long the generation was held, and whether that is known:
// from its acquisition to its end, or to now while it is held.
func (g *generation) HeldFor() (time.Duration, bool) {
	switch {
	case g.Ended != nil && g.Ended.AcquiredAt != nil:
		return g.Ended.HeldFor(), true
	case g.Ended != nil && g.Began != nil:
		return g.Ended.At.Sub(g.Began.At), true
	case g.Now == string(admin.StateLive):
		return g.heldNow, true
	}
	return 0, false
}

// Held writes HeldFor for the page.
func (g *generation) Held() string {
	d, ok := g.HeldFor()
	switch {
	case !ok:
		return ""
	case g.Now == string(admin.StateLive):
		return "held " + duration(d) + " so far"
	}
	return "held " + duration(d)
}

// BeganAt is when the generation began, nil when unknown.
func (g *generation) BeganAt() *time.Time {
	switch {
	case g.Began != nil:
		return &g.Began.At
	case g.Ended != nil:
		return g.Ended.AcquiredAt
	}
	return nil
}

// HowBegan says how the generation began: from a new row, a released
// one, an expired lease or a live one (seized), with the generation
// before.
func (g *generation) HowBegan() string {
	if g.Began == nil {
		return "not in the history shown"
	}
	return began(g.Began.How, g.Began.FromGeneration)
}

// began says how a generation began, from an acquired event's how and
// from generation.
func began(how string, from int64) string {
	switch how {
	case admin.HowNew:
		return "new"
	case admin.HowReleased:
		return fmt.Sprintf("released from gen %d", from)
	case admin.HowExpired:
		return fmt.Sprintf("expired from gen %d", from)
	case admin.HowSeized:
		return fmt.Sprintf("seized from gen %d (its lease was live)", from)
	}
	if from > 0 {
		return fmt.Sprintf("%s from gen %d", how, from)
	}
	return how
}

// HowEnded says how the generation ended, without the failure's text or
// the operator, which the page shows after it; "" when it has not ended.
func (g *generation) HowEnded() string {
	if g.Ended == nil {
		return ""
	}
	return ended(g.Ended.How)
}

// ended says what an ended event's how means.
func ended(how string) string {
	switch how {
	case admin.HowSaved:
		return "saved"
	case admin.HowReleased:
		return "released, nothing saved"
	case admin.HowFailed:
		return "failed"
	case admin.HowSaveFailed:
		return "its save failed"
	case admin.HowLost:
		return "lost its lease"
	case admin.HowStopped:
		return "stopped on request"
	case admin.HowMaxHold:
		return "stopped at its maximum hold"
	case admin.HowPanic:
		return "the work or the saver panicked"
	case admin.HowCancelled:
		return "cancelled by its caller"
	case admin.HowForced:
		return "released by force"
	case admin.HowExpired:
		return "expired, taken over"
	case admin.HowSeized:
		return "seized while live"
	case "":
		return "ended"
	}
	return how
}

// EndDetail is the text that the page shows after how the generation
// ended: the failure's text, or none for a release by force whose text
// only repeats what the page says ("released by force by operator
// NAME").
func (g *generation) EndDetail() string {
	if g.Ended == nil {
		return ""
	}
	if g.Ended.How == admin.HowForced && strings.HasPrefix(g.Ended.Detail, "released by force") {
		return ""
	}
	return g.Ended.Detail
}

// Outcome is the class of the generation's end, for its colour: "good"
// (saved, released, stopped on request, cancelled by its caller), "bad" (a failure, a loss, a takeover, by force),
// "open" (not ended).
func (g *generation) Outcome() string {
	if g.Ended == nil {
		return "open"
	}
	switch g.Ended.How {
	case admin.HowSaved, admin.HowReleased, admin.HowStopped, admin.HowCancelled:
		return "good"
	}
	return "bad"
}

// operatorAct says what an operator's action was.
func operatorAct(e admin.Event) string {
	switch e.Kind {
	case admin.EventPaused:
		return "paused"
	case admin.EventResumed:
		return "resumed"
	case admin.EventStopRequested:
		return "stop requested"
	}
	return string(e.Kind)
}

// readTimeline reads the page's events of the row that t names (t.Slot,
// before t.Before) and groups them into t.Entries. It reads one page of
// events, whatever the history's length. A table that keeps no history
// leaves t.Kept false; another error is t.Err, logged: either way the
// rest of the target page is shown.
func (h *handler) readTimeline(ctx context.Context, t *timeline) {
	evs, err := h.op.History(ctx, t.TargetID, admin.HistoryOptions{Slot: t.Slot, Before: t.Before, Limit: historyPage + 1})
	switch {
	case errors.Is(err, admin.ErrNoHistory):
		return
	case err != nil:
		t.Kept = true
		h.logger.Error("console: read history", "target", t.TargetID, "slot", t.Slot, "err", err)
		t.Err = "could not read the history: " + err.Error()
		return
	}
	t.Kept = true
	t.Events, t.Older = pageOf(evs)
	t.Entries = group(t.Events, t.row)
}

// pageOf is the events that a page shows of evs, the newest first, read
// with a limit of historyPage+1, and the ?before= of the older page (0
// when there is none). When there are older events, the page ends at
// the oldest generation that begins on it: the events before, which the
// older page shows, would be a generation cut in two. A page on which no
// generation begins (one with more events than a page) is shown whole.
func pageOf(evs []admin.Event) ([]admin.Event, int64) {
	if len(evs) <= historyPage {
		return evs, 0
	}
	evs = evs[:historyPage]
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == admin.EventAcquired {
			evs = evs[:i+1]
			break
		}
	}
	return evs, evs[len(evs)-1].Seq
}

// group makes the timeline's entries of evs (newest first): one entry
// per generation, with its beginning, saves, end and the operator's
// actions while it was held, and one for each operator's action between
// generations; newest first. cur is the row whose history it is, when it
// has one: its current generation, not ended, is marked as held or
// expired now.
func group(evs []admin.Event, cur *row) []entry {
	var out []entry
	var open *generation // the generation that began and has not ended yet
	start := func(e admin.Event) *generation {
		g := &generation{Generation: e.Generation, Holder: e.Holder, Seq: e.Seq}
		out = append(out, entry{Gen: g})
		return g
	}
	for i := len(evs) - 1; i >= 0; i-- { // oldest first
		e := evs[i]
		if open != nil && open.Generation != e.Generation && e.Kind != admin.EventPaused && e.Kind != admin.EventResumed {
			open = nil // its end is not in the history
		}
		if open != nil {
			open.Seq = e.Seq
		}
		switch e.Kind {
		case admin.EventAcquired:
			open = start(e)
			open.Began = &evs[i]
		case admin.EventSaved:
			if open == nil {
				open = start(e)
			}
			open.Saves++
			open.LastSave = e.At
		case admin.EventEnded:
			g := open
			if g == nil {
				g = start(e)
			}
			g.Ended = &evs[i]
			if g.Holder == "" {
				g.Holder = e.Holder
			}
			open = nil
		default: // an operator's action
			if open != nil {
				open.During = append(open.During, e)
			} else {
				out = append(out, entry{Action: &evs[i]})
			}
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	for _, en := range out {
		if g := en.Gen; g != nil {
			for i, j := 0, len(g.During)-1; i < j; i, j = i+1, j-1 {
				g.During[i], g.During[j] = g.During[j], g.During[i]
			}
		}
	}
	if cur != nil && len(out) > 0 {
		if g := out[0].Gen; g != nil && g.Ended == nil && g.Generation == cur.Generation && cur.State != string(admin.StateReleased) {
			g.Now = cur.State
			if cur.Held() {
				g.heldNow = cur.HeldFor
			}
		}
	}
	return out
}

// link is the target page's link to the timeline of slot (0: the
// target's own row), before seq (0: the newest).
func (t timeline) link(slot int, before int64) template.URL {
	link := "target?id=" + url.QueryEscape(t.TargetID)
	if slot > 0 {
		link += "&history=" + strconv.Itoa(slot)
	}
	if before > 0 {
		link += "&before=" + strconv.FormatInt(before, 10)
	}
	return template.URL(link + "#timeline")
}

// OlderLink is the link to the older page.
func (t timeline) OlderLink() template.URL { return t.link(t.Slot, t.Older) }

// NewestLink is the link to the newest page.
func (t timeline) NewestLink() template.URL { return t.link(t.Slot, 0) }

// SlotLink is the link to the timeline of slot (0: the target's own row).
func (t timeline) SlotLink(slot int) template.URL { return t.link(slot, 0) }

// parseTimeline reads the target page's ?history= (a slot's number, or
// none for the target's own row) and ?before= (a position in the
// history) into t, and says what is wrong with them, or "".
func parseTimeline(q url.Values, t *timeline) string {
	if s := q.Get("history"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > gormlease.MaxSlots {
			return fmt.Sprintf("history %q: give a slot's number, from 1 to %d, or leave it out for the target's own row", s, gormlease.MaxSlots)
		}
		t.Slot = n
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return fmt.Sprintf("before %q: give a position in the history (a positive number, as the older link has), or leave it out for the newest events", s)
		}
		t.Before = n
	}
	return ""
}

// timelineTmpl is the target page's history section; it is given a
// timeline.
const timelineTmpl = `{{define "timeline"}}
<h2 id="timeline-head">History{{if .Slot}} of slot {{.Slot}}{{end}}</h2>
{{if .Slots}}<p class="muted" id="history-rows">Histories: {{if .Slot}}<a href="{{.SlotLink 0}}">the target's own row</a>{{else}}<b>the target's own row</b>{{end}}
{{- range .Slots}} · {{if eq . $.Slot}}<b>slot {{.}}</b>{{else}}<a href="{{$.SlotLink .}}">slot {{.}}</a>{{end}}{{end}}</p>{{end}}
{{if not .Kept}}<p class="muted" id="no-history">This lease table keeps no history: turn it on with <code>gormlease.AutoMigrate(ctx, db, gormlease.WithHistory())</code> or <code>gormlease migrate -history</code>.</p>
{{- else if .Err}}<p class="error" id="history-error">{{.Err}}</p>
{{- else}}{{if .Before}}<p><a id="newest" href="{{.NewestLink}}">← Newest events</a></p>{{end}}
<ol id="timeline">{{range .Entries}}{{with .Gen}}
<li class="gen {{.Outcome}}" data-generation="{{.Generation}}" data-seq="{{.Seq}}">
<div><b>Generation {{.Generation}}</b> · <span class="holder">{{or .Holder "–"}}</span>{{with .Held}} · <span class="held">{{.}}</span>{{end}}</div>
<div class="began">Began{{with .BeganAt}} {{stamp .}}{{end}}: {{.HowBegan}}</div>
{{if .Saves}}<div class="saves">Saved {{.Saves}} {{if eq .Saves 1}}time{{else}}times{{end}} keeping the lease, the last {{stamp .LastSave}}</div>{{end}}
{{if .Ended}}{{$detail := .EndDetail}}{{with .Ended}}<div class="ended">Ended {{stamp .At}}: <span class="how">{{ended .How}}</span>{{if .Operator}} by <span class="operator">{{.Operator}}</span>{{end}}{{with $detail}}: <q class="detail">{{.}}</q>{{end}}</div>{{end}}
{{- else}}<div class="ended muted">{{if eq .Now "live"}}Held now{{else if eq .Now "expired"}}Not ended: its lease expired (the holder stopped renewing){{else}}End not in the history shown{{end}}</div>{{end}}
{{if .During}}<ul class="during">{{range .During}}<li>{{template "event" .}}</li>{{end}}</ul>{{end}}
</li>{{else}}{{with .Action}}
<li class="op">{{template "event" .}}</li>{{end}}{{end}}
{{else}}<li class="muted">No events{{if .Before}} before this point{{end}}.</li>
{{end}}</ol>
{{if .Older}}<p><a id="older" href="{{.OlderLink}}">Older events →</a></p>{{end}}
{{- end}}
{{end}}
{{define "event"}}<span class="act-{{.Kind}}" data-seq="{{.Seq}}">{{stamp .At}}: <b>{{act .}}</b>{{if .Operator}} by <span class="operator">{{.Operator}}</span>{{end}}{{if .Detail}}: <q class="detail">{{.Detail}}</q>{{end}} <span class="muted">(gen {{.Generation}})</span></span>{{end}}`
