package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// A caller of Do or RunWait watches the lease row only while it waits:
// while it runs the work, with nobody else waiting, no watch polls the row
// (and on PostgreSQL no listener holds a connection, no mark makes the
// release notify). Each work checks it for its own target: first a Do that
// finds the target free, then a Do that waited for an expired holder and
// took over, then a RunWait that waited for a release.
func TestDo_NoWatchWhileRunningTheWork(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.Open(t, nil) // a pool of its own: other tests' waiters listen on the shared one
		r := newRunner(t, db, fast(50*time.Millisecond, time.Second)...)
		repo := newRepository(t, db)
		checkWork := func(target string) func(context.Context) (string, error) {
			return func(ctx context.Context) (string, error) {
				assert.Zero(t, waiters(t, target).Waits, "the row is watched while the work runs")
				if s.Name == "postgres" {
					assert.False(t, listening(t, db), "a listener holds a connection while the work runs")
				}
				return "report", nil
			}
		}

		t.Run("Free", func(t *testing.T) {
			target := newTarget(t)
			_, shared, err := r.Do(context.Background(), target, checkWork(target), gormlease.SaveJSON[string], loadJSON(target))
			require.NoError(t, err)
			assert.False(t, shared)
		})

		t.Run("AfterTakingOver", func(t *testing.T) {
			target := newTarget(t)
			// Never renewed, and expired by the test once Do waits: a lease
			// that expired on its own after a second might be found expired
			// by a Do whose goroutine ran late, which would not wait.
			_, err := repo.Acquire(context.Background(), target, time.Hour)
			require.NoError(t, err)
			ch := goDo(t, context.Background(), r, target, checkWork(target))
			waitWatched(t, target) // Do waits first
			age(t, s, db, target, 2*time.Hour)
			res := recv(t, ch, 20*time.Second, "Do")
			require.NoError(t, res.err)
			assert.False(t, res.shared)
			assert.EqualValues(t, 2, leaseRow(t, db, target).Generation, "Do did not take over")
		})

		t.Run("RunWaitAfterRelease", func(t *testing.T) {
			target, held := acquireNew(t, repo, time.Hour)
			errs := make(chan error, 1)
			go func() {
				_, err := r.RunWait(context.Background(), target, checkWork(target), gormlease.SaveJSON[string])
				errs <- err
			}()
			waitWatched(t, target)
			require.NoError(t, repo.Release(context.Background(), held))
			require.NoError(t, recv(t, errs, 20*time.Second, "RunWait"))
			assert.EqualValues(t, 2, leaseRow(t, db, target).Generation)
		})
	})
}
