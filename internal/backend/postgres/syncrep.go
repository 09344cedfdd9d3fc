package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// A COMMIT on a primary with synchronous standbys (synchronous_commit on,
// synchronous_standby_names set, as Patroni's synchronous mode sets them)
// first commits locally, then waits until the standbys have the commit. When
// that wait is cancelled (a cancel request: pgx sends one when it closes a
// connection whose statement outlived its context; lib/pq, and pgx's
// CancelRequestContextWatcherHandler, when the context ends; an operator's
// pg_cancel_backend), the server stops waiting and answers the COMMIT as a
// success, with a WARNING notice: "canceling wait for synchronous
// replication due to user request ... The transaction has already committed
// locally, but might not have been replicated to the standby". When the
// primary has lost its standbys to a failover (its HA manager died, and
// nothing stopped it), that commit is on the old primary only, and a rewind
// throws it away.
//
// pgx hands notices only to the OnNotice of the pool's connection settings,
// which belong to the application. So the statements whose success the
// lease depends on (the fenced COMMIT, the heartbeat, the settling read) are
// sent here as simple queries on the connection's wire protocol, and their
// notices read with the answer: same round trip, same server work. On a
// pool whose connections are not pgx's, they go through database/sql, and
// only a cancel that the client's own context caused is caught (see the
// callers).

// syncRepWarned reports whether n says that the server stopped waiting for
// synchronous replication: a WARNING of the generic class (01000) or of an
// administrator's shutdown (57P01, sent before the connection is closed).
// Its text is not read, since lc_messages translates it. A statement of the
// lease's own raises no other warning; one that another warning accompanies
// is taken as unconfirmed, which is never unsafe.
func syncRepWarned(n *pgproto3.NoticeResponse) bool {
	return n.SeverityUnlocalized == "WARNING" && (n.Code == "01000" || n.Code == "57P01")
}

// pgxConn is the driver connection of pgx's database/sql driver
// (*stdlib.Conn), known by its method so as not to import the driver.
type pgxConn interface{ Conn() *pgx.Conn }

// simpleResult is what a simple query answered.
type simpleResult struct {
	rows [][]string // the last statement's rows, each column as text ("" for NULL)
	n    int64      // the rows the last statement affected, from its command tag
}

// errNotPgx says that a connection is not pgx's: simpleQuery sent nothing.
var errNotPgx = errors.New("not a pgx connection")

// simpleQuery sends query, without parameters, as one simple query on
// conn's pgx connection, and reads the whole answer. It returns the first
// error the server sent (a *backend.MissingTablesError for a missing table
// or column), or an error wrapping backend.ErrReplicationCancelled
// when the server warned that it cut short a wait for synchronous
// replication, or errNotPgx, having sent nothing, when conn's driver is not
// pgx. A connection whose answer was not read to its end (ctx ended, the
// connection broke) is closed, after a cancel request for the statement
// when ctx ended. The statement is reported to db's logger and ctx's
// statement hook, as backend.Query reports its own, as reported: the text
// with placeholders where query has the values written in (the lease
// tokens among them, which logs and traces should not carry), or "" for
// none, as for the fenced transaction's COMMIT, which, like gorm's, is not
// reported.
func simpleQuery(ctx context.Context, db *gorm.DB, conn *sql.Conn, query, reported string) (simpleResult, error) {
	var res simpleResult
	sent := false
	begin := time.Now()
	var end func(error)
	report := reported != ""
	if report {
		ctx, end = backend.StartStatement(ctx, db, reported)
	}
	err := conn.Raw(func(dc any) error {
		c, ok := dc.(pgxConn)
		if !ok {
			return errNotPgx
		}
		sent = true
		pg := c.Conn().PgConn()
		if pg.IsBusy() || pg.IsClosed() {
			return driver.ErrBadConn
		}
		pg.Frontend().Send(&pgproto3.Query{String: query})
		if err := pg.Frontend().Flush(); err != nil {
			return &badConn{err}
		}
		return readAnswer(ctx, pg, &res)
	})
	if !sent {
		return res, errNotPgx
	}
	if end != nil {
		end(err)
	}
	if report {
		backend.Trace(ctx, db, begin, reported, nil, res.n, err)
	}
	// A missing table or column, as backend.Query reports it: query
	// names the statement's tables (its literals never reach the error).
	return res, backend.MissingTables(err, query)
}

// cancelTimeout bounds the cancel request of a statement abandoned when its
// context ended.
const cancelTimeout = time.Second

// cancelStatement asks the server to cancel the statement running on pg,
// whose answer the caller abandons, as pgx does when it closes such a
// connection: otherwise the statement would run on, holding its locks (a
// heartbeat waiting for a standby holds the lease row's). A commit that the
// cancel cuts short in its wait for the standbys commits locally, which is
// why nothing that the caller abandoned so counts as done.
func cancelStatement(pg *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	_ = pg.CancelRequest(ctx)
}

// badConn is an error of a connection whose answer was not read to its
// end: it matches driver.ErrBadConn, so that database/sql closes the
// connection, and reads as its cause.
type badConn struct{ err error }

func (e *badConn) Error() string   { return e.err.Error() }
func (e *badConn) Unwrap() []error { return []error{driver.ErrBadConn, e.err} }

// readAnswer reads pg's messages up to ReadyForQuery into res. An error of
// the connection (ctx ended, the server went away) is returned wrapping
// driver.ErrBadConn, so that database/sql closes the connection: the rest
// of the answer is still on its way.
func readAnswer(ctx context.Context, pg *pgconn.PgConn, res *simpleResult) error {
	var serverErr error
	cancelled := false
	w := watch(ctx, pg)
	defer w.stop()
	for {
		// Read without ctx: pgconn would watch it anew for each message
		// (three allocations each); w watches it once for the answer.
		msg, err := pg.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				cancelStatement(pg)
				// w's deadline ended the read: say why, as pgconn does
				// for a read ended by its context.
				err = fmt.Errorf("receive message failed: %w (%w)", ctx.Err(), err)
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				err = pgErr // a FATAL error: the server's answer
			}
			return &badConn{err}
		}
		switch m := msg.(type) {
		case *pgproto3.RowDescription:
			res.rows = nil // a later statement's rows
		case *pgproto3.DataRow:
			row := make([]string, len(m.Values))
			for i, v := range m.Values {
				row[i] = string(v) // copied: the message's buffer is reused
			}
			res.rows = append(res.rows, row)
		case *pgproto3.CommandComplete:
			res.n = rowsAffected(m.CommandTag)
		case *pgproto3.ErrorResponse:
			if serverErr == nil {
				serverErr = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.NoticeResponse:
			cancelled = cancelled || syncRepWarned(m)
		case *pgproto3.ReadyForQuery:
			switch {
			case serverErr != nil:
				return serverErr
			case cancelled:
				return backend.ErrReplicationCancelled
			}
			return nil
		}
	}
}

// answerWatch ends the reads of one answer on a connection when a context
// ends, by the connection's read deadline, as pgconn does for each message
// read with a context.
type answerWatch struct {
	mu       sync.Mutex
	conn     net.Conn
	done     bool // the answer was read: set no deadline
	deadline bool // the deadline was set
	stopFunc func() bool
}

// watch sets pg's read deadline to now once ctx ends, until its stop. A
// context that never ends costs nothing.
func watch(ctx context.Context, pg *pgconn.PgConn) *answerWatch {
	if ctx.Done() == nil {
		return nil
	}
	w := &answerWatch{conn: pg.Conn()}
	w.stopFunc = context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.done {
			w.deadline = true
			_ = w.conn.SetReadDeadline(time.Now())
		}
	})
	return w
}

// stop ends the watch, and clears the deadline if ctx ended meanwhile, so
// that a connection whose answer was read whole stays usable.
func (w *answerWatch) stop() {
	if w == nil || w.stopFunc() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if w.deadline {
		_ = w.conn.SetReadDeadline(time.Time{})
	}
}

// rowsAffected returns the rows affected that a statement's command tag
// ends with ("UPDATE 3"), or 0, as pgconn.CommandTag.RowsAffected does,
// without a copy of the tag: the message's buffer is reused.
func rowsAffected(tag []byte) int64 {
	var n, unit int64 = 0, 1
	for i := len(tag) - 1; i >= 0 && '0' <= tag[i] && tag[i] <= '9'; i-- {
		n += int64(tag[i]-'0') * unit
		unit *= 10
	}
	return n
}

// HeartbeatBatch runs heartbeatBatchSQL. On a pool of pgx connections it
// is sent as a simple query with the leases written in as literals, so
// that a heartbeat whose wait for the synchronous standbys was cut short
// is an error (backend.ErrReplicationCancelled), not a renewal.
func (b *Backend) HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
	if sqlDB, ok := db.Statement.ConnPool.(*sql.DB); ok {
		lost, err := b.heartbeatSimple(ctx, db, sqlDB, leases)
		if !errors.Is(err, errNotPgx) {
			return lost, err
		}
	}
	targets, tokens := leaseArrays(leases)
	rows, err := backend.Query(ctx, db, b.heartbeatSQL, targets, tokens)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lost map[backend.Lease]backend.Ended
	for rows.Next() {
		var i int
		var stop sql.NullString
		if err := rows.Scan(&i, &stop); err != nil {
			return nil, err
		}
		if lost == nil {
			lost = map[backend.Lease]backend.Ended{}
		}
		if err := markLost(lost, leases, i, stop.String); err != nil {
			return nil, err
		}
	}
	return lost, rows.Err()
}

// heartbeatSimple is HeartbeatBatch as a simple query on a connection of
// sqlDB.
func (b *Backend) heartbeatSimple(ctx context.Context, db *gorm.DB, sqlDB *sql.DB, leases []backend.Lease,
) (map[backend.Lease]backend.Ended, error) {
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	query, err := b.heartbeatQuery(leases)
	if err != nil {
		return nil, err
	}
	res, err := simpleQuery(ctx, db, conn, query, b.heartbeatSQL)
	if err != nil {
		return nil, err
	}
	var lost map[backend.Lease]backend.Ended // nil while none ended: a round of leases all renewed allocates none
	for _, row := range res.rows {
		if len(row) != 2 {
			return nil, fmt.Errorf("heartbeat: %d columns returned, want 2", len(row))
		}
		i, err := strconv.Atoi(row[0])
		if err != nil {
			return nil, fmt.Errorf("heartbeat: position %q: %w", row[0], err)
		}
		if lost == nil {
			lost = make(map[backend.Lease]backend.Ended, len(res.rows))
		}
		if err := markLost(lost, leases, i, row[1]); err != nil {
			return nil, err
		}
	}
	return lost, nil
}

// heartbeatQuery returns heartbeatBatchSQL with leases written in as the
// escape string literals of its two arrays, as literal would write the
// arrays that leaseArrays writes, in one pass and one allocation: a
// heartbeat of 1,000 leases is some 60 kB of text, a hundred a second
// for 100,000 leases held. It returns an error for a target that no
// literal can carry (see checkLiteral).
func (b *Backend) heartbeatQuery(leases []backend.Lease) (string, error) {
	n := len(b.heartbeatParts[0]) + len(b.heartbeatParts[1]) + len(b.heartbeatParts[2]) + 2*len("E'{}'")
	for _, l := range leases {
		if err := checkLiteral(l.TargetID); err != nil {
			return "", fmt.Errorf("heartbeat %q: %w", l.TargetID, err)
		}
		n += len(l.TargetID) + len(`"",`) + 36 + len(",")
	}
	var q strings.Builder
	q.Grow(n)
	text := literalText{&q}
	q.WriteString(b.heartbeatParts[0])
	q.WriteString("E'{")
	for i, l := range leases {
		if i > 0 {
			q.WriteByte(',')
		}
		writeElement(text, l.TargetID)
	}
	q.WriteString("}'")
	q.WriteString(b.heartbeatParts[1])
	q.WriteString("E'{")
	var token [36]byte
	for i, l := range leases {
		if i > 0 {
			q.WriteByte(',')
		}
		tokenText(&token, l.Token)
		q.Write(token[:]) // hex digits and dashes: nothing to escape
	}
	q.WriteString("}'")
	q.WriteString(b.heartbeatParts[2])
	return q.String(), nil
}

// markLost records what heartbeatBatchSQL answered of the lease at
// position i (from 1) of leases: lost, or, for -i, renewed and asked to
// stop for reason.
func markLost(lost map[backend.Lease]backend.Ended, leases []backend.Lease, i int, reason string) error {
	stop := i < 0
	if stop {
		i = -i
	}
	if i < 1 || i > len(leases) {
		return fmt.Errorf("heartbeat: the database named lease %d of %d", i, len(leases))
	}
	if stop {
		lost[leases[i-1]] = backend.Ended{Stop: true, Reason: reason}
	} else {
		lost[leases[i-1]] = backend.Ended{}
	}
	return nil
}

// leaseArrays writes the target IDs and the tokens of leases as two array
// literals, in the leases' order.
func leaseArrays(leases []backend.Lease) (targets, tokens string) {
	var tb, kb strings.Builder
	tb.Grow(len(leases) * 40)
	kb.Grow(len(leases) * 37)
	tb.WriteByte('{')
	kb.WriteByte('{')
	var text [36]byte
	for i, l := range leases {
		if i > 0 {
			tb.WriteByte(',')
			kb.WriteByte(',')
		}
		writeElement(&tb, l.TargetID)
		tokenText(&text, l.Token)
		kb.Write(text[:])
	}
	tb.WriteByte('}')
	kb.WriteByte('}')
	return tb.String(), kb.String()
}

// ReadSaved reads what targetID's row saved under a row lock (SELECT ...
// FOR UPDATE) in a transaction of its own, whose COMMIT, since the lock
// wrote to the row, waits for the synchronous standbys as every write
// does. So what it reports is on the standbys too: a save that only an
// isolated primary holds (committed locally after its wait was cut short)
// makes the read fail, never confirm it. It waits for the lock while the
// fenced transaction still holds it.
func (b *Backend) ReadSaved(ctx context.Context, db *gorm.DB, targetID string) (backend.Saved, bool, error) {
	sqlDB, ok := db.Statement.ConnPool.(*sql.DB)
	if !ok {
		return b.readSavedTx(ctx, db, targetID)
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return backend.Saved{}, false, err
	}
	defer conn.Close()
	target, err := literal(targetID)
	if err != nil {
		return backend.Saved{}, false, fmt.Errorf("read saved %q: %w", targetID, err)
	}
	res, err := simpleQuery(ctx, db, conn, beginSQL+"; "+strings.ReplaceAll(b.readSavedSQL, "$1", target)+"; COMMIT",
		beginSQL+"; "+b.readSavedSQL+"; COMMIT")
	switch {
	case errors.Is(err, errNotPgx):
		return b.readSavedTx(ctx, db, targetID)
	case err != nil:
		return backend.Saved{}, false, err
	case len(res.rows) == 0:
		return backend.Saved{}, false, nil
	case len(res.rows[0]) != 3:
		return backend.Saved{}, false, fmt.Errorf("read saved: %d columns returned, want 3", len(res.rows[0]))
	}
	var s backend.Saved
	row := res.rows[0]
	if s.Generation, err = strconv.ParseInt(row[0], 10, 64); err != nil {
		return backend.Saved{}, false, fmt.Errorf("read saved: generation %q: %w", row[0], err)
	}
	if s.Token, err = uuid.Parse(row[1]); err != nil {
		return backend.Saved{}, false, fmt.Errorf("read saved: token %q: %w", row[1], err)
	}
	s.Released = row[2] == "t"
	return s, true, nil
}

// readSavedTx is ReadSaved through database/sql: the COMMIT waits for the
// standbys all the same, but a wait cut short by another party's cancel
// is not seen.
func (b *Backend) readSavedTx(ctx context.Context, db *gorm.DB, targetID string) (backend.Saved, bool, error) {
	var s backend.Saved
	found := false
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		found, err = backend.QueryRow(ctx, tx, b.readSavedSQL, []any{targetID}, &s.Generation, &s.Token, &s.Released)
		return err
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", backend.ErrReplicationCancelled, ctx.Err())
	}
	return s, found, err
}
