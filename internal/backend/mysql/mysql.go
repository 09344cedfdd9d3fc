// Package mysql is the MySQL 8 and MariaDB 10.6 (or later) backend of
// gormlease, on InnoDB, with gorm.io/driver/mysql. The DSN must set
// parseTime=true and keep loc=UTC (the driver's default); Migrate checks
// both. MariaDB Galera clusters run it wrapped (see package galera).
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// Backend is MySQL or MariaDB, with its statements written for its tables.
type Backend struct {
	backend.Common
	backend.Kit
	lease                                       string
	tables                                      backend.Tables
	leaseDDL, resultDDL, takeOverSQL, insertSQL string
	floorDDL, floorRow, stateSQL, slotSQL       string
	eventDDL                                    string
	readBackSQL, heldSQL, upsertSQL             string
	// rows are the targets whose rows Acquire has seen, and whether their
	// last acquire was refused: what picks its first statement.
	rows backend.Seen
	// server is what the server is, once Server has asked it.
	server atomic.Pointer[Server]
}

// mysqlLast is the largest datetime(6): the sort key of the rows that sort
// last in an operator's List (backend.Dialect.LastKey).
const mysqlLast = "CAST('9999-12-31 23:59:59.999999' AS DATETIME(6))"

// New returns the MySQL backend for tables t.
func New(t backend.Tables) *Backend {
	d := backend.Dialect{
		// UTC_TIMESTAMP(6): NOW() and CURRENT_TIMESTAMP follow the
		// session time zone. Like them it is read once, when the
		// statement starts, not when its transaction began. A statement
		// that waited for a row lock so stamps a time earlier than its
		// write, but never earlier than the client sent it, which is
		// the time self-fencing counts from.
		Now:    "UTC_TIMESTAMP(6)",
		Rebind: func(query string) string { return query },
		SecondsSince: func(col string) string {
			return "(TIMESTAMPDIFF(MICROSECOND, " + col + ", UTC_TIMESTAMP(6)) / 1e6)"
		},
		RowLock:   " FOR UPDATE SKIP LOCKED",
		FloorLock: " FOR UPDATE",
		RaiseFloor: "INSERT INTO " + t.Floor() + " (id, generation) VALUES (1, ?)" +
			" ON DUPLICATE KEY UPDATE generation = GREATEST(generation, VALUES(generation))",
		// READ COMMITTED, as on PostgreSQL. InnoDB's locking read sees
		// the latest row at any level, but READ COMMITTED takes no gap
		// locks, so the saver's writes block fewer other transactions.
		TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		Lock:      " FOR UPDATE",
		// SetSlots at REPEATABLE READ: its locking reads of rows that
		// do not exist yet take gap locks, which a Pause's insert of the
		// target's row waits for (see backend.Dialect.LockTarget).
		SlotsTx:      &sql.TxOptions{Isolation: sql.LevelRepeatableRead},
		InsertIgnore: "INSERT IGNORE INTO",
		Fresh: func(col, ms string) string {
			return col + " >= UTC_TIMESTAMP(6) - INTERVAL " + ms + " * 1000 MICROSECOND"
		},
		AddMillis: func(ts, ms string) string { return "(" + ts + " + INTERVAL " + ms + " * 1000 MICROSECOND)" },
		SortKey:   func(ts string) string { return ts },
		KeyMicros: func(key string) string {
			return "CASE WHEN " + key + " < " + mysqlLast + " THEN TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + key + ") END"
		},
		MicrosKey: "TIMESTAMPADD(MICROSECOND, ?, CAST('1970-01-01 00:00:00' AS DATETIME(6)))",
		LastKey:   mysqlLast,
	}
	return &Backend{
		Common:      backend.NewCommon(d, t),
		Kit:         backend.NewKit(d, t, func(col string) string { return "(" + col + " - INTERVAL ? MICROSECOND)" }),
		lease:       t.Lease,
		tables:      t,
		leaseDDL:    leaseDDL(t),
		resultDDL:   t.Expand(resultTable),
		takeOverSQL: t.Expand(takeOverSQL),
		slotSQL:     t.Expand(slotSQL),
		insertSQL:   t.Expand(insertSQL),
		readBackSQL: t.Expand(readBackSQL),
		heldSQL:     t.Expand(heldSQL),
		upsertSQL:   t.Expand(upsertSQL),
		floorDDL:    t.Expand(floorTable),
		eventDDL:    eventDDL(t),
		floorRow:    t.Expand(floorRow),
		stateSQL: `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)) / 1e6,
	TIMESTAMPDIFF(MICROSECOND, saved_at, UTC_TIMESTAMP(6)) / 1e6, false, timeout_ms, holder, paused_at IS NOT NULL, pause_reason,
	COALESCE(stop_generation = generation, false), TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6)) / 1e6, ` + backend.MinHoldExpr + `,
	TIMESTAMPDIFF(MICROSECOND, released_at, UTC_TIMESTAMP(6)) / 1e6
FROM ` + t.Lease + ` WHERE target_id = ?`,
	}
}

// Capabilities: batched heartbeats. MySQL has no notifications, and its
// waiters poll.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{}
}

// leaseTable and resultTable are the DDL of docs/schema-mysql.sql.
//
// target_id is varbinary(255): its bytes are compared as they are, as on
// PostgreSQL. A utf8mb4 varchar would compare under a collation, where the
// usual ones ignore case ("a" = "A") and trailing spaces ("a" = "a "), so
// two targets would share one lease. The key is 255 bytes, within every
// InnoDB row format's index limit (767 bytes for COMPACT). lease_token is
// the UUID's text, which is what uuid.UUID writes and reads. The times are
// datetime(6), written by UTC_TIMESTAMP(6) only: datetime is not converted
// by the session time zone, as timestamp would be.
const (
	leaseTable = `CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varbinary(255) NOT NULL,
	lease_token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	generation  bigint NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime(6) NOT NULL,
	released_at datetime(6) NULL,
	saved_generation bigint NULL,
	saved_at    datetime(6) NULL,
	failure     varchar(255) NULL,
	timeout_ms  bigint NULL,
	slots       int NULL,
	hold_generation bigint NULL,
	paused_at   datetime(6) NULL,
	pause_reason varchar(255) NULL,
	stop_generation bigint NULL,
	stop_reason varchar(255) NULL,
	acquired_at datetime(6) NULL,
	paused_by   varchar(255) NULL,
	stop_by     varchar(255) NULL,
	end_cause   varchar(16) NULL,
	ended_by    varchar(255) NULL,
	PRIMARY KEY (target_id),
	KEY job_lease_paused (paused_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`

	floorTable = `CREATE TABLE IF NOT EXISTS job_lease_floor (
	id         smallint NOT NULL,
	generation bigint NOT NULL,
	PRIMARY KEY (id)
) ENGINE=InnoDB`

	floorRow = `INSERT IGNORE INTO job_lease_floor (id, generation) VALUES (1, 0)`

	resultTable = `CREATE TABLE IF NOT EXISTS job_result (
	target_id  varbinary(255) NOT NULL,
	data       json NOT NULL,
	generation bigint NOT NULL,
	updated_at datetime(6) NOT NULL,
	PRIMARY KEY (target_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
)

// Migrate needs no lock of its own, unlike on PostgreSQL: CREATE TABLE IF
// NOT EXISTS takes an exclusive metadata lock on the table's name before it
// looks, so concurrent calls wait for each other and then find the table.
func (b *Backend) Migrate(ctx context.Context, db *gorm.DB, history bool) error {
	if err := CheckTimes(ctx, db); err != nil {
		return err
	}
	for _, ddl := range []string{b.leaseDDL, b.resultDDL, b.floorDDL, b.floorRow} {
		if err := db.Exec(ddl).Error; err != nil {
			return err
		}
	}
	// MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has).
	if err := backend.AddMissingColumns(db, b.lease, addedColumns); err != nil {
		return err
	}
	if err := addPausedIndex(ctx, db, backend.Tables{Lease: b.lease}); err != nil {
		return err
	}
	if !history {
		return nil
	}
	return b.migrateHistory(ctx, db, b.tables)
}

// leaseDDL is leaseTable for tables t: the index's name is never
// qualified by the schema.
func leaseDDL(t backend.Tables) string {
	index, _ := t.PausedIndex()
	return strings.Replace(t.Expand(leaseTable), "\tKEY "+t.Lease+"_paused ", "\tKEY "+index+" ", 1)
}

// addPausedIndex adds the index of the paused rows (job_lease_paused, on
// paused_at, which InnoDB's secondary index extends with the key) to a
// lease table made before it. InnoDB writes a secondary index only when a
// statement changes its columns, inserts a row or deletes one: heartbeats,
// releases and acquires of an existing row do not touch it; Pause, Resume,
// a target's first acquire and Prune do. MySQL has no CREATE INDEX IF NOT EXISTS:
// the catalog is read first, and an index that a concurrent migration
// made meanwhile (error 1061, a duplicate key name) is no error.
func addPausedIndex(ctx context.Context, db *gorm.DB, t backend.Tables) error {
	index, schema := t.PausedIndex()
	table := strings.TrimPrefix(t.Lease, schema)
	var n int64
	if _, err := backend.QueryRow(ctx, db, "SELECT COUNT(*) FROM information_schema.statistics"+
		" WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND index_name = ?",
		[]any{strings.TrimSuffix(schema, "."), table, index}, &n); err != nil {
		return fmt.Errorf("look for index %s: %w", index, err)
	}
	if n > 0 {
		return nil
	}
	err := db.WithContext(ctx).Exec("CREATE INDEX " + index + " ON " + t.Lease + " (paused_at)").Error
	if number, ok := backend.MySQLErrorNumber(err); ok && number == 1061 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create index %s: %w", index, err)
	}
	return nil
}

// addedColumns are the columns that later versions added to job_lease,
// which Migrate adds to a table made before them.
var addedColumns = []backend.Column{
	{Name: "saved_generation", DDL: "bigint NULL"},
	{Name: "saved_at", DDL: "datetime(6) NULL"},
	{Name: "failure", DDL: "varchar(255) NULL"},
	{Name: "timeout_ms", DDL: "bigint NULL"},
	{Name: "slots", DDL: "int NULL"},
	{Name: "hold_generation", DDL: "bigint NULL"},
	{Name: "paused_at", DDL: "datetime(6) NULL"},
	{Name: "pause_reason", DDL: "varchar(255) NULL"},
	{Name: "stop_generation", DDL: "bigint NULL"},
	{Name: "stop_reason", DDL: "varchar(255) NULL"},
	{Name: "acquired_at", DDL: "datetime(6) NULL"},
	{Name: "paused_by", DDL: "varchar(255) NULL"},
	{Name: "stop_by", DDL: "varchar(255) NULL"},
	{Name: "end_cause", DDL: "varchar(16) NULL"},
	{Name: "ended_by", DDL: "varchar(255) NULL"},
}

// CheckTimes makes sure that the DSN lets the lease rows be read: a
// datetime scans into a time.Time only with parseTime=true, and reads as the
// right instant only when loc is UTC, as UTC_TIMESTAMP wrote it. It compares
// the database's UTC time, as read back, with its Unix time.
func CheckTimes(ctx context.Context, db *gorm.DB) error {
	var now any
	var unix int64
	if _, err := backend.QueryRow(ctx, db, "SELECT UTC_TIMESTAMP(6), UNIX_TIMESTAMP()", nil, &now, &unix); err != nil {
		return fmt.Errorf("read the database's time: %w", err)
	}
	t, ok := now.(time.Time)
	if !ok {
		return &backend.SettingsError{Problem: fmt.Sprintf(
			"the MySQL DSN must set parseTime=true: a datetime reads as %T, not time.Time", now)}
	}
	if off := t.Sub(time.Unix(unix, 0)); off > 2*time.Second || off < -2*time.Second {
		return &backend.SettingsError{Problem: fmt.Sprintf(
			"the MySQL DSN must keep loc=UTC, the default: with loc=%v the database's UTC time reads back %v off",
			t.Location(), off.Round(time.Second))}
	}
	return nil
}

// takeOverSQL takes over an existing row that is released or expired,
// by the timeout its holder recorded (the caller's for a row without one).
// InnoDB locks the row before checking the WHERE, so two takeovers are
// serialised and the second finds the row live. LAST_INSERT_ID(expr)
// returns the new generation in the reply's insert ID: the statement's
// result says both whether it took the row and its generation, in one round
// trip and whatever the DSN's clientFoundRows. (RowsAffected alone also
// works: lease_token always changes, so a matched row is a changed row.)
// A paused row (admin.Operator.Pause) is never taken over. On a row that it
// refuses, the WHERE puts the row's generation, times four, plus one when
// the row is live and two when it is paused, in the insert ID instead,
// writing nothing: a refusal says whether there is a row, a live one or a
// paused one, without another statement. Its arguments are the token,
// the holder, the timeout in milliseconds, the target, the timeout in
// microseconds, the generation to take over from (see backend.AcquireArgs)
// twice, FromExpired (1 or 0), and the timeout in microseconds again.
const takeOverSQL = `UPDATE job_lease SET
	lease_token = ?,
	generation  = LAST_INSERT_ID(generation + 1),
	holder      = ?,
	updated_at  = UTC_TIMESTAMP(6),
	acquired_at = UTC_TIMESTAMP(6),
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	timeout_ms  = ?
WHERE target_id = ?
  AND CASE WHEN paused_at IS NULL
            AND (released_at IS NOT NULL OR updated_at < UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND)
            AND (? < 0 OR (generation = ? AND (? = 0 OR released_at IS NULL))) THEN TRUE
       ELSE LAST_INSERT_ID(generation * 4 + 2 * (paused_at IS NOT NULL) + (released_at IS NULL
            AND updated_at >= UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND)) < 0 END`

// heldSQL reads the live lease, or the pause, that refused an acquire: the
// holder, the generation, whether it is still live and its age in
// microseconds, and its timeout in microseconds (the caller's, its one
// argument after the target, for a row that records none), whether it is
// paused, the pause's reason, the microseconds since its acquisition
// (NULL when it records none), and whether it is a minimum hold.
const heldSQL = `SELECT holder, generation,
	released_at IS NULL AND updated_at >= UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND,
	TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)), COALESCE(timeout_ms * 1000, ?),
	paused_at IS NOT NULL, COALESCE(pause_reason, ''),
	TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6)), ` + backend.MinHoldExpr + `
FROM job_lease WHERE target_id = ?`

// insertSQL creates the row of a target never acquired before, or whose
// row Prune deleted, above the generation floor; as in
// takeOverSQL, LAST_INSERT_ID(expr) returns the generation. IGNORE
// turns a duplicate key into a warning and zero rows: no error to translate
// (gorm's TranslateError setting does not matter) and nothing in the
// application's log for an acquire that is simply refused. IGNORE would
// also let through values that do not fit, but Acquire has checked them
// against the columns' sizes.
const insertSQL = `INSERT IGNORE INTO job_lease
	(target_id, lease_token, generation, holder, updated_at, acquired_at, released_at, timeout_ms)
SELECT ?, ?, LAST_INSERT_ID(COALESCE(MAX(generation), 0) + 1), ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, ?
FROM job_lease_floor`

// Server is what Backend knows of its server, which it asks once.
type Server struct {
	// MariaDB reports a MariaDB server, as opposed to MySQL.
	MariaDB bool
	// Returning reports that INSERT ... RETURNING is there: MariaDB 10.5
	// or later. MySQL has no RETURNING.
	Returning bool
	// Galera reports that the server replicates with Galera (wsrep_on).
	Galera bool
}

// probeSQL reads what the server is: its version, and whether it
// replicates with Galera (wsrep_on, which MySQL does not have).
const probeSQL = "SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'version')"

// Server reports what db's server is, asking it once, with probeSQL. When
// it cannot tell (the query fails), it reports false and asks again next
// time.
func (b *Backend) Server(ctx context.Context, db *gorm.DB) (Server, bool) {
	if s, ok := b.KnownServer(); ok {
		return s, true
	}
	rows, err := backend.Query(ctx, db, probeSQL)
	if err != nil {
		return Server{}, false
	}
	defer rows.Close()
	var s Server
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return Server{}, false
		}
		switch strings.ToLower(name) {
		case "wsrep_on":
			s.Galera = strings.EqualFold(value, "ON") || value == "1"
		case "version":
			s.MariaDB = strings.Contains(value, "MariaDB")
			s.Returning = s.MariaDB && atLeast(value, 10, 5)
		}
	}
	if rows.Err() != nil {
		return Server{}, false
	}
	b.server.Store(&s)
	return s, true
}

// KnownServer reports what b's server is, when Server has asked it,
// without asking.
func (b *Backend) KnownServer() (Server, bool) {
	if s := b.server.Load(); s != nil {
		return *s, true
	}
	return Server{}, false
}

// atLeast reports whether version, as the server reports it ("10.11.6-MariaDB-log"),
// is major.minor or later.
func atLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err1 := strconv.Atoi(parts[0])
	mnr, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// takenSQL is the condition, in upsertSQL's assignments after the first,
// that the first took the row: the row carries the acquire's token, which
// is new at every acquire, so no row carried it before.
const takenSQL = "job_lease.lease_token = VALUES(lease_token)"

// upsertSQL is every acquire of a target on MariaDB, in one statement and
// one round trip, whatever its outcome: an INSERT of the target's row,
// above the generation floor (the highest generation that Prune ever
// deleted), which, where the row exists, is the UPDATE of ON DUPLICATE KEY
// UPDATE instead.
//   - The UPDATE takes over a row that is free: not paused, and released or
//     expired by the timeout its holder recorded (the caller's for a row
//     that records none), on the database's clock, at the generation to
//     take over from (see backend.AcquireArgs). ON DUPLICATE KEY UPDATE has
//     no WHERE, and its assignments run left to right, each seeing the new
//     values of those before it: the first, lease_token, judges the old row
//     and takes the acquire's token only where the row is free; every later
//     one keeps the old value unless the row now carries that token
//     (takenSQL). The takeover is so one update of the row.
//   - On a row that is not free every assignment keeps the old value, and
//     InnoDB, finding the row unchanged, writes nothing (it locks the row
//     for the statement, as the UPDATE of the other statements does).
//   - RETURNING answers the row as the statement left it, also where it
//     changed nothing: its token says whether the acquire took it, and for
//     a refusal it is the lease that refused: the holder, the generation,
//     whether it is live, its age and timeout in microseconds, whether it
//     is paused and the pause's reason, the microseconds since its
//     acquisition (NULL when it records none) and whether it is a minimum
//     hold.
//
// The INSERT reads the floor as every INSERT ... SELECT does under
// REPEATABLE READ, with a shared lock, so that a Prune, which locks the
// floor first, runs before the acquire or after it, never between its read
// and its write. Its arguments are the target, the token, the holder, the
// timeout in milliseconds, the timeout in microseconds, the generation to
// take over from twice, and the timeout in microseconds twice more. An
// acquire from a generation above 0 must never make a row, which this
// statement cannot promise: it is takeOverSQL's.
const upsertSQL = `INSERT INTO job_lease
	(target_id, lease_token, generation, holder, updated_at, acquired_at, released_at, timeout_ms)
SELECT ?, ?, COALESCE(MAX(generation), 0) + 1, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, ?
FROM job_lease_floor
ON DUPLICATE KEY UPDATE
	lease_token = IF(job_lease.paused_at IS NULL
		AND (job_lease.released_at IS NOT NULL
			OR job_lease.updated_at < UTC_TIMESTAMP(6) - INTERVAL COALESCE(job_lease.timeout_ms * 1000, ?) MICROSECOND)
		AND (? < 0 OR job_lease.generation = ?), VALUES(lease_token), job_lease.lease_token),
	generation  = IF(` + takenSQL + `, job_lease.generation + 1, job_lease.generation),
	holder      = IF(` + takenSQL + `, VALUES(holder), job_lease.holder),
	updated_at  = IF(` + takenSQL + `, VALUES(updated_at), job_lease.updated_at),
	acquired_at = IF(` + takenSQL + `, VALUES(acquired_at), job_lease.acquired_at),
	released_at = IF(` + takenSQL + `, NULL, job_lease.released_at),
	failure     = IF(` + takenSQL + `, NULL, job_lease.failure),
	end_cause   = IF(` + takenSQL + `, NULL, job_lease.end_cause),
	ended_by    = IF(` + takenSQL + `, NULL, job_lease.ended_by),
	timeout_ms  = IF(` + takenSQL + `, VALUES(timeout_ms), job_lease.timeout_ms)
RETURNING lease_token, generation, holder,
	released_at IS NULL AND updated_at >= UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND,
	TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)), COALESCE(timeout_ms * 1000, ?),
	paused_at IS NOT NULL, COALESCE(pause_reason, ''),
	TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6)), ` + backend.MinHoldExpr

// Acquire takes the lease. On MariaDB 10.5 or later (Server) every acquire
// but one from a generation above 0 is upsertSQL, one statement whatever
// its outcome. Elsewhere (MySQL, which has no RETURNING), and for that
// one, it is acquireUpdate.
//
// A target whose last acquire here was refused (contended: RunWait and Do
// try it again and again, and so do other callers) is read first, on
// either path, with heldSQL, which does not lock: while its lease is live,
// or it is paused, the refusal is that one statement; once it is free, the
// acquire's statement follows. Both of those lock the row, even where they
// refuse it, so that contenders would take their turns at the row's lock:
// docs/performance.md measures the read first at twice the contended
// attempts of upsertSQL alone. rows remembers which targets those are.
func (b *Backend) Acquire(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	if held, _ := b.rows.Get(a.TargetID); held && a.From < 0 {
		got, err := b.held(ctx, db, a.TargetID, a.Timeout.Microseconds())
		if err == nil && (got.Held != nil || got.Paused) {
			return got, nil
		}
	}
	if a.From <= 0 {
		if s, ok := b.Server(ctx, db); ok && s.Returning {
			got, err := b.upsert(ctx, db, a)
			if err == nil {
				b.rows.Add(a.TargetID, got.Held != nil || got.Paused)
			}
			return got, err
		}
	}
	return b.acquireUpdate(ctx, db, a)
}

// upsert runs upsertSQL and reads its answer.
func (b *Backend) upsert(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	micros := a.Timeout.Microseconds()
	token := a.Token.String()
	// One value for all the columns: each would be an allocation of its
	// own, as Scan's destinations escape.
	r := new(struct {
		token, holder, reason  string
		generation, age, limit int64
		live, paused, minHold  bool
		heldFor                sql.NullInt64
	})
	found, err := backend.QueryRow(ctx, db, b.upsertSQL,
		[]any{a.TargetID, token, a.Holder, backend.TimeoutMillis(a.Timeout), micros, a.From, a.From, micros, micros},
		&r.token, &r.generation, &r.holder, &r.live, &r.age, &r.limit, &r.paused, &r.reason, &r.heldFor, &r.minHold)
	switch {
	case err != nil:
		return backend.Acquired{}, fmt.Errorf("acquire: %w", err)
	case !found:
		return backend.Acquired{}, errors.New("acquire: the statement answered no row")
	case r.token == token:
		return backend.Acquired{Taken: true, Generation: r.generation}, nil
	}
	got := backend.Acquired{Paused: r.paused}
	if r.paused {
		got.PauseReason = r.reason
	}
	if r.live {
		got.Held = backend.NewHeld(r.holder, r.generation, time.Duration(r.limit)*time.Microsecond, time.Duration(r.age)*time.Microsecond).
			Since(time.Duration(r.heldFor.Int64)*time.Microsecond, r.minHold)
	}
	return got, nil
}

// acquireUpdate is Acquire on MySQL, which has no RETURNING, and Acquire
// from a generation above 0. It cannot be one statement there: INSERT ...
// ON DUPLICATE KEY UPDATE cannot answer the row, and its RowsAffected means
// different things under clientFoundRows. So it is a conditional UPDATE
// and, only when that took nothing, a second statement: every acquire of a
// target whose row exists and is free is the one UPDATE. When the UPDATE
// found no row, the second is an INSERT: when that meets a row, another
// acquire created it after the UPDATE looked, the lease was held during
// this call, and refusing is right (only Prune deletes rows, and only rows
// not held). When the UPDATE refused a live lease, the second is heldSQL,
// which reads who holds it, or why it is paused: a statement answers a
// string only in rows. An acquire from a generation (From > 0) refused by a
// row that is neither live nor paused needs no second statement.
func (b *Backend) acquireUpdate(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	ms, micros := backend.TimeoutMillis(a.Timeout), a.Timeout.Microseconds()
	expired := 0
	if a.FromExpired {
		expired = 1
	}
	res, n, err := backend.Exec(ctx, db, b.takeOverSQL, a.Token.String(), a.Holder, ms, a.TargetID, micros, a.From, a.From, expired, micros)
	if err != nil {
		return backend.Acquired{}, fmt.Errorf("take over: %w", err)
	}
	if n > 0 {
		b.rows.Add(a.TargetID, false)
		gen, err := b.generation(ctx, db, res, a.Token.String(), a.TargetID)
		if err != nil {
			return backend.Acquired{}, fmt.Errorf("take over: %w", err)
		}
		return backend.Acquired{Taken: true, Generation: gen}, nil
	}
	refused, _ := res.LastInsertId()
	switch {
	case refused%4 != 0:
		b.rows.Add(a.TargetID, true)
		return b.held(ctx, db, a.TargetID, micros)
	case refused > 0 || a.From > 0:
		b.rows.Drop(a.TargetID)
		return backend.Acquired{}, nil // a row that is not live, or, for From, a row that exists or did
	}
	b.rows.Drop(a.TargetID)
	res, n, err = backend.Exec(ctx, db, b.insertSQL, a.TargetID, a.Token.String(), a.Holder, ms)
	if err != nil {
		return backend.Acquired{}, fmt.Errorf("insert: %w", err)
	}
	if n != 1 {
		return backend.Acquired{}, nil
	}
	gen, err := b.generation(ctx, db, res, a.Token.String(), a.TargetID)
	if err != nil {
		return backend.Acquired{}, fmt.Errorf("insert: %w", err)
	}
	return backend.Acquired{Taken: true, Generation: gen}, nil
}

// held reads the live lease, or the pause, on targetID that refused an
// acquire whose timeout was micros microseconds. Held is nil, and Paused
// false, when the lease ended (or the pause) since, or the read failed: the
// acquire was refused either way.
func (b *Backend) held(ctx context.Context, db *gorm.DB, targetID string, micros int64) (backend.Acquired, error) {
	var (
		holder, reason        string
		gen, age, timeout     int64
		live, paused, minHold bool
		heldFor               sql.NullInt64
	)
	found, err := backend.QueryRow(ctx, db, b.heldSQL, []any{micros, micros, targetID}, &holder, &gen, &live, &age, &timeout,
		&paused, &reason, &heldFor, &minHold)
	if err != nil || !found {
		return backend.Acquired{}, nil // refused all the same: the read only says by whom
	}
	got := backend.Acquired{Paused: paused, PauseReason: reason}
	if live {
		got.Held = backend.NewHeld(holder, gen, time.Duration(timeout)*time.Microsecond, time.Duration(age)*time.Microsecond).
			Since(time.Duration(heldFor.Int64)*time.Microsecond, minHold)
	}
	return got, nil
}

// readBackSQL reads which of the given rows an acquire took, by its token,
// which is new at every acquire.
const readBackSQL = `SELECT target_id, generation FROM job_lease WHERE target_id IN (%s) AND lease_token = ?`

// generation returns the generation that an acquire of one of keys, with
// token, wrote: from the reply's insert ID, where LAST_INSERT_ID(expr) put
// it, or, when the server reports none (it reports 0 when a trigger on the
// lease table ran a statement), by reading the row back.
func (b *Backend) generation(ctx context.Context, db *gorm.DB, res sql.Result, token string, keys ...string) (int64, error) {
	if id, err := res.LastInsertId(); err == nil && id > 0 {
		return id, nil
	}
	_, gen, err := b.readBack(ctx, db, token, keys)
	return gen, err
}

// readBack reads the key and generation of the row among keys that holds
// token.
func (b *Backend) readBack(ctx context.Context, db *gorm.DB, token string, keys []string) (string, int64, error) {
	args := make([]any, 0, len(keys)+1)
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, token)
	q := fmt.Sprintf(b.readBackSQL, strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", "))
	var (
		key string
		gen int64
	)
	found, err := backend.QueryRow(ctx, db, q, args, &key, &gen)
	switch {
	case err != nil:
		return "", 0, fmt.Errorf("read the generation back: %w", err)
	case !found:
		return "", 0, errors.New("read the generation back: no row holds the new token any more (taken over at once)")
	}
	return key, gen, nil
}

// slotSQL takes a free slot in one statement: an UPDATE of one row, at
// random, among the semaphore's rows that record its count and are
// released or expired. InnoDB locks the rows it reads before checking them,
// so concurrent acquires take their turns and each finds the slots that
// the others took live; a refusal changes no row. LAST_INSERT_ID(expr)
// returns, in the reply's insert ID, the new generation times
// slotFactor plus the slot's number (read from the key, after the
// separator, which starts at the byte the last argument names): MySQL has
// no RETURNING, and this keeps the acquire one round trip.
const slotSQL = `UPDATE job_lease SET
	lease_token = ?,
	generation  = LAST_INSERT_ID((generation + 1) * ` + slotFactorSQL + ` + CAST(SUBSTRING(target_id, ?) AS UNSIGNED)) DIV ` + slotFactorSQL + `,
	holder      = ?,
	updated_at  = UTC_TIMESTAMP(6),
	acquired_at = UTC_TIMESTAMP(6),
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	timeout_ms  = ?
WHERE target_id IN (%s) AND slots = ? AND paused_at IS NULL
  AND (released_at IS NOT NULL OR updated_at < UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND)
ORDER BY RAND() LIMIT 1`

// slotFactor is greater than backend.MaxSlots; slotFactorSQL is the same
// in the statement's text.
const (
	slotFactor    = 1024
	slotFactorSQL = "1024"
)

// AcquireSlot runs slotSQL.
func (b *Backend) AcquireSlot(ctx context.Context, db *gorm.DB, a backend.SlotArgs) (int, int64, bool, error) {
	keys := backend.SlotKeys(a.TargetID, a.Slots)
	args := []any{a.Token.String(), len(a.TargetID) + len(backend.SlotSeparator) + 1, a.Holder, backend.TimeoutMillis(a.Timeout)}
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, a.Slots, a.Timeout.Microseconds())
	stmt := fmt.Sprintf(b.slotSQL, strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", "))
	res, n, err := backend.Exec(ctx, db, stmt, args...)
	if err != nil || n == 0 {
		return 0, 0, false, err
	}
	if v, err := res.LastInsertId(); err == nil && v > 0 {
		return int(v % slotFactor), v / slotFactor, true, nil
	}
	// No insert ID (a trigger on the lease table ran a statement): the
	// row that took the token says which slot, and its generation.
	key, gen, err := b.readBack(ctx, db, a.Token.String(), keys)
	if err != nil {
		return 0, 0, false, err
	}
	_, slot, ok := backend.ParseSlotKey(key)
	if !ok {
		return 0, 0, false, fmt.Errorf("read the slot back: %q is not a slot's key", key)
	}
	return slot, gen, true, nil
}

// HeartbeatBatch renews many leases with two statements: MySQL has no
// RETURNING, so an UPDATE joined to the leases stamps the rows that are
// still theirs, and a SELECT with the same join then reads which those are.
// A lease that the SELECT finds was renewed by the UPDATE: tokens are never
// reused, so a row that carries the token, unreleased, carried it before.
// One taken over or released in between is reported lost, which only stops
// its work early. The SELECT also reads the stop requests (RequestStop)
// that apply to the leases, so that delivering them costs no statement.
func (b *Backend) HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
	var sb strings.Builder
	args := make([]any, 0, 2*len(leases))
	for i, l := range leases {
		if i == 0 {
			sb.WriteString("SELECT ? AS t, ? AS k")
		} else {
			sb.WriteString(" UNION ALL SELECT ?, ?")
		}
		args = append(args, l.TargetID, l.Token.String())
	}
	join := b.lease + " j JOIN (" + sb.String() + ") b ON j.target_id = b.t AND j.lease_token = b.k"
	if _, _, err := backend.Exec(ctx, db, "UPDATE "+join+" SET j.updated_at = UTC_TIMESTAMP(6) WHERE j.released_at IS NULL", args...); err != nil {
		return nil, err
	}
	rows, err := backend.Query(ctx, db, "SELECT j.target_id, j.lease_token, "+backend.StopRequest("j")+
		" FROM "+join+" WHERE j.released_at IS NULL", args...)
	if err != nil {
		return nil, err
	}
	return backend.ScanLost(rows, leases)
}

// State reads what a waiter needs of the row.
func (b *Backend) State(ctx context.Context, db *gorm.DB, targetID string) (backend.State, error) {
	return backend.ScanState(ctx, db, b.stateSQL, targetID)
}
