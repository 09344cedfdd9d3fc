package gormlease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: the connection is lost while the fenced commit's COMMIT is in
// flight. Run settles the outcome when the database can still be asked:
// saved, it returns the result and nil, the saver having run once; rolled
// back, with the lease still its own, it commits again, and that commit
// saves (the saver runs twice). Otherwise it returns ErrCommitUnknown. In
// every case the result is saved at most once, and only together with the
// release of the lease that saved it.
func TestFault_CommitOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	cases := []struct {
		name      string
		delivered bool // COMMIT reaches the server before the cut
		cut       bool // the connection is cut, rather than left hanging
		atOnce    bool // cut at once: the COMMIT may or may not be read
		wantSaved bool // known in advance, when Run can settle it
		saves     int32
	}{
		{"DeliveredThenCut", true, true, false, true, 1},
		{"DeliveredThenCutAtOnce", true, true, true, false, 0},
		{"LostThenCut", false, true, false, true, 2},
		{"DeliveredThenHang", true, false, false, true, 1},
		{"LostThenHang", false, false, false, false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy := testdb.NewProxy(t, s.Addr)
			r, err := gormlease.NewRunner[string](s.OpenVia(t, proxy.Addr()),
				gormlease.WithOperationTimeout(time.Second))
			require.NoError(t, err)
			// The proxy trips on "commit": the target must not contain it.
			target := "cu-" + uuid.NewString()
			var saves atomic.Int32
			var tripped <-chan struct{}
			got, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
				return "result", nil
			}, func(tx *gorm.DB, v string) error {
				if saves.Add(1) > 1 {
					return gormlease.SaveJSON(tx, v) // the commit after the settled one
				}
				tripped = proxy.BlackholeOn("commit", tc.delivered)
				if tc.cut {
					go func() {
						<-tripped
						if tc.delivered && !tc.atOnce {
							// Cut only once the COMMIT took effect: a cut
							// right away may reset the connection before
							// the server reads it.
							waitCommitted(direct, target)
						}
						proxy.Cut()
						proxy.Restore()
					}()
				}
				return gormlease.SaveJSON(tx, v)
			})
			recv(t, tripped, time.Second, "the COMMIT to trip the proxy")
			if tc.saves > 0 {
				assert.EqualValues(t, tc.saves, saves.Load(), "saver calls")
			}
			switch {
			case tc.atOnce:
				// Whatever happened, Run could ask the database afterwards.
				require.NotErrorIs(t, err, gormlease.ErrCommitUnknown)
			case tc.cut:
				// Run could ask the database afterwards: the outcome is known.
				if tc.wantSaved {
					require.NoError(t, err)
					assert.Equal(t, "result", got)
				} else {
					require.Error(t, err)
					assert.NotErrorIs(t, err, gormlease.ErrCommitUnknown)
					assert.Contains(t, err.Error(), "nothing saved")
				}
			default:
				require.ErrorIs(t, err, gormlease.ErrCommitUnknown)
				assert.Contains(t, err.Error(), "outcome unknown")
				proxy.Cut()
				proxy.Restore()
			}
			// Once the dust settles, the result is saved at most once, and
			// saved exactly when the lease was released by the same commit.
			var lease gormlease.JobLease
			waitFor(t, 10*time.Second, "the fenced transaction to end", func() bool {
				lease = leaseRow(t, direct, target)
				return lease.ReleasedAt != nil || !rowLocked(t, direct, target)
			})
			saved := countRows(t, direct, &gormlease.JobResult{}, target)
			assert.LessOrEqual(t, saved, int64(1))
			switch {
			case tc.atOnce:
				assert.Equal(t, err == nil, saved == 1, "Run said %v, but saved is %d", err, saved)
			case tc.cut:
				assert.Equal(t, tc.wantSaved, saved == 1, "saved")
			}
			if saved == 1 {
				assert.NotNil(t, lease.ReleasedAt, "saved, but the lease was not released with it")
			}

			// The runner works again once the network is back.
			_, err = r.Run(context.Background(), "cu-"+uuid.NewString(), func(context.Context) (string, error) {
				return "again", nil
			}, gormlease.SaveJSON[string])
			require.NoError(t, err, "Run after the network came back")
		})
	}
}

// rowLocked reports whether target's lease row is locked by a transaction.
func rowLocked(t *testing.T, db *gorm.DB, target string) bool {
	t.Helper()
	var err error
	locked := false
	err = db.Transaction(func(tx *gorm.DB) error {
		var n int64
		e := tx.Raw("SELECT count(*) FROM (SELECT 1 FROM job_lease WHERE target_id = ? FOR UPDATE SKIP LOCKED) x",
			target).Scan(&n).Error
		locked = n == 0
		return e
	})
	require.NoError(t, err)
	return locked
}

// Fault: the only caller of a Do gives up (its ctx ends) while the job's
// COMMIT, which took effect, has had no answer yet. The job, cancelled,
// settles its commit as Run does; the call returns what it did: the result
// it saved, or ErrCommitUnknown when the database could not tell in time,
// never the caller's context error alone, which would report a save as
// not made.
func TestFault_DoGivenUpDuringItsCommitReportsTheSave(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, direct *gorm.DB) {
		proxy := testdb.NewProxy(t, s.Addr)
		r := newRunner(t, s.OpenVia(t, proxy.Addr()), gormlease.WithOperationTimeout(5*time.Second))
		// The proxy trips on "commit": the target must not contain it.
		target := "cu-" + uuid.NewString()
		tripped := make(chan (<-chan struct{}), 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		type outcome struct {
			v   string
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			v, _, err := r.Do(ctx, target, func(context.Context) (string, error) {
				return "result", nil
			}, func(tx *gorm.DB, v string) error {
				tripped <- proxy.BlackholeOn("commit", true)
				return gormlease.SaveJSON(tx, v)
			}, loadJSON(target))
			done <- outcome{v, err}
		}()
		recv(t, <-tripped, 10*time.Second, "the COMMIT to trip the proxy")
		waitCommitted(direct, target)
		cancel()
		proxy.Cut()
		proxy.Restore()

		var got outcome
		select {
		case got = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Do did not return")
		}
		if got.err != nil {
			require.ErrorIs(t, got.err, gormlease.ErrCommitUnknown, "the save reported as not made")
			return
		}
		assert.Equal(t, "result", got.v)
		assert.EqualValues(t, 1, countRows(t, direct, &gormlease.JobResult{}, target))
	})
}
