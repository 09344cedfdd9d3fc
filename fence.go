package gormlease

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"gorm.io/gorm"
)

// lockingBeginner is a capability that a dialect may have: beginning the
// fenced commit's transaction and locking the lease row in one round trip,
// as one query of two statements. gorm's transaction sends BEGIN alone and
// waits for its answer: one round trip of a full job's five. What it saves
// is latency (a one-worker full job ran at 1.5× the jobs/s of a plain-SQL
// lease on raw pgx, against 1.3× without it); in CPU it is about even,
// since the server parses the literal query each time where it would run a
// prepared statement.
type lockingBeginner interface {
	// beginLocked returns the query that begins the fenced transaction and
	// then runs stmt, one of the statements on l's own row, which changes
	// it, so that the query's rows affected is 1 exactly when the row is
	// still l's. Its values are written into the text, as escaped literals.
	beginLocked(stmt string, l Lease) string
	// refusesQueries reports whether err says that the driver sent the
	// query in a way that takes one statement only, so that nothing ran.
	refusesQueries(err error) bool
}

// errSaverEnds is returned to a saver that tries to end the fenced
// transaction itself.
var errSaverEnds = errors.New(prefix + "the fenced commit ends its transaction itself; the saver must not commit or roll back")

// saverPool is the fenced transaction as the saver's gorm session sees it:
// the transaction's statements go through, and it is a gorm.TxCommitter, so
// that gorm runs the saver's nested transactions as savepoints and begins
// none of its own, but its Commit and Rollback refuse. A saver that
// committed would save outside the fence, and what it wrote after would not
// be fenced at all. It has no BeginTx: a BEGIN sent from the saver would be
// one more inside the transaction.
type saverPool struct{ gorm.ConnPool }

func (*saverPool) Commit() error   { return errSaverEnds }
func (*saverPool) Rollback() error { return errSaverEnds }

// saverSession returns a new session of db on tx, the fenced
// transaction, as the saver gets it: on a saverPool, with ctx.
func saverSession(ctx context.Context, db *gorm.DB, tx gorm.ConnPool) *gorm.DB {
	// A Context makes Session copy the Statement, whose pool is set next;
	// without one, the copy would share db's.
	s := db.Session(&gorm.Session{NewDB: true, Context: ctx})
	s.Statement.ConnPool = &saverPool{tx}
	return s
}

// fencedCommitSQL ends the fenced transaction. The SELECT fails when the
// transaction is aborted (a statement of the saver failed, and the saver
// returned nil all the same), so that the COMMIT does not run: a COMMIT
// would end it as a rollback without an error, and database/sql would not
// say so.
const fencedCommitSQL = "SELECT 1; COMMIT"

// commitOnConn is the fenced commit on one connection, with the transaction
// begun and the row locked in one round trip (see lockingBeginner). It
// reports handled false, having run nothing, when r's pool is not a plain
// *sql.DB, or when the driver cannot send the two statements as one query;
// the caller then commits through gorm's transaction (after a refusal, so
// does every later commit of r).
func (r *Repository) commitOnConn(ctx context.Context, b lockingBeginner, l Lease,
	fn func(tx *gorm.DB) error, lockSQL string,
) (handled bool, err error) {
	// Only on gorm's plain pool: a ConnPool of the caller's (a wrapper
	// that traces or routes statements, or gorm's prepared statements) has
	// its own BeginTx, which gorm's transaction goes through.
	sqlDB, ok := r.db.Statement.ConnPool.(*sql.DB)
	if !ok {
		return false, nil
	}
	conn, n, refused, err := r.lockOnConn(ctx, sqlDB, b, l, lockSQL)
	switch {
	case refused:
		r.oneTripRefused.Store(true)
		return false, nil
	case err != nil:
		return true, err
	}
	inTx := true
	defer func() {
		if inTx {
			// The transaction may still be open: close the connection, which
			// rolls it back, rather than return it to the pool inside it.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}()
	// abort rolls the transaction back and returns err. When the ROLLBACK
	// fails (ctx is done, or the connection is), inTx stays set.
	abort := func(err error) (bool, error) {
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err == nil {
			inTx = false
		}
		return true, err
	}
	if n != 1 {
		return abort(wrapf(ErrLeaseLost, "commit %q", l.TargetID))
	}
	if err := fn(saverSession(ctx, r.db, conn)); err != nil {
		return abort(saveFailed(l, err))
	}
	if _, err := conn.ExecContext(ctx, fencedCommitSQL); err != nil {
		var st sqlStater
		switch {
		case !errors.As(err, &st):
			// COMMIT was sent, or about to be, and no answer came back.
			return true, &commitUnknownError{targetID: l.TargetID, cause: err}
		case st.SQLState() == "25P02":
			return abort(wrapf(err, "save %q: a statement of the saver failed and aborted the transaction, nothing saved", l.TargetID))
		}
		return abort(wrapf(err, "commit %q", l.TargetID))
	}
	inTx = false
	return true, nil
}
