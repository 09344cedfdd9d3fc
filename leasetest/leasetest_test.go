package leasetest_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
	"github.com/gormlease/gormlease/leasetest"
)

// eachDB runs fn as a parallel subtest on every supported database.
func eachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, s, s.DB(t))
		})
	}
}

func newTarget(t *testing.T) string { return t.Name() + "#" + uuid.NewString()[:8] }

func newRunner(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Runner[string] {
	t.Helper()
	r, err := gormlease.NewRunner[string](db, append([]gormlease.Option{
		gormlease.WithHeartbeatInterval(100 * time.Millisecond),
		gormlease.WithLeaseTimeout(2 * time.Second),
		gormlease.WithOperationTimeout(2 * time.Second),
	}, opts...)...)
	require.NoError(t, err)
	return r
}

func recv[V any](t *testing.T, ch <-chan V, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Occupy makes Run see ErrLeaseHeld without running its work, until it is
// released; State reports the held lease.
func TestOccupy_RunSeesLeaseHeld(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		held, release := leasetest.Occupy(t, db, target)
		info, ok := leasetest.State(t, db, target)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State)
		assert.Equal(t, leasetest.Holder, info.Row.Holder)
		assert.Equal(t, held.Generation, info.Row.Generation)

		r := newRunner(t, db)
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			t.Error("the work ran while the target was held")
			return "", nil
		}, gormlease.SaveJSON[string])
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		release()
		leasetest.WaitFor(t, db, target, admin.StateReleased, time.Second)
		got, err := r.Run(context.Background(), target, func(context.Context) (string, error) { return "ran", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.Equal(t, "ran", got)
	})
}

// A takeover in the middle of the work cancels it with ErrLeaseLost, and
// nothing is saved; the target is then the taker's.
func TestTakeOver_MidWorkCancelsTheWork(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		r := newRunner(t, db)
		started := make(chan struct{})
		taken := make(chan gormlease.Lease, 1)
		done := make(chan error, 1)
		go func() {
			_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
				close(started)
				<-ctx.Done()
				return "too late", context.Cause(ctx)
			}, gormlease.SaveJSON[string])
			done <- err
		}()
		recv(t, started, "the work")
		taken <- leasetest.TakeOver(t, db, target)
		err := recv(t, done, "Run")
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		_, _, err = gormlease.LoadJSON[string](context.Background(), db, target)
		require.ErrorIs(t, err, gormlease.ErrNoResult, "the work's result was saved")
		l := <-taken
		info, ok := leasetest.State(t, db, target)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State)
		assert.Equal(t, l.Token, info.Row.LeaseToken)
		assert.EqualValues(t, 2, info.Row.Generation, "generation + 1")
	})
}

// TakeOver of a target never acquired, or released, acquires it.
func TestTakeOver_FreeTarget(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		l := leasetest.TakeOver(t, db, target)
		assert.EqualValues(t, 1, l.Generation)
		info := leasetest.WaitFor(t, db, target, admin.StateLive, time.Second)
		assert.Equal(t, l.Token, info.Row.LeaseToken)
	})
}

// Do waits for a lease that Occupy took, holding no connection; after
// Expire, it takes the lease over and runs the work once.
func TestDo_WaitsForAnOccupantAndTakesOverAfterExpire(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		held, _ := leasetest.Occupy(t, db, target)
		r := newRunner(t, db)
		var ran atomic.Int32
		type result struct {
			v      string
			shared bool
			err    error
		}
		done := make(chan result, 1)
		go func() {
			v, shared, err := r.Do(context.Background(), target, func(ctx context.Context) (string, error) {
				ran.Add(1)
				return "fresh", nil
			}, gormlease.SaveJSON[string], func(tx *gorm.DB) (string, error) {
				v, _, err := gormlease.LoadJSON[string](tx.Statement.Context, tx, target)
				return v, err
			})
			done <- result{v, shared, err}
		}()
		// Do waits: its watch has read the live hold (a Do whose goroutine
		// ran late would begin only after Expire, and never wait); the hold
		// stays live and the work does not run.
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		testkit.WaitFor(t, 10*time.Second, "Do to wait for the occupant", func() bool { return admin.New(repo).Waiters(target).Held })
		select {
		case res := <-done:
			t.Fatalf("Do returned while the target was held: %+v", res)
		case <-time.After(300 * time.Millisecond):
		}
		assert.Zero(t, ran.Load())
		leasetest.Expire(t, db, target)
		info, ok := leasetest.State(t, db, target)
		if ok && info.Row.Generation == held.Generation {
			assert.Equal(t, admin.StateExpired, info.State)
		}
		res := recv(t, done, "Do")
		require.NoError(t, res.err)
		assert.Equal(t, "fresh", res.v)
		assert.False(t, res.shared)
		assert.EqualValues(t, 1, ran.Load())
	})
}

// Expire makes the next Run take the lease over, under the next
// generation.
func TestExpire_NextRunTakesOver(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		held, _ := leasetest.Occupy(t, db, target)
		leasetest.Expire(t, db, target)
		info := leasetest.WaitFor(t, db, target, admin.StateExpired, time.Second)
		assert.Equal(t, held.Generation, info.Row.Generation)
		r := newRunner(t, db)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			assert.Equal(t, held.Generation+1, l.Generation)
			return "x", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
	})
}

// The helpers follow WithTableNames.
func TestHelpers_OtherTables(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		tables := gormlease.WithTableNames("leasetest_lease", "leasetest_result")
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db, tables))
		target := newTarget(t)
		leasetest.Occupy(t, db, target, tables)
		_, ok := leasetest.State(t, db, target)
		assert.False(t, ok, "the default table has the row")
		info, ok := leasetest.State(t, db, target, tables)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State)
		r := newRunner(t, db, tables)
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) { return "", nil },
			gormlease.SaveJSON[string])
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	})
}

// fatalTB records the failure of a helper: Fatalf ends the goroutine, as
// testing.T's does.
type fatalTB struct {
	testing.TB
	msg chan string
}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Cleanup(fn func()) { f.TB.Cleanup(fn) }
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg <- fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs fn on a TB whose Fatalf is recorded, and returns the message.
func fails(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	f := &fatalTB{TB: t, msg: make(chan string, 1)}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		fn(f)
	}()
	<-ended
	select {
	case m := <-f.msg:
		return m
	default:
		t.Fatal("the helper did not fail the test")
		return ""
	}
}

// The helpers fail the test with a message that says what was expected.
func TestHelpers_FailClearly(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		leasetest.Occupy(t, db, target)
		msg := fails(t, func(tb testing.TB) { leasetest.Occupy(tb, db, target) })
		assert.Contains(t, msg, "held already")
		assert.Contains(t, msg, leasetest.Holder)

		msg = fails(t, func(tb testing.TB) {
			leasetest.WaitFor(tb, db, target, admin.StateReleased, 50*time.Millisecond)
		})
		assert.Contains(t, msg, "not released within 50ms")
		assert.Contains(t, msg, "last seen: live")

		msg = fails(t, func(tb testing.TB) { leasetest.Expire(tb, db, newTarget(t)) })
		assert.Contains(t, msg, "no lease row")

		empty := s.OpenEmpty(t, nil)
		msg = fails(t, func(tb testing.TB) { leasetest.State(tb, empty, target) })
		assert.Contains(t, msg, "leasetest.State")
	})
}

// State shows a paused target as paused, with the reason, and a pending
// stop request with its reason.
func TestState_ShowsPauseAndStop(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := newRunner(t, db).Repository()
		target := newTarget(t)
		_, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		require.NoError(t, admin.New(repo).Pause(ctx, target, "why"))
		require.NoError(t, admin.New(repo).RequestStop(ctx, target, "because"))
		info, ok := leasetest.State(t, db, target)
		require.True(t, ok)
		assert.True(t, info.Paused)
		assert.Equal(t, "why", info.PauseReason)
		assert.True(t, info.StopRequested)
		assert.Equal(t, "because", info.StopReason)
	})
}
