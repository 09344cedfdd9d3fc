package gormlease

import (
	"context"
	"fmt"

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
// or an error wrapping ErrNoLiveLease when there was no lease to end. (On a
// MariaDB Galera node, it first makes a causal read, so that the node has
// applied the acquires made on other nodes.)
//
// For a semaphore (WithSlots), ForceRelease ends, in the same statement,
// the lease of every slot that is not released, as RequestStop asks every
// slot's holder to stop (ForceReleaseSlot ends one slot's). It then
// returns the target's own row when that had a lease to end, and
// otherwise the row of the lowest slot it ended, whose TargetID is that
// row's key (LeaseInfo.Key); List with the target as Prefix shows every
// slot. It returns ErrNoLiveLease when neither the target nor any slot
// had a lease to end. A pause stays in place (Resume ends it).
//
// The holder's work is not stopped at once: it learns of the loss at its
// next heartbeat, or when it tries to save.
func (r *Repository) ForceRelease(ctx context.Context, targetID string) (JobLease, error) {
	if err := checkTargetID(targetID); err != nil {
		return JobLease{}, err
	}
	rows, err := r.forceRelease(ctx, fmt.Sprintf("force release %q", targetID), operatedKeys(targetID))
	if err != nil {
		return JobLease{}, err
	}
	first := rows[0]
	for _, row := range rows[1:] {
		if slotOf(row) < slotOf(first) {
			first = row
		}
	}
	return JobLease(first), nil
}

// ForceReleaseSlot is ForceRelease for the lease of one slot of targetID,
// a semaphore (WithSlots): slot is from 1 to MaxSlots. The other slots'
// holders keep their leases. It returns the slot's row as it left it,
// whose TargetID is that row's key (LeaseInfo.Key), or an error wrapping
// ErrNoLiveLease when the slot had no lease to end: no row, or one
// released.
func (r *Repository) ForceReleaseSlot(ctx context.Context, targetID string, slot int) (JobLease, error) {
	if err := checkTargetID(targetID); err != nil {
		return JobLease{}, err
	}
	if slot < 1 || slot > MaxSlots {
		return JobLease{}, invalidf("force release %q: slot must be between 1 and %d, got %d", targetID, MaxSlots, slot)
	}
	rows, err := r.forceRelease(ctx, fmt.Sprintf("force release %q slot %d", targetID, slot),
		[]string{backend.SlotKey(targetID, slot)})
	if err != nil {
		return JobLease{}, err
	}
	return JobLease(rows[0]), nil
}

// forceRelease ends the leases of the rows of keys that are not released,
// under one fresh token, and returns the rows it ended: at least one, or
// an error wrapping ErrNoLiveLease. step names the operation in its
// errors. A retry after an error sends the same token, so that it also
// finds the rows that a run whose outcome was lost ended.
func (r *Repository) forceRelease(ctx context.Context, step string, keys []string) ([]backend.Row, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, wrapf(err, "%s: mint token", step)
	}
	var rows []backend.Row
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		rows, err = r.backend.ForceRelease(ctx, r.db, keys, token, forcedReleaseFailure)
		return err
	})
	switch {
	case err != nil:
		return nil, wrapf(err, "%s", step)
	case len(rows) == 0:
		return nil, wrapf(ErrNoLiveLease, "%s", step)
	}
	return rows, nil
}

// slotOf is the slot of row, 0 for a target's own row.
func slotOf(row backend.Row) int {
	_, slot, _ := backend.ParseSlotKey(row.TargetID)
	return slot
}
