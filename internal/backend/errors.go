package backend

import (
	"context"
	"errors"
	"reflect"
	"strings"
)

// SettingsError says what to change in the connection's settings before the
// steps can run on it (see Backend.CheckSettings). The public API wraps it
// as an invalid argument.
type SettingsError struct{ Problem string }

func (e *SettingsError) Error() string { return e.Problem }

// ErrCannotListen says that a pool cannot receive notifications: its driver
// cannot, or its connections go through a connection pooler. Its waiters
// then only poll.
var ErrCannotListen = errors.New("cannot listen")

// ErrReplicationCancelled says that a statement's commit is not confirmed
// durable: the server committed it locally but cut short its wait for the
// synchronous standbys (a cancel request reached it while it waited), or
// the client's context ended while it waited, when a cancel may have. After
// a failover that left the old primary running, such a commit is on the old
// primary only. A step takes it as an unknown outcome, never as a success.
var ErrReplicationCancelled = errors.New("commit not confirmed: the wait for synchronous replication was cut short")

// sqlStater is the method by which drivers' errors (pgconn.PgError, for
// one) report their SQLSTATE, without this package importing a driver.
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

// IsSerializationFailure reports whether err is a serialization failure or
// a deadlock, after which the failed statement may simply be run again:
// SQLSTATE 40001 or 40P01 (PostgreSQL, MySQL), or one of the MySQL-protocol
// error numbers above. Under a session default of REPEATABLE READ or
// SERIALIZABLE, a single statement that meets a row changed after its
// snapshot fails so instead of re-reading the row; it was rolled back as a
// whole and changed nothing.
func IsSerializationFailure(err error) bool {
	if number, _, ok := mysqlServerError(err); ok {
		switch number {
		case mysqlDeadlock, mariadbSnapshotConflict, tidbWriteConflict:
			return true
		}
	}
	switch SQLState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// SQLState returns the SQLSTATE of the database error in err's chain, or ""
// when there is none.
func SQLState(err error) string {
	var st sqlStater
	if errors.As(err, &st) {
		return st.SQLState()
	}
	_, state, _ := mysqlServerError(err)
	return state
}

// MySQLErrorNumber returns the error number of the MySQL server error in
// err's chain, and false when there is none.
func MySQLErrorNumber(err error) (uint16, bool) {
	n, _, ok := mysqlServerError(err)
	return n, ok
}

// AnsweredByServer reports whether err is the database's own answer (an
// error that carries an SQLSTATE, or a MySQL server error), as opposed to a
// lost connection or a timeout, after which the statement may or may not
// have taken effect.
func AnsweredByServer(err error) bool {
	var st sqlStater
	if errors.As(err, &st) {
		return true
	}
	_, _, ok := mysqlServerError(err)
	return ok
}

// Unreachable reports whether err says that a statement could not reach
// the database, or lost its connection before an answer came: an error that
// no server sent (a refused or dropped connection, no server that accepts
// writes), or a server's error of class 08 (connection exception) or 57P
// (the server is shutting down, crashed, or does not accept connections
// yet; not 57014, a cancelled statement).
func Unreachable(err error) bool {
	if !AnsweredByServer(err) {
		return true
	}
	state := SQLState(err)
	return strings.HasPrefix(state, "08") || strings.HasPrefix(state, "57P")
}

// mysqlServerError finds, in err's chain, an error that a MySQL-protocol
// server sent (go-sql-driver/mysql's *MySQLError, which MySQL, MariaDB,
// Galera and TiDB all come through) and returns its error number and
// SQLSTATE. It knows the error by its shape, a pointer to a struct with the
// fields Number uint16 and SQLState [5]byte, so that gormlease does not
// link the MySQL driver into applications on other databases.
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

// retriedKey marks the context of a statement whose serialization failures
// are retried or turned into an outcome by the step that runs it.
type retriedKey struct{}

// MarkRetried returns ctx marked so: its statements' serialization failures
// are not faults for the logger (see ExpectedFailure).
func MarkRetried(ctx context.Context) context.Context {
	return context.WithValue(ctx, retriedKey{}, true)
}

// ExpectedFailure reports whether err, returned by a statement run on ctx,
// is a normal outcome rather than a fault: the statement's own context was
// cancelled (the caller gave up, or a Run stopped its heartbeat), or ctx is
// marked by MarkRetried and err is a serialization failure.
func ExpectedFailure(ctx context.Context, err error) bool {
	if errors.Is(ctx.Err(), context.Canceled) {
		return true
	}
	return ctx.Value(retriedKey{}) != nil && IsSerializationFailure(err)
}
