package gormleasegocron

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-co-op/gocron/v2"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Locker is a gocron.Locker that runs each run of a job under the lease of
// target the job's name, with gormlease's heartbeats. Pass it to
// gocron.WithDistributedLocker (or gocron.WithDistributedJobLocker for one
// job). A Locker is safe for concurrent use, by any number of schedulers
// and jobs, and needs no closing.
type Locker struct {
	runner *gormlease.Runner[struct{}]
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker on db, which must be a *gorm.DB from gorm.Open
// on a database with the gormlease tables (gormlease.AutoMigrate). The
// options are gormlease.NewRunner's: the heartbeat interval and lease
// timeout (either alone is enough: the other follows it, as in
// gormlease.WithLeaseTimeout), the holder's name, the tables, a logger, an observer, and,
// above all for schedules, gormlease.WithMinHold, which keeps a job's
// target held until that long after its acquisition, so that a pod whose
// timer fires a moment later skips the tick. With gormlease.WithMaxHold, a
// run still holding the lease that long after its acquisition loses it
// (the job itself goes on: see the package doc). NewLocker writes nothing;
// it returns an error wrapping gormlease.ErrInvalidArgument, naming the
// option at fault, for options that NewRunner refuses.
func NewLocker(db *gorm.DB, opts ...gormlease.Option) (*Locker, error) {
	r, err := gormlease.NewRunner[struct{}](db, opts...)
	if err != nil {
		return nil, err
	}
	return &Locker{runner: r}, nil
}

// Lock takes the lease of target key, the job's name, and returns a
// gocron.Lock that holds it until its Unlock. When another holder's lease
// on key is live, Lock returns an error wrapping gormlease.ErrLeaseHeld at
// once, having written nothing, and gocron skips the run. So it does while
// the job is paused (admin.Operator.Pause): the error, a *gormlease.PausedError,
// matches both ErrPaused and ErrLeaseHeld, and the paused job's ticks are
// skipped until Resume. A run whose holder an operator asks to stop
// (RequestStop) ends at its next heartbeat, and Unlock returns an error
// wrapping gormlease.ErrStopRequested. It returns an
// error wrapping ctx's when ctx ends before the lease is taken (having
// written nothing when ctx had ended before the call; a lease taken as ctx
// ended is released), and the acquire's error when the database cannot be
// reached.
//
// While the lease is held, a goroutine of the Locker's (a
// gormlease.Runner.Run whose work waits for Unlock) renews it every
// heartbeat interval. It ends, releasing the lease, at the first of: the
// Lock's Unlock; the loss of the lease, when it was taken over or its
// heartbeats could not confirm it in time; and the end of
// gormlease.WithMaxHold, when the Locker has one. ctx's cancellation after
// the lease is taken does not end it (gocron cancels a job's context on
// Shutdown and RemoveJob while the run may still be going on): gocron
// calls Unlock when the run returns, whatever the way it returns.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if ctx == nil {
		return nil, fmt.Errorf("gormleasegocron: lock %q: context is nil: %w", key, gormlease.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("gormleasegocron: lock %q: %w", key, err) // before any statement
	}
	h := &lock{unlock: make(chan struct{}), done: make(chan struct{})}
	acquired := make(chan struct{})
	// The run's context outlives ctx once the lease is taken; before
	// that, ctx's end cancels the acquire (the cancel runs on a goroutine
	// of its own: an acquire that it comes too late for is released).
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	go func() {
		defer close(h.done)
		defer cancel()
		_, h.err = l.runner.Run(runCtx, key, func(work context.Context) (struct{}, error) {
			if !stop() {
				return struct{}{}, ctx.Err() // ended while the lease was being taken
			}
			close(acquired)
			select {
			case <-h.unlock:
				return struct{}{}, nil
			case <-work.Done():
				return struct{}{}, context.Cause(work)
			}
		}, func(*gorm.DB, struct{}) error { return nil })
	}()
	select {
	case <-acquired:
		return h, nil
	case <-h.done:
	}
	if err := ctx.Err(); err != nil && !errors.Is(h.err, err) {
		return nil, fmt.Errorf("gormleasegocron: lock %q: %w (%w)", key, err, h.err)
	}
	return nil, h.err
}

// lock is the gocron.Lock of one run: the lease held by a Run whose work
// waits for unlock.
type lock struct {
	once   sync.Once
	unlock chan struct{} // closed by Unlock: the work returns
	done   chan struct{} // closed when the Run has returned
	err    error         // the Run's error, set before done is closed
}

// Unlock releases the lease, or, under gormlease.WithMinHold, leaves it
// held, unrenewed, until the minimum hold after its acquisition has
// passed. It returns after the Locker's goroutine for the lease has ended:
// the heartbeats stopped and the lease released (or held for the rest of
// its minimum hold), which the operation timeout bounds. ctx is not used:
// the release runs on a context of its own, so that a job's context that
// gocron cancelled still releases. Unlock returns nil when the lease was
// held through to the end; an error wrapping gormlease.ErrLeaseLost when it
// was lost during the run (another pod may then have run the job too); or
// the release's error. Calling it again returns the same error.
func (h *lock) Unlock(context.Context) error {
	h.once.Do(func() { close(h.unlock) })
	<-h.done
	return h.err
}
