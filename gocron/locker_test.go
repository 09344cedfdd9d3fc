package gormleasegocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	gormleasegocron "github.com/gormlease/gormlease/gocron"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// fast are lease settings for the in-process tests: a heartbeat every
// 200ms, a 2s timeout, which a loaded machine keeps.
func fast() []gormlease.Option {
	return []gormlease.Option{gormlease.WithHeartbeatInterval(200 * time.Millisecond), gormlease.WithLeaseTimeout(2 * time.Second)}
}

func newLocker(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormleasegocron.Locker {
	t.Helper()
	l, err := gormleasegocron.NewLocker(db, append(fast(), opts...)...)
	require.NoError(t, err)
	return l
}

func newKey(t *testing.T) string { return t.Name() + "-" + uuid.NewString()[:8] }

// A Lock holds the job's lease, renewed, until Unlock: meanwhile another
// Lock of the key is refused with ErrLeaseHeld, and after Unlock the key
// can be locked again.
func TestLocker_LockHoldsUntilUnlock(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		l, key := newLocker(t, db), newKey(t)
		lock, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		held := leasetest.WaitFor(t, db, key, admin.StateLive, 5*time.Second)
		_, err = l.Lock(context.Background(), key)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		// Past the lease timeout, the heartbeats have kept it live.
		time.Sleep(2500 * time.Millisecond)
		info, ok := leasetest.State(t, db, key)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State, "the lease was not renewed")
		assert.Equal(t, held.Row.Generation, info.Row.Generation)
		_, err = l.Lock(context.Background(), key)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		require.NoError(t, lock.Unlock(context.Background()))
		info, _ = leasetest.State(t, db, key)
		assert.Equal(t, admin.StateReleased, info.State, "Unlock returned before the release")
		require.NoError(t, lock.Unlock(context.Background()), "a second Unlock")
		again, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		require.NoError(t, again.Unlock(context.Background()))
	})
}

// Under WithMinHold, Unlock returns at once and leaves the lease held
// until the minimum hold has passed since the Lock: a Lock meanwhile is
// refused; one after it succeeds.
func TestLocker_UnlockHonoursMinHold(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const hold = 1500 * time.Millisecond
		l, key := newLocker(t, db, gormlease.WithMinHold(hold)), newKey(t)
		locked := time.Now()
		lock, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		require.NoError(t, lock.Unlock(context.Background()))
		assert.Less(t, time.Since(locked), hold, "Unlock waited for the minimum hold")
		_, err = l.Lock(context.Background(), key)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "locked again within the minimum hold")

		// The hold's end reads as released: the job ended cleanly.
		leasetest.WaitFor(t, db, key, admin.StateReleased, 10*time.Second)
		assert.GreaterOrEqual(t, time.Since(locked), hold, "the hold ended early")
		again, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		require.NoError(t, again.Unlock(context.Background()))
	})
}

// A lease taken over during the run ends the Locker's goroutine, and
// Unlock says so with ErrLeaseLost, releasing nothing of the new holder's.
func TestLocker_UnlockReportsALostLease(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		l, key := newLocker(t, db), newKey(t)
		lock, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		thief := leasetest.TakeOver(t, db, key)
		// Whether a heartbeat found the lease lost first, or Unlock's
		// fenced end does, the loss is reported.
		require.ErrorIs(t, lock.Unlock(context.Background()), gormlease.ErrLeaseLost)
		info, ok := leasetest.State(t, db, key)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State, "the new holder's lease was released")
		assert.Equal(t, thief.Generation, info.Row.Generation)
	})
}

// The Lock's context bounds the acquire, not the hold: a Lock on an ended
// context fails and writes nothing; a context cancelled after the Lock
// leaves the lease held until Unlock, since gocron cancels a job's context
// while its run may go on.
func TestLocker_ContextBoundsOnlyTheAcquire(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		l, key := newLocker(t, db), newKey(t)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := l.Lock(ended, key)
		require.ErrorIs(t, err, context.Canceled)
		_, ok := leasetest.State(t, db, key)
		assert.False(t, ok, "a Lock on an ended context wrote a lease row")

		ctx, cancel := context.WithCancel(context.Background())
		lock, err := l.Lock(ctx, key)
		require.NoError(t, err)
		cancel()
		time.Sleep(500 * time.Millisecond)
		info, ok := leasetest.State(t, db, key)
		require.True(t, ok)
		assert.Equal(t, admin.StateLive, info.State, "the lease was released when the Lock's context ended")
		require.NoError(t, lock.Unlock(ctx))
		info, _ = leasetest.State(t, db, key)
		assert.Equal(t, admin.StateReleased, info.State)
	})
}

// Bad input gets an error wrapping ErrInvalidArgument.
func TestLocker_BadInput(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	_, err := gormleasegocron.NewLocker(db, gormlease.WithHeartbeatInterval(0))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = gormleasegocron.NewLocker(nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	l := newLocker(t, db)
	//lint:ignore SA1012 a nil context is the bad input under test
	_, err = l.Lock(nil, "job")
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = l.Lock(context.Background(), "")
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
}

// One timing option is enough: a Locker given only the lease timeout, or
// only the heartbeat interval, takes leases with the timeout given or
// derived (four times the interval), and a DistributedElector is made with
// either.
func TestLocker_OneTimingOptionIsEnough(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		for _, tc := range []struct {
			opt  gormlease.Option
			want time.Duration
		}{
			{gormlease.WithLeaseTimeout(10 * time.Second), 10 * time.Second},
			{gormlease.WithHeartbeatInterval(time.Second), 4 * time.Second},
		} {
			l, err := gormleasegocron.NewLocker(db, tc.opt)
			require.NoError(t, err)
			key := newKey(t)
			lock, err := l.Lock(context.Background(), key)
			require.NoError(t, err)
			info := leasetest.WaitFor(t, db, key, admin.StateLive, 5*time.Second)
			assert.Equal(t, tc.want, info.Timeout)
			require.NoError(t, lock.Unlock(context.Background()))

			e, err := gormleasegocron.NewDistributedElector(context.Background(), db, key, tc.opt)
			require.NoError(t, err)
			e.Close()
		}
	})
}
