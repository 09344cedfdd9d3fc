package tests

import (
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

// The helpers below are copies of those that the tests of this module use:
// most of internal/testkit (eachDB, eachServer, newTarget, leaseRow, recv,
// newRunner, newRepository, noSave), which this module could import too, and
// of the root module's test files (eachServerDB and countRows in
// helpers_test.go, waitCommitted in fault_commit_test.go), which it cannot.

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

// newRunner makes a Runner[string] on db, failing t on error.
func newRunner(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Runner[string] {
	t.Helper()
	r, err := gormlease.NewRunner[string](db, opts...)
	require.NoError(t, err)
	return r
}

// newRepository makes a Repository on db, failing t on error.
func newRepository(t *testing.T, db *gorm.DB) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return repo
}

// noSave is a saver that fails the test if it is ever called.
func noSave(t *testing.T) func(*gorm.DB, string) error {
	return func(*gorm.DB, string) error {
		t.Errorf("saver called, but nothing may be saved")
		return nil
	}
}

// waitCommitted polls, for up to 5 s, until target's lease row shows the
// fenced commit's release. It runs off the test goroutine, so it cannot fail
// the test; the test's own checks catch a commit that never took effect.
func waitCommitted(db *gorm.DB, target string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		var n int64
		db.Model(&gormlease.JobLease{}).Where("target_id = ? AND released_at IS NOT NULL", target).Count(&n)
		if n == 1 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
