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
// clock, the one-statement acquire and the fenced commit's transaction
// options. Heartbeat, fence and release are written once, in repository.go,
// with gorm's builder and the dialect's clock.
type dialect interface {
	// migrate creates the tables when they do not exist.
	migrate(ctx context.Context, db *gorm.DB) error
	// now is an SQL expression for the database's current time, read when the
	// statement runs (not when its transaction began).
	now() string
	// acquire takes the lease on a.targetID in one statement when there is no
	// row, the row is released, or its last heartbeat is older than
	// a.timeout on the database's clock. It reports the new generation and
	// whether the lease was taken; a refused acquire is not an error.
	acquire(ctx context.Context, db *gorm.DB, a acquireArgs) (generation int64, acquired bool, err error)
	// fenceTxOptions are the options of the fenced commit's transaction.
	fenceTxOptions() *sql.TxOptions
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
	default:
		return nil, fmt.Errorf("gormlease: unsupported database %q: supported are postgres", name)
	}
}
