package admin_test

import (
	"context"
	"sync"
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

// emptyDB opens a database of its own with the gormlease tables: Prune
// deletes whatever is old enough, and must not reach other tests' rows.
func emptyDB(t *testing.T, s *testdb.Server) *gorm.DB {
	t.Helper()
	db := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db))
	return db
}

// released acquires target with timeout and releases it, at once.
func released(t *testing.T, repo *gormlease.Repository, target string) gormlease.Lease {
	t.Helper()
	l, err := repo.Acquire(context.Background(), target, time.Minute)
	require.NoError(t, err)
	require.NoError(t, repo.Release(context.Background(), l))
	return l
}

// ageRelease sets target's release d back on the database's clock.
func ageRelease(t *testing.T, s *testdb.Server, db *gorm.DB, target string, d time.Duration) {
	t.Helper()
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("released_at", s.Ago(d))
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
}

// Prune deletes the rows released, or expired by the timeout they
// recorded, more than olderThan ago, with their results, and nothing else:
// not a live lease, not one released or expired more recently. A dry run
// first counts those rows, and deletes nothing.
func TestPrune_DeletesOnlyRowsEndedLongAgo(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		_, err := repo.Acquire(ctx, "live", time.Minute)
		require.NoError(t, err)
		testkit.Age(t, s, db, "live", 50*time.Second) // live, but heartbeat long ago
		r := testkit.NewRunner(t, db)
		_, err = r.Run(ctx, "old-released", func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
		require.NoError(t, err)
		ageRelease(t, s, db, "old-released", 2*time.Hour)
		released(t, repo, "new-released")
		_, err = repo.Acquire(ctx, "old-expired", time.Minute)
		require.NoError(t, err)
		testkit.Age(t, s, db, "old-expired", 2*time.Hour)
		_, err = repo.Acquire(ctx, "new-expired", time.Minute)
		require.NoError(t, err)
		testkit.Age(t, s, db, "new-expired", time.Hour+30*time.Second) // expired 59.5 min ago
		_, err = repo.Acquire(ctx, "long-timeout", 3*time.Hour)
		require.NoError(t, err)
		testkit.Age(t, s, db, "long-timeout", 2*time.Hour) // live: its own timeout is 3 h

		var progress []int64
		dry, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, DryRun: true,
			Progress: func(n int64) { progress = append(progress, n) }})
		require.NoError(t, err)
		assert.EqualValues(t, 2, dry, "a dry run counts the rows that a prune deletes")
		assert.Empty(t, progress, "a dry run's progress")
		counts, err := op.Count(ctx, "")
		require.NoError(t, err)
		assert.EqualValues(t, 6, counts.Total, "rows after a dry run")
		_, _, err = gormlease.LoadJSON[string](ctx, db, "old-released")
		require.NoError(t, err, "the result after a dry run")

		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour})
		require.NoError(t, err)
		assert.Equal(t, dry, deleted, "what the dry run counted")
		rest, err := op.List(ctx, admin.ListOptions{})
		require.NoError(t, err)
		var ids []string
		for _, li := range rest {
			ids = append(ids, li.TargetID)
		}
		assert.Equal(t, []string{"live", "long-timeout", "new-expired", "new-released"}, ids)
		_, _, err = gormlease.LoadJSON[string](ctx, db, "old-released")
		require.ErrorIs(t, err, gormlease.ErrNoResult, "the pruned target's result")

		deleted, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour})
		require.NoError(t, err)
		assert.Zero(t, deleted, "a second Prune")
		dry, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, DryRun: true})
		require.NoError(t, err)
		assert.Zero(t, dry, "a dry run after the Prune")
	})
}

// After a target's row is pruned, its next acquisition gets a generation
// above every one it had; so does a target never acquired, since the
// floor is one for the table. KeepResults keeps the result rows.
func TestPrune_GenerationKeepsIncreasing(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		r := testkit.NewRunner(t, db)
		for range 3 {
			_, err := r.Run(ctx, "t", func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
			require.NoError(t, err)
		}
		ageRelease(t, s, db, "t", 2*time.Hour)
		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, KeepResults: true})
		require.NoError(t, err)
		require.EqualValues(t, 1, deleted)
		_, _, err = gormlease.LoadJSON[string](ctx, db, "t")
		require.NoError(t, err, "KeepResults kept the result")

		l, err := repo.Acquire(ctx, "t", time.Minute)
		require.NoError(t, err)
		assert.EqualValues(t, 4, l.Generation, "after the prune")
		l, err = repo.Acquire(ctx, "never", time.Minute)
		require.NoError(t, err)
		assert.EqualValues(t, 4, l.Generation, "a target never acquired starts above the floor")
	})
}

// Prune stops between batches when its context is done, and returns the
// rows deleted so far with the context's error.
func TestPrune_StopsOnContextDone(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		for _, target := range []string{"a", "b", "c", "d", "e"} {
			released(t, repo, target)
			ageRelease(t, s, db, target, 2*time.Hour)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var progress []int64
		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, BatchSize: 2,
			Progress: func(n int64) { progress = append(progress, n); cancel() }})
		require.ErrorIs(t, err, context.Canceled)
		assert.EqualValues(t, 2, deleted)
		assert.Equal(t, []int64{2}, progress)
		deleted, err = op.Prune(context.Background(), admin.PruneOptions{OlderThan: time.Hour, BatchSize: 2,
			Progress: func(n int64) { progress = append(progress, n) }})
		require.NoError(t, err)
		assert.EqualValues(t, 3, deleted)
		assert.Equal(t, []int64{2, 2, 3}, progress)
	})
}

// Prune refuses an age of zero or under a minute and a bad batch size,
// naming the field at fault.
func TestPrune_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, op := newOperator(t, testdb.SQLite(t).DB(t))
	_, err := op.Prune(context.Background(), admin.PruneOptions{})
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "PruneOptions.OlderThan is 0s: give the age")
	_, err = op.Prune(context.Background(), admin.PruneOptions{OlderThan: time.Second})
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "PruneOptions.OlderThan 1s is less than the minimum, 1m0s")
	for _, n := range []int{-1, 10001} {
		_, err = op.Prune(context.Background(), admin.PruneOptions{OlderThan: time.Hour, BatchSize: n})
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "batch size %d", n)
		assert.Contains(t, err.Error(), "PruneOptions.BatchSize")
	}
}

// Prunes, acquires and releases racing on the same rows: a row acquired
// while a Prune runs is never deleted (its holder can still heartbeat and
// save), every generation is above the target's previous one, and two
// Prunes at once delete each row once.
func TestPrune_RacesWithAcquireAndAnotherPrune(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		const n = 60
		targets := make([]string, n)
		before := map[string]int64{}
		for i := range targets {
			targets[i] = string(rune('A'+i/26)) + string(rune('a'+i%26))
			l := released(t, repo, targets[i])
			released(t, repo, targets[i])
			before[targets[i]] = l.Generation + 1
		}
		require.NoError(t, db.Model(&gormlease.JobLease{}).Where("1 = 1").Update("released_at", s.Ago(2*time.Hour)).Error)

		var wg sync.WaitGroup
		pruned := make(chan int64, 2)
		for range 2 {
			wg.Go(func() {
				d, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour, BatchSize: 7})
				assert.NoError(t, err)
				pruned <- d
			})
		}
		leases := make(chan gormlease.Lease, n)
		for i := range 2 {
			wg.Go(func() {
				for j := i; j < n; j += 2 {
					l, err := repo.Acquire(ctx, targets[j], time.Minute)
					if assert.NoError(t, err) {
						leases <- l
					}
				}
			})
		}
		wg.Wait()
		close(pruned)
		close(leases)
		var total int64
		for d := range pruned {
			total += d
		}
		for l := range leases {
			assert.Greater(t, l.Generation, before[l.TargetID], l.TargetID)
			// Its row is there, with its token: the holder goes on.
			require.NoError(t, repo.Heartbeat(ctx, l), l.TargetID)
			require.NoError(t, repo.CommitIfOwner(ctx, l, func(*gorm.DB) error { return nil }), l.TargetID)
		}
		rest, err := op.List(ctx, admin.ListOptions{Limit: 10000})
		require.NoError(t, err)
		assert.Len(t, rest, n, "every target acquired has its row")
		assert.LessOrEqual(t, total, int64(n))
	})
}

// A caller of Do that waits for a lease whose holder died finds the row
// gone when Prune deleted it meanwhile (the row's own timeout ran out
// long ago, though the caller's longer timeout still counted it live):
// it reads it as a target never acquired and runs the work itself, under
// a generation above the dead holder's.
func TestPrune_DoWaiterRunsWorkWhenRowIsPruned(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		// A target of this subtest's own: the watch hook looks at every
		// database's waiters.
		target := testkit.NewTarget(t)
		dead, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		// The waiter's first poll after it starts to wait comes 6s later
		// at the soonest (0.4 of a quarter of its interval): until then it
		// waits on the row as it read it, live.
		r := testkit.NewRunner(t, db, gormlease.WithHeartbeatInterval(time.Minute), gormlease.WithLeaseTimeout(3*time.Hour))
		type outcome struct {
			v      string
			shared bool
			err    error
		}
		done := make(chan outcome, 1)
		gens := make(chan int64, 1)
		go func() {
			v, shared, err := r.Do(ctx, target, func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				gens <- l.Generation
				return "fresh", nil
			}, gormlease.SaveJSON[string], func(tx *gorm.DB) (string, error) {
				v, _, err := gormlease.LoadJSON[string](tx.Statement.Context, tx, target)
				return v, err
			})
			done <- outcome{v, shared, err}
		}()
		testkit.WaitFor(t, 10*time.Second, "the caller to wait for the dead holder", func() bool { return op.Waiters(target).Held })
		testkit.Age(t, s, db, target, time.Hour) // expired 59 min ago by its own timeout
		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: 30 * time.Minute})
		require.NoError(t, err)
		require.EqualValues(t, 1, deleted)
		got := testkit.Recv(t, done, 30*time.Second, "Do")
		require.NoError(t, got.err)
		assert.Equal(t, "fresh", got.v)
		assert.False(t, got.shared)
		assert.Greater(t, testkit.Recv(t, gens, time.Second, "the generation"), dead.Generation)
	})
}
