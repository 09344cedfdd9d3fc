package gormlease_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// AutoMigrate makes the event table only with WithHistory, named after the
// lease table; again, and several at once, it changes nothing; without
// WithHistory it leaves an existing history alone. The lease table gets
// end_cause and ended_by either way.
func TestAutoMigrate_WithHistoryMakesEventTable(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := s.OpenEmpty(t, nil)
		require.NoError(t, gormlease.AutoMigrate(ctx, db))
		assert.False(t, db.Migrator().HasTable("job_lease_event"), "an event table without WithHistory")
		cols := leaseColumns(t, db)
		assert.Contains(t, cols, "end_cause")
		assert.Contains(t, cols, "ended_by")

		require.NoError(t, migrateAtOnce(db, 4, gormlease.WithHistory()))
		assert.True(t, db.Migrator().HasTable("job_lease_event"))
		require.NoError(t, gormlease.AutoMigrate(ctx, db), "without WithHistory after it")
		assert.True(t, db.Migrator().HasTable("job_lease_event"), "AutoMigrate without WithHistory dropped the history")

		names := gormlease.WithTableNames("hist_lease", "hist_result")
		require.NoError(t, gormlease.AutoMigrate(ctx, db, names, gormlease.WithHistory()))
		assert.True(t, db.Migrator().HasTable("hist_lease_event"))
	})
}

// AutoMigrate refuses a nil option, writing nothing.
func TestAutoMigrate_NilOption(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t).OpenEmpty(t, nil)
	err := gormlease.AutoMigrate(context.Background(), db, gormlease.WithHistory(), nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "option 1 is nil")
	assert.False(t, db.Migrator().HasTable("job_lease"))
}
