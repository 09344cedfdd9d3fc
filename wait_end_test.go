package gormlease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// These tests count the process's goroutines and watches, so they do not
// run in parallel with other tests (which run after them), and they visit
// the databases one after another.

// eachDBAlone runs fn as a subtest on every database, one after another,
// on a pool of its own; the goroutines that exist before it are ignored by
// checkNothingLeft.
func eachDBAlone(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB, before goleak.Option)) {
	t.Helper()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			db := s.Open(t, nil)
			require.NoError(t, db.Exec("SELECT 1").Error)
			fn(t, s, db, goleak.IgnoreCurrent())
		})
	}
}

// checkNothingLeft checks, right after the calls of Do and RunWait on db
// have returned, that none of their watches or listeners is left, that
// db's connections are back in the pool, and that no goroutine started
// since before outlives them. The MySQL driver keeps a goroutine per open
// connection, idle ones included.
func checkNothingLeft(t *testing.T, db *gorm.DB, before goleak.Option) {
	t.Helper()
	assert.Zero(t, admin.ReadStats().WatchedRows, "watches left")
	assert.False(t, listening(t, db), "listener left")
	sqlDB, err := db.DB()
	require.NoError(t, err)
	assert.Zero(t, sqlDB.Stats().InUse, "connections in use")
	assert.NoError(t, goleak.Find(before,
		goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1")))
}

// When the waits of Do and RunWait end, however they end (the awaited job's
// result, its failure, the caller's context), they leave no goroutine, no
// watch, no listener and no connection in use behind.
func TestWait_EndsLeaveNothingBehind(t *testing.T) {
	eachDBAlone(t, func(t *testing.T, s *testdb.Server, db *gorm.DB, before goleak.Option) {
		opts := fast(100*time.Millisecond, noExpiry)
		holder, waiter := newRunner(t, db, opts...), newRunner(t, db, opts...)
		repo := newRepository(t, db)
		never := func(context.Context) (string, error) {
			t.Error("a waiter ran the work")
			return "", nil
		}

		t.Run("DoByResult", func(t *testing.T) {
			target := newTarget(t)
			started, release := make(chan struct{}), make(chan struct{})
			job := goDo(t, context.Background(), holder, target, func(context.Context) (string, error) {
				close(started)
				<-release
				return "report", nil
			})
			recv(t, started, 20*time.Second, "the work to start")
			waits := []<-chan doResult{goDo(t, context.Background(), waiter, target, never), goDo(t, context.Background(), waiter, target, never)}
			waitFor(t, 10*time.Second, "both callers to join the wait", func() bool { return gormlease.DoCallers(waiter, target) == 2 })
			waitWatched(t, target)
			close(release)
			for _, ch := range append(waits, job) {
				res := recv(t, ch, 20*time.Second, "Do")
				require.NoError(t, res.err)
				assert.Equal(t, "report", res.value)
			}
			checkNothingLeft(t, db, before)
		})

		t.Run("DoByFailure", func(t *testing.T) {
			target := newTarget(t)
			started, release := make(chan struct{}), make(chan struct{})
			job := goDo(t, context.Background(), holder, target, func(context.Context) (string, error) {
				close(started)
				<-release
				return "", errors.New("upstream API answered 503")
			})
			recv(t, started, 20*time.Second, "the work to start")
			wait := goDo(t, context.Background(), waiter, target, never)
			waitWatched(t, target)
			close(release)
			assert.Error(t, recv(t, job, 20*time.Second, "the holder's Do").err)
			assert.ErrorIs(t, recv(t, wait, 20*time.Second, "the waiter's Do").err, gormlease.ErrSharedJobFailed)
			checkNothingLeft(t, db, before)
		})

		t.Run("DoByContext", func(t *testing.T) {
			target, _ := acquireNew(t, repo, time.Hour)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			waits := []<-chan doResult{goDo(t, ctx, waiter, target, never), goDo(t, ctx, waiter, target, never)}
			for _, ch := range waits {
				assert.ErrorIs(t, recv(t, ch, 20*time.Second, "Do").err, context.DeadlineExceeded)
			}
			checkNothingLeft(t, db, before)
		})

		t.Run("RunWaitByResult", func(t *testing.T) {
			target, l := acquireNew(t, repo, time.Hour)
			done := goRunWait(t, context.Background(), waiter, target, func(context.Context) (string, error) { return "mine", nil })
			waitWatched(t, target)
			require.NoError(t, repo.Release(context.Background(), l))
			res := recv(t, done, 20*time.Second, "RunWait")
			require.NoError(t, res.Err)
			assert.Equal(t, "mine", res.Value)
			checkNothingLeft(t, db, before)
		})

		t.Run("RunWaitByFailure", func(t *testing.T) {
			target, l := acquireNew(t, repo, time.Hour)
			done := goRunWait(t, context.Background(), waiter, target, func(context.Context) (string, error) {
				return "", errors.New("upstream API answered 503")
			})
			waitWatched(t, target)
			require.NoError(t, repo.Release(context.Background(), l))
			assert.ErrorContains(t, recv(t, done, 20*time.Second, "RunWait").Err, "upstream API answered 503")
			checkNothingLeft(t, db, before)
		})

		t.Run("RunWaitByContext", func(t *testing.T) {
			target, _ := acquireNew(t, repo, time.Hour)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			done := goRunWait(t, ctx, waiter, target, never)
			err := recv(t, done, 20*time.Second, "RunWait").Err
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, err, gormlease.ErrLeaseHeld)
			checkNothingLeft(t, db, before)
		})
	})
}

// goRunWait calls r.RunWait on a goroutine, with SaveJSON, and sends its
// result. The RunWait ends before t does (see endsWithTest).
func goRunWait(t testing.TB, ctx context.Context, r *gormlease.Runner[string], target string,
	work func(context.Context) (string, error),
) <-chan runResult[string] {
	ctx, cancel := context.WithCancel(ctx)
	ch, done := make(chan runResult[string], 1), make(chan struct{})
	go func() {
		defer close(done)
		v, err := r.RunWait(ctx, target, work, gormlease.SaveJSON[string])
		ch <- runResult[string]{Value: v, Err: err}
	}()
	endsWithTest(t, "RunWait "+target, cancel, done)
	return ch
}

// A caller whose context's deadline passes while it waits returns
// promptly, with an error wrapping the context's, and leaves nothing
// running: the last of the callers that share a wait stops it before it
// returns. The issue asks for 50ms; the test allows 1s, for a loaded
// machine, and logs what it measured.
func TestWait_DeadlineReturnsPromptly(t *testing.T) {
	eachDBAlone(t, func(t *testing.T, s *testdb.Server, db *gorm.DB, before goleak.Option) {
		// The waiters poll at most every 5s: a deadline is not met by a poll.
		r := newRunner(t, db, fast(5*time.Second, 20*time.Second)...)
		target, _ := acquireNew(t, newRepository(t, db), time.Hour)
		never := func(context.Context) (string, error) {
			t.Error("work ran while the lease was held")
			return "", nil
		}
		const wait = 300 * time.Millisecond
		for _, call := range []string{"Do", "RunWait"} {
			deadline := time.Now().Add(wait)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			var err error
			if call == "Do" {
				other := goDo(t, ctx, r, target, never) // a second caller shares the wait
				_, _, err = r.Do(ctx, target, never, gormlease.SaveJSON[string], loadJSON(target))
				assert.ErrorIs(t, recv(t, other, 20*time.Second, "the other Do").err, context.DeadlineExceeded)
			} else {
				_, err = r.RunWait(ctx, target, never, gormlease.SaveJSON[string])
			}
			late := time.Since(deadline)
			cancel()
			t.Logf("%s on %s returned %v after its deadline", call, s.Name, late.Round(100*time.Microsecond))
			assert.ErrorIs(t, err, context.DeadlineExceeded, call)
			assert.Less(t, late, time.Second, "%s returned late", call)
			checkNothingLeft(t, db, before)
		}
	})
}
