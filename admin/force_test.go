package admin_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// ForceRelease ends a lease by force, fenced: a new token no one holds,
// the next generation, the release time and a failure that waiters read;
// the holder's heartbeat, fenced commit and release are refused with
// ErrLeaseLost, and the next acquisition goes on above the holder's
// generation. A lease already released, or a target never acquired, has
// nothing to end: ErrNoLiveLease.
func TestForceRelease_FencesTheHolder(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		target, l := testkit.AcquireNew(t, repo, time.Hour)

		row, err := op.ForceRelease(ctx, target)
		require.NoError(t, err)
		assertForcedOut(t, repo, l, row)

		_, err = op.ForceRelease(ctx, target)
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "released already")
		_, err = op.ForceRelease(ctx, testkit.NewTarget(t))
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "never acquired")

		next, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, l.Generation+2, next.Generation)
	})
}

// assertForcedOut checks that row is l's row as a forced release left it
// (a fresh token, the next generation, released, the operator's failure),
// and that l's heartbeat, fenced commit and release are refused with
// ErrLeaseLost, the commit saving nothing.
func assertForcedOut(t *testing.T, repo *gormlease.Repository, l gormlease.Lease, row gormlease.JobLease) {
	t.Helper()
	ctx := context.Background()
	assert.Equal(t, l.Generation+1, row.Generation)
	assert.NotEqual(t, l.Token, row.LeaseToken)
	assert.NotNil(t, row.ReleasedAt)
	if assert.NotNil(t, row.Failure) {
		assert.Equal(t, "released by force by an operator", *row.Failure)
	}
	require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost)
	saved := false
	require.ErrorIs(t, repo.CommitIfOwner(ctx, l, func(*gorm.DB) error { saved = true; return nil }), gormlease.ErrLeaseLost)
	assert.False(t, saved, "the saver ran")
	require.ErrorIs(t, repo.Release(ctx, l), gormlease.ErrLeaseLost)
}

// A Run whose lease is released by force has its work cancelled with
// ErrLeaseLost at its next heartbeat, and saves nothing.
func TestForceRelease_CancelsRunningWork(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		_, op := newOperator(t, db)
		r := testkit.NewRunner(t, db, testkit.Fast(50*time.Millisecond, 2*time.Second)...)
		target := testkit.NewTarget(t)
		inside := make(chan struct{})
		res := testkit.GoRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
			close(inside)
			<-ctx.Done()
			return "", context.Cause(ctx)
		}, testkit.NoSave(t))
		testkit.Recv(t, inside, 10*time.Second, "the work to start")
		_, err := op.ForceRelease(context.Background(), target)
		require.NoError(t, err)
		require.ErrorIs(t, testkit.Recv(t, res, 10*time.Second, "Run").Err, gormlease.ErrLeaseLost)
	})
}

// ForceReleaseSlot ends the lease of one slot of a semaphore, fenced as
// ForceRelease is; the holders of the other slots keep theirs. A slot
// released already, or with no row, has nothing to end: ErrNoLiveLease.
// A bad slot number is refused, writing nothing.
func TestForceReleaseSlot_FencesOneSlotsHolder(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, target, leases := holdNewSemaphore(t, db, 3)
		op := admin.New(repo)
		gone, kept := leases[1], []gormlease.Lease{leases[0], leases[2]}

		before := testkit.SlotSnapshot(t, s, db, target, 3)
		for _, slot := range []int{0, -1, gormlease.MaxSlots + 1} {
			_, err := op.ForceReleaseSlot(ctx, target, slot)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "slot %d", slot)
			assert.Contains(t, err.Error(), "slot must be between 1 and 100")
		}
		_, err := op.ForceReleaseSlot(ctx, target+"\x1f1", 1)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "a slot row's key as the target")
		assert.Equal(t, before, testkit.SlotSnapshot(t, s, db, target, 3), "a refused call wrote")

		row, err := op.ForceReleaseSlot(ctx, target, gone.Slot)
		require.NoError(t, err)
		assert.Equal(t, testkit.SlotKey(target, gone.Slot), row.TargetID)
		assertForcedOut(t, repo, gone, row)
		for _, l := range kept {
			require.NoError(t, repo.Heartbeat(ctx, l), "slot %d", l.Slot)
			require.NoError(t, repo.CommitIfOwner(ctx, l, func(*gorm.DB) error { return nil }), "slot %d", l.Slot)
		}

		_, err = op.ForceReleaseSlot(ctx, target, gone.Slot)
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "released already")
		assert.Contains(t, err.Error(), fmt.Sprintf("slot %d", gone.Slot))
		_, err = op.ForceReleaseSlot(ctx, target, 4)
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "no row")
		_, err = op.ForceRelease(ctx, target+"-other")
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "never acquired")

		next, err := repo.AcquireSlot(ctx, target, 3, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, gone.Slot, next.Slot, "the one free slot")
		assert.Equal(t, gone.Generation+2, next.Generation)
	})
}

// ForceRelease on a semaphore's target ends every slot's lease that is not
// released, in one statement, as RequestStop asks every slot's holder to
// stop, and returns the lowest slot's row; a slot released already is left
// as it is.
func TestForceRelease_EndsEverySlot(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, target, leases := holdNewSemaphore(t, db, 3)
		op := admin.New(repo)
		require.NoError(t, repo.Release(ctx, leases[2]))
		free := testkit.LeaseRow(t, db, testkit.SlotKey(target, leases[2].Slot))

		row, err := op.ForceRelease(ctx, target)
		require.NoError(t, err)
		low := min(leases[0].Slot, leases[1].Slot)
		assert.Equal(t, testkit.SlotKey(target, low), row.TargetID, "the lowest slot ended")
		for _, l := range leases[:2] {
			require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost, "slot %d", l.Slot)
			after := testkit.LeaseRow(t, db, testkit.SlotKey(target, l.Slot))
			assert.Equal(t, l.Generation+1, after.Generation, "slot %d", l.Slot)
			assert.NotNil(t, after.ReleasedAt, "slot %d", l.Slot)
		}
		assert.Equal(t, free, testkit.LeaseRow(t, db, testkit.SlotKey(target, leases[2].Slot)), "the released slot was written")

		_, err = op.ForceRelease(ctx, target)
		require.ErrorIs(t, err, gormlease.ErrNoLiveLease, "every slot released")
	})
}

// A Run that holds one slot of a semaphore whose slot is released by force
// has its work cancelled with ErrLeaseLost at its next heartbeat and saves
// nothing; the Run on the other slot goes on and saves.
func TestForceReleaseSlot_CancelsThatSlotsRunOnly(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		r := testkit.NewRunner(t, db, append(testkit.Fast(50*time.Millisecond, 10*time.Second), gormlease.WithSlots(2))...)
		repo := r.Repository()
		op := admin.New(repo)
		target := testkit.NewTarget(t)
		slots := make(chan int, 2)
		finish := make(chan struct{})
		work := func(w context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(w)
			slots <- l.Slot
			select {
			case <-finish:
				return "done", nil
			case <-w.Done():
				return "", context.Cause(w)
			}
		}
		var saves atomic.Int32
		save := func(*gorm.DB, string) error { saves.Add(1); return nil }
		first, second := testkit.GoRun(t, ctx, r, target, work, save), testkit.GoRun(t, ctx, r, target, work, save)
		// Both Runs hold a slot; a Run that ends first says why.
		var a int
		for held := 0; held < 2; held++ {
			select {
			case slot := <-slots:
				if held == 0 {
					a = slot
				}
			case res := <-first:
				t.Fatalf("a Run ended before it held a slot: %v", res.Err)
			case res := <-second:
				t.Fatalf("a Run ended before it held a slot: %v", res.Err)
			case <-time.After(10 * time.Second):
				t.Fatalf("timed out after 10s waiting for %d of 2 Runs to hold a slot", 2-held)
			}
		}
		_, err := op.ForceReleaseSlot(ctx, target, a)
		require.NoError(t, err)

		// The first Run to end is the released slot's: the other one's
		// work runs until finish.
		goesOn := second
		select {
		case res := <-first:
			require.ErrorIs(t, res.Err, gormlease.ErrLeaseLost)
		case res := <-second:
			require.ErrorIs(t, res.Err, gormlease.ErrLeaseLost)
			goesOn = first
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for the released slot's Run to end")
		}
		assert.Zero(t, saves.Load(), "the released slot's Run saved")
		close(finish)
		require.NoError(t, testkit.Recv(t, goesOn, 10*time.Second, "the other slot's Run").Err)
		assert.Equal(t, int32(1), saves.Load(), "the other slot's Run saved")
	})
}

// holdNewSemaphore takes every slot of a new target, a semaphore of n
// slots, for an hour, with a Repository that sends no heartbeats.
func holdNewSemaphore(t *testing.T, db *gorm.DB, n int) (*gormlease.Repository, string, []gormlease.Lease) {
	t.Helper()
	repo := testkit.NewRepository(t, db)
	target := testkit.NewTarget(t)
	return repo, target, testkit.HoldSlots(t, repo, target, n, n, time.Hour)
}
