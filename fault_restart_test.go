package gormlease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: the database crashes and restarts in the middle of jobs, on a
// cluster of the test's own. What was committed before the crash survives;
// Runs whose work spans the restart (shorter than the trust window) ride
// through it and save once; Runs whose work ends while the database is down
// save nothing and say so; and every target can be run again afterwards.
func TestFault_DatabaseRestart(t *testing.T) {
	t.Parallel()
	c := testdb.NewCluster(t)
	db := c.Open(t)
	// A trust window (18 s) that outlasts the Runs that fail while the
	// database is down and its restart, also on a loaded machine (a trust
	// window of 9 s once ran out there); an operation timeout in which 16
	// Runs acquire at once under load (1 s once was not).
	r, err := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(100*time.Millisecond),
		gormlease.WithLeaseTimeout(20*time.Second),
		gormlease.WithOperationTimeout(3*time.Second))
	require.NoError(t, err)
	ctx := context.Background()
	target := func(group string, i int) string { return fmt.Sprintf("%s-%d", group, i) }

	// Saved before the crash: must survive it.
	const n = 8
	for i := range n {
		_, err := r.Run(ctx, target("before", i), func(context.Context) (string, error) {
			return "before", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
	}

	down, back := make(chan struct{}), make(chan struct{})
	var started sync.WaitGroup
	type outcome struct {
		target string
		gen    int64
		err    error
	}
	results := make(chan outcome, 2*n)
	launch := func(group string, i int, until <-chan struct{}) {
		started.Add(1)
		go func() {
			// Done when the work starts, or when the Run ends without it
			// (which the check after started.Wait reports), never twice.
			var once sync.Once
			var gen int64
			_, err := r.Run(ctx, target(group, i), func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				gen = l.Generation
				once.Do(started.Done)
				<-until
				return group, context.Cause(ctx)
			}, gormlease.SaveJSON[string])
			results <- outcome{target(group, i), gen, err}
			once.Do(started.Done)
		}()
	}
	for i := range n {
		launch("across", i, back) // work ends after the restart
		launch("during", i, down) // work ends while the database is down
	}
	started.Wait()
	select {
	case o := <-results:
		t.Fatalf("%s: the Run ended before the crash: %v", o.target, o.err)
	default:
	}

	c.Crash(t)
	close(down)
	var failed []outcome
	for range n {
		o := recv(t, results, 20*time.Second, "the Runs that ended while the database was down")
		require.Error(t, o.err, "%s: a Run saved while the database was down", o.target)
		failed = append(failed, o)
	}
	c.Start(t)
	close(back)
	for range n {
		o := recv(t, results, 20*time.Second, "the Runs across the restart")
		require.NoError(t, o.err, "%s: a Run across the restart failed", o.target)
		got, row, err := gormlease.LoadJSON[string](ctx, db, o.target)
		require.NoError(t, err)
		assert.Equal(t, "across", got)
		assert.Equal(t, o.gen, row.Generation)
	}
	for i := range n {
		got, _, err := gormlease.LoadJSON[string](ctx, db, target("before", i))
		require.NoError(t, err, "a result committed before the crash was lost")
		assert.Equal(t, "before", got)
	}
	for _, o := range failed {
		_, _, err := gormlease.LoadJSON[string](ctx, db, o.target)
		require.ErrorIs(t, err, gormlease.ErrNoResult, "%s: saved while the database was down", o.target)
		// The failed Run could not release: its lease stays until it
		// expires. Age it, and the target runs again.
		require.NoError(t, db.Exec("UPDATE job_lease SET updated_at = updated_at - interval '1 hour' WHERE target_id = ?",
			o.target).Error)
		_, err = r.Run(ctx, o.target, func(context.Context) (string, error) { return "again", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err, "%s: not runnable after the restart", o.target)
	}
}
