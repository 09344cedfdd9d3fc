package gormlease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Runner.Do through a real PgBouncer with a pool of 2 server connections,
// in transaction pooling with the query modes that name no prepared
// statement and in session pooling with pgx's default: callers on two
// Runners on separate pools, the holder's and the waiters', so that nothing
// in the process wakes the waiters. The work runs once; the waiters wake by
// polling within about one heartbeat interval of the holder's end, and get
// the saved value, or ErrSharedJobFailed when the job failed. The listener
// does not listen through PgBouncer: it keeps no PgBouncer client (and so
// no server connection) while the callers wait, and the row is not marked
// as waited on, so the job's end notifies nobody. Nothing is left behind.
func TestPgBouncer_Do(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	throughPgBouncer(t, s, []pgBouncerCase{
		{"Transaction/exec", "transaction", "exec", 4},
		{"Transaction/simple_protocol", "transaction", "simple_protocol", 4},
		// In session pooling each open connection keeps a server
		// connection: the two pools must not outgrow PgBouncer's.
		{"Session/cache_statement", "session", "", 1},
	}, func(t *testing.T, b *testdb.PgBouncer, tc pgBouncerCase) {
		holderDB, waiterDB := b.Open(t, tc.mode, tc.appConns), b.Open(t, tc.mode, tc.appConns)
		t.Run("Saved", func(t *testing.T) { doThroughPgBouncer(t, s, b, holderDB, waiterDB, nil) })
		t.Run("Failed", func(t *testing.T) {
			doThroughPgBouncer(t, s, b, holderDB, waiterDB, errors.New("upstream API answered 503"))
		})
	})
}

// doThroughPgBouncer calls Do on a new target 4 times on a Runner on
// holderDB and 4 times on one on waiterDB, both pools through b, the
// waiterDB's callers once the job runs; the job fails with jobErr when it
// is not nil. It checks the guarantees of TestPgBouncer_Do. s is the
// database behind b.
func doThroughPgBouncer(t *testing.T, s *testdb.Server, b *testdb.PgBouncer, holderDB, waiterDB *gorm.DB, jobErr error) {
	const (
		callers  = 4 // on each Runner
		interval = 200 * time.Millisecond
		margin   = time.Second // for a loaded machine
	)
	holder := newRunner(t, holderDB, fast(interval, 5*time.Second)...)
	waiter := newRunner(t, waiterDB, fast(interval, 5*time.Second)...)
	target := newTarget(t)
	var runs atomic.Int32
	release := make(chan struct{})
	work := func(ctx context.Context) (string, error) {
		runs.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
		return "report on " + target, jobErr
	}
	first := goDo(t, context.Background(), holder, target, work)
	waitFor(t, 20*time.Second, "the work to start", func() bool { return runs.Load() == 1 })
	var others []<-chan doResult
	for range callers - 1 {
		others = append(others, goDo(t, context.Background(), holder, target, work))
	}
	for range callers {
		others = append(others, goDo(t, context.Background(), waiter, target, work))
	}
	waitFor(t, 20*time.Second, "every caller waiting", func() bool {
		return gormlease.DoCallers(holder, target) == callers && gormlease.DoCallers(waiter, target) == callers &&
			waiters(t, target).Held
	})

	// While they wait, PgBouncer's clients are the pools' connections: the
	// listener has none, and does not listen; the row is not marked as
	// waited on, so the job's end will send no notification.
	appConns := func() int { return openConns(t, holderDB) + openConns(t, waiterDB) }
	waitFor(t, 20*time.Second, "PgBouncer's clients to be the pools' connections", func() bool {
		p := b.Pool(t)
		return p.ClientsActive+p.ClientsWaiting == appConns()
	})
	assert.False(t, listening(t, waiterDB), "the waiters' listener listens through PgBouncer")
	assert.False(t, rowWaitedOn(t, s.DB(t), target), "the row is marked as waited on")
	// The job runs on, its heartbeats going through PgBouncer, until the
	// waiters' polls are as far apart as they get: a heartbeat interval.
	beat := leaseRow(t, s.DB(t), target).UpdatedAt
	waitFor(t, 20*time.Second, "heartbeats for 5 intervals", func() bool {
		return leaseRow(t, s.DB(t), target).UpdatedAt.Sub(beat) >= 5*interval
	})
	p := b.Pool(t)
	t.Logf("while waiting: %d clients of PgBouncer (%d waiting), %d server connections", p.ClientsActive+p.ClientsWaiting, p.ClientsWaiting, p.Servers())

	close(release)
	res := recv(t, first, 20*time.Second, "the first caller's Do")
	ended := time.Now()
	if jobErr != nil {
		require.ErrorIs(t, res.err, jobErr)
	} else {
		require.NoError(t, res.err)
		assert.Equal(t, "report on "+target, res.value)
	}
	assert.False(t, res.shared, "the first caller, which ran the job")
	for i, ch := range others {
		res := recv(t, ch, 20*time.Second, "a waiter's Do")
		if jobErr != nil {
			require.ErrorIs(t, res.err, gormlease.ErrSharedJobFailed, "caller %d", i)
			assert.ErrorContains(t, res.err, jobErr.Error(), "caller %d", i)
		} else {
			require.NoError(t, res.err, "caller %d", i)
			assert.Equal(t, "report on "+target, res.value, "caller %d", i)
		}
		assert.True(t, res.shared, "caller %d", i)
	}
	woke := time.Since(ended)
	t.Logf("the waiters on the other pool woke %v after the job's end (heartbeat interval %v)", woke, interval)
	assert.Less(t, woke, interval+margin, "the waiters did not wake within a heartbeat interval")
	assert.EqualValues(t, 1, runs.Load(), "runs of the work")
	assert.EqualValues(t, 1, leaseRow(t, s.DB(t), target).Generation)

	// Nothing is left behind: no watch, no listener, no connection in use,
	// no client of PgBouncer but the pools' connections.
	assert.Zero(t, waiters(t, target).Waits, "the waits on the target")
	assert.False(t, listening(t, waiterDB), "the listener")
	for name, db := range map[string]*gorm.DB{"holder": holderDB, "waiter": waiterDB} {
		sqlDB, err := db.DB()
		require.NoError(t, err)
		assert.Zero(t, sqlDB.Stats().InUse, "connections in use in the %s's pool", name)
	}
	// database/sql closes the connections beyond its idle limit after
	// their statements, and PgBouncer sees them go a moment later.
	waitFor(t, 20*time.Second, "PgBouncer's clients to be the pools' connections, none waiting", func() bool {
		p := b.Pool(t)
		return p.ClientsWaiting == 0 && p.ClientsActive == appConns()
	})
}

// openConns is the number of connections open in db's pool.
func openConns(t *testing.T, db *gorm.DB) int {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	return sqlDB.Stats().OpenConnections
}
