package gormlease

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/gormlease/gormlease/observe"
)

// Heartbeats are batched. Every lease that Runs hold in one process on the
// same connection pool with the same heartbeat interval and
// operation timeout joins one beatGroup, whose goroutine renews all of them
// once per interval, with one statement per heartbeatBatchSize leases (see
// Repository.HeartbeatMany), up to beatParallelism statements at once, each
// on a connection taken from the pool only for the statement. The group's
// goroutine starts when its first lease joins and is stopped, and awaited,
// by the Run whose lease leaves last; it waits for its statements before it
// ends, so no goroutine outlives the Runs. A group's statements go through
// the gorm session of the Run that started it: Runners on one pool share
// their heartbeats whatever their gorm settings.
//
// Self-fencing stays per lease: a lease is confirmed until lease timeout
// minus the safety margin after the last successful heartbeat that renewed
// it was sent (or the acquire, for the first). The database stamped that
// heartbeat after it was sent, so no one can take the lease over before then
// on the database's clock. A timer per lease, independent of the heartbeat
// calls, cancels the work at that point; each successful heartbeat pushes it
// back. So a database that hangs or is unreachable stops the work in time
// even if a call never returns. A lease missing from a heartbeat's result
// was taken over or released: its work, and only its, is cancelled with
// ErrLeaseLost.

// beatKey says which leases may share heartbeat statements: those on the
// same database, renewed at the same pace, with the same bound on each call.
type beatKey struct {
	pool             any // see poolKey
	interval         time.Duration
	operationTimeout time.Duration
	// Leases share heartbeats only with those of Runners that report to
	// the same logger and observer (see observerKey): the group's
	// statements are reported to them.
	logger   *slog.Logger
	observer any
}

// observerKey is what identifies m's observer in a beatKey: nil when there
// is none, the observer itself, or, for an observer of a type that cannot
// be a map key, m, whose Runner's leases then share heartbeats only among
// themselves.
func observerKey(m *monitor) any {
	if m.obs == nil {
		return nil
	}
	if t := reflect.TypeOf(m.obs); !t.Comparable() {
		return m
	}
	return m.obs
}

// poolKey is what identifies repo's connection pool in a beatKey: the pool
// itself, or, for a pool of a type that cannot be a map key (a struct value
// holding a slice, say), the repository, whose leases then share heartbeats
// only among themselves.
func poolKey(repo *Repository) any {
	pool := repo.db.ConnPool
	if t := reflect.TypeOf(pool); t == nil || !t.Comparable() {
		return repo
	}
	return pool
}

// beatGroups holds the live groups; its mutex also guards every group's
// members and every member's state.
var beatGroups = struct {
	sync.Mutex
	m map[beatKey]*beatGroup
}{m: map[beatKey]*beatGroup{}}

// beatGroup renews a set of leases together.
type beatGroup struct {
	key     beatKey
	repo    *Repository
	mon     *monitor     // of the Run that started the group
	members []*heartbeat // in the order they joined, but for stop's swaps
	cancel  context.CancelFunc
	done    chan struct{}
}

// heartbeat is one lease's membership in a beatGroup, with its fence.
type heartbeat struct {
	group      *beatGroup
	lease      Lease
	trust      time.Duration
	mon        *monitor
	workCtx    context.Context // also the Run's span, for the heartbeat spans
	cancelWork context.CancelCauseFunc
	fence      *time.Timer
	index      int  // in group.members
	left       bool // set under beatGroups' mutex when stop has run
}

// startHeartbeat starts renewing lease, acquired by a statement sent at
// sent, on repo. It joins the lease to its group, starting the group's
// goroutine when the lease is the first. The lease is renewed until stop is
// called; cancelWork cancels the work with the cause of a loss.
func startHeartbeat(workCtx context.Context, repo *Repository, cfg config, mon *monitor, lease Lease,
	sent time.Time, cancelWork context.CancelCauseFunc,
) *heartbeat {
	trust := cfg.trustWindow()
	h := &heartbeat{lease: lease, trust: trust, mon: mon, workCtx: workCtx, cancelWork: cancelWork}
	h.fence = time.AfterFunc(time.Until(sent.Add(trust)), func() {
		cancelWork(&lossCause{kind: observe.EventSelfFenced,
			err: wrapf(ErrLeaseLost, "heartbeat %q: no heartbeat confirmed the lease for %v", lease.TargetID, trust)})
	})

	key := beatKey{pool: poolKey(repo), interval: cfg.heartbeatInterval, operationTimeout: cfg.operationTimeout,
		logger: mon.log, observer: observerKey(mon)}
	beatGroups.Lock()
	defer beatGroups.Unlock()
	g := beatGroups.m[key]
	if g == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if mon.obs != nil {
			ctx = withStatements(ctx, mon)
		}
		g = &beatGroup{key: key, repo: repo, mon: mon, cancel: cancel, done: make(chan struct{})}
		beatGroups.m[key] = g
		go g.loop(ctx)
	}
	h.group, h.index = g, len(g.members)
	g.members = append(g.members, h)
	return h
}

// stop stops renewing the lease and its fence. When the lease was the
// group's last, it also stops the group's goroutine and waits for it to end.
// No heartbeat renews the lease after stop returns, except one already on
// its way to the database, which the database fences like any other.
// Calling stop again does nothing.
func (h *heartbeat) stop() {
	beatGroups.Lock()
	if h.left {
		beatGroups.Unlock()
		return
	}
	h.left = true
	h.fence.Stop()
	g := h.group
	// Move the last member into h's place: it is renewed earlier in the
	// next round, never later, so its heartbeats never drift apart.
	end := g.members[len(g.members)-1]
	g.members[h.index], end.index = end, h.index
	g.members[len(g.members)-1] = nil
	g.members = g.members[:len(g.members)-1]
	last := len(g.members) == 0
	if last {
		delete(beatGroups.m, g.key)
		g.cancel()
	}
	beatGroups.Unlock()
	if last {
		<-g.done
	}
}

// loop renews the group's members every interval until the group is
// stopped. After a failed statement it retries those leases sooner; if
// nothing succeeds before their fences, the fences cancel their work.
func (g *beatGroup) loop(ctx context.Context) {
	defer close(g.done)
	tick := time.NewTicker(g.key.interval)
	defer tick.Stop()
	retry := time.NewTimer(0)
	if !retry.Stop() {
		<-retry.C
	}
	defer retry.Stop()
	var failed []*heartbeat
	for {
		var batch []*heartbeat
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
func (g *beatGroup) snapshot() []*heartbeat {
	beatGroups.Lock()
	defer beatGroups.Unlock()
	return append([]*heartbeat(nil), g.members...)
}

// beatParallelism is the most heartbeat statements a group has in flight
// at once: enough that a round of 10,000 leases ends within a few
// statements' time, few enough to leave the pool to the application.
const beatParallelism = 4

// beat renews batch, heartbeatBatchSize leases a statement and up to
// beatParallelism statements at once, and returns the leases whose
// statement failed. It returns after every statement has.
func (g *beatGroup) beat(ctx context.Context, batch []*heartbeat) []*heartbeat {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []*heartbeat
		slots  = make(chan struct{}, beatParallelism)
	)
	for len(batch) > 0 {
		chunk := batch[:min(len(batch), heartbeatBatchSize)]
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
func (g *beatGroup) beatChunk(ctx context.Context, chunk []*heartbeat) bool {
	leases := make([]Lease, 0, len(chunk))
	live := make([]*heartbeat, 0, len(chunk))
	beatGroups.Lock()
	for _, h := range chunk {
		if !h.left && h.workCtx.Err() == nil {
			leases = append(leases, h.lease)
			live = append(live, h)
		}
	}
	beatGroups.Unlock()
	if len(leases) == 0 {
		return true
	}
	sent := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, g.key.operationTimeout)
	lost, err := g.repo.heartbeatMany(callCtx, leases)
	cancel()
	if g.mon.obs != nil || g.mon.log != nil {
		g.observe(ctx, live, lost, sent, err)
	}
	if err != nil {
		return false
	}
	g.settle(live, lost, sent)
	return true
}

// observe reports a heartbeat statement sent at sent that renewed live,
// but lost, or failed with err: as an event, a heartbeat span per lease,
// and a log line when it failed or was slow (see slowHeartbeatFraction).
func (g *beatGroup) observe(ctx context.Context, live []*heartbeat, lost map[Lease]bool, sent time.Time, err error) {
	rtt := time.Since(sent)
	m := g.mon
	switch {
	case err != nil && ctx.Err() == nil:
		if m.logs(ctx, slog.LevelWarn) {
			m.log.LogAttrs(ctx, slog.LevelWarn, "gormlease: heartbeat failed, retrying",
				slog.Int("leases", len(live)), slog.Duration("duration", rtt),
				slog.Duration("retry_in", g.key.interval/4), slog.Any("error", err))
		}
	case rtt > g.key.interval/slowHeartbeatFraction:
		if m.logs(ctx, slog.LevelWarn) {
			m.log.LogAttrs(ctx, slog.LevelWarn, "gormlease: slow heartbeat",
				slog.Int("leases", len(live)), slog.Duration("duration", rtt),
				slog.Duration("interval", g.key.interval))
		}
	}
	if m.obs == nil {
		return
	}
	m.record(ctx, observe.Event{Kind: observe.EventHeartbeat, Duration: rtt, Leases: len(live), Err: err})
	for _, h := range live {
		_, end := h.mon.start(h.workCtx, observe.Span{Kind: observe.SpanHeartbeat, TargetID: h.lease.TargetID,
			Generation: h.lease.Generation, Start: sent})
		switch {
		case end == nil:
		case err != nil:
			end(err)
		case lost[h.lease]:
			end(ErrLeaseLost)
		default:
			end(nil)
		}
	}
}

// settle pushes back the fence of every lease in live that the heartbeat
// sent at sent renewed, and cancels the work of those in lost.
func (g *beatGroup) settle(live []*heartbeat, lost map[Lease]bool, sent time.Time) {
	beatGroups.Lock()
	defer beatGroups.Unlock()
	for _, h := range live {
		switch {
		case h.left || h.workCtx.Err() != nil:
			// Stopped, or already cancelled: nothing to renew.
		case lost[h.lease]:
			h.fence.Stop()
			h.cancelWork(&lossCause{kind: observe.EventLeaseLost, err: wrapf(ErrLeaseLost, "heartbeat %q", h.lease.TargetID)})
		default:
			h.fence.Reset(time.Until(sent.Add(h.trust)))
		}
	}
}
