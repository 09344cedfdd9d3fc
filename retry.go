package gormlease

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
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
//     the first time, so they are retried a few times (Repository.retry).
//   - The fenced commit is not retried on one server: it runs the caller's
//     saver, which may have effects outside the transaction, and it already
//     runs at READ COMMITTED, where the locking read re-reads the row
//     instead of failing. A serialization failure inside the saver's own
//     statements is returned (wrapped) with nothing saved; Run then
//     releases the lease.
//   - On a MariaDB Galera cluster it is, a few times, when a causal read
//     shows the lease still the caller's: there the failure may come from a
//     write on another node that did not take the lease (see galera.go).
//   - Only its first query, before the saver runs, is tried again when
//     the database cannot be reached (see reconnect.go).
const (
	// statementAttempts is how often a retryable statement is tried in all.
	statementAttempts = 5
	// retryBackoff is the first pause between attempts; it doubles each time,
	// with jitter, up to retryMaxPause, so that the colliding statements
	// spread out.
	retryBackoff  = 2 * time.Millisecond
	retryMaxPause = 100 * time.Millisecond
)

// statementBackoff is the pause between attempts of a statement that
// failed, or whose outcome is checked and sent again.
func statementBackoff() backoff {
	return backoff{pause: retryBackoff, max: retryMaxPause}
}

// backoff is the pause between two attempts of a step: it starts at a first
// pause and doubles after each wait, up to a ceiling. Each wait is jittered
// (between half and one and a half times the pause), so that sessions that
// failed together do not try again together.
type backoff struct {
	pause, max time.Duration
}

// wait waits out the current pause, then doubles it, up to the ceiling. It
// reports false, having returned early, when ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.pause/2 + rand.N(b.pause+1))
	defer t.Stop()
	b.pause = min(2*b.pause, b.max)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sqlStater is the method by which drivers' errors (pgconn.PgError, for
// one) report their SQLSTATE, without gormlease importing a driver.
type sqlStater interface{ SQLState() string }

// Server errors of the MySQL protocol that mean a serialization failure.
const (
	// mysqlDeadlock is ER_LOCK_DEADLOCK (SQLSTATE 40001): InnoDB rolled the
	// statement back to break a lock cycle, or Galera to resolve a
	// conflict with a write certified on another node.
	mysqlDeadlock = 1213
	// mariadbSnapshotConflict is ER_CHECKREAD: under MariaDB's
	// innodb_snapshot_isolation, a REPEATABLE READ statement met a row
	// changed after its snapshot.
	mariadbSnapshotConflict = 1020
	// tidbWriteConflict is TiDB's write conflict of optimistic transactions.
	tidbWriteConflict = 9007
)

// isSerializationFailure reports whether err is a serialization failure or a
// deadlock, after which the failed statement may simply be run again:
// SQLSTATE 40001 or 40P01 (PostgreSQL, MySQL), or one of the MySQL-protocol
// error numbers above.
func isSerializationFailure(err error) bool {
	if number, _, ok := mysqlServerError(err); ok {
		switch number {
		case mysqlDeadlock, mariadbSnapshotConflict, tidbWriteConflict:
			return true
		}
	}
	switch sqlState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// sqlState returns the SQLSTATE of the database error in err's chain, or ""
// when there is none.
func sqlState(err error) string {
	var st sqlStater
	if errors.As(err, &st) {
		return st.SQLState()
	}
	_, state, _ := mysqlServerError(err)
	return state
}

// answeredByServer reports whether err is the database's own answer (an
// error that carries an SQLSTATE, or a MySQL server error), as opposed to a
// lost connection or a timeout, after which the statement may or may not
// have taken effect.
func answeredByServer(err error) bool {
	var st sqlStater
	if errors.As(err, &st) {
		return true
	}
	_, _, ok := mysqlServerError(err)
	return ok
}

// mysqlServerError finds, in err's chain, an error that a MySQL-protocol
// server sent (go-sql-driver/mysql's *MySQLError, which MySQL, MariaDB,
// Galera and TiDB all come through) and returns its error number and
// SQLSTATE. It knows the error by its shape, a pointer to a struct with the
// fields Number uint16 and SQLState [5]byte, so that gormlease does not
// link the MySQL driver into applications on other databases. (The driver
// reports SQLSTATE in a field: its errors have no SQLState method.)
func mysqlServerError(err error) (number uint16, state string, ok bool) {
	for err != nil {
		if number, state, ok := mysqlErrorFields(err); ok {
			return number, state, true
		}
		switch e := err.(type) {
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, err := range e.Unwrap() {
				if number, state, ok := mysqlServerError(err); ok {
					return number, state, true
				}
			}
			return 0, "", false
		default:
			return 0, "", false
		}
	}
	return 0, "", false
}

// mysqlErrorFields reads Number and SQLState from err when err has the
// shape of a *mysql.MySQLError.
func mysqlErrorFields(err error) (number uint16, state string, ok bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return 0, "", false
	}
	n, st := v.Elem().FieldByName("Number"), v.Elem().FieldByName("SQLState")
	if !n.IsValid() || n.Kind() != reflect.Uint16 || !st.IsValid() || st.Type() != reflect.TypeFor[[5]byte]() {
		return 0, "", false
	}
	var b [5]byte
	for i := range b {
		b[i] = byte(st.Index(i).Uint())
	}
	if b != ([5]byte{}) { // empty when the server sent none
		state = string(b[:])
	}
	return uint16(n.Uint()), state, true
}

// retriedKey marks the context of a statement that Repository.retry runs.
type retriedKey struct{}

// retry runs stmt, a single statement in a transaction of its own, again
// while it fails with a serialization failure, up to r.attempts times in
// all (statementAttempts, but in tests) and while ctx lasts. It returns stmt's last error. stmt gets
// a context that marks it as retried, so that its serialization failures
// are not reported to the logger as errors (see trace): each is either
// retried or turned by the step into its outcome.
func (r *Repository) retry(ctx context.Context, stmt func(ctx context.Context) error) error {
	ctx = context.WithValue(ctx, retriedKey{}, true)
	b := statementBackoff()
	for attempt := 1; ; attempt++ {
		err := stmt(ctx)
		if err == nil || attempt >= r.attempts || !isSerializationFailure(err) || !b.wait(ctx) {
			return err
		}
	}
}

// expectedFailure reports whether err, returned by a statement run on ctx,
// is a normal outcome rather than a fault: the statement's own context was
// cancelled (the caller gave up, or a Run stopped its heartbeat), or
// Repository.retry retries the serialization failure or turns it into the
// step's outcome.
func expectedFailure(ctx context.Context, err error) bool {
	if errors.Is(ctx.Err(), context.Canceled) {
		return true
	}
	return ctx.Value(retriedKey{}) != nil && isSerializationFailure(err)
}
