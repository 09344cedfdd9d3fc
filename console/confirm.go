package console

import (
	"net/http"
	"strconv"
)

// confirmView is the content of the page that asks to confirm an action.
type confirmView struct {
	Action, TargetID, Reason, Operator string
	// Slot is the slot acted on, or 0 for the whole target.
	Slot int
	// Rows are the rows the action acts on, as they were read.
	Rows []row
	// Generation is the generation of the one row that the action acts
	// on, carried by the form so that the action is refused if it changed;
	// "" for the rows of a whole semaphore, or for no row.
	Generation string
	// Creates says that the action creates the target's row (a pause of
	// a target without one).
	Creates bool
}

// Button is the confirmation button's text.
func (v confirmView) Button() string {
	switch v.Action {
	case "release":
		return "Release by force"
	case "stop":
		return "Ask the holder to stop"
	}
	return "Create a paused row"
}

// Slotted reports whether the rows are slots' rows.
func (v confirmView) Slotted() bool { return len(v.Rows) > 0 && v.Rows[0].Slot > 0 }

// confirm answers an action that needs confirming with the page that asks
// for it: it names the target, and the holder and generation of each
// lease concerned, and posts the same form with confirm=1 (and the
// generation, so that a lease changed in the meantime is not acted on).
// It writes nothing.
func (h *handler) confirm(w http.ResponseWriter, name string, a act, cur targetRows) {
	v := confirmView{Action: name, TargetID: a.target, Reason: a.reason, Operator: a.operator, Slot: a.slot, Creates: cur.Rowless()}
	if one := cur.confirmed(a.slot); one != nil {
		v.Rows = []row{*one}
		v.Generation = strconv.FormatInt(one.Generation, 10)
	} else {
		for _, s := range cur.Slots {
			if s.State != "released" {
				v.Rows = append(v.Rows, s)
			}
		}
	}
	h.render(w, http.StatusOK, confirmTmpl, "Confirm "+name, false, v)
}

var confirmTmpl = mustPage(`{{define "content"}}
<h1>Confirm: {{.Action}} <code id="target">{{.TargetID}}</code>{{if .Slot}} slot {{.Slot}}{{end}}</h1>
<div class="confirm" id="confirm">
{{if eq .Action "release"}}<p>Release the lease by force? Its holder loses it at once: its work goes on until its next
heartbeat, and then ends without saving. Another run may start at once.</p>
{{else if eq .Action "stop"}}<p>Ask the holder to stop? Its work is cancelled at its next heartbeat, saving nothing, and
the lease is released.</p>
{{else}}<p id="creates">This target has <strong>no lease row</strong>: pausing it creates a paused row, so that no run
starts on it until it is resumed. Check the name: a row for a target that nothing runs stays until it is
resumed and pruned.</p>{{end}}
{{if .Rows}}<div class="scroll"><table id="concerned"><thead><tr>{{if .Slotted}}<th>Slot</th>{{end}}<th>State</th><th>Holder</th><th>Generation</th><th>Held for</th></tr></thead>
<tbody>{{range .Rows}}<tr>{{if .Slot}}<td class="num">{{.Slot}}</td>{{end}}<td>{{template "state" .}}</td><td class="holder">{{.Holder}}</td><td class="num generation">{{.Generation}}</td><td>{{template "held" .}}</td></tr>{{end}}</tbody></table></div>{{end}}
<p>Reason: <q id="reason">{{.Reason}}</q>{{if .Operator}} · as <span id="operator">{{.Operator}}</span>{{end}}</p>
<form class="act" method="post" action="{{.Action}}">
<input type="hidden" name="target" value="{{.TargetID}}">
<input type="hidden" name="reason" value="{{.Reason}}">
{{if .Slot}}<input type="hidden" name="slot" value="{{.Slot}}">{{end}}
{{if .Generation}}<input type="hidden" name="generation" value="{{.Generation}}">{{end}}
<input type="hidden" name="confirm" value="1">
<button type="submit" id="confirm-button" class="danger">{{.Button}}</button>
<a href="target?id={{.TargetID}}" id="cancel">Cancel</a>
</form>
</div>
{{end}}`)
