package backend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// ErrMissingTables says that a table, or a column, that the steps read or
// write does not exist: the tables were never made (AutoMigrate, or the
// command's migrate), or were made by a version that lacked the column. The
// public API exports it as gormlease.ErrMissingTables. No step retries or
// waits on it: only a migration cures it.
var ErrMissingTables = errors.New("gormlease: missing tables")

// MigrateAdvice says how to make the tables; every error that wraps
// ErrMissingTables ends with it.
const MigrateAdvice = "create the tables with gormlease.AutoMigrate, or run `gormlease migrate`"

// MissingTablesError is the error of a statement, or of CheckTables, that
// met a missing table or column: it wraps ErrMissingTables and the driver's
// error, and names what is missing when the database or the statement
// says so.
type MissingTablesError struct {
	// Table is the missing table, or the table of the missing column; ""
	// when neither the database nor the statement named it.
	Table string
	// Column is the missing column, "" when a table is missing.
	Column string
	// Missing, from CheckTables, names every table and column that it
	// found missing; Table and Column are then the first of them.
	Missing []string
	// Err is the driver's error.
	Err error
}

func (e *MissingTablesError) Error() string {
	var what string
	switch {
	case len(e.Missing) > 0:
		verb := "does"
		if len(e.Missing) > 1 {
			verb = "do"
		}
		what = strings.Join(e.Missing, ", ") + " " + verb + " not exist"
	case e.Column != "" && e.Table != "":
		what = fmt.Sprintf("column %q of table %q does not exist", e.Column, e.Table)
	case e.Column != "":
		what = fmt.Sprintf("column %q of a gormlease table does not exist", e.Column)
	case e.Table != "":
		what = fmt.Sprintf("table %q does not exist", e.Table)
	default:
		what = "a table that gormlease needs does not exist"
	}
	return what + ": " + MigrateAdvice
}

// Unwrap returns ErrMissingTables and the driver's error.
func (e *MissingTablesError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrMissingTables}
	}
	return []error{ErrMissingTables, e.Err}
}

// Error codes by which the databases say that a table or a column does
// not exist. SQLite has none of its own (its error is the generic
// SQLITE_ERROR): its messages tell.
const (
	pgUndefinedTable   = "42P01" // undefined_table
	pgUndefinedColumn  = "42703" // undefined_column
	mysqlNoSuchTable   = 1146    // ER_NO_SUCH_TABLE, MySQL and MariaDB
	mysqlBadFieldError = 1054    // ER_BAD_FIELD_ERROR: an unknown column
)

// The names in the databases' messages, in their first group: a table,
// and a column with, for some, its table in the second.
var (
	pgTableName      = regexp.MustCompile(`relation "([^"]+)" does not exist`)
	pgColumnName     = regexp.MustCompile(`column "?([^" ]+)"? (?:of relation "([^"]+)" )?does not exist`)
	mysqlTableName   = regexp.MustCompile(`Table '([^']+)' doesn't exist`)
	mysqlColumnName  = regexp.MustCompile(`Unknown column '([^']+)'`)
	sqliteTableName  = regexp.MustCompile(`no such table: ([^\s:]+)`)
	sqliteColumnName = regexp.MustCompile(`no such column: ([^\s:]+)`)
	sqliteNoColumn   = regexp.MustCompile(`table ([^\s:]+) has no column named ([^\s:]+)`)
	// statementTable finds the tables that a statement names (and, in its
	// second group, a "(" after the name, which makes it a function's).
	statementTable = regexp.MustCompile(`(?i)\b(?:FROM|UPDATE|INTO|JOIN)\s+([A-Za-z0-9_."` + "`" + `]+)(\s*\()?`)
)

// MissingTables returns err as a *MissingTablesError when it says that a
// table or a column does not exist, and err as it is otherwise. query is
// the statement that failed, which names the column's table when the
// database does not ("" when unknown).
func MissingTables(err error, query string) error {
	if err == nil {
		return nil
	}
	var done *MissingTablesError
	if errors.As(err, &done) {
		return err
	}
	table, column, ok := missingObject(err)
	if !ok {
		return err
	}
	if table == "" && column != "" {
		table = onlyTable(query)
	}
	return &MissingTablesError{Table: unqualified(table), Column: unqualified(column), Err: err}
}

// MissingTablesIn is MissingTables for a statement on table alone, which
// gorm's builder wrote.
func MissingTablesIn(err error, table string) error {
	return MissingTables(err, "FROM "+table)
}

// IsMissingTables reports whether err says that a table or a column does
// not exist, as MissingTables finds it.
func IsMissingTables(err error) bool {
	if errors.Is(err, ErrMissingTables) {
		return true
	}
	_, _, ok := missingObject(err)
	return ok
}

// missingObject reports whether err says that a table or a column does not
// exist, with their names as the database's message gives them.
func missingObject(err error) (table, column string, ok bool) {
	msg := err.Error()
	if n, isMySQL := MySQLErrorNumber(err); isMySQL {
		switch n {
		case mysqlNoSuchTable:
			return group(mysqlTableName, msg, 1), "", true
		case mysqlBadFieldError:
			return "", group(mysqlColumnName, msg, 1), true
		}
		return "", "", false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg = pgErr.Message
	}
	switch SQLState(err) {
	case pgUndefinedTable:
		return group(pgTableName, msg, 1), "", true
	case pgUndefinedColumn:
		return group(pgColumnName, msg, 2), group(pgColumnName, msg, 1), true
	}
	if AnsweredByServer(err) {
		return "", "", false // another answer of a server: not SQLite's
	}
	switch {
	case sqliteTableName.MatchString(msg):
		return group(sqliteTableName, msg, 1), "", true
	case sqliteColumnName.MatchString(msg):
		return "", group(sqliteColumnName, msg, 1), true
	case sqliteNoColumn.MatchString(msg):
		return group(sqliteNoColumn, msg, 1), group(sqliteNoColumn, msg, 2), true
	}
	return "", "", false
}

// group returns re's i-th group in s, "" when re does not match.
func group(re *regexp.Regexp, s string, i int) string {
	m := re.FindStringSubmatch(s)
	if len(m) <= i {
		return ""
	}
	return m[i]
}

// onlyTable returns the one table that query names, "" when it names
// none or several.
func onlyTable(query string) string {
	table := ""
	for _, m := range statementTable.FindAllStringSubmatch(query, -1) {
		name := unqualified(strings.Trim(m[1], "\"`"))
		if name == "" || m[2] != "" || strings.EqualFold(name, "SET") {
			continue
		}
		if table != "" && name != table {
			return ""
		}
		table = name
	}
	return table
}

// unqualified is name without its schema, database or alias qualifier:
// "test.job_lease" is "job_lease", "l.stop_by" is "stop_by".
func unqualified(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i+1:]
	}
	return name
}

// CheckTables reads, in one statement, every column that the steps use of
// the lease table, its generation floor and the result table, and no row:
// nil when they all exist. When some do not, it looks for each table and
// column in statements of its own, and returns a *MissingTablesError that
// names every one missing.
func (c *Common) CheckTables(ctx context.Context, db *gorm.DB) error {
	type table struct {
		name    string
		columns []string
	}
	t := c.tables
	lease := strings.Split(RowColumns+", slots"+c.d.LeaseColumns, ", ")
	tables := []table{
		{t.Lease, lease},
		{t.Floor(), []string{"id", "generation"}},
		{t.Result, []string{"target_id", "data", "generation", "updated_at"}},
	}
	var sel, from []string
	for i, tb := range tables {
		alias := "t" + strconv.Itoa(i)
		for _, col := range tb.columns {
			sel = append(sel, alias+"."+strings.TrimSpace(col))
		}
		from = append(from, tb.name+" "+alias)
	}
	probe := func(query string) error {
		rows, err := Query(ctx, db, query)
		if err != nil {
			return err
		}
		return errors.Join(rows.Err(), rows.Close())
	}
	err := probe("SELECT " + strings.Join(sel, ", ") + " FROM " + strings.Join(from, ", ") + " WHERE 1 = 0")
	if err == nil || !IsMissingTables(err) {
		return err
	}
	found := &MissingTablesError{Err: err}
	for _, tb := range tables {
		if err := probe("SELECT 1 FROM " + tb.name + " WHERE 1 = 0"); err != nil {
			if !IsMissingTables(err) {
				return err
			}
			found.add(tb.name, "")
			continue
		}
		for _, col := range tb.columns {
			col = strings.TrimSpace(col)
			if err := probe("SELECT " + col + " FROM " + tb.name + " WHERE 1 = 0"); err != nil {
				if !IsMissingTables(err) {
					return err
				}
				found.add(tb.name, col)
			}
		}
	}
	if len(found.Missing) == 0 {
		return nil // made meanwhile
	}
	return found
}

// add records in e that table, or its column when column is not "", is
// missing.
func (e *MissingTablesError) add(table, column string) {
	if len(e.Missing) == 0 {
		e.Table, e.Column = table, column
	}
	if column == "" {
		e.Missing = append(e.Missing, fmt.Sprintf("table %q", table))
	} else {
		e.Missing = append(e.Missing, fmt.Sprintf("column %q of table %q", column, table))
	}
}
