package recipes_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/recipes"
)

// syncArgs is a River job that syncs one account with an external API:
// two syncs of one account must not run at once.
type syncArgs struct {
	Account string `json:"account"`
}

func (syncArgs) Kind() string { return "sync_account" }

// syncTarget is the lease target of a sync_account job.
func syncTarget(job *rivertype.JobRow) string {
	var args syncArgs
	if json.Unmarshal(job.EncodedArgs, &args) != nil {
		return ""
	}
	return "sync:" + args.Account
}

// Two syncs of one account, on a River client with two workers: the
// first runs, the second finds its lease held and is snoozed (not failed)
// until the first has ended; then it runs. They never run at once.
func TestRiverSnoozeOnHeld_OneSyncAtATime(t *testing.T) {
	s := testdb.Postgres(t)
	db := s.DB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.DSN) // in the test's schema, by search_path
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)

	seen := newRefusals()
	runner := newRunner[struct{}](t, db, gormlease.WithObserver(seen))
	var flight inFlight
	started, release := make(chan struct{}, 2), make(chan struct{})
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[syncArgs]) error {
		flight.enter()
		defer flight.leave()
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	middleware, err := recipes.RiverSnoozeOnHeld(runner, syncTarget, 50*time.Millisecond)
	require.NoError(t, err)
	_, err = recipes.RiverSnoozeOnHeld(runner, syncTarget, -time.Second)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	client, err := river.NewClient(driver, &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:           workers,
		Middleware:        []rivertype.Middleware{middleware},
		FetchPollInterval: 20 * time.Millisecond,
		FetchCooldown:     10 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
		TestOnly:          true,
	})
	require.NoError(t, err)
	events, unsubscribe := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobSnoozed, river.EventKindJobFailed)
	defer unsubscribe()
	require.NoError(t, client.Start(ctx))
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		require.NoError(t, client.StopAndCancel(stopCtx))
	}()

	account := newTarget(t)
	for range 2 {
		_, err := client.Insert(ctx, syncArgs{Account: account}, nil)
		require.NoError(t, err)
	}
	recvT(t, started, "the first sync to start")
	snoozed := 0
	for snoozed == 0 {
		e := recvT(t, events, "the second sync to be snoozed")
		require.Equal(t, river.EventKindJobSnoozed, e.Kind, "job %d", e.Job.ID)
		snoozed++
	}
	assert.Positive(t, seen.n.Load())
	close(release)
	completed := 0
	for completed < 2 {
		switch e := recvT(t, events, "both syncs to complete"); e.Kind {
		case river.EventKindJobCompleted:
			completed++
			assert.Equal(t, 1, e.Job.Attempt, "a snooze counted as an attempt")
		case river.EventKindJobSnoozed:
			snoozed++
		default:
			t.Fatalf("job %d: %s: %v", e.Job.ID, e.Kind, e.Job.Errors)
		}
	}
	assert.EqualValues(t, 1, flight.most.Load(), "two syncs of one account ran at once")
	t.Logf("the second sync was snoozed %d times", snoozed)
}

// recvT receives from ch, failing the test after 20s.
func recvT[V any](t *testing.T, ch <-chan V, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("waited 20s for %s", what)
		panic("unreachable")
	}
}
