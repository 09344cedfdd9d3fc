package gormlease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: a session default of REPEATABLE READ or SERIALIZABLE (as
// CockroachDB and some applications set). Concurrent acquires of a released
// or expired target must each end in the lease or in ErrLeaseHeld, never in a
// serialization failure, and the whole Run must work as at READ COMMITTED.
func TestFault_StrictSessionIsolation(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db := s.Open(t, map[string]string{"default_transaction_isolation": level})
			var got string
			require.NoError(t, db.Raw("SHOW default_transaction_isolation").Scan(&got).Error)
			require.Equal(t, level, got, "the session default did not take")
			r, err := gormlease.NewRunner[int](db)
			require.NoError(t, err)
			target := newTarget(t)
			rounds, n := soakOr(10, 200), 8
			for round := range rounds {
				if round%2 == 1 {
					age(t, s, s.DB(t), target, time.Hour) // expired rather than released
				}
				var wins, saves atomic.Int32
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make(chan error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						_, err := r.Run(context.Background(), target, func(ctx context.Context) (int, error) {
							wins.Add(1)
							return i, nil
						}, func(tx *gorm.DB, v int) error {
							saves.Add(1)
							return gormlease.SaveJSON(tx, v)
						})
						if err != nil && !errors.Is(err, gormlease.ErrLeaseHeld) {
							errs <- err
						}
					}()
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Errorf("round %d: spurious failure: %v", round, err)
				}
				assert.GreaterOrEqual(t, wins.Load(), int32(1), "round %d: no Run won", round)
				assert.Equal(t, wins.Load(), saves.Load(), "round %d: every winner saves", round)
			}
		})
	}
}

// Fault: under a strict session default, a heartbeat or release whose
// snapshot predates a takeover fails with 40001 at first; retried, it
// reports ErrLeaseLost, and the new holder's lease is untouched. When that
// was its last attempt, it reads the row, finds the takeover, and reports
// ErrLeaseLost all the same. The failure is not logged as an error.
func TestFault_StrictIsolationHeartbeatAfterTakeover(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		for _, step := range []string{"Heartbeat", "Release", "Heartbeat/LastAttempt", "Release/LastAttempt"} {
			t.Run(level+"/"+step, func(t *testing.T) {
				t.Parallel()
				app := appName(t)
				db, st := recording(s.Open(t, map[string]string{"default_transaction_isolation": level, "application_name": app}))
				repo := newRepository(t, db)
				target := newTarget(t)
				// The acquire keeps its retries: under serializable, the
				// parallel subtests' acquires conflict now and then.
				l, err := repo.Acquire(context.Background(), target, time.Hour)
				require.NoError(t, err)
				if strings.HasSuffix(step, "/LastAttempt") {
					repo, err = gormlease.NewRepository(db, gormlease.WithStatementAttempts(1))
					require.NoError(t, err)
				}

				// A takeover that holds the row until the step waits on it.
				tx := direct.Begin()
				require.NoError(t, tx.Error)
				defer tx.Rollback()
				steal(t, s, tx, target)
				done := make(chan error, 1)
				go func() {
					if strings.HasPrefix(step, "Heartbeat") {
						done <- repo.Heartbeat(context.Background(), l)
					} else {
						done <- repo.Release(context.Background(), l)
					}
				}()
				waitBackendLockWait(t, direct, app)
				require.NoError(t, tx.Commit().Error)
				err = recv(t, done, 10*time.Second, step)
				require.ErrorIs(t, err, gormlease.ErrLeaseLost)
				assert.Empty(t, st.errors(), "an expected serialization failure was logged as an error")
				row := leaseRow(t, direct, target)
				assert.NotEqual(t, l.Token, row.LeaseToken)
				assert.Nil(t, row.ReleasedAt, "the old holder released the new holder's lease")
			})
		}
	}
}
