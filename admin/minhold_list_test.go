package admin_test

import (
	"context"
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

// A Run whose work ended before its minimum hold leaves its row held for
// the rest of it, and List says so (MinHold, live); once the hold has
// passed the row reads as released, not expired, on every database. A
// holder that died still reads as expired.
func TestList_MinHoldEndsReleased(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		const hold = 1500 * time.Millisecond
		r := testkit.NewRunner(t, db, gormlease.WithMinHold(hold))
		_, err := r.Run(ctx, "hold/ended", func(context.Context) (string, error) { return "", nil },
			func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		repo := r.Repository()
		op := admin.New(repo)
		// A holder that died: its lease times out as the hold does.
		_, err = repo.Acquire(ctx, "hold/died", hold)
		require.NoError(t, err)

		li := listOne(t, op, "hold/ended")
		require.Equal(t, admin.StateLive, li.State, "the hold ended before it was read: the machine is too slow")
		assert.True(t, li.MinHold)
		assert.Greater(t, li.ExpiresIn, time.Duration(0))
		assert.LessOrEqual(t, li.Timeout, hold)
		assert.False(t, listOne(t, op, "hold/died").MinHold, "a live lease read as a minimum hold")
		_, err = repo.Acquire(ctx, "hold/ended", time.Minute)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "the hold did not hold")

		li = waitState(t, op, "hold/ended", admin.StateReleased, 10*time.Second)
		assert.False(t, li.MinHold)
		assert.Zero(t, li.ExpiresIn)
		assert.Nil(t, li.Row.ReleasedAt, "the row was written after the hold")
		died := waitState(t, op, "hold/died", admin.StateExpired, 10*time.Second)
		assert.False(t, died.MinHold)

		released, err := op.List(ctx, admin.ListOptions{Prefix: "hold/", State: admin.StateReleased})
		require.NoError(t, err)
		require.Len(t, released, 1)
		assert.Equal(t, "hold/ended", released[0].TargetID)

		// The next acquisition takes the target; its row is an ordinary
		// lease again.
		l, err := repo.Acquire(ctx, "hold/ended", time.Minute)
		require.NoError(t, err)
		li = listOne(t, op, "hold/ended")
		assert.Equal(t, admin.StateLive, li.State)
		assert.False(t, li.MinHold)
		require.NoError(t, repo.Release(ctx, l))
	})
}

// listOne reads target's row with List.
func listOne(t *testing.T, op *admin.Operator, target string) admin.LeaseInfo {
	t.Helper()
	page, err := op.List(context.Background(), admin.ListOptions{Prefix: target, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, target, page[0].TargetID)
	return page[0]
}

// waitState reads target's row until it is in state, failing t after
// timeout.
func waitState(t *testing.T, op *admin.Operator, target string, state admin.LeaseState,
	timeout time.Duration,
) admin.LeaseInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		li := listOne(t, op, target)
		if li.State == state {
			return li
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %s after %v, not %s", target, li.State, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
