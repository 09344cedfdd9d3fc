package gormlease

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gormlease/gormlease/observe"
)

// Heartbeats are batched. Every lease that Runs hold on one Repository
// with the same heartbeat interval, operation timeout, logger and observer
// joins one beatGroup of that Repository, whose goroutine renews all of them
// once per interval, with one statement per heartbeatBatchSize leases (see
// Repository.HeartbeatMany), up to beatParallelism statements at once, each
// on a connection taken from the pool only for the statement. The group's
// goroutine starts when its first lease joins and is stopped, and awaited,
// by the Run whose lease leaves last; it waits for its statements before it
// ends, so no goroutine outlives the Runs. Nothing is shared between
// Repositories: each Runner has its own (and a second one on
// WithHeartbeatDB's pool), so a group's statements always go to its
// members' own table, through their own gorm session.
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

// beatKey says which leases of one Repository may share heartbeat
// statements: those renewed at the same pace, with the same bound on each
// call, reported to the same logger and observer.
type beatKey struct {
	interval         time.Duration
	operationTimeout time.Duration
	logger           *slog.Logger
	observer         any // see observerKey
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

// beats holds a Repository's live heartbeat groups; its mutex also guards
// every group's members and every member's state.
type beats struct {
	mu sync.Mutex
	m  map[beatKey]*beatGroup
}

// beating counts the live heartbeat groups of the process, for the tests'
// leak checks.
var beating atomic.Int64

// beatGroup renews a set of leases together.
type beatGroup struct {
	owner   *beats
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
	left       bool // set under the owner's mutex when stop has run
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

	key := beatKey{interval: cfg.heartbeatInterval, operationTimeout: cfg.operationTimeout,
		logger: mon.log, observer: observerKey(mon)}
	owner := &repo.beats
	owner.mu.Lock()
	defer owner.mu.Unlock()
	g := owner.m[key]
	if g == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if mon.obs != nil {
			ctx = withStatements(ctx, mon)
		}
		g = &beatGroup{owner: owner, key: key, repo: repo, mon: mon, cancel: cancel, done: make(chan struct{})}
		if owner.m == nil {
			owner.m = map[beatKey]*beatGroup{}
		}
		owner.m[key] = g
		beating.Add(1)
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
	g := h.group
	g.owner.mu.Lock()
	if h.left {
		g.owner.mu.Unlock()
		return
	}
	h.left = true
	h.fence.Stop()
	// Move the last member into h's place: it is renewed earlier in the
	// next round, never later, so its heartbeats never drift apart.
	end := g.members[len(g.members)-1]
	g.members[h.index], end.index = end, h.index
	g.members[len(g.members)-1] = nil
	g.members = g.members[:len(g.members)-1]
	last := len(g.members) == 0
	if last {
		delete(g.owner.m, g.key)
		beating.Add(-1)
		g.cancel()
	}
	g.owner.mu.Unlock()
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
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
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
	g.owner.mu.Lock()
	for _, h := range chunk {
		if !h.left && h.workCtx.Err() == nil {
			leases = append(leases, h.lease)
			live = append(live, h)
		}
	}
	g.owner.mu.Unlock()
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
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
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
