package backend

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gorm.io/gorm"
)

// The lease steps' own statements run straight on the connection pool under
// the *gorm.DB, or on its transaction, rather than through gorm's statement
// builder and callbacks: they are fixed texts with a few scalar arguments,
// so the builder would add nothing but client work on the hot path. They
// are still reported to the session's logger, as gorm reports its own, with
// the arguments inlined by the dialector, and to the statement hook of
// their context (a Runner's observer). Callbacks registered on the *gorm.DB
// do not see them; the saver's statements do. Going to the pool under the
// *gorm.DB also means that a read/write splitting plugin such as dbresolver
// never sends them to a replica.

// StatementHook starts the span of one statement, query, on the database
// named dialector, and returns the context to run it on and the function
// that ends the span with the statement's error.
type StatementHook func(ctx context.Context, dialector, query string) (context.Context, func(error))

type hookKey struct{}

// WithStatementHook returns ctx whose statements are reported to hook; a
// nil hook reports them to none.
func WithStatementHook(ctx context.Context, hook StatementHook) context.Context {
	return context.WithValue(ctx, hookKey{}, hook)
}

// HasStatementHook reports whether ctx's statements are reported to a hook.
func HasStatementHook(ctx context.Context) bool {
	h, _ := ctx.Value(hookKey{}).(StatementHook)
	return h != nil
}

// ConnPool returns the pool, or transaction, that db's statements run on.
func ConnPool(db *gorm.DB) (gorm.ConnPool, error) {
	if db.Statement == nil || db.Statement.ConnPool == nil {
		return nil, errors.New("db has no connection pool: open it with gorm.Open")
	}
	return db.Statement.ConnPool, nil
}

// InTx reports whether db's statements run in a transaction.
func InTx(db *gorm.DB) bool {
	_, ok := db.Statement.ConnPool.(gorm.TxCommitter)
	return ok
}

// Exec runs query, a statement that returns no rows, and returns its result
// and the number of rows it affected.
//
// Exec, ExecOn, QueryRow and Query return the error of a statement that met
// a missing table or column as a *MissingTablesError (see MissingTables),
// so that every step, and the admin package's, reports it alike.
func Exec(ctx context.Context, db *gorm.DB, query string, args ...any) (sql.Result, int64, error) {
	pool, err := ConnPool(db)
	if err != nil {
		return nil, 0, err
	}
	return ExecOn(ctx, db, pool, query, args...)
}

// ExecOn is Exec on pool, reported to db's logger. Every caller decides on
// the rows affected, so a driver that cannot count them is an error.
func ExecOn(ctx context.Context, db *gorm.DB, pool gorm.ConnPool, query string, args ...any) (sql.Result, int64, error) {
	ctx, end := startStatement(ctx, db, query)
	begin := time.Now()
	res, err := pool.ExecContext(ctx, query, args...)
	rows := int64(-1)
	if err == nil {
		rows, err = res.RowsAffected()
	}
	trace(ctx, db, begin, query, args, rows, err)
	if end != nil {
		end(err)
	}
	return res, rows, MissingTables(err, query)
}

// QueryRow runs query, a statement that returns at most one row, and scans
// that row into dest. It reports false, and no error, when there is no row.
//
// It reads the row through QueryContext rather than QueryRowContext: gorm's
// prepared-statement pool (gorm.Config{PrepareStmt: true}) answers a
// QueryRowContext whose statement it could not prepare (a cancelled context,
// a database out of reach) with an empty *sql.Row, whose Scan panics.
func QueryRow(ctx context.Context, db *gorm.DB, query string, args []any, dest ...any) (bool, error) {
	pool, err := ConnPool(db)
	if err != nil {
		return false, err
	}
	ctx, end := startStatement(ctx, db, query)
	begin := time.Now()
	found := false
	res, err := pool.QueryContext(ctx, query, args...)
	if err == nil {
		found, err = scanFirst(res, dest...)
	}
	rows := int64(1)
	switch {
	case err != nil:
		rows = -1
	case !found:
		rows = 0
	}
	trace(ctx, db, begin, query, args, rows, err)
	if end != nil {
		end(err)
	}
	return found, MissingTables(err, query)
}

// scanFirst scans the first of rows, if any, into dest and closes rows, as
// (*sql.Row).Scan does. It reports whether there was a row.
func scanFirst(rows *sql.Rows, dest ...any) (bool, error) {
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return false, err
	}
	// Close reports an error that ended the statement after its row.
	return true, rows.Close()
}

// Query runs query and returns its rows, which the caller must close.
func Query(ctx context.Context, db *gorm.DB, query string, args ...any) (*sql.Rows, error) {
	pool, err := ConnPool(db)
	if err != nil {
		return nil, err
	}
	ctx, end := startStatement(ctx, db, query)
	begin := time.Now()
	rows, err := pool.QueryContext(ctx, query, args...)
	trace(ctx, db, begin, query, args, -1, err)
	if end != nil {
		end(err) // when the query has answered; reading its rows is not counted
	}
	return rows, MissingTables(err, query)
}

// StartStatement starts the span of query, on db, for a statement that a
// backend sends by other means than ExecOn, Query and QueryRow: end is nil
// when ctx has no hook. Trace then reports it to db's logger.
func StartStatement(ctx context.Context, db *gorm.DB, query string) (context.Context, func(error)) {
	return startStatement(ctx, db, query)
}

// Trace reports a statement started with StartStatement to db's logger,
// with its arguments (written in as the dialector explains them) and the
// rows it affected.
func Trace(ctx context.Context, db *gorm.DB, begin time.Time, query string, args []any, rows int64, err error) {
	trace(ctx, db, begin, query, args, rows, err)
}

// startStatement starts the span of query, on db, when ctx has a hook; end
// is nil otherwise.
func startStatement(ctx context.Context, db *gorm.DB, query string) (context.Context, func(error)) {
	hook, _ := ctx.Value(hookKey{}).(StatementHook)
	if hook == nil {
		return ctx, nil
	}
	name := ""
	if db.Dialector != nil {
		name = db.Dialector.Name()
	}
	return hook(ctx, name, query)
}

// trace reports a statement to db's logger as the library's own (see
// QuietLogger): at logger.Info, with its text, the arguments inlined by the
// dialector, built only when the logger writes it. A failed statement is
// reported with rows -1, which gorm's logger writes as "-".
func trace(ctx context.Context, db *gorm.DB, begin time.Time, query string, args []any, rows int64, err error) {
	if db.Logger == nil {
		return
	}
	if err != nil {
		rows = -1
	}
	QuietLogger(db.Logger).Trace(ctx, begin, func() (string, int64) {
		if db.Dialector == nil {
			return query, rows
		}
		return db.Dialector.Explain(query, args...), rows
	}, err)
}
