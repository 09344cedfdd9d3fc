package admin

import (
	"context"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/ops"
)

// LeaseState is the state of a lease row, judged on the database's clock.
type LeaseState string

const (
	// StateLive is a lease held and renewed within its timeout: acquiring
	// the target is refused.
	StateLive LeaseState = "live"
	// StateExpired is a lease not released whose last heartbeat is older
	// than its timeout: the next acquire takes it over. A row written
	// before the timeout_ms column existed has no timeout, and counts as
	// expired since its last heartbeat.
	StateExpired LeaseState = "expired"
	// StateReleased is a lease released by its holder, or by force; or
	// one whose holder ended its work and kept the target for a minimum
	// hold (gormlease.WithMinHold, gormlease.Repository.Hold) that has
	// passed since.
	StateReleased LeaseState = "released"
)

const (
	// defaultListLimit is the number of rows that List returns when
	// ListOptions.Limit is 0.
	defaultListLimit = 100
	// maxListLimit is the largest ListOptions.Limit that List accepts.
	maxListLimit = 10000
)

// ListOptions choose the rows that Operator.List returns. The zero value
// lists the first 100 rows of every state.
type ListOptions struct {
	// Prefix keeps the targets whose ID starts with it, byte for byte
	// (no wildcards); "" keeps all.
	Prefix string
	// State keeps the rows in this state; "" keeps all.
	State LeaseState
	// After is the Key of the last row of the previous page: List returns
	// the rows after it, in the order of their keys. "" starts at the
	// first.
	After string
	// Limit is the most rows returned, up to 10,000; 0 means 100.
	Limit int
}

// LeaseInfo is a lease row as List reads it, with what it means: its
// target and slot, and its state and ages on the database's clock.
type LeaseInfo struct {
	// Row is the lease row as it was read. Its TargetID is the row's key
	// (Key), which for the row of a slot is not the target's ID.
	Row gormlease.JobLease
	// TargetID is the target that the row leases, as the caller of Run,
	// Acquire or Get names it; for the row of a slot of a semaphore
	// (WithSlots), the semaphore's target.
	TargetID string
	// Key is the row's primary key: TargetID, or for the row of a slot the
	// target ID, the byte 0x1f and the slot's number, which sorts right
	// after the target's (List with the target as Prefix lists its slots).
	// Give the last row's Key as ListOptions.After to read the next page.
	Key string
	// Slot is the slot of the row's semaphore, from 1; 0 for an ordinary
	// lease row.
	Slot int
	// State is the row's state when it was read.
	State LeaseState
	// Age is the time since Row.UpdatedAt: the acquisition or last
	// heartbeat.
	Age time.Duration
	// Timeout is the lease timeout that the row records: the last
	// acquisition's, or under a minimum hold the rest of the hold that
	// Hold recorded; 0 when the row records none (see
	// gormlease.JobLease.TimeoutMS).
	Timeout time.Duration
	// ExpiresIn is, for a row not released, Timeout - Age: how long the
	// lease lives without another heartbeat, negative once it has expired;
	// under a minimum hold, how long the hold lasts. It is 0 for a released
	// row, including one whose minimum hold has passed.
	ExpiresIn time.Duration
	// MinHold reports that the holder has ended its work and the row is
	// held, unrenewed, for the rest of its minimum hold
	// (gormlease.WithMinHold, gormlease.Repository.Hold): State is
	// StateLive until ExpiresIn, and
	// StateReleased after it, never StateExpired.
	MinHold bool
	// Paused reports that the target is paused (Operator.Pause): no
	// acquisition takes the row until Resume. State still says whether a
	// lease is held: one held when Pause was called runs to its end.
	Paused bool
	// PauseReason is the reason that Pause recorded, or "".
	PauseReason string
	// StopRequested reports that an operator asked the row's current
	// holder to stop (Operator.RequestStop), and the holder has not
	// released the lease yet. (A request made of an earlier generation
	// leaves its reason in Row.StopReason, but does not apply.)
	StopRequested bool
	// StopReason is the reason of the request that StopRequested reports,
	// or "".
	StopReason string
}

// check returns an error wrapping gormlease.ErrInvalidArgument when o
// cannot be used, and o with its defaults filled in.
func (o ListOptions) check() (ListOptions, error) {
	switch o.State {
	case "", StateLive, StateExpired, StateReleased:
	default:
		return o, ops.Invalidf("list: state %q is not one of live, expired, released", o.State)
	}
	switch {
	case o.Limit < 0 || o.Limit > maxListLimit:
		return o, ops.Invalidf("list: limit %d is not between 0 and %d", o.Limit, maxListLimit)
	case o.Limit == 0:
		o.Limit = defaultListLimit
	}
	for _, f := range []struct{ name, value string }{{"prefix", o.Prefix}, {"after", o.After}} {
		if f.value == "" {
			continue
		}
		if problem := ops.CheckText(f.value, ops.MaxTargetIDLength); problem != "" {
			return o, ops.Invalidf("list: %s %q %s", f.name, ops.TruncateUTF8(f.value, 40), problem)
		}
	}
	return o, nil
}

// List returns the lease rows that opts chooses, in the order of their
// keys (LeaseInfo.Key), a page at a time: pass the Key of a page's last
// row as opts.After to get the next, until a page is shorter than the
// limit. Each row's state and ages are read on the database's clock, in
// one statement, and every page costs about the same however large the
// table. It reads the database that the Repository's *gorm.DB was opened
// on, never a replica. Options it cannot honour return an error wrapping
// gormlease.ErrInvalidArgument that names the option.
func (o *Operator) List(ctx context.Context, opts ListOptions) ([]LeaseInfo, error) {
	r, err := o.parts()
	if err != nil {
		return nil, err
	}
	opts, err = opts.check()
	if err != nil {
		return nil, err
	}
	rows, err := r.Backend.List(ctx, r.DB, backend.ListQuery{
		After: opts.After, Prefix: opts.Prefix, State: string(opts.State), Limit: opts.Limit,
	})
	if err != nil {
		return nil, ops.Wrapf(err, "list")
	}
	out := make([]LeaseInfo, len(rows))
	for i, row := range rows {
		out[i] = leaseInfo(row)
	}
	return out, nil
}

// Get returns the lease row of targetID itself (never one of its slots'),
// and false when the target has never been acquired or its row was
// pruned. It is for inspection: the row may change right after. It reads
// the database that the Repository's *gorm.DB was opened on, never a
// replica, as the lease's own statements do.
func (o *Operator) Get(ctx context.Context, targetID string) (gormlease.JobLease, bool, error) {
	r, err := o.parts()
	if err != nil {
		return gormlease.JobLease{}, false, err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return gormlease.JobLease{}, false, err
	}
	row, found, err := r.Backend.Get(ctx, r.DB, targetID)
	if err != nil {
		return gormlease.JobLease{}, false, ops.Wrapf(err, "get %q", targetID)
	}
	return gormlease.JobLease(row), found, nil
}

// leaseInfo returns the row that the backend listed as a LeaseInfo, with
// its state and durations as read.
func leaseInfo(listed backend.Listed) LeaseInfo {
	row := gormlease.JobLease(listed.Row)
	li := LeaseInfo{Row: row, TargetID: row.TargetID, Key: row.TargetID, State: LeaseState(listed.State), Age: listed.Age}
	if target, slot, ok := backend.ParseSlotKey(row.TargetID); ok {
		li.TargetID, li.Slot = target, slot
	}
	if row.TimeoutMS != nil {
		li.Timeout = time.Duration(*row.TimeoutMS) * time.Millisecond
	}
	if li.State != StateReleased && row.ReleasedAt == nil {
		li.ExpiresIn = li.Timeout - li.Age
	}
	held := row.ReleasedAt == nil && row.HoldGeneration != nil && *row.HoldGeneration == row.Generation
	li.MinHold = held && li.State == StateLive
	li.Paused = row.PausedAt != nil
	if row.PauseReason != nil {
		li.PauseReason = *row.PauseReason
	}
	if row.ReleasedAt == nil && row.StopGeneration != nil && *row.StopGeneration == row.Generation {
		li.StopRequested = true
		if row.StopReason != nil {
			li.StopReason = *row.StopReason
		}
	}
	return li
}
