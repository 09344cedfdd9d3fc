package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/observe"
)

// heldLeases writes n held lease rows at once, with target IDs that need
// quoting in an array literal, and returns them as Leases.
func heldLeases(t *testing.T, db *gorm.DB, n int) []gormlease.Lease {
	t.Helper()
	prefix := newTarget(t) + `,"{q}\`
	leases := make([]gormlease.Lease, n)
	rows := make([]gormlease.JobLease, n)
	for i := range leases {
		leases[i] = gormlease.Lease{TargetID: fmt.Sprintf("%s %d", prefix, i), Token: uuid.New(), Generation: 1}
		rows[i] = gormlease.JobLease{TargetID: leases[i].TargetID, LeaseToken: leases[i].Token, Generation: 1,
			Holder: "test", UpdatedAt: time.Now()}
	}
	require.NoError(t, db.CreateInBatches(rows, 500).Error)
	return leases
}

// count returns the number of statements recorded since the last take.
func (s *statements) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sql)
}

// heartbeatStatements returns those of sql that renew leases.
func heartbeatStatements(sql []string) (n int) {
	for _, s := range sql {
		// PostgreSQL's renews in a CTE, the others' are a bare UPDATE.
		beat := strings.HasPrefix(strings.TrimSpace(s), "UPDATE job_lease") || strings.Contains(s, "renewed AS (\n\tUPDATE job_lease")
		if beat && strings.Contains(s, "updated_at =") {
			n++
		}
	}
	return n
}

// HeartbeatMany renews 1,000 leases a statement and reports exactly the
// leases that are no longer the caller's: taken over or released, in any
// chunk.
func TestRepository_HeartbeatManyReportsExactlyTheLostLeases(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		leases := heldLeases(t, db, 2100)
		stolen := []int{3, 1000, 2099}
		for _, i := range stolen {
			steal(t, s, db, leases[i].TargetID)
		}
		repo := newRepository(t, db)
		require.NoError(t, repo.Release(context.Background(), leases[1500]))
		age(t, s, db, leases[42].TargetID, time.Minute)

		rec, st := recording(db)
		lost, err := gormlease.HeartbeatMany(newRepository(t, rec), context.Background(), leases)
		require.NoError(t, err)
		assert.Equal(t, 3, heartbeatStatements(st.take()), "one statement per 1,000 leases")
		want := map[gormlease.Lease]bool{leases[1500]: true}
		for _, i := range stolen {
			want[leases[i]] = true
		}
		assert.Equal(t, want, lost)
		assert.WithinDuration(t, time.Now(), leaseRow(t, db, leases[42].TargetID).UpdatedAt, 30*time.Second,
			"a renewed lease kept its old heartbeat")
		for _, i := range stolen {
			assert.NotEqual(t, leases[i].Token, leaseRow(t, db, leases[i].TargetID).LeaseToken)
		}
	})
}

// HeartbeatMany refuses a bad lease before writing anything.
func TestRepository_HeartbeatManyBadInput(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		leases := heldLeases(t, db, 2)
		age(t, s, db, leases[0].TargetID, time.Minute)
		before := leaseRow(t, db, leases[0].TargetID).UpdatedAt
		_, err := gormlease.HeartbeatMany(newRepository(t, db), context.Background(),
			[]gormlease.Lease{leases[0], {TargetID: leases[1].TargetID}})
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "nil token")
		assert.Equal(t, before, leaseRow(t, db, leases[0].TargetID).UpdatedAt, "a lease was renewed")
	})
}

// Runs that hold leases at once share their heartbeats: one statement per
// interval for all of them, not one per lease. A lease taken over cancels
// only its own work; the others carry on and save.
func TestRun_BatchedHeartbeatsCancelOnlyTheLostLease(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const n, interval = 8, 100 * time.Millisecond
		rec, st := recording(s.Open(t, nil)) // a pool of its own: no other test's leases
		// Timeouts that hold under -race on a busy machine: only the
		// theft may cost a lease.
		r := newRunner(t, rec, append(fast(interval, 10*time.Second), gormlease.WithOperationTimeout(10*time.Second))...)
		targets := make([]string, n)
		for i := range targets {
			targets[i] = newTarget(t)
		}
		victim := targets[3]

		var entered atomic.Int32
		allInside := make(chan struct{})
		stolen := make(chan struct{})
		results := make([]<-chan runResult[string], n)
		var begun time.Time
		for i, target := range targets {
			results[i] = goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
				if entered.Add(1) == n {
					close(allInside)
				}
				if target == victim {
					<-ctx.Done()
					return "", context.Cause(ctx)
				}
				select {
				case <-stolen: // keep going a few heartbeats after the theft
					time.Sleep(4 * interval)
					return "ok", ctx.Err()
				case <-ctx.Done():
					return "", context.Cause(ctx)
				}
			}, func(*gorm.DB, string) error { return nil })
		}
		select {
		case <-allInside:
		case <-time.After(30 * time.Second):
			close(stolen) // let the Runs that got in end
			t.Fatalf("only %d of %d Runs got inside their work in 30s", entered.Load(), n)
		}
		st.take()
		begun = time.Now()
		steal(t, s, db, victim)
		close(stolen)

		for i, target := range targets {
			res := recv(t, results[i], 10*time.Second, "Run "+target)
			if target == victim {
				require.ErrorIs(t, res.Err, gormlease.ErrLeaseLost)
				assert.Nil(t, leaseRow(t, db, target).ReleasedAt, "the thief's lease was released")
				continue
			}
			require.NoError(t, res.Err, target)
			assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, target)
		}
		beats := heartbeatStatements(st.take())
		rounds := int(time.Since(begun)/interval) + 2
		assert.Positive(t, beats)
		assert.LessOrEqual(t, beats, rounds, "%d heartbeat statements for %d leases in %d intervals", beats, n, rounds)
	})
}

// Leases with different heartbeat intervals on one pool are renewed at
// their own pace, not at the fastest one's: the fast lease is renewed five
// times while the slow one, due once a minute, is not renewed at all.
func TestRun_HeartbeatGroupsKeepTheirIntervals(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.Open(t, nil) // a pool of its own: no other test's heartbeat groups
		// The same operation timeout for both, generous for a busy machine:
		// only the interval may tell their groups apart.
		opTimeout := gormlease.WithOperationTimeout(10 * time.Second)
		fastRunner := newRunner(t, db, append(fast(40*time.Millisecond, 5*time.Second), opTimeout)...)
		slowRunner := newRunner(t, db, append(fast(time.Minute, 3*time.Minute), opTimeout)...)
		fastTarget, slowTarget := newTarget(t), newTarget(t)
		done := make(chan struct{})
		hold := func(inside chan struct{}) func(context.Context) (string, error) {
			return func(ctx context.Context) (string, error) {
				close(inside)
				select {
				case <-done:
					return "ok", nil
				case <-ctx.Done():
					return "", context.Cause(ctx)
				}
			}
		}
		save := func(*gorm.DB, string) error { return nil }
		// The fast lease's heartbeats start first, so that a slow lease
		// that joined them would be renewed at the fast pace.
		fastInside, slowInside := make(chan struct{}), make(chan struct{})
		fastRes := goRun(t, context.Background(), fastRunner, fastTarget, hold(fastInside), save)
		waitInside(t, fastInside, fastRes, "fast Run")
		slowRes := goRun(t, context.Background(), slowRunner, slowTarget, hold(slowInside), save)
		waitInside(t, slowInside, slowRes, "slow Run")

		slowFirst := leaseRow(t, db, slowTarget).UpdatedAt
		fastSeen := map[time.Time]bool{}
		waitFor(t, 20*time.Second, "five renewals of the fast lease", func() bool {
			fastSeen[leaseRow(t, db, fastTarget).UpdatedAt] = true
			return len(fastSeen) > 5 // its first heartbeat seen, and five more
		})
		// At most 20s have passed since the slow lease was acquired: well
		// within its interval of a minute.
		assert.Equal(t, slowFirst, leaseRow(t, db, slowTarget).UpdatedAt, "the slow lease was renewed at the fast pace")
		close(done)
		require.NoError(t, recv(t, fastRes, 10*time.Second, "fast Run").Err)
		require.NoError(t, recv(t, slowRes, 10*time.Second, "slow Run").Err)
	})
}

// waitInside waits until a Run is inside its work, failing t with the Run's
// error if it returns first.
func waitInside(t *testing.T, inside <-chan struct{}, res <-chan runResult[string], what string) {
	t.Helper()
	select {
	case <-inside:
	case r := <-res:
		t.Fatalf("%s returned before its work: %v", what, r.Err)
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s to be inside its work", what)
	}
}

// The heartbeat goroutine of a group starts with its first lease and is
// gone when Run returns: nothing outlives the Runs, even when they end
// together, lose their lease, or fail.
func TestRun_NoHeartbeatGoroutineOutlivesRun(t *testing.T) {
	// Not parallel: it counts the package's live heartbeat groups.
	for _, s := range testdb.All(t) {
		db := s.DB(t)
		// Timeouts that hold while 30 acquires queue on a busy machine.
		r := newRunner(t, db, append(fast(20*time.Millisecond, 5*time.Second),
			gormlease.WithOperationTimeout(10*time.Second))...)
		const n = 30
		var inside atomic.Int32
		allInside := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			target := newTarget(t)
			wg.Go(func() {
				_, _ = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
					if inside.Add(1) == n {
						close(allInside)
					}
					select { // not t.Fatal: this is not the test's goroutine
					case <-allInside:
					case <-time.After(30 * time.Second):
						t.Errorf("only %d of %d Runs inside their work after 30s", inside.Load(), n)
					}
					if i == 0 {
						assert.NotEmpty(t, heartbeatGoroutines(), "the probe sees no heartbeat goroutine while leases are held")
					}
					switch i % 3 {
					case 0:
						steal(t, s, db, target)
						<-ctx.Done()
						return "", context.Cause(ctx)
					case 1:
						return "", errors.New("work failed")
					}
					time.Sleep(60 * time.Millisecond)
					return "ok", nil
				}, func(*gorm.DB, string) error { return nil })
			})
		}
		wg.Wait()
		assert.Zero(t, admin.ReadStats().HeartbeatGroups, "a heartbeat group outlived its Runs")
		assert.Empty(t, heartbeatGoroutines(), "a heartbeat goroutine outlived its Run on %s", s.Name)
	}
}

// heartbeatGoroutines returns the stacks of the goroutines that run
// gormlease's heartbeats. (goleak would also see the connections that the
// pools open meanwhile, which are not leaks.)
func heartbeatGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/heartbeat.(*group)") {
			found = append(found, g)
		}
	}
	return found
}

// WithHeartbeatDB sends the heartbeats through its own pool, and only them.
func TestRun_WithHeartbeatDBCarriesTheHeartbeats(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		main, mainSQL := recording(s.Open(t, nil))
		beats, beatSQL := recording(s.Open(t, nil))
		// A lease timeout that a busy machine's slow statements do not
		// reach: the test is about where the heartbeats go.
		r := newRunner(t, main, append(fast(30*time.Millisecond, 10*time.Second), gormlease.WithHeartbeatDB(beats))...)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			waitFor(t, 30*time.Second, "three heartbeats on the heartbeat pool", func() bool {
				return beatSQL.count() >= 3 || ctx.Err() != nil
			})
			return "ok", context.Cause(ctx)
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		assert.Zero(t, heartbeatStatements(mainSQL.take()), "a heartbeat went through the main pool")
		sql := beatSQL.take()
		assert.Positive(t, heartbeatStatements(sql))
		for _, stmt := range sql {
			// Only heartbeats: no acquire, commit or release (MySQL's
			// heartbeat also reads back what its UPDATE renewed).
			assert.NotContains(t, stmt, "INSERT", "the heartbeat pool ran an acquire")
			assert.NotContains(t, stmt, "released_at =", "the heartbeat pool ran a release")
			assert.NotContains(t, stmt, "job_result", "the heartbeat pool ran a save")
		}
	})
}

// WithHeartbeatDB refuses a nil db and one inside a transaction.
func TestNewRunner_RejectsBadHeartbeatDB(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t).DB(t)
	_, err := gormlease.NewRunner[string](db, gormlease.WithHeartbeatDB(nil))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithHeartbeatDB: db is nil")

	tx := db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	_, err = gormlease.NewRunner[string](db, gormlease.WithHeartbeatDB(tx))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithHeartbeatDB")
	assert.Contains(t, err.Error(), "inside a transaction")
}

// 100 jobs at once progress on a pool of one connection: the work holds no
// connection, so all 100 hold their lease at once and one heartbeat
// statement renews them all; none loses its lease. With WithHeartbeatDB the
// heartbeats have a connection of their own too. The timeouts are generous
// because 100 acquires and 100 commits queue for the one connection, which
// takes seconds under -race on a busy machine.
func TestRun_HundredJobsOnOneConnection(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		for _, separate := range []bool{false, true} {
			name := map[bool]string{false: "SharedPool", true: "WithHeartbeatDB"}[separate]
			t.Run(name, func(t *testing.T) {
				const n, interval = 100, 100 * time.Millisecond
				db, beatSQL := recording(s.Open(t, nil))
				sqlDB, err := db.DB()
				require.NoError(t, err)
				sqlDB.SetMaxOpenConns(1)
				opts := append(fast(interval, 30*time.Second), gormlease.WithOperationTimeout(20*time.Second))
				if separate {
					var beats *gorm.DB
					beats, beatSQL = recording(s.Open(t, nil))
					beatsSQL, err := beats.DB()
					require.NoError(t, err)
					beatsSQL.SetMaxOpenConns(1)
					opts = append(opts, gormlease.WithHeartbeatDB(beats))
				}
				r := newRunner(t, db, opts...)
				targets := make([]string, n)
				for i := range targets {
					targets[i] = newTarget(t)
				}
				// The work holds its lease until one heartbeat statement
				// has renewed all 100: a connection held by the work, or
				// a statement per lease, would never let that happen.
				renewedAll := make(chan struct{})
				work := func(ctx context.Context) (string, error) {
					select {
					case <-renewedAll:
						return "done", nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}
				results := make([]<-chan runResult[string], n)
				for i, target := range targets {
					results[i] = goRun(t, context.Background(), r, target, work, gormlease.SaveJSON[string])
				}
				// Once all 100 are held, every one is renewed by fewer
				// heartbeat statements than there are leases. (PostgreSQL
				// reports its statement with placeholders, so the rows say
				// which leases were renewed, not the statement's text.)
				check := s.DB(t)
				deadline := time.Now().Add(45 * time.Second)
				var held map[string]time.Time
				for held = renewals(t, check, targets); len(held) < n; held = renewals(t, check, targets) {
					require.False(t, time.Now().After(deadline), "only %d of %d leases held after 45s", len(held), n)
					time.Sleep(20 * time.Millisecond)
				}
				beatSQL.take()
				for renewed := 0; renewed < n; {
					if time.Now().After(deadline) {
						t.Errorf("only %d of %d leases renewed in 45s", renewed, n)
						break
					}
					time.Sleep(20 * time.Millisecond)
					renewed = 0
					for target, at := range renewals(t, check, targets) {
						if at.After(held[target]) {
							renewed++
						}
					}
				}
				beats := heartbeatStatements(beatSQL.take())
				assert.Less(t, beats, n/2, "heartbeat statements to renew %d leases once", n)
				close(renewedAll)
				for i := range n {
					assert.NoError(t, recv(t, results[i], time.Minute, "Run").Err)
				}
				for _, target := range targets {
					got, _, err := gormlease.LoadJSON[string](context.Background(), db, target)
					require.NoError(t, err)
					assert.Equal(t, "done", got)
				}
			})
		}
	})
}

// renewals returns the last heartbeat of each of targets' rows that holds
// a lease, on the database's clock.
func renewals(t *testing.T, db *gorm.DB, targets []string) map[string]time.Time {
	t.Helper()
	var rows []gormlease.JobLease
	require.NoError(t, db.Where("target_id IN ? AND released_at IS NULL", targets).Find(&rows).Error)
	at := make(map[string]time.Time, len(rows))
	for _, row := range rows {
		at[row.TargetID] = row.UpdatedAt
	}
	return at
}

// sends records when each lease's heartbeats that renewed it were sent, as
// an Observer.
type sends struct {
	mu     sync.Mutex
	since  time.Time // zero: not recording yet
	until  time.Time // zero: recording until the end
	leases map[string][]time.Time
}

func (s *sends) Start(ctx context.Context, span observe.Span) (context.Context, func(error)) {
	if span.Kind != observe.SpanHeartbeat {
		return ctx, func(error) {}
	}
	target, sent := span.TargetID, span.Start
	return ctx, func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err == nil && !s.since.IsZero() && !sent.Before(s.since) && (s.until.IsZero() || sent.Before(s.until)) {
			s.leases[target] = append(s.leases[target], sent)
		}
	}
}

func (s *sends) Record(context.Context, observe.Event) {}

// record starts recording.
func (s *sends) record() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since, s.leases = time.Now(), map[string][]time.Time{}
}

// stop stops recording: heartbeats sent from now on are left out, those
// on their way are recorded.
func (s *sends) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.until = time.Now()
}

// fewest returns the fewest heartbeats recorded of any of targets.
func (s *sends) fewest(targets []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := -1
	for _, target := range targets {
		if k := len(s.leases[target]); n < 0 || k < n {
			n = k
		}
	}
	return n
}

// manyLeasesDB opens a pool of its own on PostgreSQL, for a test that
// holds many leases: no other test's leases share its heartbeats, and at
// most 20 connections serve its Runs, which commit all at once in the
// end.
func manyLeasesDB(t *testing.T) *gorm.DB {
	t.Helper()
	db := testdb.Postgres(t).Open(t, nil)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(20)
	return db
}

// holdMany starts a Run of r on each of targets, whose work returns once
// done(i) is closed for the i-th, with at most 16 acquiring at once so
// that the heartbeats of the leases already held find connections, and
// waits until every one is inside its work; if that takes over two
// minutes, it calls abort, which must close every done channel, and fails
// t.
func holdMany(t *testing.T, r *gormlease.Runner[string], targets []string, done func(i int) <-chan struct{},
	abort func(),
) []<-chan runResult[string] {
	t.Helper()
	var inside sync.WaitGroup
	inside.Add(len(targets))
	acquiring := make(chan struct{}, 16)
	results := make([]<-chan runResult[string], len(targets))
	for i, target := range targets {
		acquiring <- struct{}{}
		release := done(i)
		results[i] = goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
			<-acquiring
			inside.Done()
			select {
			case <-release:
				return "ok", nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		}, func(*gorm.DB, string) error { return nil })
	}
	allInside := make(chan struct{})
	go func() { inside.Wait(); close(allInside) }()
	select {
	case <-allInside:
	case <-time.After(2 * time.Minute):
		abort()
		t.Fatalf("not every one of %d Runs was inside its work after 2m", len(targets))
	}
	return results
}

// The leases of one Runner are renewed in batches of 1,000, and the
// batches' statements are spread over the interval, each at a phase of its
// own, while each lease is renewed an interval after the last time: here
// 2,500 leases, three statements a round (1,000, 1,000 and 500 leases),
// watched for ten rounds. All three at once, as a round sent as fast as
// possible would be, fails.
func TestRun_HeartbeatsAreSpreadOverTheInterval(t *testing.T) {
	t.Parallel()
	db := manyLeasesDB(t)
	const n, interval, rounds = 2500, 400 * time.Millisecond, 10
	obs := &sends{}
	// Timeouts that hold while 2,500 acquires queue under -race on a busy
	// machine: only the pace of the heartbeats is measured.
	r := newRunner(t, db, append(fast(interval, 30*time.Second),
		gormlease.WithOperationTimeout(10*time.Second), gormlease.WithObserver(obs))...)
	targets := make([]string, n)
	for i := range targets {
		targets[i] = newTarget(t)
	}
	done := make(chan struct{})
	results := holdMany(t, r, targets, func(int) <-chan struct{} { return done }, func() { close(done) })
	obs.record()
	waitFor(t, time.Minute, fmt.Sprintf("%d heartbeats of every lease", rounds), func() bool {
		return obs.fewest(targets) >= rounds
	})
	// Only the rounds while every lease is held: once the work ends, the
	// leases leave their batches one by one, and the statements of the
	// batches left renew fewer of them, and merge.
	obs.stop()
	close(done)
	for i := range n {
		require.NoError(t, recv(t, results[i], time.Minute, "Run").Err)
	}

	// A statement is the leases whose heartbeat was sent at one time; a
	// batch, the leases renewed together, named by the least of them.
	batchOf := map[time.Time]string{}
	var periods []time.Duration
	for _, target := range targets {
		sent := obs.leases[target]
		slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
		for i, at := range sent {
			if b, ok := batchOf[at]; !ok || target < b {
				batchOf[at] = target
			}
			if i > 0 {
				periods = append(periods, at.Sub(sent[i-1]))
			}
		}
	}
	slices.Sort(periods)
	median := periods[len(periods)/2]
	assert.InDelta(t, interval, median, float64(interval/10), "the median time between two heartbeats of a lease")
	assert.Less(t, periods[len(periods)-1], 2*interval, "a lease waited two intervals for its heartbeat")

	// Each batch's phase: when in the interval its statements were sent,
	// the median over the rounds.
	first := slices.MinFunc(slices.Collect(maps.Keys(batchOf)), func(a, b time.Time) int { return a.Compare(b) })
	phases := map[string][]time.Duration{}
	for at, batch := range batchOf {
		phases[batch] = append(phases[batch], at.Sub(first)%interval)
	}
	require.Len(t, phases, 3, "batches of 1,000 leases")
	var medians []time.Duration
	for _, ps := range phases {
		slices.Sort(ps)
		medians = append(medians, ps[len(ps)/2])
	}
	for i, a := range medians {
		for _, b := range medians[i+1:] {
			apart := (a - b + interval) % interval
			apart = min(apart, interval-apart)
			assert.GreaterOrEqual(t, apart, interval/8, "two batches' heartbeats are sent %v apart in the interval of %v (phases %v)",
				apart, interval, medians)
		}
	}
}

// batchSizes records the number of leases of each heartbeat statement, as
// an Observer.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) Start(ctx context.Context, _ observe.Span) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (b *batchSizes) Record(_ context.Context, e observe.Event) {
	if e.Kind == observe.EventHeartbeat && e.Err == nil {
		b.mu.Lock()
		b.sizes = append(b.sizes, e.Leases)
		b.mu.Unlock()
	}
}

// last returns the sizes of the last n statements, or nil before n.
func (b *batchSizes) last(n int) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sizes) < n {
		return nil
	}
	return slices.Clone(b.sizes[len(b.sizes)-n:])
}

// When leases leave, the batches that are left are merged, so that the
// leases still held are renewed by one statement per 1,000 again: here
// 1,500 leases in two batches, of which 1,000 leave, and the other 500 end
// up in one statement, and keep their leases.
func TestRun_HeartbeatBatchesMergeWhenLeasesLeave(t *testing.T) {
	t.Parallel()
	db := manyLeasesDB(t)
	const n, leaving, interval = 1500, 1000, 200 * time.Millisecond
	obs := &batchSizes{}
	r := newRunner(t, db, append(fast(interval, 30*time.Second),
		gormlease.WithOperationTimeout(10*time.Second), gormlease.WithObserver(obs))...)
	targets := make([]string, n)
	for i := range targets {
		targets[i] = newTarget(t)
	}
	stay, leave := make(chan struct{}), make(chan struct{})
	results := holdMany(t, r, targets, func(i int) <-chan struct{} {
		if i%3 != 0 { // two in three leave, from both batches
			return leave
		}
		return stay
	}, func() { close(stay); close(leave) })
	waitFor(t, 30*time.Second, "two heartbeat statements a round", func() bool {
		return slices.Equal(obs.last(2), []int{1000, 500}) || slices.Equal(obs.last(2), []int{500, 1000})
	})
	close(leave)
	for i := range n {
		if i%3 != 0 {
			require.NoError(t, recv(t, results[i], time.Minute, "a Run that leaves").Err)
		}
	}
	waitFor(t, 30*time.Second, "the 500 leases left renewed by one statement, three rounds running", func() bool {
		return slices.Equal(obs.last(3), []int{n - leaving, n - leaving, n - leaving})
	})
	close(stay)
	for i := 0; i < n; i += 3 {
		require.NoError(t, recv(t, results[i], time.Minute, "a Run that stays").Err)
	}
}
