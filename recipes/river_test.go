package recipes_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
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
	rc := startRiver(t, s, workers, middleware)

	account := newTarget(t)
	for range 2 {
		_, err := rc.client.Insert(ctx, syncArgs{Account: account}, nil)
		require.NoError(t, err)
	}
	recvT(t, started, "the first sync to start")
	snoozed := 0
	for snoozed == 0 {
		e := recvT(t, rc.events, "the second sync to be snoozed")
		require.Equal(t, river.EventKindJobSnoozed, e.Kind, "job %d", e.Job.ID)
		snoozed++
	}
	assert.Positive(t, seen.n.Load())
	close(release)
	completed := 0
	for completed < 2 {
		switch e := recvT(t, rc.events, "both syncs to complete"); e.Kind {
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

// Jobs whose own code calls Run on another target, held or paused, and
// fail with that refusal, returned or panicked with, fail: River records
// their error and, at their MaxAttempts of 1, discards them. None is
// snoozed, for the refusal is not of the job's own target. A job whose own
// target is held is still snoozed, and does not run.
func TestRiverSnoozeOnHeld_JobRefusedInsideFails(t *testing.T) {
	s := testdb.Postgres(t)
	db := s.DB(t)
	ctx := context.Background()
	runner := newRunner[struct{}](t, db)
	ownHeld := nestedArgs{Name: "OwnTargetHeld", Target: newTarget(t)}
	leasetest.Occupy(t, db, ownHeld.Target)
	jobs := append(nestedJobs(t, db), ownHeld)
	runs := map[string]*atomic.Int32{}
	for _, job := range jobs {
		runs[job.Name] = new(atomic.Int32)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[nestedArgs]) error {
		runs[job.Args.Name].Add(1)
		return job.Args.run(ctx, runner)
	}))
	middleware, err := recipes.RiverSnoozeOnHeld(runner, func(job *rivertype.JobRow) string {
		var args nestedArgs
		if json.Unmarshal(job.EncodedArgs, &args) != nil {
			return ""
		}
		return args.Target
	}, 50*time.Millisecond)
	require.NoError(t, err)
	rc := startRiver(t, s, workers, middleware)

	byID := map[int64]nestedArgs{}
	for _, job := range jobs {
		res, err := rc.client.Insert(ctx, job, &river.InsertOpts{MaxAttempts: 1})
		require.NoError(t, err)
		byID[res.Job.ID] = job
	}
	failed, ownSnoozed := 0, false
	for failed < len(jobs)-1 || !ownSnoozed {
		e := recvT(t, rc.events, "the jobs refused inside to fail and the other to be snoozed")
		job := byID[e.Job.ID]
		switch e.Kind {
		case river.EventKindJobSnoozed:
			require.Equal(t, ownHeld.Name, job.Name, "a job refused inside was snoozed")
			ownSnoozed = true
		case river.EventKindJobFailed:
			require.NotEqual(t, ownHeld.Name, job.Name)
			failed++
			assert.Equal(t, rivertype.JobStateDiscarded, e.Job.State, job.Name)
			assert.Equal(t, 1, e.Job.Attempt, job.Name)
			if assert.Len(t, e.Job.Errors, 1, job.Name) {
				assert.Contains(t, e.Job.Errors[0].Error, job.Other, "%s: the job's error", job.Name)
			}
		default:
			t.Fatalf("%s: %s", job.Name, e.Kind)
		}
	}
	for _, job := range jobs[:len(jobs)-1] {
		assert.EqualValues(t, 1, runs[job.Name].Load(), "runs of %s", job.Name)
	}
	assert.Zero(t, runs[ownHeld.Name].Load(), "the job whose target was held ran")
}

// riverClient is a started River client, and the events of its jobs'
// ends: completed, snoozed or failed.
type riverClient struct {
	client *river.Client[pgx.Tx]
	events <-chan *river.Event
}

// startRiver starts a River client on s's database, in the test's schema,
// with River's tables migrated, the workers and the middleware, two
// workers and fast polling; it is stopped when the test ends.
func startRiver(t *testing.T, s *testdb.Server, workers *river.Workers, middleware rivertype.WorkerMiddleware) riverClient {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.DSN) // in the test's schema, by search_path
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
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
	t.Cleanup(unsubscribe)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		assert.NoError(t, client.StopAndCancel(stopCtx))
	})
	return riverClient{client: client, events: events}
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
