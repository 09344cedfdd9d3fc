package backend_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ncruces/go-sqlite3"
	sqlitedriver "github.com/ncruces/go-sqlite3/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// The error forms that the steps meet, as the drivers make them: only those
// that say the database cannot be reached right now are tried again; a
// closed pool, the server's other answers and SQLite's errors are not.
func TestUnreachable(t *testing.T) {
	state := func(s string) (b [5]byte) { copy(b[:], s); return b }
	closedPool, connDone := closedPoolErrors(t)
	noTable, syntax, locked := sqliteErrors(t)
	refused := refusedDial(t)
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},

		// The connection could not be made, or broke.
		{"BadConn", driver.ErrBadConn, true},
		{"BadConnWrapped", fmt.Errorf("acquire: %w", driver.ErrBadConn), true},
		{"DialRefused", refused, true},
		{"DNS", &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}, true},
		{"ClosedSocket", fmt.Errorf("read: %w", net.ErrClosed), true},
		{"UnexpectedEOF", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), true},
		{"EOF", io.EOF, true},
		{"PgxConnClosed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), true},
		{"PgxConnectRefused", pgxConnect(t), true},
		{"PgxNoServerAcceptsWrites", fmt.Errorf("failed to connect: %w",
			errors.Join(fmt.Errorf("127.0.0.1:5432: %w", pgconn.ErrReadOnlyConnection))), true},
		{"MySQLInvalidConn", mysql.ErrInvalidConn, true},
		{"MySQLInvalidConnWrapped", fmt.Errorf("acquire: %w", mysql.ErrInvalidConn), true},

		// A statement, or an attempt, whose context ended first.
		{"DeadlineExceeded", fmt.Errorf("timeout: %w", context.DeadlineExceeded), true},
		{"Canceled", context.Canceled, true},
		{"TxDone", sql.ErrTxDone, true},

		// The server says it cannot serve now.
		{"PostgresConnectionFailure", &pgconn.PgError{Code: "08006"}, true},
		{"PostgresAdminShutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"PostgresStartingUp", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"SQLiteLocked", locked, true},
		{"SQLiteBusy", fmt.Errorf("x: %w", sqlite3.BUSY), true},
		{"SQLiteInterrupted", sqlite3.INTERRUPT, true},
		{"PostgresTooManyConnections", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "53300"}), true},
		{"MySQLTooManyConnections", &mysql.MySQLError{Number: 1040, SQLState: state("08004")}, true},
		{"PostgresOutOfMemory", &pgconn.PgError{Code: "53200"}, false},
		{"MySQLServerShutdown", &mysql.MySQLError{Number: 1053, SQLState: state("08S01")}, true},
		{"GaleraNotReady", &mysql.MySQLError{Number: 1047, SQLState: state("08S01")}, true},

		// Waiting does not cure these.
		{"PoolClosed", closedPool, false},
		{"PoolClosedWrapped", fmt.Errorf("acquire: %w", closedPool), false},
		{"PoolClosedAndDeadline", errors.Join(context.DeadlineExceeded, closedPool), false},
		{"ConnDone", connDone, false},
		// A statement that the server ended at a time limit of its own:
		// nothing was done, and it may succeed a moment later.
		{"PostgresStatementTimeout", &pgconn.PgError{Code: "57014"}, true},
		{"PostgresLockTimeout", &pgconn.PgError{Code: "55P03"}, true},
		{"MySQLLockWaitTimeout", &mysql.MySQLError{Number: 1205, SQLState: state("HY000")}, true},
		{"MySQLQueryTimeout", &mysql.MySQLError{Number: 3024, SQLState: state("HY000")}, true},
		{"MariaDBStatementTimeout", &mysql.MySQLError{Number: 1969, SQLState: state("70100")}, true},
		{"PostgresNoTable", &pgconn.PgError{Code: "42P01"}, false},
		{"PostgresSyntax", &pgconn.PgError{Code: "42601"}, false},
		{"PostgresPermission", &pgconn.PgError{Code: "42501"}, false},
		{"PostgresAuthentication", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), false},
		{"PostgresSerialization", &pgconn.PgError{Code: "40001"}, false},
		{"PostgresReadOnlyTransaction", &pgconn.PgError{Code: "25006"}, false},
		{"MySQLNoTable", &mysql.MySQLError{Number: 1146, SQLState: state("42S02")}, false},
		{"MySQLAccessDenied", &mysql.MySQLError{Number: 1045, SQLState: state("28000")}, false},
		{"MySQLDeadlock", &mysql.MySQLError{Number: 1213, SQLState: state("40001")}, false},
		{"SQLiteNoTable", noTable, false},
		{"SQLiteSyntax", syntax, false},

		{"RecordNotFound", gorm.ErrRecordNotFound, false},
		{"Other", errors.New("something else"), false},
		{"OtherSaysInvalidConnection", fmt.Errorf("check: %w", errors.New("the invalid connection string")), false},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, backend.Unreachable(tc.err), "%s: %v", tc.name, tc.err)
	}
}

// closedPoolErrors returns database/sql's errors of a statement on a closed
// *sql.DB and of one on a closed *sql.Conn.
func closedPoolErrors(t *testing.T) (pool, conn error) {
	t.Helper()
	db, err := sqlitedriver.Open("file:" + t.TempDir() + "/closed.db")
	require.NoError(t, err)
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, conn = c.ExecContext(context.Background(), "SELECT 1")
	require.ErrorIs(t, conn, sql.ErrConnDone)
	require.NoError(t, db.Close())
	_, pool = db.Exec("SELECT 1")
	require.EqualError(t, pool, "sql: database is closed")
	return pool, conn
}

// sqliteErrors returns SQLite's errors for a missing table, for bad SQL,
// and for a write while another connection holds the write lock.
func sqliteErrors(t *testing.T) (noTable, syntax, locked error) {
	t.Helper()
	dsn := "file:" + t.TempDir() + "/errors.db?_pragma=busy_timeout(0)"
	db, err := sqlitedriver.Open(dsn)
	require.NoError(t, err)
	defer db.Close()
	_, noTable = db.Exec("SELECT * FROM no_such_table")
	require.ErrorContains(t, noTable, "no such table")
	_, syntax = db.Exec("SELEKT 1")
	require.ErrorContains(t, syntax, "syntax error")

	_, err = db.Exec("CREATE TABLE t (x int)")
	require.NoError(t, err)
	writer, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer writer.Close()
	_, err = writer.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	defer func() { _, _ = writer.ExecContext(context.Background(), "ROLLBACK") }()
	_, locked = db.Exec("INSERT INTO t VALUES (1)")
	require.ErrorContains(t, locked, "database is locked")
	return noTable, syntax, locked
}

// refusedDial returns the error of a TCP connection that the host refused.
func refusedDial(t *testing.T) error {
	t.Helper()
	_, err := net.DialTimeout("tcp", closedAddr(t), time.Second)
	require.Error(t, err)
	return err
}

// pgxConnect returns pgx's error of a connection to a port that nothing
// listens on.
func pgxConnect(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pgconn.Connect(ctx, "postgres://u@"+closedAddr(t)+"/db?connect_timeout=1")
	var connect *pgconn.ConnectError
	require.ErrorAs(t, err, &connect)
	return err
}

// closedAddr returns a loopback address that nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
