package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ncruces/go-sqlite3"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Error codes by which the databases say that a table does not exist.
const (
	// postgresUndefinedTable is SQLSTATE undefined_table.
	postgresUndefinedTable = "42P01"
	// mysqlNoSuchTable is ER_NO_SUCH_TABLE, on MySQL and MariaDB.
	mysqlNoSuchTable = 1146
)

// isMissingTable reports whether err is the database saying that a table
// does not exist. SQLite has no code of its own for it: its error is the
// generic SQLITE_ERROR, told apart by the message.
func isMissingTable(err error) bool {
	var (
		pgErr     *pgconn.PgError
		mysqlErr  *mysqldriver.MySQLError
		sqliteErr *sqlite3.Error
	)
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code == postgresUndefinedTable
	case errors.As(err, &mysqlErr):
		return mysqlErr.Number == mysqlNoSuchTable
	case errors.As(err, &sqliteErr):
		return sqliteErr.Code() == sqlite3.ERROR && strings.Contains(sqliteErr.Error(), "no such table")
	}
	return false
}

// explainMissingTable returns err, or, when err says that a table does not
// exist, an error that says which of the command's tables are missing in
// db and how to make them: with the migrate command, or
// gormlease.AutoMigrate from Go.
func (c *command) explainMissingTable(ctx context.Context, db *gorm.DB, err error) error {
	if !isMissingTable(err) {
		return err
	}
	migrate := "gormlease.AutoMigrate(ctx, db)"
	command := "gormlease migrate"
	if c.leaseTable != (gormlease.JobLease{}).TableName() || c.resultTable != (gormlease.JobResult{}).TableName() {
		migrate = fmt.Sprintf("gormlease.AutoMigrate(ctx, db, gormlease.WithTableNames(%q, %q))", c.leaseTable, c.resultTable)
		command += fmt.Sprintf(" -lease-table %s -result-table %s", c.leaseTable, c.resultTable)
	}
	command += " with the same -dsn"
	m := db.WithContext(ctx).Migrator()
	if !m.HasTable(c.leaseTable) {
		return fmt.Errorf("the lease table %q does not exist in this database\n"+
			"  to create the tables, run %s, or call %s from Go;\n"+
			"  if the tables have other names, give them with -lease-table and -result-table", c.leaseTable, command, migrate)
	}
	// The generation floor table is named after the lease table, as
	// admin.Operator.Prune names it.
	var missing []string
	for _, table := range []string{c.resultTable, c.leaseTable + "_floor"} {
		if !m.HasTable(table) {
			missing = append(missing, strconv.Quote(table))
		}
	}
	if len(missing) == 0 { // made since, or where the check does not look
		return fmt.Errorf("%w\na table that gormlease needs does not exist: create the tables with %s, or %s from Go", err, command, migrate)
	}
	verb := "does"
	if len(missing) > 1 {
		verb = "do"
	}
	return fmt.Errorf("the lease table %q exists but %s %s not\n"+
		"  the tables were made by an earlier version, or not all made: run %s, or call %s from Go,\n"+
		"  which adds what is missing and keeps every row", c.leaseTable, strings.Join(missing, " and "), verb, command, migrate)
}

// migrateCmd creates the tables, or adds what an earlier version's lack.
func migrateCmd(ctx context.Context, c *command) error {
	lease, result := c.repo.Tables()
	opts := []gormlease.MigrateOption{gormlease.WithTableNames(lease, result)}
	if c.history {
		opts = append(opts, gormlease.WithHistory())
	}
	if err := gormlease.AutoMigrate(ctx, c.db, opts...); err != nil {
		return invalid(err)
	}
	if c.json {
		j := migrateJSON{Command: "migrate", LeaseTable: lease, ResultTable: result, FloorTable: lease + "_floor", History: c.history}
		if c.history {
			j.EventTable = lease + "_event"
		}
		return c.writeJSON(j)
	}
	fmt.Fprintf(c.env.stdout, "the tables %s, %s and %s_floor are ready\n", lease, result, lease)
	if c.history {
		fmt.Fprintf(c.env.stdout, "%s keeps each target's history in %s: gormlease history TARGET reads it\n", lease, lease+"_event")
	}
	return nil
}

// migrateJSON is the outcome of migrate, as -json writes it: the tables
// that are ready.
type migrateJSON struct {
	Command     string `json:"command"`
	LeaseTable  string `json:"lease_table"`
	ResultTable string `json:"result_table"`
	FloorTable  string `json:"floor_table"`
	// History is -history, and EventTable the table of the history that
	// it made ready.
	History    bool   `json:"history"`
	EventTable string `json:"event_table,omitempty"`
}
