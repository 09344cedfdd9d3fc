package backend

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// SettingsError says what to change in the connection's settings before the
// steps can run on it (see Backend.CheckSettings). The public API wraps it
// as an invalid argument.
type SettingsError struct{ Problem string }

func (e *SettingsError) Error() string { return e.Problem }

// SettingsWarning is a server setting that weakens a guarantee (see
// Backend.SettingsWarnings): Setting's Value, and Message, which says what
// it risks (logged as it is, and named in the docs).
type SettingsWarning struct{ Setting, Value, Message string }

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
// one; lib/pq's too) report their SQLSTATE, whichever driver made them.
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

// Unreachable reports whether err says that the database cannot be reached,
// or cannot serve, right now, so that the same step, tried again on a new
// connection a moment later, may succeed: it is the one test of whether a step is tried again
// while the database is away (a failover, a switchover, a restart). Only
// these errors are:
//
//   - the server's own errors of class 08 (connection exception) or 57P (the
//     server is shutting down, crashed, or does not accept connections yet),
//     PostgreSQL's 53300, too many connections (MySQL's is of class 08), and
//     a statement that the server gave up on after a time limit of its own:
//     a lock wait or statement timeout (see timedOutOnServer);
//   - a connection that could not be made, or that broke before the answer
//     came: a refused, reset, aborted or unreachable connection, a closed
//     socket, an unexpected end of the stream (*net.OpError, *net.DNSError,
//     net.ErrClosed, io.EOF, io.ErrUnexpectedEOF, the syscall errors of
//     those), database/sql's driver.ErrBadConn, pgx's pgconn.ErrConnClosed
//     and, for target_session_attrs=read-write, pgconn.ErrReadOnlyConnection
//     (no server that accepts writes, as during a failover), and
//     go-sql-driver/mysql's "invalid connection" and "bad connection";
//   - a statement or a transaction whose context ended before its answer
//     came (context.DeadlineExceeded, context.Canceled, a network deadline,
//     sql.ErrTxDone of a transaction that database/sql rolled back when its
//     context ended): the caller's step stops when it is its own context
//     that ended, and tries again when it was one attempt's;
//   - an error that its driver marks as temporary (a Temporary method that
//     reports true): SQLite's "database is locked" (SQLITE_BUSY), when the
//     write lock stayed taken past the busy timeout or could not be waited
//     for, and its "interrupted", a statement whose context ended.
//
// Every other error is one that waiting cannot cure, and the step returns it
// at once: any other answer of the server (a missing table or column, which
// the statements return as a *MissingTablesError, bad SQL, a
// permission, a serialization failure, which the steps retry apart from
// this), SQLite's other errors ("no such table", bad SQL), and a pool that
// was closed (sql: database is closed, sql.ErrConnDone), which an error of
// the kinds above does not outweigh. It is database/sql's driver.ErrBadConn
// rule, retry what is known to be transient, widened to the errors of a
// connection that broke after the statement was sent, which pgx's
// pgconn.SafeToRetry leaves out: a step may send its statement again because
// each step is written to be sent again (see AcquireArgs and the fenced
// commit).
func Unreachable(err error) bool {
	switch {
	case err == nil, poolClosed(err), errors.Is(err, ErrMissingTables):
		return false
	case AnsweredByServer(err):
		state := SQLState(err)
		return strings.HasPrefix(state, "08") || strings.HasPrefix(state, "57P") || state == pgTooManyConnections ||
			timedOutOnServer(err)
	}
	for _, target := range transientErrors {
		if errors.Is(err, target) {
			return true
		}
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	var temporary interface{ Temporary() bool }
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) || anyMessage(err, mysqlConnLost...) ||
		errors.As(err, &temporary) && temporary.Temporary()
}

// pgTooManyConnections is PostgreSQL's SQLSTATE for a connection refused
// because every one the server allows is taken.
const pgTooManyConnections = "53300"

// timedOutOnServer reports whether err is the server's answer to a
// statement that it gave up on after a time limit of its own: a lock that
// another session held past lock_timeout (PostgreSQL's 55P03) or
// innodb_lock_wait_timeout (MySQL's 1205), or a statement that ran past
// statement_timeout (57014, which is also a statement cancelled on
// request: by this process when its context ended, which the steps tell
// apart by their context), max_execution_time (MySQL's 3024) or
// max_statement_time (MariaDB's 1969). Nothing was done, and the same
// statement may succeed once the other session, or the load, has gone.
func timedOutOnServer(err error) bool {
	switch SQLState(err) {
	case "55P03", "57014":
		return true
	}
	number, ok := MySQLErrorNumber(err)
	return ok && (number == 1205 || number == 3024 || number == 1969)
}

// transientErrors are the error values, matched with errors.Is, that say
// that a connection could not be made or broke, or that a statement's
// context ended before its answer came (see Unreachable).
var transientErrors = []error{
	driver.ErrBadConn,
	context.DeadlineExceeded, context.Canceled, os.ErrDeadlineExceeded, sql.ErrTxDone,
	net.ErrClosed, io.EOF, io.ErrUnexpectedEOF,
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
	syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
	pgconn.ErrConnClosed, pgconn.ErrReadOnlyConnection,
}

// mysqlConnLost are the messages of go-sql-driver/mysql's ErrInvalidConn,
// which it returns when a connection broke while it read an answer, and of
// its bad connection error, which it returns when one broke before it
// wrote: errors of a package that gormlease does not link (see
// mysqlServerError), known by their text.
var mysqlConnLost = []string{"invalid connection", "bad connection"}

// closedPoolMessage is the message of database/sql's error for a statement
// on a *sql.DB that was closed, whose value is not exported.
const closedPoolMessage = "sql: database is closed"

// poolClosed reports whether err says that the pool, or the connection
// that the step was given, was closed by the application: no waiting
// brings it back.
func poolClosed(err error) bool {
	return errors.Is(err, sql.ErrConnDone) || anyMessage(err, closedPoolMessage)
}

// anyMessage reports whether an error in err's chain, wrapping nothing
// itself, has one of msgs as its whole message.
func anyMessage(err error, msgs ...string) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() error }:
		return anyMessage(e.Unwrap(), msgs...)
	case interface{ Unwrap() []error }:
		for _, err := range e.Unwrap() {
			if anyMessage(err, msgs...) {
				return true
			}
		}
		return false
	}
	return slices.Contains(msgs, err.Error())
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
