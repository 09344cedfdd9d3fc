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

// A Do that begins while a job is live, but whose first reads of the row
// are refused (the server or a pooler turns its connections away), loads
// that job's result once its reads work again, after the job saved and
// released: it does not take the released row and run the work a second
// time.
func TestDo_FirstReadsRefusedSharesTheJobThatSavedMeanwhile(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		finish := holdWhile(t, newRunner(t, db), target, "the holder's", nil)

		proxy := testdb.NewProxy(t, s.Addr)
		late := newRunner(t, s.OpenVia(t, proxy.Addr()), fast(100*time.Millisecond, 2*time.Second)...)
		proxy.Refuse()
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := goDo(t, ctx, late, target, func(context.Context) (string, error) {
			runs.Add(1)
			return "a second result", nil
		})
		// The Do watches the row only after its first read failed: the
		// proxy refused every connection since before the Do began.
		waitFor(t, 10*time.Second, "the Do watching "+target, func() bool { return waiters(t, target).Waits > 0 })

		require.NoError(t, finish())
		require.NoError(t, proxy.Admit())

		r := <-res
		require.NoError(t, r.err)
		assert.Equal(t, "the holder's", r.value)
		assert.True(t, r.shared, "shared")
		assert.Zero(t, runs.Load(), "the Do ran the work after the job it began under saved")
	})
}

// A Do that waited for generation g, and whose reads failed while g failed
// and a later generation failed too, gets the later failure, the only one
// the row keeps, told as that generation's, after the one it waited for.
func TestDo_SharedFailureSaysWhose(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		finish := holdWhile(t, newRunner(t, db), target, "", errors.New("the first failure"))

		proxy := testdb.NewProxy(t, s.Addr)
		waiter := newRunner(t, s.OpenVia(t, proxy.Addr()), fast(100*time.Millisecond, 2*time.Second)...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := goDo(t, ctx, waiter, target, func(context.Context) (string, error) {
			t.Error("the waiter ran the work")
			return "", nil
		})
		waitWatched(t, target) // it read generation 1 live
		proxy.Refuse()
		require.Error(t, finish())
		_, err := newRunner(t, db).Run(context.Background(), target, func(context.Context) (string, error) {
			return "", errors.New("the second failure")
		}, gormlease.SaveJSON[string])
		require.Error(t, err)
		require.NoError(t, proxy.Admit())

		r := <-res
		var shared *gormlease.SharedJobError
		require.ErrorAs(t, r.err, &shared)
		assert.EqualValues(t, 2, shared.Generation)
		assert.EqualValues(t, 1, shared.WaitedFor)
		assert.Contains(t, shared.Message, "the second failure")
		assert.Contains(t, r.err.Error(), "generation 2, after generation 1")
	})
}

// A Do whose first reads time out, because its pool has no connection to
// give (the application's other queries took them all), loads the result
// of the job that saved meanwhile once a connection is free, rather than
// run the work a second time: as with refused connections, on every
// database, SQLite included.
func TestDo_FirstReadsTimedOutSharesTheJobThatSavedMeanwhile(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		finish := holdWhile(t, newRunner(t, db), target, "the holder's", nil)

		busy := s.Open(t, nil)
		sqlDB, err := busy.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		late := newRunner(t, busy, fast(100*time.Millisecond, 2*time.Second)...)
		conn, err := sqlDB.Conn(context.Background()) // the pool's only connection, taken
		require.NoError(t, err)
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := goDo(t, ctx, late, target, func(context.Context) (string, error) {
			runs.Add(1)
			return "a second result", nil
		})
		// The Do watches the row only after its first read failed: it
		// waited for a connection past its operation timeout.
		waitFor(t, 10*time.Second, "the Do watching "+target, func() bool { return waiters(t, target).Waits > 0 })

		require.NoError(t, finish())
		require.NoError(t, conn.Close())

		r := <-res
		require.NoError(t, r.err)
		assert.Equal(t, "the holder's", r.value)
		assert.True(t, r.shared, "shared")
		assert.Zero(t, runs.Load(), "the Do ran the work after the job it began under saved")
	})
}

// A Do whose first read waits for a connection of its pool (the
// application's other queries hold them all) while the job it began under
// saves and releases, and then gets one within its operation timeout,
// loads that job's result: the read counts from the moment it was sent on
// its connection, not from the moment it began to wait for one, so the
// save is seen as made after the call began. On every database.
func TestDo_FirstReadAfterAWaitForAConnectionSharesTheJobThatSavedMeanwhile(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		finish := holdWhile(t, newRunner(t, db), target, "the holder's", nil)

		busy := s.Open(t, nil)
		sqlDB, err := busy.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		late := newRunner(t, busy, append(fast(100*time.Millisecond, 2*time.Second),
			gormlease.WithOperationTimeout(time.Minute))...)
		conn, err := sqlDB.Conn(context.Background()) // the pool's only connection, taken
		require.NoError(t, err)
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res := goDo(t, ctx, late, target, func(context.Context) (string, error) {
			runs.Add(1)
			return "a second result", nil
		})
		// The Do's first read waits for the connection the test holds: the
		// Do has begun (not only its goroutine, which may run late).
		waitFor(t, 10*time.Second, "the Do's first read waiting for a connection", func() bool {
			return sqlDB.Stats().WaitCount > 0
		})
		// The job saves a second after the Do began, or more: far more than
		// the read's round trip, within which a save cannot be told from
		// one made before the call (see Do), and far less than the wait for
		// the connection, by which the read was judged before.
		time.Sleep(time.Second)
		require.NoError(t, finish())
		require.NoError(t, conn.Close())

		r := <-res
		require.NoError(t, r.err)
		assert.Equal(t, "the holder's", r.value)
		assert.True(t, r.shared, "shared")
		assert.Zero(t, runs.Load(), "the Do ran the work after the job it began under saved")
	})
}

// holdWhile starts a Run of r on target whose work, once it runs, waits
// until the returned finish is called, then returns value and workErr; it
// returns once the work runs. finish returns the Run's error.
func holdWhile(t *testing.T, r *gormlease.Runner[string], target, value string, workErr error) (finish func() error) {
	t.Helper()
	working, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			close(working)
			<-release
			return value, workErr
		}, gormlease.SaveJSON[string])
		held <- err
	}()
	<-working
	return func() error {
		close(release)
		return <-held
	}
}
