package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// maxReason is the longest reason, in bytes, that an action takes: the
// longest that admin.Operator.Pause and RequestStop record (the columns hold
// 255).
const maxReason = 255

// act is what an action is asked to do: on target, or with slot > 0 on
// that slot of it (stop and release only), for reason, by operator ("" for
// no identity).
type act struct {
	target, reason string
	slot           int
	operator       string
}

// actions are what the console can do to a target, by name: each is a
// POST to its name under the console's root. op records the operator.
var actions = map[string]func(op *admin.Operator, ctx context.Context, a act) error{
	"pause": func(op *admin.Operator, ctx context.Context, a act) error {
		return op.Pause(ctx, a.target, a.reason)
	},
	"resume": func(op *admin.Operator, ctx context.Context, a act) error {
		return op.Resume(ctx, a.target)
	},
	"stop": func(op *admin.Operator, ctx context.Context, a act) error {
		if a.slot > 0 {
			return op.RequestStopSlot(ctx, a.target, a.slot, a.reason)
		}
		return op.RequestStop(ctx, a.target, a.reason)
	},
	"release": func(op *admin.Operator, ctx context.Context, a act) error {
		var err error
		if a.slot > 0 {
			_, err = op.ForceReleaseSlot(ctx, a.target, a.slot)
		} else {
			_, err = op.ForceRelease(ctx, a.target)
		}
		return err
	},
}

// slotActions are the actions that take the form field slot.
var slotActions = map[string]bool{"stop": true, "release": true}

// isAction reports whether name is one of the console's actions.
func isAction(name string) bool {
	_, ok := actions[name]
	return ok
}

// parseSlot reads the form field slot of the action name: 0 when it is
// absent or empty, else a number from 1 to gormlease.MaxSlots, which only
// stop and release take.
func parseSlot(name, field string) (int, error) {
	if field == "" {
		return 0, nil
	}
	if !slotActions[name] {
		return 0, fmt.Errorf("%s applies to the whole target and takes no slot: only stop and release take the form field slot", name)
	}
	slot, err := strconv.Atoi(field)
	if err != nil || slot < 1 || slot > gormlease.MaxSlots {
		return 0, fmt.Errorf("the form field slot must be a slot's number, from 1 to %d, got %q", gormlease.MaxSlots, field)
	}
	return slot, nil
}

// sameOrigin is the check of the request's origin: Go's, which reads
// Sec-Fetch-Site, or else compares Origin with Host.
var sameOrigin = http.NewCrossOriginProtection()

// action runs the action name on the form's target (or, given the form
// field slot, on that slot of it), when the request is a same-origin POST
// that the authorizer allows; it answers 303 to the target's page when
// done.
func (h *handler) action(w http.ResponseWriter, r *http.Request, name string) {
	log := h.logger.With("action", name, "remote", r.RemoteAddr)
	refuse := func(status int, msg string) {
		log.Warn("console: action refused", "status", status, "why", msg)
		h.fail(w, r, status, msg)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		refuse(http.StatusMethodNotAllowed, name+" is a POST, with the form fields target and reason (and, for stop and release, slot)")
		return
	}
	if err := checkOrigin(r); err != nil {
		refuse(http.StatusForbidden, err.Error())
		return
	}
	if h.authorize == nil {
		refuse(http.StatusForbidden, "this console is read-only: it was built without WithAuthorizer, so it takes no actions")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		refuse(http.StatusBadRequest, "the form could not be read: "+err.Error())
		return
	}
	target, reason := r.PostFormValue("target"), r.PostFormValue("reason")
	log = log.With("target", target, "reason", reason)
	slot, slotErr := parseSlot(name, r.PostFormValue("slot"))
	if slot > 0 {
		log = log.With("slot", slot)
	}
	switch {
	case target == "":
		refuse(http.StatusBadRequest, "give the target, in the form field target")
		return
	case slotErr != nil:
		refuse(http.StatusBadRequest, slotErr.Error())
		return
	case len(reason) > maxReason || !utf8.ValidString(reason):
		refuse(http.StatusBadRequest, fmt.Sprintf("the reason must be UTF-8 text of at most %d bytes", maxReason))
		return
	case reason == "" && name != "resume":
		refuse(http.StatusBadRequest, "give a reason, in the form field reason: it is logged, and a pause records it in the row")
		return
	}
	if problem := checkTarget(target); problem != "" {
		refuse(http.StatusBadRequest, problem)
		return
	}
	if err := h.authorize(r, name, target); err != nil {
		refuse(http.StatusForbidden, "not allowed: "+err.Error())
		return
	}
	a := act{target: target, reason: reason, slot: slot}
	if h.identity != nil {
		a.operator = h.identity(r)
		if problem := checkOperator(a.operator); problem != "" {
			// The application's identity function is wrong: a person
			// must look.
			log.Error("console: action refused: the identity cannot be recorded", "why", problem)
			h.fail(w, r, http.StatusInternalServerError, "the operator's identity cannot be recorded: "+problem)
			return
		}
		if a.operator != "" {
			log = log.With("operator", a.operator)
		}
	}
	ctx, cancel := dbContext(r)
	defer cancel()
	cur, err := h.readRows(ctx, target)
	if err != nil {
		log.Error("console: action failed: read the target", "err", err)
		h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%s %q: could not read the target: %v", name, target, err))
		return
	}
	if msg := cur.mismatch(name, slot); msg != "" {
		refuse(http.StatusConflict, fmt.Sprintf("%s %q: %s; nothing was done", name, target, msg))
		return
	}
	confirmed := r.PostFormValue("confirm") == "1"
	if !confirmed && cur.needsConfirm(name) {
		log.Debug("console: action to confirm")
		h.confirm(w, name, a, cur)
		return
	}
	if g := r.PostFormValue("generation"); confirmed && g != "" {
		if msg := cur.changed(slot, g); msg != "" {
			refuse(http.StatusConflict, fmt.Sprintf("%s %q: %s; nothing was done: look at the target's page again", name, target, msg))
			return
		}
	}
	if err := actions[name](h.operator(a.operator), ctx, a); err != nil {
		status := actionStatus(err)
		if status == http.StatusInternalServerError {
			log.Error("console: action failed", "err", err)
		} else {
			log.Warn("console: action refused", "status", status, "err", err)
		}
		h.fail(w, r, status, fmt.Sprintf("%s %q: %v", name, target, err))
		return
	}
	log.Info("console: action done")
	done := url.Values{"id": {target}, "done": {name}}
	if slot > 0 {
		done.Set("slot", strconv.Itoa(slot))
	}
	seeOther(w, "target?"+done.Encode())
}

// checkOrigin returns an error unless r says, by its Sec-Fetch-Site or
// Origin header, that it comes from the console's own origin. A request
// with neither is refused too: a script that posts an action says where
// it comes from with either header.
func checkOrigin(r *http.Request) error {
	if r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Origin") == "" {
		return errors.New("cross-origin check: the request has neither a Sec-Fetch-Site nor an Origin header; " +
			"a browser sends them, and a script must send one: Origin: the console's scheme://host, or Sec-Fetch-Site: same-origin")
	}
	if err := sameOrigin.Check(r); err != nil {
		return fmt.Errorf("cross-origin check: refused (%v): actions are taken only from the console's own pages", err)
	}
	return nil
}

// actionStatus is the HTTP status for an action's error.
func actionStatus(err error) int {
	switch {
	case errors.Is(err, gormlease.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, gormlease.ErrNoLiveLease):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// seeOther answers 303 See Other to location, a URL relative to the
// console's root, as it is: http.Redirect would resolve it against the
// request's path, from which http.StripPrefix took the prefix away.
func seeOther(w http.ResponseWriter, location string) {
	w.Header().Set("Location", location)
	w.WriteHeader(http.StatusSeeOther)
}

// operator is the Operator that records name as the operator of its
// actions, or the console's own for "".
func (h *handler) operator(name string) *admin.Operator {
	if name == "" {
		return h.op
	}
	return h.op.As(name)
}

// checkTarget says what is wrong with id as a target ID, or "": 1 to 255
// bytes of UTF-8, without a NUL or the byte 0x1f (which gormlease keeps
// for the keys of slot rows), as gormlease's own check asks.
func checkTarget(id string) string {
	const max = 255
	switch {
	case id == "":
		return "give the target"
	case len(id) > max:
		return fmt.Sprintf("the target ID is %d bytes long: a target ID has at most %d bytes", len(id), max)
	case !utf8.ValidString(id):
		return "the target ID is not valid UTF-8"
	case strings.IndexByte(id, 0) >= 0:
		return "the target ID has a NUL byte, which no target ID has"
	case strings.Contains(id, slotSeparator):
		return "the target ID has the byte 0x1f, which gormlease keeps for the keys of slot rows: give the target's own ID"
	}
	return ""
}

// checkOperator says what is wrong with name as an operator's identity,
// or "": "" (no identity) or 1 to 255 bytes of UTF-8 without a NUL byte.
func checkOperator(name string) string {
	switch {
	case len(name) > maxReason:
		return fmt.Sprintf("it is %d bytes long, more than the %d the row holds", len(name), maxReason)
	case !utf8.ValidString(name):
		return "it is not valid UTF-8"
	case strings.IndexByte(name, 0) >= 0:
		return "it has a NUL byte"
	}
	return ""
}
