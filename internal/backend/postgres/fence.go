package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
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
// in one round trip (see beginOnConn). On any other pool it runs through gorm's
// transaction, as on the other databases.
func (b *Backend) CommitFenced(ctx context.Context, db *gorm.DB, f backend.Fence) error {
	return b.FenceWith(ctx, db, f, b.UpdateOwn, b.beginOnConn)
}

// beginOnConn begins the fenced transaction on a connection of db's pool
// of its own, whose COMMIT is read with its notices, and locks f's row.
// With f.Release, BEGIN and the statement that records the save and
// releases the lease, which locks the row and checks the token in one, go
// in one round trip: on pgx's connection in its default query mode, BEGIN
// and the statement prepared, sent together (beginPipelined); otherwise
// one simple query (beginLocked). Without, the
// transaction begins by a BEGIN of its own, and the row is locked by the
// locking read through the row's model (Common.LockRead); the save is
// recorded after the saver. It reports handled false, having run nothing,
// when it cannot: db's pool is not a *sql.DB, or its driver cannot (then
// the commit goes through gorm's transaction, and, when the driver refused
// the one-query BEGIN, b's commits do from then on).
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
		var n int64
		n, err = b.beginPipelined(ctx, db, conn, f.Lease)
		if errors.Is(err, errNotPgx) {
			var query string
			if query, err = b.beginLocked(f.Lease); err != nil {
				_ = conn.Close()
				return nil, true, err
			}
			_, n, err = backend.ExecOn(ctx, db, conn, query)
			if err != nil && refusesQueries(err) {
				_ = conn.Close()
				b.oneTripRefused.Store(true)
				return nil, false, nil
			}
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

// beginPipelined begins the fenced transaction at READ COMMITTED and runs
// the statement that records the save and releases the lease
// (backend.SaveRelease), which locks l's row, in one round trip, on pgx's
// connection under conn in pgx's default query mode (cache_statement).
// Both go in the extended protocol, before one Sync: BEGIN parsed as the
// unnamed statement, bound and executed, then the statement, prepared once
// per connection (pgx's Conn.Prepare, which answers from the connection's
// own statements after the first call), bound to the target and the token
// and executed, all sent at once. The server so does not parse and plan
// the statement at every commit, as it would the simple query of
// beginLocked. After an error it skips what comes before the Sync: the
// statement never runs when BEGIN failed, whereas after a simple-query
// BEGIN it would run, and commit, outside a transaction, recording the
// lease as released and saved without the saver's writes.
// It returns the rows the statement affected, and errNotPgx, having sent
// nothing, when conn is not pgx's, or is in another query mode, which may
// be chosen because prepared statements do not last (a pooler between).
func (b *Backend) beginPipelined(ctx context.Context, db *gorm.DB, conn *sql.Conn, l backend.Lease) (int64, error) {
	var res simpleResult
	sent := false
	begin := time.Now()
	ctx, end := backend.StartStatement(ctx, db, b.beginSaveReleaseSQL)
	err := conn.Raw(func(dc any) error {
		c, ok := dc.(pgxConn)
		if !ok || c.Conn().Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
			return errNotPgx
		}
		sent = true
		if c.Conn().IsClosed() || c.Conn().PgConn().IsBusy() {
			return driver.ErrBadConn
		}
		sd, err := c.Conn().Prepare(ctx, b.saveReleaseSQL, b.saveReleaseSQL)
		if err != nil {
			return err
		}
		pg := c.Conn().PgConn()
		// One value for the messages and the token's text: each would be
		// an allocation of its own, as Send's argument escapes.
		m := new(struct {
			parseBegin pgproto3.Parse
			bindBegin  pgproto3.Bind
			execBegin  pgproto3.Execute
			bind       pgproto3.Bind
			exec       pgproto3.Execute
			sync       pgproto3.Sync
			params     [2][]byte
			token      [36]byte
		})
		tokenText(&m.token, l.Token)
		m.params = [2][]byte{[]byte(l.TargetID), m.token[:]}
		m.parseBegin.Query = beginSQL // the unnamed statement and portal
		m.bind.PreparedStatement = sd.Name
		m.bind.Parameters = m.params[:] // text, as no format codes say otherwise
		f := pg.Frontend()
		f.Send(&m.parseBegin)
		f.Send(&m.bindBegin)
		f.Send(&m.execBegin)
		f.Send(&m.bind)
		f.Send(&m.exec)
		f.Send(&m.sync)
		if err := f.Flush(); err != nil {
			return &badConn{err}
		}
		// One answer, up to the Sync's ReadyForQuery: the first error
		// ended it, and the caller discards the connection for it.
		return readAnswer(ctx, pg, &res)
	})
	if !sent {
		return 0, errNotPgx
	}
	if end != nil {
		end(err)
	}
	backend.Trace(ctx, db, begin, b.beginSaveReleaseSQL, []any{l.TargetID, l.Token.String()}, res.n, err)
	return res.n, backend.MissingTables(err, b.saveReleaseSQL)
}

// beginLocked returns the query that begins the fenced transaction at READ
// COMMITTED and runs the statement that records the save and releases the
// lease (backend.SaveRelease), which locks the lease row, on l's row, for
// drivers other than pgx (see beginPipelined). lib/pq sends a query without
// arguments as a simple query, which may hold several statements; its rows
// affected are the last statement's.
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
