package recipes_test

import (
	"context"
	"encoding/json"
	"os"
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

// Two tasks that sync one account, on an asynq server with two workers:
// the first runs, the second finds the lease held and is retried soon,
// without counting the retry as a failure, until the first has ended; then
// it runs. They never run at once.
func TestAsynqLeaseMiddleware_OneSyncAtATime(t *testing.T) {
	redisOpt := asynq.RedisClientOpt{Addr: redisAddr(t)}
	db := testdb.Postgres(t).DB(t)
	queue := newTarget(t) // a queue of this test's own on the shared server
	inspector := asynq.NewInspector(redisOpt)
	t.Cleanup(func() {
		assert.NoError(t, inspector.DeleteQueue(queue, true))
		inspector.Close()
	})

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
	srv := asynq.NewServer(redisOpt, asynq.Config{
		Concurrency:              2,
		Queues:                   map[string]int{queue: 1},
		IsFailure:                recipes.AsynqIsFailure,
		RetryDelayFunc:           recipes.AsynqRetryDelay(50*time.Millisecond, nil),
		TaskCheckInterval:        20 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		LogLevel:                 asynq.ErrorLevel,
		ShutdownTimeout:          5 * time.Second,
	})
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()
	client := asynq.NewClient(redisOpt)
	defer client.Close()

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
