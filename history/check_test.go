package history

import (
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
