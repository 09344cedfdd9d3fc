package backend_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	sqlitedriver "github.com/ncruces/go-sqlite3/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/backend"
)

// A missing table or column is known by each database's code (SQLite's by
// its message), named from the message or, for a column whose table the
// message does not give, from the statement, and never tried again.
func TestMissingTables(t *testing.T) {
	state := func(s string) (b [5]byte) { copy(b[:], s); return b }
	noTable, syntax, _ := sqliteErrors(t)
	noColumn := sqliteNoColumn(t)
	cases := []struct {
		name          string
		err           error
		query         string
		table, column string
	}{
		{"PostgresTable", &pgconn.PgError{Code: "42P01", Message: `relation "job_lease" does not exist`}, "", "job_lease", ""},
		{"PostgresSchemaTable", &pgconn.PgError{Code: "42P01", Message: `relation "app.job_lease" does not exist`}, "", "job_lease", ""},
		{"PostgresColumnOfRelation", &pgconn.PgError{Code: "42703", Message: `column "stop_by" of relation "job_lease" does not exist`},
			"", "job_lease", "stop_by"},
		{"PostgresColumnFromStatement", &pgconn.PgError{Code: "42703", Message: `column l.acquired_at does not exist`},
			"SELECT l.acquired_at, EXTRACT(EPOCH FROM clock_timestamp() - l.updated_at) FROM job_lease AS l WHERE target_id = $1",
			"job_lease", "acquired_at"},
		{"PostgresColumnOfSeveralTables", &pgconn.PgError{Code: "42703", Message: `column "waiting" does not exist`},
			"SELECT 1 FROM job_lease JOIN job_result USING (target_id)", "", "waiting"},
		{"MySQLTable", &mysql.MySQLError{Number: 1146, SQLState: state("42S02"), Message: "Table 'test.job_lease_floor' doesn't exist"},
			"", "job_lease_floor", ""},
		{"MySQLColumn", &mysql.MySQLError{Number: 1054, SQLState: state("42S22"), Message: "Unknown column 'stop_by' in 'field list'"},
			"UPDATE job_lease SET stop_by = ? WHERE target_id = ?", "job_lease", "stop_by"},
		{"MySQLColumnInUpsert", &mysql.MySQLError{Number: 1054, SQLState: state("42S22"), Message: "Unknown column 'acquired_at' in 'field list'"},
			"INSERT INTO job_lease (target_id) SELECT ? FROM job_lease_floor ON DUPLICATE KEY UPDATE acquired_at = NULL", "", "acquired_at"},
		{"SQLiteTable", noTable, "", "no_such_table", ""},
		{"SQLiteColumn", noColumn, "SELECT nope FROM t", "t", "nope"},
		{"Wrapped", fmt.Errorf("acquire: %w", &pgconn.PgError{Code: "42P01", Message: `relation "job_lease" does not exist`}), "",
			"job_lease", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := backend.MissingTables(tc.err, tc.query)
			require.ErrorIs(t, err, backend.ErrMissingTables)
			require.ErrorIs(t, err, tc.err, "the driver's error stays in the chain")
			var missing *backend.MissingTablesError
			require.ErrorAs(t, err, &missing)
			assert.Equal(t, tc.table, missing.Table, "table")
			assert.Equal(t, tc.column, missing.Column, "column")
			assert.Contains(t, err.Error(), backend.MigrateAdvice)
			assert.False(t, backend.Unreachable(err), "tried again")
			assert.Same(t, err, backend.MissingTables(err, tc.query), "classified twice")
		})
	}
	for _, other := range []error{
		nil, syntax, errors.New("no such thing"),
		&pgconn.PgError{Code: "42601", Message: "syntax error"},
		&mysql.MySQLError{Number: 1064, SQLState: state("42000"), Message: "You have an error in your SQL syntax"},
		// A server's answer whose text looks like SQLite's is not SQLite's.
		&pgconn.PgError{Code: "P0001", Message: "no such table: x"},
	} {
		assert.Equal(t, other, backend.MissingTables(other, "SELECT 1 FROM job_lease"), "%v", other)
	}
	assert.Equal(t, `column "stop_by" of table "job_lease" does not exist: `+backend.MigrateAdvice,
		(&backend.MissingTablesError{Table: "job_lease", Column: "stop_by"}).Error())
}

// sqliteNoColumn returns SQLite's error for a column that does not exist.
func sqliteNoColumn(t *testing.T) error {
	t.Helper()
	db, err := sqlitedriver.Open("file:" + t.TempDir() + "/columns.db")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec("CREATE TABLE t (x int)")
	require.NoError(t, err)
	_, err = db.Exec("SELECT nope FROM t")
	require.ErrorContains(t, err, "no such column")
	return err
}
