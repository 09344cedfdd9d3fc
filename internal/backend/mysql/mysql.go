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
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// Backend is MySQL or MariaDB, with its statements written for its tables.
type Backend struct {
	backend.Common
	lease                                       string
	leaseDDL, resultDDL, takeOverSQL, insertSQL string
	floorDDL, floorRow, stateSQL, slotSQL       string
	readBackSQL                                 string
}

// New returns the MySQL backend for tables t.
func New(t backend.Tables) *Backend {
	return &Backend{
		Common: backend.NewCommon(backend.Dialect{
			Name: "mysql",
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
			TxOptions:    &sql.TxOptions{Isolation: sql.LevelReadCommitted},
			Lock:         " FOR UPDATE",
			InsertIgnore: "INSERT IGNORE INTO",
		}, t),
		lease:       t.Lease,
		leaseDDL:    t.Expand(leaseTable),
		resultDDL:   t.Expand(resultTable),
		takeOverSQL: t.Expand(takeOverSQL),
		slotSQL:     t.Expand(slotSQL),
		insertSQL:   t.Expand(insertSQL),
		readBackSQL: t.Expand(readBackSQL),
		floorDDL:    t.Expand(floorTable),
		floorRow:    t.Expand(floorRow),
		stateSQL: `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)) / 1e6,
	TIMESTAMPDIFF(MICROSECOND, saved_at, UTC_TIMESTAMP(6)) / 1e6, false, timeout_ms
FROM ` + t.Lease + ` WHERE target_id = ?`,
	}
}

// Capabilities: batched heartbeats. MySQL has no notifications, and its
// waiters poll.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{BatchHeartbeat: true}
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
	PRIMARY KEY (target_id)
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
func (b *Backend) Migrate(ctx context.Context, db *gorm.DB) error {
	if err := CheckTimes(ctx, db); err != nil {
		return err
	}
	for _, ddl := range []string{b.leaseDDL, b.resultDDL, b.floorDDL, b.floorRow} {
		if err := db.Exec(ddl).Error; err != nil {
			return err
		}
	}
	// MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has).
	return backend.AddMissingColumns(db, b.lease, addedColumns)
}

// addedColumns are the columns that later versions added to job_lease,
// which Migrate adds to a table made before them.
var addedColumns = []backend.Column{
	{Name: "saved_generation", DDL: "bigint NULL"},
	{Name: "saved_at", DDL: "datetime(6) NULL"},
	{Name: "failure", DDL: "varchar(255) NULL"},
	{Name: "timeout_ms", DDL: "bigint NULL"},
	{Name: "slots", DDL: "int NULL"},
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
const takeOverSQL = `UPDATE job_lease SET
	lease_token = ?,
	generation  = LAST_INSERT_ID(generation + 1),
	holder      = ?,
	updated_at  = UTC_TIMESTAMP(6),
	released_at = NULL,
	failure     = NULL,
	timeout_ms  = ?
WHERE target_id = ?
  AND (released_at IS NOT NULL OR updated_at < UTC_TIMESTAMP(6) - INTERVAL COALESCE(timeout_ms * 1000, ?) MICROSECOND)
  AND (? < 0 OR generation = ?)`

// insertSQL creates the row of a target never acquired before, or whose
// row Prune deleted, above the generation floor; as in
// takeOverSQL, LAST_INSERT_ID(expr) returns the generation. IGNORE
// turns a duplicate key into a warning and zero rows: no error to translate
// (gorm's TranslateError setting does not matter) and nothing in the
// application's log for an acquire that is simply refused. IGNORE would
// also let through values that do not fit, but Acquire has checked them
// against the columns' sizes.
const insertSQL = `INSERT IGNORE INTO job_lease
	(target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT ?, ?, LAST_INSERT_ID(COALESCE(MAX(generation), 0) + 1), ?, UTC_TIMESTAMP(6), NULL, ?
FROM job_lease_floor`

// Acquire cannot be one statement here: INSERT ... ON DUPLICATE KEY UPDATE
// has no WHERE (gorm's OnConflict{Where} drops it silently), and its
// RowsAffected means different things under clientFoundRows. So it is a
// conditional UPDATE and, only when that took nothing, an INSERT. Every
// acquire of a target whose row exists is the one UPDATE. When the INSERT
// meets a row, another acquire created it after the UPDATE looked: the
// lease was held during this call, and refusing is right. (Only Prune
// deletes rows, and only rows not held.)
func (b *Backend) Acquire(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (int64, bool, error) {
	ms := backend.TimeoutMillis(a.Timeout)
	res, n, err := backend.Exec(ctx, db, b.takeOverSQL, a.Token.String(), a.Holder, ms, a.TargetID, a.Timeout.Microseconds(), a.From, a.From)
	if err != nil {
		return 0, false, fmt.Errorf("take over: %w", err)
	}
	if n > 0 {
		gen, err := b.generation(ctx, db, res, a.Token.String(), a.TargetID)
		if err != nil {
			return 0, false, fmt.Errorf("take over: %w", err)
		}
		return gen, true, nil
	}
	if a.From > 0 {
		return 0, false, nil // a row exists, or did: it is not a target never acquired
	}
	res, n, err = backend.Exec(ctx, db, b.insertSQL, a.TargetID, a.Token.String(), a.Holder, ms)
	if err != nil {
		return 0, false, fmt.Errorf("insert: %w", err)
	}
	if n != 1 {
		return 0, false, nil
	}
	gen, err := b.generation(ctx, db, res, a.Token.String(), a.TargetID)
	if err != nil {
		return 0, false, fmt.Errorf("insert: %w", err)
	}
	return gen, true, nil
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
	released_at = NULL,
	failure     = NULL,
	timeout_ms  = ?
WHERE target_id IN (%s) AND slots = ?
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
// its work early.
func (b *Backend) HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []backend.Lease) (map[backend.Lease]bool, error) {
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
	rows, err := backend.Query(ctx, db, "SELECT j.target_id, j.lease_token FROM "+join+" WHERE j.released_at IS NULL", args...)
	if err != nil {
		return nil, err
	}
	return backend.ScanLost(rows, leases)
}

// State reads what a waiter needs of the row.
func (b *Backend) State(ctx context.Context, db *gorm.DB, targetID string) (backend.State, error) {
	return backend.ScanState(ctx, db, b.stateSQL, targetID)
}
