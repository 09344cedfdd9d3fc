package gormlease

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

// The lease steps' own statements (acquire, heartbeat, release, and the
// release that locks the row in Run's fenced commit) run straight on the
// connection pool under the *gorm.DB, or on its transaction, rather than
// through gorm's statement builder and callbacks. They are fixed texts with
// a few scalar arguments, so the builder adds nothing but client work: on a
// refused acquire, gorm's Raw/Scan took twice the CPU of the statement on
// database/sql alone (about 40 µs against 19 µs, with 59 allocations
// against 18), and a lease library's hot path is exactly such statements.
//
// They are still reported to the session's logger, as gorm reports its
// own, with the arguments inlined by the dialector. Callbacks registered
// on the *gorm.DB (tracing plugins, for one) do not see them; the saver's
// statements, and everything else the caller runs on the transaction, do.
// A Runner's Observer does see them, as SpanStatement spans (see
// startStatement): that is how a tracer sees the lease's statements.
// Going to the pool under the *gorm.DB also means that a read/write
// splitting plugin such as dbresolver never sends them to a replica.

// connPool returns the pool, or transaction, that db's statements run on.
func connPool(db *gorm.DB) (gorm.ConnPool, error) {
	if db.Statement == nil || db.Statement.ConnPool == nil {
		return nil, errors.New("db has no connection pool: open it with gorm.Open")
	}
	return db.Statement.ConnPool, nil
}

// execSQL runs query, a statement that returns no rows, and returns the
// number of rows it affected and its result.
func execSQL(ctx context.Context, db *gorm.DB, query string, args ...any) (sql.Result, int64, error) {
	pool, err := connPool(db)
	if err != nil {
		return nil, 0, err
	}
	return execOn(ctx, db, pool, query, args...)
}

// execOn is execSQL on pool, reported to db's logger. Every caller decides
// on the rows affected, so a driver that cannot count them is an error.
func execOn(ctx context.Context, db *gorm.DB, pool gorm.ConnPool, query string, args ...any) (sql.Result, int64, error) {
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
	return res, rows, err
}

// queryRowSQL runs query, a statement that returns at most one row, and
// scans that row into dest. It reports false, and no error, when there is
// no row.
//
// It reads the row through QueryContext rather than QueryRowContext: gorm's
// prepared-statement pool (gorm.Config{PrepareStmt: true}) answers a
// QueryRowContext whose statement it could not prepare (a cancelled context,
// a database out of reach) with an empty *sql.Row, whose Scan panics.
// QueryContext returns that error.
func queryRowSQL(ctx context.Context, db *gorm.DB, query string, args []any, dest ...any) (bool, error) {
	pool, err := connPool(db)
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
	return found, err
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

// querySQL runs query and returns its rows, which the caller must close.
func querySQL(ctx context.Context, db *gorm.DB, query string, args ...any) (*sql.Rows, error) {
	pool, err := connPool(db)
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
	return rows, err
}

// startStatement starts the span of query, on db, when ctx is a Runner's
// with an Observer; end is nil otherwise.
func startStatement(ctx context.Context, db *gorm.DB, query string) (context.Context, func(error)) {
	m := statementObserver(ctx)
	if m == nil {
		return ctx, nil
	}
	name := ""
	if db.Dialector != nil {
		name = db.Dialector.Name()
	}
	return m.startStatement(ctx, name, query)
}

// trace reports a statement to db's logger, as gorm's callbacks do: the
// logger decides, by its level and slow threshold, whether to build the
// statement's text and write it. A failure that is a normal outcome (see
// expectedFailure) is reported as the statement alone, without the error,
// so that the logger does not write it as an error: the step returns it, or
// retries it, or turns it into its outcome.
func trace(ctx context.Context, db *gorm.DB, begin time.Time, query string, args []any, rows int64, err error) {
	if db.Logger == nil {
		return
	}
	if err != nil && expectedFailure(ctx, err) {
		err = nil
	}
	db.Logger.Trace(ctx, begin, func() (string, int64) {
		if db.Dialector == nil {
			return query, rows
		}
		return db.Dialector.Explain(query, args...), rows
	}, err)
}

// numbered rewrites the ? placeholders of query as PostgreSQL's $1, $2, ...
// The statements it is used on have no ? in their literals.
func numbered(query string) string {
	var b strings.Builder
	n := 0
	for {
		i := strings.IndexByte(query, '?')
		if i < 0 {
			b.WriteString(query)
			return b.String()
		}
		n++
		b.WriteString(query[:i])
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
		query = query[i+1:]
	}
}
