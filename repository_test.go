package gormlease_test

import (
	"context"
	"database/sql"
	"fmt"
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
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// statements records the SQL that gorm runs through a session, and the
// statements that were reported with an error: those that gorm's loggers
// write as errors.
type statements struct {
	logger.Interface
	mu     sync.Mutex
	sql    []string
	failed []string
}

func (s *statements) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	if err != nil {
		s.failed = append(s.failed, fmt.Sprintf("%s: %v", sql, err))
	}
	s.mu.Unlock()
}

// errors returns the statements reported with an error, with the error.
func (s *statements) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.failed...)
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

// Points 1, 3 and 7: each step is the statements the package doc
// describes, and every one that changes the row matches the token.
func TestRepository_StepsAreSingleStatements(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		rec, st := recording(db)
		repo := newRepository(t, rec)
		ctx := context.Background()
		target := newTarget(t)

		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		// On MySQL the first acquire of a target is an UPDATE that finds
		// no row, then the INSERT; elsewhere one statement.
		assert.Len(t, steps(st), firstAcquireStatements[flavour(s)], "acquire")

		require.NoError(t, repo.Heartbeat(ctx, l))
		sql := st.take()
		require.Len(t, sql, 1, "heartbeat")
		assert.Contains(t, sql[0], l.Token.String(), "heartbeat does not match the token")

		require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
			return gormlease.SaveJSON(tx, "x")
		}))
		sql = st.take()
		if s.Name == "postgres" {
			// On a pgx pool the transaction begins on a connection of its
			// own, whose COMMIT is read with its notices.
			require.NotEmpty(t, sql)
			assert.Equal(t, "BEGIN ISOLATION LEVEL READ COMMITTED", sql[0])
			sql = sql[1:]
		}
		require.Len(t, sql, 3, "commit: the locking read, the saver's statement, the save's record")
		// A locking read through the model (SQLite: the transaction's
		// write lock), then the save's record, which matches the token.
		assert.Contains(t, sql[0], "job_lease")
		assert.Contains(t, sql[0], target)
		assert.Equal(t, s.Name != "sqlite", strings.HasSuffix(sql[0], "FOR UPDATE"), "%s", sql[0])
		assert.Contains(t, sql[2], "saved_generation = generation")
		assert.Contains(t, sql[2], l.Token.String(), "the save's record does not match the token")

		require.NoError(t, repo.Release(ctx, l))
		sql = st.take()
		require.Len(t, sql, 1, "release")
		assert.Contains(t, sql[0], l.Token.String(), "release does not match the token")

		// Every later acquire of the target is one statement everywhere.
		_, err = repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.Len(t, st.take(), 1, "acquire of a released target")
	})
}

// firstAcquireStatements is how many statements each database runs for the
// first acquire of a target.
var firstAcquireStatements = map[string]int{"postgres": 1, "mariadb": 1, "mysql": 2, "sqlite": 1}

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
		target, l := acquireNew(t, repo, time.Hour)

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
// not make it fail with a serialization error (40001 on PostgreSQL; InnoDB's
// locking read sees the latest row at every level, and must keep doing so).
func TestRepository_CommitIgnoresSessionIsolation(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		for _, level := range []string{"repeatable read", "serializable"} {
			t.Run(strings.ReplaceAll(level, " ", "_"), func(t *testing.T) {
				t.Parallel()
				db := s.Open(t, s.Isolation(level))
				repo := newRepository(t, db)
				ctx := context.Background()
				target, l := acquireNew(t, repo, time.Hour)

				// A heartbeat in flight: its transaction holds the row.
				hb := db.Begin()
				require.NoError(t, hb.Error)
				defer hb.Rollback()
				require.NoError(t, hb.Model(&gormlease.JobLease{}).Where("target_id = ?", target).
					Update("updated_at", s.Ago(0)).Error)
				done := make(chan error, 1)
				go func() {
					done <- repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, "saved") })
				}()
				// The fenced commit locks the row with a locking read.
				waitLockWait(t, s, "the commit", "%job_lease%FOR UPDATE%")
				require.NoError(t, hb.Commit().Error)
				require.NoError(t, recv(t, done, 10*time.Second, "the commit"))
				got, _, err := gormlease.LoadJSON[string](ctx, db, target)
				require.NoError(t, err)
				assert.Equal(t, "saved", got)
			})
		}
	})
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

// Point 2, under contention: when many acquire one target at once, exactly
// one takes it, whether the target is new, released or expired, and none
// takes a live lease. On MySQL it runs with clientFoundRows on and off,
// which change what the server counts as affected rows.
func TestRepository_AcquireRaceNeverStealsLiveLease(t *testing.T) {
	t.Parallel()
	const racers = 50
	const timeout = time.Minute
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		variants := map[string]map[string]string{"DefaultDSN": nil}
		if s.Name == "mysql" {
			variants = map[string]map[string]string{
				"ClientFoundRows": {"clientFoundRows": "true"},
				"ChangedRows":     {"clientFoundRows": "false"},
			}
		}
		for name, params := range variants {
			t.Run(name, func(t *testing.T) {
				db := s.Open(t, params)
				warmPool(t, db, racers)
				repo := newRepository(t, db)
				ctx := context.Background()
				target := newTarget(t)

				// race has racers goroutines acquire target at once, and
				// returns the leases taken; every other acquire is refused.
				race := func(what string) []gormlease.Lease {
					t.Helper()
					start := make(chan struct{})
					type outcome struct {
						lease gormlease.Lease
						err   error
					}
					out := make(chan outcome, racers)
					for range racers {
						go func() {
							<-start
							l, err := repo.Acquire(ctx, target, timeout)
							out <- outcome{l, err}
						}()
					}
					close(start)
					var won []gormlease.Lease
					for range racers {
						o := recv(t, out, 30*time.Second, what)
						if o.err == nil {
							won = append(won, o.lease)
							continue
						}
						require.ErrorIs(t, o.err, gormlease.ErrLeaseHeld, what)
					}
					return won
				}
				// takenOnce checks that exactly one racer took the lease, at
				// the next generation, and that the row is its own.
				takenOnce := func(won []gormlease.Lease, gen int64, what string) gormlease.Lease {
					t.Helper()
					require.Equal(t, 1, len(won), "%s: leases taken", what)
					assert.Equal(t, gen, won[0].Generation, what)
					row := leaseRow(t, db, target)
					assert.Equal(t, won[0].Token, row.LeaseToken, what)
					assert.Equal(t, gen, row.Generation, what)
					assert.Nil(t, row.ReleasedAt, what)
					// The winner's lease works: a heartbeat finds its row.
					require.NoError(t, repo.Heartbeat(ctx, won[0]), what)
					return won[0]
				}

				held := takenOnce(race("new target"), 1, "new target")
				for range 3 {
					assert.Empty(t, race("live lease"), "a live lease was taken")
					assert.Equal(t, held.Token, leaseRow(t, db, target).LeaseToken, "a refused acquire changed the row")

					require.NoError(t, repo.Release(ctx, held))
					held = takenOnce(race("released"), held.Generation+1, "released")

					age(t, s, db, target, timeout+time.Second)
					held = takenOnce(race("expired"), held.Generation+1, "expired")
				}
			})
		}
	})
}

// warmPool opens n connections in db's pool and keeps them idle, so that n
// goroutines can start statements at the same moment.
func warmPool(t *testing.T, db *gorm.DB, n int) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(n)
	sqlDB.SetMaxIdleConns(n)
	conns := make([]*sql.Conn, n)
	for i := range conns {
		conns[i], err = sqlDB.Conn(context.Background())
		require.NoError(t, err)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
}

// Target IDs are compared byte for byte on every database: case and
// trailing spaces make different targets, each with its own lease.
func TestRepository_TargetIDsAreExact(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		ctx := context.Background()
		base := newTarget(t)
		for _, target := range []string{base + "-a", base + "-A", base + "-a ", base + "-á"} {
			l, err := repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err, "%q shares a lease with another target", target)
			assert.EqualValues(t, 1, l.Generation, target)
			assert.Equal(t, target, leaseRow(t, db, target).TargetID)
		}
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
		target, l := acquireNew(t, repo, time.Hour)
		row, ok, err := admin.New(repo).Get(ctx, target)
		require.NoError(t, err)
		require.True(t, ok)
		// The database runs on this machine: its clock is ours.
		assert.WithinDuration(t, time.Now(), row.UpdatedAt, 5*time.Second, "updated_at")
		assert.Nil(t, row.ReleasedAt)

		require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, 1) }))
		require.NoError(t, repo.Release(ctx, l))
		row, _, err = admin.New(repo).Get(ctx, target)
		require.NoError(t, err)
		require.NotNil(t, row.ReleasedAt, "released_at")
		assert.WithinDuration(t, time.Now(), *row.ReleasedAt, 5*time.Second, "released_at")
		assert.False(t, row.ReleasedAt.Before(row.UpdatedAt), "released before the last heartbeat")
		_, res, err := gormlease.LoadJSON[int](ctx, db, target)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), res.UpdatedAt, 5*time.Second, "job_result.updated_at")
	})
}
