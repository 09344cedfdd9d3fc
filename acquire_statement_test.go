package gormlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// ownTables returns the name of a lease table that only the calling test
// uses, made on s, and the option that names it and its result table.
func ownTables(t *testing.T, s *testdb.Server, prefix string) (string, gormlease.TableOption) {
	t.Helper()
	lease := fmt.Sprintf("%s_%d_%s", prefix, targetSeq.Add(1), uuid.NewString()[:8])
	tables := gormlease.WithTableNames(lease, lease+"_result")
	require.NoError(t, gormlease.AutoMigrate(context.Background(), s.DB(t), tables))
	return lease, tables
}

// A refused acquire writes nothing on PostgreSQL: after many of them on a
// live lease, the row is as its holder's acquire wrote it, with no lock on it
// (xmin and xmax unchanged).
func TestAcquire_RefusedWritesNothing(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	db := s.DB(t)
	ctx := context.Background()
	lease, tables := ownTables(t, s, "refused")
	repo, err := gormlease.NewRepository(db, tables)
	require.NoError(t, err)
	target := newTarget(t)
	_, err = repo.Acquire(ctx, target, time.Minute)
	require.NoError(t, err)
	row := func() (xmin, xmax string) {
		t.Helper()
		require.NoError(t, db.Raw("SELECT xmin::text, xmax::text FROM "+lease+" WHERE target_id = ?", target).Row().Scan(&xmin, &xmax))
		return xmin, xmax
	}
	xmin, xmax := row()
	for range 20 {
		_, err := repo.Acquire(ctx, target, time.Minute)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	}
	gotMin, gotMax := row()
	assert.Equal(t, xmin, gotMin, "the row's last writer")
	assert.Equal(t, xmax, gotMax, "the row's last locker")
}

// On PostgreSQL the acquire of a target whose row is free rewrites the row
// in place: one HOT update, and no row lock written before it (as INSERT ...
// ON CONFLICT DO UPDATE writes one); and over acquire and release cycles at
// least 95% of the table's updates are HOT (no index entry written). It runs
// on a cluster of its own: a transaction of another session would hold back
// the pruning of dead row versions, which a HOT update needs room from on the
// row's page, and the write-ahead log is read with pg_walinspect.
func TestAcquire_TakeoverIsOneHOTUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testdb.NewCluster(t)
	admin := c.Open(t)
	const lease = "hot_lease"
	tables := gormlease.WithTableNames(lease, "hot_result")
	require.NoError(t, gormlease.AutoMigrate(ctx, admin, tables))
	require.NoError(t, admin.Exec("CREATE EXTENSION IF NOT EXISTS pg_walinspect").Error)

	t.Run("OneRecordPerTakeover", func(t *testing.T) {
		repo, err := gormlease.NewRepository(admin, tables)
		require.NoError(t, err)
		target := newTarget(t)
		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		require.NoError(t, repo.Release(ctx, l))
		var start string
		require.NoError(t, admin.Raw("SELECT pg_current_wal_insert_lsn()::text").Row().Scan(&start))
		_, err = repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		var records []string
		require.NoError(t, admin.Raw(`SELECT record_type FROM pg_get_wal_records_info(CAST(? AS pg_lsn), pg_current_wal_flush_lsn())
			WHERE resource_manager LIKE 'Heap%' AND block_ref LIKE '%/' || pg_relation_filenode(CAST(? AS regclass)) || ' %'
			ORDER BY start_lsn`, start, lease).Scan(&records).Error)
		assert.Equal(t, []string{"HOT_UPDATE"}, records, "the takeover's WAL records on the lease table")
	})

	t.Run("HOTUpdates", func(t *testing.T) {
		const targets, cycles = 10, 200
		db := c.Open(t)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		repo, err := gormlease.NewRepository(db, tables)
		require.NoError(t, err)
		var hot0, upd0 int64
		stat := func(hot, upd *int64) {
			t.Helper()
			require.NoError(t, admin.Raw(`SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables
				WHERE relid = CAST(? AS regclass)`, lease).Row().Scan(hot, upd))
		}
		stat(&hot0, &upd0)
		prefix := newTarget(t)
		for i := range cycles {
			l, err := repo.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i%targets), time.Minute)
			require.NoError(t, err)
			require.NoError(t, repo.Release(ctx, l))
		}
		// A backend reports its table statistics when it exits.
		require.NoError(t, sqlDB.Close())
		var hot, upd int64
		waitFor(t, 20*time.Second, "the updates in pg_stat_user_tables", func() bool {
			stat(&hot, &upd)
			return upd-upd0 >= 2*cycles-targets
		})
		hot, upd = hot-hot0, upd-upd0
		assert.GreaterOrEqual(t, float64(hot)/float64(upd), 0.95, "HOT updates: %d of %d", hot, upd)
	})
}
