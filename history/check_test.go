package history

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// clean is a history with nothing wrong: generation 1 acquired, saved and
// released; generation 2 acquired after the release, saved and released.
func clean() Input {
	return Input{
		Events: []Event{
			{Worker: "a", Run: 1, Kind: KindRun, Target: "t", At: 100},
			{Worker: "a", Run: 1, Kind: KindWork, Target: "t", Gen: 1, Token: "A", At: 200},
			{Worker: "a", Run: 1, Kind: KindSave, Target: "t", Gen: 1, Token: "A", At: 300},
			{Worker: "a", Run: 1, Kind: KindEnd, Target: "t", Outcome: OutcomeOK, At: 400},
			{Worker: "b", Run: 1, Kind: KindRun, Target: "t", At: 150},
			{Worker: "b", Run: 1, Kind: KindEnd, Target: "t", Outcome: OutcomeHeld, At: 160},
			{Worker: "b", Run: 2, Kind: KindRun, Target: "t", At: 500},
			{Worker: "b", Run: 2, Kind: KindWork, Target: "t", Gen: 2, Token: "B", At: 600},
			{Worker: "b", Run: 2, Kind: KindSave, Target: "t", Gen: 2, Token: "B", At: 700},
			{Worker: "b", Run: 2, Kind: KindEnd, Target: "t", Outcome: OutcomeOK, At: 800},
		},
		Results: []Result{{Target: "t", Gen: 1, Token: "A", At: 310}, {Target: "t", Gen: 2, Token: "B", At: 710}},
		Changes: []Change{
			{Insert: true, Target: "t", NewGen: 1, NewToken: "A", NewUpdated: 190, NewTimeoutMS: 1, At: 190},
			{Target: "t", OldGen: 1, NewGen: 1, OldToken: "A", NewToken: "A", OldUpdated: 190, NewUpdated: 190,
				NewReleased: 350, OldTimeoutMS: 1, NewTimeoutMS: 1, At: 350},
			{Target: "t", OldGen: 1, NewGen: 2, OldToken: "A", NewToken: "B", OldUpdated: 190, NewUpdated: 590,
				OldReleased: 350, OldTimeoutMS: 1, NewTimeoutMS: 1, At: 590},
		},
		Targets: []string{"t"}, From: 0, To: 900, Recovery: 0, Window: 500 * time.Microsecond,
	}
}

func kinds(rep Report) map[string]int {
	k := map[string]int{}
	for _, v := range rep.Violations {
		k[v.Kind]++
	}
	return k
}

func TestCheck_CleanHistoryPasses(t *testing.T) {
	rep := Check(clean())
	assert.Empty(t, rep.Violations)
	assert.Equal(t, 3, rep.Runs)
	assert.Equal(t, 2, rep.Acquisitions)
	assert.Equal(t, 4, rep.Ops)
	assert.Equal(t, 1, rep.Windows)
}

// Each broken guarantee, put into the clean history, is found, and named.
func TestCheck_FindsEachViolation(t *testing.T) {
	for name, tc := range map[string]struct {
		break_ func(in *Input)
		want   []string
	}{
		"DoubleSave": {func(in *Input) {
			in.Results = append(in.Results, Result{Target: "t", Gen: 2, Token: "B", At: 720})
		}, []string{ViolationDoubleSave}},
		"StaleSave": {func(in *Input) {
			// Generation 1's save comes after generation 2 started.
			in.Events[2].At, in.Events[3].At, in.Results[0].At = 650, 660, 650
		}, []string{ViolationStaleSave, ViolationNotLinearizable}},
		"LostResult":  {func(in *Input) { in.Results = in.Results[1:] }, []string{ViolationLostResult}},
		"PhantomSave": {func(in *Input) { in.Events[3].Outcome = OutcomeLost }, []string{ViolationPhantomSave}},
		"ForeignSave": {func(in *Input) {
			in.Results = append(in.Results, Result{Target: "t", Gen: 3, Token: "C", At: 850})
		}, []string{ViolationForeignSave}},
		"EarlyTakeover": {func(in *Input) {
			// Generation 2 takes over the unreleased generation 1 0.4 ms
			// after its last renewal, within its 1 ms timeout.
			in.Changes = []Change{in.Changes[0], in.Changes[2]}
			in.Changes[1].OldReleased = 0
		}, []string{ViolationEarlyTakeover}},
		"NoProgress": {func(in *Input) {
			// Nothing saved from the end of a fault to the end of the run.
			in.To, in.Faults = 5000, []Fault{{Start: 0, End: 1000}}
		}, []string{ViolationNoProgress}},
	} {
		t.Run(name, func(t *testing.T) {
			in := clean()
			tc.break_(&in)
			got := kinds(Check(in))
			for _, k := range tc.want {
				assert.NotZero(t, got[k], "%s not found; found %v", k, got)
			}
			assert.Len(t, got, len(tc.want), "found %v, want only %v", got, tc.want)
		})
	}
}

// A fault, a worker's or a failover of the cluster, and its recovery, is
// no quiet window.
func TestCheck_QuietWindowsLeaveFaultsOut(t *testing.T) {
	in := Input{From: 0, To: 10_000_000, Recovery: time.Second, Window: 2 * time.Second,
		Faults: []Fault{{Worker: "0", Start: 4_000_000, End: 5_000_000}, {Worker: "cluster", Start: 5_500_000, End: 6_000_000}}}
	assert.Equal(t, [][2]int64{{1_000_000, 4_000_000}, {7_000_000, 10_000_000}}, quietWindows(in))
}

// A paused target starts no work: in the clean history, a pause from 450
// to 650 is broken by b's Run 2 (called at 500, work at 600); one from 120
// to 550 is not (a's work began at 200, but its Run was called at 100,
// before the pause committed, and b's Run 2 began its work after the
// Resume was sent), nor is b's refused Run (no acquisition).
func TestCheck_PausedTargetStartsNoWork(t *testing.T) {
	in := clean()
	in.Pauses = []Pause{{Target: "t", Committed: 120, Resumed: 550}}
	assert.Empty(t, Check(in).Violations)

	in.Pauses = []Pause{{Target: "t", Committed: 450, Resumed: 650}}
	rep := Check(in)
	assert.Equal(t, map[string]int{ViolationPausedStart: 1}, kinds(rep))

	in.Pauses = []Pause{{Target: "other", Committed: 450, Resumed: 650}}
	assert.Empty(t, Check(in).Violations, "a pause of another target")
}

// A pause sent again across a failover is certain only from its confirmed
// answer: b's Run 2, called at 500 while the Pause sent at 450 was still
// unanswered, breaks nothing when the answer came at 550, nor when none
// ever came; it does when the answer came at 480.
func TestCheck_PauseUncertainUntilConfirmed(t *testing.T) {
	in := clean()
	in.Pauses = []Pause{{Target: "t", Sent: 450, Committed: 550, Resumed: 650}}
	assert.Empty(t, Check(in).Violations, "a Run called before the pause was confirmed")

	in.Pauses = []Pause{{Target: "t", Sent: 450, Resumed: 650}}
	assert.Empty(t, Check(in).Violations, "a pause never confirmed")

	in.Pauses = []Pause{{Target: "t", Sent: 450, Committed: 480, Resumed: 650}}
	assert.Equal(t, map[string]int{ViolationPausedStart: 1}, kinds(Check(in)))
}

// doClean is clean() with a's work's end logged, and a call of Do by c,
// made while a's generation 1 worked, that shared its result.
func doClean() Input {
	in := clean()
	in.CallLag = 10 * time.Microsecond
	in.Events = append(in.Events,
		Event{Worker: "a", Run: 1, Kind: KindWorkEnd, Target: "t", At: 290},
		Event{Worker: "c", Run: 1, Kind: KindDo, Target: "t", At: 250},
		Event{Worker: "c", Run: 1, Kind: KindEnd, Target: "t", Outcome: OutcomeShared, Shared: true, Loaded: 1, At: 420},
	)
	return in
}

// Each broken promise of Do, and a call that ran its work twice, put into
// a clean history, is found, and named.
func TestCheck_FindsDoViolations(t *testing.T) {
	assert.Empty(t, Check(doClean()).Violations)
	for name, tc := range map[string]struct {
		break_ func(in *Input)
		want   string
	}{
		"RanAgain": {func(in *Input) {
			// b's call 2 is a Do, made while generation 1 worked, that ran
			// generation 2 after generation 1 saved.
			in.Events[6].Kind, in.Events[6].At = KindDo, 260
		}, ViolationDoRanAgain},
		"StaleShare": {func(in *Input) {
			// c called Do after a's Run had returned, and shared its result.
			in.Events[len(in.Events)-2].At = 420
			in.Events[len(in.Events)-1].At = 450
		}, ViolationDoStaleShare},
		"FalseFailure": {func(in *Input) {
			e := &in.Events[len(in.Events)-1]
			e.Outcome, e.Shared, e.Loaded, e.Failed = OutcomeSharedFailed, true, 0, 1
		}, ViolationDoFalseFailure},
		"WorkedTwice": {func(in *Input) {
			// b's call 2 is a RunWait whose work ran twice, under generation
			// 2 and then 3, which saved.
			in.Events[6].Kind = KindRunWait
			in.Events = append(in.Events, Event{Worker: "b", Run: 2, Kind: KindWork, Target: "t", Gen: 3, Token: "C", Try: 2, At: 620})
			in.Results[1] = Result{Target: "t", Gen: 3, Token: "C", At: 710}
			in.Changes = append(in.Changes, Change{Target: "t", OldGen: 2, NewGen: 3, OldToken: "B", NewToken: "C",
				OldUpdated: 590, NewUpdated: 615, OldReleased: 612, OldTimeoutMS: 1, NewTimeoutMS: 1, At: 615})
		}, ViolationWorkedTwice},
	} {
		t.Run(name, func(t *testing.T) {
			in := doClean()
			tc.break_(&in)
			got := kinds(Check(in))
			assert.Equal(t, map[string]int{tc.want: 1}, got)
		})
	}
}

// A Do whose worker was held up (paused, or its statements stalled) just
// after it logged its call may begin later: it is not judged by the time
// of its log line.
func TestCheck_DoHeldUpIsNotJudgedByItsLogLine(t *testing.T) {
	in := doClean()
	in.Events[6].Kind, in.Events[6].At, in.Events[6].Worker = KindDo, 260, "w1.0"
	for i := 7; i < 10; i++ {
		in.Events[i].Worker = "w1.0"
	}
	assert.Equal(t, map[string]int{ViolationDoRanAgain: 1}, kinds(Check(in)))
	in.Faults = []Fault{{Kind: "pause", Worker: "1", Start: 255, End: 265, HeldUp: true}}
	assert.Empty(t, Check(in).Violations)
	in.Faults[0].Worker = "2"
	assert.Equal(t, map[string]int{ViolationDoRanAgain: 1}, kinds(Check(in)), "another worker's pause")
}

// eventsClean is clean() with its history kept: generation 2's release in
// the log, the events of both generations, and an operator's pause,
// resume and stop request, each answered nil. Its events, in seq order:
// acquired 1, ended 1, paused, resumed, acquired 2, stop_requested 2,
// ended 2.
func eventsClean() Input {
	in := clean()
	in.Events[1].Holder, in.Events[7].Holder = "a", "b"
	in.Changes[0].NewHolder, in.Changes[0].NewAcquired = "a", 190
	in.Changes[1].OldHolder, in.Changes[1].NewHolder, in.Changes[1].NewAcquired = "a", "a", 190
	in.Changes[2].OldHolder, in.Changes[2].NewHolder, in.Changes[2].NewAcquired = "a", "b", 590
	in.Changes = append(in.Changes, Change{Target: "t", OldGen: 2, NewGen: 2, OldToken: "B", NewToken: "B",
		OldHolder: "b", NewHolder: "b", OldUpdated: 590, NewUpdated: 590, NewReleased: 720, OldTimeoutMS: 1, NewTimeoutMS: 1,
		NewAcquired: 590, At: 720})
	in.EventsKept = true
	in.LeaseEvents = []LeaseEvent{
		{Target: "t", Seq: 1, At: 190, Kind: "acquired", Gen: 1, Holder: "a", How: "new"},
		{Target: "t", Seq: 2, At: 350, Kind: "ended", Gen: 1, Holder: "a", How: "saved", AcquiredAt: 190},
		{Target: "t", Seq: 3, At: 450, Kind: "paused", Gen: 1, Holder: "a", Operator: "op", Detail: "deploy"},
		{Target: "t", Seq: 4, At: 460, Kind: "resumed", Gen: 1, Holder: "a", Operator: "op"},
		{Target: "t", Seq: 5, At: 590, Kind: "acquired", Gen: 2, Holder: "b", How: "released", FromGen: 1},
		{Target: "t", Seq: 6, At: 605, Kind: "stop_requested", Gen: 2, Holder: "b", Operator: "op", Detail: "enough"},
		{Target: "t", Seq: 7, At: 720, Kind: "ended", Gen: 2, Holder: "b", How: "saved", AcquiredAt: 590},
	}
	in.OperatorCalls = []OperatorCall{
		{Target: "t", Kind: "paused", Operator: "op", Reason: "deploy", Sent: 440, Answered: 455, Done: 455},
		{Target: "t", Kind: "resumed", Operator: "op", Sent: 458, Answered: 470, Done: 470},
		{Target: "t", Kind: "stop_requested", Operator: "op", Reason: "enough", Sent: 600, Answered: 610, Done: 610},
	}
	return in
}

// deleteEvent deletes in's event of seq, and numbers the rest again.
func deleteEvent(in *Input, seq int64) {
	in.LeaseEvents = slices.Delete(in.LeaseEvents, int(seq-1), int(seq))
	for i := range in.LeaseEvents {
		in.LeaseEvents[i].Seq = int64(i + 1)
	}
}

func TestCheck_EventsCleanHistoryPasses(t *testing.T) {
	rep := Check(eventsClean())
	assert.Empty(t, rep.Violations)
	assert.Equal(t, 7, rep.Events)
	assert.Equal(t, 3, rep.OperatorEvents)
	assert.Equal(t, 2, rep.EndsJudged)
	assert.Equal(t, map[string]int{"saved": 2}, rep.Ends)

	in := eventsClean()
	in.EventsKept = false
	in.LeaseEvents = nil
	assert.Empty(t, Check(in).Violations, "a history not kept is not checked")
}

// Each flaw of the history, put into the clean one, is found, and named:
// against the audit log, the workers' calls, the operator's, and the
// order of seq.
func TestCheck_FindsEachEventViolation(t *testing.T) {
	for name, tc := range map[string]struct {
		break_ func(in *Input)
		want   []string
	}{
		"DeletedEvent": {func(in *Input) {
			// The end of generation 1, gone: a gap in seq, and generation 2
			// acquired while 1 has not ended.
			in.LeaseEvents = slices.Delete(in.LeaseEvents, 1, 2)
		}, []string{ViolationEventMissing, ViolationEventSeq, ViolationEventOrder}},
		"MissingAcquisition": {func(in *Input) {
			deleteEvent(in, 5) // b's generation 2, and its stop request and end, then out of order
		}, []string{ViolationEventMissing, ViolationEventOrder}},
		"WrongHow": {func(in *Input) { in.LeaseEvents[4].How = "expired" }, []string{ViolationEventWrong}},
		"WrongHolder": {func(in *Input) {
			in.LeaseEvents[0].Holder = "x" // against the log, and against a's work
		}, []string{ViolationEventWrong}},
		"WrongFrom":       {func(in *Input) { in.LeaseEvents[4].FromGen = 0 }, []string{ViolationEventWrong}},
		"WrongAcquiredAt": {func(in *Input) { in.LeaseEvents[1].AcquiredAt = 100 }, []string{ViolationEventWrong}},
		"FailureOnASave":  {func(in *Input) { in.LeaseEvents[1].Detail = "boom" }, []string{ViolationEventWrong}},
		"DuplicateSeq":    {func(in *Input) { in.LeaseEvents[3].Seq = 3 }, []string{ViolationEventSeq}},
		"DuplicateEvent": {func(in *Input) {
			e := in.LeaseEvents[0]
			e.Seq = 8
			in.LeaseEvents = append(in.LeaseEvents, e)
		}, []string{ViolationEventExtra, ViolationEventOrder}},
		"PhantomEnd": {func(in *Input) {
			in.LeaseEvents = append(in.LeaseEvents, LeaseEvent{Target: "t", Seq: 8, At: 800, Kind: "ended", Gen: 3, How: "failed"})
		}, []string{ViolationEventExtra, ViolationEventOrder}},
		"PhantomSavedEvent": {func(in *Input) {
			in.LeaseEvents = slices.Insert(in.LeaseEvents, 6, LeaseEvent{Target: "t", Seq: 7, At: 700, Kind: "saved", Gen: 2, Holder: "b"})
			in.LeaseEvents[7].Seq = 8
			in.Results = in.Results[:1]
			in.Events[9].Outcome = OutcomeUnknown // so that nothing else tells
		}, []string{ViolationEventExtra}},
		"UnknownKind": {func(in *Input) {
			in.LeaseEvents = append(in.LeaseEvents, LeaseEvent{Target: "t", Seq: 8, At: 800, Kind: "renewed", Gen: 2})
		}, []string{ViolationEventExtra}},
		"SaveEndedOtherwise": {func(in *Input) {
			// b's Run returned nil, and its generation ended failed.
			in.LeaseEvents[6].How, in.LeaseEvents[6].Detail = "failed", "boom"
		}, []string{ViolationEventOutcome}},
		"SaveNotEnded": {func(in *Input) {
			// Nor in the log: the release of generation 2 did not happen.
			in.Changes = in.Changes[:3]
			deleteEvent(in, 7)
		}, []string{ViolationEventMissing}},
		"OperatorEventMissing": {func(in *Input) { deleteEvent(in, 3) }, []string{ViolationEventMissing}},
		"OperatorEventByAnother": {func(in *Input) {
			in.LeaseEvents[3].Operator = "mallory"
		}, []string{ViolationEventMissing, ViolationEventExtra}},
		"OperatorEventOfNoCall": {func(in *Input) {
			in.LeaseEvents = append(in.LeaseEvents, LeaseEvent{Target: "t", Seq: 8, At: 800, Kind: "paused", Gen: 2, Operator: "op"})
		}, []string{ViolationEventExtra}},
		"OperatorEventLate": {func(in *Input) {
			in.LeaseEvents[2].At = 456 // after the answer: not the call's, which has none then
		}, []string{ViolationEventMissing, ViolationEventExtra}},
		"WrongReason":       {func(in *Input) { in.LeaseEvents[2].Detail = "other" }, []string{ViolationEventWrong}},
		"PauseOfAnotherGen": {func(in *Input) { in.LeaseEvents[3].Gen = 2 }, []string{ViolationEventOrder}},
		"StopOfAnotherGen": {func(in *Input) {
			in.LeaseEvents[5].Gen = 1
		}, []string{ViolationEventOrder}},
	} {
		t.Run(name, func(t *testing.T) {
			in := eventsClean()
			tc.break_(&in)
			got := kinds(Check(in))
			for _, k := range tc.want {
				assert.NotZero(t, got[k], "%s not found; found %v", k, got)
			}
			assert.Len(t, got, len(tc.want), "found %v, want only %v", got, tc.want)
		})
	}
}

// The end of a generation whose call failed after its work ran follows
// the call's error: its release records the cause that the error says, and
// the work's failure; a takeover or a commit whose outcome the call could
// not know allows any.
func TestCheck_EventEndsFollowTheCall(t *testing.T) {
	// failed makes b's call 2 end with err, its work with work (outcome
	// and text), nothing saved, and generation 2's end how, with detail.
	failed := func(outcome, err, workOutcome, workErr, how, detail string) Input {
		in := eventsClean()
		in.Events[9].Outcome, in.Events[9].Err = outcome, err
		in.Events[8] = Event{Worker: "b", Run: 2, Kind: KindWorkEnd, Target: "t", Outcome: workOutcome, Err: workErr, At: 700}
		in.Results = in.Results[:1]
		in.LeaseEvents[6].How, in.LeaseEvents[6].Detail = how, detail
		return in
	}
	const workErr, runErr = "boom", `gormlease: work "t": boom`
	for name, tc := range map[string]struct {
		in   Input
		want string // "" for none
	}{
		"Failed":                {failed(OutcomeError, runErr, WorkFailed, workErr, "failed", `work "t": boom`), ""},
		"FailedAndNotReleased":  {failed(OutcomeError, runErr+"; then release: connection refused", WorkFailed, workErr, "failed", `work "t": boom`), ""},
		"FailedWithOtherText":   {failed(OutcomeError, runErr, WorkFailed, workErr, "failed", `work "t": bam`), ViolationEventOutcome},
		"FailedWithoutText":     {failed(OutcomeError, runErr, WorkFailed, workErr, "failed", ""), ViolationEventOutcome},
		"FailedEndedLost":       {failed(OutcomeError, runErr, WorkFailed, workErr, "lost", `work "t": boom`), ViolationEventOutcome},
		"FailedEndedCancelled":  {failed(OutcomeError, runErr, WorkFailed, workErr, "cancelled", `work "t": boom`), ViolationEventOutcome},
		"FailedEndedReleased":   {failed(OutcomeError, runErr, WorkFailed, workErr, "released", ""), ViolationEventOutcome},
		"Stopped":               {failed(OutcomeStopped, "gormlease: stop requested", WorkInterrupted, "stop requested", "stopped", "stop requested"), ""},
		"StoppedEndedFailed":    {failed(OutcomeStopped, "gormlease: stop requested", WorkInterrupted, "stop requested", "failed", "stop requested"), ViolationEventOutcome},
		"Lost":                  {failed(OutcomeLost, "gormlease: lease lost", WorkInterrupted, "lease lost", "lost", "lease lost"), ""},
		"LostEndedStopped":      {failed(OutcomeLost, "gormlease: lease lost", WorkInterrupted, "lease lost", "stopped", "lease lost"), ViolationEventOutcome},
		"Cancelled":             {failed(OutcomeError, `gormlease: run "t": context canceled`, WorkInterrupted, "context canceled", "cancelled", `run "t": context canceled`), ""},
		"CancelledAsFailure":    {failed(OutcomeError, `gormlease: run "t": context canceled`, WorkInterrupted, "context canceled", "failed", `run "t": context canceled`), ViolationEventOutcome},
		"CancelledAfterFailure": {failed(OutcomeError, `gormlease: run "t": context canceled`, WorkFailed, workErr, "cancelled", `run "t": context canceled`), ""},
		"SaveFailed":            {failed(OutcomeError, `gormlease: commit "t": connection reset`, "", "", "save_failed", `commit "t": connection reset`), ""},
		"SaveFailedAsWorkFailure": {failed(OutcomeError, `gormlease: commit "t": connection reset`, "", "", "failed", `commit "t": connection reset`),
			ViolationEventOutcome},
		"CommitUnknown": {failed(OutcomeUnknown, "gormlease: commit: outcome unknown", "", "", "failed", "x"), ""},
	} {
		t.Run(name, func(t *testing.T) {
			got := kinds(Check(tc.in))
			if tc.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Equal(t, map[string]int{tc.want: 1}, got)
		})
	}
}

// A generation taken over unreleased ends expired, past its holder's
// timeout, by the takeover's own events (ended, then acquired), whatever
// its call returned; within the timeout, by the database's clock, it may
// read seized.
func TestCheck_EventsOfATakeover(t *testing.T) {
	// b's call failed, its release did not land, and c took generation 2
	// over at updated (its lease timeout is 1 ms from 590).
	takeover := func(updated int64, how string) Input {
		in := eventsClean()
		in.Events[9].Outcome, in.Events[9].Err = OutcomeError, `gormlease: work "t": boom; then release: connection refused`
		in.Events[8] = Event{Worker: "b", Run: 2, Kind: KindWorkEnd, Target: "t", Outcome: WorkFailed, Err: "boom", At: 700}
		in.Results = in.Results[:1]
		in.Changes[3] = Change{Target: "t", OldGen: 2, NewGen: 3, OldToken: "B", NewToken: "C", OldHolder: "b", NewHolder: "c",
			OldUpdated: 590, NewUpdated: updated, OldTimeoutMS: 1, NewTimeoutMS: 1, NewAcquired: updated, At: updated}
		in.LeaseEvents[6] = LeaseEvent{Target: "t", Seq: 7, At: updated, Kind: "ended", Gen: 2, Holder: "b", How: how, AcquiredAt: 590}
		in.LeaseEvents = append(in.LeaseEvents,
			LeaseEvent{Target: "t", Seq: 8, At: updated, Kind: "acquired", Gen: 3, Holder: "c", How: how, FromGen: 2})
		in.To = max(in.To, updated+100)
		return in
	}
	assert.Empty(t, kinds(Check(takeover(1700, "expired"))))
	assert.Equal(t, map[string]int{ViolationEventWrong: 2}, kinds(Check(takeover(1700, "seized"))), "seized, past the timeout")
	assert.Empty(t, kinds(Check(takeover(1590, "seized"))), "at the timeout, on the log's stamps")
	assert.Empty(t, kinds(Check(takeover(1590, "expired"))), "at the timeout, on the log's stamps")

	// Taken over, but recorded as released by its holder, with its cause.
	in := takeover(1700, "expired")
	in.LeaseEvents[6].How, in.LeaseEvents[6].Detail = "failed", `work "t": boom`
	in.LeaseEvents[7].How = "released"
	assert.Equal(t, map[string]int{ViolationEventWrong: 2}, kinds(Check(in)))
}

// A generation ended as stopped was asked to stop first, in seq order.
func TestCheck_StoppedAfterAStopRequest(t *testing.T) {
	in := eventsClean()
	in.Events[9].Outcome, in.Events[9].Err = OutcomeStopped, "gormlease: stop requested"
	in.Events[8] = Event{Worker: "b", Run: 2, Kind: KindWorkEnd, Target: "t", Outcome: WorkInterrupted, Err: "stop requested", At: 700}
	in.Results = in.Results[:1]
	in.LeaseEvents[6].How = "stopped"
	assert.Empty(t, kinds(Check(in)))
	// The stop request after the end: out of order, twice.
	in.LeaseEvents[5], in.LeaseEvents[6] = in.LeaseEvents[6], in.LeaseEvents[5]
	in.LeaseEvents[5].Seq, in.LeaseEvents[6].Seq = 6, 7
	assert.Equal(t, map[string]int{ViolationEventOrder: 2}, kinds(Check(in)))
}
