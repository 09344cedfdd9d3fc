package admin

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/ops"
)

// forcedReleaseFailure is the failure that ForceRelease records in the
// lease row, without an operator's name (As): what callers of Runner.Do
// that waited for the job read in their SharedJobError.
const forcedReleaseFailure = "released by force by an operator"

// maxFailureLength is the most bytes that the failure column holds.
const maxFailureLength = 255

// forcedFailure is the failure that ForceRelease records for the
// operator named by ("" for none).
func forcedFailure(by string) string {
	if by == "" {
		return forcedReleaseFailure
	}
	return ops.TruncateUTF8("released by force by operator "+by, maxFailureLength)
}

// ForceRelease ends the lease on targetID, whoever holds it, live or
// expired: for a holder known to be gone, whose lease should not wait out
// its timeout. It is fenced as a takeover is: the row gets a fresh token
// that no one holds, the next generation, its release time and the failure
// "released by force by an operator", or "released by force by operator
// NAME" from an Operator made by As (the Message of the
// *gormlease.SharedJobError that callers of Runner.Do waiting for the job
// get), so that the holder's later heartbeat, fenced commit and release
// fail with gormlease.ErrLeaseLost. The row records "forced" as its
// EndCause and the operator as its EndedBy. The row is kept, and a pause stays. On
// a semaphore (WithSlots) it ends every slot's lease that is not released,
// in the same statement. It returns the row as it left it (the target's
// own, or else the lowest slot's it ended, whose TargetID is that row's
// LeaseInfo.Key), or an error wrapping gormlease.ErrNoLiveLease when there
// was no lease to end.
func (o *Operator) ForceRelease(ctx context.Context, targetID string) (gormlease.JobLease, error) {
	r, err := o.parts()
	if err != nil {
		return gormlease.JobLease{}, err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return gormlease.JobLease{}, err
	}
	rows, err := forceRelease(ctx, r, o.name, fmt.Sprintf("force release %q", targetID), operatedKeys(targetID))
	if err != nil {
		return gormlease.JobLease{}, err
	}
	first := rows[0]
	for _, row := range rows[1:] {
		if slotOf(row) < slotOf(first) {
			first = row
		}
	}
	return gormlease.JobLease(first), nil
}

// ForceReleaseSlot is ForceRelease for the lease of one slot of targetID,
// a semaphore (WithSlots): slot is from 1 to gormlease.MaxSlots. The other
// slots' holders keep their leases. It returns the slot's row as it left
// it, whose TargetID is that row's key (LeaseInfo.Key), or an error
// wrapping gormlease.ErrNoLiveLease when the slot had no lease to end: no
// row, or one released.
func (o *Operator) ForceReleaseSlot(ctx context.Context, targetID string, slot int) (gormlease.JobLease, error) {
	r, err := o.parts()
	if err != nil {
		return gormlease.JobLease{}, err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return gormlease.JobLease{}, err
	}
	if err := checkSlot("force release", targetID, slot); err != nil {
		return gormlease.JobLease{}, err
	}
	rows, err := forceRelease(ctx, r, o.name, fmt.Sprintf("force release %q slot %d", targetID, slot),
		[]string{backend.SlotKey(targetID, slot)})
	if err != nil {
		return gormlease.JobLease{}, err
	}
	return gormlease.JobLease(rows[0]), nil
}

// forceRelease ends the leases of the rows of keys that are not released,
// under one fresh token, and returns the rows it ended: at least one, or
// an error wrapping ErrNoLiveLease, by the operator by ("" for none). step
// names the operation in its errors. The statement is tried again, with
// the same token, only after a serialization failure, which rolled it
// back.
func forceRelease(ctx context.Context, r ops.Repository, by, step string, keys []string) ([]backend.Row, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, ops.Wrapf(err, "%s: mint token", step)
	}
	var rows []backend.Row
	err = r.Retry(ctx, func(ctx context.Context) (err error) {
		rows, err = r.Backend.ForceRelease(ctx, r.DB, keys, token, forcedFailure(by), by)
		return err
	})
	switch {
	case err != nil:
		return nil, ops.Wrapf(err, "%s", step)
	case len(rows) == 0:
		return nil, ops.Wrapf(gormlease.ErrNoLiveLease, "%s", step)
	}
	return rows, nil
}

// slotOf is the slot of row, 0 for a target's own row.
func slotOf(row backend.Row) int {
	_, slot, _ := backend.ParseSlotKey(row.TargetID)
	return slot
}
