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

// Elector elects one leader for a named role ("scheduler") among the
// processes that campaign for it: the holder of the role's lease, which is
// the lease row of target name. The lease's generation is the leader's
// fencing term. An Elector is safe for concurrent use; the calls of Lead
// on one Elector queue in the process, as RunWait's do.
type Elector struct {
	name   string
	runner *Runner[struct{}]
	// term is the context of the term this Elector leads now, or nil.
	term atomic.Pointer[context.Context]
}

// NewElector returns an Elector for one named role. Its lease is the lease
// row of target name, in the tables of WithTableNames; the other options
// are NewRunner's (interval, timeout, holder, logger, observer, …), with
// which it leads: a leader that dies or freezes is replaced within the
// lease timeout plus a heartbeat interval. WithSlots above 1 is refused
// (ErrInvalidArgument). It writes nothing; the tables
// must exist (AutoMigrate).
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

// Lead campaigns for the role and then leads for one term:
//   - It waits, holding no connection, until it holds the role's lease
//     (woken as RunWait is: at once by a resignation in this process, by
//     notification on PostgreSQL, by poll, and when the lease expires).
//   - It then calls lead with a context that carries the lease
//     (LeaseFromContext: the generation is the fencing term) and is
//     cancelled when the term ends: with a cause wrapping ErrLeaseLost when
//     leadership is lost or can no longer be trusted, ErrStopRequested when
//     an operator asked the leader to stop (Repository.RequestStop), and
//     ErrMaxHoldExceeded when WithMaxHold has passed. lead should then
//     return at once.
//   - It releases the lease when lead returns, so that a standby leads
//     (with WithMinHold, at the end of the hold, or at once after a stop
//     request).
//
// It returns lead's error, as lead returned it (an error of lead's that
// wraps ErrLeaseHeld, from a lease of its own, is not a refusal of the
// role: Lead does not campaign again on it); an error wrapping
// ErrLeaseLost, ErrStopRequested or ErrMaxHoldExceeded when the term ended
// so, whatever lead returned; or an error
// wrapping ctx's when ctx ended before a term began, which also wraps a
// *HeldError saying who led when ctx ended while another holder's lease
// was live (as RunWait's does). A campaign whose acquire fails because the
// database is out of reach campaigns again, with backoff, until ctx ends;
// it is logged at Warn. Any other error of a campaign, which waiting cannot
// cure (a closed pool, a missing table), Lead returns at once. Writes made
// during the term are fenced with
// Repository().CommitIfOwner and the lease from LeaseFromContext: a
// deposed leader's are refused. A panic in lead is returned as a
// *PanicError.
func (e *Elector) Lead(ctx context.Context, lead func(ctx context.Context) error) error {
	if lead == nil {
		return invalidf("lead function is nil")
	}
	led := false
	work := func(term context.Context) (struct{}, error) {
		led = true
		e.term.Store(&term)
		defer e.term.Store(nil)
		return struct{}{}, lead(term)
	}
	wait := backend.Backoff{Pause: campaignRetry, Max: campaignMaxRetry}
	var failed *WorkError // lead's error, as RunWait returns it
	for {
		_, err := e.runner.RunWait(ctx, e.name, work, func(*gorm.DB, struct{}) error { return nil })
		switch {
		case err == nil:
			return nil
		case led && errors.As(err, &failed):
			return failed.Err // the saver does nothing: the work is lead
		case led || errors.Is(err, ErrInvalidArgument):
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
// role's lease row, and true, while its lease is live; false when nobody
// leads (the row is released, expired, or there is none). It reads the
// role's own row, in one statement, never the row of a slot of a
// semaphore (WithSlots) of the same name.
func (e *Elector) Leader(ctx context.Context) (LeaseInfo, bool, error) {
	info, found, err := e.runner.Repository().info(ctx, e.name)
	if err != nil {
		return LeaseInfo{}, false, wrapf(err, "leader of %q", e.name)
	}
	return info, found && info.State == StateLive, nil
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
