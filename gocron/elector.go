package gormleasegocron

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// ErrNotLeader is what DistributedElector.IsLeader and
// DistributedElector.Term return when the DistributedElector does not lead,
// or no longer trusts its lease.
var ErrNotLeader = errors.New("gormleasegocron: not the leader")

// DistributedElector is a gocron.Elector on a gormlease.Elector: it
// campaigns for a role in the background, and IsLeader returns nil while it
// leads. Pass it to gocron.WithDistributedElector. A DistributedElector is
// safe for concurrent use.
type DistributedElector struct {
	elector *gormlease.Elector
	name    string                          // the role
	term    atomic.Pointer[context.Context] // the term's context while leading
	cancel  context.CancelFunc
	done    chan struct{}         // closed when the campaign has ended
	failed  atomic.Pointer[error] // the error that ended the campaign, if one did
}

var _ gocron.Elector = (*DistributedElector)(nil)

// NewDistributedElector returns a DistributedElector for the role name,
// whose lease is the lease row of target name, and starts its campaign: a
// goroutine that calls gormlease.Elector.Lead in a loop, leading for a term
// whenever it holds the role's lease and campaigning again when the term is
// lost, until ctx ends or Close is called. The options are
// gormlease.NewElector's (heartbeat interval and lease timeout, either
// alone enough, holder, tables, logger, observer): a leader that dies or
// freezes is replaced within the lease timeout plus a heartbeat interval.
// It returns an error wrapping gormlease.ErrInvalidArgument, and starts
// nothing, when ctx is nil or gormlease.NewElector refuses name or an
// option. Call Close to wait for the campaign to end.
//
// While the role is paused (admin.Operator.Pause of target name), no
// DistributedElector leads: a campaign waits, holding no connection, until
// Resume, and a leader whose role is paused during its term steps down, for
// it reads the role's row at the start of each term and then every half of
// the lease timeout (one SELECT; standbys read nothing). Its term ends with
// a cause wrapping gormlease.ErrPaused, and the lease is released. An
// operator's RequestStop ends the term at the leader's next heartbeat; the
// campaign then goes on, and any DistributedElector, this one too, may lead
// the next term (Pause first to keep every DistributedElector from
// leading).
//
// A campaign whose database cannot be reached campaigns again, with
// backoff, as gormlease.Elector.Lead does. An error that waiting cannot
// cure (a closed pool, a missing table, a permission) ends the campaign at
// once: from then on IsLeader and Term return an error that wraps both
// ErrNotLeader and that error, so that it is seen rather than retried
// forever.
func NewDistributedElector(ctx context.Context, db *gorm.DB, name string, opts ...gormlease.Option) (*DistributedElector, error) {
	if ctx == nil {
		return nil, fmt.Errorf("gormleasegocron: elector: context is nil: %w", gormlease.ErrInvalidArgument)
	}
	el, err := gormlease.NewElector(db, name, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &DistributedElector{elector: el, name: name, cancel: cancel, done: make(chan struct{})}
	go e.campaign(ctx)
	return e, nil
}

// campaign leads the role, one term after another, until ctx ends or
// Lead fails with an error that waiting cannot cure.
func (e *DistributedElector) campaign(ctx context.Context) {
	defer close(e.done)
	for ctx.Err() == nil {
		led := false
		// Lead waits for the lease, holding no connection, and retries a
		// failed acquire itself while the database cannot be reached; it
		// returns when the term ends, or at once with any other error.
		err := e.elector.Lead(ctx, func(lead context.Context) error {
			led = true
			term, end := context.WithCancelCause(lead)
			defer end(nil)
			e.term.Store(&term)
			defer e.term.Store(nil)
			e.watchPause(term, end)
			return nil // the lease is released: a paused role waits in Lead
		})
		if !led && err != nil && ctx.Err() == nil {
			e.failed.Store(&err)
			return
		}
	}
}

// pauseCheckDefault is how often a leader reads the role's row for a
// pause when the row records no lease timeout.
const pauseCheckDefault = time.Second

// watchPause returns when term ends, or, having ended it with a cause
// wrapping gormlease.ErrPaused, when the role is paused: it reads the
// role's row at the start of the term, and then every half of the lease
// timeout that the row records. A read that fails is not an outcome (the
// heartbeats judge the lease): the next one is made as planned.
func (e *DistributedElector) watchPause(term context.Context, end context.CancelCauseFunc) {
	op, name := admin.New(e.elector.Repository()), e.name
	every := pauseCheckDefault
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-term.Done():
			return
		case <-t.C:
		}
		row, found, err := op.Get(term, name)
		if err == nil && found {
			if row.PausedAt != nil {
				reason := ""
				if row.PauseReason != nil {
					reason = *row.PauseReason
				}
				end(fmt.Errorf("gormleasegocron: the role was paused; the term ended: %w",
					&gormlease.PausedError{Target: name, Reason: reason}))
				return
			}
			if row.TimeoutMS != nil && *row.TimeoutMS > 0 {
				every = time.Duration(*row.TimeoutMS) * time.Millisecond / 2
			}
		}
		t.Reset(every)
	}
}

// IsLeader returns nil while the DistributedElector leads the role and
// still trusts its lease, and an error wrapping ErrNotLeader otherwise (see
// Term): gocron then skips the run. It asks no database: a leader stops
// trusting its lease, and IsLeader returns ErrNotLeader, before the lease
// can expire and a standby lead. ctx is not used.
func (e *DistributedElector) IsLeader(context.Context) error {
	_, err := e.Term()
	return err
}

// Term returns the context of the DistributedElector's term while it leads,
// and ErrNotLeader otherwise; once the campaign has ended with an error
// that waiting cannot cure (see NewDistributedElector), an error wrapping
// both ErrNotLeader and that error. The context carries the role's lease
// (gormlease.LeaseFromContext; its Generation is the term) and is
// cancelled, with a cause wrapping gormlease.ErrLeaseLost, when leadership
// is lost or can no longer be trusted; with one wrapping
// gormlease.ErrStopRequested when an operator asked the leader to stop
// (admin.Operator.RequestStop); with one wrapping gormlease.ErrPaused when
// the role was paused (admin.Operator.Pause; see NewDistributedElector); or with
// context.Canceled when the campaign ends. A job that must stop when its
// leader is deposed runs on it; writes fenced by the term go through
// Repository().CommitIfOwner with the lease.
func (e *DistributedElector) Term() (context.Context, error) {
	term := e.term.Load()
	if term == nil || (*term).Err() != nil {
		if failed := e.failed.Load(); failed != nil {
			return nil, fmt.Errorf("%w: the campaign ended: %w", ErrNotLeader, *failed)
		}
		return nil, ErrNotLeader
	}
	return *term, nil
}

// Leader reports who leads the role now, as the database sees it: the
// role's lease row, and true while its lease is live (see
// gormlease.Elector.Leader).
func (e *DistributedElector) Leader(ctx context.Context) (gormlease.JobLease, bool, error) {
	return e.elector.Leader(ctx)
}

// Repository returns the Repository that the role's lease is held
// through, for writes fenced by the term with CommitIfOwner.
func (e *DistributedElector) Repository() *gormlease.Repository { return e.elector.Repository() }

// Close ends the campaign and waits for its goroutine to end: a term in
// progress ends, and its lease is released, so that a standby leads at
// once. It returns when the release has ended (bounded by the operation
// timeout). Close may be called more than once, and after ctx has ended.
func (e *DistributedElector) Close() {
	e.cancel()
	<-e.done
}
