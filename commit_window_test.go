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
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// killOwnConnection ends, from db, the session that runs tx's statements,
// as a failover or a restart would end it.
func killOwnConnection(t *testing.T, s *testdb.Server, db, tx *gorm.DB) error {
	var id int64
	var ownID, kill string
	switch s.Name {
	case "postgres":
		ownID, kill = "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(?)"
	case "mysql":
		ownID, kill = "SELECT CONNECTION_ID()", "KILL CONNECTION ?"
	default:
		t.Fatalf("no connection to kill on %s", s.Name)
	}
	if err := tx.Raw(ownID).Scan(&id).Error; err != nil {
		return err
	}
	return db.Exec(kill, id).Error
}

// TestRun_CommitWindowCountsFromTheFailure: a fenced commit whose
// transaction the server ends before COMMIT is committed again while the
// reconnect window lasts, counted from the failure, not from the commit's
// beginning: a saver that ran longer than the window before its
// connection was killed gets a second commit, which saves once.
func TestRun_CommitWindowCountsFromTheFailure(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const window = time.Second
		r := newRunner(t, s.Open(t, nil), gormlease.WithOperationTimeout(10*time.Second),
			gormlease.WithReconnectWindow(window))
		target := newTarget(t)
		var calls atomic.Int32
		got, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			return "saved", nil
		}, func(tx *gorm.DB, v string) error {
			if calls.Add(1) > 1 {
				return gormlease.SaveJSON(tx, v)
			}
			// The saver's own running time: longer than the whole window.
			time.Sleep(window + window/2)
			if err := killOwnConnection(t, s, db, tx); err != nil {
				return err
			}
			return gormlease.SaveJSON(tx, v)
		})
		require.NoError(t, err, "the commit after the killed one")
		assert.Equal(t, "saved", got)
		assert.EqualValues(t, 2, calls.Load(), "saver calls")
		assert.EqualValues(t, 1, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
		assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
	})
}

// TestRun_SaverPastOperationTimeout: a saver that runs past the operation
// timeout finds its context done and its transaction ended, and nothing is
// saved. Run takes that for a transaction that ended before COMMIT (a
// statement cut by the timeout may have waited on a server that went
// away): it commits again, with a new operation timeout, while the
// reconnect window, counted from that failure, lasts; a saver that is
// slow once saves then. When every commit runs past, Run returns an error
// that wraps context.DeadlineExceeded and names the option to raise, after
// at most CommitAttempts saver calls, and releases the lease.
func TestRun_SaverPastOperationTimeout(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const timeout = 300 * time.Millisecond
		once := newRunner(t, db, gormlease.WithOperationTimeout(timeout)) // the window is the timeout
		always := newRunner(t, db, gormlease.WithOperationTimeout(timeout), gormlease.WithReconnectWindow(time.Minute),
			gormlease.WithLeaseTimeout(2*time.Minute)) // a window of a minute needs a lease that outlives it
		for _, tc := range []struct {
			name  string
			write bool // the saver writes after its context ended
		}{{"ThenWrites", true}, {"ThenReturns", false}} {
			// slowSaver waits until its context ends, in its first slow
			// calls, and saves in the others.
			slowSaver := func(calls *atomic.Int32, slow int32) func(tx *gorm.DB, v string) error {
				return func(tx *gorm.DB, v string) error {
					if calls.Add(1) > slow {
						return gormlease.SaveJSON(tx, v)
					}
					<-tx.Statement.Context.Done()
					if tc.write {
						return gormlease.SaveJSON(tx, v)
					}
					return nil
				}
			}
			work := func(context.Context) (string, error) { return "late", nil }

			t.Run("Once"+tc.name, func(t *testing.T) {
				target := newTarget(t)
				var calls atomic.Int32
				got, err := once.Run(context.Background(), target, work, slowSaver(&calls, 1))
				require.NoError(t, err, "the commit after the one that ran past the timeout")
				assert.Equal(t, "late", got)
				assert.EqualValues(t, 2, calls.Load(), "saver calls")
				assert.EqualValues(t, 1, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
				assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
			})
			t.Run("Always"+tc.name, func(t *testing.T) {
				target := newTarget(t)
				var calls atomic.Int32
				_, err := always.Run(context.Background(), target, work, slowSaver(&calls, 1000))
				require.Error(t, err)
				assert.ErrorIs(t, err, context.DeadlineExceeded)
				assert.False(t, errors.Is(err, gormlease.ErrCommitUnknown) || errors.Is(err, gormlease.ErrLeaseLost),
					"the saver ran past the timeout and nothing was committed: %v", err)
				assert.Contains(t, err.Error(), "WithOperationTimeout")
				assert.Contains(t, err.Error(), "nothing saved")
				assert.EqualValues(t, gormlease.CommitAttempts, calls.Load(), "saver calls")
				assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
				assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
			})
		}
	})
}

// TestCommitIfOwner_ContextEndsBeforeCommit: when the caller's context
// ends while fn runs, CommitIfOwner rolls the transaction back and says
// so: nothing saved, an error that wraps the context's cause, not
// ErrCommitUnknown, since no COMMIT was sent. The lease stays held.
func TestCommitIfOwner_ContextEndsBeforeCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		target, l := acquireNew(t, repo, time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
			<-tx.Statement.Context.Done()
			return nil
		})
		require.Error(t, err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, gormlease.ErrCommitUnknown)
		assert.Contains(t, err.Error(), "nothing saved")
		row := leaseRow(t, db, target)
		assert.Nil(t, row.SavedGeneration, "saved")
		assert.Nil(t, row.ReleasedAt, "released")
		require.NoError(t, repo.Release(context.Background(), l))
	})
}

// After a failed Run, the release is tried again while the database cannot
// be reached: held up past the operation timeout by another session's lock
// on the row (on SQLite, its write lock), it releases the lease once that
// lock is gone, within the reconnect window.
func TestRun_ReleaseAfterFailureTriedAgain(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		releases := &failedReads{Interface: logger.Discard, needle: "failure =", failed: make(chan time.Duration, 1)}
		r := newRunner(t, db.Session(&gorm.Session{Logger: releases}), gormlease.WithOperationTimeout(300*time.Millisecond),
			gormlease.WithReconnectWindow(time.Minute), gormlease.WithLeaseTimeout(2*time.Minute))
		blocker := s.Open(t, nil)
		var tx *gorm.DB
		failed := errors.New("work failed")
		done := make(chan error, 1)
		go func() {
			_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
				// Another session locks the row until the release has
				// failed once.
				tx = blocker.Begin()
				if err := tx.Exec("UPDATE job_lease SET holder = holder WHERE target_id = ?", target).Error; err != nil {
					return "", err
				}
				return "", failed
			}, gormlease.SaveJSON[string])
			done <- err
		}()
		<-releases.failed
		require.NoError(t, tx.Rollback().Error)
		err := <-done
		require.ErrorIs(t, err, failed)
		assert.NotContains(t, err.Error(), "release", "the release failed: %v", err)
		assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
	})
}
