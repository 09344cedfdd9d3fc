package gormlease

import (
	"context"
	"database/sql"
	"errors"
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

func (d postgresDialect) migrate(ctx context.Context, db *gorm.DB) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", postgresMigrateLock).Error; err != nil {
			return err
		}
		return tx.Exec(d.schemaSQL).Error
	})
}

// now is clock_timestamp(): now() is frozen at the start of the
// transaction, so after waiting on a row lock it would stamp the lease
// older than it is.
func (postgresDialect) now() string { return "clock_timestamp()" }

// postgresAcquire takes the lease in one statement. The NOT EXISTS guard
// reads the row without locking it: when the lease is live, nothing is
// inserted or locked, so a refused acquire writes nothing. Otherwise the
// insert goes ahead, and on a conflict the ON CONFLICT ... WHERE re-checks
// the latest row under its lock before taking it over. Its arguments are
// the target, the token, the holder and the timeout in seconds; the casts
// give each the one type that all its uses agree on.
const postgresAcquire = `
INSERT INTO job_lease AS l (target_id, lease_token, generation, holder, updated_at, released_at)
SELECT CAST($1 AS varchar), CAST($2 AS uuid), 1, CAST($3 AS varchar), clock_timestamp(), NULL
WHERE NOT EXISTS (
	SELECT 1 FROM job_lease
	WHERE target_id = $1 AND released_at IS NULL
	  AND updated_at >= clock_timestamp() - make_interval(secs => CAST($4 AS double precision)))
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL
WHERE l.released_at IS NOT NULL
   OR l.updated_at < clock_timestamp() - make_interval(secs => CAST($4 AS double precision))
RETURNING l.generation`

func (d postgresDialect) acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (int64, bool, error) {
	var generation int64
	ok, err := queryRowSQL(ctx, db, d.acquireSQL,
		[]any{a.targetID, a.token.String(), a.holder, a.timeout.Seconds()}, &generation)
	return generation, ok, err
}

// rebind numbers the placeholders, as PostgreSQL wants them.
func (postgresDialect) rebind(query string) string { return numbered(query) }

// beginLocked begins the fenced transaction at READ COMMITTED (see
// fenceTxOptions) and locks the lease row in the same query: with release,
// the release's UPDATE; without, a locking read. pgx (and lib/pq) send a
// query without arguments as a simple query, which may hold several
// statements; its rows affected are the last statement's. The target is an
// escape string literal (postgresLiteral), the token a UUID's text.
func (d postgresDialect) beginLocked(l Lease, release bool) string {
	var b strings.Builder
	b.WriteString("BEGIN ISOLATION LEVEL READ COMMITTED; ")
	if release {
		b.WriteString("UPDATE " + d.lease + " SET released_at = clock_timestamp()")
	} else {
		b.WriteString("SELECT 1 FROM " + d.lease)
	}
	b.WriteString(" WHERE target_id = ")
	b.WriteString(postgresLiteral(l.TargetID))
	b.WriteString(" AND lease_token = '")
	b.WriteString(l.Token.String())
	b.WriteString("' AND released_at IS NULL")
	if !release {
		b.WriteString(" FOR UPDATE")
	}
	return b.String()
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
