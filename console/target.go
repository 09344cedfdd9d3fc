package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// maxResultShown is the most bytes of a result row's data that the target
// page shows.
const maxResultShown = 64 << 10

// slotSeparator is the byte between a target ID and its slot's number in
// the key of a slot's row (see admin.LeaseInfo.Key).
const slotSeparator = "\x1f"

// maxKey is the longest key of a lease row, in bytes.
const maxKey = 255

// result is a target's result row as the target page shows it.
type result struct {
	Generation int64
	UpdatedAt  time.Time
	Data       string
	Size       int
	Truncated  bool
	// raw is the whole data, for the JSON view.
	raw []byte
}

// targetRows are a target's lease rows: its own, and its slots' (in the
// order of their slots).
type targetRows struct {
	Row   *row
	Slots []row
	// Held is the number of live slots.
	Held int
}

// targetView is the target page's content.
type targetView struct {
	TargetID string
	targetRows
	Result *result
	// Done is the action just done, on DoneSlot when that is not 0.
	Done     string
	DoneSlot int
	Actions  bool
	// History is the timeline of the target's own row, or of a slot's.
	History timeline
}

// Paused reports whether the target is paused: its row, or one of its
// slots' rows, is.
func (t targetRows) Paused() bool {
	if t.Row != nil && t.Row.Paused {
		return true
	}
	for _, s := range t.Slots {
		if s.Paused {
			return true
		}
	}
	return false
}

// Active reports whether the target has a lease that stop and release
// can act on: a row, its own or a slot's, not released.
func (t targetRows) Active() bool {
	if t.Row != nil && t.Row.State != string(admin.StateReleased) {
		return true
	}
	for _, s := range t.Slots {
		if s.State != string(admin.StateReleased) {
			return true
		}
	}
	return false
}

// Rowless reports whether the target has no row at all: never acquired
// nor paused, or pruned.
func (t targetRows) Rowless() bool { return t.Row == nil && len(t.Slots) == 0 }

// slot is the row of slot n, or nil.
func (t targetRows) slot(n int) *row {
	for i := range t.Slots {
		if t.Slots[i].Slot == n {
			return &t.Slots[i]
		}
	}
	return nil
}

// mismatch says why the action name (on slot, when not 0) does not match
// the target's state, or "": a pause of a paused target, a resume of one
// not paused, a stop or release with no lease to act on.
func (t targetRows) mismatch(name string, slot int) string {
	switch name {
	case "pause":
		if t.Paused() {
			return "it is paused already"
		}
	case "resume":
		if !t.Paused() {
			return "it is not paused"
		}
	case "stop", "release":
		if slot > 0 {
			if s := t.slot(slot); s == nil || s.State == string(admin.StateReleased) {
				return fmt.Sprintf("slot %d has no live lease to %s: released, or never acquired", slot, name)
			}
		} else if !t.Active() {
			return "it has no live lease to " + name + ": released, or never acquired"
		}
	}
	return ""
}

// needsConfirm reports whether the action name takes a confirmation
// first: a stop or a release always does, and a pause of a target
// without a row, which creates one.
func (t targetRows) needsConfirm(name string) bool {
	return name == "stop" || name == "release" || name == "pause" && t.Rowless()
}

// confirmed is the row that a confirmation names (the target's own, or
// slot's), or nil for the rows of a whole semaphore: a target with slot
// rows, whose own row, when a pause made one, holds no lease.
func (t targetRows) confirmed(slot int) *row {
	if slot > 0 {
		return t.slot(slot)
	}
	if len(t.Slots) > 0 {
		return nil
	}
	return t.Row
}

// changed says how the row that the confirmation named (generation, the
// form field) has changed since, or "".
func (t targetRows) changed(slot int, generation string) string {
	r := t.confirmed(slot)
	if r == nil {
		return "the lease row that the confirmation named is gone"
	}
	if g := strconv.FormatInt(r.Generation, 10); g != generation {
		return fmt.Sprintf("the lease changed since the confirmation of generation %s: it is now generation %s, held by %q", generation, g, r.Holder)
	}
	return ""
}

// targetPage serves a target's page: its row, its slots' rows and its
// result row, and the action form when the console has an authorizer.
func (h *handler) targetPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		h.fail(w, r, http.StatusBadRequest, "give the target: target?id=TARGET")
		return
	}
	if problem := checkTarget(id); problem != "" {
		h.fail(w, r, http.StatusBadRequest, problem)
		return
	}
	v := targetView{TargetID: id, Actions: h.authorize != nil, History: timeline{TargetID: id}}
	if problem := parseTimeline(r.URL.Query(), &v.History); problem != "" {
		h.fail(w, r, http.StatusBadRequest, problem)
		return
	}
	if done := r.URL.Query().Get("done"); isAction(done) {
		v.Done = done
		v.DoneSlot, _ = parseSlot(done, r.URL.Query().Get("slot"))
	}
	ctx, cancel := dbContext(r)
	defer cancel()
	err := h.readTarget(ctx, &v)
	switch {
	case errors.Is(err, gormlease.ErrInvalidArgument):
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		h.logger.Error("console: read target", "target", id, "err", err)
		h.fail(w, r, http.StatusInternalServerError, "could not read the target: "+err.Error())
		return
	}
	// The history is read after the rows, whose current generation it
	// marks; its errors are the section's own, and the rest of the page is
	// shown.
	v.History.row = v.Row
	if v.History.Slot > 0 {
		v.History.row = v.slot(v.History.Slot)
	}
	for _, s := range v.Slots {
		v.History.Slots = append(v.History.Slots, s.Slot)
	}
	h.readTimeline(ctx, &v.History)
	status := http.StatusOK
	if v.Rowless() && v.Result == nil && len(v.History.Events) == 0 {
		status = http.StatusNotFound
	}
	if wantsJSON(r) {
		h.writeJSON(w, status, v.json())
		return
	}
	h.render(w, status, targetTmpl, id, true, v)
}

// readRows reads id's own row and its slots' rows.
func (h *handler) readRows(ctx context.Context, id string) (targetRows, error) {
	// The target's own row is the first under it as a prefix; its slots'
	// rows follow, under the target and the separator.
	var t targetRows
	page, err := h.op.List(ctx, admin.ListOptions{Prefix: id, Limit: 1})
	if err != nil {
		return t, err
	}
	if len(page) == 1 && page[0].Key == id {
		rw := newRow(page[0])
		t.Row = &rw
	}
	if len(id)+len(slotSeparator) > maxKey {
		return t, nil // too long to have slots: a slot's key would not fit
	}
	slots, err := h.op.List(ctx, admin.ListOptions{Prefix: id + slotSeparator, Limit: gormlease.MaxSlots})
	if err != nil {
		return t, err
	}
	for _, li := range slots {
		if li.Slot > 0 && li.TargetID == id {
			t.Slots = append(t.Slots, newRow(li))
			if li.State == admin.StateLive {
				t.Held++
			}
		}
	}
	sort.Slice(t.Slots, func(i, j int) bool { return t.Slots[i].Slot < t.Slots[j].Slot })
	return t, nil
}

// readTarget reads v.TargetID's row, slots and result into v.
func (h *handler) readTarget(ctx context.Context, v *targetView) error {
	var err error
	if v.targetRows, err = h.readRows(ctx, v.TargetID); err != nil {
		return err
	}
	_, res, err := gormlease.LoadJSON[json.RawMessage](ctx, h.db, v.TargetID, h.tables...)
	switch {
	case errors.Is(err, gormlease.ErrNoResult):
		return nil
	case err != nil && res.TargetID == "": // a decode error still returns the row
		return err
	}
	v.Result = &result{Generation: res.Generation, UpdatedAt: res.UpdatedAt, Size: len(res.Data), raw: res.Data}
	data := res.Data
	if len(data) > maxResultShown {
		data, v.Result.Truncated = data[:maxResultShown], true
	}
	if utf8.Valid(data) || v.Result.Truncated {
		v.Result.Data = string(data)
	} else {
		v.Result.Data = fmt.Sprintf("(%d bytes that are not UTF-8 text)", len(data))
	}
	return nil
}

var targetTmpl = mustPage(timelineTmpl + `{{define "content"}}
<h1>Target <code id="target">{{.TargetID}}</code></h1>
{{if .Done}}<p class="note" id="done">{{.Done}}{{if .DoneSlot}} slot {{.DoneSlot}}{{end}}: done.</p>{{end}}
{{if .Row}}{{with .Row}}
<h2>Lease row</h2>
<dl id="row">
<dt>State</dt><dd>{{template "state" .}}</dd>
{{if .Paused}}<dt>Pause reason</dt><dd id="pause-reason">{{.PauseReason}}</dd>
<dt>Paused by</dt><dd id="paused-by">{{or .PausedBy "–"}}</dd>{{end}}
{{if .StopRequested}}<dt>Stop reason</dt><dd>{{.StopReason}}</dd>
<dt>Stop asked by</dt><dd id="stop-by">{{or .StopBy "–"}}</dd>{{end}}
<dt>Holder</dt><dd>{{.Holder}}</dd>
<dt>Held since</dt><dd id="held-since">{{if .Held}}{{stamp .AcquiredAt}} (held for {{duration .HeldFor}}){{else if .AcquiredAt}}<span class="muted">acquired {{stamp .AcquiredAt}}, released since</span>{{else}}<span class="muted">–</span>{{end}}</dd>
<dt>Generation</dt><dd>{{.Generation}}</dd>
<dt>Token</dt><dd><code>{{.Token}}</code></dd>
<dt>Heartbeat</dt><dd>{{template "heartbeat" .}}</dd>
<dt>Expires in</dt><dd>{{.Expires}}</dd>
<dt>Updated at</dt><dd>{{stamp .UpdatedAt}}</dd>
<dt>Released at</dt><dd>{{if .ReleasedAt}}{{stamp .ReleasedAt}}{{else}}–{{end}}</dd>
<dt>Last save or failure</dt><dd>{{template "outcome" .}}</dd>
</dl>{{end}}
{{else if not .Slots}}<p class="muted">No lease row for this target: never acquired, or pruned.</p>{{end}}
{{if .Slots}}
<h2>Slots: {{len .Slots}} rows, {{.Held}} held</h2>
<div class="scroll"><table id="slots"><thead><tr><th>Slot</th><th>State</th><th>Holder</th><th>Held for</th><th>Generation</th><th>Heartbeat age / timeout</th><th>Expires in</th><th>Last save or failure</th>{{if $.Actions}}<th>Actions on this slot</th>{{end}}</tr></thead>
<tbody>{{range .Slots}}<tr>
<td class="num">{{.Slot}}</td><td>{{template "state" .}}</td><td>{{.Holder}}</td><td>{{template "held" .}}</td><td class="num">{{.Generation}}</td>
<td>{{template "heartbeat" .}}</td><td>{{.Expires}}</td><td>{{template "outcome" .}}</td>
{{- if $.Actions}}<td>{{if ne .State "released"}}<form class="act slot" id="slot-{{.Slot}}" method="post" action="stop">
<input type="hidden" name="target" value="{{$.TargetID}}"><input type="hidden" name="slot" value="{{.Slot}}">
<input name="reason" required maxlength="255" placeholder="why" aria-label="reason for slot {{.Slot}}">
<button type="submit" formaction="stop" id="stop-slot-{{.Slot}}">Stop…</button>
<button type="submit" formaction="release" id="release-slot-{{.Slot}}" class="danger">Release…</button>
</form>{{else}}–{{end}}</td>{{end}}
</tr>{{end}}</tbody></table></div>
{{end}}
<h2>Result row</h2>
{{with .Result}}<p>Generation {{.Generation}}, saved {{stamp .UpdatedAt}}, {{.Size}} bytes{{if .Truncated}} (the first 64 KiB shown){{end}}.</p>
<pre id="result">{{.Data}}</pre>{{else}}<p class="muted">None saved (gormlease.SaveJSON writes it).</p>{{end}}
{{if .Actions}}
<h2>Actions</h2>
<form class="act" id="actions" method="post" action="pause">
<input type="hidden" name="target" value="{{.TargetID}}">
<label>Reason <input name="reason" required maxlength="255" placeholder="why, for the log and the row"></label>
{{if .Paused}}<button type="submit" formaction="resume" id="resume" formnovalidate>Resume</button>
{{- else}}<button type="submit" formaction="pause" id="pause">Pause{{if .Rowless}}…{{end}}</button>{{end}}
{{if .Active}}<button type="submit" formaction="stop" id="stop">Ask the holder to stop…</button>
<button type="submit" formaction="release" id="release" class="danger">Release by force…</button>{{end}}
</form>
<p class="muted">Pause: no new run starts until resumed; a run in progress goes on.{{if .Rowless}} This target has no row: pausing it creates one (you are asked to confirm).{{end}}
{{if .Active}}Stop: the holder stops at its next heartbeat, saving nothing.
Release by force: the lease ends now, fenced; its holder learns at its next heartbeat. Both ask you to confirm.{{else}}No lease to stop or release: {{if .Rowless}}never acquired{{else}}released{{end}}.{{end}}
{{if .Slots}}On this target, stop and release act on every slot; a slot's own buttons, in the table above, act on that slot only.{{end}}</p>
{{end}}
{{template "timeline" .History}}
{{end}}`)
