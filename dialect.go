package gormlease

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// dialect is the seam between the lease steps and one database's SQL. Only
// what differs between databases lives behind it: the DDL, the database
// clock, the acquire (one statement where the database has a conditional
// upsert) and the fenced commit's transaction options. Heartbeat, fence and
// release are written once, in repository.go, with gorm's builder and the
// dialect's clock.
type dialect interface {
	// migrate creates the tables when they do not exist.
	migrate(ctx context.Context, db *gorm.DB) error
	// now is an SQL expression for the database's current time, read when the
	// statement runs (not when its transaction began).
	now() string
	// acquire takes the lease on a.targetID, in as few statements as the
	// database allows, when there is no row, the row is released, or its
	// last heartbeat is older than a.timeout on the database's clock. It reports the new generation and
	// whether the lease was taken; a refused acquire is not an error.
	acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (generation int64, acquired bool, err error)
	// fenceTxOptions are the options of the fenced commit's transaction.
	fenceTxOptions() *sql.TxOptions
	// rebind rewrites the ? placeholders of query as the database's driver
	// wants them.
	rebind(query string) string
}

// batchHeartbeater is a capability that a dialect may have: renewing many
// leases in one statement. Dialects without it get one statement per lease.
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
	timeout  time.Duration
}

// dialectFor picks the dialect for db's gorm dialector.
func dialectFor(db *gorm.DB) (dialect, error) {
	if db.Dialector == nil {
		return nil, invalidf("db has no dialector: open it with gorm.Open")
	}
	switch name := db.Dialector.Name(); name {
	case "postgres":
		return postgresDialect{}, nil
	case "mysql":
		return mysqlDialect{}, nil
	case "sqlite":
		return sqliteDialect{}, nil
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
