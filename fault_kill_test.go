package gormlease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// killFixture is a Runner on a pool of its own, whose backends are found by
// their application_name and killed with pg_terminate_backend.
type killFixture struct {
	s      *testdb.Server
	direct *gorm.DB // the shared pool, never killed
	app    string
	r      *gormlease.Runner[string]
	target string
}

func newKillFixture(t *testing.T) *killFixture {
	s := testdb.Postgres(t)
	app := appName(t)
	db := s.Open(t, map[string]string{"application_name": app})
	return &killFixture{
		s: s, direct: s.DB(t), app: app, target: newTarget(t),
		r: newRunner(t, db, fast(50*time.Millisecond, 5*time.Second)...),
	}
}

// heartbeatAfter waits until the lease row shows a heartbeat later than since.
func (f *killFixture) heartbeatAfter(t *testing.T, since time.Time) {
	waitFor(t, 10*time.Second, "a heartbeat after the kill", func() bool {
		return leaseRow(t, f.direct, f.target).UpdatedAt.After(since)
	})
}

// runAndCheck runs work that calls fault and then returns "done", and checks
// that the Run saved its result once, under its own generation.
func (f *killFixture) runAndCheck(t *testing.T, fault func()) {
	var gen int64
	_, err := f.r.Run(context.Background(), f.target, func(ctx context.Context) (string, error) {
		l, _ := gormlease.LeaseFromContext(ctx)
		gen = l.Generation
		fault()
		return "done", ctx.Err()
	}, gormlease.SaveJSON[string])
	require.NoError(t, err)
	f.checkSavedOnce(t, gen)
}

// checkSavedOnce checks that the target's result is saved once, by the
// given generation, and that the lease is released.
func (f *killFixture) checkSavedOnce(t *testing.T, generation int64) {
	got, row, err := gormlease.LoadJSON[string](context.Background(), f.direct, f.target)
	require.NoError(t, err)
	assert.Equal(t, "done", got)
	assert.Equal(t, generation, row.Generation)
	assert.NotNil(t, leaseRow(t, f.direct, f.target).ReleasedAt, "lease not released")
}

// Fault: the backend running a heartbeat is killed mid-statement. The next
// heartbeat, on a new connection, renews the lease; the work finishes and
// saves once.
func TestFault_KilledDuringHeartbeat(t *testing.T) {
	t.Parallel()
	f := newKillFixture(t)
	f.runAndCheck(t, func() {
		// Hold the row so that the next heartbeat waits on it, then kill it.
		tx := f.direct.Begin()
		require.NoError(t, tx.Error)
		defer tx.Rollback()
		require.NoError(t, tx.Exec("SELECT 1 FROM job_lease WHERE target_id = ? FOR UPDATE", f.target).Error)
		pid := waitBackendLockWait(t, f.direct, f.app)
		terminate(t, f.direct, pid)
		killed := leaseRow(t, tx, f.target).UpdatedAt
		require.NoError(t, tx.Rollback().Error)
		f.heartbeatAfter(t, killed)
	})
}

// Fault: every connection of the runner's pool is killed while the work
// runs (none is in use then). Heartbeats reconnect; the work saves once.
func TestFault_KilledDuringWork(t *testing.T) {
	t.Parallel()
	f := newKillFixture(t)
	f.runAndCheck(t, func() {
		waitFor(t, 5*time.Second, "a pooled backend", func() bool {
			return len(backends(t, f.direct, f.app, "")) > 0
		})
		for _, pid := range backends(t, f.direct, f.app, "") {
			terminate(t, f.direct, pid)
		}
		f.heartbeatAfter(t, leaseRow(t, f.direct, f.target).UpdatedAt)
	})
}

// TestFault_KilledInsideFencedCommit kills the fenced transaction's own
// backend after the saver wrote, before COMMIT: the transaction is rolled
// back, and the lease is still the Run's, so Run commits again, saver
// included, and that commit saves once. When every commit is killed so, Run
// gives up after a few, says nothing was saved, and releases the lease.
func TestFault_KilledInsideFencedCommit(t *testing.T) {
	t.Parallel()
	f := newKillFixture(t)
	// killingSaver saves, then has the transaction's backend killed while
	// calls, counted in saves, are at most kill.
	killingSaver := func(saves *atomic.Int32, kill int32) func(tx *gorm.DB, v string) error {
		return func(tx *gorm.DB, v string) error {
			n := saves.Add(1)
			if err := gormlease.SaveJSON(tx, v); err != nil {
				return err
			}
			if n > kill {
				return nil
			}
			var pid int64
			if err := tx.Raw("SELECT pg_backend_pid()").Scan(&pid).Error; err != nil {
				return err
			}
			terminate(t, f.direct, pid)
			return nil
		}
	}
	work := func(context.Context) (string, error) { return "saved", nil }

	once := f.target + "-once"
	var saves atomic.Int32
	_, err := f.r.Run(context.Background(), once, work, killingSaver(&saves, 1))
	require.NoError(t, err, "the commit after the killed one")
	assert.EqualValues(t, 2, saves.Load(), "saver calls")
	assert.EqualValues(t, 1, countRows(t, f.direct, &gormlease.JobResult{}, once), "results saved")
	assert.NotNil(t, leaseRow(t, f.direct, once).ReleasedAt, "lease not released")

	always := f.target + "-always"
	saves.Store(0)
	_, err = f.r.Run(context.Background(), always, work, killingSaver(&saves, 1000))
	require.Error(t, err)
	assert.False(t, errors.Is(err, gormlease.ErrLeaseLost) || errors.Is(err, gormlease.ErrCommitUnknown),
		"a kill before COMMIT is a plain rollback: %v", err)
	assert.EqualValues(t, gormlease.CommitAttempts, saves.Load(), "saver calls")
	assert.Zero(t, countRows(t, f.direct, &gormlease.JobResult{}, always), "a killed transaction saved")
	assert.NotNil(t, leaseRow(t, f.direct, always).ReleasedAt, "lease not released after the rollback")

	f.runAndCheck(t, func() {})
}
