package gormlease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// The fenced commit, one implementation for CommitIfOwner and for Run's
// save-and-release (commitAndRelease), on every pool type. Its transaction,
// from BEGIN and the lock of the row to COMMIT, is the backend's
// (backend.Backend.CommitFenced, described in internal/backend/fence.go):
// the Repository hands it the lease and the saver, and turns its outcome
// into the step's error. The backend may then ask for the whole commit to
// run again (a Galera certification failure while the lease was still the
// caller's). A transaction that the server ended before its COMMIT (a
// shutdown, a failover, a broken connection: *backend.EndedError) saved
// nothing, and Runner.Run may run the commit again too, while the lease is
// still its own; nothing else retries it.

// endedBeforeCommit reports whether err, from a fenced commit, says that
// the transaction ended before its COMMIT, without saving anything.
func endedBeforeCommit(err error) bool {
	var e *backend.EndedError
	return errors.As(err, &e)
}

// failedSince returns when the fenced commit that failed with err first
// met its failure: for a transaction that ended before its COMMIT, when
// that was first seen; for any other error, now.
func failedSince(err error) time.Time {
	var e *backend.EndedError
	if errors.As(err, &e) {
		return e.Since
	}
	return time.Now()
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
	var panicked error // the saver's panic, which ends the commit whatever else failed
	f := backend.Fence{Lease: l.row(), Release: release, Attempts: r.attempts, Save: func(tx *gorm.DB) error {
		err := fn(tx)
		if _, ok := err.(*PanicError); ok {
			panicked = err
		}
		return err
	}}
	for attempt := 1; ; attempt++ {
		panicked = nil
		raw := r.backend.CommitFenced(ctx, r.db, f)
		if raw == nil {
			return nil
		}
		err := fenceError(l, raw, panicked)
		// The backend judges the database's error as it came: a saver's
		// statement that a Galera certification aborted (a deadlock) is
		// the transaction's failure, which fenceError reports as the
		// saver's, and one more attempt may settle it.
		judged := raw
		if panicked != nil {
			judged = err
		}
		switch again, lost := r.backend.RetryCommit(ctx, r.db, l.row(), judged, attempt); {
		case lost:
			return wrapf(fmt.Errorf("%w: another write on the lease row came first (%w)", ErrLeaseLost, unwrapStep(err)),
				"commit %q", l.TargetID)
		case !again:
			return err
		}
	}
}

// fenceError is the step's error for a fenced commit of l that failed
// with err, the backend's; panicked is the saver's panic, if it panicked.
func fenceError(l Lease, err, panicked error) error {
	var (
		unknown *backend.CommitUnknownError
		saver   *backend.SaverError
		ended   *backend.EndedError
	)
	switch {
	case panicked != nil:
		return saveFailed(l, panicked)
	case errors.As(err, &unknown):
		return &commitUnknownError{targetID: l.TargetID, cause: unknown.Err}
	case errors.As(err, &saver):
		if errors.As(err, &ended) {
			// The saver's statement failed because the transaction is gone.
			return &backend.EndedError{Err: saveFailed(l, saver.Err), Since: ended.Since}
		}
		return saveFailed(l, saver.Err)
	case errors.Is(err, backend.ErrNotOwned):
		return wrapf(errLockedNothing, "commit %q", l.TargetID)
	}
	return wrapf(err, "commit %q", l.TargetID)
}
