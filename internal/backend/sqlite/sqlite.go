// Package sqlite is the SQLite backend of gormlease, through
// github.com/ncruces/go-sqlite3/gormlite (pure Go) or another gorm
// dialector named "sqlite".
//
// SQLite has no row locks: gorm drops FOR UPDATE from the fenced commit's
// locking read. The fence is the database's single write lock instead: the
// fenced commit begins with BEGIN IMMEDIATE, so it holds the write lock from
// its first statement to its end, and an acquire that would take the lease
// over waits for it (up to the connection's busy timeout). Timestamps are
// text written by strftime on the database's clock, in UTC, and compared
// through julianday(), never as text, since drivers write time.Time values
// in other formats.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease/internal/backend"
)

// Backend is SQLite, with its statements written for its tables.
type Backend struct {
	backend.Common
	backend.Kit
	lease                                         string
	schemaSQL, acquireSQL, heartbeatSQL, stateSQL string
	indexSQL, eventSQL                            string
	slotSQL, heldSQL                              string
}

// now is the database's current time as the text the tables hold: UTC,
// with milliseconds.
const now = `strftime('%Y-%m-%d %H:%M:%f', 'now')`

// earlierText is col, a timestamp column, moved back by its one argument,
// a number of microseconds, in the text that now writes: the test kit's
// (backend.Kit).
func earlierText(col string) string {
	return "strftime('%Y-%m-%d %H:%M:%f', julianday(" + col + ") - ? / 86400000000.0)"
}

// New returns the SQLite backend for tables t.
func New(t backend.Tables) *Backend {
	d := backend.Dialect{
		Now:    now,
		Rebind: func(query string) string { return query },
		SecondsSince: func(col string) string {
			return "((julianday('now') - julianday(" + col + ")) * 86400.0)"
		},
		RaiseFloor: "INSERT INTO " + t.Floor() + " (id, generation) VALUES (1, ?)" +
			" ON CONFLICT (id) DO UPDATE SET generation = max(generation, excluded.generation)",
		// Serializable, which the ncruces driver always begins with
		// BEGIN IMMEDIATE, whatever the DSN's _txlock: the transaction
		// takes the write lock before its first statement. (The driver
		// refuses READ COMMITTED; SQLite transactions are serializable
		// anyway.)
		TxOptions:    &sql.TxOptions{Isolation: sql.LevelSerializable},
		SlotsTx:      &sql.TxOptions{Isolation: sql.LevelSerializable},
		InsertIgnore: "INSERT INTO",
		IgnoreSuffix: " ON CONFLICT (target_id) DO NOTHING",
		Fresh: func(col, ms string) string {
			return "(julianday('now') - julianday(" + col + ")) * 86400000.0 <= " + ms
		},
		// A julian day number, which julianday() reads back as it is.
		AddMillis: func(ts, ms string) string { return "(julianday(" + ts + ") + " + ms + " / 86400000.0)" },
		// Whole milliseconds (what the text holds) since the Unix epoch,
		// as microseconds: an integer that compares exactly.
		SortKey: func(ts string) string {
			return "(CAST(round((julianday(" + ts + ") - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
		},
		KeyMicros: func(key string) string { return "NULLIF(" + key + ", 9223372036854775807)" },
		MicrosKey: "CAST(? AS INTEGER)",
		LastKey:   "9223372036854775807",
	}
	return &Backend{
		Common:       backend.NewCommon(d, t),
		Kit:          backend.NewKit(d, t, earlierText),
		lease:        t.Lease,
		schemaSQL:    t.Expand(schema),
		indexSQL:     pausedIndex(t),
		eventSQL:     eventSQL(t),
		acquireSQL:   t.Expand(acquireSQL),
		heartbeatSQL: t.Expand(heartbeatBatchSQL),
		slotSQL:      t.Expand(slotSQL),
		heldSQL:      t.Expand(heldSQL),
		stateSQL: `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	(julianday('now') - julianday(updated_at)) * 86400.0,
	(julianday('now') - julianday(saved_at)) * 86400.0, 0, timeout_ms, holder, paused_at IS NOT NULL, pause_reason,
	COALESCE(stop_generation = generation, false), (julianday('now') - julianday(acquired_at)) * 86400.0, ` + backend.MinHoldExpr + `,
	(julianday('now') - julianday(released_at)) * 86400.0
FROM ` + t.Lease + ` WHERE target_id = ?`,
	}
}

// Capabilities: batched heartbeats. SQLite has no notifications, and its
// waiters poll.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{}
}

// addedColumns are the columns that later versions added to job_lease,
// which Migrate adds to a table made before them.
var addedColumns = []backend.Column{
	{Name: "saved_generation", DDL: "integer"},
	{Name: "saved_at", DDL: "datetime"},
	{Name: "failure", DDL: "text"},
	{Name: "timeout_ms", DDL: "integer"},
	{Name: "slots", DDL: "integer"},
	{Name: "hold_generation", DDL: "integer"},
	{Name: "paused_at", DDL: "datetime"},
	{Name: "pause_reason", DDL: "text"},
	{Name: "stop_generation", DDL: "integer"},
	{Name: "stop_reason", DDL: "text"},
	{Name: "acquired_at", DDL: "datetime"},
	{Name: "paused_by", DDL: "text"},
	{Name: "stop_by", DDL: "text"},
	{Name: "end_cause", DDL: "text"},
	{Name: "ended_by", DDL: "text"},
}

// schema is the DDL of docs/sqlite.md. The datetime column type makes
// the driver scan the timestamps into time.Time.
const schema = `
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
	timeout_ms  integer,
	slots       integer,
	hold_generation integer,
	paused_at   datetime,
	pause_reason text,
	stop_generation integer,
	stop_reason text,
	acquired_at datetime,
	paused_by   text,
	stop_by     text,
	end_cause   text,
	ended_by    text
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

// pausedIndex is the DDL of the index of the paused rows, by key (see
// docs/sqlite.md), for tables t: it comes after the columns that
// AddMissingColumns adds, paused_at among them. SQLite qualifies the
// index's name, not its table's, with the schema.
func pausedIndex(t backend.Tables) string {
	index, schema := t.PausedIndex()
	table := strings.TrimPrefix(t.Lease, schema)
	return "CREATE INDEX IF NOT EXISTS " + schema + index + " ON " + table + " (target_id) WHERE paused_at IS NOT NULL"
}

// Migrate runs the DDL in one write transaction: a concurrent Migrate
// waits for it.
func (b *Backend) Migrate(ctx context.Context, db *gorm.DB, history bool) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(b.schemaSQL).Error; err != nil {
			return err
		}
		if err := backend.AddMissingColumns(tx, b.lease, addedColumns); err != nil {
			return err
		}
		if err := tx.Exec(b.indexSQL).Error; err != nil {
			return err
		}
		if !history {
			return nil
		}
		if err := tx.Exec(b.eventSQL).Error; err != nil {
			return err
		}
		return backend.AddMissingColumns(tx, backend.Tables{Lease: b.lease}.Event(), addedEventColumns)
	}, b.TxOptions())
}

// acquireSQL takes the lease in one statement, as postgresAcquire does:
// the NOT EXISTS guard makes a refused acquire write nothing, and the
// ON CONFLICT ... WHERE re-checks the row under the write lock; both judge
// the row by the timeout its holder recorded, and the DO UPDATE never
// takes a paused row (admin.Operator.Pause). Ages are
// compared in seconds through julianday(). A target without a row starts
// above the generation floor, but only for an acquire of any generation
// or from 0: from a generation above 0 (backend.AcquireArgs.From) the
// SELECT yields nothing where there is no row, so that no row is made for
// a generation that is gone. The statement holds the write lock from its
// start, so no Prune can commit while it runs.
const acquireSQL = `
INSERT INTO job_lease AS l (target_id, lease_token, generation, holder, updated_at, acquired_at, released_at, timeout_ms)
SELECT ?1, ?2, COALESCE((SELECT generation FROM job_lease_floor WHERE id = 1), 0) + 1, ?3, ` + now + `, ` + now + `, NULL, ?6
WHERE NOT EXISTS (
	SELECT 1 FROM job_lease
	WHERE target_id = ?1 AND released_at IS NULL
	  AND (julianday('now') - julianday(updated_at)) * 86400.0 <= COALESCE(timeout_ms / 1000.0, ?4))
  AND (?5 <= 0 OR EXISTS (SELECT 1 FROM job_lease WHERE target_id = ?1))
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	acquired_at = excluded.acquired_at,
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	timeout_ms  = excluded.timeout_ms
WHERE l.paused_at IS NULL
  AND (l.released_at IS NOT NULL
    OR (julianday('now') - julianday(l.updated_at)) * 86400.0 > COALESCE(l.timeout_ms / 1000.0, ?4))
  AND (?5 < 0 OR (l.generation = ?5 AND (NOT ?7 OR l.released_at IS NULL)))
RETURNING generation`

// heldSQL reads the live lease, or the pause, that refused an acquire: the
// holder, the generation, whether it is live, its age in seconds and its
// timeout in seconds, the caller's (the second argument) for a row that
// records none, whether it is paused and the pause's reason, the seconds
// since its acquisition (NULL when it records none) and whether it is a
// minimum hold.
const heldSQL = `
SELECT holder, generation,
	released_at IS NULL AND (julianday('now') - julianday(updated_at)) * 86400.0 <= COALESCE(timeout_ms / 1000.0, ?2),
	(julianday('now') - julianday(updated_at)) * 86400.0, COALESCE(timeout_ms / 1000.0, ?2),
	paused_at IS NOT NULL, COALESCE(pause_reason, ''),
	(julianday('now') - julianday(acquired_at)) * 86400.0, ` + backend.MinHoldExpr + `
FROM job_lease WHERE target_id = ?1`

// Acquire runs acquireSQL and, when it refused, heldSQL: SQLite's RETURNING
// answers only the rows that a statement wrote, and a refusal writes none.
// The database is in the process, so the second statement costs no round
// trip over a network; the lease it reads is the one that refused, unless
// another connection ended it in between, or the read failed, when Held is
// nil.
func (b *Backend) Acquire(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	var generation int64
	ok, err := backend.QueryRow(ctx, db, b.acquireSQL,
		[]any{a.TargetID, a.Token.String(), a.Holder, a.Timeout.Seconds(), a.From, backend.TimeoutMillis(a.Timeout), a.FromExpired}, &generation) // the token as text
	if err != nil || ok {
		return backend.Acquired{Taken: ok, Generation: generation}, err
	}
	var (
		holder, reason        string
		live, paused, minHold bool
		age, timeout          float64
		heldFor               sql.NullFloat64
		heldGeneration        int64
	)
	found, err := backend.QueryRow(ctx, db, b.heldSQL, []any{a.TargetID, a.Timeout.Seconds()}, &holder, &heldGeneration, &live,
		&age, &timeout, &paused, &reason, &heldFor, &minHold)
	if err != nil || !found {
		return backend.Acquired{}, nil // refused all the same: the read only says by whom
	}
	got := backend.Acquired{Paused: paused, PauseReason: reason}
	if live {
		got.Held = backend.NewHeld(holder, heldGeneration, backend.Seconds(timeout), backend.Seconds(age)).
			Since(backend.Seconds(heldFor.Float64), minHold)
	}
	return got, nil
}

// slotSQL takes a free slot in one statement: the subquery picks one of
// the semaphore's rows that records its count and is released or expired,
// at random, and the UPDATE takes it; the statement holds the write lock
// from its start, so no other step changes the rows in between. When no
// row qualifies, nothing is written. Its arguments are the keys of the slot
// rows as a JSON array, the token, the holder, the timeout in seconds and in
// milliseconds, and the count.
const slotSQL = `
UPDATE job_lease SET
	lease_token = ?2,
	generation  = generation + 1,
	holder      = ?3,
	updated_at  = ` + now + `,
	acquired_at = ` + now + `,
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	timeout_ms  = ?5
WHERE target_id = (
	SELECT target_id FROM job_lease
	WHERE target_id IN (SELECT value FROM json_each(?1)) AND slots = ?6 AND paused_at IS NULL
	  AND (released_at IS NOT NULL
	    OR (julianday('now') - julianday(updated_at)) * 86400.0 > COALESCE(timeout_ms / 1000.0, ?4))
	ORDER BY random() LIMIT 1)
RETURNING target_id, generation`

// AcquireSlot runs slotSQL.
func (b *Backend) AcquireSlot(ctx context.Context, db *gorm.DB, a backend.SlotArgs) (int, int64, bool, error) {
	keys, err := json.Marshal(backend.SlotKeys(a.TargetID, a.Slots))
	if err != nil {
		return 0, 0, false, err
	}
	var key string
	var generation int64
	ok, err := backend.QueryRow(ctx, db, b.slotSQL,
		[]any{string(keys), a.Token.String(), a.Holder, a.Timeout.Seconds(), backend.TimeoutMillis(a.Timeout), a.Slots}, &key, &generation)
	if err != nil || !ok {
		return 0, 0, false, err
	}
	_, slot, _ := backend.ParseSlotKey(key)
	return slot, generation, true, nil
}

// MinBusyTimeout is the shortest busy timeout accepted on an SQLite
// connection. SQLite has one write lock per database file: a step that
// finds it taken waits for it up to the busy timeout, and without one it
// fails at once with "database is locked". The ncruces driver sets a busy
// timeout of one minute unless the DSN sets PRAGMAs; a DSN that does must
// set busy_timeout too, first: _pragma=busy_timeout(10000).
const MinBusyTimeout = time.Second

// CheckSettings refuses a connection whose busy timeout is shorter than
// MinBusyTimeout, saying how to fix the DSN. It reads one PRAGMA from one
// connection of the pool; a DSN sets the same PRAGMAs on every one.
func (b *Backend) CheckSettings(ctx context.Context, db *gorm.DB) error {
	var ms int64
	quiet := db.Session(&gorm.Session{Logger: logger.Discard}) // not one of the steps
	if err := quiet.WithContext(ctx).Raw("PRAGMA busy_timeout").Scan(&ms).Error; err != nil {
		return fmt.Errorf("read sqlite busy_timeout: %w", err)
	}
	if timeout := time.Duration(ms) * time.Millisecond; timeout < MinBusyTimeout {
		return &backend.SettingsError{Problem: fmt.Sprintf("sqlite busy_timeout is %v, less than %v: concurrent steps would fail with "+
			"\"database is locked\"; set it in the DSN, before other PRAGMAs, as "+
			"file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)", timeout, MinBusyTimeout)}
	}
	return nil
}

// heartbeatBatchSQL renews many leases in one statement. The leases
// travel as one JSON array of [target, token] pairs, so that the statement's
// text is the same whatever their number. It answers each lease renewed,
// with the stop request (RequestStop) that applies to it, if any (see
// backend.StopRequest).
const heartbeatBatchSQL = `
UPDATE job_lease AS l SET updated_at = ` + now + `
FROM (SELECT json_extract(value, '$[0]') AS b_target, json_extract(value, '$[1]') AS b_token
      FROM json_each(?)) AS b
WHERE l.target_id = b.b_target AND l.lease_token = b.b_token
  AND l.released_at IS NULL
RETURNING target_id, lease_token, CASE WHEN stop_generation = generation THEN COALESCE(stop_reason, '') END`

// HeartbeatBatch runs heartbeatBatchSQL.
func (b *Backend) HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
	pairs := make([][2]string, len(leases))
	for i, l := range leases {
		pairs[i] = [2]string{l.TargetID, l.Token.String()}
	}
	data, err := json.Marshal(pairs)
	if err != nil {
		return nil, err
	}
	rows, err := backend.Query(ctx, db, b.heartbeatSQL, string(data))
	if err != nil {
		return nil, err
	}
	return backend.ScanLost(rows, leases)
}

// State reads what a waiter needs of the row.
func (b *Backend) State(ctx context.Context, db *gorm.DB, targetID string) (backend.State, error) {
	return backend.ScanState(ctx, db, b.stateSQL, targetID)
}
