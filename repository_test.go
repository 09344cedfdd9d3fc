package gormlease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// statements records the SQL that gorm runs through a session.
type statements struct {
	logger.Interface
	mu  sync.Mutex
	sql []string
}

func (s *statements) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	s.mu.Unlock()
}

// take returns the statements recorded since the last take.
func (s *statements) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sql
	s.sql = nil
	return out
}

// recording returns a session on db that records its statements.
func recording(db *gorm.DB) (*gorm.DB, *statements) {
	st := &statements{Interface: logger.Discard}
	return db.Session(&gorm.Session{Logger: st}), st
}

func newRepository(t *testing.T, db *gorm.DB) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return repo
}

// Points 1, 3 and 7: each step is the statements the seed describes, and
// every one that changes the row matches the token.
func TestRepository_StepsAreSingleStatements(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		rec, st := recording(db)
		repo := newRepository(t, rec)
		ctx := context.Background()
		target := newTarget(t)

		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.Len(t, st.take(), 1, "acquire")

		require.NoError(t, repo.Heartbeat(ctx, l))
		sql := st.take()
		require.Len(t, sql, 1, "heartbeat")
		assert.Contains(t, sql[0], l.Token.String(), "heartbeat does not match the token")

		require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
			return gormlease.SaveJSON(tx, "x")
		}))
		sql = st.take()
		require.Len(t, sql, 2, "commit: the locking read and the saver's statement")
		if s.Name != "sqlite" { // SQLite locks the whole database instead, with BEGIN IMMEDIATE
			assert.Contains(t, strings.ToUpper(sql[0]), "FOR UPDATE")
		}

		require.NoError(t, repo.Release(ctx, l))
		sql = st.take()
		require.Len(t, sql, 1, "release")
		assert.Contains(t, sql[0], l.Token.String(), "release does not match the token")
	})
}

// Point 2: a lease is taken over only when its last heartbeat is older than
// the timeout on the database's clock; a fresher one never is.
func TestRepository_TakeoverOnlyAfterTimeout(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		ctx := context.Background()
		target := newTarget(t)
		const timeout = time.Minute

		first, err := repo.Acquire(ctx, target, timeout)
		require.NoError(t, err)
		age(t, s, db, target, timeout-5*time.Second)
		_, err = repo.Acquire(ctx, target, timeout)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "a lease younger than the timeout was taken")
		assert.Equal(t, first.Token, leaseRow(t, db, target).LeaseToken, "a refused acquire changed the row")

		age(t, s, db, target, timeout+5*time.Second)
		second, err := repo.Acquire(ctx, target, timeout)
		require.NoError(t, err, "a lease older than the timeout was not taken over")
		assert.NotEqual(t, first.Token, second.Token, "the token was not minted afresh")
		assert.Equal(t, first.Generation+1, second.Generation)

		// The old holder can change nothing any more.
		assert.ErrorIs(t, repo.Heartbeat(ctx, first), gormlease.ErrLeaseLost)
		assert.ErrorIs(t, repo.Release(ctx, first), gormlease.ErrLeaseLost)
		called := false
		err = repo.CommitIfOwner(ctx, first, func(*gorm.DB) error { called = true; return nil })
		assert.ErrorIs(t, err, gormlease.ErrLeaseLost)
		assert.False(t, called, "the old holder's saver ran")
		row := leaseRow(t, db, target)
		assert.Equal(t, second.Token, row.LeaseToken)
		assert.Nil(t, row.ReleasedAt, "the old holder released the new holder's lease")
	})
}

// Point 7: release touches only the caller's own lease and makes the target
// acquirable at once.
func TestRepository_ReleaseOnlyOwnLease(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		ctx := context.Background()
		target := newTarget(t)
		l, err := repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)

		forged := l
		forged.Token = uuid.New()
		assert.ErrorIs(t, repo.Release(ctx, forged), gormlease.ErrLeaseLost)
		assert.Nil(t, leaseRow(t, db, target).ReleasedAt, "a release with another token released the lease")

		require.NoError(t, repo.Release(ctx, l))
		assert.ErrorIs(t, repo.Release(ctx, l), gormlease.ErrLeaseLost, "second release")
		assert.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost, "heartbeat after release")
		next, err := repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err, "a released target was not acquirable at once")
		assert.Equal(t, l.Generation+1, next.Generation)
	})
}

// Point 6: the fenced commit runs at READ COMMITTED whatever the session
// default, so a heartbeat that commits while it waits for the row lock does
// not make it fail with a serialization error (40001).
func TestRepository_CommitIgnoresSessionIsolation(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(level, " ", "_"), func(t *testing.T) {
			t.Parallel()
			db := s.Open(t, map[string]string{"default_transaction_isolation": level})
			repo := newRepository(t, db)
			ctx := context.Background()
			target := newTarget(t)
			l, err := repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)

			// A heartbeat in flight: its transaction holds the row.
			hb := db.Begin()
			require.NoError(t, hb.Error)
			require.NoError(t, hb.Exec("UPDATE job_lease SET updated_at = clock_timestamp() WHERE target_id = ?", target).Error)
			done := make(chan error, 1)
			go func() {
				done <- repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, "saved") })
			}()
			waitFor(t, 10*time.Second, "the commit to wait on the row lock", func() bool {
				var n int64
				s.DB(t).Raw(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
					AND query LIKE '%job_lease%FOR UPDATE%'`).Scan(&n)
				return n > 0
			})
			require.NoError(t, hb.Commit().Error)
			require.NoError(t, recv(t, done, 10*time.Second, "the commit"))
			got, _, err := gormlease.LoadJSON[string](ctx, db, target)
			require.NoError(t, err)
			assert.Equal(t, "saved", got)
		})
	}
}

// Point 10: bad input to the Repository is refused, naming the problem.
func TestRepository_BadInput(t *testing.T) {
	t.Parallel()
	_, err := gormlease.NewRepository(nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "db is nil")

	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		// Rolled back at once: on SQLite an open transaction holds the
		// database's write lock.
		tx := db.Begin()
		_, err := gormlease.NewRepository(tx)
		require.NoError(t, tx.Rollback().Error)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "inside a transaction")

		repo := newRepository(t, db)
		ctx := context.Background()
		target := newTarget(t)
		_, err = repo.Acquire(ctx, target, 0)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "lease timeout must be > 0")
		assert.Zero(t, countRows(t, db, &gormlease.JobLease{}, target))

		nilToken := gormlease.Lease{TargetID: target}
		for name, err := range map[string]error{
			"Heartbeat": repo.Heartbeat(ctx, nilToken),
			"Release":   repo.Release(ctx, nilToken),
			"Commit":    repo.CommitIfOwner(ctx, nilToken, func(*gorm.DB) error { return nil }),
		} {
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument, name)
			assert.ErrorContains(t, err, "nil token", name)
		}
		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.ErrorContains(t, repo.CommitIfOwner(ctx, l, nil), "commit function is nil")
		assert.ErrorContains(t, gormlease.SaveJSON(db, "x"), "no lease in the transaction's context")
	})
}

// Timestamps are written by the database's clock and scan back into
// time.Time as the right instants, on every database (SQLite stores them as
// text).
func TestRepository_TimestampsScanAsTime(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		ctx := context.Background()
		target := newTarget(t)
		l, err := repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		row, ok, err := repo.Get(ctx, target)
		require.NoError(t, err)
		require.True(t, ok)
		// The database runs on this machine: its clock is ours.
		assert.WithinDuration(t, time.Now(), row.UpdatedAt, 5*time.Second, "updated_at")
		assert.Nil(t, row.ReleasedAt)

		require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, 1) }))
		require.NoError(t, repo.Release(ctx, l))
		row, _, err = repo.Get(ctx, target)
		require.NoError(t, err)
		require.NotNil(t, row.ReleasedAt, "released_at")
		assert.WithinDuration(t, time.Now(), *row.ReleasedAt, 5*time.Second, "released_at")
		assert.False(t, row.ReleasedAt.Before(row.UpdatedAt), "released before the last heartbeat")
		_, res, err := gormlease.LoadJSON[int](ctx, db, target)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), res.UpdatedAt, 5*time.Second, "job_result.updated_at")
	})
}
