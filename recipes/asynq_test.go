package recipes_test

import (
	"context"
	"encoding/json"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/recipes"
)

// redisAddr is the Redis server of the asynq tests: GORMLEASE_TEST_REDIS_ADDR
// or the local one.
func redisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("GORMLEASE_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := "DATABASE TESTS NOT RUN: no Redis at " + addr + ": " + err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (CI is set, so this fails instead of skipping)")
		}
		t.Skip(msg)
	}
	return addr
}

// asynqQueue returns the Redis server of the asynq tests, a queue of the
// test's own on it, deleted when the test ends, and an inspector.
func asynqQueue(t *testing.T) (asynq.RedisClientOpt, string, *asynq.Inspector) {
	t.Helper()
	redisOpt := asynq.RedisClientOpt{Addr: redisAddr(t)}
	queue := newTarget(t)
	inspector := asynq.NewInspector(redisOpt)
	t.Cleanup(func() {
		assert.NoError(t, inspector.DeleteQueue(queue, true))
		inspector.Close()
	})
	return redisOpt, queue, inspector
}

// startAsynq starts an asynq server with mux on queue, with cfg's retry
// delay and error handler, AsynqIsFailure, two workers and fast polling,
// and returns a client; both are closed when the test ends.
func startAsynq(t *testing.T, redisOpt asynq.RedisClientOpt, queue string, mux *asynq.ServeMux, cfg asynq.Config) *asynq.Client {
	t.Helper()
	cfg.Concurrency = 2
	cfg.Queues = map[string]int{queue: 1}
	cfg.IsFailure = recipes.AsynqIsFailure
	cfg.TaskCheckInterval = 20 * time.Millisecond
	cfg.DelayedTaskCheckInterval = 50 * time.Millisecond
	cfg.LogLevel = asynq.ErrorLevel
	cfg.ShutdownTimeout = 5 * time.Second
	srv := asynq.NewServer(redisOpt, cfg)
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	client := asynq.NewClient(redisOpt)
	t.Cleanup(func() { assert.NoError(t, client.Close()) })
	return client
}

// Two tasks that sync one account, on an asynq server with two workers:
// the first runs, the second finds the lease held and is retried soon,
// without counting the retry as a failure, until the first has ended; then
// it runs. They never run at once.
func TestAsynqLeaseMiddleware_OneSyncAtATime(t *testing.T) {
	redisOpt, queue, inspector := asynqQueue(t)
	db := testdb.Postgres(t).DB(t)

	seen := newRefusals()
	runner := newRunner[struct{}](t, db, gormlease.WithObserver(seen))
	var flight inFlight
	started, release, done := make(chan struct{}, 2), make(chan struct{}), make(chan string, 2)
	mux := asynq.NewServeMux()
	mux.Use(recipes.AsynqLeaseMiddleware(runner, func(task *asynq.Task) string {
		var args syncArgs
		if json.Unmarshal(task.Payload(), &args) != nil {
			return ""
		}
		return "sync:" + args.Account
	}))
	mux.HandleFunc("sync_account", func(ctx context.Context, task *asynq.Task) error {
		flight.enter()
		defer flight.leave()
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		id, _ := asynq.GetTaskID(ctx)
		done <- id
		return nil
	})
	client := startAsynq(t, redisOpt, queue, mux, asynq.Config{
		RetryDelayFunc: recipes.AsynqRetryDelay(50*time.Millisecond, nil),
	})

	payload, err := json.Marshal(syncArgs{Account: newTarget(t)})
	require.NoError(t, err)
	var ids []string
	for range 2 {
		info, err := client.Enqueue(asynq.NewTask("sync_account", payload), asynq.Queue(queue),
			asynq.MaxRetry(1), asynq.Retention(time.Minute))
		require.NoError(t, err)
		ids = append(ids, info.ID)
	}
	recvT(t, started, "the first sync to start")
	// The second is refused more than its MaxRetry of 1 allows failures.
	seen.waitFor(t, 3)
	close(release)
	recvT(t, done, "a sync to end")
	recvT(t, done, "the other sync to end")
	assert.EqualValues(t, 1, flight.most.Load(), "two syncs of one account ran at once")
	for _, id := range ids {
		info, err := inspector.GetTaskInfo(queue, id)
		require.NoError(t, err)
		assert.Zero(t, info.Retried, "task %s: a refusal counted as a failure", id)
	}
	t.Logf("%d refusals", seen.n.Load())
}

// Tasks whose handler calls Run on another target, held or paused, and
// fails with that refusal, returned or panicked with, fail: AsynqIsFailure
// says so, AsynqRetryDelay retries them as other failures, their retries
// count, and at their MaxRetry of 1 they are archived after two runs. So
// is a task run without a lease (its target "") that returns such a
// refusal.
func TestAsynqLeaseMiddleware_TaskRefusedInsideFails(t *testing.T) {
	redisOpt, queue, inspector := asynqQueue(t)
	db := testdb.Postgres(t).DB(t)
	runner := newRunner[struct{}](t, db)
	jobs := nestedJobs(t, db)
	noLease := jobs[0] // returns the refusal
	noLease.Name, noLease.Target = "NoLease", ""
	jobs = append(jobs, noLease)
	runs := map[string]*atomic.Int32{}
	for _, job := range jobs {
		runs[job.Name] = new(atomic.Int32)
	}
	argsOf := func(task *asynq.Task) (args nestedArgs) { // on asynq's goroutines
		assert.NoError(t, json.Unmarshal(task.Payload(), &args))
		return args
	}
	mux := asynq.NewServeMux()
	mux.Use(recipes.AsynqLeaseMiddleware(runner, func(task *asynq.Task) string { return argsOf(task).Target }))
	mux.HandleFunc(nestedArgs{}.Kind(), func(ctx context.Context, task *asynq.Task) error {
		args := argsOf(task)
		runs[args.Name].Add(1)
		return args.run(ctx, runner)
	})
	type failure struct {
		name string
		err  error
	}
	failures := make(chan failure, 4*len(jobs))
	client := startAsynq(t, redisOpt, queue, mux, asynq.Config{
		RetryDelayFunc: recipes.AsynqRetryDelay(time.Hour, func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond }),
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, task *asynq.Task, err error) {
			failures <- failure{argsOf(task).Name, err}
		}),
	})

	ids := map[string]string{}
	for _, job := range jobs {
		payload, err := json.Marshal(job)
		require.NoError(t, err)
		info, err := client.Enqueue(asynq.NewTask(job.Kind(), payload), asynq.Queue(queue),
			asynq.MaxRetry(1), asynq.Retention(time.Minute))
		require.NoError(t, err)
		ids[job.Name] = info.ID
	}
	for range 2 * len(jobs) {
		f := recvT(t, failures, "the tasks' failures")
		require.True(t, recipes.AsynqIsFailure(f.err), "%s: a refusal met inside was not a failure: %v", f.name, f.err)
	}
	for _, job := range jobs {
		info := waitTaskState(t, inspector, queue, ids[job.Name], asynq.TaskStateArchived)
		assert.Equal(t, 1, info.Retried, "%s: retries", job.Name)
		assert.Contains(t, info.LastErr, job.Other, "%s: the task's error", job.Name)
		assert.EqualValues(t, 2, runs[job.Name].Load(), "runs of %s", job.Name)
	}
}

// waitTaskState waits until the task id of queue is in state, and returns
// its info, failing the test after 20s.
func waitTaskState(t *testing.T, inspector *asynq.Inspector, queue, id string, state asynq.TaskState) *asynq.TaskInfo {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		info, err := inspector.GetTaskInfo(queue, id)
		require.NoError(t, err)
		if info.State == state {
			return info
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("task %s: %v after 20s, want %v", id, info.State, state)
		}
	}
}
