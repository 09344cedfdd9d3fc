package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// With gorm's prepared statements (gorm.Config{PrepareStmt: true}), a step
// whose statement cannot be prepared, because its context is done before
// the database is reached, returns that error. (gorm's pool answers a
// QueryRowContext it could not prepare with an empty *sql.Row, whose Scan
// panics inside database/sql.) Every step runs on a fresh pool, so that none
// of its statements is prepared yet.
func TestPrepareStmt_DoneContextIsAnError(t *testing.T) {
	t.Parallel()
	dones := map[string]func() (context.Context, context.CancelFunc){
		"Cancelled": func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		},
		"DeadlinePassed": func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		},
	}
	eachDB(t, func(t *testing.T, s *testdb.Server, shared *gorm.DB) {
		for name, done := range dones {
			t.Run(name, func(t *testing.T) {
				db := s.Open(t, nil).Session(&gorm.Session{PrepareStmt: true})
				repo := newRepository(t, db)
				r := newRunner(t, db)
				// The leases come from the shared pool, which prepares nothing.
				_, held := acquireNew(t, newRepository(t, shared), time.Minute)
				work := func(context.Context) (string, error) { return "x", nil }
				steps := []struct {
					name string
					call func(ctx context.Context) error
				}{
					{"AutoMigrate", func(ctx context.Context) error { return gormlease.AutoMigrate(ctx, db) }},
					{"Acquire", func(ctx context.Context) error {
						_, err := repo.Acquire(ctx, newTarget(t), time.Minute)
						return err
					}},
					{"Heartbeat", func(ctx context.Context) error { return repo.Heartbeat(ctx, held) }},
					{"HeartbeatMany", func(ctx context.Context) error {
						_, err := gormlease.HeartbeatMany(repo, ctx, []gormlease.Lease{held})
						return err
					}},
					{"CommitIfOwner", func(ctx context.Context) error {
						return repo.CommitIfOwner(ctx, held, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, "x") })
					}},
					{"Release", func(ctx context.Context) error { return repo.Release(ctx, held) }},
					{"Get", func(ctx context.Context) error {
						_, _, err := admin.New(repo).Get(ctx, held.TargetID)
						return err
					}},
					{"LoadJSON", func(ctx context.Context) error {
						_, _, err := gormlease.LoadJSON[string](ctx, db, held.TargetID)
						return err
					}},
					{"Run", func(ctx context.Context) error {
						_, err := r.Run(ctx, newTarget(t), work, gormlease.SaveJSON[string])
						return err
					}},
				}
				for _, step := range steps {
					ctx, cancel := done()
					var err error
					require.NotPanics(t, func() { err = step.call(ctx) }, step.name)
					assert.ErrorIs(t, err, ctx.Err(), step.name)
					cancel()
				}
				// The lease was never touched: none of the steps reached it.
				assert.Equal(t, held.Token, leaseRow(t, shared, held.TargetID).LeaseToken)
				assert.Nil(t, leaseRow(t, shared, held.TargetID).ReleasedAt)
			})
		}
	})
}
