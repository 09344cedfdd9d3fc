package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Fault is one fault the driver injected, on one worker or, for a
// failover, on the cluster (Worker "cluster"), from Start to End (Unix
// microseconds, wall clock).
type Fault struct {
	Kind       string
	Worker     string
	Start, End int64
	// HeldUp says that the fault may have held up what the worker did,
	// without failing it: its process stopped (SIGSTOP), what it sent
	// withheld and then delivered (a commit stall), or, on a cluster, a
	// failover (a statement may wait for a dying server) or a Galera
	// node's crash (the others hold commits until they drop it). A call
	// that the worker began in it may begin, or make its first read, only
	// when it ends. Check does not judge a call of Do by
	// ViolationDoRanAgain when such a fault overlaps the call's first
	// Input.CallLag (from its start), nor by ViolationDoStaleShare when
	// one overlaps any of the call (from its start to its end).
	HeldUp bool
}

// Input is everything Check reads: the workers' logs, the database's
// records, and the faults.
type Input struct {
	Events  []Event
	Results []Result
	Changes []Change
	Faults  []Fault
	// Pauses are the operator's pauses of targets (admin.Operator.Pause, then
	// Resume): no Run may start work on a paused target.
	Pauses []Pause
	// EventsKept says that the lease table keeps a history
	// (gormlease.WithHistory): LeaseEvents are all its events, which
	// Check cross-checks against Changes, the workers' Events and
	// OperatorCalls (see checkEvents).
	EventsKept  bool
	LeaseEvents []LeaseEvent
	// OperatorCalls are the operator's calls on the targets: Pause, Resume
	// and RequestStop, each sent until it landed.
	OperatorCalls []OperatorCall
	// Targets are the targets the workers ran on.
	Targets []string
	// From and To bound the run (wall clock, Unix microseconds).
	From, To int64
	// Recovery is how long after a fault ends its effects may last (a
	// lease left behind lives up to its timeout); Window is the shortest
	// quiet window in which every target must make progress.
	Recovery, Window time.Duration
	// Resolution is that of the database's stamps in the lease rows (1 ms
	// on SQLite, whose rows hold text with milliseconds; 0 elsewhere): a
	// takeover within it of the holder's expiry is not early.
	Resolution time.Duration
	// CallLag bounds, unless a fault held the worker up (Fault.HeldUp),
	// how long after a call of Do logged its start the library makes its
	// first read of the row, and how long a read takes: a save made within
	// it of the call's start may count, as far as the call can tell, as
	// made before or after it (see checkDo).
	CallLag time.Duration
	// VisualizeDir, when set, is where the model check draws each target's
	// history that is not linearizable.
	VisualizeDir string
}

// Pause is one pause of Target by the operator, who sends each call again
// until it lands (across a failover, an attempt may fail, or land without
// its answer): Sent is when the first Pause was sent; Committed when a
// Pause returned nil, so that the pause had committed (0: none did);
// Resumed when the first Resume was sent (wall clock, Unix microseconds).
// From Sent to Committed the pause may or may not be in effect, and from
// Resumed on it may be over: an acquisition begun after Committed that had
// taken the lease before Resumed broke the pause, and no other did. A pause
// that was never confirmed is checked nowhere.
type Pause struct {
	Target                   string
	Sent, Committed, Resumed int64
}

// Violation is one broken guarantee.
type Violation struct {
	// Kind is one of the Violation* constants.
	Kind   string
	Target string
	Detail string
}

// String says what was broken, where, and how.
func (v Violation) String() string { return fmt.Sprintf("%s on %q: %s", v.Kind, v.Target, v.Detail) }

// The kinds of Violation.
const (
	ViolationDoubleSave      = "double save"
	ViolationStaleSave       = "save by a generation after a later one started"
	ViolationLostResult      = "lost result"
	ViolationPhantomSave     = "save that Run did not report"
	ViolationForeignSave     = "save by no logged acquisition"
	ViolationEarlyTakeover   = "takeover before the holder's recorded expiry"
	ViolationNoProgress      = "no progress in a quiet window"
	ViolationNotLinearizable = "not linearizable"
	ViolationPausedStart     = "work started on a paused target"
	// Do's, in a call that did not share another's job in its process
	// (see Check).
	ViolationDoRanAgain     = "Do ran the work again for a wave that saved"
	ViolationDoStaleShare   = "Do shared a result saved before it began"
	ViolationDoFalseFailure = "Do reported a shared job failure that is not one"
	// Any call's: Run, Do and RunWait each run the work at most once.
	ViolationWorkedTwice = "a call ran its work more than once"
)

// Report is what Check found, with counts of what it checked.
type Report struct {
	Violations []Violation
	// Runs, Acquisitions, Saves and Changes count what was checked (Runs
	// every call: Run, RunWait, Do); Ops the operations of the model
	// check; Windows the quiet windows; Events the events of the history,
	// OperatorEvents those of them that the operator's calls wrote, and
	// EndsJudged the ended events judged by the call that held their
	// generation (a release's cause, or a save).
	Runs, Acquisitions, Saves, Changes, Ops, Windows int
	Events, OperatorEvents, EndsJudged               int
	// Ends counts the ended events by how.
	Ends map[string]int
	// Calls counts the calls by what was called, and Outcomes by outcome.
	Calls    map[string]int
	Outcomes map[string]int
	// Errors is the first error message of each call's outcome that is
	// an error.
	Errors map[string]string
}

// run is one call, of Run, RunWait or Do, put together from its events;
// or, when the call ran its work more than once, one of those works: each
// but the last ends as an error (none of them saved, or the call would
// have ended).
type run struct {
	worker, target string
	call           string // KindRun, KindRunWait or KindDo
	// again marks a work of the call after its first; superseded one
	// that the call's next work ended (its end is made up).
	again, superseded bool
	id                int64
	start, work       int64
	workEnd           int64
	save, end         int64 // 0: not logged
	gen               int64
	token, outcome    string
	err               string
	// holder is the holder name of the call's Runner (its work's log);
	// workOutcome and workErr what its work returned (WorkFailed,
	// WorkInterrupted, or "" for a value).
	holder, workOutcome, workErr string
	// tries is the number of works of the call (on its last run).
	tries int
	// Do's: see Event.
	shared         bool
	loaded, failed int64
}

// Check verifies in's history.
func Check(in Input) Report {
	rep := Report{Calls: map[string]int{}, Outcomes: map[string]int{}, Errors: map[string]string{}}
	runs := assemble(in.Events)
	byToken := map[string]*run{}
	for _, r := range runs {
		if r.token != "" {
			rep.Acquisitions++
			byToken[r.token] = r
		}
		if r.again {
			rep.Violations = append(rep.Violations, Violation{Kind: ViolationWorkedTwice, Target: r.target,
				Detail: fmt.Sprintf("%s %s %d ran its work again (work %d), under generation %d", r.worker, r.call, r.id, r.tries, r.gen)})
			continue // counted with its call
		}
		rep.Runs++
		rep.Calls[r.call]++
		if r.end != 0 {
			rep.Outcomes[r.outcome]++
			if _, ok := rep.Errors[r.outcome]; !ok && r.err != "" {
				rep.Errors[r.outcome] = r.err
			}
		} else {
			rep.Outcomes["no end (crashed)"]++
		}
	}
	rep.Saves, rep.Changes = len(in.Results), len(in.Changes)
	add := func(kind, target, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{Kind: kind, Target: target, Detail: fmt.Sprintf(format, args...)})
	}

	// A paused target starts no work: no Run that called Run after the
	// pause was confirmed had its lease (its work began) before the first
	// Resume was sent.
	for _, p := range in.Pauses {
		if p.Committed == 0 {
			continue // never confirmed: it may not have landed at all
		}
		for _, r := range runs {
			if r.target == p.Target && r.token != "" && r.start > p.Committed && r.work < p.Resumed {
				add(ViolationPausedStart, r.target, "%s run %d called Run at %s and began generation %d's work at %s, within the pause from %s to %s",
					r.worker, r.id, micros(r.start), r.gen, micros(r.work), micros(p.Committed), micros(p.Resumed))
			}
		}
	}

	// No double save per (target, generation); each save by a logged
	// acquisition of that generation, whose Run did not deny it.
	saved := map[string]map[int64]int{}
	savedBy := map[string]Result{}
	for _, res := range in.Results {
		if saved[res.Target] == nil {
			saved[res.Target] = map[int64]int{}
		}
		saved[res.Target][res.Gen]++
		if saved[res.Target][res.Gen] == 2 {
			add(ViolationDoubleSave, res.Target, "generation %d saved more than once", res.Gen)
		}
		savedBy[res.Token] = res
		r := byToken[res.Token]
		switch {
		case r == nil || r.target != res.Target || r.gen != res.Gen:
			add(ViolationForeignSave, res.Target, "generation %d saved with token %s (value %s)", res.Gen, res.Token, res.Value)
		case r.end != 0 && r.outcome != OutcomeOK && r.outcome != OutcomeUnknown:
			add(ViolationPhantomSave, res.Target, "generation %d (%s %s %d) saved, but it returned %s: %s", res.Gen, r.worker, r.call, r.id, r.outcome, r.err)
		}
	}
	// No lost result: a Run that returned nil has its row.
	for _, r := range runs {
		if r.end != 0 && r.outcome == OutcomeOK {
			if _, ok := savedBy[r.token]; !ok {
				add(ViolationLostResult, r.target, "%s run %d returned nil for generation %d, and no result row has its token", r.worker, r.id, r.gen)
			}
		}
	}

	// No save by a generation after a later one started: on the
	// database's clock (the save's INSERT after the later acquisition's
	// change of the row), and on the wall clock (the saver started after
	// the later generation's work did).
	acquiredAt := map[string][]Change{}
	for _, c := range in.Changes {
		if c.Takeover() {
			acquiredAt[c.Target] = append(acquiredAt[c.Target], c)
		}
	}
	for _, res := range in.Results {
		for _, c := range acquiredAt[res.Target] {
			if c.At != 0 && c.NewGen > res.Gen && c.At < res.At {
				add(ViolationStaleSave, res.Target, "generation %d saved at %s, after generation %d was acquired at %s (database clock)",
					res.Gen, micros(res.At), c.NewGen, micros(c.At))
				break
			}
		}
		r := byToken[res.Token]
		if r == nil || r.save == 0 {
			continue
		}
		for _, later := range runs {
			if later.target == r.target && later.gen > r.gen && later.work != 0 && later.work < r.save {
				add(ViolationStaleSave, res.Target, "generation %d's saver started at %s, after generation %d's work started at %s (wall clock)",
					r.gen, micros(r.save), later.gen, micros(later.work))
				break
			}
		}
	}

	// No takeover before the holder's own recorded expiry: a change that
	// starts a new generation on a row not released comes at least the
	// old holder's timeout_ms after its last renewal (the database's
	// stamps, both).
	for _, c := range in.Changes {
		if c.Insert || !c.Takeover() {
			continue
		}
		if c.NewGen < c.OldGen {
			add(ViolationEarlyTakeover, c.Target, "generation went back from %d to %d", c.OldGen, c.NewGen)
		}
		if c.OldReleased != 0 {
			continue
		}
		if age := c.NewUpdated - c.OldUpdated; age+in.Resolution.Microseconds() < c.OldTimeoutMS*1000 {
			add(ViolationEarlyTakeover, c.Target, "generation %d taken over by %d after %v, within its holder's timeout of %v",
				c.OldGen, c.NewGen, time.Duration(age)*time.Microsecond, time.Duration(c.OldTimeoutMS)*time.Millisecond)
		}
	}

	checkDo(in, runs, saved, add)

	if in.EventsKept {
		checkEvents(in, runs, saved, &rep, add)
	}

	// Liveness: in every quiet window, each target has a Run that saved.
	windows := quietWindows(in)
	rep.Windows = len(windows)
	for _, w := range windows {
		for _, target := range in.Targets {
			ok := false
			for _, r := range runs {
				if r.target == target && r.outcome == OutcomeOK && r.end >= w[0] && r.end <= w[1] {
					ok = true
					break
				}
			}
			if !ok {
				add(ViolationNoProgress, target, "no Run saved from %s to %s", micros(w[0]), micros(w[1]))
			}
		}
	}

	// The model check.
	ops, vs := linearizable(runs, in.Results, in.VisualizeDir)
	rep.Ops = ops
	rep.Violations = append(rep.Violations, vs...)
	return rep
}

// assemble puts each Run together from its events.
func assemble(events []Event) []*run {
	type key struct {
		worker string
		id     int64
	}
	byKey := map[key]*run{}
	var runs []*run
	for _, e := range events {
		k := key{e.Worker, e.Run}
		r := byKey[k]
		if r == nil {
			r = &run{worker: e.Worker, id: e.Run, target: e.Target}
			byKey[k] = r
			runs = append(runs, r)
		}
		switch e.Kind {
		case KindRun, KindRunWait, KindDo:
			r.start, r.call = e.At, e.Kind
		case KindWork:
			if r.token != "" {
				// The call runs its work again: the work before ended
				// without a save that counts.
				r.end, r.outcome, r.err, r.superseded = e.At, OutcomeError, "the call ran its work again", true
				r = &run{worker: e.Worker, id: e.Run, target: e.Target, call: r.call, start: r.start, tries: r.tries, again: true}
				byKey[k] = r
				runs = append(runs, r)
			}
			r.work, r.gen, r.token, r.holder = e.At, e.Gen, e.Token, e.Holder
			r.tries++
		case KindWorkEnd:
			r.workEnd, r.workOutcome, r.workErr = e.At, e.Outcome, e.Err
		case KindSave:
			r.save = e.At
		case KindEnd:
			r.end, r.outcome, r.err = e.At, e.Outcome, e.Err
			r.shared, r.loaded, r.failed = e.Shared, e.Loaded, e.Failed
		}
	}
	return runs
}

// checkDo checks the promise of each call of Do, which shares no job with
// another call in its process (each Do loop of a worker has a Runner of
// its own); saved counts the saves of each target's generations.
//
// A call that began while a generation of its target was unsaved does not
// run the work under a later generation when that one saved after the call
// began: the call's answer is that save (ViolationDoRanAgain). The
// generation counts as unsaved from its work's start (before the call
// began) until its work ended (after the call began, by more than
// in.CallLag): its save's transaction, and so the save, came after. Do
// promises it for a save made after its first read, or during first
// reads that failed; its first read that works, within in.CallLag of the
// call's start, unless a fault held its worker up then: a call that
// began then is not judged so. This is looser than Do's contract, which
// holds for any save between the call's start and its acquisition: a
// wave whose work began after the call is not checked.
//
// A result shared by the call (nil, shared) is one that was saved after
// the call began: not one whose call had returned more than in.CallLag
// before (ViolationDoStaleShare). Do may take a save made before it began
// by up to the latency of the read that found it, when its first reads
// failed; in.CallLag bounds that latency unless a fault held the worker
// up during the call, and a call during which one did is not judged so.
// Only results whose call returned nil are checked (not the save of a
// worker that crashed, nor one whose commit's outcome was unknown), and
// by that call's return, which comes after its save.
//
// And a SharedJobError names a generation that saved nothing, for a call
// that did not run the work itself (ViolationDoFalseFailure).
func checkDo(in Input, runs []*run, saved map[string]map[int64]int,
	add func(kind, target, format string, args ...any),
) {
	lag := in.CallLag.Microseconds()
	savedBy := map[string]map[int64]*run{} // by target and generation
	for _, r := range runs {
		if r.token != "" && saved[r.target][r.gen] > 0 {
			if savedBy[r.target] == nil {
				savedBy[r.target] = map[int64]*run{}
			}
			savedBy[r.target][r.gen] = r
		}
	}
	for _, c := range runs {
		if c.call != KindDo || c.again {
			continue
		}
		if c.token != "" && !heldUp(in.Faults, c.worker, c.start, c.start+lag) {
			for gen, x := range savedBy[c.target] {
				if gen < c.gen && x.work < c.start && x.workEnd > c.start+lag {
					add(ViolationDoRanAgain, c.target, "%s do %d, called at %s while generation %d (%s %s %d) worked from %s to %s and then saved, ran the work under generation %d at %s",
						c.worker, c.id, micros(c.start), gen, x.worker, x.call, x.id, micros(x.work), micros(x.workEnd), c.gen, micros(c.work))
					break
				}
			}
		}
		switch c.outcome {
		case OutcomeShared:
			if x := savedBy[c.target][c.loaded]; x != nil && x.end != 0 && x.outcome == OutcomeOK && x.end < c.start-lag &&
				!heldUp(in.Faults, c.worker, c.start, c.end) {
				add(ViolationDoStaleShare, c.target, "%s do %d, called at %s, shared generation %d's result, whose %s %d had returned at %s",
					c.worker, c.id, micros(c.start), c.loaded, x.call, x.id, micros(x.end))
			}
		case OutcomeSharedFailed:
			if c.token != "" {
				add(ViolationDoFalseFailure, c.target, "%s do %d ran the work itself (generation %d), and returned a SharedJobError for generation %d",
					c.worker, c.id, c.gen, c.failed)
			}
			if saved[c.target][c.failed] > 0 {
				add(ViolationDoFalseFailure, c.target, "%s do %d returned a SharedJobError for generation %d, which saved",
					c.worker, c.id, c.failed)
			}
		}
	}
}

// heldUp reports whether a fault that holds up a worker's statements (see
// Fault.HeldUp) was in effect on worker (named w<n>.<incarnation>, whose
// faults name it n), or on the cluster, at some time from from to to.
func heldUp(faults []Fault, worker string, from, to int64) bool {
	n, _, _ := strings.Cut(strings.TrimPrefix(worker, "w"), ".")
	for _, f := range faults {
		if f.HeldUp && (f.Worker == n || f.Worker == "cluster") && f.Start <= to && from <= f.End {
			return true
		}
	}
	return false
}

// quietWindows returns the windows of at least in.Window in which no
// fault was in effect: each fault from its start to in.Recovery after its
// end, and the run's first in.Recovery too (the workers start up).
func quietWindows(in Input) [][2]int64 {
	rec := in.Recovery.Microseconds()
	busy := [][2]int64{{in.From, in.From + rec}}
	for _, f := range in.Faults {
		busy = append(busy, [2]int64{f.Start, f.End + rec})
	}
	sort.Slice(busy, func(i, j int) bool { return busy[i][0] < busy[j][0] })
	var windows [][2]int64
	free := in.From
	for _, b := range busy {
		if b[0]-free >= in.Window.Microseconds() {
			windows = append(windows, [2]int64{free, b[0]})
		}
		free = max(free, b[1])
	}
	if in.To-free >= in.Window.Microseconds() {
		windows = append(windows, [2]int64{free, in.To})
	}
	return windows
}

func micros(us int64) string {
	return time.UnixMicro(us).UTC().Format("15:04:05.000000")
}
