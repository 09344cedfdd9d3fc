package gormlease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/wait"
	"github.com/gormlease/gormlease/observe"
)

// ErrSharedJobFailed is matched by the *SharedJobError that Runner.Do
// returns when the job it waited for ended without saving: its work or
// saver failed or panicked, it was cancelled, or it lost its lease.
var ErrSharedJobFailed = errors.New("gormlease: shared job failed")

// SharedJobError is the error that Runner.Do returns to a caller that
// waited for another caller's job when that job ended without saving (the
// waiters do not run the work: call Do again for that). It is the same
// wherever the job ran, and unwraps to ErrSharedJobFailed, never to the
// job's own error.
type SharedJobError struct {
	// TargetID is the target of the job.
	TargetID string
	// Generation is the generation whose failure Message tells, or 0.
	Generation int64
	// WaitedFor is the generation waited for, when not Generation; else 0.
	WaitedFor int64
	// Message is the job's error message, as the lease row keeps it.
	Message string
}

// Error implements error.
func (e *SharedJobError) Error() string {
	if e.WaitedFor > 0 && e.WaitedFor != e.Generation {
		return fmt.Sprintf("gormlease: shared job %q (generation %d, after generation %d that was waited for ended without saving) failed: %s",
			e.TargetID, e.Generation, e.WaitedFor, e.Message)
	}
	if e.Generation > 0 {
		return fmt.Sprintf("gormlease: shared job %q (generation %d) failed: %s", e.TargetID, e.Generation, e.Message)
	}
	return fmt.Sprintf("gormlease: shared job %q failed: %s", e.TargetID, e.Message)
}

// Unwrap returns ErrSharedJobFailed, wherever the job ran.
func (e *SharedJobError) Unwrap() error { return ErrSharedJobFailed }

// endedWithoutSaving is the message of a job that ended without saving and
// left no failure: it was released by Repository.Release, or by force.
const endedWithoutSaving = "ended without saving a result"

// Do runs work once for everyone who asks for targetID at the same time,
// across goroutines, processes and machines (a distributed singleflight).
// When no one holds the target and no result was saved since the call
// began, Do runs work and save as Run does and returns (result, false, nil),
// or Run's error. When another holder's lease is live, Do waits for that
// job, holding no connection: when it saved, Do calls load in a transaction
// and returns (loaded, true, nil); when it ended without saving, Do returns
// a *SharedJobError and does not run the work. When the holder dies, or an
// operator stops the job, one waiting caller takes over and runs the work.
// While the target is paused, Do waits. With WithReuseFor(d), a result
// saved less than d ago is returned at once, through load, as shared.
//
// The calls of one Runner for one target in one process share one job or
// wait, with the first caller's work, save and context values (not its
// cancellation). A caller whose ctx ends stops waiting, with an error
// wrapping ctx.Err() and the *HeldError or *PausedError it waits on, if any;
// the job goes on for the others, and may still save. The last caller to
// leave cancels the job and waits for it to stop, and gets its result if it
// saved by then, or its ErrCommitUnknown if it may have. Do refuses a Runner
// with WithSlots or WithMinHold (ErrInvalidArgument).
//
// docs/reliability.md, section "Do, RunWait and the Elector: what they
// promise", says which results a call may share and when it runs the work;
// docs/design.md, section "Waiting and sharing results", how it waits. The
// context of load's tx carries no lease. With SaveJSON as save, load can be:
//
//	func(tx *gorm.DB) (T, error) { v, _, err := gormlease.LoadJSON[T](tx.Statement.Context, tx, targetID); return v, err }
func (r *Runner[T]) Do(ctx context.Context, targetID string,
	work func(ctx context.Context) (T, error), save func(tx *gorm.DB, result T) error,
	load func(tx *gorm.DB) (T, error),
) (result T, shared bool, err error) {
	var zero T
	if err := checkCall(ctx, targetID, work, save); err != nil {
		return zero, false, err
	}
	if r.cfg.slots > 1 {
		return zero, false, invalidf("Do: the Runner has WithSlots(%d): one shared result among %d holders means nothing; use Run or RunWait, or a Runner without slots",
			r.cfg.slots, r.cfg.slots)
	}
	if r.cfg.minHold > 0 {
		return zero, false, invalidf("Do: the Runner has WithMinHold, which Do cannot honour: its waiters wait for a generation to be released or saved; use a Runner without it")
	}
	if load == nil {
		return zero, false, invalidf("load function is nil")
	}
	began, again := time.Now(), false
	for {
		f, first := r.local.join(ctx, targetID, func(fctx context.Context, f *flight[T]) (T, bool, error) {
			return r.do(fctx, targetID, withGeneration(work, &f.generation), save, load, &f.held, began, again)
		})
		select {
		case <-f.done:
		case <-ctx.Done():
			if r.local.leave(targetID, f) {
				// The call was the job's last caller: the job, cancelled,
				// has stopped. When it had saved, or may have, by then
				// (its commit was under way), that is the call's outcome.
				switch {
				case f.err == nil:
					return f.value, !first || !f.ran, nil
				case f.ran && errors.Is(f.err, ErrCommitUnknown):
					return zero, false, f.err
				}
			}
			if held := f.held.Load(); held != nil {
				return zero, false, wrapf(&stoppedWaitingError{cause: ctx.Err(), held: held.err}, "do %q", targetID)
			}
			return zero, false, wrapf(ctx.Err(), "do %q", targetID)
		}
		r.local.leave(targetID, f)
		switch {
		case f.err == nil:
			return f.value, !first || !f.ran, nil
		case !first && f.generation > 0 && (errors.Is(f.err, ErrStopRequested) || errors.Is(f.err, ErrCommitUnknown)):
			// An operator stopped the job that ran here for the first
			// caller: it was given up, not failed, and the others take
			// over, as the callers in other processes do. Or its commit's
			// outcome is unknown: the others read the row, as the callers
			// in other processes do, and load what it saved, if it did.
			// Either way they began before that job's end.
			again = true
			continue
		case !first && f.generation > 0:
			// The work ran here, for the first caller: to the others it is
			// a shared job that failed, as it is to the callers in other
			// processes, which read its failure from the lease row. (An
			// acquire that failed ran nothing: they get its error.)
			var lost *SharedJobError
			if !errors.As(f.err, &lost) {
				return zero, true, &SharedJobError{TargetID: targetID, Generation: f.generation, Message: failureText(f.err)}
			}
		}
		return zero, !first || !f.ran, f.err
	}
}

// do is Do's shared job: it runs work, or waits for the job in progress
// and loads its result. ran reports whether it ran work. While it waits,
// held is the HeldError of the lease it waits for, as it last read it.
func (r *Runner[T]) do(ctx context.Context, targetID string,
	work func(context.Context) (T, error), save func(*gorm.DB, T) error, load func(*gorm.DB) (T, error),
	held *atomic.Pointer[refusal], began time.Time, again bool,
) (result T, ran bool, err error) {
	var zero T
	begin, tried := time.Now(), time.Time{}
	defer func() { r.waited(ctx, targetID, observe.EventDoWait, begin, tried) }()
	// The row as this call finds it, read by the call itself: the watch,
	// shared with others, may publish a later state before this call looks.
	// The first read is judged as the first read of the call only when it
	// is: a call that began again after its process's job was stopped or
	// left its commit unknown has waited since it began (see savedSince).
	st, sent, err := r.readState(ctx, targetID)
	if again {
		sent = time.Time{}
	}
	if err != nil && !backend.Unreachable(err) {
		return zero, false, wrapf(err, "do %q: read lease", targetID)
	}
	// When the database cannot be reached right now, the watch reads the
	// row until it can, as it does while Do waits.
	unread := err != nil
	// The watch is held only while this call waits, never while it runs the
	// work: a watch polls, and on PostgreSQL takes a listener connection and
	// marks the row as waited on, which a job that nobody waits for must not
	// cost.
	var w *wait.Watch
	defer func() {
		if w != nil {
			w.Unsubscribe()
		}
	}()
	var changed <-chan struct{}
	var waitFor int64 // the generation whose end Do waits for; 0 before it waits
	for {
		refused := false
		switch {
		case unread:
		case savedSince(st, began, sent, r.cfg.reuseFor), waitFor > 0 && st.SavedGeneration >= waitFor:
			tried = time.Now()
			v, err := r.load(ctx, targetID, load)
			return v, false, err
		case waitFor > 0 && st.Generation >= waitFor && st.Released && !st.Stopped:
			msg := st.Failure
			if msg == "" {
				msg = endedWithoutSaving
			}
			shared := &SharedJobError{TargetID: targetID, Generation: st.Generation, Message: msg}
			if st.Generation != waitFor {
				shared.WaitedFor = waitFor
			}
			return zero, false, shared
		case st.Live(r.cfg.leaseTimeout):
			waitFor = st.Generation
			held.Store(&refusal{r.heldError(targetID, st)})
		case st.Paused:
			// No one may start the job: wait for the Resume, then run it
			// or wait for whoever took the target first.
			held.Store(&refusal{&PausedError{Target: targetID, Reason: st.PauseReason}})
		default:
			// No one holds the target: run the work, unless another caller
			// took the target over since the row was read.
			if w != nil {
				w.Unsubscribe()
				w = nil
			}
			tried = time.Now()
			held.Store(nil)
			// A lease seen expired is taken over only while it is still
			// unreleased: its holder may yet save, and then this call loads
			// that result rather than make it again.
			expired := st.Found && !st.Released
			v, err := r.run(ctx, targetID, work, save, takeover{generation: st.Generation, expired: expired})
			if !errors.Is(err, ErrLeaseHeld) {
				// A refusal of the work's own (a *WorkError) is not this
				// call's: it ran, and failed.
				return v, true, err
			}
			var h *HeldError
			var p *PausedError
			switch {
			case errors.As(err, &p):
				// Paused since the row was read: wait for the Resume.
				held.Store(&refusal{p})
			case errors.As(err, &h):
				// A live lease refused it: wait for its end, whether it is
				// a later generation or the one seen expired, renewed by a
				// late heartbeat.
				held.Store(&refusal{h})
				waitFor = h.Generation
			case !expired:
				// Another caller took the target first, with the next
				// generation (or a later one): wait for the end of that
				// one, as read after the refusal.
				waitFor = st.Generation + 1
			default:
				// The expired lease ended since the row was read: its holder
				// saved, or failed, or another caller took it over. Its end
				// is what this call waits for; a later generation, read
				// live, is waited for in its turn.
				waitFor = st.Generation
			}
			refused = true
		}
		if w == nil {
			// A new watch starts from this call's read, unless that read
			// is older than the refusal.
			initial := &st
			if refused || unread {
				initial = nil
			}
			w = r.watch(targetID, initial)
			_, _, changed = w.Current()
		}
		if refused || unread {
			w.Poke()
		}
		if err := w.Next(ctx, changed); err != nil {
			if ctx.Err() == nil {
				return zero, false, wrapf(err, "do %q: read the lease it waits for", targetID)
			}
			if h := held.Load(); h != nil {
				return zero, false, wrapf(&stoppedWaitingError{cause: err, held: h.err}, "do %q", targetID)
			}
			return zero, false, wrapf(err, "do %q", targetID)
		}
		st, _, changed = w.Current()
		unread, sent = false, time.Time{}
	}
}

// savedSince reports whether st shows a result that Do shares: one saved
// after begin, when the call began, or within reuse. A save counts from the
// moment its fenced commit locked the row, which the row records
// (saved_at), on the database's clock: savedSince compares durations only.
//
// On the call's own first read, sent when the read was sent on its
// connection (see readState; the database took its ages later), a save counts only when it was surely after begin:
// a call that follows a job's end runs the work again, as it must. On any
// later read (sent zero), when the call has waited or its first reads
// failed, a save counts when it may have been after begin: the database
// took the ages before the read's answer came (st.Read). So a call whose
// first reads failed loads the result of a job that began and saved while
// it could not read, rather than run the work a second time; a save up to
// the read's latency (and savedSlack) before begin may count too.
func savedSince(st backend.State, begin, sent time.Time, reuse time.Duration) bool {
	switch {
	case st.SavedGeneration <= 0 || st.SavedAge < 0:
		return false
	case st.SavedAge < reuse:
		return true
	case !doFirstReadRule:
		return false
	case !sent.IsZero():
		return sent.Add(-st.SavedAge - savedSlack).After(begin)
	}
	return !st.Read.IsZero() && !st.Read.Add(-st.SavedAge+savedSlack).Before(begin)
}

// savedSlack covers the coarsest clock among the databases' (SQLite's
// milliseconds), by which a save could read as up to that much older or
// younger than it is.
const savedSlack = time.Millisecond

// withGeneration returns work, which records in *generation the
// generation of the lease it runs under.
func withGeneration[T any](work func(context.Context) (T, error), generation *int64) func(context.Context) (T, error) {
	return func(ctx context.Context) (T, error) {
		if l, ok := LeaseFromContext(ctx); ok {
			*generation = l.Generation
		}
		return work(ctx)
	}
}

// load calls load in a transaction, which read/write splitting plugins
// send to the primary, bounded by the operation timeout.
func (r *Runner[T]) load(ctx context.Context, targetID string, load func(*gorm.DB) (T, error)) (v T, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.operationTimeout)
	defer cancel()
	err = r.repo.db.WithContext(ctx).Transaction(func(tx *gorm.DB) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = &PanicError{Step: "load", Value: p, Stack: debug.Stack()}
			}
		}()
		v, err = load(tx)
		return err
	})
	if err != nil {
		var zero T
		return zero, wrapf(err, "load %q", targetID)
	}
	return v, nil
}

// RunWait is Run, except that while another holder's lease is live, or the
// target is paused, it waits, holding no connection, until the lease ends or
// the target is resumed, then tries again; ctx bounds the whole wait. With
// WithSlots(n) it waits while all n slots are held. A work's failure, and
// ErrSlotCountConflict, end the call at once. Each call runs its own work,
// under a lease of its own: N calls for a target run one at a time, in no
// promised order (across processes, not first come, first served). When ctx
// ends while it waits, its error wraps ctx.Err() and, once it has read the
// lease, the *HeldError or *PausedError that it waited on. docs/design.md,
// section "Waiting and sharing results", tells how it waits.
func (r *Runner[T]) RunWait(ctx context.Context, targetID string,
	work func(ctx context.Context) (T, error), save func(tx *gorm.DB, result T) error,
) (T, error) {
	return r.runWait(ctx, targetID, work, save, nil)
}

// runWait is RunWait, which calls seen, when not nil, with each read of
// targetID's row that found its lease ended and made it try again.
func (r *Runner[T]) runWait(ctx context.Context, targetID string,
	work func(ctx context.Context) (T, error), save func(tx *gorm.DB, result T) error, seen func(backend.State),
) (T, error) {
	var zero T
	if err := checkCall(ctx, targetID, work, save); err != nil {
		return zero, err
	}
	begin, tried := time.Now(), time.Time{}
	defer func() { r.waited(ctx, targetID, observe.EventRunWait, begin, tried) }()
	leave, err := r.local.enter(ctx, targetID, max(r.cfg.slots, 1))
	if err != nil {
		return zero, wrapf(err, "run %q: waiting in the process", targetID)
	}
	defer leave()
	for {
		tried = time.Now()
		v, err := r.Run(ctx, targetID, work, save)
		if !errors.Is(err, ErrLeaseHeld) {
			return v, err
		}
		refused := err
		if r.cfg.slots > 1 {
			err = r.waitSlotFree(ctx, targetID)
		} else {
			err = r.waitEnded(ctx, targetID, &refused, seen)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			return zero, wrapf(err, "run %q: read the lease it waits for", targetID)
		case err != nil:
			return zero, wrapf(&stoppedWaitingError{cause: err, held: refused}, "run %q", targetID)
		}
	}
}

// waitEnded waits until a read of targetID's row, made after it was
// called, shows the lease released or expired, or until ctx is done; it
// calls seen, when not nil, with that read. It holds the watch only while
// it waits, not while the next Run works. Each read that finds the lease
// live replaces *refused with the HeldError of what it read.
func (r *Runner[T]) waitEnded(ctx context.Context, targetID string, refused *error, seen func(backend.State)) error {
	w := r.watch(targetID, nil)
	defer w.Unsubscribe()
	_, _, changed := w.Current()
	w.Poke()
	for {
		if err := w.Next(ctx, changed); err != nil {
			return err
		}
		var st backend.State
		st, _, changed = w.Current()
		switch {
		case st.Paused:
			*refused = &PausedError{Target: targetID, Reason: st.PauseReason}
		case !st.Live(r.cfg.leaseTimeout):
			if seen != nil {
				seen(st)
			}
			return nil
		default:
			*refused = r.heldError(targetID, st)
		}
	}
}

// heldError is the HeldError of targetID's lease as st, a read that found
// it live, shows it.
func (r *Runner[T]) heldError(targetID string, st backend.State) *HeldError {
	timeout := st.Timeout
	if timeout <= 0 {
		timeout = r.cfg.leaseTimeout
	}
	return newHeldError(targetID, backend.NewHeld(st.Holder, st.Generation, timeout, st.Age).Since(st.HeldFor, st.MinHold))
}

// waitSlotFree is waitEnded for a Runner with slots: it waits until a read
// of one of the target's slot rows, made after it was called, shows that
// slot released or expired (or missing, for the acquire to make). It
// watches each slot's row, as waitEnded watches a target's.
func (r *Runner[T]) waitSlotFree(ctx context.Context, targetID string) error {
	watches := make([]*wait.Watch, r.cfg.slots)
	changed := make([]<-chan struct{}, len(watches))
	for i := range watches {
		watches[i] = r.watch(backend.SlotKey(targetID, i+1), nil)
		defer watches[i].Unsubscribe()
		_, _, changed[i] = watches[i].Current()
		watches[i].Poke()
	}
	for {
		i, err := wait.NextAny(ctx, changed)
		if err != nil {
			return err
		}
		if err := watches[i].Err(); err != nil {
			return err
		}
		var st backend.State
		st, _, changed[i] = watches[i].Current()
		if !st.Live(r.cfg.leaseTimeout) && !st.Paused {
			return nil
		}
	}
}

// localCalls are the calls of Do and RunWait in progress on one Runner, by
// target: Do's shared jobs, and RunWait's queues.
type localCalls[T any] struct {
	mu      sync.Mutex
	flights map[string]*flight[T]
	queues  map[string]*queue
}

// refusal is the refusal that a waiting Do last met: a *HeldError, or a
// *PausedError.
type refusal struct{ err error }

// flight is one shared job of Do in this process.
type flight[T any] struct {
	callers int
	cancel  context.CancelFunc
	done    chan struct{}
	// Set before done is closed.
	value      T
	ran        bool
	generation int64 // of the lease the work ran under; 0 if it did not run
	err        error
	// held is the lease that the job waits for, while it waits (see do).
	held atomic.Pointer[refusal]
}

// join joins the shared job on targetID, starting it with run when there is
// none; first reports whether it started it. run records in f.generation
// the generation of the lease its work runs under, and in f.held the lease
// it waits for. The job's context keeps ctx's values, not its
// cancellation. Call leave when done with it.
func (lc *localCalls[T]) join(ctx context.Context, targetID string,
	run func(ctx context.Context, f *flight[T]) (T, bool, error),
) (f *flight[T], first bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	f = lc.flights[targetID]
	if f == nil {
		if lc.flights == nil {
			lc.flights = map[string]*flight[T]{}
		}
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight[T]{cancel: cancel, done: make(chan struct{})}
		lc.flights[targetID] = f
		first = true
		go func() {
			defer close(f.done)
			defer cancel()
			defer lc.forget(targetID, f)
			// Stays the answer when the work or the saver calls runtime.Goexit.
			f.err = wrapf(errWorkExited, "do %q", targetID)
			f.value, f.ran, f.err = run(fctx, f)
		}()
	}
	f.callers++
	return f, first
}

// leave leaves f. The last caller to leave a job still in progress cancels
// it and waits for it to stop; last reports that it was, so that f's
// outcome is set.
func (lc *localCalls[T]) leave(targetID string, f *flight[T]) (last bool) {
	lc.mu.Lock()
	f.callers--
	last = f.callers == 0
	if last && lc.flights[targetID] == f {
		delete(lc.flights, targetID) // a later call starts a new job
	}
	lc.mu.Unlock()
	if last {
		f.cancel()
		<-f.done
	}
	return last
}

// forget removes f, which has ended, so that a later call starts anew.
func (lc *localCalls[T]) forget(targetID string, f *flight[T]) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.flights[targetID] == f {
		delete(lc.flights, targetID)
	}
}

// queue lets RunWait's calls for one target through one at a time, or as
// many at a time as the target has slots.
type queue struct {
	turn  chan struct{} // holds a value while a call has its turn
	calls int
}

// enter waits for the turn of a RunWait call on targetID, one of n at a
// time, until ctx is done, and returns the function that ends the turn.
func (lc *localCalls[T]) enter(ctx context.Context, targetID string, n int) (leave func(), err error) {
	lc.mu.Lock()
	q := lc.queues[targetID]
	if q == nil {
		if lc.queues == nil {
			lc.queues = map[string]*queue{}
		}
		q = &queue{turn: make(chan struct{}, n)}
		lc.queues[targetID] = q
	}
	q.calls++
	lc.mu.Unlock()
	done := func() {
		lc.mu.Lock()
		defer lc.mu.Unlock()
		if q.calls--; q.calls == 0 {
			delete(lc.queues, targetID)
		}
	}
	select {
	case q.turn <- struct{}{}:
		return func() { <-q.turn; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}
