package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The fenced commit, one implementation for CommitIfOwner and for Run's
// save-and-release (Fence.Release), on every pool type, behind one method
// of the seam (Backend.CommitFenced):
//
//  1. Begin a transaction and lock the lease row, checking that it still
//     carries the caller's token. Without Release, with a locking read
//     through a model of the lease row (gorm's clause.Locking{Strength:
//     "UPDATE"}: SELECT ... FOR UPDATE; on SQLite, the transaction's write
//     lock), on every pool; with Release, with the statement that records
//     the save and releases the lease, which locks and checks in one. A
//     backend may begin the transaction in a way of its own (PostgreSQL's
//     one-round-trip transport, which reads the COMMIT with its notices);
//     otherwise it is begun through gorm. While the database cannot be
//     reached (a failover, a restart), this first step is tried again, on
//     another connection, until the context ends: nothing has run yet.
//  2. Run the saver on the transaction; its error rolls everything back.
//     So does the context's end before COMMIT (the saver ran past a Run's
//     operation timeout), which is an *EndedError wrapping the context's
//     cause.
//  3. Without Release, record the save in the row; then COMMIT. A COMMIT
//     that got no answer, or that the server answered by ending the
//     connection, is a *CommitUnknownError, and so is one that the server
//     committed without the confirmation of the synchronous standbys it
//     waits for (ErrReplicationCancelled): after a failover that left the
//     old primary running, it is there alone.

// Fence is one fenced commit: the lease it is fenced by, and the caller's
// writes.
type Fence struct {
	// Lease is the caller's lease: the row must still carry its token,
	// unreleased.
	Lease Lease
	// Release makes the commit also release the lease: the statement that
	// records the save and releases it locks the row (SaveRelease).
	// Without it, a locking read locks the row and the save is recorded
	// after Save (Save).
	Release bool
	// Save runs the caller's writes on tx, the transaction's session,
	// which refuses to be committed or rolled back.
	Save func(tx *gorm.DB) error
	// Attempts is how often the transaction's beginning and lock are tried
	// in all while they fail with a deadlock or serialization failure; 0
	// means StatementAttempts.
	Attempts int
}

// OwnFunc runs op on l's own row, as Backend.UpdateOwn does: a wrapping
// backend passes its own to Common.FenceWith.
type OwnFunc func(ctx context.Context, db *gorm.DB, op Own, l Lease, args ...any) (int64, error)

// BeginFunc begins a fenced transaction in a backend's own way and locks
// the row, with Common.LockRead for a fence without Release. It reports
// handled false, having run nothing, when it cannot (another driver, a
// pool of the caller's): the transaction is then begun through gorm. It
// returns ErrNotOwned, having rolled back, when no row holds the lease.
type BeginFunc func(ctx context.Context, db *gorm.DB, f Fence) (tx *FencedTx, handled bool, err error)

// FencedTx is a fenced commit's open transaction, with the row locked.
type FencedTx struct {
	// Pool runs the transaction's statements.
	Pool gorm.ConnPool
	// Commit sends COMMIT; Rollback ends the transaction without saving.
	Commit   func(ctx context.Context) error
	Rollback func(ctx context.Context)
	// Recorded is set when the statement that locked the row also recorded
	// the save.
	Recorded bool
}

// EndedError is the error of a fenced commit whose transaction the server
// ended, or lost, before its COMMIT was sent, or whose context ended
// before: nothing was saved, and the lease may still be the caller's.
// Since is when the commit first met the failure: a Run's reconnect
// window counts from then.
type EndedError struct {
	Err   error
	Since time.Time
}

func (e *EndedError) Error() string { return e.Err.Error() }
func (e *EndedError) Unwrap() error { return e.Err }

// CommitUnknownError is the error of a fenced commit whose COMMIT was
// sent, or about to be, and got no answer, or whose server ended the
// connection in its place, or committed without the confirmation of its
// synchronous standbys: the writes may or may not be saved. Err is the
// cause.
type CommitUnknownError struct{ Err error }

func (e *CommitUnknownError) Error() string { return "outcome unknown: " + e.Err.Error() }
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// SaverError is the error that a fence's Save returned, when the
// transaction rolled back for it: nothing was saved.
type SaverError struct{ Err error }

func (e *SaverError) Error() string { return e.Err.Error() }
func (e *SaverError) Unwrap() error { return e.Err }

// errSaverEnds is returned to a saver that tries to end the fenced
// transaction itself.
var errSaverEnds = errors.New("gormlease: the fenced commit ends its transaction itself; the saver must not commit or roll back")

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

// Session returns a new session of db on pool, with ctx.
func Session(ctx context.Context, db *gorm.DB, pool gorm.ConnPool) *gorm.DB {
	// A Context makes Session copy the Statement, whose pool is set next;
	// without one, the copy would share db's.
	s := db.Session(&gorm.Session{NewDB: true, Context: ctx})
	s.Statement.ConnPool = pool
	return s
}

// txCheckTimeout bounds the statement by which a fenced commit whose
// saver failed finds out whether its transaction is gone.
const txCheckTimeout = 10 * time.Second

// CommitFenced runs f through gorm's transaction.
func (c *Common) CommitFenced(ctx context.Context, db *gorm.DB, f Fence) error {
	return c.FenceWith(ctx, db, f, c.UpdateOwn, nil)
}

// FenceWith runs one attempt of the fenced commit f, with own running the
// statements on the caller's row (a wrapping backend's UpdateOwn), and
// begin, when not nil, beginning the transaction in the backend's own way
// (see BeginFunc). It returns, having saved nothing: ErrNotOwned when no
// row held the lease; an *EndedError when the transaction could not begin
// before ctx ended, ended before its COMMIT, or ctx ended before it; a
// *SaverError when f.Save failed. A *CommitUnknownError says that the
// COMMIT's outcome is unknown.
func (c *Common) FenceWith(ctx context.Context, db *gorm.DB, f Fence, own OwnFunc, begin BeginFunc) error {
	tx, err := c.beginFenced(ctx, db, f, own, begin)
	if err != nil {
		return err
	}
	ended := false
	defer func() {
		if !ended {
			tx.Rollback(ctx)
		}
	}()
	if err := f.Save(Session(ctx, db, &saverPool{tx.Pool})); err != nil || ctx.Err() != nil {
		return saverEnded(ctx, db, tx, err)
	}
	if !f.Release && !tx.Recorded {
		switch n, err := own(ctx, Session(ctx, db, tx.Pool), Save, f.Lease); {
		case err != nil && Unreachable(err) && txGone(ctx, db, tx):
			return &EndedError{fmt.Errorf("record the save: %w", err), time.Now()}
		case err != nil:
			return fmt.Errorf("record the save: %w", err)
		case n != 1:
			return ErrNotOwned // the row is locked: not reached
		}
	}
	ended = true
	err = tx.Commit(ctx)
	if err == nil && ctx.Err() != nil {
		// The context ended while COMMIT waited. A driver that cancels the
		// statement on the server then (lib/pq does) reports success for a
		// COMMIT whose wait for the synchronous standbys the cancel cut
		// short: committed locally, but maybe on this server only.
		err = fmt.Errorf("%w: %w", ErrReplicationCancelled, context.Cause(ctx))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrReplicationCancelled), !AnsweredByServer(err), Unreachable(err):
		// COMMIT was sent, or about to be, and no answer came back (any
		// error that the server did not send, whether or not waiting cures
		// it), or the server ended the connection in its place (which a
		// shutdown does also after committing); or it committed without the
		// standbys' confirmation, which a failover may throw away.
		return &CommitUnknownError{err}
	case SQLState(err) == "25P02":
		return &SaverError{fmt.Errorf("a statement of the saver failed and aborted the transaction, nothing saved: %w", err)}
	}
	return err
}

// beginFenced begins the fenced transaction and locks f's row, trying
// again while the database cannot be reached, until ctx ends. A deadlock or
// serialization failure of the lock (InnoDB's deadlock detection, when
// concurrent acquires of a target's slots lock their rows in another
// order) is tried again too, up to f.Attempts times in all: the
// server rolled the transaction back before the saver ran, so nothing was
// done. It returns ErrNotOwned, having rolled back, when no row held the
// lease, and an *EndedError when the database could not be reached before
// ctx ended.
func (c *Common) beginFenced(ctx context.Context, db *gorm.DB, f Fence, own OwnFunc, begin BeginFunc) (*FencedTx, error) {
	wait, conflict := ReconnectBackoff(), StatementBackoff()
	conflicts, attempts := 0, f.Attempts
	if attempts <= 0 {
		attempts = StatementAttempts
	}
	var since time.Time // the first attempt that could not reach the database
	for {
		tx, err := c.beginOnce(MarkRetried(ctx), db, f, own, begin)
		if err != nil && IsSerializationFailure(err) {
			if conflicts++; conflicts < attempts && conflict.Wait(ctx) {
				continue
			}
			return nil, err
		}
		switch {
		case err == nil || errors.Is(err, ErrNotOwned) || !Unreachable(err):
			return tx, err
		case since.IsZero():
			since = time.Now()
		}
		if !wait.Wait(ctx) {
			return nil, &EndedError{err, since}
		}
	}
}

// beginOnce is one attempt of beginFenced.
func (c *Common) beginOnce(ctx context.Context, db *gorm.DB, f Fence, own OwnFunc, begin BeginFunc) (*FencedTx, error) {
	if begin != nil {
		if tx, handled, err := begin(ctx, db, f); handled {
			return tx, err
		}
	}
	g := db.WithContext(ctx).Begin(c.d.TxOptions)
	if g.Error != nil {
		return nil, fmt.Errorf("begin: %w", g.Error)
	}
	tx := &FencedTx{
		Pool:     g.Statement.ConnPool,
		Commit:   func(context.Context) error { return g.Commit().Error },
		Rollback: func(context.Context) { g.Rollback() },
		Recorded: f.Release,
	}
	var held bool
	var err error
	if f.Release {
		var n int64
		n, err = own(ctx, g, SaveRelease, f.Lease)
		held = n == 1
	} else {
		held, err = c.LockRead(ctx, g, f.Lease)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("lock lease row: %w", err)
	case !held:
		err = ErrNotOwned
	}
	if err != nil {
		tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// lockedRow is the lease row as the fenced commit's locking read reads
// it: a model of the columns that say who holds the lease. The columns
// are named, as in the public JobLease, so that the caller's naming
// strategy does not rename them.
type lockedRow struct {
	LeaseToken uuid.UUID  `gorm:"column:lease_token"`
	ReleasedAt *time.Time `gorm:"column:released_at"`
}

// LockRead locks l's row in tx with a locking read through a model of
// the row, which gorm builds with clause.Locking{Strength: "UPDATE"}
// (SELECT * ... FOR UPDATE; on SQLite, which has no such clause, the
// transaction holds the database's write lock), and reports whether the
// row holds l: its token, unreleased.
func (c *Common) LockRead(ctx context.Context, tx *gorm.DB, l Lease) (bool, error) {
	var rows []lockedRow
	err := Quiet(tx.WithContext(ctx)).Table(c.tables.Lease).Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).
		Where("target_id = ?", l.TargetID).Limit(1).Find(&rows).Error
	if err != nil {
		return false, MissingTablesIn(err, c.tables.Lease)
	}
	return len(rows) == 1 && rows[0].LeaseToken == l.Token && rows[0].ReleasedAt == nil, nil
}

// saverEnded is the fenced commit's error when the saver failed with err,
// or when ctx ended before COMMIT (err is nil then): the transaction is
// not committed. When ctx has ended (a Run's operation timeout, or the
// caller's cancellation), the saver ran past it: its statements failed
// from then on, or database/sql rolled its transaction back with the
// context. That is an *EndedError, wrapping ctx's cause, as is a statement
// that failed because the transaction's connection, or its server, is
// gone: a statement cut by the timeout cannot be told from one that waited
// on a server that went away, and nothing was saved either way. Any other
// error is the saver's.
func saverEnded(ctx context.Context, db *gorm.DB, tx *FencedTx, err error) error {
	if ctx.Err() != nil {
		ended := fmt.Errorf("nothing saved: %w", context.Cause(ctx))
		if err != nil {
			ended = fmt.Errorf("%w; the saver got: %w", ended, err)
		}
		return &EndedError{ended, time.Now()}
	}
	if Unreachable(err) && txGone(ctx, db, tx) {
		// The saver's statement failed because the transaction is gone with
		// its connection or its server.
		return &EndedError{&SaverError{err}, time.Now()}
	}
	return &SaverError{err}
}

// txGone reports whether tx can no longer run statements because its
// connection, or its server, is gone: a statement on it fails as one that
// could not reach the database. A transaction that a failed statement only
// aborted still answers.
func txGone(ctx context.Context, db *gorm.DB, tx *FencedTx) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txCheckTimeout)
	defer cancel()
	_, _, err := Exec(ctx, Session(ctx, db, tx.Pool), "SELECT 1")
	return err != nil && Unreachable(err)
}
