package history

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gormlease/gormlease/admin"
)

// The kinds of Violation of the lease table's history (Input.LeaseEvents:
// see checkEvents).
const (
	ViolationEventMissing = "a change without its event"
	ViolationEventExtra   = "an event without its change"
	ViolationEventWrong   = "an event that misstates its change"
	ViolationEventSeq     = "event seq not 1, 2, ... per target"
	ViolationEventOrder   = "events out of their changes' order"
	ViolationEventOutcome = "an end that the worker's call contradicts"
)

// OperatorCall is one call of the operator on a target, sent until it
// landed (see Pause): Kind is the event it records (admin.EventPaused for
// Pause, EventResumed for Resume, EventStopRequested for RequestStop),
// Operator the name it records (admin.Operator.As), Reason the reason it
// gave (Pause and RequestStop). Sent is when its first attempt was sent,
// Answered when an attempt returned nil (0: none did: each failed, or
// RequestStop found no live lease, which it changed nothing for), Done
// when its last attempt returned (wall clock, Unix microseconds).
type OperatorCall struct {
	Target, Kind, Operator, Reason string
	Sent, Answered, Done           int64
}

// nilToken is the token of a row that no acquisition has taken: one that
// Pause (or SetSlots) made.
const nilToken = "00000000-0000-0000-0000-000000000000"

// releaseCauses are the hows of an ended event written by a release of the
// generation by its holder (Run's, Repository.Release's): the row's
// end_cause, which a release without one leaves to the trigger (saved,
// released, or failed with a failure).
var releaseCauses = []string{admin.HowSaved, admin.HowReleased, admin.HowFailed, admin.HowSaveFailed, admin.HowLost,
	admin.HowStopped, admin.HowMaxHold, admin.HowPanic, admin.HowCancelled}

// takenCauses are the hows of an ended event that a later acquisition or
// an operator wrote: the generation did not end by its holder's release.
var takenCauses = []string{admin.HowExpired, admin.HowSeized, admin.HowForced}

// wantEvent is an event that a change of the audit log (Input.Changes)
// calls for.
type wantEvent struct {
	target, kind string
	gen          int64
	holder       string
	// hows are the hows it may have; from the generation before
	// (acquired); acquired when the generation was acquired (ended: its
	// acquired_at, 0 when not known).
	hows     []string
	from     int64
	acquired int64
	// change says which change calls for it.
	change string
}

type eventKey struct {
	target, kind string
	gen          int64
}

// checkEvents cross-checks the history (in.LeaseEvents) against the audit
// log of the lease rows' changes (in.Changes), the saved results (saved
// counts the saves of each target's generations), the workers' calls
// (runs) and the operator's (in.OperatorCalls); it counts what it checked
// in rep.
//
// Against the audit log: each acquisition in it (an insert of a row not
// released, or a change of the generation of a row left unreleased) has
// exactly one acquired event of its generation, with its holder, how
// (new for a row that no acquisition had taken, released, or, for one
// taken unreleased, expired past the old holder's timeout by more than
// in.Resolution, else expired or seized) and the generation before; and
// each end of a generation exactly one ended event, with its holder and
// acquired_at: by a takeover of the unreleased row (expired or seized, as
// the acquisition), by a release (a cause that a release records, with no
// operator), or by a change of the generation to a released row
// (ForceRelease: forced). An acquired or ended event that no change calls
// for, or a second one, is a violation; a saved event needs a saved result
// of its generation. Each target's events are numbered 1, 2, ... by seq;
// in that order, each generation is acquired after the last one ended,
// and ended (and asked to stop, or saved) while it is the row's; a
// generation ended as stopped was asked to stop first; an operator's
// pause or resume names the row's generation.
//
// Against what the workers observed: each call that ran its work under a
// generation has its acquired event, with the call's Runner's holder; a
// call that returned nil has the ended event of its generation, as saved;
// one that returned an error after its work ran, and whose generation its
// release ended (not a takeover nor a forced release: the release may not
// have landed), ended it with the cause that its error says: lost for
// ErrLeaseLost, stopped for ErrStopRequested, failed for its work's own
// failure (with the failure's text: the call's error's, which holds the
// work's), cancelled for its context's end, save_failed or cancelled for a
// failed commit. A call whose commit's outcome it could not know
// (ErrCommitUnknown), or that did not return (a crash), allows any end.
//
// Against the operator's calls: each call answered nil has its event
// (paused, resumed, stop_requested) on its target, with its operator name
// (and its reason), written between the call's first attempt and that
// answer; and each such event was written during a call of its kind, by
// its operator, on its target.
func checkEvents(in Input, runs []*run, saved map[string]map[int64]int, rep *Report,
	add func(kind, target, format string, args ...any),
) {
	rep.Ends = map[string]int{}
	evs := slices.Clone(in.LeaseEvents)
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].Target != evs[j].Target {
			return evs[i].Target < evs[j].Target
		}
		return evs[i].Seq < evs[j].Seq
	})
	byTarget := map[string][]*LeaseEvent{}
	var targets []string
	byKey := map[eventKey][]*LeaseEvent{}
	for i := range evs {
		e := &evs[i]
		if _, ok := byTarget[e.Target]; !ok {
			targets = append(targets, e.Target)
		}
		byTarget[e.Target] = append(byTarget[e.Target], e)
		byKey[eventKey{e.Target, e.Kind, e.Gen}] = append(byKey[eventKey{e.Target, e.Kind, e.Gen}], e)
		if admin.EventKind(e.Kind) == admin.EventEnded {
			rep.Ends[e.How]++
		}
	}
	rep.Events = len(evs)

	// seq: 1, 2, ... per target; the first break of each target's.
	for _, t := range targets {
		for i, e := range byTarget[t] {
			if e.Seq != int64(i+1) {
				add(ViolationEventSeq, t, "event %d of the target (%s of generation %d) has seq %d", i+1, e.Kind, e.Gen, e.Seq)
				break
			}
		}
	}

	// The audit log's acquisitions and ends, each with exactly one event.
	wants := wantedEvents(in.Changes, in.Resolution)
	consumed := map[eventKey]bool{}
	for _, w := range wants {
		k := eventKey{w.target, w.kind, w.gen}
		found := byKey[k]
		consumed[k] = true
		switch {
		case len(found) == 0:
			add(ViolationEventMissing, w.target, "no %s event of generation %d (%s)", w.kind, w.gen, w.change)
			continue
		case len(found) > 1:
			add(ViolationEventExtra, w.target, "%d %s events of generation %d (seq %s), for one %s",
				len(found), w.kind, w.gen, seqs(found), w.change)
		}
		e := found[0]
		var wrong []string
		if e.Holder != w.holder {
			wrong = append(wrong, fmt.Sprintf("holder %q, not %q", e.Holder, w.holder))
		}
		if !slices.Contains(w.hows, e.How) {
			wrong = append(wrong, fmt.Sprintf("how %q, not %s", e.How, strings.Join(w.hows, " or ")))
		}
		switch w.kind {
		case string(admin.EventAcquired):
			if e.FromGen != w.from {
				wrong = append(wrong, fmt.Sprintf("from generation %d, not %d", e.FromGen, w.from))
			}
		case string(admin.EventEnded):
			if w.acquired != 0 && e.AcquiredAt != w.acquired {
				wrong = append(wrong, fmt.Sprintf("acquired at %s, not %s", micros(e.AcquiredAt), micros(w.acquired)))
			}
			if e.How != admin.HowForced && e.Operator != "" {
				wrong = append(wrong, fmt.Sprintf("operator %q for an end that is not forced", e.Operator))
			}
			if (e.How == admin.HowSaved || e.How == admin.HowReleased) && e.Detail != "" {
				wrong = append(wrong, fmt.Sprintf("failure %q for an end %s", e.Detail, e.How))
			}
		}
		if len(wrong) > 0 {
			add(ViolationEventWrong, w.target, "%s event of generation %d (seq %d, %s): %s",
				w.kind, w.gen, e.Seq, w.change, strings.Join(wrong, "; "))
		}
	}
	for _, t := range targets {
		for _, e := range byTarget[t] {
			k := eventKey{e.Target, e.Kind, e.Gen}
			switch admin.EventKind(e.Kind) {
			case admin.EventAcquired, admin.EventEnded:
				if !consumed[k] {
					add(ViolationEventExtra, t, "%s event of generation %d (seq %d, how %q): no change of the row made it",
						e.Kind, e.Gen, e.Seq, e.How)
				}
			case admin.EventSaved:
				if saved[t][e.Gen] == 0 {
					add(ViolationEventExtra, t, "saved event of generation %d (seq %d): no result of it was saved", e.Gen, e.Seq)
				}
			case admin.EventPaused, admin.EventResumed, admin.EventStopRequested:
				rep.OperatorEvents++
			default:
				add(ViolationEventExtra, t, "event of kind %q (seq %d)", e.Kind, e.Seq)
			}
		}
	}

	for _, t := range targets {
		checkEventOrder(t, byTarget[t], add)
	}
	rep.EndsJudged = checkWorkerEvents(runs, byKey, add)
	checkOperatorEvents(in, evs, add)
}

// wantedEvents returns the acquired and ended events that changes, each
// target's in order, call for (see checkEvents).
func wantedEvents(changes []Change, resolution time.Duration) []wantEvent {
	res := resolution.Microseconds()
	var wants []wantEvent
	acquiredAt := map[eventKey]int64{} // by target and generation (kind "")
	for i, c := range changes {
		what := fmt.Sprintf("change %d of the log", i+1)
		acquire := func(how []string, from int64) {
			acquiredAt[eventKey{target: c.Target, gen: c.NewGen}] = c.NewAcquired
			wants = append(wants, wantEvent{target: c.Target, kind: string(admin.EventAcquired), gen: c.NewGen,
				holder: c.NewHolder, hows: how, from: from, change: what + ": its acquisition by " + c.NewHolder})
		}
		end := func(how []string, by string) {
			wants = append(wants, wantEvent{target: c.Target, kind: string(admin.EventEnded), gen: c.OldGen,
				holder: c.OldHolder, hows: how, acquired: acquiredAt[eventKey{target: c.Target, gen: c.OldGen}],
				change: what + ": its end by " + by})
		}
		switch {
		case c.Insert:
			if c.NewReleased == 0 {
				acquire([]string{admin.HowNew}, 0)
			}
		case c.NewGen != c.OldGen && c.NewReleased == 0:
			switch {
			case c.OldToken == nilToken:
				acquire([]string{admin.HowNew}, 0)
			case c.OldReleased != 0:
				acquire([]string{admin.HowReleased}, c.OldGen)
			default:
				// Taken unreleased: expired when past the old holder's
				// timeout on the log's stamps (the trigger reads its own
				// clock, later than the acquisition's stamp, or the same);
				// within it, the trigger's clock may have passed it.
				how := []string{admin.HowExpired, admin.HowSeized}
				if c.NewUpdated-c.OldUpdated > c.OldTimeoutMS*1000+res {
					how = how[:1]
				}
				end(how, "a takeover")
				acquire(how, c.OldGen)
			}
		case c.NewGen != c.OldGen && c.OldReleased == 0:
			end([]string{admin.HowForced}, "a forced release")
		case c.NewGen == c.OldGen && c.OldReleased == 0 && c.NewReleased != 0:
			end(releaseCauses, "its release")
		}
	}
	return wants
}

// checkEventOrder checks one target's events, in seq order: each
// generation acquired above the last, after it ended; ended, asked to
// stop and saved while it is the row's; ended as stopped after a stop
// request; paused and resumed naming the row's generation (once an
// acquisition has named it: the generation after a forced release's).
func checkEventOrder(target string, evs []*LeaseEvent, add func(kind, target, format string, args ...any)) {
	var cur, rowGen int64 // the last generation acquired; the row's (0: not known)
	open := false
	stopAsked := map[int64]bool{}
	bad := func(e *LeaseEvent, format string, args ...any) {
		add(ViolationEventOrder, target, "%s event of generation %d (seq %d): %s", e.Kind, e.Gen, e.Seq, fmt.Sprintf(format, args...))
	}
	for _, e := range evs {
		switch admin.EventKind(e.Kind) {
		case admin.EventAcquired:
			switch {
			case open:
				bad(e, "generation %d had not ended", cur)
			case e.Gen <= cur:
				bad(e, "not above generation %d, acquired before", cur)
			}
			cur, rowGen, open = e.Gen, e.Gen, true
		case admin.EventEnded:
			if !open || e.Gen != cur {
				bad(e, "not the generation held (%d, held: %v)", cur, open)
			}
			if e.How == admin.HowStopped && !stopAsked[e.Gen] {
				bad(e, "ended as stopped, with no stop request before")
			}
			if e.How == admin.HowForced {
				rowGen = e.Gen + 1 // ForceRelease moves the row on
			}
			open = false
		case admin.EventStopRequested, admin.EventSaved:
			if !open || e.Gen != cur {
				bad(e, "not the generation held (%d, held: %v)", cur, open)
			}
			if admin.EventKind(e.Kind) == admin.EventStopRequested {
				stopAsked[e.Gen] = true
			}
		case admin.EventPaused, admin.EventResumed:
			if rowGen != 0 && e.Gen != rowGen {
				bad(e, "not the row's generation, %d", rowGen)
			}
		}
	}
}

// checkWorkerEvents checks the events of each generation that a worker's
// call ran its work under against what the call observed (see
// checkEvents), and returns how many ended events it judged so.
func checkWorkerEvents(runs []*run, byKey map[eventKey][]*LeaseEvent, add func(kind, target, format string, args ...any)) (judged int) {
	for _, r := range runs {
		if r.token == "" {
			continue
		}
		who := fmt.Sprintf("%s %s %d", r.worker, r.call, r.id)
		acq := byKey[eventKey{r.target, string(admin.EventAcquired), r.gen}]
		switch {
		case len(acq) == 0:
			add(ViolationEventMissing, r.target, "%s ran its work under generation %d, which has no acquired event", who, r.gen)
		case r.holder != "" && acq[0].Holder != r.holder:
			add(ViolationEventWrong, r.target, "%s (holder %q) ran its work under generation %d, acquired by %q as its event says",
				who, r.holder, r.gen, acq[0].Holder)
		}
		if r.end == 0 || r.superseded || r.outcome == OutcomeUnknown {
			continue // a crash, or a work that ran again, or a commit whose outcome is not known: any end
		}
		ends := byKey[eventKey{r.target, string(admin.EventEnded), r.gen}]
		if r.outcome == OutcomeOK {
			judged++
			switch {
			case len(ends) == 0:
				add(ViolationEventMissing, r.target, "%s returned nil for generation %d, which has no ended event", who, r.gen)
			case ends[0].How != admin.HowSaved:
				add(ViolationEventOutcome, r.target, "%s returned nil for generation %d, which ended %s (seq %d)",
					who, r.gen, ends[0].How, ends[0].Seq)
			}
			continue
		}
		if len(ends) == 0 || slices.Contains(takenCauses, ends[0].How) {
			// Not ended yet (its release did not land, and no one took it
			// over), or not by its release: the audit log judges those.
			continue
		}
		e := ends[0]
		want := endCauses(r)
		if want == nil {
			continue
		}
		judged++
		if !slices.Contains(want, e.How) {
			add(ViolationEventOutcome, r.target, "%s returned %s (%s) for generation %d, which its release ended %s (seq %d), not %s",
				who, r.outcome, r.err, r.gen, e.How, e.Seq, strings.Join(want, " or "))
			continue
		}
		if e.How == admin.HowFailed && !failureMatches(e.Detail, r.err, r.workErr) {
			add(ViolationEventOutcome, r.target, "%s failed with %q under generation %d, which ended failed with the failure %q (seq %d)",
				who, r.err, r.gen, e.Detail, e.Seq)
		}
	}
	return judged
}

// endCauses are the causes that the release of r's generation may record,
// by what r returned after its work ran; nil: any.
func endCauses(r *run) []string {
	switch r.outcome {
	case OutcomeLost:
		return []string{admin.HowLost}
	case OutcomeStopped:
		return []string{admin.HowStopped}
	case OutcomeError:
		switch {
		case r.workEnd == 0:
			return nil
		case r.workOutcome == WorkFailed && strings.Contains(r.err, r.workErr):
			// The call's error is the work's failure (a WorkError).
			return []string{admin.HowFailed}
		case r.workOutcome != "":
			// The work's context ended, and the call's error is not the
			// lease's loss nor a stop request: the caller's context.
			return []string{admin.HowCancelled}
		default:
			// The work returned its value; the saver or the fenced commit
			// failed, or the caller's context ended meanwhile.
			return []string{admin.HowSaveFailed, admin.HowCancelled}
		}
	}
	return nil
}

// failureMatches reports whether detail, the failure's text in an ended
// event, is the call's error runErr (less its "gormlease: " prefix and any
// NUL, cut to the column's 255 bytes with "..."), which holds workErr, the
// work's own.
func failureMatches(detail, runErr, workErr string) bool {
	text := strings.ReplaceAll(runErr, "\x00", "")
	if cut, ok := strings.CutSuffix(detail, "..."); ok && len(detail) > 255-3-4 { // cut at a rune's start
		return strings.Contains(text, cut)
	}
	return detail != "" && strings.Contains(text, detail) && strings.Contains(detail, workErr)
}

// checkOperatorEvents checks the operator's events (paused, resumed,
// stop_requested) against the operator's calls (see checkEvents).
func checkOperatorEvents(in Input, evs []LeaseEvent, add func(kind, target, format string, args ...any)) {
	res := in.Resolution.Microseconds()
	operatorKind := func(kind string) bool {
		switch admin.EventKind(kind) {
		case admin.EventPaused, admin.EventResumed, admin.EventStopRequested:
			return true
		}
		return false
	}
	for _, c := range in.OperatorCalls {
		if c.Answered == 0 {
			continue
		}
		var found *LeaseEvent
		for i := range evs {
			e := &evs[i]
			if e.Target == c.Target && e.Kind == c.Kind && e.Operator == c.Operator && e.At >= c.Sent-res && e.At <= c.Answered+res {
				found = e
				break
			}
		}
		switch {
		case found == nil:
			add(ViolationEventMissing, c.Target, "no %s event by %q from %s to %s, when the call sent at %s was answered nil",
				c.Kind, c.Operator, micros(c.Sent), micros(c.Answered), micros(c.Sent))
		case c.Kind != string(admin.EventResumed) && found.Detail != c.Reason:
			add(ViolationEventWrong, c.Target, "%s event (seq %d) by %q has the reason %q, not %q",
				c.Kind, found.Seq, c.Operator, found.Detail, c.Reason)
		}
	}
	for _, e := range evs {
		if !operatorKind(e.Kind) {
			continue
		}
		ok := false
		for _, c := range in.OperatorCalls {
			if e.Target == c.Target && e.Kind == c.Kind && e.Operator == c.Operator && e.At >= c.Sent-res && e.At <= c.Done+res {
				ok = true
				break
			}
		}
		if !ok {
			add(ViolationEventExtra, e.Target, "%s event (seq %d) by %q at %s: no such call of the operator was under way",
				e.Kind, e.Seq, e.Operator, micros(e.At))
		}
	}
}

// seqs lists the seq of each of evs.
func seqs(evs []*LeaseEvent) string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = fmt.Sprint(e.Seq)
	}
	return strings.Join(s, ", ")
}
