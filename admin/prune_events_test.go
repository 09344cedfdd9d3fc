package admin_test

import (
	"context"
	"math"
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

// eventSeqs reads the seqs of key's events, oldest first.
func eventSeqs(t *testing.T, db *gorm.DB, key string) []int64 {
	t.Helper()
	var out []int64
	require.NoError(t, db.Table("job_lease_event").Where("target_id = ?", key).Order("seq").Pluck("seq", &out).Error)
	return out
}

// clearEvents deletes every event: the tests that write their own start
// from none, whatever the triggers wrote for the rows they made.
func clearEvents(t *testing.T, db *gorm.DB) {
	t.Helper()
	require.NoError(t, db.Exec("DELETE FROM job_lease_event").Error)
}

// Prune deletes the events older than its age, after the lease rows, in
// batches of BatchSize, but keeps the newest of each row whose lease row
// stays, so that its Seq goes on; a row whose lease row is gone, or is
// pruned in the same run, loses them all. A dry run counts exactly what
// the prune then deletes, and deletes nothing; the count is apart from
// the lease rows'.
func TestPrune_DeletesOldEvents(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		repo, op := newOperator(t, db)
		for _, target := range []string{"kept", "recent", "old-row"} {
			released(t, repo, target)
		}
		ageRelease(t, s, db, "old-row", 2*time.Hour)
		clearEvents(t, db)
		h := time.Hour
		addEvents(t, s, db,
			ev{key: "kept", seq: 1, kind: "acquired", generation: 1, age: 3 * h},
			ev{key: "kept", seq: 2, kind: "ended", generation: 1, age: 2 * h},
			ev{key: "kept", seq: 3, kind: "paused", generation: 1, age: 2 * h},
			ev{key: "gone", seq: 1, kind: "acquired", generation: 1, age: 3 * h},
			ev{key: "gone", seq: 2, kind: "ended", generation: 1, age: 2 * h},
			ev{key: "gone", seq: 3, kind: "acquired", generation: 2, age: 2 * h},
			ev{key: "recent", seq: 1, kind: "acquired", generation: 1, age: 2 * h},
			ev{key: "recent", seq: 2, kind: "ended", generation: 1, age: 10 * time.Minute},
			ev{key: "recent", seq: 3, kind: "acquired", generation: 2, age: time.Minute},
			ev{key: "gone-recent", seq: 1, kind: "acquired", generation: 1, age: 2 * h},
			ev{key: "gone-recent", seq: 2, kind: "ended", generation: 1, age: 5 * time.Minute},
			ev{key: testkit.SlotKey("kept", 1), seq: 1, kind: "acquired", generation: 1, age: 3 * h},
			ev{key: testkit.SlotKey("kept", 1), seq: 2, kind: "ended", generation: 1, age: 2 * h},
			ev{key: "old-row", seq: 1, kind: "acquired", generation: 1, age: 3 * h},
			ev{key: "old-row", seq: 2, kind: "ended", generation: 1, age: 2 * h},
		)
		const want = 2 + 3 + 1 + 1 + 2 + 2

		var dryEvents int64
		dry, err := op.Prune(ctx, admin.PruneOptions{OlderThan: h, DryRun: true, EventsDeleted: &dryEvents})
		require.NoError(t, err)
		assert.EqualValues(t, 1, dry, "lease rows a dry run counts")
		assert.EqualValues(t, want, dryEvents, "events a dry run counts")
		assert.Equal(t, []int64{1, 2, 3}, eventSeqs(t, db, "kept"), "after a dry run")

		var events int64
		var progress []int64
		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: h, BatchSize: 2, EventsDeleted: &events,
			EventProgress: func(n int64) { progress = append(progress, n) }})
		require.NoError(t, err)
		assert.EqualValues(t, 1, deleted, "lease rows deleted, events apart")
		assert.EqualValues(t, want, events)
		require.NotEmpty(t, progress)
		for i, n := range progress {
			prev := int64(0)
			if i > 0 {
				prev = progress[i-1]
			}
			assert.LessOrEqual(t, n-prev, int64(2), "a batch deletes at most BatchSize events: %v", progress)
			assert.Greater(t, n, prev, "progress only after a batch that deleted: %v", progress)
		}
		assert.EqualValues(t, want, progress[len(progress)-1])

		assert.Equal(t, []int64{3}, eventSeqs(t, db, "kept"), "the newest event of a row that stays")
		assert.Empty(t, eventSeqs(t, db, "gone"), "a row without a lease row")
		assert.Equal(t, []int64{2, 3}, eventSeqs(t, db, "recent"))
		assert.Equal(t, []int64{2}, eventSeqs(t, db, "gone-recent"))
		assert.Empty(t, eventSeqs(t, db, testkit.SlotKey("kept", 1)), "a slot's row without a lease row")
		assert.Empty(t, eventSeqs(t, db, "old-row"), "a row pruned in the same run")

		events = -1
		deleted, err = op.Prune(ctx, admin.PruneOptions{OlderThan: h, EventsDeleted: &events})
		require.NoError(t, err)
		assert.Zero(t, deleted)
		assert.Zero(t, events, "a second prune")
	})
}

// KeepEvents caps each row's history at its newest events, whatever their
// age, in batches; a cap above a row's count keeps it whole, and a
// negative one is refused, deleting nothing.
func TestPrune_KeepEventsCapsEachRow(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		repo, op := newOperator(t, db)
		released(t, repo, "busy")
		clearEvents(t, db)
		fillEvents(t, s, db, "busy", 25) // one a second up to now
		fillEvents(t, s, db, "quiet", 3)
		fillEvents(t, s, db, "a", 5)

		var dryEvents int64
		_, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: 4, DryRun: true, EventsDeleted: &dryEvents})
		require.NoError(t, err)
		assert.EqualValues(t, 21+1, dryEvents)

		var events int64
		var progress []int64
		_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: 4, BatchSize: 5, EventsDeleted: &events,
			EventProgress: func(n int64) { progress = append(progress, n) }})
		require.NoError(t, err)
		assert.EqualValues(t, 22, events)
		assert.Equal(t, []int64{5, 10, 15, 20, 22}, progress, "batches of 5")
		assert.Equal(t, []int64{22, 23, 24, 25}, eventSeqs(t, db, "busy"))
		assert.Equal(t, []int64{1, 2, 3}, eventSeqs(t, db, "quiet"))
		assert.Equal(t, []int64{2, 3, 4, 5}, eventSeqs(t, db, "a"))

		_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: math.MaxInt, EventsDeleted: &events})
		require.NoError(t, err)
		assert.Zero(t, events, "a cap above every row's count")

		events = -1
		_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: -1, EventsDeleted: &events})
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "KeepEvents is -1")
		assert.Zero(t, events)
		assert.Len(t, eventSeqs(t, db, "busy"), 4)
	})
}

// Where the table keeps no history, Prune deletes the lease rows as
// before, and no events, without an error, also with KeepEvents and in a
// dry run.
func TestPrune_WithoutHistory(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		released(t, repo, "old")
		ageRelease(t, s, db, "old", 2*time.Hour)
		events := int64(-1)
		dry, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: 1, DryRun: true, EventsDeleted: &events})
		require.NoError(t, err)
		assert.EqualValues(t, 1, dry)
		assert.Zero(t, events)
		events = -1
		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepEvents: 1, EventsDeleted: &events})
		require.NoError(t, err)
		assert.EqualValues(t, 1, deleted)
		assert.Zero(t, events)
	})
}

// On PostgreSQL a row of the event table may hold a generation's
// acquisition and its end: Prune judges it by its end, the newer of the
// two, and counts both events when it deletes it.
func TestPrune_GenerationRowJudgedByItsEnd(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	ctx := context.Background()
	db := historyDB(t, s)
	repo, op := newOperator(t, db)
	l, err := repo.Acquire(ctx, "long", time.Hour)
	require.NoError(t, err)
	// Held for two hours: the acquisition is old, its end is not.
	require.NoError(t, db.Exec("UPDATE job_lease SET acquired_at = acquired_at - interval '2 hours' WHERE target_id = 'long'").Error)
	require.NoError(t, repo.Release(ctx, l))
	released(t, repo, "long") // a newer row, which Prune keeps as the newest
	require.Equal(t, []int64{1, 3}, eventSeqs(t, db, "long"), "each generation one row")

	var events int64
	_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, EventsDeleted: &events})
	require.NoError(t, err)
	assert.Zero(t, events, "events deleted")
	assert.Equal(t, []int64{1, 3}, eventSeqs(t, db, "long"))

	// Both generations ended two hours ago: the first row goes, two events.
	require.NoError(t, db.Exec("UPDATE job_lease_event SET ended_at = ended_at - interval '2 hours', at = at - interval '2 hours'").Error)
	_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, EventsDeleted: &events, DryRun: true})
	require.NoError(t, err)
	assert.EqualValues(t, 2, events, "events a dry run counts")
	_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, EventsDeleted: &events})
	require.NoError(t, err)
	assert.EqualValues(t, 2, events, "events deleted")
	assert.Equal(t, []int64{3}, eventSeqs(t, db, "long"))
}
