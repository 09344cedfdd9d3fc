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
)

// ErrNotLeader is what Elector.IsLeader and Elector.Term return when the
// Elector does not lead, or no longer trusts its lease.
var ErrNotLeader = errors.New("gormleasegocron: not the leader")

// Elector is a gocron.Elector on a gormlease.Elector: it campaigns for a
// role in the background, and IsLeader returns nil while it leads. Pass it
// to gocron.WithDistributedElector. An Elector is safe for concurrent use.
type Elector struct {
	elector *gormlease.Elector
	term    atomic.Pointer[context.Context] // the term's context while leading
	cancel  context.CancelFunc
	done    chan struct{} // closed when the campaign has ended
}

var _ gocron.Elector = (*Elector)(nil)

// campaignPause is how long the campaign waits before it campaigns again
// after a Lead that ended without a term (with an error that Lead did not
// retry itself).
const campaignPause = time.Second

// NewElector returns an Elector for the role name, whose lease is the
// lease row of target name, and starts its campaign: a goroutine that
// calls gormlease.Elector.Lead in a loop, leading for a term whenever it
// holds the role's lease and campaigning again when the term is lost,
// until ctx ends or Close is called. The options are
// gormlease.NewElector's (heartbeat interval and lease timeout, holder,
// tables, logger, observer): a leader that dies or freezes is replaced
// within the lease timeout plus a heartbeat interval. It returns an error
// wrapping gormlease.ErrInvalidArgument, and starts nothing, when ctx is
// nil or gormlease.NewElector refuses name or an option. Call Close to
// wait for the campaign to end.
func NewElector(ctx context.Context, db *gorm.DB, name string, opts ...gormlease.Option) (*Elector, error) {
	if ctx == nil {
		return nil, fmt.Errorf("gormleasegocron: elector: context is nil: %w", gormlease.ErrInvalidArgument)
	}
	el, err := gormlease.NewElector(db, name, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Elector{elector: el, cancel: cancel, done: make(chan struct{})}
	go e.campaign(ctx)
	return e, nil
}

// campaign leads the role, one term after another, until ctx ends.
func (e *Elector) campaign(ctx context.Context) {
	defer close(e.done)
	for ctx.Err() == nil {
		led := false
		// Lead waits for the lease, holding no connection, and retries a
		// failed acquire itself; it returns when the term ends.
		_ = e.elector.Lead(ctx, func(term context.Context) error {
			led = true
			e.term.Store(&term)
			defer e.term.Store(nil)
			<-term.Done()
			return nil
		})
		if led {
			continue
		}
		t := time.NewTimer(campaignPause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// IsLeader returns nil while the Elector leads the role and still trusts
// its lease, and ErrNotLeader otherwise: gocron then skips the run. It asks
// no database: a leader stops trusting its lease, and IsLeader returns
// ErrNotLeader, before the lease can expire and a standby lead. ctx is not
// used.
func (e *Elector) IsLeader(context.Context) error {
	_, err := e.Term()
	return err
}

// Term returns the context of the Elector's term while it leads, and
// ErrNotLeader otherwise. The context carries the role's lease
// (gormlease.LeaseFromContext; its Generation is the term) and is
// cancelled, with a cause wrapping gormlease.ErrLeaseLost, when leadership
// is lost or can no longer be trusted, or with context.Canceled when the
// campaign ends. A job that must stop when its leader is deposed runs on
// it; writes fenced by the term go through Repository().CommitIfOwner with
// the lease.
func (e *Elector) Term() (context.Context, error) {
	term := e.term.Load()
	if term == nil || (*term).Err() != nil {
		return nil, ErrNotLeader
	}
	return *term, nil
}

// Leader reports who leads the role now, as the database sees it (see
// gormlease.Elector.Leader).
func (e *Elector) Leader(ctx context.Context) (gormlease.LeaseInfo, bool, error) {
	return e.elector.Leader(ctx)
}

// Repository returns the Repository that the role's lease is held
// through, for writes fenced by the term with CommitIfOwner.
func (e *Elector) Repository() *gormlease.Repository { return e.elector.Repository() }

// Close ends the campaign and waits for its goroutine to end: a term in
// progress ends, and its lease is released, so that a standby leads at
// once. It returns when the release has ended (bounded by the operation
// timeout). Close may be called more than once, and after ctx has ended.
func (e *Elector) Close() {
	e.cancel()
	<-e.done
}
