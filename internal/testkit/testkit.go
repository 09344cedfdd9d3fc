// Package testkit holds the test helpers that the tests of package
// gormlease, of package admin and of the tests module share: subtests on
// every database, target IDs of a test's own, Runners, Repositories and
// Electors that fail the test on error, goroutines that end with the test,
// and reads and writes of lease rows that stand for other processes. Each
// helper fails the test, saying what it was doing, rather than returning
// an error. It also opens the database of the runnable examples
// (ExampleDB), those of the root module and of the modules gocron and
// recipes alike, which have no test to fail.
package testkit

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// EachDB runs fn as a parallel subtest on every supported database.
func EachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	EachServer(t, testdb.All(t), fn)
}

// EachServer runs fn as a parallel subtest on each of servers, named
// after it.
func EachServer(t *testing.T, servers []*testdb.Server, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	for _, s := range servers {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, s, s.DB(t))
		})
	}
}

// EachServerDB runs fn as a parallel subtest on every database server: the
// databases reached over a network, with sessions and row locks that other
// sessions can see, as opposed to SQLite's file.
func EachServerDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	var servers []*testdb.Server
	for _, s := range testdb.All(t) {
		if s.Addr != "" {
			servers = append(servers, s)
		}
	}
	EachServer(t, servers, fn)
}

var targetSeq atomic.Int64

// NewTarget returns a target ID no other test uses.
func NewTarget(t testing.TB) string {
	return fmt.Sprintf("%s#%d-%s", t.Name(), targetSeq.Add(1), uuid.NewString()[:8])
}

// NewRunner makes a Runner[string] on db, failing t on error.
func NewRunner(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Runner[string] {
	t.Helper()
	r, err := gormlease.NewRunner[string](db, opts...)
	require.NoError(t, err)
	return r
}

// NewRepository makes a Repository on db, failing t on error.
func NewRepository(t *testing.T, db *gorm.DB) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return repo
}

// NewElector makes an Elector for role on db, with Fast(200ms, 2s) and
// opts, failing t on error.
func NewElector(t *testing.T, db *gorm.DB, role string, opts ...gormlease.Option) *gormlease.Elector {
	t.Helper()
	e, err := gormlease.NewElector(db, role, append(Fast(200*time.Millisecond, 2*time.Second), opts...)...)
	require.NoError(t, err)
	return e
}

// Fast are options for tests that watch heartbeats and expiry.
func Fast(interval, timeout time.Duration) []gormlease.Option {
	return []gormlease.Option{
		gormlease.WithHeartbeatInterval(interval),
		gormlease.WithLeaseTimeout(timeout),
		gormlease.WithOperationTimeout(2 * time.Second),
	}
}

// NoSave is a saver that fails the test if it is ever called.
func NoSave(t *testing.T) func(*gorm.DB, string) error {
	return func(*gorm.DB, string) error {
		t.Errorf("saver called, but nothing may be saved")
		return nil
	}
}

// AcquireNew acquires, on repo, a lease on a target no other test uses,
// failing t on error.
func AcquireNew(t testing.TB, repo *gormlease.Repository, timeout time.Duration) (string, gormlease.Lease) {
	t.Helper()
	target := NewTarget(t)
	l, err := repo.Acquire(context.Background(), target, timeout)
	require.NoError(t, err)
	return target, l
}

// HoldSlots takes k of target's n slots with repo, which sends no
// heartbeats: the holders are frozen, and their slots expire after timeout.
func HoldSlots(t *testing.T, repo *gormlease.Repository, target string, n, k int, timeout time.Duration) []gormlease.Lease {
	t.Helper()
	leases := make([]gormlease.Lease, k)
	for i := range leases {
		l, err := repo.AcquireSlot(context.Background(), target, n, timeout)
		require.NoError(t, err)
		leases[i] = l
	}
	return leases
}

// SlotKey is the key of slot's row of target, as the backend writes it.
func SlotKey(target string, slot int) string { return fmt.Sprintf("%s\x1f%d", target, slot) }

// SlotSnapshot reads every column of target's slot rows 1..n, and on
// PostgreSQL each row version's xmin and xmax: equal snapshots mean that
// nothing wrote (or locked) the rows in between.
func SlotSnapshot(t *testing.T, s *testdb.Server, db *gorm.DB, target string, n int) []map[string]any {
	t.Helper()
	cols := "*"
	if s.Name == "postgres" {
		cols = "*, CAST(xmin AS text) AS row_xmin, CAST(xmax AS text) AS row_xmax"
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = SlotKey(target, i+1)
	}
	var rows []map[string]any
	require.NoError(t, db.Table("job_lease").Select(cols).Where("target_id IN ?", keys).Order("target_id").Find(&rows).Error)
	require.Len(t, rows, n, "slot rows of %q", target)
	return rows
}

// LeaseRow reads the job_lease row of target.
func LeaseRow(t *testing.T, db *gorm.DB, target string) gormlease.JobLease {
	t.Helper()
	var row gormlease.JobLease
	require.NoError(t, db.Where("target_id = ?", target).Take(&row).Error)
	return row
}

// CountRows counts the rows of model's table for target.
func CountRows(t *testing.T, db *gorm.DB, model any, target string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Model(model).Where("target_id = ?", target).Count(&n).Error)
	return n
}

// Age sets target's last heartbeat d back on the database's clock.
func Age(t *testing.T, s *testdb.Server, db *gorm.DB, target string, d time.Duration) {
	t.Helper()
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("updated_at", s.Ago(d))
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
}

// WaitFor polls cond until it holds, failing t after timeout.
func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitCommitted polls, for up to 5 s, until target's lease row shows the
// fenced commit's release. It runs off the test goroutine, so it cannot fail
// the test; the test's own checks catch a commit that never took effect.
func WaitCommitted(db *gorm.DB, target string) {
	PollRow(db, target, "released_at IS NOT NULL")
}

// PollRow polls, for up to 5 s, until target's lease row meets cond, an
// SQL condition (see WaitCommitted).
func PollRow(db *gorm.DB, target, cond string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		var n int64
		db.Model(&gormlease.JobLease{}).Where("target_id = ? AND "+cond, target).Count(&n)
		if n == 1 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Recv receives from ch, failing t after timeout.
func Recv[V any](t *testing.T, ch <-chan V, timeout time.Duration, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		panic("unreachable")
	}
}

// RunResult is what Run returned, sent over a channel.
type RunResult[T any] struct {
	Value T
	Err   error
}

// GoRun calls r.Run on a goroutine and sends its result. The Run ends
// before t does (see EndsWithTest).
func GoRun[T any](t testing.TB, ctx context.Context, r *gormlease.Runner[T], target string,
	work func(context.Context) (T, error), save func(*gorm.DB, T) error,
) <-chan RunResult[T] {
	ctx, cancel := context.WithCancel(ctx)
	ch, done := make(chan RunResult[T], 1), make(chan struct{})
	go func() {
		defer close(done)
		v, err := r.Run(ctx, target, work, save)
		ch <- RunResult[T]{Value: v, Err: err}
	}()
	EndsWithTest(t, "Run "+target, cancel, done)
	return ch
}

// GoLead calls e.Lead on a goroutine with lead, and sends what it returned.
// The Lead ends before t does (see EndsWithTest).
func GoLead(t testing.TB, ctx context.Context, e *gormlease.Elector, lead func(context.Context) error) <-chan error {
	ctx, cancel := context.WithCancel(ctx)
	ch, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		ch <- e.Lead(ctx, lead)
	}()
	EndsWithTest(t, "Lead", cancel, done)
	return ch
}

// EndsWithTest has the goroutine that closes done end before t does,
// however t ends: t's cleanup cancels the goroutine's context (cancel) and
// waits for done, so that nothing the goroutine reports to t comes after
// t has ended, and nothing it does outlives the servers that t's earlier
// cleanups stop. A goroutine that waits on something other than its
// context must be let go by the test before; one still running 30 s
// later fails t, and is left behind.
func EndsWithTest(t testing.TB, what string, cancel context.CancelFunc, done <-chan struct{}) {
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("%s still running 30s after the test ended", what)
		}
	})
}
