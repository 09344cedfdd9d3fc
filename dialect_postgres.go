package gormlease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// postgresDialect is PostgreSQL (and databases that speak its SQL, with
// gorm.io/driver/postgres), with its statements written for its tables.
type postgresDialect struct {
	lease                               string
	schemaSQL, acquireSQL, heartbeatSQL string
}

func newPostgresDialect(t tableNames) postgresDialect {
	return postgresDialect{
		lease:        t.lease,
		schemaSQL:    t.expand(postgresSchema),
		acquireSQL:   t.expand(postgresAcquire),
		heartbeatSQL: t.expand(postgresHeartbeatBatch),
	}
}

// postgresSchema is the DDL of docs/schema.sql. updated_at and released_at
// stay unindexed and the fill factor leaves room on each page, so that
// heartbeats and releases are HOT updates that touch no index.
const postgresSchema = `
CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) PRIMARY KEY,
	lease_token uuid         NOT NULL,
	generation  bigint       NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  timestamptz  NOT NULL,
	released_at timestamptz
) WITH (fillfactor = 80);
ALTER TABLE job_lease
	ADD COLUMN IF NOT EXISTS saved_generation bigint,
	ADD COLUMN IF NOT EXISTS saved_at         timestamptz,
	ADD COLUMN IF NOT EXISTS failure          varchar(255),
	ADD COLUMN IF NOT EXISTS waiting          boolean NOT NULL DEFAULT false,
	ADD COLUMN IF NOT EXISTS timeout_ms       bigint;
CREATE TABLE IF NOT EXISTS job_lease_floor (
	id         smallint PRIMARY KEY CHECK (id = 1),
	generation bigint   NOT NULL
);
INSERT INTO job_lease_floor (id, generation) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) PRIMARY KEY,
	data       jsonb        NOT NULL,
	generation bigint       NOT NULL,
	updated_at timestamptz  NOT NULL
);`

// postgresMigrateLock is the advisory lock key that serialises concurrent
// AutoMigrate calls: CREATE TABLE IF NOT EXISTS alone can fail with a
// unique violation when two sessions create the same table at once.
const postgresMigrateLock = 0x676f726d6c6561 // "gormlea"

// migrateAttempts bounds how often migrate runs the DDL when concurrent
// migrations without the advisory lock keep colliding: each collision
// leaves one more object made, and there are fewer objects than attempts.
const migrateAttempts = 10

// errNoAdvisoryLock marks the failure of the migration's advisory lock on a
// server that lacks it.
var errNoAdvisoryLock = errors.New("no advisory lock")

// migrate runs the DDL in a transaction that first takes an advisory lock,
// so that concurrent migrations run one after another. Where the server has
// no such lock (CockroachDB before transaction-level advisory locks, which
// has no pg_advisory_xact_lock, or YugabyteDB without its advisory-lock
// flags) the DDL runs without it: every statement of the DDL does nothing
// for what exists (IF NOT EXISTS, ON CONFLICT DO NOTHING), so a migration
// that collides with a concurrent one, and fails for it, is run again until
// it finds everything made.
func (d postgresDialect) migrate(ctx context.Context, db *gorm.DB) error {
	lock := true
	b := statementBackoff()
	for attempt := 1; ; attempt++ {
		err := db.Transaction(func(tx *gorm.DB) error {
			if lock {
				if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", postgresMigrateLock).Error; err != nil {
					if st := sqlState(err); st == "42883" || st == "0A000" { // undefined function, not supported
						return fmt.Errorf("%w: %w", errNoAdvisoryLock, err)
					}
					return err
				}
			}
			return tx.Exec(d.schemaSQL).Error
		})
		switch {
		case err == nil:
			return nil
		case lock && errors.Is(err, errNoAdvisoryLock):
			lock = false
			continue
		case lock || attempt >= migrateAttempts || !migrationCollision(err) || !b.wait(ctx):
			return err
		}
	}
}

// migrationCollision reports whether err is what a DDL statement meets when
// a concurrent one makes the same object: a duplicate in the catalog, or a
// serialization failure or deadlock between the two transactions.
func migrationCollision(err error) bool {
	switch sqlState(err) {
	case "23505", "42P07", "42701", "42710", "40001", "40P01":
		return true
	}
	return false
}

// now is clock_timestamp(): now() is frozen at the start of the
// transaction, so after waiting on a row lock it would stamp the lease
// older than it is.
func (postgresDialect) now() string { return "clock_timestamp()" }

// postgresAcquire takes the lease in one statement. The NOT EXISTS guard
// reads the row without locking it: when the lease is live, nothing is
// inserted or locked, so a refused acquire writes nothing. Otherwise the
// insert goes ahead, and on a conflict the ON CONFLICT ... WHERE re-checks
// the latest row under its lock before taking it over. Both judge the row by
// the timeout its holder recorded (timeout_ms), so that a caller with a
// shorter timeout never takes over a lease that its holder still trusts; a
// row without one (written before the column existed) by the caller's. Its arguments are
// the target, the token, the holder, the timeout in microseconds, the
// generation to take over from (see acquireArgs) and the timeout in
// milliseconds; the casts give each the one type that all its uses agree on.
// The timeout is an integer times interval '1 microsecond', not
// make_interval, which CockroachDB lacks (see docs/scaling.md).
//
// A target without a row starts above the generation floor, the highest
// generation that Prune ever deleted, and above the row that the
// statement's snapshot shows: a Prune that deletes the row while the
// statement runs has not committed its raise of the floor yet (see
// prune.go).
const postgresAcquire = `
INSERT INTO job_lease AS l (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT CAST($1 AS varchar), CAST($2 AS uuid),
	GREATEST((SELECT generation FROM job_lease WHERE target_id = $1),
	         (SELECT generation FROM job_lease_floor WHERE id = 1), 0) + 1,
	CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
WHERE NOT EXISTS (
	SELECT 1 FROM job_lease
	WHERE target_id = $1 AND released_at IS NULL
	  AND updated_at >= clock_timestamp() - COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL,
	failure     = NULL,
	waiting     = false,
	timeout_ms  = excluded.timeout_ms
WHERE (l.released_at IS NOT NULL
    OR l.updated_at < clock_timestamp() - COALESCE(l.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
  AND (CAST($5 AS bigint) < 0 OR l.generation = $5)
RETURNING l.generation`

func (d postgresDialect) acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (int64, bool, error) {
	var generation int64
	ok, err := queryRowSQL(ctx, db, d.acquireSQL,
		[]any{a.targetID, a.token.String(), a.holder, timeoutMicros(a.timeout), a.from, timeoutMillis(a.timeout)}, &generation)
	return generation, ok, err
}

// rebind numbers the placeholders, as PostgreSQL wants them.
func (postgresDialect) rebind(query string) string { return numbered(query) }

// beginLocked begins the fenced transaction at READ COMMITTED (see
// fenceTxOptions) and runs stmt, which locks the lease row, in the same
// query. pgx (and lib/pq) send a query without arguments as a simple
// query, which may hold several statements; its rows affected are the last
// statement's. stmt's $1 and $2, the target and the token, are written in
// as literals: the target as an escape string literal (postgresLiteral),
// the token as a UUID's text.
func (postgresDialect) beginLocked(stmt string, l Lease) string {
	return "BEGIN ISOLATION LEVEL READ COMMITTED; " + strings.NewReplacer(
		"$1", postgresLiteral(l.TargetID),
		"$2", "'"+l.Token.String()+"'",
	).Replace(stmt)
}

// notifyWaiters is appended to the statements that end a generation or
// save its result: when a waiter has marked the row (see markWaitingSQL),
// it sends the lease table's name and the target on the gormlease channel.
// The notification is delivered when the transaction commits, and only
// then. Rows nobody waits on send nothing, so that jobs nobody waits for do
// not pay NOTIFY's cost: PostgreSQL serialises the commits of all
// transactions that notify.
func (d postgresDialect) notifyWaiters() string {
	return " RETURNING CASE WHEN waiting THEN pg_notify('" + pgNotifyChannel + "', '" + d.lease + " ' || target_id) END"
}

// stateSQL reads what a waiter needs of the row: see leaseState.
func (d postgresDialect) stateSQL() string {
	return `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	EXTRACT(EPOCH FROM clock_timestamp() - updated_at), EXTRACT(EPOCH FROM clock_timestamp() - saved_at), waiting, timeout_ms
FROM ` + d.lease + ` WHERE target_id = $1`
}

// markWaitingSQL marks the row of a live generation as waited on, so that
// the statement that ends it notifies (see notifyWaiters). It locks the
// row: it runs wholly before that statement, which then sees the mark, or
// wholly after it, when it finds the generation ended and changes nothing.
func (d postgresDialect) markWaitingSQL() string {
	return `UPDATE ` + d.lease + ` SET waiting = true
WHERE target_id = $1 AND generation = $2 AND released_at IS NULL AND NOT waiting`
}

// postgresLiteral writes s, valid UTF-8 without NUL (as checkTargetID
// makes sure), as an escape string literal: E'...' with backslashes and
// quotes escaped. An escape string reads the same whatever
// standard_conforming_strings says, and in UTF-8, the client encoding of
// pgx and lib/pq, neither byte occurs inside a multi-byte character.
func postgresLiteral(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 4)
	b.WriteString("E")
	writeQuoted(&b, s, '\'')
	return b.String()
}

// writeQuoted writes s to b between quote characters, with each backslash
// and quote character in s escaped by a backslash.
func writeQuoted(b *strings.Builder, s string, quote byte) {
	b.WriteByte(quote)
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == quote {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte(quote)
}

// refusesQueries reports whether err is the server refusing several
// statements in one prepared statement: the driver sends queries without
// arguments through the extended protocol.
func (postgresDialect) refusesQueries(err error) bool {
	var st sqlStater
	return errors.As(err, &st) && st.SQLState() == "42601" && strings.Contains(err.Error(), "multiple commands")
}

// fenceTxOptions asks for READ COMMITTED whatever the session default: under
// REPEATABLE READ, a heartbeat committed after the transaction's snapshot
// makes the locking read fail with a serialization error (40001).
func (postgresDialect) fenceTxOptions() *sql.TxOptions {
	return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
}

// postgresHeartbeatBatch renews many leases in one statement. The leases
// travel as two array literals, so that the statement's text, and its
// prepared plan, is the same whatever their number.
const postgresHeartbeatBatch = `
UPDATE job_lease AS l SET updated_at = clock_timestamp()
FROM unnest(CAST($1 AS text[]), CAST($2 AS uuid[])) AS b(target_id, lease_token)
WHERE l.target_id = b.target_id AND l.lease_token = b.lease_token AND l.released_at IS NULL
RETURNING l.target_id, l.lease_token`

func (d postgresDialect) heartbeatBatch(ctx context.Context, db *gorm.DB, leases []Lease) (map[Lease]bool, error) {
	targets := make([]string, len(leases))
	tokens := make([]string, len(leases))
	for i, l := range leases {
		targets[i] = l.TargetID
		tokens[i] = l.Token.String()
	}
	rows, err := querySQL(ctx, db, d.heartbeatSQL, postgresArray(targets), postgresArray(tokens))
	if err != nil {
		return nil, err
	}
	return scanRenewed(rows, leases)
}

// postgresArray writes values as a PostgreSQL array literal, each element
// quoted, with backslashes and double quotes escaped.
func postgresArray(values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		writeQuoted(&b, v, '"')
	}
	b.WriteByte('}')
	return b.String()
}

// secondsSince counts from statement_timestamp(), the same for every row of
// a statement, so that a row's state and age agree.
func (postgresDialect) secondsSince(col string) string {
	return "CAST(EXTRACT(EPOCH FROM statement_timestamp() - " + col + ") AS double precision)"
}

// raiseFloorSQL raises the generation floor to its argument, when that is
// higher, creating the row if it is missing.
func (postgresDialect) raiseFloorSQL(floor string) string {
	return "INSERT INTO " + floor + " AS f (id, generation) VALUES (1, ?)" +
		" ON CONFLICT (id) DO UPDATE SET generation = GREATEST(f.generation, excluded.generation)"
}
