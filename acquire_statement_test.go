package gormlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
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
// (xmin and xmax unchanged). That holds for Acquire, whose INSERT answers
// the lease that refused it, and for AcquireFrom, whose UPDATE does.
func TestAcquire_RefusedWritesNothing(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	db := s.DB(t)
	ctx := context.Background()
	lease, tables := ownTables(t, s, "refused")
	repo, err := gormlease.NewRepository(db, tables, gormlease.WithHolder("pod-a"))
	require.NoError(t, err)
	target := newTarget(t)
	l, err := repo.Acquire(ctx, target, time.Minute)
	require.NoError(t, err)
	row := func() (xmin, xmax string) {
		t.Helper()
		require.NoError(t, db.Raw("SELECT xmin::text, xmax::text FROM "+lease+" WHERE target_id = ?", target).Row().Scan(&xmin, &xmax))
		return xmin, xmax
	}
	xmin, xmax := row()
	for range 20 {
		_, err := repo.Acquire(ctx, target, time.Minute)
		requireHeld(t, err, target, "pod-a", l.Generation, time.Minute)
		_, err = gormlease.AcquireFrom(repo, ctx, target, time.Minute, l.Generation)
		requireHeld(t, err, target, "pod-a", l.Generation, time.Minute)
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

// mariaDB returns the MariaDB server, or skips t where the MySQL server is
// MySQL: the acquire in one statement needs MariaDB's RETURNING.
func mariaDB(t testing.TB) *testdb.Server {
	t.Helper()
	s := testdb.MySQL(t)
	if flavour(s) != "mariadb" {
		t.Skipf("the server is %s, not MariaDB", s.Version)
	}
	return s
}

// On MariaDB every outcome of an acquire is one statement, as on
// PostgreSQL: a target's first acquire, the takeover of a released or an
// expired lease, and the refusal by a live lease or a pause, which says
// who holds the lease, or why the target is paused. A target that the
// Repository saw refused is read first, without a lock: a refusal again is
// that read, and a takeover the read and the acquire. A Repository that
// takes the server for MySQL (no RETURNING) runs two statements for a first
// acquire and a first refusal.
func TestAcquire_MariaDBOneStatementPerOutcome(t *testing.T) {
	t.Parallel()
	s := mariaDB(t)
	db := s.DB(t)
	ctx := context.Background()
	const timeout = time.Minute
	for _, tc := range []struct {
		name  string
		mysql bool // the Repository takes the server for MySQL
		want  int  // statements of a first acquire and of a first refusal
	}{{"MariaDB", false, 1}, {"MySQL", true, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			holder := holderRepository(t, db, "pod-a")
			on := db
			if tc.mysql {
				on = asMySQL(t, db)
			}
			rec, st := recording(on)
			other, err := gormlease.NewRepository(rec, gormlease.WithHolder("pod-b"))
			require.NoError(t, err)

			target := newTarget(t)
			first, err := other.Acquire(ctx, target, timeout)
			require.NoError(t, err)
			assert.Len(t, steps(st), tc.want, "statements of a first acquire")
			require.NoError(t, other.Release(ctx, first))
			st.take()

			l, err := holder.Acquire(ctx, target, timeout)
			require.NoError(t, err)
			assert.Equal(t, first.Generation+1, l.Generation)
			_, err = other.Acquire(ctx, target, timeout)
			requireHeld(t, err, target, "pod-a", l.Generation, timeout)
			assert.Len(t, steps(st), tc.want, "statements of a first refusal")
			_, err = other.Acquire(ctx, target, timeout)
			requireHeld(t, err, target, "pod-a", l.Generation, timeout)
			assert.Len(t, steps(st), 1, "statements of a refusal again")

			// The holder's lease expires. A Repository that saw the target
			// refused reads it first (without a lock, as contenders do),
			// then takes it over: two statements everywhere.
			age(t, s, db, target, 2*timeout)
			taken, err := other.Acquire(ctx, target, timeout)
			require.NoError(t, err)
			assert.Equal(t, l.Generation+1, taken.Generation)
			assert.Len(t, steps(st), 2, "statements of the takeover of an expired lease seen refused")
			row := leaseRow(t, db, target)
			assert.Equal(t, taken.Token, row.LeaseToken)
			assert.Equal(t, "pod-b", row.Holder)
			require.NotNil(t, row.TimeoutMS)
			assert.EqualValues(t, timeout.Milliseconds(), *row.TimeoutMS)

			// One that did not takes it over in one statement.
			age(t, s, db, target, 2*timeout)
			third, err := gormlease.NewRepository(rec, gormlease.WithHolder("pod-c"))
			require.NoError(t, err)
			thirds, err := third.Acquire(ctx, target, 2*timeout)
			require.NoError(t, err)
			assert.Equal(t, taken.Generation+1, thirds.Generation)
			assert.Len(t, steps(st), 1, "statements of the takeover of an expired lease")
			row = leaseRow(t, db, target)
			assert.Equal(t, "pod-c", row.Holder)
			require.NotNil(t, row.TimeoutMS)
			assert.EqualValues(t, 2*timeout.Milliseconds(), *row.TimeoutMS)
			taken = thirds
			other = third

			// Released: one statement takes it over, everywhere.
			require.NoError(t, other.Release(ctx, taken))
			st.take()
			again, err := other.Acquire(ctx, target, timeout)
			require.NoError(t, err)
			assert.Equal(t, taken.Generation+1, again.Generation)
			assert.Len(t, steps(st), 1, "statements of the takeover of a released lease")

			// Paused, and held: the refusal says both.
			require.NoError(t, admin.New(holder).Pause(ctx, target, "maintenance"))
			st.take()
			_, err = other.Acquire(ctx, target, timeout)
			var paused *gormlease.PausedError
			require.ErrorAs(t, err, &paused)
			assert.Equal(t, "maintenance", paused.Reason)
			assert.LessOrEqual(t, len(steps(st)), tc.want, "statements of a refusal by a pause")
			assert.Equal(t, again.Token, leaseRow(t, db, target).LeaseToken, "the pause was taken over")
		})
	}
}

// sessionHandlers reads the handler counters of the session that db, a
// pool of one connection, runs on: the rows its statements asked InnoDB to
// update, to write (insert) and to delete.
func sessionHandlers(t *testing.T, db *gorm.DB) (update, write, del int64) {
	t.Helper()
	rows, err := db.Raw(`SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.SESSION_STATUS
		WHERE VARIABLE_NAME IN ('HANDLER_UPDATE', 'HANDLER_WRITE', 'HANDLER_DELETE')`).Rows()
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		require.NoError(t, rows.Scan(&name, &v))
		switch name {
		case "HANDLER_UPDATE":
			update = v
		case "HANDLER_WRITE":
			write = v
		case "HANDLER_DELETE":
			del = v
		}
	}
	require.NoError(t, rows.Err())
	return update, write, del
}

// On MariaDB a refused acquire writes nothing: the session that ran many
// of them, refused by a live lease or by a pause, asked InnoDB to update no
// row (Handler_update, which counts the rows that a statement changed, not
// those it found unchanged), and the row is as it was. A takeover is one
// row update, and a first acquire one row written. The acquires run on a
// pool of one connection, whose session counters are read.
func TestAcquire_MariaDBRefusalWritesNothing(t *testing.T) {
	t.Parallel()
	s := mariaDB(t)
	db := s.Open(t, nil)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	shared := s.DB(t)
	ctx := context.Background()
	const timeout = time.Minute
	repo := holderRepository(t, db, "pod-b")
	holder := holderRepository(t, shared, "pod-a")
	_, err = repo.Acquire(ctx, newTarget(t), timeout) // the Repository's probe of its server
	require.NoError(t, err)

	held, l := acquireNew(t, holder, timeout)
	paused := newTarget(t)
	require.NoError(t, admin.New(holder).Pause(ctx, paused, "maintenance"))
	heldRow, pausedRow := leaseRow(t, shared, held), leaseRow(t, shared, paused)
	upd0, write0, del0 := sessionHandlers(t, db)
	for range 20 {
		_, err := repo.Acquire(ctx, held, timeout)
		requireHeld(t, err, held, "pod-a", l.Generation, timeout)
		_, err = repo.Acquire(ctx, paused, timeout)
		require.ErrorIs(t, err, gormlease.ErrPaused)
	}
	upd, write, del := sessionHandlers(t, db)
	assert.Zero(t, upd-upd0, "rows updated by 40 refusals")
	assert.Zero(t, del-del0, "rows deleted by 40 refusals")
	assert.LessOrEqual(t, write-write0, int64(40), "rows written by 40 refusals: one attempt each, that found the key")
	assert.Equal(t, heldRow, leaseRow(t, shared, held), "the held row changed")
	assert.Equal(t, pausedRow, leaseRow(t, shared, paused), "the paused row changed")

	age(t, s, shared, held, 2*timeout)
	upd0, _, del0 = sessionHandlers(t, db)
	taken, err := repo.Acquire(ctx, held, timeout)
	require.NoError(t, err)
	upd, _, del = sessionHandlers(t, db)
	assert.EqualValues(t, 1, upd-upd0, "rows updated by a takeover")
	assert.Zero(t, del-del0, "rows deleted by a takeover")
	assert.Equal(t, l.Generation+1, taken.Generation)

	upd0, write0, _ = sessionHandlers(t, db)
	_, err = repo.Acquire(ctx, newTarget(t), timeout)
	require.NoError(t, err)
	upd, write, _ = sessionHandlers(t, db)
	assert.Zero(t, upd-upd0, "rows updated by a first acquire")
	assert.EqualValues(t, 1, write-write0, "rows written by a first acquire")
}

// On SQLite a refusal writes nothing to the database: its INSERT finds the
// live lease (or the pause) and inserts nothing, and the read of who holds
// it is a read, so data_version, read on another connection, stays the
// same over refusals by a live lease (Acquire and AcquireFrom) and by a
// pause, and changes with a takeover.
func TestAcquire_SQLiteRefusalWritesNothing(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	db := s.OpenEmpty(t, nil) // a file of its own: no other test writes to it
	ctx := context.Background()
	require.NoError(t, gormlease.AutoMigrate(ctx, db))
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(2)
	watcher, err := sqlDB.Conn(ctx) // the other connection serves the Repositories
	require.NoError(t, err)
	defer watcher.Close()
	version := func() (v int64) {
		t.Helper()
		require.NoError(t, watcher.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v))
		return v
	}
	const timeout = time.Minute
	holder := holderRepository(t, db, "pod-a")
	rec, st := recording(db)
	repo, err := gormlease.NewRepository(rec, gormlease.WithHolder("pod-b"))
	require.NoError(t, err)
	held, l := acquireNew(t, holder, timeout)
	paused := newTarget(t)
	require.NoError(t, admin.New(holder).Pause(ctx, paused, "maintenance"))
	heldRow, pausedRow := leaseRow(t, db, held), leaseRow(t, db, paused)

	v0 := version()
	st.take()
	for range 20 {
		_, err := repo.Acquire(ctx, held, timeout)
		requireHeld(t, err, held, "pod-a", l.Generation, timeout)
		_, err = gormlease.AcquireFrom(repo, ctx, held, timeout, l.Generation)
		requireHeld(t, err, held, "pod-a", l.Generation, timeout)
		_, err = repo.Acquire(ctx, paused, timeout)
		require.ErrorIs(t, err, gormlease.ErrPaused)
	}
	assert.Len(t, st.take(), 120, "statements of 60 refusals: the acquire and the read of the lease")
	assert.Equal(t, v0, version(), "data_version: the refusals wrote to the database")
	assert.Equal(t, heldRow, leaseRow(t, db, held), "the held row changed")
	assert.Equal(t, pausedRow, leaseRow(t, db, paused), "the paused row changed")

	age(t, s, db, held, 2*timeout)
	v0 = version()
	taken, err := repo.Acquire(ctx, held, timeout)
	require.NoError(t, err)
	assert.Equal(t, l.Generation+1, taken.Generation)
	assert.NotEqual(t, v0, version(), "data_version: the takeover wrote nothing")
}
