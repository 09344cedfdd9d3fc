package gormlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// Elector elects one leader for a named role among the processes that
// campaign for it: the holder of the lease of target name, whose generation
// is the leader's fencing term. It is safe for concurrent use.
type Elector struct {
	name   string
	runner *Runner[struct{}]
	// term is the context of the term this Elector leads now, or nil.
	term atomic.Pointer[context.Context]
}

// NewElector returns an Elector for the role name. It takes NewRunner's
// options, with which it leads: a leader that dies or freezes is replaced
// within the lease timeout plus a heartbeat interval. It refuses WithSlots
// above 1, and writes nothing; the tables must exist (AutoMigrate).
func NewElector(db *gorm.DB, name string, opts ...Option) (*Elector, error) {
	if err := checkTargetID(name); err != nil {
		return nil, wrapf(err, "elector")
	}
	r, err := NewRunner[struct{}](db, opts...)
	if err != nil {
		return nil, err
	}
	if r.cfg.slots > 1 {
		return nil, invalidf("elector: WithSlots(%d): a role has one leader", r.cfg.slots)
	}
	return &Elector{name: name, runner: r}, nil
}

// Lead campaigns for the role, waiting as RunWait does, and then leads for
// one term: it calls lead with a context that carries the lease
// (LeaseFromContext; its generation is the fencing term) and is cancelled
// when ctx is or the term ends (ErrLeaseLost, ErrStopRequested,
// ErrMaxHoldExceeded). lead should then return at once; Lead then releases
// the lease, so that a standby leads. It returns lead's error as lead
// returned it, or an error wrapping the cause of the term's end, or, when
// ctx ends before a term, one wrapping ctx's error and the *HeldError or
// *PausedError it waited on. A campaign that fails because the database is
// out of reach or busy campaigns again, until ctx ends. A panic in lead is
// a *PanicError. Fence the term's writes with Repository().CommitIfOwner
// and that lease. docs/design.md, section "Electing a leader", tells more.
//
// With WithObserver, Lead reports its campaign and its term to the
// observer (observe.EventCampaign, EventTermBegun, EventTermEnded), and
// reads the role's row once before its first acquire, so that the term
// can say how long the role had been without a leader.
func (e *Elector) Lead(ctx context.Context, lead func(ctx context.Context) error) error {
	if lead == nil {
		return invalidf("lead function is nil")
	}
	t := e.campaign(ctx)
	defer t.exited(ctx) // a term that lead left by runtime.Goexit
	led := false
	work := func(term context.Context) (struct{}, error) {
		led = true
		e.term.Store(&term)
		defer e.term.Store(nil)
		t.begin(term)
		err := lead(term)
		t.returned(term, err)
		return struct{}{}, err
	}
	var seen func(backend.State) // the reads of the row that the campaign waited on
	if t != nil {
		seen = t.saw
	}
	wait := backend.Backoff{Pause: campaignRetry, Max: campaignMaxRetry}
	for {
		_, err := e.runner.runWait(ctx, e.name, work, func(*gorm.DB, struct{}) error { return nil }, seen)
		if led {
			ret := err
			var failed *WorkError // lead's error, as RunWait returns it
			if errors.As(err, &failed) {
				ret = failed.Err // the saver does nothing: the work is lead
			}
			t.ended(ctx, err, ret)
			return ret
		}
		switch {
		case err == nil, errors.Is(err, ErrInvalidArgument):
			return err
		case ctx.Err() != nil:
			if errors.Is(err, ctx.Err()) {
				return err
			}
			// A driver may say so in its own words ("interrupted").
			return wrapf(fmt.Errorf("%w (%w)", ctx.Err(), err), "lead %q", e.name)
		case !backend.Unreachable(err) && !backend.IsSerializationFailure(err):
			return err // campaigning again would fail so again
		}
		// The campaign's acquire failed (the database out of reach, or
		// busy with the other standbys' acquires): campaign again.
		e.runner.mon.logLease(ctx, slog.LevelWarn, "gormlease: campaign failed, trying again", Lease{TargetID: e.name},
			slog.Any("error", err))
		if !wait.Wait(ctx) {
			return err
		}
	}
}

const (
	// campaignRetry is the first pause before a Lead whose acquire failed
	// campaigns again; it doubles, with jitter, up to campaignMaxRetry.
	campaignRetry    = 50 * time.Millisecond
	campaignMaxRetry = 2 * time.Second
)

// Leader reports who leads the role now, as the database sees it: the
// role's lease row (its Holder leads, its Generation is the term), and true,
// while its lease is live; false when nobody leads (the row is released or
// expired, or there is none: the zero JobLease). It reads the role's own
// row, in one statement, never the row of a slot of a semaphore (WithSlots)
// of the same name.
func (e *Elector) Leader(ctx context.Context) (JobLease, bool, error) {
	r := e.runner.Repository()
	rows, err := r.backend.List(ctx, r.db, backend.ListQuery{Key: e.name, Limit: 1})
	if err != nil {
		return JobLease{}, false, wrapf(err, "leader of %q", e.name)
	}
	if len(rows) == 0 {
		return JobLease{}, false, nil
	}
	return JobLease(rows[0].Row), rows[0].Live(), nil
}

// IsLeader reports whether this Elector leads now and still trusts its
// lease: a Lead of it is in its term, whose context is not cancelled.
func (e *Elector) IsLeader() bool {
	term := e.term.Load()
	return term != nil && (*term).Err() == nil
}

// Repository returns the Repository that the Elector's lease is held
// through: for fenced writes during a term, with CommitIfOwner.
func (e *Elector) Repository() *Repository { return e.runner.Repository() }
