package gormlease

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gormlease/gormlease/internal/backend"
)

// The fenced commit, one implementation for CommitIfOwner and for Run's
// save-and-release (CommitAndRelease), on every pool type:
//
//  1. Begin a transaction and lock the lease row, checking that it still
//     carries the caller's token. Through gorm's transaction, CommitIfOwner
//     locks it with a locking read through the JobLease model (SELECT ...
//     FOR UPDATE; on SQLite, the transaction's write lock), and
//     CommitAndRelease with the statement that records the save and
//     releases the lease, which locks and checks in one. Where the backend
//     can (PostgreSQL, on a plain database/sql pool), BEGIN and the
//     statement that records the save (CommitIfOwner) or records it and
//     releases (CommitAndRelease) go in one query on a connection of the
//     fence's own, and the COMMIT, on that connection, is read with its
//     notices (see backend.Backend.CommitOn). While the database cannot be
//     reached (a failover, a restart), this first step is tried again, on
//     another connection, until the context ends: nothing has run yet.
//  2. Run the saver on the transaction; its error rolls everything back.
//  3. Through gorm's transaction, CommitIfOwner records the save in the
//     row; then COMMIT. A COMMIT that got no answer, or that the server
//     answered by ending the connection, is ErrCommitUnknown, and so is one
//     that the server committed without the confirmation of the
//     synchronous standbys it waits for (backend.ErrReplicationCancelled):
//     after a failover that left the old primary running, it is there
//     alone.
//
// The backend may then ask for the whole commit to run again (a Galera
// certification failure while the lease was still the caller's). A
// transaction that the server ended before its COMMIT (a shutdown, a
// failover, a broken connection: *endedError) saved nothing, and
// Runner.Run may run the commit again too, while the lease is still its
// own; nothing else retries it.

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

// session returns a new session of db on pool, with ctx.
func session(ctx context.Context, db *gorm.DB, pool gorm.ConnPool) *gorm.DB {
	// A Context makes Session copy the Statement, whose pool is set next;
	// without one, the copy would share db's.
	s := db.Session(&gorm.Session{NewDB: true, Context: ctx})
	s.Statement.ConnPool = pool
	return s
}

// fencedTx is the fenced commit's open transaction.
type fencedTx struct {
	// pool runs the transaction's statements.
	pool gorm.ConnPool
	// commit sends COMMIT; rollback ends the transaction without saving.
	commit   func(ctx context.Context) error
	rollback func(ctx context.Context)
	// recorded is set when the statement that locked the row also
	// recorded the save.
	recorded bool
}

// endedError is an error of a fenced commit whose transaction the server
// ended, or lost, before its COMMIT was sent: nothing was saved, and the
// lease may still be the caller's.
type endedError struct{ err error }

func (e *endedError) Error() string { return e.err.Error() }
func (e *endedError) Unwrap() error { return e.err }

// endedBeforeCommit reports whether err, from a fenced commit, says that
// the transaction ended before its COMMIT, without saving anything.
func endedBeforeCommit(err error) bool {
	var e *endedError
	return errors.As(err, &e)
}

// errLockedNothing is the lock's error when no row held the lease.
var errLockedNothing = fmt.Errorf("%w: %w", ErrLeaseLost, backend.ErrNotOwned)

// commit is the fenced commit of l: fn under the fence, and with release
// the lease's release in the same transaction.
func (r *Repository) commit(ctx context.Context, l Lease, fn func(tx *gorm.DB) error, release bool) error {
	if err := l.check(); err != nil {
		return err
	}
	if fn == nil {
		return invalidf("commit function is nil")
	}
	ctx = withLease(ctx, l, r.tables)
	for attempt := 1; ; attempt++ {
		err := r.commitOnce(ctx, l, fn, release)
		if err == nil {
			return nil
		}
		switch again, lost := r.backend.RetryCommit(ctx, r.db, l.row(), err, attempt); {
		case lost:
			return wrapf(fmt.Errorf("%w: another write on the lease row came first (%w)", ErrLeaseLost, unwrapStep(err)),
				"commit %q", l.TargetID)
		case !again:
			return err
		}
	}
}

// commitOnce is one attempt of the fenced commit, in one transaction.
func (r *Repository) commitOnce(ctx context.Context, l Lease, fn func(tx *gorm.DB) error, release bool) error {
	tx, err := r.beginFenced(ctx, l, release)
	if err != nil {
		return err
	}
	ended := false
	defer func() {
		if !ended {
			tx.rollback(ctx)
		}
	}()
	if err := fn(session(ctx, r.db, &saverPool{tx.pool})); err != nil {
		err = saveFailed(l, err)
		if backend.Unreachable(err) && r.txGone(ctx, tx) {
			// The saver's statement failed because the transaction is
			// gone with its connection or its server.
			return &endedError{err}
		}
		return err
	}
	if !release && !tx.recorded {
		switch n, err := r.backend.UpdateOwn(ctx, session(ctx, r.db, tx.pool), backend.Save, l.row()); {
		case err != nil && backend.Unreachable(err):
			return &endedError{wrapf(err, "commit %q: record the save", l.TargetID)}
		case err != nil:
			return wrapf(err, "commit %q: record the save", l.TargetID)
		case n != 1:
			return wrapf(errLockedNothing, "commit %q", l.TargetID) // the row is locked: not reached
		}
	}
	ended = true
	err = tx.commit(ctx)
	if err == nil && ctx.Err() != nil {
		// The context ended while COMMIT waited. A driver that cancels the
		// statement on the server then (lib/pq does) reports success for a
		// COMMIT whose wait for the synchronous standbys the cancel cut
		// short: committed locally, but maybe on this server only.
		err = fmt.Errorf("%w: %w", backend.ErrReplicationCancelled, context.Cause(ctx))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, backend.ErrReplicationCancelled), backend.Unreachable(err):
		// COMMIT was sent, or about to be, and no answer came back, or the
		// server ended the connection in its place (which a shutdown does
		// also after committing); or it committed without the standbys'
		// confirmation, which a failover may throw away: Run settles it by
		// a read the standbys confirm.
		return &commitUnknownError{targetID: l.TargetID, cause: err}
	case backend.SQLState(err) == "25P02":
		return wrapf(err, "save %q: a statement of the saver failed and aborted the transaction, nothing saved", l.TargetID)
	}
	return wrapf(err, "commit %q", l.TargetID)
}

// beginFenced begins the fenced transaction and locks l's row, trying again
// while the database cannot be reached, until ctx ends. It returns an error
// wrapping ErrLeaseLost, having rolled back, when no row held l, and an
// *endedError when the database could not be reached before ctx ended.
func (r *Repository) beginFenced(ctx context.Context, l Lease, release bool) (*fencedTx, error) {
	wait := backend.ReconnectBackoff()
	for {
		tx, err := r.beginOnce(ctx, l, release)
		switch {
		case err == nil || errors.Is(err, ErrLeaseLost) || !backend.Unreachable(err):
			return tx, err
		case !wait.Wait(ctx):
			return nil, &endedError{err}
		}
	}
}

// txGone reports whether tx can no longer run statements because its
// connection, or its server, is gone: a statement on it fails as one that
// could not reach the database. A transaction that a failed statement only
// aborted still answers.
func (r *Repository) txGone(ctx context.Context, tx *fencedTx) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), acquireCleanupTimeout)
	defer cancel()
	_, _, err := backend.Exec(ctx, session(ctx, r.db, tx.pool), "SELECT 1")
	return err != nil && backend.Unreachable(err)
}

// beginOnce is one attempt of beginFenced.
func (r *Repository) beginOnce(ctx context.Context, l Lease, release bool) (*fencedTx, error) {
	if r.backend.Capabilities().OneTripBegin && !r.oneTripRefused.Load() {
		if sqlDB, ok := r.db.Statement.ConnPool.(*sql.DB); ok {
			op := backend.Save
			if release {
				op = backend.SaveRelease
			}
			tx, handled, err := r.beginOneTrip(ctx, sqlDB, l, op)
			if handled {
				return tx, err
			}
		}
	}
	g := r.db.WithContext(ctx).Begin(r.backend.TxOptions())
	if g.Error != nil {
		return nil, wrapf(g.Error, "commit %q: begin", l.TargetID)
	}
	tx := &fencedTx{
		pool:     g.Statement.ConnPool,
		commit:   func(context.Context) error { return g.Commit().Error },
		rollback: func(context.Context) { g.Rollback() },
	}
	held, err := r.lock(ctx, g, l, release)
	if err == nil && !held {
		err = wrapf(errLockedNothing, "commit %q", l.TargetID)
	}
	if err != nil {
		tx.rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// lock locks l's row in tx and reports whether it holds l.
func (r *Repository) lock(ctx context.Context, tx *gorm.DB, l Lease, release bool) (bool, error) {
	if release {
		n, err := r.backend.UpdateOwn(ctx, tx, backend.SaveRelease, l.row())
		if err != nil {
			return false, wrapf(err, "commit %q: lock lease row", l.TargetID)
		}
		return n == 1, nil
	}
	var rows []JobLease
	err := tx.Table(r.tables.lease).Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).
		Where("target_id = ?", l.row().TargetID).Limit(1).Find(&rows).Error
	if err != nil {
		return false, wrapf(err, "commit %q: lock lease row", l.TargetID)
	}
	return len(rows) == 1 && rows[0].LeaseToken == l.Token && rows[0].ReleasedAt == nil, nil
}

// beginOneTrip begins the fenced transaction on a connection of sqlDB and
// runs op (Save or SaveRelease), which locks the row and records the save,
// in the same query (see backend.Capabilities.OneTripBegin). It reports
// handled false, having run nothing, when the driver cannot send the two
// statements as one query; then r's commits go through gorm's transaction
// from then on.
func (r *Repository) beginOneTrip(ctx context.Context, sqlDB *sql.DB, l Lease, op backend.Own) (*fencedTx, bool, error) {
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, true, wrapf(err, "commit %q", l.TargetID)
	}
	_, n, err := backend.ExecOn(ctx, r.db, conn, r.backend.BeginLocked(op, l.row()))
	if err != nil {
		if r.backend.RefusesQueries(err) {
			_ = conn.Close()
			r.oneTripRefused.Store(true)
			return nil, false, nil
		}
		// BEGIN may have run: close the connection, which rolls it back,
		// rather than return it to the pool inside the transaction.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
		return nil, true, wrapf(err, "commit %q: lock lease row", l.TargetID)
	}
	tx := &fencedTx{pool: conn, recorded: true}
	inTx := true
	closeConn := func() {
		if inTx {
			// The transaction may still be open: close the connection,
			// which rolls it back, rather than return it to the pool inside
			// it.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}
	tx.rollback = func(ctx context.Context) {
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err == nil {
			inTx = false
		}
		closeConn()
	}
	// The SELECT fails when the transaction is aborted (a statement of the
	// saver failed, and the saver returned nil all the same), so that the
	// COMMIT does not run: a COMMIT would end it as a rollback without an
	// error.
	tx.commit = func(ctx context.Context) error {
		err := r.backend.CommitOn(ctx, r.db, conn, "SELECT 1; COMMIT")
		if err == nil || !backend.AnsweredByServer(err) {
			inTx = err != nil
			closeConn()
			return err
		}
		tx.rollback(ctx)
		return err
	}
	if n != 1 {
		tx.rollback(ctx)
		return nil, true, wrapf(errLockedNothing, "commit %q", l.TargetID)
	}
	return tx, true, nil
}
