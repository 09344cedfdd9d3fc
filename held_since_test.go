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
	"github.com/gormlease/gormlease/leasetest"
)

// heldSinceMargin bounds how long ago, on a loaded machine, a row's
// acquisition may be when a test reads it just after acquiring.
const heldSinceMargin = 15 * time.Second

// backdateAcquired moves target's acquired_at back to d ago on the
// database's clock, so that a statement that wrote it again would show.
func backdateAcquired(t *testing.T, s *testdb.Server, db *gorm.DB, target string, d time.Duration) time.Time {
	t.Helper()
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("acquired_at", s.Ago(d))
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
	row := leaseRow(t, db, target)
	require.NotNil(t, row.AcquiredAt)
	return *row.AcquiredAt
}

// requireAcquiredNow requires target's row to record an acquisition
// within heldSinceMargin of now on the database's clock.
func requireAcquiredNow(t *testing.T, s *testdb.Server, db *gorm.DB, target, what string) time.Time {
	t.Helper()
	row := leaseRow(t, db, target)
	require.NotNil(t, row.AcquiredAt, "%s: acquired_at is NULL", what)
	now := clockOf(t, s, db)
	at := *row.AcquiredAt
	assert.WithinRange(t, at, now.Add(-heldSinceMargin), now.Add(time.Millisecond), "%s: acquired_at", what)
	assert.WithinDuration(t, row.UpdatedAt, at, time.Second, "%s: acquired_at and updated_at", what)
	return at
}

// The acquire's own statement records when each generation began
// (acquired_at, "held since"): a new row, a released row acquired again, an
// expired lease taken over, an AcquireFrom (of a generation, or of none), a
// slot; heartbeats (single and batched) and a minimum hold leave it as it
// is.
func TestAcquire_RecordsHeldSince(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := holderRepository(t, db, "pod-a")
		other := holderRepository(t, db, "pod-b")

		// A new row.
		target, l := acquireNew(t, repo, time.Minute)
		requireAcquiredNow(t, s, db, target, "new row")

		// Heartbeats and a minimum hold do not touch it.
		old := backdateAcquired(t, s, db, target, time.Hour)
		require.NoError(t, repo.Heartbeat(ctx, l))
		row := leaseRow(t, db, target)
		require.NotNil(t, row.AcquiredAt)
		assert.True(t, old.Equal(*row.AcquiredAt), "a heartbeat changed acquired_at: %v -> %v", old, *row.AcquiredAt)
		require.NoError(t, repo.Hold(ctx, l, time.Second))
		row = leaseRow(t, db, target)
		assert.True(t, old.Equal(*row.AcquiredAt), "a hold changed acquired_at: %v -> %v", old, *row.AcquiredAt)

		// Released (the hold is over) and acquired again, by the same
		// Repository (which knows the row) and by another.
		age(t, s, db, target, time.Minute)
		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, target, "takeover after a minimum hold")
		backdateAcquired(t, s, db, target, time.Hour)
		require.NoError(t, repo.Release(ctx, l))
		l, err = repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, target, "released row, acquired again")
		backdateAcquired(t, s, db, target, time.Hour)
		require.NoError(t, repo.Release(ctx, l))
		_, err = other.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, target, "released row, acquired by another")

		// An expired lease taken over, by Acquire and by AcquireFrom.
		backdateAcquired(t, s, db, target, time.Hour)
		age(t, s, db, target, 2*time.Minute)
		l, err = repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, target, "expired lease taken over")
		backdateAcquired(t, s, db, target, time.Hour)
		age(t, s, db, target, 2*time.Minute)
		l, err = gormlease.AcquireFrom(other, ctx, target, time.Minute, l.Generation)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, target, "expired lease taken over from its generation")
		require.NoError(t, other.Release(ctx, l))

		// A new row from generation 0 (on MariaDB, MySQL's INSERT).
		fresh := newTarget(t)
		_, err = gormlease.AcquireFrom(other, ctx, fresh, time.Minute, 0)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, fresh, "new row from generation 0")

		// A slot.
		slots := newTarget(t)
		sl, err := repo.AcquireSlot(ctx, slots, 2, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, slotKey(slots, sl.Slot), "slot")
		backdateAcquired(t, s, db, slotKey(slots, sl.Slot), time.Hour)
		require.NoError(t, repo.Release(ctx, sl))
		sl, err = repo.AcquireSlot(ctx, slots, 2, time.Minute)
		require.NoError(t, err)
		requireAcquiredNow(t, s, db, slotKey(slots, sl.Slot), "slot acquired again")
	})
}

// A Run's batched heartbeats leave acquired_at as the acquire wrote it.
func TestRun_HeartbeatsKeepHeldSince(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		r := newRunner(t, db, fast(100*time.Millisecond, 5*time.Second)...)
		target := newTarget(t)
		started := make(chan struct{})
		release := make(chan struct{})
		done := goRun(t, ctx, r, target, func(ctx context.Context) (string, error) {
			close(started)
			<-release
			return "", nil
		}, func(*gorm.DB, string) error { return nil })
		recv(t, started, 30*time.Second, "the work to start")
		old := backdateAcquired(t, s, db, target, time.Hour)
		beat := leaseRow(t, db, target).UpdatedAt
		waitFor(t, 30*time.Second, "a heartbeat", func() bool { return leaseRow(t, db, target).UpdatedAt.After(beat) })
		row := leaseRow(t, db, target)
		assert.True(t, old.Equal(*row.AcquiredAt), "a heartbeat changed acquired_at: %v -> %v", old, *row.AcquiredAt)
		close(release)
		recv(t, done, 30*time.Second, "the run to end")
	})
}

// A refusal says how long the live lease has been held (HeldFor), read by
// the refusing statement, and RetryAfter derives from it a wait of a few
// seconds for a job of a few seconds, not the lease's timeout; under a
// minimum hold, the hold's end; for a row that does not record its
// acquisition, 1 s.
func TestHeldError_RetryAfter(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		other := holderRepository(t, db, "pod-b")

		// A job held for about a second, under a 2-minute lease.
		target, l := acquireNew(t, holderRepository(t, db, "pod-a"), 2*time.Minute)
		backdateAcquired(t, s, db, target, time.Second)
		_, err := other.Acquire(ctx, target, time.Minute)
		held := requireHeld(t, err, target, "pod-a", l.Generation, 2*time.Minute)
		assert.GreaterOrEqual(t, held.HeldFor, time.Second, "held for")
		assert.Less(t, held.HeldFor, time.Second+heldSinceMargin, "held for")
		assert.GreaterOrEqual(t, held.RetryAfter(), time.Second)
		assert.LessOrEqual(t, held.RetryAfter(), 2*time.Second+heldSinceMargin, "retry after")
		assert.Equal(t, held.RetryAfter().Truncate(time.Second), held.RetryAfter(), "whole seconds")

		// The same refusal through Run, and through RunWait's wait, which
		// reads the row on its own.
		r := newRunner(t, db, gormlease.WithHolder("pod-c"))
		work := func(context.Context) (string, error) { t.Error("work ran"); return "", nil }
		_, err = r.Run(ctx, target, work, noSave(t))
		held = requireHeld(t, err, target, "pod-a", l.Generation, 2*time.Minute)
		assert.GreaterOrEqual(t, held.HeldFor, time.Second, "held for, Run")
		assert.LessOrEqual(t, held.RetryAfter(), 2*time.Second+heldSinceMargin, "retry after, Run")
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = r.RunWait(wctx, target, work, noSave(t))
		cancel()
		held = requireHeld(t, err, target, "pod-a", l.Generation, 2*time.Minute)
		assert.GreaterOrEqual(t, held.HeldFor, time.Second, "held for, RunWait")
		assert.LessOrEqual(t, held.RetryAfter(), 2*time.Second+heldSinceMargin, "retry after, RunWait")

		// A Run of pod-a, alive and beating under the default timeout
		// (2 minutes), about a second into its job.
		job := newTarget(t)
		started, finish := make(chan struct{}), make(chan struct{})
		done := goRun(t, ctx, newRunner(t, db, gormlease.WithHolder("pod-a")), job, func(context.Context) (string, error) {
			close(started)
			<-finish
			return "", nil
		}, func(*gorm.DB, string) error { return nil })
		recv(t, started, 30*time.Second, "the job to start")
		backdateAcquired(t, s, db, job, time.Second)
		_, err = r.Run(ctx, job, work, noSave(t))
		held = requireHeld(t, err, job, "pod-a", generationOf(t, db, job), gormlease.DefaultLeaseTimeout)
		assert.GreaterOrEqual(t, held.HeldFor, time.Second, "held for, a Run's job")
		assert.GreaterOrEqual(t, held.RetryAfter(), time.Second)
		assert.LessOrEqual(t, held.RetryAfter(), 2*time.Second+heldSinceMargin, "retry after, a Run's job")
		close(finish)
		recv(t, done, 30*time.Second, "the job to end")

		// leasetest.Occupy's hour-long lease, just acquired: about 1 s.
		occupied := newTarget(t)
		leasetest.Occupy(t, db, occupied)
		_, err = other.Acquire(ctx, occupied, time.Minute)
		held = requireHeld(t, err, occupied, leasetest.Holder, generationOf(t, db, occupied), leasetest.OccupyTimeout)
		assert.Less(t, held.HeldFor, heldSinceMargin, "held for, Occupy")
		assert.GreaterOrEqual(t, held.RetryAfter(), time.Second)
		assert.LessOrEqual(t, held.RetryAfter(), heldSinceMargin, "retry after, Occupy")

		// A row that records no acquisition: HeldFor 0, RetryAfter 1 s.
		require.NoError(t, db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("acquired_at", nil).Error)
		_, err = other.Acquire(ctx, target, time.Minute)
		held = requireHeld(t, err, target, "pod-a", l.Generation, 2*time.Minute)
		assert.Zero(t, held.HeldFor, "held for, no acquired_at")
		assert.Equal(t, time.Second, held.RetryAfter(), "retry after, no acquired_at")

		// Under a minimum hold, the hold's end, whatever HeldFor.
		hold := newTarget(t)
		holder := holderRepository(t, db, "pod-a")
		hl, err := holder.Acquire(ctx, hold, time.Minute)
		require.NoError(t, err)
		require.NoError(t, holder.Hold(ctx, hl, 30*time.Second))
		_, err = other.Acquire(ctx, hold, time.Minute)
		held = requireHeld(t, err, hold, "pod-a", hl.Generation, 30*time.Second)
		assert.Less(t, held.HeldFor, heldSinceMargin, "held for, min hold")
		assert.Greater(t, held.RetryAfter(), 30*time.Second-heldMargin, "retry after, min hold")
		assert.LessOrEqual(t, held.RetryAfter(), 30*time.Second, "retry after, min hold")

		// A slot's refusal says so too.
		slots := newTarget(t)
		_, err = holder.AcquireSlot(ctx, slots, 1, 2*time.Minute)
		require.NoError(t, err)
		backdateAcquired(t, s, db, slotKey(slots, 1), time.Second)
		_, err = other.AcquireSlot(ctx, slots, 1, time.Minute)
		held = requireHeld(t, err, slots, "pod-a", leaseRow(t, db, slotKey(slots, 1)).Generation, 2*time.Minute)
		assert.GreaterOrEqual(t, held.HeldFor, time.Second, "held for, slot")
		assert.LessOrEqual(t, held.RetryAfter(), 2*time.Second+heldSinceMargin, "retry after, slot")
	})
}

// generationOf is the generation of target's row.
func generationOf(t *testing.T, db *gorm.DB, target string) int64 {
	t.Helper()
	return leaseRow(t, db, target).Generation
}

// RetryAfter: as long again as the lease was held, at least 1 s, at most
// ExpiresIn rounded up; under a minimum hold, ExpiresIn rounded up; whole
// seconds always.
func TestHeldError_RetryAfterArithmetic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		expires, held, want time.Duration
		minHold             bool
	}{
		{"HeldBriefly", time.Hour, 300 * time.Millisecond, time.Second, false},
		{"HeldASecondAndABit", 2 * time.Minute, 1200 * time.Millisecond, 2 * time.Second, false},
		{"HeldLong", 2 * time.Minute, 10 * time.Minute, 2 * time.Minute, false},
		{"ExpiresSoon", 1500 * time.Millisecond, 10 * time.Second, 2 * time.Second, false},
		{"ExpiresVerySoon", time.Microsecond, 10 * time.Second, time.Second, false},
		{"Unknown", time.Hour, 0, time.Second, false},
		{"MinHold", 29*time.Second + time.Millisecond, time.Second, 30 * time.Second, true},
		{"MinHoldEnding", time.Millisecond, time.Second, time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := gormlease.NewHeldError("t", tc.expires, tc.held, tc.minHold)
			assert.Equal(t, tc.want, err.RetryAfter())
		})
	}
}
