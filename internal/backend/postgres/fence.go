package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// beginSQL begins the fenced transaction.
const beginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED"

// commitSQL ends the fenced transaction. The SELECT fails when the
// transaction is aborted (a statement of the saver failed, and the saver
// returned nil all the same), so that the COMMIT does not run: a COMMIT
// would end it as a rollback without an error.
const commitSQL = "SELECT 1; COMMIT"

// CommitFenced runs the fenced commit f. On gorm's plain *sql.DB pool the
// transaction runs on a connection of its own, whose COMMIT is read with
// its notices (see simpleQuery), so that a commit whose wait for the
// synchronous standbys was cut short is not a success; with f.Release,
// BEGIN and the statement that records the save and releases the lease go
// in one query (see beginOnConn). On any other pool it runs through gorm's
// transaction, as on the other databases.
func (b *Backend) CommitFenced(ctx context.Context, db *gorm.DB, f backend.Fence) error {
	return b.FenceWith(ctx, db, f, b.UpdateOwn, b.beginOnConn)
}

// beginOnConn begins the fenced transaction on a connection of db's pool
// of its own, whose COMMIT is read with its notices, and locks f's row.
// With f.Release, BEGIN and the statement that records the save and
// releases the lease, which locks the row and checks the token in one, go
// in one query (beginLocked). Without, the transaction begins by a BEGIN
// of its own, and the row is locked by the locking read through the row's
// model (Common.LockRead); the save is recorded after the saver. It
// reports handled false, having run nothing, when it cannot: db's pool is
// not a *sql.DB, or its driver cannot (then the commit goes through gorm's
// transaction, and, when the driver refused the one-query BEGIN, b's
// commits do from then on).
func (b *Backend) beginOnConn(ctx context.Context, db *gorm.DB, f backend.Fence) (*backend.FencedTx, bool, error) {
	sqlDB, ok := db.Statement.ConnPool.(*sql.DB)
	if !ok || b.oneTripRefused.Load() {
		return nil, false, nil
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, true, err
	}
	c := &connTx{db: db, conn: conn, inTx: true}
	var held bool
	if f.Release {
		var query string
		if query, err = b.beginLocked(f.Lease); err != nil {
			_ = conn.Close()
			return nil, true, err
		}
		var n int64
		_, n, err = backend.ExecOn(ctx, db, conn, query)
		if err != nil && refusesQueries(err) {
			_ = conn.Close()
			b.oneTripRefused.Store(true)
			return nil, false, nil
		}
		held = n == 1
	} else {
		_, err = simpleQuery(ctx, db, conn, beginSQL, beginSQL)
		if errors.Is(err, errNotPgx) {
			_ = conn.Close()
			return nil, false, nil
		}
		if err == nil {
			held, err = b.LockRead(ctx, backend.Session(ctx, db, conn), f.Lease)
		}
	}
	if err != nil {
		c.discard()
		return nil, true, fmt.Errorf("lock lease row: %w", err)
	}
	c.tx = backend.FencedTx{Pool: conn, Recorded: f.Release, Commit: c.commit, Rollback: c.rollback}
	if !held {
		c.rollback(ctx)
		return nil, true, backend.ErrNotOwned
	}
	return &c.tx, true, nil
}

// connTx is a fenced transaction that beginOnConn began on a connection of
// its own: one value, whose methods are its FencedTx's Commit and
// Rollback.
type connTx struct {
	tx   backend.FencedTx
	db   *gorm.DB
	conn *sql.Conn
	inTx bool // the transaction may still be open on conn
}

// discard closes the connection, which rolls back a transaction that may
// still be open on it, rather than return it to the pool inside the
// transaction.
func (c *connTx) discard() {
	_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.conn.Close()
}

// close returns the connection to the pool, or discards it while the
// transaction may still be open on it.
func (c *connTx) close() {
	if c.inTx {
		c.discard()
		return
	}
	_ = c.conn.Close()
}

// rollback ends the transaction without saving, and gives up the
// connection.
func (c *connTx) rollback(ctx context.Context) {
	if _, err := c.conn.ExecContext(ctx, "ROLLBACK"); err == nil {
		c.inTx = false
	}
	c.close()
}

// commit sends COMMIT, read with its notices, and gives up the connection;
// after an error that the server answered, it rolls back first.
func (c *connTx) commit(ctx context.Context) error {
	_, err := simpleQuery(ctx, c.db, c.conn, commitSQL, "")
	if errors.Is(err, errNotPgx) {
		_, err = c.conn.ExecContext(ctx, commitSQL)
	}
	if err == nil || !backend.AnsweredByServer(err) {
		c.inTx = err != nil
		c.close()
		return err
	}
	c.rollback(ctx)
	return err
}

// beginLocked returns the query that begins the fenced transaction at READ
// COMMITTED and runs the statement that records the save and releases the
// lease (backend.SaveRelease), which locks the lease row, on l's row. pgx
// (and lib/pq) send a query without arguments as a simple query, which may
// hold several statements; its rows affected are the last statement's.
// The statement's $1 and $2, the target and the token, are written in as
// literals (see literal), in one pass and one allocation: the query is
// built for every fenced commit.
func (b *Backend) beginLocked(l backend.Lease) (string, error) {
	if err := checkLiteral(l.TargetID); err != nil {
		return "", fmt.Errorf("lock lease row %q: %w", l.TargetID, err)
	}
	p := &b.saveReleaseParts
	var q strings.Builder
	// Every byte of the target may need an escape; the token needs none.
	q.Grow(len(beginSQL) + len("; ") + len(p[0]) + len(p[1]) + len(p[2]) +
		2*len(l.TargetID) + 36 + 2*len("E''"))
	q.WriteString(beginSQL)
	q.WriteString("; ")
	q.WriteString(p[0])
	q.WriteString("E'")
	literalText{&q}.WriteString(l.TargetID)
	q.WriteByte('\'')
	q.WriteString(p[1])
	var token [36]byte
	tokenText(&token, l.Token) // hex digits and dashes: nothing to escape
	q.WriteString("E'")
	q.Write(token[:])
	q.WriteByte('\'')
	q.WriteString(p[2])
	return q.String(), nil
}

// refusesQueries reports whether err is the server refusing several
// statements in one prepared statement: the driver sent the query through
// the extended protocol, and nothing ran.
func refusesQueries(err error) bool {
	return backend.SQLState(err) == "42601" && strings.Contains(err.Error(), "multiple commands")
}
