package gormlease_test

import (
	"context"
	"errors"
	"sync"
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

// previousDDL is the DDL that AutoMigrate ran before the lease table had
// the columns saved_generation, saved_at, failure and waiting (commit
// 68720ae), one statement an entry, by database.
var previousDDL = map[string][]string{
	"postgres": {`CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) PRIMARY KEY,
	lease_token uuid         NOT NULL,
	generation  bigint       NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  timestamptz  NOT NULL,
	released_at timestamptz
) WITH (fillfactor = 80)`, `CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) PRIMARY KEY,
	data       jsonb        NOT NULL,
	generation bigint       NOT NULL,
	updated_at timestamptz  NOT NULL
)`},
	"mysql": {`CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varbinary(255) NOT NULL,
	lease_token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	generation  bigint NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime(6) NOT NULL,
	released_at datetime(6) NULL,
	PRIMARY KEY (target_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`, `CREATE TABLE IF NOT EXISTS job_result (
	target_id  varbinary(255) NOT NULL,
	data       json NOT NULL,
	generation bigint NOT NULL,
	updated_at datetime(6) NOT NULL,
	PRIMARY KEY (target_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`},
	"sqlite": {`CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) NOT NULL PRIMARY KEY,
	lease_token varchar(36)  NOT NULL,
	generation  integer      NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime     NOT NULL,
	released_at datetime
)`, `CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) NOT NULL PRIMARY KEY,
	data       text         NOT NULL,
	generation integer      NOT NULL,
	updated_at datetime     NOT NULL
)`},
}

// addedColumns are the lease table's columns that the upgrade adds, by
// database.
var addedColumns = map[string][]string{
	"postgres": {"saved_generation", "saved_at", "failure", "waiting", "slots", "hold_generation", "paused_at", "stop_generation", "end_cause", "ended_by"},
	"mysql":    {"saved_generation", "saved_at", "failure", "slots", "hold_generation", "paused_at", "stop_generation", "end_cause", "ended_by"},
	"sqlite":   {"saved_generation", "saved_at", "failure", "slots", "hold_generation", "paused_at", "stop_generation", "end_cause", "ended_by"},
}

// heldTarget and releasedTarget are the targets of the rows that
// makePreviousTables puts in the tables: a lease held now, and a released
// one, with a result.
const (
	heldTarget     = "held by a previous version"
	releasedTarget = "released by a previous version"
)

// oldLease is a lease row as the previous DDL has it.
type oldLease struct {
	TargetID   string
	LeaseToken string
	Generation int64
	Holder     string
	UpdatedAt  time.Time
	ReleasedAt *time.Time
}

// oldResult is a result row as the previous DDL has it.
type oldResult struct {
	TargetID   string
	Data       string
	Generation int64
	UpdatedAt  time.Time
}

// makePreviousTables makes the tables with previousDDL in db, which has
// none, and fills them with previousRows.
func makePreviousTables(t *testing.T, s *testdb.Server, db *gorm.DB) {
	t.Helper()
	for _, ddl := range previousDDL[s.Name] {
		require.NoError(t, db.Exec(ddl).Error)
	}
	insert := "INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, released_at) VALUES (?, ?, ?, ?, ?, ?)"
	require.NoError(t, db.Exec(insert, heldTarget, uuid.NewString(), 3, "old-holder", s.Ago(0), nil).Error)
	require.NoError(t, db.Exec(insert, releasedTarget, uuid.NewString(), 5, "old-holder", s.Ago(time.Hour), s.Ago(time.Hour)).Error)
	require.NoError(t, db.Exec("INSERT INTO job_result (target_id, data, generation, updated_at) VALUES (?, ?, ?, ?)",
		releasedTarget, `"old report"`, 5, s.Ago(time.Hour)).Error)
}

// previousRows reads the rows of the previous DDL's columns.
func previousRows(t *testing.T, db *gorm.DB) ([]oldLease, []oldResult) {
	t.Helper()
	var leases []oldLease
	require.NoError(t, db.Raw(`SELECT target_id, lease_token, generation, holder, updated_at, released_at
		FROM job_lease ORDER BY target_id`).Scan(&leases).Error)
	var results []oldResult
	require.NoError(t, db.Raw(`SELECT target_id, data, generation, updated_at FROM job_result ORDER BY target_id`).
		Scan(&results).Error)
	require.Len(t, leases, 2)
	require.Len(t, results, 1)
	return leases, results
}

// leaseColumns returns the lease table's columns with their database types.
func leaseColumns(t *testing.T, db *gorm.DB) map[string]string {
	t.Helper()
	types, err := db.Migrator().ColumnTypes("job_lease")
	require.NoError(t, err)
	cols := map[string]string{}
	for _, c := range types {
		cols[c.Name()] = c.DatabaseTypeName()
	}
	return cols
}

// checkUpgraded checks that AutoMigrate upgraded db's tables from the
// previous DDL: the columns are added, the rows kept as they were, the
// leases' new columns empty, and that Run and Do work on them.
func checkUpgraded(t *testing.T, s *testdb.Server, db *gorm.DB, leases []oldLease, results []oldResult) {
	t.Helper()
	cols := leaseColumns(t, db)
	for _, c := range addedColumns[s.Name] {
		assert.Contains(t, cols, c, "column not added")
	}
	gotLeases, gotResults := previousRows(t, db)
	assert.Equal(t, leases, gotLeases, "lease rows changed")
	assert.Equal(t, results, gotResults, "result rows changed")
	for _, target := range []string{heldTarget, releasedTarget} {
		row := leaseRow(t, db, target)
		assert.Nil(t, row.SavedGeneration, "%s: saved_generation", target)
		assert.Nil(t, row.SavedAt, "%s: saved_at", target)
		assert.Nil(t, row.Failure, "%s: failure", target)
	}

	// A lease timeout that a heartbeat late on a loaded machine does not
	// reach: no waiter may take the holder's place.
	opts := fast(100*time.Millisecond, 20*time.Second)
	r := newRunner(t, db, opts...)
	work := func(context.Context) (string, error) { return "new report", nil }
	_, err := r.Run(context.Background(), heldTarget, work, gormlease.SaveJSON[string])
	assert.ErrorIs(t, err, gormlease.ErrLeaseHeld, "the previous version's live lease")
	v, shared, err := r.Do(context.Background(), releasedTarget, work, gormlease.SaveJSON[string], loadJSON(releasedTarget))
	require.NoError(t, err)
	assert.False(t, shared)
	assert.Equal(t, "new report", v)
	row := leaseRow(t, db, releasedTarget)
	assert.EqualValues(t, 6, row.Generation)
	require.NotNil(t, row.SavedGeneration)
	assert.EqualValues(t, 6, *row.SavedGeneration)
	assert.NotNil(t, row.SavedAt)

	// A waiter on the upgraded table gets the holder's result.
	fresh := newTarget(t)
	started, release := make(chan struct{}), make(chan struct{})
	holder := goDo(t, context.Background(), r, fresh, func(context.Context) (string, error) {
		close(started)
		<-release
		return "fresh report", nil
	})
	recv(t, started, 20*time.Second, "the holder's work to start")
	waiter := goDo(t, context.Background(), newRunner(t, db, opts...), fresh, work)
	waitWatched(t, fresh)
	close(release)
	for _, ch := range []<-chan doResult{holder, waiter} {
		res := recv(t, ch, 20*time.Second, "Do")
		require.NoError(t, res.err)
		assert.Equal(t, "fresh report", res.value)
	}
}

// AutoMigrate upgrades tables made by the previous version's DDL: it adds
// the new columns, keeps every row as it was, and Run and Do work on the
// upgraded tables. A second AutoMigrate changes nothing.
func TestAutoMigrate_UpgradesPreviousTables(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.OpenEmpty(t, nil) // on SQLite, a new file
		makePreviousTables(t, s, db)
		leases, results := previousRows(t, db)
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db))
		cols := leaseColumns(t, db)
		upgraded, _ := previousRows(t, db)

		require.NoError(t, gormlease.AutoMigrate(context.Background(), db), "a second time")
		assert.Equal(t, cols, leaseColumns(t, db), "the second AutoMigrate changed the columns")
		again, _ := previousRows(t, db)
		assert.Equal(t, upgraded, again, "the second AutoMigrate changed the rows")
		checkUpgraded(t, s, db, leases, results)
	})
}

// Several AutoMigrates at once upgrade tables made by the previous
// version's DDL: each succeeds (MySQL has no ADD COLUMN IF NOT EXISTS, so
// they race to add each column), and the tables are upgraded once.
func TestAutoMigrate_ConcurrentUpgrade(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.OpenEmpty(t, nil)
		makePreviousTables(t, s, db)
		leases, results := previousRows(t, db)
		require.NoError(t, migrateAtOnce(db, 8))
		checkUpgraded(t, s, db, leases, results)
	})
}

// migrateAtOnce runs n AutoMigrates with opts on db at the same moment
// and returns their errors, joined.
func migrateAtOnce(db *gorm.DB, n int, opts ...gormlease.MigrateOption) error {
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			errs <- gormlease.AutoMigrate(context.Background(), db, opts...)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// oldLeaseTables is the lease table as the first version made it, before
// the columns that AutoMigrate adds.
var oldLeaseTables = map[string]string{
	"postgres": `CREATE TABLE job_lease (target_id varchar(255) PRIMARY KEY, lease_token uuid NOT NULL,
		generation bigint NOT NULL, holder varchar(255) NOT NULL DEFAULT '', updated_at timestamptz NOT NULL,
		released_at timestamptz)`,
	"mysql": `CREATE TABLE job_lease (target_id varbinary(255) NOT NULL PRIMARY KEY,
		lease_token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, generation bigint NOT NULL,
		holder varchar(255) NOT NULL DEFAULT '', updated_at datetime(6) NOT NULL, released_at datetime(6) NULL)`,
	"sqlite": `CREATE TABLE job_lease (target_id varchar(255) NOT NULL PRIMARY KEY, lease_token varchar(36) NOT NULL,
		generation integer NOT NULL, holder varchar(255) NOT NULL DEFAULT '', updated_at datetime NOT NULL,
		released_at datetime)`,
}

// AutoMigrate upgrades a lease table made before timeout_ms existed
// without losing its rows; such a row has no timeout, lists as expired,
// and its next acquisition records one and goes on with its generation.
func TestAutoMigrate_AddsTimeoutKeepingRows(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := s.OpenEmpty(t, nil)
		require.NoError(t, db.Exec(oldLeaseTables[s.Name]).Error)
		target := newTarget(t)
		require.NoError(t, db.Exec("INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at) VALUES (?, ?, 7, 'old', ?)",
			target, "6f1c1d56-2a8e-4a55-9f4c-3f1f0b6a8c11", s.Ago(time.Hour)).Error)
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db))

		repo := newRepository(t, db)
		op := admin.New(repo)
		got, err := op.List(ctx, admin.ListOptions{})
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, "old", got[0].Row.Holder)
		assert.EqualValues(t, 7, got[0].Row.Generation)
		assert.Nil(t, got[0].Row.TimeoutMS)
		assert.Equal(t, admin.StateExpired, got[0].State)
		assert.Zero(t, got[0].Timeout)

		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.EqualValues(t, 8, l.Generation)
		row, _, err := op.Get(ctx, target)
		require.NoError(t, err)
		require.NotNil(t, row.TimeoutMS)
		assert.EqualValues(t, 60000, *row.TimeoutMS)
	})
}
