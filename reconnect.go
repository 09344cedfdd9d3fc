package gormlease

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"time"
)

// Reconnecting the fenced commit. When PostgreSQL fails over to a standby,
// or restarts, the pool still holds connections to the server that is gone,
// each of which fails its next statement, and new connections fail until a
// server accepts writes again (a multi-host DSN with
// target_session_attrs=read-write then finds the new primary). A Run whose
// work ends in that moment has a result, and a lease that it still trusts
// for most of the lease timeout. So the fenced commit tries its first query
// (BEGIN and the statement that locks the row and checks the token) again
// on another connection while the database cannot be reached, until the
// operation timeout: nothing has run yet, the saver runs only once the row
// is locked, and the database still judges the token. Once the saver has
// run, nothing is tried again (see ErrCommitUnknown).

const (
	// reconnectFirstPause is the first pause between attempts; it doubles,
	// with jitter, up to reconnectMaxPause.
	reconnectFirstPause = 20 * time.Millisecond
	reconnectMaxPause   = 500 * time.Millisecond
)

// reconnectBackoff is the pause between attempts to reach a database that
// could not be reached.
func reconnectBackoff() backoff {
	return backoff{pause: reconnectFirstPause, max: reconnectMaxPause}
}

// unreachable reports whether err says that a statement could not reach
// the database, or lost its connection before an answer came: an error that
// no server sent (a refused or dropped connection, no server that accepts
// writes), or a server's error of class 08 (connection exception) or 57P
// (the server is shutting down, crashed, or does not accept connections
// yet; not 57014, a cancelled statement).
func unreachable(err error) bool {
	if !answeredByServer(err) {
		return true
	}
	state := sqlState(err)
	return strings.HasPrefix(state, "08") || strings.HasPrefix(state, "57P")
}

// lockOnConn takes a connection from sqlDB and runs the fenced commit's
// first query on it, beginning the transaction and running lockSQL on l's
// row. It returns the connection, inside the transaction, and the rows that
// lockSQL changed. While the database cannot be reached (see unreachable)
// it tries again, on another connection, until ctx ends. refused reports
// that the driver cannot send the query (see lockingBeginner), and nothing
// ran.
func (r *Repository) lockOnConn(ctx context.Context, sqlDB *sql.DB, b lockingBeginner, l Lease, lockSQL string,
) (conn *sql.Conn, n int64, refused bool, err error) {
	wait := reconnectBackoff()
	for {
		conn, err = sqlDB.Conn(ctx)
		if err == nil {
			_, n, err = execOn(ctx, r.db, conn, b.beginLocked(lockSQL, l))
			if err == nil {
				return conn, n, false, nil
			}
			if b.refusesQueries(err) {
				_ = conn.Close()
				return nil, 0, true, nil
			}
			// BEGIN may have run: close the connection, which rolls it back,
			// rather than return it to the pool inside the transaction.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			_ = conn.Close()
			err = wrapf(err, "commit %q: lock lease row", l.TargetID)
		} else {
			err = wrapf(err, "commit %q", l.TargetID)
		}
		if !unreachable(err) || !wait.wait(ctx) {
			return nil, 0, false, err
		}
	}
}
