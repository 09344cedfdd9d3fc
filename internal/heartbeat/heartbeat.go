// Package heartbeat renews the leases that Runs hold, in batches, and fences
// each one on its own: it owns the heartbeat goroutines, and their lifetimes
// are all here.
//
// Every lease that joins a Set with the same Settings joins one group. A
// group keeps its leases in buckets of up to backend.MaxBatch leases, and
// renews each bucket with one statement once per interval, at a phase of
// the interval that is the bucket's own: bucket i at the bit reversal of i
// in 1/1024ths of the interval (0, 1/2, 1/4, 3/4, 1/8, ...), so that however
// many buckets there are, their statements are spread evenly over the
// interval, not sent in a burst. A lease joins the lowest-numbered bucket
// with room, and leaves it only when the bucket is merged into lower ones
// (below), which are due no later: so each of its renewals comes at most
// one interval after the one before, and its first within an interval of
// its joining, whichever bucket that is. Up to Parallelism statements are in flight at
// once, each on a connection taken from the pool only for the statement; a
// bucket due while they are is sent as soon as one returns, so a group that
// cannot keep pace renews as fast as the database answers. When leases
// leave, a bucket whose leases fit in the room of lower buckets is merged
// into them right after it was renewed, and only into buckets due no later
// than itself: no lease is renewed later for it.
//
// The group's goroutine sends the statements, each on a goroutine of its
// own. It starts when the group's first lease joins and is stopped, and
// awaited, by the Stop of the lease that leaves last; it waits for its
// statements before it ends, so no goroutine outlives the leases. A Set
// belongs to one Repository, whose leases are the only ones it renews:
// nothing is shared between Repositories.
//
// Self-fencing stays per lease: a lease is confirmed until its trust window
// after the last successful heartbeat that renewed it was sent (or the
// acquire, for the first). The database stamped that heartbeat after it was
// sent, so no one can take the lease over before then on the database's
// clock. The group's goroutine reports the loss at that point: it keeps the
// earliest deadline of each bucket's leases and wakes for the earliest of
// all. It never waits for a statement, so a database that hangs or is
// unreachable stops the work in time even if a call never returns. A lease
// missing from a heartbeat's result was taken over or released: its loss,
// and only its, is reported.
package heartbeat

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
)

// Parallelism is the most heartbeat statements a group has in flight at
// once: enough that a group that falls behind catches up within a few
// statements' time, few enough to leave the pool to the application.
const Parallelism = 4

// phaseBits says how finely the phases of a group's buckets divide the
// interval: into 1<<phaseBits; bucket i and bucket i+1<<phaseBits share
// one.
const phaseBits = 10

// Renew renews leases, each once, and returns those that are no longer the
// caller's, and those whose holder was asked to stop; an error means that
// the outcome of some is unknown.
type Renew func(ctx context.Context, leases []backend.Lease) (ended map[backend.Lease]backend.Ended, err error)

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

// Round is one heartbeat statement, as Settings.Round is told of it. Its
// Members are only valid during the call. Ended holds the leases that it
// found lost, or asked to stop.
type Round struct {
	Members []*Member
	Ended   map[backend.Lease]backend.Ended
	Sent    time.Time
	Err     error
}

// Set holds the live groups of one Repository. Its zero value is ready;
// Renew must be set before the first Join.
type Set struct {
	Renew Renew
	// mu guards every group's buckets and every member's state.
	mu     sync.Mutex
	groups map[key]*group
}

// live counts the live groups of the process.
var live atomic.Int64

// Live returns the number of heartbeat groups of the process whose
// goroutine runs: the goroutines of this package, one per group, which is
// zero whenever no Set renews a lease.
func Live() int { return int(live.Load()) }

// group renews a set of leases together.
type group struct {
	set      *Set
	key      key
	settings Settings
	epoch    time.Time // bucket i is due at epoch + its phase + a whole number of intervals
	buckets  []*bucket // by number; the last is never empty
	room     int       // no bucket numbered below it has room
	size     int       // members in all buckets
	wakeAt   time.Time // when the goroutine wakes next; zero: only for a join or a statement's end
	wake     chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
	// statements are those in flight; results, their outcomes, one for
	// each in flight, so never full. Both are the goroutine's own.
	statements sync.WaitGroup
	results    chan result
}

// bucket is the leases of a group that one statement renews.
type bucket struct {
	n       int // its number in group.buckets
	phase   time.Duration
	members []*Member // in any order: they are renewed together
	due     time.Time // the next renewal on the bucket's phase
	retry   time.Time // zero, or a renewal sooner than due, after a failed one
	busy    bool      // its statement is in flight
	fence   int64     // no later than the deadline of any of its members not lost; never if none
	// leases and live are the statement's, from its sending until the
	// goroutine learns that it returned: they are reused.
	leases []backend.Lease
	live   []*Member
}

// Member is one lease's membership in a group, with its fence.
type Member struct {
	group *group
	// Lease is the lease renewed.
	Lease backend.Lease
	// Context is the context of the lease's work, for the round's hooks.
	Context  context.Context
	trust    time.Duration
	lost     func(Loss)  // Join's, called through lose
	once     sync.Once   // lose calls lost once
	unwatch  func() bool // stops the watch of Context
	bucket   *bucket
	index    int   // in bucket.members
	deadline int64 // when its trust ends (see nanos): trust after the last statement that confirmed it was sent
	left     bool  // Stop has run
	ended    bool  // Context is done
	gone     bool  // its loss was reported
}

// The fences count in monotonic nanoseconds since origin, which a renewal
// of 1,000 leases compares 2,000 times.
var origin = time.Now()

// never is a deadline that does not come.
const never = math.MaxInt64

// nanos returns t in nanoseconds since origin.
func nanos(t time.Time) int64 { return int64(t.Sub(origin)) }

// Loss says why a lease is no longer renewed.
type Loss struct {
	// SelfFenced: no heartbeat confirmed the lease within its trust window
	// after the last one sent. Otherwise a heartbeat found it taken over
	// or released, or, with Stop, asked to stop (RequestStop) for Reason.
	SelfFenced bool
	Stop       bool
	Reason     string
}

// Join starts renewing lease, acquired by a statement sent at sent, with
// settings s, until Stop. workCtx is the context of the lease's work: once
// it is done, the lease is no longer renewed. lost is called, once, when the
// lease is lost, or its holder asked to stop, saying which (see Loss); the
// lease is no longer renewed then. It is called with the Set's lock held,
// so it must not call the Set or a Member.
func (set *Set) Join(s Settings, workCtx context.Context, lease backend.Lease, sent time.Time, trust time.Duration,
	lost func(Loss),
) *Member {
	m := &Member{Lease: lease, Context: workCtx, trust: trust, deadline: nanos(sent) + int64(trust), lost: lost}
	m.unwatch = context.AfterFunc(workCtx, func() {
		set.mu.Lock()
		m.ended = true
		set.mu.Unlock()
	})

	k := key{interval: s.Interval, timeout: s.OperationTimeout, report: s.Report}
	set.mu.Lock()
	defer set.mu.Unlock()
	g := set.groups[k]
	if g == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if s.Context != nil {
			ctx = s.Context(ctx)
		}
		g = &group{set: set, key: k, settings: s, epoch: time.Now(), wake: make(chan struct{}, 1),
			cancel: cancel, done: make(chan struct{}), results: make(chan result, Parallelism)}
		if set.groups == nil {
			set.groups = map[key]*group{}
		}
		set.groups[k] = g
		live.Add(1)
		go g.loop(ctx)
	}
	m.group = g
	g.add(m, time.Now())
	return m
}

// lose reports m's loss, or its holder's request to stop, once.
func (m *Member) lose(why Loss) { m.once.Do(func() { m.lost(why) }) }

// add puts m in the lowest-numbered bucket with room, and wakes the
// group's goroutine if that bucket, or m's fence, is due before it would
// wake.
func (g *group) add(m *Member, now time.Time) {
	for g.room < len(g.buckets) && len(g.buckets[g.room].members) >= backend.MaxBatch {
		g.room++
	}
	if g.room == len(g.buckets) {
		g.buckets = append(g.buckets, g.newBucket(len(g.buckets), now))
	}
	b := g.buckets[g.room]
	if len(b.members) == 0 && !b.due.After(now) {
		// Empty, it was not sent, and its due time stayed behind.
		b.due = g.nextOnGrid(b.due, now)
	}
	b.add(m)
	g.size++
	b.fence = min(b.fence, m.deadline)
	if at := earliest(b.next(), b.fenceTime()); g.wakeAt.IsZero() || at.Before(g.wakeAt) {
		select {
		case g.wake <- struct{}{}:
		default: // already woken
		}
	}
}

// newBucket returns bucket n of g, first due on its phase after now.
func (g *group) newBucket(n int, now time.Time) *bucket {
	// The bit reversal of n's low bits: the first 2^k buckets' phases
	// divide the interval evenly, for every k.
	slot := bits.Reverse64(uint64(n)) >> (64 - phaseBits)
	b := &bucket{n: n, phase: time.Duration(uint64(g.key.interval) / (1 << phaseBits) * slot), fence: never}
	b.due = g.nextOnGrid(g.epoch.Add(b.phase), now)
	return b
}

// nextOnGrid returns the first time after now that is due plus a whole
// number of intervals, or due itself when it is after now.
func (g *group) nextOnGrid(due, now time.Time) time.Time {
	if due.After(now) {
		return due
	}
	return due.Add((now.Sub(due)/g.key.interval + 1) * g.key.interval)
}

// add makes m a member of b.
func (b *bucket) add(m *Member) {
	m.bucket, m.index = b, len(b.members)
	b.members = append(b.members, m)
}

// remove takes m out of b, moving b's last member into its place: the
// members of a bucket are renewed together, so none is renewed later for
// it.
func (b *bucket) remove(m *Member) {
	end := b.members[len(b.members)-1]
	b.members[m.index], end.index = end, m.index
	b.members[len(b.members)-1] = nil
	b.members = b.members[:len(b.members)-1]
}

// next returns when b is next renewed.
func (b *bucket) next() time.Time {
	if !b.retry.IsZero() && b.retry.Before(b.due) {
		return b.retry
	}
	return b.due
}

// fenceTime returns b's fence as a time, zero for never.
func (b *bucket) fenceTime() time.Time {
	if b.fence == never {
		return time.Time{}
	}
	return origin.Add(time.Duration(b.fence))
}

// earliest returns the earlier of a and b, where zero means never.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Stop stops renewing the lease and its fence. When the lease was its
// group's last, it also stops the group's goroutine and waits for it to
// end. No heartbeat renews the lease after Stop returns, except one already
// on its way to the database, which the database fences like any other.
// Calling Stop again does nothing.
func (m *Member) Stop() {
	m.unwatch()
	g := m.group
	set := g.set
	set.mu.Lock()
	if m.left {
		set.mu.Unlock()
		return
	}
	m.left = true
	b := m.bucket
	b.remove(m)
	g.size--
	g.room = min(g.room, b.n)
	g.trim()
	last := g.size == 0
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

// trim drops g's empty buckets from the end.
func (g *group) trim() {
	for len(g.buckets) > 0 && len(g.buckets[len(g.buckets)-1].members) == 0 {
		g.buckets[len(g.buckets)-1] = nil
		g.buckets = g.buckets[:len(g.buckets)-1]
	}
	g.room = min(g.room, len(g.buckets))
}

// result is a statement's outcome, as the group's goroutine learns it.
type result struct {
	b  *bucket
	ok bool
}

// loop renews the group's buckets, each when due, and reports the loss of
// the leases whose trust ended, until the group is stopped. After a failed
// statement it renews that bucket sooner, a quarter of the interval later;
// if nothing succeeds before their deadlines, its leases are reported lost.
func (g *group) loop(ctx context.Context) {
	defer close(g.done)
	defer g.statements.Wait()
	inFlight := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		g.set.mu.Lock()
		now := time.Now()
		g.fence(now)
		for inFlight < Parallelism {
			b := g.dueBucket(now)
			if b == nil {
				break
			}
			if g.send(b, now) {
				inFlight++
				g.statements.Go(func() { g.results <- g.renew(ctx, b) })
			}
		}
		g.wakeAt = g.nextEvent(inFlight < Parallelism)
		wakeAt := g.wakeAt
		g.set.mu.Unlock()
		if wakeAt.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(time.Until(wakeAt))
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-g.wake:
		case r := <-g.results:
			inFlight--
			g.set.mu.Lock()
			g.finish(ctx, r, time.Now())
			g.set.mu.Unlock()
		}
	}
}

// fence reports the loss of every lease whose trust ended by now, and
// moves each bucket's fence to the next deadline of its members.
func (g *group) fence(now time.Time) {
	t := nanos(now)
	for _, b := range g.buckets {
		if b.fence > t {
			continue
		}
		b.fence = never
		for _, m := range b.members {
			switch {
			case m.gone:
			case m.deadline <= t:
				m.gone = true
				m.lose(Loss{SelfFenced: true})
			default:
				b.fence = min(b.fence, m.deadline)
			}
		}
	}
}

// dueBucket returns the bucket due by now, the earliest first, that has
// members and no statement in flight, or nil.
func (g *group) dueBucket(now time.Time) *bucket {
	var due *bucket
	for _, b := range g.buckets {
		if b.busy || len(b.members) == 0 || b.next().After(now) {
			continue
		}
		if due == nil || b.next().Before(due.next()) {
			due = b
		}
	}
	return due
}

// send moves b's due time to its next on its phase, and readies its
// statement: it reports whether b has leases to renew, and is then busy.
func (g *group) send(b *bucket, now time.Time) bool {
	if !b.due.After(now) {
		b.due = b.due.Add(g.key.interval)
		if behind := now.Add(-g.key.interval); !b.due.After(behind) {
			// More than an interval behind: due again at once, but on
			// its phase within the last interval. While the group
			// cannot keep pace, its buckets are sent in turn, the most
			// overdue first, as fast as the statements return; once it
			// can, none owes more than one renewal.
			b.due = g.nextOnGrid(b.due, now).Add(-g.key.interval)
		}
	}
	b.retry = time.Time{}
	b.leases, b.live = b.leases[:0], b.live[:0]
	for _, m := range b.members {
		if !m.ended && !m.gone {
			b.leases = append(b.leases, m.Lease)
			b.live = append(b.live, m)
		}
	}
	b.busy = len(b.live) > 0
	return b.busy
}

// nextEvent returns when the group's goroutine must wake next: for the
// earliest fence, and, when slots are free for statements, for the
// earliest bucket due. Zero means only a join or a statement's end.
func (g *group) nextEvent(slots bool) time.Time {
	var at time.Time
	for _, b := range g.buckets {
		at = earliest(at, b.fenceTime())
		if slots && !b.busy && len(b.members) > 0 {
			at = earliest(at, b.next())
		}
	}
	return at
}

// renew sends b's statement and settles its outcome.
func (g *group) renew(ctx context.Context, b *bucket) result {
	sent := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, g.key.timeout)
	lost, err := g.set.Renew(callCtx, b.leases)
	if err == nil && callCtx.Err() != nil {
		// Answered after its context ended: a driver that cancels the
		// statement on the server then (lib/pq does) reports success for
		// a renewal whose wait for the synchronous standbys the cancel cut
		// short. It renewed nothing that a failover keeps.
		err = fmt.Errorf("%w: %w", backend.ErrReplicationCancelled, callCtx.Err())
	}
	cancel()
	if g.settings.Round != nil {
		g.settings.Round(ctx, Round{Members: b.live, Ended: lost, Sent: sent, Err: err})
	}
	if err != nil {
		return result{b: b}
	}
	g.settle(b, lost, sent)
	return result{b: b, ok: true}
}

// settle confirms, until their trust after sent, the leases of b's
// statement that it renewed, and reports the loss of those in ended, or
// the request that their holder stop.
func (g *group) settle(b *bucket, ended map[backend.Lease]backend.Ended, sent time.Time) {
	t := nanos(sent)
	g.set.mu.Lock()
	defer g.set.mu.Unlock()
	for _, m := range b.live {
		switch {
		case m.left || m.ended || m.gone:
			// Stopped, or its work already ended: nothing to renew.
		default:
			e, found := ended[m.Lease]
			if !found {
				m.deadline = max(m.deadline, t+int64(m.trust))
				continue
			}
			m.gone = true
			m.lose(Loss{Stop: e.Stop, Reason: e.Reason})
		}
	}
	b.fence = never
	for _, m := range b.members {
		if !m.gone {
			b.fence = min(b.fence, m.deadline)
		}
	}
}

// finish frees the slot of r's statement: a bucket whose statement failed
// is renewed again a quarter of the interval later, unless it is due
// sooner; one that succeeded is merged into lower buckets if they have room
// for it.
func (g *group) finish(ctx context.Context, r result, now time.Time) {
	r.b.busy = false
	switch {
	case !r.ok && ctx.Err() == nil:
		r.b.retry = now.Add(g.key.interval / 4)
	case r.ok:
		g.merge(r.b)
	}
}

// merge moves the members of b, just renewed, into lower-numbered buckets
// due no later than b, if they have room for all of them.
func (g *group) merge(b *bucket) {
	if b.n == 0 || b.n >= len(g.buckets) || g.buckets[b.n] != b || len(b.members) == 0 {
		return // the first, dropped, or empty
	}
	into := func(l *bucket) bool { return len(l.members) > 0 && !l.next().After(b.next()) }
	room := 0
	for _, l := range g.buckets[:b.n] {
		if into(l) {
			room += max(0, backend.MaxBatch-len(l.members))
		}
	}
	if room < len(b.members) {
		return
	}
	for _, l := range g.buckets[:b.n] {
		if !into(l) {
			continue
		}
		for len(b.members) > 0 && len(l.members) < backend.MaxBatch {
			m := b.members[len(b.members)-1]
			b.remove(m)
			l.add(m)
		}
		l.fence = min(l.fence, b.fence)
	}
	b.fence = never
	g.trim()
}
