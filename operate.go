package gormlease

import (
	"context"
	"strconv"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/wait"
)

// Operating a target: an operator pauses it, resumes it, or asks its
// holder to stop. Each is recorded in the target's row (and its slots'),
// where every acquire and every heartbeat already looks: a pause is decided
// by the acquire's own statements, and a stop request travels back on the
// holder's heartbeat (see docs/design.md).

// maxReasonLength is the longest reason of a pause or a stop request, in
// bytes: the columns hold 255.
const maxReasonLength = 255

// operatedKeys are the keys of the rows that an operator's action on
// targetID changes: the target's own and those of its slots.
func operatedKeys(targetID string) []string {
	return append([]string{targetID}, backend.SlotKeys(targetID, MaxSlots)...)
}

// checkReason returns an error wrapping ErrInvalidArgument when reason
// cannot be stored: "" is accepted.
func checkReason(step, targetID, reason string) error {
	if reason == "" {
		return nil
	}
	if problem := checkText(reason, maxReasonLength); problem != "" {
		return invalidf("%s %q: reason %q %s", step, targetID, truncateUTF8(reason, 40), problem)
	}
	return nil
}

// Pause stops new acquisitions of targetID until Resume. Run and Acquire are refused at once
// with an error wrapping ErrPaused; RunWait, Do and Elector.Lead wait, holding no connection,
// until the target is resumed or their context ends. A lease held when Pause is called runs to
// its end (RequestStop stops it too). The reason, and when, are recorded in the row; pausing a
// target that has no row creates it. Pausing a paused target updates its reason.
//
// With WithSlots, pausing the target pauses every slot: Pause marks the
// target's row and those of its slots, in one transaction, which a first
// acquire making the slot rows at the same moment waits for, or makes
// Pause wait: the rows it makes are paused either way. The reason is at
// most 255 bytes of valid UTF-8 without NUL ("" is allowed). A paused row is
// never pruned (Prune), and ForceRelease leaves the pause in place.
func (r *Repository) Pause(ctx context.Context, targetID, reason string) error {
	if err := checkTargetID(targetID); err != nil {
		return err
	}
	if err := checkReason("pause", targetID, reason); err != nil {
		return err
	}
	keys := operatedKeys(targetID)
	err := r.retry(ctx, func(ctx context.Context) error {
		return r.backend.Pause(ctx, r.db, keys, reason)
	})
	if err != nil {
		return wrapf(err, "pause %q", targetID)
	}
	return nil
}

// Resume lets targetID be acquired again, and wakes those that wait for it.
//
// It clears the pause of the target's row and of its slots' rows in one
// statement, which on PostgreSQL notifies the waiters of other processes as
// a release does; those of this process are woken at once, and the others
// within their poll. Resuming a target that is not paused is not an error;
// the rows are written all the same, so that a nil return means the resume
// is as durable as any write, also when an earlier Resume's answer was lost.
func (r *Repository) Resume(ctx context.Context, targetID string) error {
	if err := checkTargetID(targetID); err != nil {
		return err
	}
	keys := operatedKeys(targetID)
	err := r.retry(ctx, func(ctx context.Context) error {
		_, err := r.backend.Resume(ctx, r.db, keys)
		return err
	})
	if err != nil {
		return wrapf(err, "resume %q", targetID)
	}
	for _, key := range keys {
		wait.Wake(r.waitKey, key)
	}
	return nil
}

// RequestStop asks the current holder of targetID to stop. Its next heartbeat finds the
// request: the work's context is cancelled with a cause wrapping ErrStopRequested, nothing is
// saved, and the lease is released, so that a waiting RunWait, Do or standby Elector can take
// over (Pause first to keep anyone from starting again). For an Elector, the term ends. The
// request applies to the lease that was live when it was made, never to a later one.
// RequestStop returns the error ForceRelease returns when no lease is held (ErrNoLiveLease):
// when every row of the target is released. An expired lease, whose holder may be gone, is
// asked all the same; a holder that comes back stops at its next heartbeat.
//
// The request is recorded in the row, with the generation of the lease it
// applies to (JobLease.StopGeneration) and its reason, in one statement; it
// reaches the holder on the heartbeat that the holder sends anyway, so the
// holder stops within one heartbeat interval (WithHeartbeatInterval). With
// WithSlots it asks every slot's holder to stop (RequestStopSlot asks one).
// A holder that is not a Runner (Repository.Acquire and Heartbeat) is not
// stopped: it sees the request only by reading its row (Get).
func (r *Repository) RequestStop(ctx context.Context, targetID, reason string) error {
	if err := checkTargetID(targetID); err != nil {
		return err
	}
	return r.requestStop(ctx, targetID, "stop %q", reason, operatedKeys(targetID))
}

// RequestStopSlot is RequestStop for the holder of one slot of targetID, a
// semaphore (WithSlots): slot is from 1 to MaxSlots. It returns an error
// wrapping ErrNoLiveLease when that slot has no lease that is not released.
func (r *Repository) RequestStopSlot(ctx context.Context, targetID string, slot int, reason string) error {
	if err := checkTargetID(targetID); err != nil {
		return err
	}
	if slot < 1 || slot > MaxSlots {
		return invalidf("stop %q: slot must be between 1 and %d, got %d", targetID, MaxSlots, slot)
	}
	return r.requestStop(ctx, targetID, "stop %q slot "+strconv.Itoa(slot), reason, []string{backend.SlotKey(targetID, slot)})
}

// requestStop records a request to stop the leases of keys, step naming
// it (with targetID) in its errors.
func (r *Repository) requestStop(ctx context.Context, targetID, step, reason string, keys []string) error {
	if err := checkReason("stop", targetID, reason); err != nil {
		return err
	}
	var n int64
	err := r.retry(ctx, func(ctx context.Context) (err error) {
		n, err = r.backend.RequestStop(ctx, r.db, keys, reason)
		return err
	})
	switch {
	case err != nil:
		return wrapf(err, step, targetID)
	case n == 0:
		return wrapf(ErrNoLiveLease, step, targetID)
	}
	return nil
}
