// Package heartbeat renews the leases that Runs hold, in batches, and fences
// each one on its own: it owns the heartbeat goroutines, and their lifetimes
// are all here.
//
// Every lease that joins a Set with the same Settings joins one group, whose
// goroutine renews all of its leases once per interval, with one statement
// per backend.MaxBatch leases, up to Parallelism statements at once, each on
// a connection taken from the pool only for the statement. The group's
// goroutine starts when its first lease joins and is stopped, and awaited,
// by the Stop of the lease that leaves last; it waits for its statements
// before it ends, so no goroutine outlives the leases. A Set belongs to one
// Repository, whose leases are the only ones it renews: nothing is shared
// between Repositories.
//
// Self-fencing stays per lease: a lease is confirmed until its trust window
// after the last successful heartbeat that renewed it was sent (or the
// acquire, for the first). The database stamped that heartbeat after it was
// sent, so no one can take the lease over before then on the database's
// clock. A timer per lease, independent of the heartbeat calls, reports the
// loss at that point; each successful heartbeat pushes it back. So a
// database that hangs or is unreachable stops the work in time even if a
// call never returns. A lease missing from a heartbeat's result was taken
// over or released: its loss, and only its, is reported.
package heartbeat

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
)

// Parallelism is the most heartbeat statements a group has in flight at
// once: enough that a round of 10,000 leases ends within a few statements'
// time, few enough to leave the pool to the application.
const Parallelism = 4

// Renew renews leases, each once, and returns those that are no longer the
// caller's; an error means that the outcome of some is unknown.
type Renew func(ctx context.Context, leases []backend.Lease) (lost map[backend.Lease]bool, err error)

// Settings say which leases share heartbeat statements: those renewed at
// the same pace, with the same bound on each statement, reported to the
// same party. Report is that party's identity (comparable); Round and
// Context are its hooks, which every lease with the same Report passes
// alike.
type Settings struct {
	Interval         time.Duration
	OperationTimeout time.Duration
	Report           any
	// Context, when set, returns the context that the group's statements
	// run on, from the group's own.
	Context func(ctx context.Context) context.Context
	// Round, when set, is told of each statement: the leases it renewed,
	// those it found lost, when it was sent, and its error.
	Round func(ctx context.Context, r Round)
}

// key is Settings without its hooks.
type key struct {
	interval, timeout time.Duration
	report            any
}

// Round is one heartbeat statement, as Settings.Round is told of it.
type Round struct {
	Members []*Member
	Lost    map[backend.Lease]bool
	Sent    time.Time
	Err     error
}

// Set holds the live groups of one Repository. Its zero value is ready;
// Renew must be set before the first Join.
type Set struct {
	Renew Renew
	// mu guards every group's members and every member's state.
	mu     sync.Mutex
	groups map[key]*group
}

// live counts the live groups of the process, for the tests' leak checks.
var live atomic.Int64

// Live returns the number of heartbeat groups whose goroutine runs.
func Live() int { return int(live.Load()) }

// group renews a set of leases together.
type group struct {
	set      *Set
	key      key
	settings Settings
	members  []*Member // in the order they joined, but for Stop's swaps
	cancel   context.CancelFunc
	done     chan struct{}
}

// Member is one lease's membership in a group, with its fence.
type Member struct {
	group *group
	// Lease is the lease renewed.
	Lease backend.Lease
	// Context is the context of the lease's work, for the round's hooks.
	Context context.Context
	trust   time.Duration
	lost    func(selfFenced bool)
	fence   *time.Timer
	index   int  // in group.members
	left    bool // set under the set's mutex when Stop has run
}

// Join starts renewing lease, acquired by a statement sent at sent, with
// settings s, until Stop. workCtx is the context of the lease's work: once
// it is done, the lease is no longer renewed. lost is called, once, when the
// lease is lost: selfFenced when no heartbeat confirmed it within trust of
// the last one sent, otherwise because a heartbeat found it taken over.
func (set *Set) Join(s Settings, workCtx context.Context, lease backend.Lease, sent time.Time, trust time.Duration,
	lost func(selfFenced bool),
) *Member {
	m := &Member{Lease: lease, Context: workCtx, trust: trust}
	var once sync.Once
	m.lost = func(selfFenced bool) { once.Do(func() { lost(selfFenced) }) }
	m.fence = time.AfterFunc(time.Until(sent.Add(trust)), func() { m.lost(true) })

	k := key{interval: s.Interval, timeout: s.OperationTimeout, report: s.Report}
	set.mu.Lock()
	defer set.mu.Unlock()
	g := set.groups[k]
	if g == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if s.Context != nil {
			ctx = s.Context(ctx)
		}
		g = &group{set: set, key: k, settings: s, cancel: cancel, done: make(chan struct{})}
		if set.groups == nil {
			set.groups = map[key]*group{}
		}
		set.groups[k] = g
		live.Add(1)
		go g.loop(ctx)
	}
	m.group, m.index = g, len(g.members)
	g.members = append(g.members, m)
	return m
}

// Stop stops renewing the lease and its fence. When the lease was its
// group's last, it also stops the group's goroutine and waits for it to
// end. No heartbeat renews the lease after Stop returns, except one already
// on its way to the database, which the database fences like any other.
// Calling Stop again does nothing.
func (m *Member) Stop() {
	g := m.group
	set := g.set
	set.mu.Lock()
	if m.left {
		set.mu.Unlock()
		return
	}
	m.left = true
	m.fence.Stop()
	// Move the last member into m's place: it is renewed earlier in the
	// next round, never later, so its heartbeats never drift apart.
	end := g.members[len(g.members)-1]
	g.members[m.index], end.index = end, m.index
	g.members[len(g.members)-1] = nil
	g.members = g.members[:len(g.members)-1]
	last := len(g.members) == 0
	if last {
		delete(set.groups, g.key)
		live.Add(-1)
		g.cancel()
	}
	set.mu.Unlock()
	if last {
		<-g.done
	}
}

// loop renews the group's members every interval until the group is
// stopped. After a failed statement it retries those leases sooner, a
// quarter of the interval later; if nothing succeeds before their fences,
// the fences report their loss.
func (g *group) loop(ctx context.Context) {
	defer close(g.done)
	tick := time.NewTicker(g.key.interval)
	defer tick.Stop()
	retry := time.NewTimer(0)
	if !retry.Stop() {
		<-retry.C
	}
	defer retry.Stop()
	var failed []*Member
	for {
		var batch []*Member
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			batch = g.snapshot()
			failed = nil
			retry.Stop()
		case <-retry.C:
			batch, failed = failed, nil
		}
		failed = g.beat(ctx, batch)
		if len(failed) > 0 {
			retry.Reset(g.key.interval / 4)
		}
	}
}

// snapshot returns the group's members, in a stable order, so that each
// lease is renewed at the same point of every round.
func (g *group) snapshot() []*Member {
	g.set.mu.Lock()
	defer g.set.mu.Unlock()
	return append([]*Member(nil), g.members...)
}

// beat renews batch, backend.MaxBatch leases a statement and up to
// Parallelism statements at once, and returns the leases whose statement
// failed. It returns after every statement has.
func (g *group) beat(ctx context.Context, batch []*Member) []*Member {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []*Member
		slots  = make(chan struct{}, Parallelism)
	)
	for len(batch) > 0 {
		chunk := batch[:min(len(batch), backend.MaxBatch)]
		batch = batch[len(chunk):]
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if !g.beatChunk(ctx, chunk) && ctx.Err() == nil {
				mu.Lock()
				failed = append(failed, chunk...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// beatChunk renews the live leases of chunk in one statement, and reports
// whether the statement succeeded.
func (g *group) beatChunk(ctx context.Context, chunk []*Member) bool {
	leases := make([]backend.Lease, 0, len(chunk))
	live := make([]*Member, 0, len(chunk))
	g.set.mu.Lock()
	for _, m := range chunk {
		if !m.left && m.Context.Err() == nil {
			leases = append(leases, m.Lease)
			live = append(live, m)
		}
	}
	g.set.mu.Unlock()
	if len(leases) == 0 {
		return true
	}
	sent := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, g.key.timeout)
	lost, err := g.set.Renew(callCtx, leases)
	if err == nil && callCtx.Err() != nil {
		// Answered after its context ended: a driver that cancels the
		// statement on the server then (lib/pq does) reports success for
		// a renewal whose wait for the synchronous standbys the cancel cut
		// short. It renewed nothing that a failover keeps.
		err = fmt.Errorf("%w: %w", backend.ErrReplicationCancelled, callCtx.Err())
	}
	cancel()
	if g.settings.Round != nil {
		g.settings.Round(ctx, Round{Members: live, Lost: lost, Sent: sent, Err: err})
	}
	if err != nil {
		return false
	}
	g.settle(live, lost, sent)
	return true
}

// settle pushes back the fence of every lease in live that the heartbeat
// sent at sent renewed, and reports the loss of those in lost.
func (g *group) settle(live []*Member, lost map[backend.Lease]bool, sent time.Time) {
	g.set.mu.Lock()
	defer g.set.mu.Unlock()
	for _, m := range live {
		switch {
		case m.left || m.Context.Err() != nil:
			// Stopped, or its work already ended: nothing to renew.
		case lost[m.Lease]:
			m.fence.Stop()
			m.lost(false)
		default:
			m.fence.Reset(time.Until(sent.Add(m.trust)))
		}
	}
}
