package gormlease

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// dialect is the seam between the lease steps and one database's SQL. Only
// what differs between databases lives behind it: the DDL, the database
// clock, the placeholders, the acquire (one statement where the database
// has a conditional upsert), the fenced commit's transaction options, how
// waiters are told and what they read; and, as optional capabilities, the
// batched heartbeat (batchHeartbeater) and BEGIN sent with the locking
// statement (lockingBeginner). The statements on the caller's own row
// (heartbeat, release, the fenced commit's lock) are written once, in
// repository.go, as SQL text built from the dialect's clock and
// placeholders, and run straight on the connection pool, not through
// gorm's builder (see statement.go).
type dialect interface {
	// migrate creates the tables when they do not exist.
	migrate(ctx context.Context, db *gorm.DB) error
	// now is an SQL expression for the database's current time, read when the
	// statement runs (not when its transaction began).
	now() string
	// acquire takes the lease on a.targetID, in as few statements as the
	// database allows, when there is no row, the row is released, or its
	// last heartbeat is older than the timeout recorded in the row (its
	// holder's; a.timeout for a row that records none) on the database's
	// clock. It reports the new generation and
	// whether the lease was taken; a refused acquire is not an error.
	acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (generation int64, acquired bool, err error)
	// fenceTxOptions are the options of the fenced commit's transaction.
	fenceTxOptions() *sql.TxOptions
	// rebind rewrites the ? placeholders of query as the database's driver
	// wants them.
	rebind(query string) string
	// notifyWaiters is what the statements that end a generation or save
	// its result append to tell waiters in other processes, or "" where
	// the database cannot; waiters poll in any case.
	notifyWaiters() string
	// stateSQL is the statement that reads a lease row for a waiter: see
	// readState. Its one argument is the target.
	stateSQL() string
	// secondsSince is an SQL expression for the time, in seconds, from
	// col, a timestamp column, to the database's time when the statement
	// started.
	secondsSince(col string) string
	// raiseFloorSQL is the statement that raises the generation floor,
	// the table floor, to its one argument when that is higher (see
	// prune.go).
	raiseFloorSQL(floor string) string
}

// column is a column that a later version added to the lease table.
type column struct{ name, ddl string }

// addMissingColumns adds to table those of columns that it lacks: the
// upgrade, by AutoMigrate, of a table made by an earlier version. A column
// that another AutoMigrate adds at the same time makes the ALTER fail; it is
// then found there, and that is not an error.
func addMissingColumns(db *gorm.DB, table string, columns []column) error {
	quiet := db.Session(&gorm.Session{Logger: logger.Discard})
	has := func(c column) bool {
		return quiet.Exec("SELECT "+c.name+" FROM "+table+" WHERE 1 = 0").Error == nil
	}
	for _, c := range columns {
		if has(c) {
			continue
		}
		if err := db.Exec("ALTER TABLE " + table + " ADD COLUMN " + c.name + " " + c.ddl).Error; err != nil && !has(c) {
			return fmt.Errorf("add column %s.%s: %w", table, c.name, err)
		}
	}
	return nil
}

// batchHeartbeater is a capability that a dialect may have: renewing many
// leases in one batch of statements (one, or two on MySQL). Dialects
// without it get one statement per lease.
type batchHeartbeater interface {
	// heartbeatBatch stamps the rows of leases (at most heartbeatBatchSize)
	// with the database's time where target and token match and the lease is
	// not released, and returns the leases it renewed.
	heartbeatBatch(ctx context.Context, db *gorm.DB, leases []Lease) (renewed map[Lease]bool, err error)
}

// leaseKeyOf identifies a lease by what its row carries.
type leaseKeyOf struct {
	targetID string
	token    uuid.UUID
}

// scanRenewed reads rows, the target and token of each lease that a
// heartbeat statement renewed, closes them, and returns those of leases
// that it renewed.
func scanRenewed(rows *sql.Rows, leases []Lease) (map[Lease]bool, error) {
	defer rows.Close()
	byKey := make(map[leaseKeyOf]Lease, len(leases))
	for _, l := range leases {
		byKey[leaseKeyOf{l.TargetID, l.Token}] = l
	}
	renewed := make(map[Lease]bool, len(leases))
	for rows.Next() {
		var k leaseKeyOf
		if err := rows.Scan(&k.targetID, &k.token); err != nil {
			return nil, err
		}
		if l, ok := byKey[k]; ok {
			renewed[l] = true
		}
	}
	return renewed, rows.Err()
}

// acquireArgs are the values of one acquire statement.
type acquireArgs struct {
	targetID string
	token    uuid.UUID
	holder   string
	// timeout is the new lease's timeout, recorded in the row. The row's
	// current lease is judged by the timeout its own holder recorded.
	timeout time.Duration
	// from, when not anyGeneration, is the generation that the row must
	// have for the acquire to take it over (0: there must be no row). A
	// caller that waited for a generation to end takes over from that one
	// only, never from one that began and ended since it looked.
	from int64
}

// timeoutMillis is d in whole milliseconds, rounded up, as the timeout_ms
// column records a lease's timeout.
func timeoutMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// timeoutMicros is d, which is positive, in whole microseconds, rounded to
// the nearest, as PostgreSQL rounds an interval of fractional seconds.
func timeoutMicros(d time.Duration) int64 {
	return int64(d/time.Microsecond + (d%time.Microsecond+time.Microsecond/2)/time.Microsecond)
}

// anyGeneration is acquireArgs.from when any generation may be taken over.
const anyGeneration = -1

// dialectFor picks the dialect for db's gorm dialector, with its
// statements written for the tables t.
func dialectFor(db *gorm.DB, t tableNames) (dialect, error) {
	if db.Dialector == nil {
		return nil, invalidf("db has no dialector: open it with gorm.Open")
	}
	switch name := db.Dialector.Name(); name {
	case "postgres":
		return newPostgresDialect(t), nil
	case "mysql":
		return newMySQLDialect(t), nil
	case "sqlite":
		return newSQLiteDialect(t), nil
	default:
		return nil, fmt.Errorf(prefix+"unsupported database %q: supported are postgres, mysql and sqlite", name)
	}
}

// settingsChecker is a dialect that can tell, before any lease step, that
// the connection's settings would make the steps fail later.
type settingsChecker interface {
	// checkSettings returns an error wrapping ErrInvalidArgument that says
	// what to change when db's settings do not suit the lease steps. It
	// writes nothing.
	checkSettings(ctx context.Context, db *gorm.DB) error
}

// settingsCheckTimeout bounds the settings check of NewRepository, which
// takes no context.
const settingsCheckTimeout = 10 * time.Second

// checkSettings runs d's settings check on db, when d has one.
func checkSettings(ctx context.Context, d dialect, db *gorm.DB) error {
	if c, ok := d.(settingsChecker); ok {
		return c.checkSettings(ctx, db)
	}
	return nil
}
