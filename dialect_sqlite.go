package gormlease

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// sqliteDialect is SQLite, through github.com/ncruces/go-sqlite3/gormlite
// (pure Go) or another gorm dialector named "sqlite".
//
// SQLite has no row locks: gorm drops FOR UPDATE from the fenced commit's
// locking read. The fence is the database's single write lock instead: the
// fenced commit begins with BEGIN IMMEDIATE, so it holds the write lock from
// its first statement to its end, and an acquire that would take the lease
// over waits for it (up to the connection's busy timeout). Timestamps are
// text written by strftime on the database's clock, in UTC, and compared
// through julianday(), never as text, since drivers write time.Time values in
// other formats.
type sqliteDialect struct {
	schemaSQL, acquireSQL, heartbeatSQL string
	lease                               string
}

// sqliteAddedColumns are the columns that later versions added to
// job_lease, which AutoMigrate adds to a table made before them.
var sqliteAddedColumns = []column{
	{"saved_generation", "integer"},
	{"saved_at", "datetime"},
	{"failure", "text"},
	{"timeout_ms", "integer"},
}

func newSQLiteDialect(t tableNames) sqliteDialect {
	return sqliteDialect{
		lease:        t.lease,
		schemaSQL:    t.expand(sqliteSchema),
		acquireSQL:   t.expand(sqliteAcquire),
		heartbeatSQL: t.expand(sqliteHeartbeatBatch),
	}
}

// sqliteSchema is the DDL of docs/sqlite.md. The datetime column type makes
// the driver scan the timestamps into time.Time.
const sqliteSchema = `
CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) NOT NULL PRIMARY KEY,
	lease_token varchar(36)  NOT NULL,
	generation  integer      NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime     NOT NULL,
	released_at datetime,
	saved_generation integer,
	saved_at    datetime,
	failure     text,
	timeout_ms  integer
);
CREATE TABLE IF NOT EXISTS job_lease_floor (
	id         integer NOT NULL PRIMARY KEY CHECK (id = 1),
	generation integer NOT NULL
);
INSERT INTO job_lease_floor (id, generation) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) NOT NULL PRIMARY KEY,
	data       text         NOT NULL,
	generation integer      NOT NULL,
	updated_at datetime     NOT NULL
);`

func (d sqliteDialect) migrate(ctx context.Context, db *gorm.DB) error {
	// One write transaction: a concurrent AutoMigrate waits for it.
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(d.schemaSQL).Error; err != nil {
			return err
		}
		return addMissingColumns(tx, d.lease, sqliteAddedColumns)
	}, d.fenceTxOptions())
}

// sqliteNow is the database's current time as the text the tables hold:
// UTC, with milliseconds.
const sqliteNow = `strftime('%Y-%m-%d %H:%M:%f', 'now')`

func (sqliteDialect) now() string { return sqliteNow }

// sqliteAcquire takes the lease in one statement, as postgresAcquire does:
// the NOT EXISTS guard makes a refused acquire write nothing, and the
// ON CONFLICT ... WHERE re-checks the row under the write lock; both judge
// the row by the timeout its holder recorded. Ages are
// compared in seconds through julianday(). A target without a row starts
// above the generation floor (see prune.go); the statement holds the write
// lock from its start, so no Prune can commit while it runs.
const sqliteAcquire = `
INSERT INTO job_lease AS l (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT ?1, ?2, COALESCE((SELECT generation FROM job_lease_floor WHERE id = 1), 0) + 1, ?3, ` + sqliteNow + `, NULL, ?6
WHERE NOT EXISTS (
	SELECT 1 FROM job_lease
	WHERE target_id = ?1 AND released_at IS NULL
	  AND (julianday('now') - julianday(updated_at)) * 86400.0 <= COALESCE(timeout_ms / 1000.0, ?4))
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL,
	failure     = NULL,
	timeout_ms  = excluded.timeout_ms
WHERE (l.released_at IS NOT NULL
    OR (julianday('now') - julianday(l.updated_at)) * 86400.0 > COALESCE(l.timeout_ms / 1000.0, ?4))
  AND (?5 < 0 OR l.generation = ?5)
RETURNING generation`

func (d sqliteDialect) acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (int64, bool, error) {
	var generation int64
	ok, err := queryRowSQL(ctx, db, d.acquireSQL,
		[]any{a.targetID, a.token.String(), a.holder, a.timeout.Seconds(), a.from, timeoutMillis(a.timeout)}, &generation) // the token as text
	return generation, ok, err
}

// rebind keeps the placeholders: SQLite takes ?.
func (sqliteDialect) rebind(query string) string { return query }

// fenceTxOptions asks for a serializable transaction, which the ncruces
// driver always begins with BEGIN IMMEDIATE, whatever the DSN's _txlock: the
// transaction takes the write lock before its first statement. (The driver
// refuses READ COMMITTED; SQLite transactions are serializable anyway.)
func (sqliteDialect) fenceTxOptions() *sql.TxOptions {
	return &sql.TxOptions{Isolation: sql.LevelSerializable}
}

// minSQLiteBusyTimeout is the shortest busy timeout that gormlease accepts
// on an SQLite connection. SQLite has one write lock per database file: a
// step that finds it taken waits for it up to the busy timeout, and without
// one it fails at once with "database is locked". The ncruces driver sets a
// busy timeout of one minute unless the DSN sets PRAGMAs; a DSN that does
// must set busy_timeout too, first: _pragma=busy_timeout(10000).
const minSQLiteBusyTimeout = time.Second

// checkSettings refuses an SQLite connection whose busy timeout is
// shorter than minSQLiteBusyTimeout, with an error wrapping
// ErrInvalidArgument that says how to fix the DSN. It reads one PRAGMA from
// one connection of the pool; a DSN sets the same PRAGMAs on every one.
func (sqliteDialect) checkSettings(ctx context.Context, db *gorm.DB) error {
	var ms int64
	quiet := db.Session(&gorm.Session{Logger: logger.Discard}) // not one of the steps
	if err := quiet.WithContext(ctx).Raw("PRAGMA busy_timeout").Scan(&ms).Error; err != nil {
		return wrapf(err, "read sqlite busy_timeout")
	}
	if timeout := time.Duration(ms) * time.Millisecond; timeout < minSQLiteBusyTimeout {
		return invalidf("sqlite busy_timeout is %v, less than %v: concurrent steps would fail with "+
			"\"database is locked\"; set it in the DSN, before other PRAGMAs, as "+
			"file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)", timeout, minSQLiteBusyTimeout)
	}
	return nil
}

// sqliteHeartbeatBatch renews many leases in one statement. The leases
// travel as one JSON array of [target, token] pairs, so that the statement's
// text is the same whatever their number.
const sqliteHeartbeatBatch = `
UPDATE job_lease AS l SET updated_at = ` + sqliteNow + `
FROM (SELECT json_extract(value, '$[0]') AS b_target, json_extract(value, '$[1]') AS b_token
      FROM json_each(?)) AS b
WHERE l.target_id = b.b_target AND l.lease_token = b.b_token
  AND l.released_at IS NULL
RETURNING target_id, lease_token`

func (d sqliteDialect) heartbeatBatch(ctx context.Context, db *gorm.DB, leases []Lease) (map[Lease]bool, error) {
	pairs := make([][2]string, len(leases))
	for i, l := range leases {
		pairs[i] = [2]string{l.TargetID, l.Token.String()}
	}
	data, err := json.Marshal(pairs)
	if err != nil {
		return nil, err
	}
	rows, err := querySQL(ctx, db, d.heartbeatSQL, string(data))
	if err != nil {
		return nil, err
	}
	return scanRenewed(rows, leases)
}

// notifyWaiters is empty: SQLite has no notifications, and waiters poll.
func (sqliteDialect) notifyWaiters() string { return "" }

// stateSQL reads what a waiter needs of the row: see leaseState.
func (d sqliteDialect) stateSQL() string {
	return `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	(julianday('now') - julianday(updated_at)) * 86400.0,
	(julianday('now') - julianday(saved_at)) * 86400.0, 0, timeout_ms
FROM ` + d.lease + ` WHERE target_id = ?`
}

// secondsSince counts from julianday('now'), read once per statement.
func (sqliteDialect) secondsSince(col string) string {
	return "((julianday('now') - julianday(" + col + ")) * 86400.0)"
}

// raiseFloorSQL raises the generation floor to its argument, when that is
// higher, creating the row if it is missing.
func (sqliteDialect) raiseFloorSQL(floor string) string {
	return "INSERT INTO " + floor + " (id, generation) VALUES (1, ?)" +
		" ON CONFLICT (id) DO UPDATE SET generation = max(generation, excluded.generation)"
}
