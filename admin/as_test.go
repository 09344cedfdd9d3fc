package admin_test

import (
	"context"
	"strings"
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

// An Operator made by As records its operator: Pause in paused_by (and a
// pause again without a name clears it; Resume replaces it with its own),
// RequestStop and RequestStopSlot in stop_by, ForceRelease and
// ForceReleaseSlot in the failure; List reads them back. The Operator it
// was made from records none.
func TestOperatorAs_RecordsTheOperator(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		alice := op.As("alice")
		target, _ := testkit.AcquireNew(t, repo, time.Hour)
		info := func(key string) admin.LeaseInfo {
			t.Helper()
			page, err := op.List(ctx, admin.ListOptions{Prefix: key, Limit: 1})
			require.NoError(t, err)
			require.Len(t, page, 1)
			require.Equal(t, key, page[0].Key)
			return page[0]
		}

		require.NoError(t, alice.Pause(ctx, target, "deploy"))
		row := testkit.LeaseRow(t, db, target)
		if assert.NotNil(t, row.PausedBy) {
			assert.Equal(t, "alice", *row.PausedBy)
		}
		assert.Equal(t, "alice", info(target).PausedBy)
		require.NoError(t, op.Pause(ctx, target, "deploy again"))
		assert.Nil(t, testkit.LeaseRow(t, db, target).PausedBy, "a pause without a name")
		require.NoError(t, alice.Pause(ctx, target, "deploy"))
		require.NoError(t, op.Resume(ctx, target))
		row = testkit.LeaseRow(t, db, target)
		assert.Nil(t, row.PausedAt)
		assert.Nil(t, row.PausedBy, "a Resume without a name records none")
		assert.Empty(t, info(target).PausedBy)
		require.NoError(t, alice.Pause(ctx, target, "deploy"))
		require.NoError(t, op.As("bob").Resume(ctx, target))
		row = testkit.LeaseRow(t, db, target)
		assert.Nil(t, row.PausedAt)
		if assert.NotNil(t, row.PausedBy) {
			assert.Equal(t, "bob", *row.PausedBy, "Resume records who resumed, in place of who paused")
		}
		assert.Empty(t, info(target).PausedBy, "a row not paused shows no PausedBy")
		require.NoError(t, op.As("carol").Resume(ctx, target))
		assert.Equal(t, "bob", *testkit.LeaseRow(t, db, target).PausedBy, "a Resume of a row not paused records no one")

		require.NoError(t, op.As("bob").RequestStop(ctx, target, "runaway"))
		row = testkit.LeaseRow(t, db, target)
		if assert.NotNil(t, row.StopBy) {
			assert.Equal(t, "bob", *row.StopBy)
		}
		li := info(target)
		assert.True(t, li.StopRequested)
		assert.Equal(t, "bob", li.StopBy)

		forced, err := op.As("carol").ForceRelease(ctx, target)
		require.NoError(t, err)
		if assert.NotNil(t, forced.Failure) {
			assert.Equal(t, "released by force by operator carol", *forced.Failure)
		}
		assert.Empty(t, info(target).StopBy, "no request applies to a released lease")

		// Slots, and a name of the most bytes: the failure is cut to the
		// column's 255 bytes, on a character's boundary.
		sem := testkit.NewTarget(t)
		testkit.HoldSlots(t, repo, sem, 2, 2, time.Hour)
		long := strings.Repeat("é", 127) + "x" // 255 bytes
		dave := op.As(long)
		require.NoError(t, dave.RequestStopSlot(ctx, sem, 2, "slot"))
		slot := info(testkit.SlotKey(sem, 2))
		assert.Equal(t, long, slot.StopBy)
		forced, err = dave.ForceReleaseSlot(ctx, sem, 1)
		require.NoError(t, err)
		if assert.NotNil(t, forced.Failure) {
			want := "released by force by operator " + strings.Repeat("é", 112)
			assert.Equal(t, want, *forced.Failure)
			assert.LessOrEqual(t, len(*forced.Failure), 255)
		}
		forced, err = op.ForceReleaseSlot(ctx, sem, 2)
		require.NoError(t, err)
		if assert.NotNil(t, forced.Failure) {
			assert.Equal(t, "released by force by an operator", *forced.Failure, "the Operator that As was called on")
		}
	})
}

// A name that the columns cannot hold makes every method of the Operator
// refuse, as bad input, and write nothing.
func TestOperatorAs_RefusesBadNames(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		target, _ := testkit.AcquireNew(t, repo, time.Hour)
		fresh := testkit.NewTarget(t)
		for _, name := range []string{"", strings.Repeat("x", 256), "bad\xff", "nul\x00"} {
			bad := op.As(name)
			invalid := func(what string, err error) {
				t.Helper()
				assert.ErrorIs(t, err, gormlease.ErrInvalidArgument, "%s as %q", what, name)
			}
			invalid("Pause", bad.Pause(ctx, target, "r"))
			invalid("Pause of a target without a row", bad.Pause(ctx, fresh, "r"))
			invalid("Resume", bad.Resume(ctx, target))
			invalid("RequestStop", bad.RequestStop(ctx, target, "r"))
			invalid("RequestStopSlot", bad.RequestStopSlot(ctx, target, 1, "r"))
			_, err := bad.ForceRelease(ctx, target)
			invalid("ForceRelease", err)
			_, err = bad.ForceReleaseSlot(ctx, target, 1)
			invalid("ForceReleaseSlot", err)
			_, err = bad.List(ctx, admin.ListOptions{})
			invalid("List", err)
			_, err = bad.Count(ctx, "")
			invalid("Count", err)
			_, _, err = bad.Get(ctx, target)
			invalid("Get", err)
			_, err = bad.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, DryRun: true})
			invalid("Prune", err)
			assert.Zero(t, bad.Waiters(target))
			assert.False(t, bad.Listening())
		}
		row := testkit.LeaseRow(t, db, target)
		assert.Nil(t, row.ReleasedAt, "released")
		assert.Nil(t, row.PausedAt, "paused")
		assert.Nil(t, row.StopGeneration, "asked to stop")
		assert.Zero(t, testkit.CountRows(t, db, &gormlease.JobLease{}, fresh), "a row made for the pause")
	})
}
