package gormlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"

	"github.com/gormlease/gormlease/observe"
)

// Runner runs work once per target at a time, under a heartbeat lease, and
// saves its result of type T only while the lease is still its own. It is
// safe for concurrent use, holds no goroutine or connection between Runs,
// and needs no closing.
type Runner[T any] struct {
	repo   *Repository
	beater *Repository // the heartbeats' Repository: repo, or on WithHeartbeatDB's db
	cfg    config
	local  localCalls[T] // the calls of Do and RunWait in progress, by target
	mon    monitor       // WithLogger's and WithObserver's
	report any           // the Report of the heartbeats' settings, made once (see startHeartbeat)
}

// NewRunner returns a Runner on db, a *gorm.DB from gorm.Open on a supported
// database, not inside a transaction. For options out of range or at odds
// with each other it returns an error wrapping ErrInvalidArgument that
// names the option at fault; it refuses db's settings as NewRepository
// does. It writes nothing; create the tables with AutoMigrate.
func NewRunner[T any](db *gorm.DB, opts ...Option) (*Runner[T], error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	repo, err := newRepository(db, cfg)
	if err != nil {
		return nil, err
	}
	beater := repo
	if cfg.heartbeatDB != nil {
		beater, err = newRepository(cfg.heartbeatDB, cfg)
		if err != nil {
			return nil, wrapf(err, "WithHeartbeatDB")
		}
		if got, want := cfg.heartbeatDB.Dialector.Name(), db.Dialector.Name(); got != want {
			return nil, invalidf("WithHeartbeatDB: db is %s but the Runner's database is %s", got, want)
		}
	}
	mon := monitor{log: cfg.logger, obs: cfg.observer, holder: cfg.holder, table: cfg.tables.lease,
		slow: cfg.heartbeatInterval / slowHeartbeatFraction}
	r := &Runner[T]{repo: repo, beater: beater, cfg: cfg, mon: mon}
	r.report = reportKey{logger: r.mon.log, observer: observerKey(&r.mon)}
	return r, nil
}

// Repository returns the Repository that the Runner runs its steps with.
func (r *Runner[T]) Repository() *Repository { return r.repo }

// Run runs work for targetID under a lease, then saves its result with save,
// once, if the lease is still the caller's.
//
// When another holder's lease on targetID is live, or the target is paused,
// Run returns a *HeldError (ErrLeaseHeld) or a *PausedError at once, without
// calling work. Otherwise work runs on the calling goroutine, holding no
// connection, while a heartbeat renews the lease. Its context carries the
// lease (LeaseFromContext) and is cancelled with ctx, or with a cause that
// Run returns, saving nothing: the lease lost (ErrLeaseLost), WithMaxHold
// passed (ErrMaxHoldExceeded), or an operator's stop (ErrStopRequested).
// When work succeeds, save runs in the fenced commit, as CommitIfOwner runs
// its fn, and the same transaction releases the lease (with WithMinHold,
// while the hold lasts, the lease is held to its end instead); a lease
// taken over meanwhile saves nothing (ErrLeaseLost). Otherwise the lease is
// released on a context that survives ctx's cancellation; with WithMinHold
// it is held to the hold's end instead, unless an operator asked the holder
// to stop.
//
// Run returns only after work has returned, the heartbeat has stopped, and
// the result was committed or discarded; when work or save calls
// runtime.Goexit, Run does not return, but still releases the lease. It
// returns work's result, and nil, only when save committed; save gets a copy
// (make T a pointer type to get back what the save assigns). An error of
// work or save comes back as a *WorkError (or, when the work's context had
// ended, as its cause), a panic as a *PanicError.
//
// While the database cannot be reached, Run tries its acquire and its fenced
// commit again within WithReconnectWindow. save may be called again after a
// call whose transaction was rolled back (at most one call's writes are
// committed), so keep its effects inside tx. When Run cannot tell whether its
// COMMIT took effect, its error wraps ErrCommitUnknown. docs/design.md,
// sections Lifecycle and Failure model, tells each step and each recovery.
func (r *Runner[T]) Run(ctx context.Context, targetID string,
	work func(ctx context.Context) (T, error),
	save func(tx *gorm.DB, result T) error,
) (T, error) {
	var zero T
	if err := checkCall(ctx, targetID, work, save); err != nil {
		return zero, err
	}
	return r.run(ctx, targetID, work, save, anyGeneration)
}

// takeover is the generation that an acquire may take over: any
// (anyGeneration), or only generation (0: only when the target has no
// row), and, with expired, only while that
// generation is unreleased.
type takeover struct {
	generation int64
	expired    bool
}

// anyGeneration is run's from when any generation may be taken over.
var anyGeneration = takeover{generation: backend.AnyGeneration}

// run is Run, taking the target over only as from allows, and with its
// arguments checked.
func (r *Runner[T]) run(ctx context.Context, targetID string,
	work func(ctx context.Context) (T, error), save func(tx *gorm.DB, result T) error, from takeover,
) (_ T, err error) {
	var zero T
	m := &r.mon
	if m.obs != nil {
		var end func(error)
		ctx, end = m.start(ctx, observe.Span{Kind: observe.SpanRun, TargetID: targetID})
		defer func() { end(err) }()
	}
	ctx = withStatements(ctx, m)

	acquireCtx, endAcquire := m.start(ctx, observe.Span{Kind: observe.SpanAcquire, TargetID: targetID})
	var (
		lease Lease
		began = time.Now()
		sent  time.Time // when the statement that took the lease was sent
	)
	// Each attempt within the operation timeout; while the database cannot
	// be reached, attempts within the reconnect window.
	actx, cancel := context.WithTimeout(acquireCtx, r.cfg.reconnect())
	if r.cfg.slots > 1 {
		lease, sent, err = r.repo.acquireSlotEach(actx, targetID, r.cfg.slots, r.cfg.leaseTimeout, r.cfg.operationTimeout, time.Time{})
	} else {
		lease, sent, err = r.repo.acquireEach(actx, targetID, r.cfg.leaseTimeout, from, r.cfg.operationTimeout, time.Time{})
	}
	cancel()
	r.acquired(ctx, targetID, lease, began, err, endAcquire)
	if err != nil {
		return zero, err
	}
	defer r.leaseEnded(ctx, lease, sent)
	// A work or saver that calls runtime.Goexit (t.FailNow does) unwinds
	// through here without returning: hold has stopped the heartbeat, and
	// the lease, still held, is released before the goroutine exits.
	returned := false
	defer func() {
		if !returned {
			_ = r.releaseAfter(ctx, lease, sent, backend.EndFailed, wrapf(errWorkExited, "run %q", targetID))
		}
	}()
	result, err := r.hold(ctx, lease, sent, work, save)
	returned = true
	return result, err
}

// hold is run from the moment the lease is acquired: it runs work under the
// heartbeat, then the fenced commit or the release.
func (r *Runner[T]) hold(ctx context.Context, lease Lease, sent time.Time,
	work func(ctx context.Context) (T, error), save func(tx *gorm.DB, result T) error,
) (T, error) {
	var zero T
	m := &r.mon
	targetID := lease.TargetID
	workCtx, cancelWork := context.WithCancelCause(withLease(ctx, lease, r.repo.tables))
	defer cancelWork(context.Canceled)
	hb := r.startHeartbeat(workCtx, lease, sent, cancelWork)
	defer hb.Stop() // after runtime.Goexit in work; Stop is idempotent
	var maxHold *time.Timer
	if r.cfg.maxHold > 0 {
		maxHold = time.AfterFunc(r.cfg.maxHold, func() {
			cancelWork(&lossCause{kind: observe.EventMaxHoldExceeded, err: fmt.Errorf(
				"gormlease: run %q: work still running after the max hold of %v: %w",
				targetID, r.cfg.maxHold, ErrMaxHoldExceeded)})
		})
		defer maxHold.Stop() // after runtime.Goexit in work
	}
	result, workErr := callWork(workCtx, work)
	if maxHold != nil {
		maxHold.Stop()
	}
	hb.Stop()

	switch cause := context.Cause(workCtx); {
	case errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrMaxHoldExceeded):
		r.lost(ctx, lease, sent, cause)
		end := backend.EndLost
		if errors.Is(cause, ErrMaxHoldExceeded) {
			end = backend.EndMaxHold
		}
		return zero, r.releaseAfter(ctx, lease, sent, end, cause)
	case errors.Is(cause, ErrStopRequested):
		r.stopped(ctx, lease, sent, cause)
		return zero, r.releaseAfter(ctx, lease, sent, backend.EndStopped, cause)
	case cause != nil:
		return zero, r.releaseAfter(ctx, lease, sent, backend.EndCancelled, wrapf(cause, "run %q", targetID))
	case workErr != nil:
		if _, panicked := workErr.(*PanicError); panicked {
			// the panic says "work panicked"
			return zero, r.releaseAfter(ctx, lease, sent, backend.EndPanic, wrapf(workErr, "run %q", targetID))
		}
		return zero, r.releaseAfter(ctx, lease, sent, backend.EndFailed,
			&WorkError{Step: "work", Target: targetID, Generation: lease.Generation, Err: workErr})
	}

	commitCtx, endCommit := m.start(ctx, observe.Span{Kind: observe.SpanCommit, TargetID: targetID, Generation: lease.Generation})
	begin := time.Now()
	outcome, err := r.commit(commitCtx, lease, sent, func(tx *gorm.DB) error { return callSave(tx, save, result) })
	r.committed(ctx, lease, outcome, sent, begin, err, endCommit)
	if outcome != commitSaved {
		return zero, err
	}
	return result, nil
}

// commit runs the fenced commit of a Run that holds lease, with save, and
// returns its outcome and Run's error.
func (r *Runner[T]) commit(ctx context.Context, lease Lease, sent time.Time, save func(tx *gorm.DB) error) (commitOutcome, error) {
	release, err := r.commitOnce(ctx, lease, sent, save)
	if err == nil {
		return r.saved(ctx, lease, sent), nil
	}
	return r.commitFailed(ctx, lease, sent, failedSince(err), save, release, err)
}

// commitOnce is one fenced commit of lease, with save, under the operation
// timeout: the save and the release, or, while a minimum hold lasts, the
// save alone. release reports which. A saver that runs past the timeout
// gets an error naming it (see saverEnded in internal/backend/fence.go).
func (r *Runner[T]) commitOnce(ctx context.Context, lease Lease, sent time.Time,
	save func(tx *gorm.DB) error,
) (release bool, _ error) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.cfg.operationTimeout, &commitTimeoutError{r.cfg.operationTimeout})
	defer cancel()
	if r.holdLeft(sent) > 0 {
		return false, r.repo.CommitIfOwner(ctx, lease, save)
	}
	return true, r.repo.commitAndRelease(ctx, lease, save)
}

// commitTimeoutError is the cause of a fenced commit's context that ended
// at the operation timeout: it says which option to raise, and wraps
// context.DeadlineExceeded.
type commitTimeoutError struct{ timeout time.Duration }

func (e *commitTimeoutError) Error() string {
	return fmt.Sprintf("the fenced commit ran past the operation timeout of %v (WithOperationTimeout)", e.timeout)
}

func (e *commitTimeoutError) Unwrap() error { return context.DeadlineExceeded }

// saved ends a Run whose fenced commit saved: it keeps the lease held for
// the rest of the minimum hold, when one is left (the commit saved without
// releasing then), and wakes the target's waiters.
func (r *Runner[T]) saved(ctx context.Context, lease Lease, sent time.Time) commitOutcome {
	if r.holdLeft(sent) > 0 {
		r.holdFor(ctx, lease, sent, backend.EndSaved, nil)
	}
	r.wake(lease)
	return commitSaved
}

// holdLeft is how much of the minimum hold (WithMinHold) remains of a lease
// whose acquire was sent at sent: 0 without one.
func (r *Runner[T]) holdLeft(sent time.Time) time.Duration {
	if r.cfg.minHold <= 0 {
		return 0
	}
	return r.cfg.minHold - time.Since(sent)
}

// holdFor keeps lease held for the rest of its minimum hold, in place of
// its release, on a context that survives ctx's cancellation, recording
// end as how its generation ended and runErr (nil for none) as its
// failure. When that fails the lease stays held until its timeout: longer,
// never shorter. It reports whether the lease is held so.
func (r *Runner[T]) holdFor(ctx context.Context, lease Lease, sent time.Time, end string, runErr error) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.operationTimeout)
	defer cancel()
	hold := r.holdLeft(sent)
	if hold <= 0 {
		return false
	}
	var failure *string
	if runErr != nil {
		text := failureText(runErr)
		failure = &text
	}
	err := r.repo.hold(ctx, lease, hold, &end, failure)
	switch {
	case err == nil:
		r.mon.logLease(ctx, slog.LevelDebug, "gormlease: lease held for the rest of its minimum hold", lease,
			slog.Duration("hold", hold))
		return true
	case errors.Is(err, ErrLeaseLost):
		return false
	}
	r.mon.logLease(ctx, slog.LevelWarn, "gormlease: minimum hold not recorded, the lease stays held until it times out",
		lease, slog.Any("error", err))
	return true
}

// commitFailed handles a fenced commit of lease that failed with err,
// having first met its failure at failed (see failedSince); release says
// whether it was a save-and-release. A commit that saved nothing while the
// lease stayed the Run's (its transaction ended before its COMMIT, or a
// save-and-release's COMMIT that got no answer is settled as rolled back)
// is run again, with save, until it saves, the lease is lost, or the
// reconnect window has passed since failed: the database going away for a
// moment (a switchover, a failover, a restart) does not throw the work's
// result away, however long the saver ran before it did. A
// save-and-release that committed released the lease, so that the lock of
// the commit run again fails; a save alone (during a minimum hold) leaves
// it held, and is not run again after a COMMIT without an answer. At most
// commitAttempts commits are sent in all, with pauses between them as
// between reconnects.
func (r *Runner[T]) commitFailed(ctx context.Context, lease Lease, sent, failed time.Time,
	save func(tx *gorm.DB) error, release bool, err error,
) (commitOutcome, error) {
	settled := false // err follows a COMMIT settled as rolled back
	attempt := 1
	pause := backend.ReconnectBackoff()
	for {
		var unknown *commitUnknownError
		switch {
		case errors.As(err, &unknown):
			switch r.settleCommit(ctx, lease, failed) {
			case settledSaved:
				return r.saved(ctx, lease, sent), nil
			case settledUnknown:
				return commitUnknown, err
			case settledLost:
				return commitFailed, nothingSaved(lease, unknown)
			}
			// Nothing saved, and the lease is still the Run's.
			if err = nothingSaved(lease, unknown); !release {
				return commitFailed, r.releaseAfter(ctx, lease, sent, commitEnd(ctx, err), err)
			}
			settled = true
		case errors.Is(err, ErrLeaseLost) && settled:
			// A COMMIT settled as rolled back was taken for one that had not
			// ended yet, on a database whose settling read does not wait for
			// it: it may have saved since.
			if r.settleCommit(ctx, lease, failed) == settledSaved {
				return r.saved(ctx, lease, sent), nil
			}
			return commitLost, err
		case errors.Is(err, ErrLeaseLost):
			return commitLost, err
		case !endedBeforeCommit(err):
			// The transaction was rolled back: the lease is still ours, or
			// already gone, and releasing is safe.
			return commitFailed, r.releaseAfter(ctx, lease, sent, commitEnd(ctx, err), err)
		}
		attempt++
		if attempt > commitAttempts || time.Since(failed) >= r.cfg.reconnect() || !pause.Wait(ctx) {
			return commitFailed, r.releaseAfter(ctx, lease, sent, commitEnd(ctx, err), err)
		}
		r.mon.logLease(ctx, slog.LevelDebug, "gormlease: fenced commit ended without saving, committing again", lease,
			slog.Any("reason", err))
		if release, err = r.commitOnce(ctx, lease, sent, save); err == nil {
			return r.saved(ctx, lease, sent), nil
		}
	}
}

// commitAttempts bounds how many fenced commits a Run sends in all when
// they end without saving (see commitFailed): the database went away for
// a moment, which a second commit, or a third, rides through; a saver
// whose transaction keeps failing so is not called for ever.
const commitAttempts = 4

// checkCall returns an error wrapping ErrInvalidArgument when the
// arguments of a Run, RunWait or Do cannot be run.
func checkCall[T any](ctx context.Context, targetID string,
	work func(context.Context) (T, error), save func(*gorm.DB, T) error,
) error {
	switch {
	case ctx == nil:
		return invalidf("context is nil")
	case work == nil:
		return invalidf("work function is nil")
	case save == nil:
		return invalidf("save function is nil")
	}
	return checkTargetID(targetID)
}

// releaseAfter releases lease after Run failed with runErr, recording end
// (backend.EndFailed, ...) as how its generation ended, and returns
// runErr, with the release's own error added when that failed for a reason
// other than the lease being gone already.
func (r *Runner[T]) releaseAfter(ctx context.Context, lease Lease, sent time.Time, end string, runErr error) error {
	// A holder asked to stop gives the lease up at once, minimum hold or
	// not, so that another can take over.
	stopped := errors.Is(runErr, ErrStopRequested)
	if !stopped && r.holdLeft(sent) > 0 && r.holdFor(ctx, lease, sent, end, runErr) {
		return runErr // held for the rest of the minimum hold instead
	}
	err := r.releaseFailed(ctx, lease, end, runErr)
	if err == nil {
		r.wake(lease)
	}
	if err == nil || errors.Is(err, ErrLeaseLost) {
		r.mon.logLease(ctx, slog.LevelDebug, "gormlease: lease released", lease, slog.Any("reason", runErr))
		return runErr
	}
	r.mon.logLease(ctx, slog.LevelError, "gormlease: release failed, the lease stays held until it times out", lease,
		slog.Any("error", err), slog.Any("reason", runErr))
	return &cleanupError{err: runErr, cleanup: err}
}

// releaseFailed releases lease with runErr as its failure, on a context
// that survives ctx's cancellation, each attempt within the operation
// timeout. While the database cannot be reached right now (on SQLite, its
// write lock still taken by others past that timeout) it tries again, for
// the reconnect window and at least the operation timeout: a lease left
// held would keep the target from everyone until it timed out. A release
// whose answer was lost and that did release is found so by the next
// attempt, which then reports the lease gone.
func (r *Runner[T]) releaseFailed(ctx context.Context, lease Lease, end string, runErr error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(r.cfg.operationTimeout, r.cfg.reconnect()))
	defer cancel()
	b := backend.ReconnectBackoff()
	for {
		actx, acancel := context.WithTimeout(ctx, r.cfg.operationTimeout)
		err := r.repo.releaseFailed(actx, lease, end, runErr)
		acancel()
		if err == nil || !backend.Unreachable(err) || !b.Wait(ctx) {
			return err
		}
	}
}

// commitEnd is how a generation whose fenced commit failed with err ended:
// by a panic of the saver, the caller's context, or the save's failure.
func commitEnd(ctx context.Context, err error) string {
	var panicked *PanicError
	switch {
	case errors.As(err, &panicked):
		return backend.EndPanic
	case ctx.Err() != nil:
		return backend.EndCancelled
	}
	return backend.EndSaveFailed
}

// nothingSaved is Run's error after a COMMIT that got no answer was settled
// as rolled back.
func nothingSaved(lease Lease, unknown *commitUnknownError) error {
	return wrapf(unknown.cause, "commit %q: the connection failed during COMMIT and the database shows nothing saved",
		lease.TargetID)
}

// settlement is what settleCommit found out about a COMMIT that got no
// answer.
type settlement uint8

const (
	settledUnknown settlement = iota // it cannot tell
	settledSaved                     // the commit took effect
	settledHeld                      // it did not, and the lease is still the Run's
	settledLost                      // it did not, and the lease is gone
)

// settleCommit finds out, after a commit whose COMMIT got no answer,
// whether that commit took effect, by reading the lease row: the commit
// records its generation as the saved one, in the same transaction, so a
// saved generation equal to the lease's proves that it took effect, and an
// older one (or none) that it did not. The read counts only once the
// database confirms it as it confirms commits (see
// backend.Backend.ReadSaved): a primary that a failover left behind, still
// running, holds commits that the new primary lacks. While the database
// cannot be reached or cannot confirm the read (a failover, a restart, a
// primary waiting for its synchronous standbys), it tries again, each read
// within the operation timeout, until the operation timeout has passed and
// the reconnect window since the commit failed, at failed
// (WithReconnectWindow), or the caller's ctx ends (the first read outlives
// it). Anything else (the row is gone, or a later generation saved since)
// leaves the outcome unknown, and Run returns ErrCommitUnknown.
func (r *Runner[T]) settleCommit(ctx context.Context, lease Lease, failed time.Time) settlement {
	until := failed.Add(r.cfg.reconnect())
	if t := time.Now().Add(r.cfg.operationTimeout); t.After(until) {
		until = t
	}
	caller := ctx
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	b := backend.ReconnectBackoff()
	for {
		s, err := r.settleOnce(ctx, lease)
		switch {
		case err == nil, !backend.Unreachable(err) && !errors.Is(err, backend.ErrReplicationCancelled):
			return s
		case caller.Err() != nil, !b.Wait(ctx):
			return s // the caller gave up, or the time is over
		}
	}
}

// settleOnce is one attempt of settleCommit; err is the error of its read
// when that failed.
func (r *Runner[T]) settleOnce(ctx context.Context, lease Lease) (settlement, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.operationTimeout)
	defer cancel()
	s, found, err := r.repo.readSaved(ctx, lease)
	switch {
	case err != nil:
		return settledUnknown, err
	case !found:
		return settledUnknown, nil // pruned: nothing left to tell
	case s.Generation == lease.Generation:
		return settledSaved, nil
	case s.Generation > lease.Generation:
		return settledUnknown, nil // a later generation saved since
	case s.Holds(lease.row()):
		return settledHeld, nil
	}
	return settledLost, nil
}

// callWork calls work and turns a panic into a *PanicError.
func callWork[T any](ctx context.Context, work func(context.Context) (T, error)) (result T, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Step: "work", Value: v, Stack: debug.Stack()}
		}
	}()
	return work(ctx)
}

// callSave calls save and turns a panic into a *PanicError.
func callSave[T any](tx *gorm.DB, save func(*gorm.DB, T) error, result T) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Step: "save", Value: v, Stack: debug.Stack()}
		}
	}()
	return save(tx, result)
}
