package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
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

// result is a target's result row as the target page shows it.
type result struct {
	Generation int64
	UpdatedAt  time.Time
	Data       string
	Size       int
	Truncated  bool
}

// targetView is the target page's content.
type targetView struct {
	TargetID string
	Row      *row
	Slots    []row
	Held     int
	Result   *result
	// Done is the action just done, on DoneSlot when that is not 0.
	Done     string
	DoneSlot int
	Actions  bool
}

// targetPage serves a target's page: its row, its slots' rows and its
// result row, and the action form when the console has an authorizer.
func (h *handler) targetPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		h.fail(w, r, http.StatusBadRequest, "give the target: target?id=TARGET")
		return
	}
	v := targetView{TargetID: id, Actions: h.authorize != nil}
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
	status := http.StatusOK
	if v.Row == nil && len(v.Slots) == 0 && v.Result == nil {
		status = http.StatusNotFound
	}
	h.render(w, status, targetTmpl, id, true, v)
}

// readTarget reads v.TargetID's row, slots and result into v.
func (h *handler) readTarget(ctx context.Context, v *targetView) error {
	// The target's own row is the first under it as a prefix; its slots'
	// rows follow, under the target and the separator.
	page, err := h.op.List(ctx, admin.ListOptions{Prefix: v.TargetID, Limit: 1})
	if err != nil {
		return err
	}
	if len(page) == 1 && page[0].Key == v.TargetID {
		rw := newRow(page[0])
		v.Row = &rw
	}
	slots, err := h.op.List(ctx, admin.ListOptions{Prefix: v.TargetID + slotSeparator, Limit: gormlease.MaxSlots})
	if err != nil {
		return err
	}
	for _, li := range slots {
		if li.Slot > 0 && li.TargetID == v.TargetID {
			v.Slots = append(v.Slots, newRow(li))
			if li.State == admin.StateLive {
				v.Held++
			}
		}
	}
	sort.Slice(v.Slots, func(i, j int) bool { return v.Slots[i].Slot < v.Slots[j].Slot })
	_, res, err := gormlease.LoadJSON[json.RawMessage](ctx, h.db, v.TargetID, h.tables...)
	switch {
	case errors.Is(err, gormlease.ErrNoResult):
		return nil
	case err != nil && res.TargetID == "": // a decode error still returns the row
		return err
	}
	v.Result = &result{Generation: res.Generation, UpdatedAt: res.UpdatedAt, Size: len(res.Data)}
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

var targetTmpl = mustPage(`{{define "content"}}
<h1>Target <code id="target">{{.TargetID}}</code></h1>
{{if .Done}}<p class="note" id="done">{{.Done}}{{if .DoneSlot}} slot {{.DoneSlot}}{{end}}: done.</p>{{end}}
{{if .Row}}{{with .Row}}
<h2>Lease row</h2>
<dl id="row">
<dt>State</dt><dd>{{template "state" .}}</dd>
{{if .Paused}}<dt>Pause reason</dt><dd id="pause-reason">{{.PauseReason}}</dd>{{end}}
{{if .StopRequested}}<dt>Stop reason</dt><dd>{{.StopReason}}</dd>{{end}}
<dt>Holder</dt><dd>{{.Holder}}</dd>
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
<table id="slots"><thead><tr><th>Slot</th><th>State</th><th>Holder</th><th>Generation</th><th>Heartbeat age / timeout</th><th>Expires in</th><th>Last save or failure</th>{{if $.Actions}}<th>Actions on this slot</th>{{end}}</tr></thead>
<tbody>{{range .Slots}}<tr>
<td class="num">{{.Slot}}</td><td>{{template "state" .}}</td><td>{{.Holder}}</td><td class="num">{{.Generation}}</td>
<td>{{template "heartbeat" .}}</td><td>{{.Expires}}</td><td>{{template "outcome" .}}</td>
{{- if $.Actions}}<td>{{if ne .State "released"}}<form class="act slot" id="slot-{{.Slot}}" method="post" action="stop">
<input type="hidden" name="target" value="{{$.TargetID}}"><input type="hidden" name="slot" value="{{.Slot}}">
<input name="reason" required maxlength="255" placeholder="why" aria-label="reason for slot {{.Slot}}">
<button type="submit" formaction="stop" id="stop-slot-{{.Slot}}">Stop</button>
<button type="submit" formaction="release" id="release-slot-{{.Slot}}">Release</button>
</form>{{else}}–{{end}}</td>{{end}}
</tr>{{end}}</tbody></table>
{{end}}
<h2>Result row</h2>
{{with .Result}}<p>Generation {{.Generation}}, saved {{stamp .UpdatedAt}}, {{.Size}} bytes{{if .Truncated}} (the first 64 KiB shown){{end}}.</p>
<pre id="result">{{.Data}}</pre>{{else}}<p class="muted">None saved (gormlease.SaveJSON writes it).</p>{{end}}
{{if .Actions}}
<h2>Actions</h2>
<form class="act" id="actions" method="post" action="pause">
<input type="hidden" name="target" value="{{.TargetID}}">
<label>Reason <input name="reason" required maxlength="255" placeholder="why, for the log and the row"></label>
<button type="submit" formaction="pause" id="pause">Pause</button>
<button type="submit" formaction="resume" id="resume" formnovalidate>Resume</button>
<button type="submit" formaction="stop" id="stop">Ask the holder to stop</button>
<button type="submit" formaction="release" id="release">Release by force</button>
</form>
<p class="muted">Pause: no new run starts until resumed; a run in progress goes on. Stop: the holder stops at its next heartbeat, saving nothing.
Release by force: the lease ends now, fenced; its holder learns at its next heartbeat.
{{if .Slots}}On this target, stop and release act on every slot; a slot's own buttons, in the table above, act on that slot only.{{end}}</p>
{{end}}
{{end}}`)
