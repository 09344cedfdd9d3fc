package gormlease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// defaultTables is a Repository on the default tables, which tells the
// waits of the whole process on a row of them, whatever pool they use.
var defaultTables struct {
	once sync.Once
	repo *gormlease.Repository
	err  error
}

// waiters returns the waits of this process on target's row of the
// default lease table, through any pool.
func waiters(t testing.TB, target string) gormlease.Waiters {
	t.Helper()
	defaultTables.once.Do(func() {
		defaultTables.repo, defaultTables.err = gormlease.NewRepository(testdb.Postgres(t).DB(t))
	})
	require.NoError(t, defaultTables.err)
	return defaultTables.repo.Waiters(target)
}

// listening reports whether this process has a notification listener for
// db's pool that listens now.
func listening(t testing.TB, db *gorm.DB) bool {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return repo.Listening()
}

// eachDB runs fn as a parallel subtest on every supported database.
func eachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	eachServer(t, testdb.All(t), fn)
}

// eachServerDB runs fn as a parallel subtest on every database server: the
// databases reached over a network, with sessions and row locks that other
// sessions can see, as opposed to SQLite's file.
func eachServerDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	var servers []*testdb.Server
	for _, s := range testdb.All(t) {
		if s.Addr != "" {
			servers = append(servers, s)
		}
	}
	eachServer(t, servers, fn)
}

func eachServer(t *testing.T, servers []*testdb.Server, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	for _, s := range servers {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, s, s.DB(t))
		})
	}
}

var targetSeq atomic.Int64

// newTarget returns a target ID no other test uses.
func newTarget(t testing.TB) string {
	return fmt.Sprintf("%s#%d-%s", t.Name(), targetSeq.Add(1), uuid.NewString()[:8])
}

// leaseRow reads the job_lease row of target.
func leaseRow(t *testing.T, db *gorm.DB, target string) gormlease.JobLease {
	t.Helper()
	var row gormlease.JobLease
	require.NoError(t, db.Where("target_id = ?", target).Take(&row).Error)
	return row
}

// countRows counts the rows of model's table for target.
func countRows(t *testing.T, db *gorm.DB, model any, target string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Model(model).Where("target_id = ?", target).Count(&n).Error)
	return n
}

// steal gives target's lease to a stranger, as a takeover by another process
// would: a new token, a new generation, a fresh heartbeat.
func steal(t *testing.T, s *testdb.Server, db *gorm.DB, target string) {
	t.Helper()
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Updates(map[string]any{
		"lease_token": uuid.New(),
		"generation":  gorm.Expr("generation + 1"),
		"updated_at":  s.Ago(0),
		"released_at": nil,
	})
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected, "steal %q", target)
}

// stolenBeforeCommit is work that steals target's lease (see steal) and
// returns a result: a takeover that no heartbeat sees before the commit,
// when the interval is longer than the work.
func stolenBeforeCommit(t *testing.T, s *testdb.Server, db *gorm.DB, target string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		steal(t, s, db, target)
		return "stale result", nil
	}
}

// age sets target's last heartbeat d back on the database's clock.
func age(t *testing.T, s *testdb.Server, db *gorm.DB, target string, d time.Duration) {
	t.Helper()
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("updated_at", s.Ago(d))
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
}

// waitLooksExpired waits until target's last heartbeat, as committed, is
// older than timeout on the database's clock.
func waitLooksExpired(t *testing.T, s *testdb.Server, db *gorm.DB, target string, timeout time.Duration) {
	t.Helper()
	waitFor(t, 10*time.Second, "the lease to look expired", func() bool {
		var n int64
		require.NoError(t, db.Model(&gormlease.JobLease{}).
			Where("target_id = ? AND updated_at < ?", target, s.Ago(timeout+50*time.Millisecond)).Count(&n).Error)
		return n == 1
	})
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitLockWait waits until a session of s waits for a row lock while
// running a statement that matches the SQL LIKE pattern like.
func waitLockWait(t *testing.T, s *testdb.Server, what, like string) {
	t.Helper()
	require.NotEmpty(t, like, "no statement pattern for %s", s.Name)
	pollLockTables(t, what+" to wait on the row lock", func() bool {
		n, err := s.LockWaits(s.DB(t), like)
		require.NoError(t, err)
		return n > 0
	})
}

// pollLockTables polls cond, which reads the database's lock tables, until
// it holds, failing t after 10s. It polls every 200ms: InnoDB refreshes the
// lock tables of information_schema only when they were last read more
// than 100ms ago, so faster polling would read the same stale snapshot for
// ever.
func pollLockTables(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// recv receives from ch, failing t after timeout.
func recv[V any](t *testing.T, ch <-chan V, timeout time.Duration, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		panic("unreachable")
	}
}

// runResult is what Run returned, sent over a channel.
type runResult[T any] struct {
	value T
	err   error
}

// goRun calls r.Run on a goroutine and sends its result. The Run ends
// before t does (see endsWithTest).
func goRun[T any](t testing.TB, ctx context.Context, r *gormlease.Runner[T], target string,
	work func(context.Context) (T, error), save func(*gorm.DB, T) error,
) <-chan runResult[T] {
	ctx, cancel := context.WithCancel(ctx)
	ch, done := make(chan runResult[T], 1), make(chan struct{})
	go func() {
		defer close(done)
		v, err := r.Run(ctx, target, work, save)
		ch <- runResult[T]{v, err}
	}()
	endsWithTest(t, "Run "+target, cancel, done)
	return ch
}

// endsWithTest has the goroutine that closes done end before t does,
// however t ends: t's cleanup cancels the goroutine's context (cancel) and
// waits for done, so that nothing the goroutine reports to t comes after
// t has ended, and nothing it does outlives the servers that t's earlier
// cleanups stop. A goroutine that waits on something other than its
// context must be let go by the test before; one still running 30 s
// later fails t, and is left behind.
func endsWithTest(t testing.TB, what string, cancel context.CancelFunc, done <-chan struct{}) {
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("%s still running 30s after the test ended", what)
		}
	})
}

// newRunner makes a Runner[string] on db, failing t on error.
func newRunner(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Runner[string] {
	t.Helper()
	r, err := gormlease.NewRunner[string](db, opts...)
	require.NoError(t, err)
	return r
}

// fast are options for tests that watch heartbeats and expiry.
func fast(interval, timeout time.Duration) []gormlease.Option {
	return []gormlease.Option{
		gormlease.WithHeartbeatInterval(interval),
		gormlease.WithLeaseTimeout(timeout),
		gormlease.WithOperationTimeout(2 * time.Second),
	}
}

// noSave is a saver that fails the test if it is ever called.
func noSave(t *testing.T) func(*gorm.DB, string) error {
	return func(*gorm.DB, string) error {
		t.Errorf("saver called, but nothing may be saved")
		return nil
	}
}

// acquireNew acquires, on repo, a lease on a target no other test uses,
// failing t on error.
func acquireNew(t testing.TB, repo *gormlease.Repository, timeout time.Duration) (string, gormlease.Lease) {
	t.Helper()
	target := newTarget(t)
	l, err := repo.Acquire(context.Background(), target, timeout)
	require.NoError(t, err)
	return target, l
}

// clockOf reads the clock of s, the one that judges a lease's expiry, in
// the time zone and precision in which s keeps the lease rows' times.
func clockOf(t *testing.T, s *testdb.Server, db *gorm.DB) time.Time {
	t.Helper()
	var q string
	switch s.Name {
	case "postgres":
		q = "SELECT clock_timestamp()"
	case "mysql":
		q = "SELECT UTC_TIMESTAMP(6)"
	default:
		var text string
		require.NoError(t, db.Raw("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").Scan(&text).Error)
		now, err := time.Parse("2006-01-02 15:04:05.000", text)
		require.NoError(t, err)
		return now
	}
	var now time.Time
	require.NoError(t, db.Raw(q).Scan(&now).Error)
	return now
}
