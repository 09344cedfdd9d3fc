package gormlease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: on MySQL or MariaDB, a lease step's statement is chosen as the
// victim of an InnoDB deadlock (error 1213, SQLSTATE 40001), as it is on
// Galera when a conflicting write wins certification on another node. The
// step retries, and returns what the retry finds: the lease, ErrLeaseHeld or
// ErrLeaseLost, never the driver's 1213. The retried failure is not
// reported to the logger as an error.
func TestFault_MySQLDeadlockIsRetried(t *testing.T) {
	t.Parallel()
	s := testdb.MySQL(t)
	direct := s.DB(t)
	const (
		touch = "UPDATE job_lease SET holder = 'deadlocker' WHERE target_id = ?"
		steal = "UPDATE job_lease SET lease_token = UUID(), generation = generation + 1, " +
			"updated_at = UTC_TIMESTAMP(6), released_at = NULL WHERE target_id = ?"
	)
	// The acquire's statement: MariaDB's upsert, MySQL's UPDATE.
	acquire := "LAST_INSERT_ID"
	if flavour(s) == "mariadb" {
		acquire = "ON DUPLICATE KEY UPDATE"
	}
	cases := []struct {
		name  string
		stmt  string // a part of the step's statement that no other has
		write string // the deadlocking transaction's own change of the row
		step  func(repo *gormlease.Repository, l gormlease.Lease) error
		want  error
		// once: the statement is tried once only, so the deadlock is its
		// last attempt's failure.
		once bool
	}{
		{"AcquireHeld", acquire, steal, func(repo *gormlease.Repository, l gormlease.Lease) error {
			_, err := repo.Acquire(context.Background(), l.TargetID, time.Minute)
			return err
		}, gormlease.ErrLeaseHeld, false},
		{"HeartbeatRenews", "SET updated_at", touch, heartbeat, nil, false},
		{"HeartbeatLost", "SET updated_at", steal, heartbeat, gormlease.ErrLeaseLost, false},
		{"ReleaseReleases", "SET released_at", touch, release, nil, false},
		{"ReleaseLost", "SET released_at", steal, release, gormlease.ErrLeaseLost, false},
		// After the last attempt, an acquire is refused. A heartbeat reads
		// the row as last committed, where the transaction's takeover is
		// not yet: the lease is not lost, only not renewed.
		{"AcquireHeldAfterLastAttempt", acquire, steal, func(repo *gormlease.Repository, l gormlease.Lease) error {
			_, err := repo.Acquire(context.Background(), l.TargetID, time.Minute)
			return err
		}, gormlease.ErrLeaseHeld, true},
		{"HeartbeatNotRenewedAfterLastAttempt", "SET updated_at", steal, heartbeat, errNotRenewed, true},
		// The fenced commit's locking read, before the saver runs: its
		// transaction, rolled back by the deadlock, begins again.
		{"CommitLocksAgain", "FOR UPDATE", touch, func(repo *gormlease.Repository, l gormlease.Lease) error {
			return repo.CommitIfOwner(context.Background(), l, func(*gorm.DB) error { return nil })
		}, nil, false},
		// With WithStatementAttempts(1), the commit's lock is tried once:
		// the deadlock is its error, and nothing is saved.
		{"CommitLockedOnceAfterLastAttempt", "FOR UPDATE", touch, func(repo *gormlease.Repository, l gormlease.Lease) error {
			return repo.CommitIfOwner(context.Background(), l, func(*gorm.DB) error { return nil })
		}, errDeadlock, true},
	}
	for _, tc := range cases {
		// One at a time: InnoDB refreshes its information_schema lock
		// tables only after 100ms without a read of them.
		t.Run(tc.name, func(t *testing.T) {
			rec, st := recording(direct)
			attempts := gormlease.DefaultStatementAttempts
			tries := 2 // at least: the deadlock, and the retry
			if tc.once {
				attempts, tries = 1, 1
			}
			repo, err := gormlease.NewRepository(rec, gormlease.WithStatementAttempts(attempts))
			require.NoError(t, err)
			target, l := acquireNew(t, newRepository(t, direct), time.Minute)
			if strings.HasPrefix(tc.name, "Acquire") {
				age(t, s, direct, target, time.Hour) // so that the acquire takes it over
			}
			before := leaseRow(t, direct, target)
			// The transaction runs on a pool of its own: connection IDs are
			// never reused, so a stale snapshot of the lock tables from an
			// earlier case cannot match it.
			err = deadlockStep(t, s.Open(t, nil), target, "%"+tc.stmt+"%", tc.write, tc.once, func() error { return tc.step(repo, l) })
			switch tc.want {
			case nil:
				require.NoError(t, err)
			case errDeadlock:
				require.Error(t, err)
				assert.Contains(t, err.Error(), "1213", "not the deadlock")
			case errNotRenewed:
				require.Error(t, err)
				assert.NotErrorIs(t, err, gormlease.ErrLeaseLost)
				assert.Contains(t, err.Error(), "the row still holds the lease")
			default:
				require.ErrorIs(t, err, tc.want)
			}
			if err != nil && !tc.once {
				assert.NotContains(t, err.Error(), "1213", "the deadlock reached the caller")
			}

			var ran int
			for _, sql := range st.take() {
				if strings.Contains(sql, tc.stmt) {
					ran++
				}
			}
			assert.GreaterOrEqual(t, ran, tries, "the step's statement was not retried: no deadlock?")
			assert.Empty(t, st.errors(), "a retried deadlock was logged as an error")

			row := leaseRow(t, direct, target)
			switch {
			case tc.name == "HeartbeatRenews":
				assert.True(t, row.UpdatedAt.After(before.UpdatedAt), "not renewed")
			case tc.name == "ReleaseReleases":
				assert.NotNil(t, row.ReleasedAt, "not released")
			case tc.name == "CommitLocksAgain":
				require.NotNil(t, row.SavedGeneration, "not saved")
				assert.Equal(t, l.Generation, *row.SavedGeneration, "the save's generation")
			case tc.name == "CommitLockedOnceAfterLastAttempt":
				assert.Nil(t, row.SavedGeneration, "saved after the deadlock")
			default:
				assert.NotEqual(t, l.Token, row.LeaseToken)
				assert.Nil(t, row.ReleasedAt, "the new holder's lease was released")
			}
		})
	}
}

// errNotRenewed stands for the error of a heartbeat that could not renew a
// lease that is still the caller's, and errDeadlock for the deadlock itself
// reaching the caller.
var (
	errNotRenewed = errors.New("not renewed")
	errDeadlock   = errors.New("deadlock")
)

func heartbeat(repo *gormlease.Repository, l gormlease.Lease) error {
	return repo.Heartbeat(context.Background(), l)
}

func release(repo *gormlease.Repository, l gormlease.Lease) error {
	return repo.Release(context.Background(), l)
}

// deadlockStep runs step, whose statement (matching the SQL LIKE pattern
// like) changes target's row, into an InnoDB deadlock, as a lock upgrade
// makes one: a transaction takes a shared lock on the row, step's statement
// queues for an exclusive lock, and then the transaction asks for its own
// exclusive lock, to run write, which queues behind step's. Each waits for
// the other: InnoDB rolls back the lighter, step's statement, with error
// 1213. (The transaction has written a few rows first, to be the heavier.)
// The transaction then commits write, and deadlockStep returns step's error;
// with once, step's statement is not retried, and the transaction commits
// only after step returned.
func deadlockStep(t *testing.T, db *gorm.DB, target, like, write string, once bool, step func() error) error {
	t.Helper()
	tx := db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	for range 3 {
		require.NoError(t, tx.Exec("INSERT INTO job_lease (target_id, lease_token, generation, updated_at) VALUES (?, ?, 1, UTC_TIMESTAMP(6))",
			newTarget(t), uuid.NewString()).Error)
	}
	var n int
	require.NoError(t, tx.Raw("SELECT count(*) FROM job_lease WHERE target_id = ? LOCK IN SHARE MODE", target).Scan(&n).Error)
	require.Equal(t, 1, n)
	var conn int64
	require.NoError(t, tx.Raw("SELECT CONNECTION_ID()").Scan(&conn).Error)
	done := make(chan error, 1)
	go func() { done <- step() }()
	waitBlockedBy(t, db, conn, like)
	require.NoError(t, tx.Exec(write, target).Error, "the deadlock's victim was the transaction, not the step")
	var err error
	if once {
		err = recv(t, done, 10*time.Second, "the step")
	}
	require.NoError(t, tx.Commit().Error)
	if !once {
		err = recv(t, done, 10*time.Second, "the step")
	}
	return err
}

// waitBlockedBy waits until a statement that matches the SQL LIKE pattern
// like waits for a lock held by the transaction of connection conn: MariaDB
// tells in information_schema.INNODB_LOCK_WAITS, MySQL 8 in
// performance_schema.data_lock_waits.
func waitBlockedBy(t *testing.T, db *gorm.DB, conn int64, like string) {
	t.Helper()
	const (
		mariadb = `SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS w
			JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
			JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
			WHERE b.trx_mysql_thread_id = ? AND r.trx_query LIKE ?`
		mysql8 = `SELECT count(*) FROM performance_schema.data_lock_waits w
			JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID
			JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID
			WHERE b.trx_mysql_thread_id = ? AND r.trx_query LIKE ?`
	)
	query := mariadb
	pollLockTables(t, like+" to wait on the transaction's lock", func() bool {
		var n int64
		err := db.Raw(query, conn, like).Scan(&n).Error
		if err != nil && query == mariadb {
			query = mysql8
			err = db.Raw(query, conn, like).Scan(&n).Error
		}
		require.NoError(t, err)
		return n > 0
	})
}
