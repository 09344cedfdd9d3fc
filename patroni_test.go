package gormlease_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Patroni tests run on the process's Patroni cluster (testdb.SharedPatroni):
// three members in synchronous mode and a one-node etcd, with no watchdog.
// Each test fails the cluster over in one way, checks what the Runs
// returned against what the new primary holds, and heals the cluster
// before it ends. They do not run in parallel: they share the cluster.

// patroniOptions are the settings of issue 18's reproduction: heartbeats
// every 200 ms, a lease timeout of 2 s (a trust window of 1.8 s) and an
// operation timeout of 3 s.
func patroniOptions() []gormlease.Option {
	return []gormlease.Option{
		gormlease.WithHeartbeatInterval(200 * time.Millisecond),
		gormlease.WithLeaseTimeout(2 * time.Second),
		gormlease.WithOperationTimeout(3 * time.Second),
	}
}

// stormOutcome is what one Run of a storm returned.
type stormOutcome struct {
	target     string
	generation int64 // 0 when the work never ran
	err        error
	began      time.Time // when Run was called
	ended      time.Time // when it returned
}

// storm runs Runs on new targets from many goroutines until stopped: each
// Run's work takes 50 to 1,000 ms (so that heartbeats renew it), and its
// saver holds the fenced transaction open 0 to 100 ms after its insert (so
// that some Runs are in their commit at any moment).
type storm struct {
	r     *gormlease.Runner[string]
	saves saves

	mu       sync.Mutex
	outcomes []stormOutcome
	saved    atomic.Int64

	// outages are the stretches in which the test's own probes found no
	// primary that committed a write, from the fault on, longest first.
	outages []outage
	fault   time.Time // when the fault began
}

// outage is a stretch of time without a primary, between the last probe
// that committed a write before it and the first one after it: it holds
// the real outage, give or take a probe.
type outage struct{ from, to time.Time }

func (o outage) length() time.Duration { return o.to.Sub(o.from) }

// overlaps reports whether a Run that ran from began to ended was at work
// during the outage.
func (o outage) overlaps(began, ended time.Time) bool {
	return began.Before(o.to) && ended.After(o.from)
}

// longest is the longest of outages, or none.
func longest(outages []outage) outage {
	if len(outages) == 0 {
		return outage{}
	}
	return outages[0]
}

// probeOutages commits a write on db, a pool on the cluster's multi-host
// DSN as the storm's that keeps no idle connection, every 100 ms until stop
// is closed, each within a second, and returns the stretches of over a
// second between two probes that committed, longest first. Each probe is
// what a Run's first statement does at worst: it dials the DSN, which
// finds the primary, and commits a write (in synchronous mode, once a
// synchronous standby confirms it, as the fenced commits need). So an
// outage is what an application sees: no primary, or none that it could
// reach and commit on within a second.
func probeOutages(db *gorm.DB, stop <-chan struct{}) []outage {
	last := time.Now()
	var gaps []outage
	gap := func(now time.Time) {
		if o := (outage{last, now}); o.length() > time.Second {
			gaps = append(gaps, o)
		}
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.WithContext(ctx).Exec(`INSERT INTO patroni_probe (id, at) VALUES (1, clock_timestamp())
			ON CONFLICT (id) DO UPDATE SET at = excluded.at`).Error
		cancel()
		now := time.Now()
		if err == nil {
			gap(now)
			last = now
		}
		select {
		case <-stop:
			gap(now) // no primary until the end
			slices.SortFunc(gaps, func(a, b outage) int { return cmp.Compare(b.length(), a.length()) })
			return gaps
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// run runs workers goroutines until stop is closed, and returns once every
// Run has returned.
func (s *storm) run(t *testing.T, workers int, stop <-chan struct{}) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				target := newTarget(t)
				began := time.Now()
				var gen int64
				_, err := s.r.Run(ctx, target, func(ctx context.Context) (string, error) {
					l, _ := gormlease.LeaseFromContext(ctx)
					gen = l.Generation
					select {
					case <-time.After(time.Duration(50+rand.IntN(950)) * time.Millisecond):
						return "result", nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}, func(tx *gorm.DB, v string) error {
					if err := s.saves.save(tx, v); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
					return nil
				})
				if err == nil {
					s.saved.Add(1)
				}
				s.mu.Lock()
				s.outcomes = append(s.outcomes, stormOutcome{target, gen, err, began, time.Now()})
				s.mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond) // the cluster is away: do not spin
				}
			}
		})
	}
	wg.Wait()
}

// quoted matches the quoted targets in errors' messages, which the log of
// the kinds of errors leaves out.
var quoted = regexp.MustCompile(`"[^"]*"`)

// check checks the storm's outcomes against the saves that db, a pool on
// the new primary, holds: no target saved twice, every Run that returned
// nil saved on the new primary, no Run that returned another error than
// ErrCommitUnknown saved, and every error a library error. It returns the
// count of each kind of outcome, for the log.
func (s *storm) check(t *testing.T, db *gorm.DB) map[string]int {
	t.Helper()
	all := s.saves.byTargetOn(t, db)
	kinds := map[string]int{}
	for _, o := range s.outcomes {
		switch {
		case o.err == nil:
			kinds["saved"]++
			assert.Equal(t, []int64{o.generation}, all[o.target],
				"%s: Run returned nil, but the new primary does not hold its one save", o.target)
		case errors.Is(o.err, gormlease.ErrCommitUnknown):
			kinds["commit unknown"]++
			assert.LessOrEqual(t, len(all[o.target]), 1, "%s: saves", o.target)
		default:
			kinds[quoted.ReplaceAllString(errKind(o.err), "")]++
			assert.Empty(t, all[o.target], "%s: saved, though Run returned %v", o.target, o.err)
		}
		if o.err != nil {
			assert.True(t, libraryError(o.err), "%s: not a library error: %v", o.target, o.err)
		}
	}
	for target, gens := range all {
		assert.Len(t, gens, 1, "%s: saved twice", target)
	}
	return kinds
}

// stormFailover runs a storm of 50 Runs through the cluster's multi-host
// DSN, which lists the leader first, fails the leader with fault once the
// Runs have saved results, waits for a new leader, lets the storm go on for
// a few seconds more, and checks the outcomes on the new primary; then it
// heals the cluster and checks them again on the primary after the heal.
func stormFailover(t *testing.T, opts []gormlease.Option,
	fault func(t *testing.T, c *testdb.Patroni, leader *testdb.PatroniMember),
) *storm {
	c := testdb.SharedPatroni(t)
	old := c.Leader()
	require.NotNil(t, old, "no leader")
	db := c.Open(t, old)
	sv := newSaves(t, db)
	probeDB := c.Open(t, old)
	require.NoError(t, probeDB.Exec(`CREATE TABLE IF NOT EXISTS patroni_probe (
		id int PRIMARY KEY, at timestamptz NOT NULL)`).Error)
	probeSQL, err := probeDB.DB()
	require.NoError(t, err)
	probeSQL.SetMaxIdleConns(0) // each probe dials, as a Run's first statement may
	s := &storm{r: newRunner(t, db, opts...), saves: sv}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { defer close(stopped); s.run(t, 50, stop) }()
	// The storm is stopped once: after the failover, or by the heal
	// deferred for a test that ends before that (closing stop twice would
	// panic, and end every test of the process).
	storming := true
	stopStorm := func() {
		if storming {
			storming = false
			close(stop)
			<-stopped
		}
	}
	healed := false
	defer func() {
		if !healed {
			stopStorm()
			c.Heal(t)
		}
	}()
	waitFor(t, 30*time.Second, "the storm to save results", func() bool { return s.saved.Load() >= 50 })

	// The probes run from the fault until the storm has stopped, and are
	// joined before the test goes on, whatever happens.
	stopProbe, probed := make(chan struct{}), make(chan []outage, 1)
	go func() { probed <- probeOutages(probeDB, stopProbe) }()
	probing := true
	endProbe := func() {
		if probing {
			probing = false
			close(stopProbe)
			s.outages = <-probed
		}
	}
	defer endProbe()

	before := s.saved.Load()
	start := time.Now()
	s.fault = start
	fault(t, c, old)
	leader := c.WaitLeader(t, old, 90*time.Second) // Patroni took 3 to 15 s here, more under load
	seen := time.Now()
	failover := seen.Sub(start)
	time.Sleep(3 * time.Second) // Runs go on after the failover: it takes a moment to see their effect
	stopStorm()
	endProbe()
	// The outcomes against the new primary, before the old one rejoins;
	// then again against the primary after the heal, which may be another.
	kinds := s.check(t, leader.Open(t))
	healStart := time.Now()
	c.Heal(t)
	healed = true
	heal := time.Since(healStart)
	now := c.Leader()
	require.NotNil(t, now, "no leader after the heal")
	s.check(t, now.Open(t))
	// Recovery: the first Run begun after the new leader was seen that
	// saved, counted from the fault.
	recovery := "none before the cluster was healed"
	var first time.Duration
	for _, o := range s.outcomes {
		if d := o.began.Sub(start); o.err == nil && o.began.After(seen) && (first == 0 || d < first) {
			first = d
		}
	}
	if first > 0 {
		recovery = first.Round(time.Millisecond).String() + " after the fault"
	}
	t.Logf("failover from %s to %s in %v, without a primary for %v; first saving Run begun after it: %s; "+
		"healed in %v; %d Runs (%d saved before the fault): %v", old.Name(), leader.Name(),
		failover.Round(time.Millisecond), longest(s.outages).length().Round(time.Millisecond), recovery,
		heal.Round(time.Millisecond), len(s.outcomes), before, kinds)
	return s
}

// TestPatroni_KillPostmaster kills the leader's postmaster with SIGKILL
// while 50 Runs work, commit and heartbeat through the multi-host DSN:
// Patroni (primary_start_timeout 0) promotes the synchronous standby. No
// target is saved twice, every Run that returned nil has its save on the
// new primary, and every other Run returned a library error.
func TestPatroni_KillPostmaster(t *testing.T) {
	stormFailover(t, patroniOptions(), func(t *testing.T, _ *testdb.Patroni, leader *testdb.PatroniMember) {
		leader.KillPostmaster(t)
	})
}

// TestPatroni_KillPatroni kills the leader's Patroni with SIGKILL while 50
// Runs work, commit and heartbeat through the multi-host DSN. Its
// PostgreSQL stays up and read-write, first in the DSN, until the test
// heals the cluster (Patroni then rewinds it and makes it a replica): its
// commits wait for a synchronous standby that has been promoted, and those
// that the client gives up on commit there locally. No Run may return nil
// for a save that the new primary lacks.
func TestPatroni_KillPatroni(t *testing.T) {
	var killed *testdb.PatroniMember
	stormFailover(t, patroniOptions(), func(t *testing.T, _ *testdb.Patroni, leader *testdb.PatroniMember) {
		killed = leader
		leader.KillPatroni(t)
	})
	t.Logf("the old primary's log: %d waits for synchronous replication cancelled, %d pg_rewind runs",
		strings.Count(killed.Log(), "canceling wait for synchronous replication"), strings.Count(killed.Log(), "pg_rewind"))
}

// TestPatroni_StoppedPatroni stops the leader's Patroni with SIGSTOP, as a
// hung process, while Runs of a Runner connected to that primary alone hold
// leases: its PostgreSQL stays up and read-write, and etcd's leader key
// expires, so that the synchronous standby takes over; the old primary's
// commits from then on wait for a standby that has moved on.
//   - Holders whose work outlasts the failover self-fence within their
//     trust window: no heartbeat that only the old primary kept counts.
//   - Runs that commit after the failover never return nil for a save that
//     the new primary lacks.
//   - A Runner on the new primary takes each holder's target over, after
//     that holder fenced itself and only then.
func TestPatroni_StoppedPatroni(t *testing.T) {
	c := testdb.SharedPatroni(t)
	old := c.Leader()
	require.NotNil(t, old, "no leader")
	oldDB := old.Open(t)
	sv := newSaves(t, oldDB)
	// A safety margin of 1 s: the takeover on the new primary comes at
	// least that long after the holder's fence, which leaves the test room
	// to see the fence first on a loaded machine.
	const leaseTimeout, margin = 3 * time.Second, time.Second
	opts := []gormlease.Option{gormlease.WithHeartbeatInterval(200 * time.Millisecond),
		gormlease.WithLeaseTimeout(leaseTimeout), gormlease.WithSafetyMargin(margin),
		gormlease.WithOperationTimeout(3 * time.Second)}
	trust := leaseTimeout - margin
	rOld := newRunner(t, oldDB, opts...)
	ctx := context.Background()
	healed := false
	defer func() {
		if !healed {
			c.Heal(t)
		}
	}()

	const n = 5
	type holder struct {
		target string
		fenced atomic.Int64 // unix nanoseconds at which the work saw its context end
		done   <-chan runResult[string]
	}
	holders := make([]*holder, n)
	started := make(chan struct{}, 2*n)
	for i := range holders {
		h := &holder{target: newTarget(t)}
		h.done = goRun(t, ctx, rOld, h.target, func(ctx context.Context) (string, error) {
			context.AfterFunc(ctx, func() { h.fenced.Store(time.Now().UnixNano()) })
			started <- struct{}{}
			<-ctx.Done()
			return "", context.Cause(ctx)
		}, sv.save)
		holders[i] = h
	}
	commitNow := make(chan struct{})
	committers := map[string]<-chan runResult[string]{}
	for range n {
		target := newTarget(t)
		committers[target] = goRun(t, ctx, rOld, target, func(ctx context.Context) (string, error) {
			started <- struct{}{}
			select {
			case <-commitNow:
				return "after the failover", nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		}, sv.save)
	}
	for range 2 * n {
		recv(t, started, 10*time.Second, "the Runs to start")
	}

	stopped := time.Now()
	old.StopPatroni(t)
	leader := c.WaitLeader(t, old, 90*time.Second) // Patroni took 3 to 15 s here, more under load
	promoted := time.Now()
	newDB := leader.Open(t)
	// Patroni reports the new leader a moment before its promotion ends;
	// until then its standby may still receive the old primary's commits.
	waitFor(t, 10*time.Second, "the new primary to accept writes", func() bool {
		var inRecovery bool
		return newDB.Raw("SELECT pg_is_in_recovery()").Scan(&inRecovery).Error == nil && !inRecovery
	})
	close(commitNow)
	rNew := newRunner(t, newDB, opts...)

	// The takers: each tries its holder's target on the new primary until
	// it gets it.
	var wg sync.WaitGroup
	taken := make([]time.Time, n)
	for i, h := range holders {
		wg.Go(func() {
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				_, err := rNew.Run(ctx, h.target, func(context.Context) (string, error) {
					taken[i] = time.Now()
					return "taken over", nil
				}, sv.save)
				if err == nil {
					return
				}
				// Held, until the holder's timeout; or refused while the
				// new primary finishes its promotion.
				assert.True(t, libraryError(err), "%s: taker: %v", h.target, err)
				time.Sleep(20 * time.Millisecond)
			}
			t.Errorf("%s: not taken over on the new primary within 30 s", h.target)
		})
	}
	wg.Wait()
	for i, h := range holders {
		res := recv(t, h.done, 20*time.Second, "the holders")
		assert.ErrorIs(t, res.Err, gormlease.ErrLeaseLost, "%s: holder", h.target)
		fenced := time.Unix(0, h.fenced.Load())
		require.False(t, taken[i].IsZero(), "%s: never taken over", h.target)
		assert.True(t, taken[i].After(fenced), "%s: taken over on the new primary %v before its holder fenced itself",
			h.target, fenced.Sub(taken[i]))
		// The last heartbeat that the standby confirmed was sent before it
		// was promoted: the fence comes within the trust window of that,
		// and 2 s more for a loaded machine.
		assert.Less(t, fenced.Sub(promoted), trust+2*time.Second, "%s: fenced late", h.target)
		t.Logf("%s: fenced %v after the promotion was seen, taken over %v after the fence", h.target,
			fenced.Sub(promoted).Round(time.Millisecond), taken[i].Sub(fenced).Round(time.Millisecond))
	}
	outcomes := map[string]error{}
	for target, ch := range committers {
		outcomes[target] = recv(t, ch, 20*time.Second, "the committers").Err
	}

	// The saves are read from the new primary, the one that the Runs'
	// outcomes are judged against, before the heal: under load, Patroni
	// has failed the cluster over a second time while it healed, which
	// is another failover than this test's.
	saves := sv.byTargetOn(t, newDB)
	old.Continue(t)
	c.Heal(t)
	healed = true
	if now := c.Leader(); now != leader && now != nil {
		t.Logf("the leader changed again while the cluster healed: %s, then %s", leader.Name(), now.Name())
	}
	for target, err := range outcomes {
		if err == nil {
			assert.Len(t, saves[target], 1, "%s: Run returned nil, but the new primary does not hold its save", target)
		} else {
			assert.True(t, libraryError(err), "%s: not a library error: %v", target, err)
			assert.LessOrEqual(t, len(saves[target]), 1, "%s: saves", target)
		}
		t.Logf("committer after the failover: %v", err)
	}
	for _, h := range holders {
		assert.Len(t, saves[h.target], 1, "%s: the taker's save", h.target)
	}
	t.Logf("Patroni stopped; new leader %s seen %v later", leader.Name(), promoted.Sub(stopped).Round(time.Millisecond))
}

// TestPatroni_Switchover runs a storm of 50 Runs through the multi-host
// DSN while patronictl hands the leadership to the synchronous standby: a
// planned switchover. Its lease timeout and reconnect window (6 s) outlast
// a switchover on a quiet machine, as docs/scaling.md advises. No target
// is saved twice, and no save is lost, whatever the timing. Whether a Run
// may return an error is judged from what the cluster did, as the test's
// own probes measured it (see probeOutages), not from a quiet machine's
// timings. A Run at work while there was a primary, or during an outage
// no longer than the reconnect window less the operation timeout (an
// attempt on the server going away may use up that much of the window
// first), returns no error that its caller would have to handle: Runs that
// begin during the switchover acquire once the new primary accepts
// writes, fenced commits that the old primary's shutdown ended are
// committed again on the new one, and COMMITs that got no answer are
// settled by the row. Only ErrCommitUnknown (an outcome that not even the
// row could tell within the window) is allowed then. A longer outage (a
// loaded machine has seen the switchover take 25 s) is more than the
// settings ride through: the Runs at work during it may return the
// library's errors, having saved nothing (which check verifies).
func TestPatroni_Switchover(t *testing.T) {
	const window, timeout = 6 * time.Second, 3 * time.Second
	s := stormFailover(t, []gormlease.Option{gormlease.WithHeartbeatInterval(200 * time.Millisecond),
		gormlease.WithLeaseTimeout(window), gormlease.WithOperationTimeout(timeout),
		gormlease.WithReconnectWindow(window)},
		func(t *testing.T, c *testdb.Patroni, leader *testdb.PatroniMember) {
			c.Switchover(t, leader, c.SyncStandby())
		})
	var long []outage // the outages that the settings do not ride through
	for _, o := range s.outages {
		if o.length() > window-timeout {
			long = append(long, o)
		}
	}
	excused := 0
	for _, o := range s.outcomes {
		switch {
		case o.err == nil, errors.Is(o.err, gormlease.ErrCommitUnknown):
		case slices.ContainsFunc(long, func(out outage) bool { return out.overlaps(o.began, o.ended) }):
			excused++
		default:
			assert.NoError(t, o.err, "%s: an error during a switchover, by a Run at work from %v to %v after the fault "+
				"(without a primary from, to: %v)", o.target, o.began.Sub(s.fault).Round(time.Millisecond),
				o.ended.Sub(s.fault).Round(time.Millisecond), s.outagesSinceFault())
		}
	}
	t.Logf("without a primary (from, to, after the fault): %v; %d errors of Runs at work during the %d of "+
		"those longer than the window of %v less the operation timeout of %v allowed",
		s.outagesSinceFault(), excused, len(long), window, timeout)
}

// outagesSinceFault lists the storm's outages as times after the fault,
// in the order they came, for the log.
func (s *storm) outagesSinceFault() string {
	outages := slices.Clone(s.outages)
	slices.SortFunc(outages, func(a, b outage) int { return a.from.Compare(b.from) })
	var b strings.Builder
	for _, o := range outages {
		fmt.Fprintf(&b, "[%v, %v] ", o.from.Sub(s.fault).Round(time.Millisecond), o.to.Sub(s.fault).Round(time.Millisecond))
	}
	return strings.TrimSpace(b.String())
}
