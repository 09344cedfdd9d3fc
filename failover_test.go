package gormlease_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Failover tests run on a PostgreSQL primary with a streaming standby of
// their own (testdb.PgPair). The application reaches them with a multi-host
// DSN and target_session_attrs=read-write; a failover crashes the primary
// and promotes the standby, and the application goes on with the same
// *gorm.DB and the same Runner.

// failoverOptions: a trust window (4.5 s) far longer than a failover on
// loopback (about 0.3 s), and heartbeats often enough to renew leases on
// the new primary many times within it.
func failoverOptions() []gormlease.Option {
	return []gormlease.Option{
		gormlease.WithHeartbeatInterval(100 * time.Millisecond),
		gormlease.WithLeaseTimeout(5 * time.Second),
		gormlease.WithOperationTimeout(time.Second),
	}
}

// saves is the tests' result table: one row per save, with no unique key,
// so that a second save of a target would show as a second row.
type saves struct{ db *gorm.DB }

func newSaves(t *testing.T, db *gorm.DB) saves {
	require.NoError(t, db.Exec(`CREATE TABLE IF NOT EXISTS failover_saves (
		id bigserial PRIMARY KEY, target_id text NOT NULL, generation bigint NOT NULL)`).Error)
	return saves{db}
}

// save is the Runs' saver: it records the save under the lease's generation.
func (saves) save(tx *gorm.DB, _ string) error {
	l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
	return tx.Exec("INSERT INTO failover_saves (target_id, generation) VALUES (?, ?)", l.TargetID, l.Generation).Error
}

// count returns how many saves target has, asking db (a pool on the pair,
// or on one of its servers).
func (s saves) count(t *testing.T, db *gorm.DB, target string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Raw("SELECT count(*) FROM failover_saves WHERE target_id = ?", target).Scan(&n).Error)
	return n
}

// byTarget returns every target's saves, by generation.
func (s saves) byTarget(t *testing.T) map[string][]int64 {
	t.Helper()
	return s.byTargetOn(t, s.db)
}

// byTargetOn is byTarget, read from db (a pool on one server).
func (s saves) byTargetOn(t *testing.T, db *gorm.DB) map[string][]int64 {
	t.Helper()
	var rows []struct {
		TargetID   string
		Generation int64
	}
	require.NoError(t, db.Raw("SELECT target_id, generation FROM failover_saves ORDER BY id").Scan(&rows).Error)
	m := map[string][]int64{}
	for _, r := range rows {
		m[r.TargetID] = append(m[r.TargetID], r.Generation)
	}
	return m
}

// errDone is what the churn's work returns when it finds the target's
// result saved already: the caller runs each target until it is saved.
var errDone = errors.New("already saved")

// churn runs Runs on many targets from several goroutines, each target
// until it has its save, recording every Run's outcome; the failover happens
// while it runs.
type churn struct {
	r       *gormlease.Runner[string]
	saves   saves
	targets []string

	mu       sync.Mutex
	outcomes []churnOutcome
	runs     map[string]int // executions of the work, by target
	inFlight atomic.Int64   // Runs between acquire and return
}

type churnOutcome struct {
	target     string
	generation int64 // 0 when the work never ran
	err        error
}

// run works through c.targets on workers goroutines; each Run's work reads
// whether the target is saved (under the lease: so it sees every save that
// committed before), then takes 10 to 60 ms, as a call to an API would.
// done is closed once each worker has saved a few targets.
func (c *churn) run(ctx context.Context, t *testing.T, workers int, warm chan<- struct{}) {
	var wg sync.WaitGroup
	var warmed sync.WaitGroup
	warmed.Add(workers)
	go func() { warmed.Wait(); close(warm) }()
	for w := range workers {
		wg.Go(func() {
			saved := 0
			for i := w; i < len(c.targets); i += workers {
				c.runUntilSaved(ctx, t, c.targets[i])
				if saved++; saved == 3 {
					warmed.Done()
				}
			}
			if saved < 3 {
				warmed.Done()
			}
		})
	}
	wg.Wait()
}

// runUntilSaved runs target until a Run saves it, or finds it saved, or
// ctx ends (the test is over).
func (c *churn) runUntilSaved(ctx context.Context, t *testing.T, target string) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return
		}
		var gen int64
		_, err := c.r.Run(ctx, target, func(ctx context.Context) (string, error) {
			c.inFlight.Add(1)
			defer c.inFlight.Add(-1)
			l, _ := gormlease.LeaseFromContext(ctx)
			gen = l.Generation
			var n int64
			if err := c.saves.db.WithContext(ctx).Raw("SELECT count(*) FROM failover_saves WHERE target_id = ?",
				target).Scan(&n).Error; err != nil {
				return "", err
			}
			if n > 0 {
				return "", errDone
			}
			c.mu.Lock()
			c.runs[target]++
			c.mu.Unlock()
			select {
			case <-time.After(time.Duration(10+rand.IntN(50)) * time.Millisecond):
				return "result", nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		}, c.saves.save)
		c.mu.Lock()
		c.outcomes = append(c.outcomes, churnOutcome{target, gen, err})
		c.mu.Unlock()
		if err == nil || errors.Is(err, errDone) {
			return
		}
		// The database is away, or the lease is held until it expires
		// after a release that could not reach the database: try again.
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
	t.Errorf("%s: not saved within a minute", target)
}

// heldOnPrimary waits until every one of leases has a heartbeat on the
// database of db later than since (the database's time), under its own
// token: their heartbeats go on on the new primary.
func heldOnPrimary(t *testing.T, db *gorm.DB, leases []gormlease.Lease, since time.Time) {
	t.Helper()
	for _, l := range leases {
		waitFor(t, 10*time.Second, "a heartbeat on the new primary of "+l.TargetID, func() bool {
			var row gormlease.JobLease
			if err := db.Where("target_id = ?", l.TargetID).Take(&row).Error; err != nil {
				return false // a connection to the old primary, failing once
			}
			require.Equal(t, l.Token, row.LeaseToken, "%s: the lease on the new primary is not the Run's", l.TargetID)
			require.Nil(t, row.ReleasedAt, "%s: released on the new primary while its Run works", l.TargetID)
			return row.UpdatedAt.After(since)
		})
	}
}

// dbNow reads the database's clock, retrying while db still hands out
// connections to the old primary.
func dbNow(t *testing.T, db *gorm.DB) time.Time {
	t.Helper()
	var now time.Time
	waitFor(t, 10*time.Second, "the new primary to answer", func() bool {
		return db.Raw("SELECT clock_timestamp()").Scan(&now).Error == nil
	})
	return now
}

// TestFailover_SyncStandby fails the primary over to its synchronous
// standby while Runs work and while Runs commit, on one Runner that is
// never reopened:
//   - results saved before the failover are on the new primary;
//   - Runs whose work straddles the failover keep their leases: their
//     heartbeats renew them on the new primary, and they save once;
//   - Runs whose saver is in its transaction when the primary dies return an
//     error, save nothing, and leave the lease released on the new primary;
//   - many Runs churning through targets meanwhile: every Run that returned
//     nil has its save on the new primary, a Run that returned another error
//     than ErrCommitUnknown saved nothing, and no target has two saves;
//   - new Runs succeed soon after the failover.
func TestFailover_SyncStandby(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, true)
	db := pair.Open(t)
	sv := newSaves(t, db)
	r := newRunner(t, db, failoverOptions()...)
	ctx := context.Background()
	work := func(value string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return value, nil }
	}

	// Saved before the failover.
	before := make([]string, 8)
	for i := range before {
		before[i] = newTarget(t)
		_, err := r.Run(ctx, before[i], work("before"), sv.save)
		require.NoError(t, err)
	}

	// Straddling: work that waits until the leases have been renewed on
	// the new primary.
	const nAcross = 8
	back := make(chan struct{})
	letBack := sync.OnceFunc(func() { close(back) })
	acrossLeases := make(chan gormlease.Lease, nAcross)
	acrossDone := map[string]<-chan runResult[string]{}
	for range nAcross {
		acrossDone[newTarget(t)] = nil
	}
	for target := range acrossDone {
		acrossDone[target] = goRun(t, ctx, r, target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			acrossLeases <- l
			select {
			case <-back:
				return "across", nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		}, sv.save)
	}
	var across []gormlease.Lease
	for range nAcross {
		across = append(across, recv(t, acrossLeases, 10*time.Second, "the straddling Runs to start"))
	}

	// Committing: savers held in the fenced transaction, half before their
	// insert and half after it, when the primary dies.
	const nCommitting = 4
	inSaver, release := make(chan string, nCommitting), make(chan struct{})
	letRelease := sync.OnceFunc(func() { close(release) })
	committing := map[string]<-chan runResult[string]{}
	for i := range nCommitting {
		target := newTarget(t)
		insertFirst := i%2 == 1
		committing[target] = goRun(t, ctx, r, target, work("committing"), func(tx *gorm.DB, v string) error {
			if insertFirst {
				if err := sv.save(tx, v); err != nil {
					return err
				}
			}
			inSaver <- target
			<-release
			if insertFirst {
				return nil
			}
			return sv.save(tx, v)
		})
	}
	// When the test ends early, its held Runs are let go before their
	// goroutines are waited for (cleanups run last registered first).
	t.Cleanup(func() { letBack(); letRelease() })
	for range nCommitting {
		recv(t, inSaver, 10*time.Second, "the savers to be in their transactions")
	}

	// Churn, from before the failover to after it.
	c := &churn{r: r, saves: sv, runs: map[string]int{}}
	for range 120 {
		c.targets = append(c.targets, newTarget(t))
	}
	// The churn ends before the test does, and before the pair's servers
	// stop (cleanups run last registered first), even when the test fails
	// early: it reports to t.
	churnCtx, stopChurn := context.WithCancel(ctx)
	warm, churned := make(chan struct{}), make(chan struct{})
	go func() { defer close(churned); c.run(churnCtx, t, 6, warm) }()
	t.Cleanup(func() { stopChurn(); <-churned })
	recv(t, warm, 30*time.Second, "the churn to get going")

	churnInFlight := c.inFlight.Load()
	start := time.Now()
	pair.Failover(t)
	promoted := time.Since(start)
	since := dbNow(t, db)

	heldOnPrimary(t, db, across, since)
	letBack()
	for target, ch := range acrossDone {
		res := recv(t, ch, 20*time.Second, "the straddling Runs")
		require.NoError(t, res.Err, "%s: a Run that straddled the failover did not save", target)
		assert.EqualValues(t, 1, sv.count(t, db, target), "%s: saves", target)
	}

	// The failover ended their transactions before their COMMIT, with the
	// lease still theirs: each commits again on the new primary.
	letRelease()
	for target, ch := range committing {
		res := recv(t, ch, 30*time.Second, "the Runs whose commit the failover cut")
		require.NoError(t, res.Err, "%s: a commit cut by the failover was not committed again", target)
		assert.EqualValues(t, 1, sv.count(t, db, target), "%s: saves on the new primary", target)
		assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "%s: lease not released on the new primary", target)
	}

	// New Runs on the same Runner.
	recovered := time.Now()
	waitFor(t, 10*time.Second, "a new Run to succeed after the failover", func() bool {
		_, err := r.Run(ctx, newTarget(t), work("after"), sv.save)
		return err == nil
	})
	recovery := time.Since(recovered)

	recv(t, churned, 90*time.Second, "the churn to end")
	for _, target := range before {
		assert.EqualValues(t, 1, sv.count(t, db, target), "%s: saved before the failover, lost", target)
	}
	all := sv.byTarget(t)
	var failed, unknown int
	kinds := map[string]int{}
	for _, o := range c.outcomes {
		switch {
		case o.err == nil:
			assert.Equal(t, []int64{o.generation}, all[o.target], "%s: Run returned nil", o.target)
		case errors.Is(o.err, gormlease.ErrCommitUnknown):
			unknown++
		case errors.Is(o.err, errDone):
		default:
			failed++
			kinds[errKind(o.err)]++
			assert.NotContains(t, all[o.target], o.generation, "%s: saved, though Run returned %v", o.target, o.err)
		}
	}
	for _, target := range c.targets {
		assert.Len(t, all[target], 1, "%s: saves", target)
	}
	reruns := 0
	for _, n := range c.runs {
		reruns += n - 1
	}
	t.Logf("churn's failed Runs by kind: %v", kinds)
	t.Logf("failover: promoted in %v; %d straddling Runs and %d churning Runs in their work at the crash, "+
		"%d Runs cut in their commit; churn: %d Runs on %d targets, %d failed, %d commit unknown, %d works run again "+
		"after a failed Run; first new Run %v after the promotion; targets saved twice: 0",
		promoted, nAcross, churnInFlight, nCommitting, len(c.outcomes), len(c.targets), failed, unknown, reruns, recovery)
}

// TestFailover_SyncCommitWaitingForStandby fails over while a fenced
// commit's COMMIT waits for the synchronous standby, which has stopped
// receiving WAL: the old primary committed it locally, but the standby that
// takes over never got it. Run must not claim success for that COMMIT: it
// settles it by reading the row on the new primary, which shows nothing
// saved and the lease still the Run's, and so commits again there. Run
// returns nil only with its one save on the new primary.
func TestFailover_SyncCommitWaitingForStandby(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, true)
	db := pair.Open(t)
	sv := newSaves(t, db)
	// An operation timeout that outlasts the failover, so that the Run can
	// settle its commit on the new primary.
	r := newRunner(t, db, append(failoverOptions(), gormlease.WithOperationTimeout(4*time.Second))...)
	ctx := context.Background()
	old := pair.Primary().Open(t)

	// The standby stops receiving while the work runs: the acquire has
	// reached it, the fenced commit will not.
	target := newTarget(t)
	working, finish := make(chan struct{}), make(chan struct{})
	done := goRun(t, ctx, r, target, func(context.Context) (string, error) {
		close(working)
		<-finish
		return "lost", nil
	}, sv.save)
	recv(t, working, 10*time.Second, "the work to start")
	pair.WaitReplayed(t)
	pair.DetachStandby(t)
	close(finish)
	waitFor(t, 10*time.Second, "the COMMIT to wait for the standby", func() bool {
		var n int64
		require.NoError(t, old.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND query LIKE '%COMMIT%'`).Scan(&n).Error)
		return n > 0
	})
	pair.Failover(t)
	res := recv(t, done, 30*time.Second, "the Run whose COMMIT waited")
	require.NoError(t, res.Err, "the commit was not committed again on the new primary")
	dbNow(t, db)
	assert.EqualValues(t, 1, sv.count(t, db, target), "saves on the new primary")
	row := leaseRow(t, db, target)
	require.NotNil(t, row.SavedGeneration)
	assert.Equal(t, row.Generation, *row.SavedGeneration, "the save is not the Run's generation's")
	assert.NotNil(t, row.ReleasedAt, "lease not released")
}

// TestFailover_AsyncLosesCommittedSave shows what asynchronous replication
// allows. A Run commits on the primary after the standby stopped receiving
// its WAL, and returns nil; the primary fails over, and the save is gone
// with it. On the new primary the lease is still held by that Run (its
// acquisition had reached the standby), so the target is refused until the
// lease expires, and then the work runs a second time. What cannot happen:
// two saves on the surviving primary. A Run whose work straddles the
// failover, and whose lease had reached the standby, keeps its lease and
// saves once.
func TestFailover_AsyncLosesCommittedSave(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, false)
	db := pair.Open(t)
	sv := newSaves(t, db)
	// A long timeout: the lost target's lease must still be live on the new
	// primary when the test looks (it ages it by hand then).
	r := newRunner(t, db, append(failoverOptions(), gormlease.WithLeaseTimeout(30*time.Second))...)
	ctx := context.Background()
	old := pair.Primary().Open(t)

	var executions sync.Map // target → *atomic.Int64
	work := func(gate <-chan struct{}, started chan<- gormlease.Lease) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			n, _ := executions.LoadOrStore(l.TargetID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			if started != nil {
				started <- l
			}
			select {
			case <-gate:
				return "done", nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		}
	}
	ran := func(target string) int64 {
		n, ok := executions.Load(target)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	open := make(chan struct{})
	close(open)

	// lost: acquired while the standby still streams, saved after it
	// stopped. across: acquired then too, working through the failover.
	lost, across := newTarget(t), newTarget(t)
	lostGate, acrossGate := make(chan struct{}), make(chan struct{})
	started := make(chan gormlease.Lease, 2)
	lostDone := goRun(t, ctx, r, lost, work(lostGate, started), sv.save)
	acrossDone := goRun(t, ctx, r, across, work(acrossGate, started), sv.save)
	leases := []gormlease.Lease{recv(t, started, 10*time.Second, "the Runs to start"),
		recv(t, started, 10*time.Second, "the Runs to start")}
	pair.WaitReplayed(t)
	pair.DetachStandby(t)

	close(lostGate)
	res := recv(t, lostDone, 10*time.Second, "the Run that saves on the primary alone")
	require.NoError(t, res.Err, "the primary committed the save")
	assert.EqualValues(t, 1, sv.count(t, old, lost), "the old primary has the save")

	pair.Failover(t)
	since := dbNow(t, db)
	for _, l := range leases {
		if l.TargetID == across {
			heldOnPrimary(t, db, []gormlease.Lease{l}, since)
		}
	}
	assert.EqualValues(t, 0, sv.count(t, db, lost), "the committed save was lost with the old primary")
	row := leaseRow(t, db, lost)
	assert.Nil(t, row.ReleasedAt, "the new primary still has the lease held")

	// The target is refused until the lease expires (aged here rather than
	// waited for), and then runs a second time.
	_, err := r.Run(ctx, lost, work(open, nil), sv.save)
	require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	require.NoError(t, db.Exec("UPDATE job_lease SET updated_at = updated_at - interval '1 hour' WHERE target_id = ?", lost).Error)
	_, err = r.Run(ctx, lost, work(open, nil), sv.save)
	require.NoError(t, err)
	assert.EqualValues(t, 2, ran(lost), "the work ran a second time")
	assert.EqualValues(t, 1, sv.count(t, db, lost), "one save in the end")

	close(acrossGate)
	res = recv(t, acrossDone, 20*time.Second, "the Run across the failover")
	require.NoError(t, res.Err)
	assert.EqualValues(t, 1, ran(across))
	assert.EqualValues(t, 1, sv.count(t, db, across))
}

// TestFailover_CommitWaitsForNewPrimary: a Run whose work ends while no
// server accepts writes (the primary crashed, the standby is not promoted
// yet) commits once the standby is promoted, within the operation timeout:
// the fenced commit tries its first query again while the database cannot
// be reached. Its heartbeats go through a pool of their own, so that every
// connection the Runner's pool dials after the crash is the commit's.
func TestFailover_CommitWaitsForNewPrimary(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, true)
	beats := pair.Open(t)
	cfg, err := pgx.ParseConfig(pair.DSN())
	require.NoError(t, err)
	var dials atomic.Int64
	var dialer net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sv := newSaves(t, db)
	r := newRunner(t, db, gormlease.WithHeartbeatInterval(100*time.Millisecond),
		gormlease.WithLeaseTimeout(30*time.Second), gormlease.WithOperationTimeout(10*time.Second),
		gormlease.WithHeartbeatDB(beats))

	target := newTarget(t)
	working, finish := make(chan struct{}), make(chan struct{})
	done := goRun(t, context.Background(), r, target, func(context.Context) (string, error) {
		close(working)
		<-finish
		return "saved", nil
	}, sv.save)
	recv(t, working, 10*time.Second, "the work to start")
	pair.Crash(t)
	before := dials.Load()
	close(finish)
	var res runResult[string]
	returned := false
	waitFor(t, 10*time.Second, "the commit to try the crashed primary", func() bool {
		select {
		case res = <-done:
			returned = true
		default:
		}
		return returned || dials.Load() > before
	})
	pair.Promote(t)
	if !returned {
		res = recv(t, done, 20*time.Second, "the Run to commit on the new primary")
	}
	require.NoError(t, res.Err, "the commit gave up before the new primary came")
	assert.EqualValues(t, 1, sv.count(t, db, target))
	assert.NotNil(t, leaseRow(t, db, target).ReleasedAt)
}

// errKind names the kind of a failed Run's error, for the test's log: its
// first line, without the target.
func errKind(err error) string {
	switch {
	case errors.Is(err, gormlease.ErrLeaseHeld):
		return "held"
	case errors.Is(err, gormlease.ErrLeaseLost):
		return "lost"
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if i, j := strings.Index(msg, "\""), strings.Index(msg, "\": "); i > 0 && j > i {
		msg = msg[:i] + msg[j+1:]
	}
	return msg
}
