package admin

import (
	"context"
	"strconv"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/ops"
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
	return append([]string{targetID}, backend.SlotKeys(targetID, gormlease.MaxSlots)...)
}

// checkReason returns an error wrapping gormlease.ErrInvalidArgument when
// reason cannot be stored: "" is accepted.
func checkReason(step, targetID, reason string) error {
	if reason == "" {
		return nil
	}
	if problem := ops.CheckText(reason, maxReasonLength); problem != "" {
		return ops.Invalidf("%s %q: reason %q %s", step, targetID, ops.TruncateUTF8(reason, 40), problem)
	}
	return nil
}

// checkSlot returns an error wrapping gormlease.ErrInvalidArgument, from
// step on targetID, when slot is not a slot of a semaphore.
func checkSlot(step, targetID string, slot int) error {
	if slot < 1 || slot > gormlease.MaxSlots {
		return ops.Invalidf("%s %q: slot must be between 1 and %d, got %d", step, targetID, gormlease.MaxSlots, slot)
	}
	return nil
}

// Pause stops new acquisitions of targetID, and of its slots (WithSlots),
// until Resume: Run, Acquire and AcquireSlot are refused at once with a
// *gormlease.PausedError, which matches gormlease.ErrPaused; RunWait, Do
// and Elector.Lead wait, holding no connection, until the target is
// resumed or their context ends. A lease held when Pause is called runs to
// its end (RequestStop stops it too). The reason, at most 255 bytes of
// valid UTF-8 without NUL ("" is allowed), the time and the operator (see
// As; none without it) are recorded in the rows; pausing a target that
// has no row creates it, and pausing a paused target updates its reason
// and operator. A paused row is never pruned, and ForceRelease leaves the
// pause in place.
func (o *Operator) Pause(ctx context.Context, targetID, reason string) error {
	r, err := o.parts()
	if err != nil {
		return err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return err
	}
	if err := checkReason("pause", targetID, reason); err != nil {
		return err
	}
	keys := operatedKeys(targetID)
	err = r.Retry(ctx, func(ctx context.Context) error {
		return r.Backend.Pause(ctx, r.DB, keys, reason, o.name)
	})
	if err != nil {
		return ops.Wrapf(err, "pause %q", targetID)
	}
	return nil
}

// Resume lets targetID, and its slots, be acquired again, and wakes those
// that wait for it: at once in this process, and within their poll, or by
// notification on PostgreSQL, in others. It clears the pause's time and
// reason from the rows, and records the operator who resumed (see As) in
// place of the one who paused (the history's resumed event reads it; the
// LeaseInfo of a row not paused shows no PausedBy). Resuming a target that is not
// paused is not an error; the rows are written all the same, so that a nil
// return means the resume is as durable as any write.
func (o *Operator) Resume(ctx context.Context, targetID string) error {
	r, err := o.parts()
	if err != nil {
		return err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return err
	}
	keys := operatedKeys(targetID)
	err = r.Retry(ctx, func(ctx context.Context) error {
		_, err := r.Backend.Resume(ctx, r.DB, keys, o.name)
		return err
	})
	if err != nil {
		return ops.Wrapf(err, "resume %q", targetID)
	}
	for _, key := range keys {
		wait.Wake(r.WaitKey, key)
	}
	return nil
}

// RequestStop asks the current holder of targetID, and of each of its
// slots, to stop. A Runner finds the request at its next heartbeat: its
// work's context is cancelled with a cause wrapping
// gormlease.ErrStopRequested, nothing is saved, and the lease is released,
// so that a waiting RunWait, Do or standby Elector takes over (Pause first
// to keep anyone from starting again). The request applies to the leases
// not released when it is made, expired ones included, never to a later
// one; a holder that is not a Runner sees it only in its row (Get). The
// reason (as Pause's) and the operator (see As; none without it) are
// recorded with the request. It returns an error wrapping
// gormlease.ErrNoLiveLease when every row of the target is released, or
// there is none, when the request is made: nil only when a lease carries
// the request (a lease acquired after it does not).
func (o *Operator) RequestStop(ctx context.Context, targetID, reason string) error {
	r, err := o.parts()
	if err != nil {
		return err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return err
	}
	return requestStop(ctx, r, o.name, targetID, "stop %q", reason, operatedKeys(targetID))
}

// RequestStopSlot is RequestStop for the holder of one slot of targetID, a
// semaphore (WithSlots): slot is from 1 to gormlease.MaxSlots. It returns
// an error wrapping gormlease.ErrNoLiveLease when that slot has no lease
// that is not released.
func (o *Operator) RequestStopSlot(ctx context.Context, targetID string, slot int, reason string) error {
	r, err := o.parts()
	if err != nil {
		return err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return err
	}
	if err := checkSlot("stop", targetID, slot); err != nil {
		return err
	}
	return requestStop(ctx, r, o.name, targetID, "stop %q slot "+strconv.Itoa(slot), reason, []string{backend.SlotKey(targetID, slot)})
}

// requestStop records a request to stop the leases of keys, by the
// operator by ("" for none), step naming it (with targetID) in its errors.
func requestStop(ctx context.Context, r ops.Repository, by, targetID, step, reason string, keys []string) error {
	if err := checkReason("stop", targetID, reason); err != nil {
		return err
	}
	var n int64
	err := r.Retry(ctx, func(ctx context.Context) (err error) {
		n, err = r.Backend.RequestStop(ctx, r.DB, keys, reason, by)
		return err
	})
	switch {
	case err != nil:
		return ops.Wrapf(err, step, targetID)
	case n == 0:
		return ops.Wrapf(gormlease.ErrNoLiveLease, step, targetID)
	}
	return nil
}
