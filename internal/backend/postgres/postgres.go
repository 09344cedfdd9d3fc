// Package postgres is the PostgreSQL backend of gormlease (and of the
// databases that speak its SQL through gorm.io/driver/postgres): its
// statements, its migration, and its notifications to waiters, by
// LISTEN/NOTIFY on the channel that Channel names.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// Channel is the channel on which the statements that end a waited-for
// generation notify, with the lease table's name and the target, separated
// by a space, as the payload.
const Channel = "gormlease"

// Backend is PostgreSQL, with its statements written for its tables.
type Backend struct {
	backend.Common
	backend.Kit
	lease                   string
	schemaSQL, heartbeatSQL string
	historySQL              string
	heartbeatParts          [3]string // heartbeatSQL before $1, between $1 and $2, and after $2
	saveReleaseParts        [3]string // the statement of backend.SaveRelease, cut so too (see beginLocked)
	saveReleaseSQL          string    // the statement of backend.SaveRelease (see beginPipelined)
	beginSaveReleaseSQL     string    // BEGIN and that statement, as beginPipelined reports them
	acquireSQL, rowSQL      string
	takeOverSQL             string
	stateSQL, markSQL       string
	slotSQL, readSavedSQL   string
	// oneTripRefused is set once the driver refused to begin the fenced
	// transaction and lock the row in one query (see beginOnConn).
	oneTripRefused atomic.Bool
	// bytewise is 1 once List found that target_id orders byte for byte,
	// -1 once it found not, 0 before it looked.
	bytewise atomic.Int32
	// rows are the targets whose rows Acquire has seen exist, and whether
	// their last acquire found them held: what picks its statement.
	rows backend.Seen

	mu     sync.Mutex
	config *pgx.ConnConfig // the pool's connection settings, once Listen read them
}

// New returns the PostgreSQL backend for tables t.
func New(t backend.Tables) *Backend {
	b := &Backend{
		lease:        t.Lease,
		schemaSQL:    schemaSQL(t),
		historySQL:   historySQL(t),
		acquireSQL:   t.Expand(AcquireSQL),
		rowSQL:       t.Expand(AcquireRowSQL),
		takeOverSQL:  t.Expand(TakeOverSQL),
		heartbeatSQL: t.Expand(heartbeatBatchSQL),
		slotSQL:      t.Expand(slotSQL),
		stateSQL: `SELECT generation, released_at IS NOT NULL, COALESCE(saved_generation, 0), failure,
	EXTRACT(EPOCH FROM clock_timestamp() - updated_at), EXTRACT(EPOCH FROM clock_timestamp() - saved_at), waiting, timeout_ms, holder, paused_at IS NOT NULL, pause_reason,
	COALESCE(stop_generation = generation, false), EXTRACT(EPOCH FROM clock_timestamp() - acquired_at), ` + backend.MinHoldExpr + `,
	EXTRACT(EPOCH FROM clock_timestamp() - released_at)
FROM ` + t.Lease + ` WHERE target_id = $1`,
		readSavedSQL: `SELECT COALESCE(saved_generation, 0), lease_token, released_at IS NOT NULL FROM ` + t.Lease +
			` WHERE target_id = $1 FOR UPDATE`,
		// markSQL marks the row of a live generation, or of a paused
		// target, as waited on, so that the statement that ends it, or the
		// Resume, notifies. It locks the row: it runs wholly before that
		// statement, which then sees the mark, or wholly after it, when it
		// finds the generation ended (or the pause) and changes nothing.
		markSQL: `UPDATE ` + t.Lease + ` SET waiting = true
WHERE target_id = $1 AND generation = $2 AND (released_at IS NULL OR paused_at IS NOT NULL) AND NOT waiting`,
	}
	head, rest, _ := strings.Cut(b.heartbeatSQL, "$1")
	mid, tail, _ := strings.Cut(rest, "$2")
	b.heartbeatParts = [3]string{head, mid, tail}
	d := dialect(t)
	d.PrefixRange = b.bytewiseOrder
	b.Common = backend.NewCommon(d, t)
	b.SetPendingEvent(t.Expand(pendingEventSQL))
	b.Kit = backend.NewKit(d, t, func(col string) string {
		return "(" + col + " - CAST(? AS bigint) * interval '1 microsecond')"
	})
	b.saveReleaseSQL = b.OwnSQL(backend.SaveRelease)
	b.beginSaveReleaseSQL = beginSQL + "; " + b.saveReleaseSQL
	head, rest, _ = strings.Cut(b.saveReleaseSQL, "$1")
	mid, tail, _ = strings.Cut(rest, "$2")
	b.saveReleaseParts = [3]string{head, mid, tail}
	return b
}

// dialect is what PostgreSQL's SQL writes differently, for tables t.
func dialect(t backend.Tables) backend.Dialect {
	return backend.Dialect{
		// clock_timestamp(): now() is frozen at the start of the
		// transaction, so after waiting on a row lock it would stamp the
		// lease older than it is.
		Now:    "clock_timestamp()",
		Rebind: numbered,
		// From statement_timestamp(), the same for every row of a
		// statement, so that a row's state and age agree.
		SecondsSince: func(col string) string {
			return "CAST(EXTRACT(EPOCH FROM statement_timestamp() - " + col + ") AS double precision)"
		},
		Notify:    notifySuffix(t.Lease),
		RowLock:   " FOR UPDATE SKIP LOCKED",
		FloorLock: " FOR UPDATE",
		RaiseFloor: "INSERT INTO " + t.Floor() + " AS f (id, generation) VALUES (1, ?)" +
			" ON CONFLICT (id) DO UPDATE SET generation = GREATEST(f.generation, excluded.generation)",
		// READ COMMITTED whatever the session default: under REPEATABLE
		// READ, a heartbeat committed after the transaction's snapshot
		// makes the locking read fail with a serialization error (40001).
		TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		Lock:      " FOR UPDATE",
		// A transaction-scoped advisory lock (it works through pgbouncer's
		// transaction pooling), in a key space of two int4 keys apart from
		// the bigint one of the migration's lock.
		LockTarget:   "SELECT pg_advisory_xact_lock(hashtext(?), hashtext(?))",
		SlotsTx:      &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		InsertIgnore: "INSERT INTO",
		IgnoreSuffix: " ON CONFLICT (target_id) DO NOTHING",
		LeaseColumns: ", waiting",
		// Timestamps compared and ordered as they are: an age in seconds
		// (EXTRACT gives a numeric) costs twice as much a row.
		Fresh: func(col, ms string) string {
			return col + " >= statement_timestamp() - " + ms + " * interval '1 millisecond'"
		},
		AddMillis: func(ts, ms string) string { return "(" + ts + " + " + ms + " * interval '1 millisecond')" },
		SortKey:   func(ts string) string { return ts },
		KeyMicros: func(key string) string {
			return "CASE WHEN isfinite(" + key + ") THEN CAST(EXTRACT(EPOCH FROM " + key + ") * 1000000 AS bigint) END"
		},
		MicrosKey: "(TIMESTAMPTZ 'epoch' + CAST(? AS bigint) * interval '1 microsecond')",
		LastKey:   "TIMESTAMPTZ 'infinity'",
	}
}

// notifySuffix is appended to the statements that end a generation or save
// its result: when a waiter has marked the row (see MarkWaiting), it sends
// the lease table's name and the target on Channel. The notification is
// delivered when the transaction commits, and only then. Rows nobody waits
// on send nothing, so that jobs nobody waits for do not pay NOTIFY's cost:
// PostgreSQL serialises the commits of all transactions that notify.
func notifySuffix(lease string) string {
	return " RETURNING CASE WHEN waiting THEN pg_notify('" + Channel + "', '" + lease + " ' || target_id) END"
}

// Capabilities: notifications and batched heartbeats.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Notify: true}
}

// Schema is the DDL of docs/schema.sql. updated_at and released_at
// stay unindexed and the fill factor leaves room on each page, so that
// heartbeats and releases are HOT updates that touch no index. The one
// index of the operator's reads, job_lease_paused, holds the paused rows
// only, by key: heartbeats, acquires and releases change neither the key
// nor paused_at, its condition, so they stay HOT; only Pause and Resume
// change it. The scans of the whole table that the operator's reads make
// run without parallel workers, whose start costs more than they save at
// the table's usual sizes, the more so on a busy server (see
// docs/schema.sql).
const Schema = `
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
	ADD COLUMN IF NOT EXISTS timeout_ms       bigint,
	ADD COLUMN IF NOT EXISTS slots            integer,
	ADD COLUMN IF NOT EXISTS hold_generation  bigint,
	ADD COLUMN IF NOT EXISTS paused_at        timestamptz,
	ADD COLUMN IF NOT EXISTS pause_reason     varchar(255),
	ADD COLUMN IF NOT EXISTS stop_generation  bigint,
	ADD COLUMN IF NOT EXISTS stop_reason      varchar(255),
	ADD COLUMN IF NOT EXISTS acquired_at      timestamptz,
	ADD COLUMN IF NOT EXISTS paused_by        varchar(255),
	ADD COLUMN IF NOT EXISTS stop_by          varchar(255),
	ADD COLUMN IF NOT EXISTS end_cause        varchar(16),
	ADD COLUMN IF NOT EXISTS ended_by         varchar(255);
CREATE INDEX IF NOT EXISTS job_lease_paused ON job_lease (target_id) WHERE paused_at IS NOT NULL;
ALTER TABLE job_lease SET (parallel_workers = 0);
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

// schemaSQL is Schema for tables t. The index takes its schema from the
// table, so its name in CREATE INDEX is never qualified.
func schemaSQL(t backend.Tables) string {
	index, _ := t.PausedIndex()
	return strings.Replace(t.Expand(Schema), " "+t.Lease+"_paused ON ", " "+index+" ON ", 1)
}

// migrateLock is the advisory lock key that serialises concurrent
// migrations: CREATE TABLE IF NOT EXISTS alone can fail with a unique
// violation when two sessions create the same table at once.
const migrateLock = 0x676f726d6c6561 // "gormlea"

// migrateAttempts bounds how often Migrate runs the DDL when concurrent
// migrations without the advisory lock keep colliding: each collision
// leaves one more object made, and there are fewer objects than attempts.
const migrateAttempts = 10

// errNoAdvisoryLock marks the failure of the migration's advisory lock on a
// server that lacks it.
var errNoAdvisoryLock = errors.New("no advisory lock")

// Migrate runs the DDL in a transaction that first takes an advisory lock,
// so that concurrent migrations run one after another. Where the server has
// no such lock (CockroachDB before transaction-level advisory locks, or
// YugabyteDB without its advisory-lock flags) the DDL runs without it:
// every statement of the DDL does nothing for what exists (IF NOT EXISTS,
// ON CONFLICT DO NOTHING), so a migration that collides with a concurrent
// one, and fails for it, is run again until it finds everything made.
func (b *Backend) Migrate(ctx context.Context, db *gorm.DB, history bool) error {
	ddl := b.schemaSQL
	if history {
		ddl += b.historySQL // Schema ends with its semicolon
	}
	lock := true
	wait := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		err := db.Transaction(func(tx *gorm.DB) error {
			if lock {
				if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", migrateLock).Error; err != nil {
					if st := backend.SQLState(err); st == "42883" || st == "0A000" { // undefined function, not supported
						return fmt.Errorf("%w: %w", errNoAdvisoryLock, err)
					}
					return err
				}
			}
			return tx.Exec(ddl).Error
		})
		switch {
		case err == nil:
			return nil
		case lock && errors.Is(err, errNoAdvisoryLock):
			lock = false
			continue
		case lock || attempt >= migrateAttempts || !migrationCollision(err) || !wait.Wait(ctx):
			return err
		}
	}
}

// migrationCollision reports whether err is what a DDL statement meets when
// a concurrent one makes the same object: a duplicate in the catalog, or a
// serialization failure or deadlock between the two transactions.
func migrationCollision(err error) bool {
	switch backend.SQLState(err) {
	case "23505", "42P07", "42701", "42710", "40001", "40P01":
		return true
	}
	return false
}

// TakeOverSQL takes over the target's row where it is released or expired:
// a plain UPDATE, which locks and rewrites the row in place (a HOT update),
// with no speculative insert and no row lock of its own before it. An
// UPDATE whose WHERE fails on the row its snapshot shows, a live lease,
// locks and writes nothing. It judges the row by the timeout its holder
// recorded (timeout_ms), so that a caller with a shorter timeout never takes
// over a lease that its holder still trusts; a row without one (written
// before the column existed) by the caller's. Its arguments are the target,
// the token, the holder, the timeout in microseconds, the generation to take
// over from (see backend.AcquireArgs), the timeout in milliseconds, and
// whether that generation must still be unreleased (FromExpired); the
// casts give each the one type that all its uses agree on. The timeout is an
// integer times interval '1 microsecond', not make_interval, which
// CockroachDB lacks (see docs/scaling.md). docs/performance.md measures this
// shape against the INSERT ... ON CONFLICT DO UPDATE of earlier versions.
const TakeOverSQL = `
UPDATE job_lease AS l SET` + takeOverSetSQL + `
WHERE l.target_id = CAST($1 AS varchar)
  AND ` + freeSQL + `
  AND (CAST($5 AS bigint) < 0 OR (l.generation = $5 AND (NOT CAST($7 AS boolean) OR l.released_at IS NULL)))
RETURNING l.generation`

// takeOverSetSQL is the SET list of every takeover, of a target's row
// (TakeOverSQL) or of a slot's (slotSQL): a fresh token ($2), the next
// generation, the caller's holder name ($3) and timeout in milliseconds
// ($6), the database's time as the last heartbeat and as the acquisition
// of the new generation (acquired_at, "held since"), and the last lease's
// release, failure, end cause and waiters cleared. A column that a takeover sets is
// added here, once.
const takeOverSetSQL = `
	lease_token = CAST($2 AS uuid),
	generation  = l.generation + 1,
	holder      = CAST($3 AS varchar),
	updated_at  = clock_timestamp(),
	acquired_at = clock_timestamp(),
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	waiting     = false,
	timeout_ms  = CAST($6 AS bigint)`

// freeSQL is the condition that a row may be taken over: not paused
// (admin.Operator.Pause), and released, or its last heartbeat older than the
// timeout its holder recorded, or, for a row that records none, the
// caller's timeout in microseconds ($4). A paused row so refuses every
// takeover in the takeover's own statement, writing nothing.
const freeSQL = `(paused_at IS NULL AND (released_at IS NOT NULL
    OR updated_at < clock_timestamp() - COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond'))`

// curSQL reads, as the CTE cur of AcquireSQL, the target's row as the
// statement's snapshot shows it: its generation and holder, whether it is
// unreleased, its age on the database's clock (one reading of
// clock_timestamp(), which judges the row and measures what is left of it
// alike), and its timeout in microseconds, the caller's for a row that
// records none, and whether it is paused, with the pause's reason, the
// time since its acquisition (NULL when it records none), and whether it
// is a minimum hold. Its arguments are the target ($1) and the caller's
// timeout in microseconds ($4).
const curSQL = `cur AS (
	SELECT generation, holder, released_at IS NULL AS unreleased, clock_timestamp() - updated_at AS age,
		COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) AS micros, paused_at IS NOT NULL AS paused, pause_reason,
		clock_timestamp() - acquired_at AS held, ` + backend.MinHoldExpr + ` AS minhold
	FROM job_lease WHERE target_id = CAST($1 AS varchar)
)`

// liveSQL is the condition, on cur, that its row is a live lease: the
// negation of TakeOverSQL's.
const liveSQL = `COALESCE(cur.unreleased AND cur.age <= cur.micros * interval '1 microsecond', false)`

// pausedSQL is the condition, on cur, that its row is paused.
const pausedSQL = `COALESCE(cur.paused, false)`

// refusalSQL is what AcquireSQL answers after the generation that it took
// (NULL when it took nothing), on one row whatever it did: the row that cur
// read: holder, generation, whether it is live, its age in seconds and its
// timeout in microseconds (NULLs without a row), whether it is paused and
// the pause's reason, the seconds since its acquisition ("held for", NULL
// when it records none) and whether it is a minimum hold.
const refusalSQL = `cur.holder, cur.generation, ` + liveSQL + `,
	CAST(EXTRACT(EPOCH FROM cur.age) AS double precision), cur.micros, ` + pausedSQL + `, cur.pause_reason,
	CAST(EXTRACT(EPOCH FROM cur.held) AS double precision), COALESCE(cur.minhold, false)
FROM (VALUES (1)) AS one (x) LEFT JOIN cur ON true`

// AcquireSQL is every acquire of a target, in one statement and one round
// trip, whatever its outcome: a data-modifying CTE whose parts all see one
// snapshot of the row (cur).
//   - took is TakeOverSQL: a free row (released or expired) is taken by the
//     one UPDATE, a HOT update in place. A live row it neither locks nor
//     writes. When it waits for another acquire's lock on the row, it
//     judges the row that acquire left.
//   - ins creates the row only where the snapshot shows none: a target
//     never acquired, or whose row Prune deleted. It starts above the
//     generation floor, the highest generation that Prune ever deleted
//     (Prune raises the floor in the transaction that deletes, so one
//     snapshot shows both or neither). Where another acquire's row is there
//     by then, ON CONFLICT DO NOTHING refuses, writing nothing. Where the
//     snapshot shows a row, ins does not run its INSERT at all: a refusal
//     by a live lease writes nothing.
//   - The answer is one row: the generation taken, by either part (NULL
//     when neither took), then the row as cur read it (refusalSQL), so that
//     a refusal says which lease refused it with no statement of its own.
//
// Its arguments are TakeOverSQL's: the target, the token, the holder, the
// timeout in microseconds, the generation to take over from (see
// backend.AcquireArgs: a row is made only for AnyGeneration and 0), the
// timeout in milliseconds and FromExpired. docs/performance.md measures this shape against
// an UPDATE followed, when that took nothing, by an INSERT.
const AcquireSQL = `
WITH ` + curSQL + `, took AS (` + TakeOverSQL + `
), ins AS (
	INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, acquired_at, released_at, timeout_ms)
	SELECT CAST($1 AS varchar), CAST($2 AS uuid),
		COALESCE((SELECT generation FROM job_lease_floor WHERE id = 1), 0) + 1,
		CAST($3 AS varchar), clock_timestamp(), clock_timestamp(), NULL, CAST($6 AS bigint)
	WHERE NOT EXISTS (SELECT 1 FROM cur) AND CAST($5 AS bigint) <= 0
	ON CONFLICT (target_id) DO NOTHING
	RETURNING generation
)
SELECT COALESCE((SELECT generation FROM took), (SELECT generation FROM ins)), ` + refusalSQL

// AcquireRowSQL is AcquireSQL for a target whose row is known to exist:
// the same statement without its INSERT, whose part of the plan an acquire
// of such a row pays for in every call (docs/performance.md measures it).
// Its arguments and answer are AcquireSQL's.
const AcquireRowSQL = `
WITH ` + curSQL + `, took AS (` + TakeOverSQL + `
)
SELECT (SELECT generation FROM took), ` + refusalSQL

// Acquire takes the lease in one statement, or answers the live lease (or
// the pause) that refused it, choosing the statement from what it has seen
// of the target (rows):
//   - a target it has not seen: AcquireSQL, for any outcome;
//   - a target whose last acquire it saw refused (contended), and every
//     takeover from a generation above 0 (which never makes a row):
//     AcquireRowSQL, AcquireSQL without the INSERT;
//   - a target whose last acquire it saw take the row (acquired again and
//     again, one holder after another): TakeOverSQL alone, the cheapest
//     takeover, and, only when that took nothing, AcquireRowSQL for the
//     answer.
//
// When a statement took nothing from a row, or an absence of one, that it
// would have taken as its snapshot showed it, another statement changed the
// row while it ran: an acquire took it over or made it first, or Prune
// deleted it (AcquireRowSQL then finds no row). The statement then runs
// again, up to raceAttempts times in all, on a snapshot that shows what
// that statement did: a live lease to answer, or no row to make.
func (b *Backend) Acquire(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	args := []any{a.TargetID, a.Token.String(), a.Holder, timeoutMicros(a.Timeout), a.From, backend.TimeoutMillis(a.Timeout), a.FromExpired}
	held, seen := b.rows.Get(a.TargetID)
	if seen && !held && a.From < 0 {
		var generation int64
		taken, err := backend.QueryRow(ctx, db, b.takeOverSQL, args, &generation)
		if err != nil || taken {
			return backend.Acquired{Taken: taken, Generation: generation}, err
		}
	}
	for attempt := 1; ; attempt++ {
		query := b.acquireSQL
		if a.From > 0 || b.rows.Has(a.TargetID) {
			query = b.rowSQL
		}
		got, row, raced, err := b.acquireAnswer(ctx, db, query, args, a)
		if err != nil {
			return got, err
		}
		if row {
			b.rows.Add(a.TargetID, !got.Taken)
		} else {
			b.rows.Drop(a.TargetID)
		}
		if !raced || attempt >= raceAttempts {
			return got, nil
		}
	}
}

// raceAttempts bounds how often Acquire runs its statement while other
// statements change the row under it.
const raceAttempts = 3

// acquireAnswer runs query, AcquireSQL or AcquireRowSQL, with args, for
// the acquire acq, and reads its answer. row reports that the
// target has a row: the statement took one, or read one. raced reports
// that it took nothing from a row, or an absence of one, that it would
// have taken as its snapshot showed it.
func (b *Backend) acquireAnswer(ctx context.Context, db *gorm.DB, query string, args []any, acq backend.AcquireArgs) (_ backend.Acquired, row, raced bool, _ error) {
	// One value for all the columns: each would be an allocation of its
	// own, as Scan's destinations escape.
	a := new(struct {
		taken, generation, micros sql.NullInt64
		holder, reason            sql.NullString
		live, paused, minHold     bool
		age, heldFor              sql.NullFloat64
	})
	if _, err := backend.QueryRow(ctx, db, query, args, &a.taken, &a.holder, &a.generation, &a.live, &a.age, &a.micros, &a.paused, &a.reason,
		&a.heldFor, &a.minHold); err != nil {
		return backend.Acquired{}, false, false, err
	}
	taken, generation, micros, holder, reason, live, paused, age := a.taken, a.generation, a.micros, a.holder, a.reason, a.live, a.paused, a.age
	since := backend.Seconds(a.heldFor.Float64)
	switch {
	case taken.Valid:
		return backend.Acquired{Taken: true, Generation: taken.Int64}, true, false, nil
	case paused:
		got := backend.Acquired{Paused: true, PauseReason: reason.String}
		if live {
			timeout := time.Duration(micros.Int64) * time.Microsecond
			got.Held = backend.NewHeld(holder.String, generation.Int64, timeout, backend.Seconds(age.Float64)).Since(since, a.minHold)
		}
		return got, true, false, nil
	case !live:
		// From an expired generation that the snapshot shows, the row may
		// have been released since: a refusal either way.
		from := acq.From
		raced = from < 0 || (from == 0 && !generation.Valid) || (from > 0 && generation.Int64 == from && !acq.FromExpired)
		return backend.Acquired{}, generation.Valid, raced, nil
	}
	timeout := time.Duration(micros.Int64) * time.Microsecond
	return backend.Acquired{Held: backend.NewHeld(holder.String, generation.Int64, timeout, backend.Seconds(age.Float64)).Since(since, a.minHold)}, true, false, nil
}

// slotSQL takes a free slot in one statement. The subquery picks one of
// the semaphore's rows that records its count and is released or expired,
// at random, so that concurrent acquires seldom want the same one, and
// locks it, skipping the rows that other statements hold locked; under the
// lock PostgreSQL checks the row's latest version against the conditions
// again, and goes on to the next when it no longer qualifies. When no row
// qualifies, nothing is locked or written. Its arguments are the keys of
// the slot rows as an array literal, the token, the holder, the timeout in
// microseconds, the count, and the timeout in milliseconds.
const slotSQL = `
UPDATE job_lease AS l SET` + takeOverSetSQL + `
WHERE l.target_id = (
	SELECT target_id FROM job_lease
	WHERE target_id = ANY(CAST($1 AS varchar[])) AND slots = CAST($5 AS integer)
	  AND ` + freeSQL + `
	ORDER BY random() LIMIT 1
	FOR UPDATE SKIP LOCKED)
RETURNING l.target_id, l.generation`

// AcquireSlot runs slotSQL.
func (b *Backend) AcquireSlot(ctx context.Context, db *gorm.DB, a backend.SlotArgs) (int, int64, bool, error) {
	var key string
	var generation int64
	ok, err := backend.QueryRow(ctx, db, b.slotSQL,
		[]any{array(backend.SlotKeys(a.TargetID, a.Slots)), a.Token.String(), a.Holder, timeoutMicros(a.Timeout),
			a.Slots, backend.TimeoutMillis(a.Timeout)}, &key, &generation)
	if err != nil || !ok {
		return 0, 0, false, err
	}
	_, slot, _ := backend.ParseSlotKey(key)
	return slot, generation, true, nil
}

// timeoutMicros is d, which is positive, in whole microseconds, rounded to
// the nearest, as PostgreSQL rounds an interval of fractional seconds.
func timeoutMicros(d time.Duration) int64 {
	return int64(d/time.Microsecond + (d%time.Microsecond+time.Microsecond/2)/time.Microsecond)
}

// heartbeatBatchSQL renews many leases in one statement. The leases
// travel as two array literals, so that the statement's text, and its
// prepared plan, is the same whatever their number. It returns the
// positions in them (from 1) of the leases it did not renew, with a NULL
// reason, and, negated, those of the leases it renewed whose holder an
// operator asked to stop (RequestStop), with the request's reason, read
// from the row that the UPDATE renewed; and so, as a rule, nothing: the
// client reads no row for a lease renewed that nobody asked to stop.
//
// Each array is read in a scalar subquery, so that the planner, which then
// does not see how many leases there are, looks each one up by the primary
// key. Seeing 1,000 of them, it would hash them and scan the whole table
// instead wherever it reckons that cheaper: on a table never analyzed, or
// one of many released rows (a batch of 1,000 took 30 ms against 4.3 ms at
// 100,000 rows, and 18.6 ms against 6.6 ms at 10,000 held of 100,000). The
// leases not renewed are found by EXCEPT ALL, which hashes or sorts
// whatever the planner reckons.
const heartbeatBatchSQL = `
WITH b AS (
	SELECT * FROM unnest((SELECT CAST($1 AS text[])), (SELECT CAST($2 AS uuid[]))) WITH ORDINALITY AS b(target_id, lease_token, i)
), renewed AS (
	UPDATE job_lease AS l SET updated_at = clock_timestamp()
	FROM b
	WHERE l.target_id = b.target_id AND l.lease_token = b.lease_token AND l.released_at IS NULL
	RETURNING b.i, CASE WHEN l.stop_generation = l.generation THEN COALESCE(l.stop_reason, '') END AS stop
)
SELECT i, CAST(NULL AS text) FROM (SELECT i FROM b EXCEPT ALL SELECT i FROM renewed) AS lost
UNION ALL SELECT -i, stop FROM renewed WHERE stop IS NOT NULL`

// array writes values as a text[] array literal, for a statement's
// argument.
func array(values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		writeElement(&b, v)
	}
	b.WriteByte('}')
	return b.String()
}

// tokenText writes token's canonical text, as uuid.UUID.String does, into
// text, without allocating: it needs no quotes in an array literal.
func tokenText(text *[36]byte, token uuid.UUID) {
	const digits = "0123456789abcdef"
	j := 0
	for i, c := range token {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			text[j] = '-'
			j++
		}
		text[j], text[j+1] = digits[c>>4], digits[c&0x0f]
		j += 2
	}
}

// State reads what a waiter needs of the row.
func (b *Backend) State(ctx context.Context, db *gorm.DB, targetID string) (backend.State, error) {
	return backend.ScanState(ctx, db, b.stateSQL, targetID)
}

// MarkWaiting runs markSQL.
func (b *Backend) MarkWaiting(ctx context.Context, db *gorm.DB, targetID string, generation int64) (marked, ended bool, err error) {
	_, n, err := backend.Exec(ctx, db, b.markSQL, targetID, generation)
	if err != nil {
		return false, false, err
	}
	return n == 1, n == 0, nil
}

// bytewiseOrder reports whether the lease table's target_id orders byte for
// byte, read once per backend: its collation sorts 'B' before 'a', as byte
// order does and the language collations do not.
func (b *Backend) bytewiseOrder(ctx context.Context, db *gorm.DB) (bool, error) {
	if v := b.bytewise.Load(); v != 0 {
		return v > 0, nil
	}
	var bytewise bool
	query := "SELECT CAST('B' AS varchar) COLLATE \"default\" < CAST('a' AS varchar) COLLATE \"default\"" +
		" AND (SELECT COALESCE(c.collname, 'default') IN ('default', 'C', 'POSIX', 'C.UTF-8', 'C.utf8', 'ucs_basic')" +
		" FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation AND a.attcollation <> 100" +
		" WHERE a.attrelid = CAST($1 AS regclass) AND a.attname = 'target_id')"
	if _, err := backend.QueryRow(ctx, db, query, []any{b.lease}, &bytewise); err != nil {
		return false, fmt.Errorf("read the collation of target_id: %w", err)
	}
	if bytewise {
		b.bytewise.Store(1)
	} else {
		b.bytewise.Store(-1)
	}
	return bytewise, nil
}

// numbered rewrites the ? placeholders of query as PostgreSQL's $1, $2, ...
// The statements it is used on have no ? in their literals.
func numbered(query string) string {
	var b strings.Builder
	n := 0
	for {
		i := strings.IndexByte(query, '?')
		if i < 0 {
			b.WriteString(query)
			return b.String()
		}
		n++
		b.WriteString(query[:i])
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
		query = query[i+1:]
	}
}
