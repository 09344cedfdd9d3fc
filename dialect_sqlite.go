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
type sqliteDialect struct{}

// sqliteSchema is the DDL of docs/sqlite.md. The datetime column type makes
// the driver scan the timestamps into time.Time.
const sqliteSchema = `
CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) NOT NULL PRIMARY KEY,
	lease_token varchar(36)  NOT NULL,
	generation  integer      NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime     NOT NULL,
	released_at datetime
);
CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) NOT NULL PRIMARY KEY,
	data       text         NOT NULL,
	generation integer      NOT NULL,
	updated_at datetime     NOT NULL
);`

func (sqliteDialect) migrate(ctx context.Context, db *gorm.DB) error {
	// One write transaction: a concurrent AutoMigrate waits for it.
	return db.Transaction(func(tx *gorm.DB) error {
		return tx.Exec(sqliteSchema).Error
	}, sqliteDialect{}.fenceTxOptions())
}

// sqliteNow is the database's current time as the text the tables hold:
// UTC, with milliseconds.
const sqliteNow = `strftime('%Y-%m-%d %H:%M:%f', 'now')`

func (sqliteDialect) now() string { return sqliteNow }

// sqliteAcquire takes the lease in one statement, as postgresAcquire does:
// the NOT EXISTS guard makes a refused acquire write nothing, and the
// ON CONFLICT ... WHERE re-checks the row under the write lock. Ages are
// compared in seconds through julianday().
const sqliteAcquire = `
INSERT INTO job_lease AS l (target_id, lease_token, generation, holder, updated_at, released_at)
SELECT ?1, ?2, 1, ?3, ` + sqliteNow + `, NULL
WHERE NOT EXISTS (
	SELECT 1 FROM job_lease
	WHERE target_id = ?1 AND released_at IS NULL
	  AND (julianday('now') - julianday(updated_at)) * 86400.0 <= ?4)
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL
WHERE l.released_at IS NOT NULL
   OR (julianday('now') - julianday(l.updated_at)) * 86400.0 > ?4
RETURNING generation`

func (sqliteDialect) acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (int64, bool, error) {
	var generation int64
	ok, err := queryRowSQL(ctx, db, sqliteAcquire,
		[]any{a.targetID, a.token.String(), a.holder, a.timeout.Seconds()}, &generation) // the token as text
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

// MinSQLiteBusyTimeout is the shortest busy timeout that gormlease accepts
// on an SQLite connection. SQLite has one write lock per database file: a
// step that finds it taken waits for it up to the busy timeout, and without
// one it fails at once with "database is locked". The ncruces driver sets a
// busy timeout of one minute unless the DSN sets PRAGMAs; a DSN that does
// must set busy_timeout too, first: _pragma=busy_timeout(10000).
const MinSQLiteBusyTimeout = time.Second

// checkSettings refuses an SQLite connection whose busy timeout is
// shorter than MinSQLiteBusyTimeout, with an error wrapping
// ErrInvalidArgument that says how to fix the DSN. It reads one PRAGMA from
// one connection of the pool; a DSN sets the same PRAGMAs on every one.
func (sqliteDialect) checkSettings(ctx context.Context, db *gorm.DB) error {
	var ms int64
	quiet := db.Session(&gorm.Session{Logger: logger.Discard}) // not one of the steps
	if err := quiet.WithContext(ctx).Raw("PRAGMA busy_timeout").Scan(&ms).Error; err != nil {
		return wrapf(err, "read sqlite busy_timeout")
	}
	if timeout := time.Duration(ms) * time.Millisecond; timeout < MinSQLiteBusyTimeout {
		return invalidf("sqlite busy_timeout is %v, less than %v: concurrent steps would fail with "+
			"\"database is locked\"; set it in the DSN, before other PRAGMAs, as "+
			"file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)", timeout, MinSQLiteBusyTimeout)
	}
	return nil
}

// sqliteHeartbeatBatch renews many leases in one statement. The leases
// travel as one JSON array of [target, token] pairs, so that the statement's
// text is the same whatever their number.
const sqliteHeartbeatBatch = `
UPDATE job_lease SET updated_at = ` + sqliteNow + `
FROM (SELECT json_extract(value, '$[0]') AS b_target, json_extract(value, '$[1]') AS b_token
      FROM json_each(?)) AS b
WHERE job_lease.target_id = b.b_target AND job_lease.lease_token = b.b_token
  AND job_lease.released_at IS NULL
RETURNING target_id, lease_token`

func (sqliteDialect) heartbeatBatch(ctx context.Context, db *gorm.DB, leases []Lease) (map[Lease]bool, error) {
	pairs := make([][2]string, len(leases))
	for i, l := range leases {
		pairs[i] = [2]string{l.TargetID, l.Token.String()}
	}
	data, err := json.Marshal(pairs)
	if err != nil {
		return nil, err
	}
	rows, err := querySQL(ctx, db, sqliteHeartbeatBatch, string(data))
	if err != nil {
		return nil, err
	}
	return scanRenewed(rows, leases)
}
