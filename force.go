package gormlease

import (
	"context"

	"github.com/google/uuid"

	"github.com/gormlease/gormlease/internal/backend"
)

// forcedReleaseFailure is the failure that ForceRelease records in the
// lease row: what callers of Runner.Do that waited for the job read in
// their SharedJobError.
const forcedReleaseFailure = "released by force by an operator"

// ForceRelease ends the lease on targetID, whoever holds it, live or
// expired: for an operator, when a holder is known to be gone and its
// lease should not wait out its timeout. It is fenced, as a takeover is:
// in one statement the row gets a fresh token that no one holds, the next
// generation and its release time, and records the failure "released by
// force by an operator", the Message of the SharedJobError that callers of
// Runner.Do waiting for the job get. The
// holder's later heartbeats, fenced commit and release all fail with
// ErrLeaseLost, and the next acquisition gets a generation above the
// holder's. The row is kept. ForceRelease returns the row as it left it,
// or an error wrapping ErrNotHeld when there was no lease to end. (On a
// MariaDB Galera node, it first checks with a causal read that the node had
// not merely not yet applied the acquire made on another node.)
//
// The holder's work is not stopped at once: it learns of the loss at its
// next heartbeat, or when it tries to save.
func (r *Repository) ForceRelease(ctx context.Context, targetID string) (JobLease, error) {
	if err := checkTargetID(targetID); err != nil {
		return JobLease{}, err
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return JobLease{}, wrapf(err, "force release %q: mint token", targetID)
	}
	var row backend.Row
	var found bool
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		row, found, err = r.backend.ForceRelease(ctx, r.db, targetID, token, forcedReleaseFailure)
		return err
	})
	switch {
	case err != nil:
		return JobLease{}, wrapf(err, "force release %q", targetID)
	case !found:
		return JobLease{}, wrapf(ErrNotHeld, "force release %q", targetID)
	}
	return JobLease(row), nil
}
