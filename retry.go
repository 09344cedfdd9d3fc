package gormlease

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Serialization failures. Under a session default of REPEATABLE READ or
// SERIALIZABLE (or on databases that always run so), a single statement that
// meets a row changed after its snapshot fails with SQLSTATE 40001 instead
// of re-reading the row, and a lock cycle ends in a deadlock error (40P01 on
// PostgreSQL). The statement was rolled back as a whole and changed nothing.
//
// Where retrying is safe, and where it is not:
//   - Acquire, Heartbeat and Release are each one statement that gormlease
//     writes: re-running it after a rollback is the same as running it for
//     the first time, so they are retried a few times (retryStatement).
//   - The fenced commit is not retried: it runs the caller's saver, which may
//     have effects outside the transaction, and it already runs at READ
//     COMMITTED, where the locking read re-reads the row instead of failing.
//     A serialization failure inside the saver's own statements is returned
//     (wrapped) with nothing saved; Run then releases the lease.
const (
	// statementAttempts is how often a retryable statement is tried in all.
	statementAttempts = 5
	// retryBackoff is the first pause between attempts; it doubles each time,
	// with jitter, so that the colliding statements spread out.
	retryBackoff = 2 * time.Millisecond
)

// sqlStater is the method by which drivers' errors (pgconn.PgError, for
// one) report their SQLSTATE, without gormlease importing a driver.
type sqlStater interface{ SQLState() string }

// isSerializationFailure reports whether err is a serialization failure or a
// deadlock, after which the failed statement may simply be run again.
func isSerializationFailure(err error) bool {
	var st sqlStater
	if !errors.As(err, &st) {
		return false
	}
	switch st.SQLState() {
	case "40001", "40P01":
		return true
	}
	return false
}

// retryStatement runs stmt, a single statement in a transaction of its own,
// again while it fails with a serialization failure, up to statementAttempts
// times in all and while ctx lasts. It returns stmt's last error.
func retryStatement(ctx context.Context, stmt func() error) error {
	pause := retryBackoff
	for attempt := 1; ; attempt++ {
		err := stmt()
		if err == nil || attempt == statementAttempts || !isSerializationFailure(err) {
			return err
		}
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause *= 2
	}
}
