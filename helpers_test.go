package gormlease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// defaultTables is an Operator on the default tables, which tells the
// waits of the whole process on a row of them, whatever pool they use.
var defaultTables struct {
	once sync.Once
	op   *admin.Operator
	err  error
}

// waiters returns the waits of this process on target's row of the
// default lease table, through any pool.
func waiters(t testing.TB, target string) admin.WaitStats {
	t.Helper()
	defaultTables.once.Do(func() {
		var repo *gormlease.Repository
		repo, defaultTables.err = gormlease.NewRepository(testdb.Postgres(t).DB(t))
		defaultTables.op = admin.New(repo)
	})
	require.NoError(t, defaultTables.err)
	return defaultTables.op.Waiters(target)
}

// listening reports whether this process has a notification listener for
// db's pool that listens now.
func listening(t testing.TB, db *gorm.DB) bool {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return admin.New(repo).Listening()
}

// The helpers that these tests share with those of package admin and of
// the tests module (see internal/testkit).
var (
	eachDB        = testkit.EachDB
	eachServerDB  = testkit.EachServerDB
	newTarget     = testkit.NewTarget
	newRunner     = testkit.NewRunner
	newRepository = testkit.NewRepository
	newElector    = testkit.NewElector
	fast          = testkit.Fast
	noSave        = testkit.NoSave
	acquireNew    = testkit.AcquireNew
	holdSlots     = testkit.HoldSlots
	slotKey       = testkit.SlotKey
	slotSnapshot  = testkit.SlotSnapshot
	leaseRow      = testkit.LeaseRow
	countRows     = testkit.CountRows
	age           = testkit.Age
	waitFor       = testkit.WaitFor
	waitCommitted = testkit.WaitCommitted
	pollRow       = testkit.PollRow
	goLead        = testkit.GoLead
	endsWithTest  = testkit.EndsWithTest
)

// targetSeq numbers the names that tests make of their own.
var targetSeq atomic.Int64

// recv receives from ch, failing t after timeout.
func recv[V any](t *testing.T, ch <-chan V, timeout time.Duration, what string) V {
	t.Helper()
	return testkit.Recv(t, ch, timeout, what)
}

// runResult is what Run returned, sent over a channel.
type runResult[T any] = testkit.RunResult[T]

// goRun calls r.Run on a goroutine and sends its result. The Run ends
// before t does (see endsWithTest).
func goRun[T any](t testing.TB, ctx context.Context, r *gormlease.Runner[T], target string,
	work func(context.Context) (T, error), save func(*gorm.DB, T) error,
) <-chan runResult[T] {
	return testkit.GoRun(t, ctx, r, target, work, save)
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
