package postgres_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The statements sent as simple queries on pgx's connection (the batched
// heartbeat, the settling read of a fenced commit) report a missing table
// as every other statement does: an error that wraps ErrMissingTables and
// names the table, so that nothing takes it for a fault that waiting cures.
func TestSimpleQueries_ReportMissingTables(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t).OpenEmpty(t, nil)
	b := postgres.New(backend.DefaultTables)
	ctx := context.Background()

	_, err := b.HeartbeatBatch(ctx, db, []backend.Lease{{TargetID: "missing", Token: uuid.New(), Generation: 1}})
	require.ErrorIs(t, err, backend.ErrMissingTables, "heartbeat: %v", err)
	assert.Contains(t, err.Error(), `table "job_lease"`)
	assert.Contains(t, err.Error(), backend.MigrateAdvice)

	_, _, err = b.ReadSaved(ctx, db, "missing")
	require.ErrorIs(t, err, backend.ErrMissingTables, "read saved: %v", err)
	assert.Contains(t, err.Error(), backend.MigrateAdvice)
}
