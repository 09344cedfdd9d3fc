package gormlease_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// heldBeats is a caller's gorm.ConnPool around a pool that holds the first
// heartbeat statement until the statement's context is done, and then
// passes it on to the database, on that context: the heartbeat is in flight
// when the Run that sent it ends, and the end cancels it.
type heldBeats struct {
	gorm.ConnPool
	pool *sql.DB
	sent chan struct{} // receives once a heartbeat is held
	once sync.Once
}

func (p *heldBeats) hold(ctx context.Context, query string) {
	if strings.Contains(query, "SET updated_at") || strings.Contains(query, "SET j.updated_at") {
		first := false
		p.once.Do(func() { first = true })
		if first {
			close(p.sent)
			<-ctx.Done()
		}
	}
}

func (p *heldBeats) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	p.hold(ctx, query)
	return p.pool.ExecContext(ctx, query, args...)
}

func (p *heldBeats) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	p.hold(ctx, query)
	return p.pool.QueryContext(ctx, query, args...)
}

func (p *heldBeats) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	return p.pool.BeginTx(ctx, opts)
}

func (p *heldBeats) GetDBConn() (*sql.DB, error) { return p.pool, nil }

// Normal outcomes are not errors in the application's log: gorm's loggers
// write a statement reported with an error as an error line. A heartbeat
// cancelled because the work ended, a step on a cancelled context, a
// refused acquire and a lost lease are all reported without one.
func TestLogging_ExpectedOutcomesAreNotErrors(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, direct *gorm.DB) {
		db := s.Open(t, nil) // a pool of this test's own: its heartbeats are its own
		sqlDB, err := db.DB()
		require.NoError(t, err)
		st := &statements{Interface: db.Logger}
		pool := &heldBeats{ConnPool: sqlDB, pool: sqlDB, sent: make(chan struct{})}
		logged := db.Session(&gorm.Session{NewDB: true, Context: context.Background(), Logger: st})
		logged.Statement.ConnPool = pool
		r := newRunner(t, logged, gormlease.WithHeartbeatInterval(50*time.Millisecond),
			gormlease.WithLeaseTimeout(time.Minute), gormlease.WithOperationTimeout(30*time.Second))
		repo := r.Repository()
		ctx := context.Background()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()

		// The work ends while a heartbeat is in flight: Run stops the
		// heartbeat, which cancels it.
		got, err := r.Run(ctx, newTarget(t), func(context.Context) (string, error) {
			recv(t, pool.sent, 10*time.Second, "a heartbeat")
			return "done", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.Equal(t, "done", got)

		// Steps on a cancelled context.
		_, err = r.Run(cancelled, newTarget(t), func(context.Context) (string, error) { return "", nil }, noSave(t))
		require.ErrorIs(t, err, context.Canceled)
		target, l := acquireNew(t, repo, time.Minute)
		require.ErrorIs(t, repo.Heartbeat(cancelled, l), context.Canceled)
		_, err = gormlease.HeartbeatMany(repo, cancelled, []gormlease.Lease{l})
		require.ErrorIs(t, err, context.Canceled)

		// A refused acquire.
		_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		// A lost lease, at every step.
		steal(t, s, direct, target)
		require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost)
		lost, err := gormlease.HeartbeatMany(repo, ctx, []gormlease.Lease{l})
		require.NoError(t, err)
		assert.True(t, lost[l])
		require.ErrorIs(t, repo.CommitIfOwner(ctx, l, func(*gorm.DB) error { return nil }), gormlease.ErrLeaseLost)
		require.ErrorIs(t, repo.Release(ctx, l), gormlease.ErrLeaseLost)

		assert.Empty(t, st.errors(), "normal outcomes logged as errors")
		assert.NotEmpty(t, st.take(), "the steps' statements were not logged at all")
	})
}
