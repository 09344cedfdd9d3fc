package gormlease

import (
	"context"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
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
	// hold (WithMinHold, Repository.Hold) that has passed since.
	StateReleased LeaseState = "released"
)

const (
	// defaultListLimit is the number of rows that List returns when
	// ListOptions.Limit is 0.
	defaultListLimit = 100
	// maxListLimit is the largest ListOptions.Limit that List accepts.
	maxListLimit = 10000
)

// ListOptions choose the rows that Repository.List returns. The zero value
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

// LeaseInfo is a lease row as List reads it, with its state and ages on
// the database's clock.
type LeaseInfo struct {
	JobLease
	// TargetID is the target that the row leases, as the caller of Run,
	// Acquire or Get names it; for the row of a slot of a semaphore
	// (WithSlots), the semaphore's target. It hides the embedded
	// JobLease.TargetID, which is the row's Key.
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
	// Age is the time since UpdatedAt: the acquisition or last heartbeat.
	Age time.Duration
	// Timeout is the lease timeout that the row records: the last
	// acquisition's, or under a minimum hold the rest of the hold that
	// Hold recorded; 0 when the row records none (see JobLease.TimeoutMS).
	Timeout time.Duration
	// ExpiresIn is, for a row not released, Timeout - Age: how long the
	// lease lives without another heartbeat, negative once it has expired;
	// under a minimum hold, how long the hold lasts. It is 0 for a released
	// row, including one whose minimum hold has passed.
	ExpiresIn time.Duration
	// MinHold reports that the holder has ended its work and the row is
	// held, unrenewed, for the rest of its minimum hold (WithMinHold,
	// Repository.Hold): State is StateLive until ExpiresIn, and
	// StateReleased after it, never StateExpired.
	MinHold bool
	// Paused reports that the target is paused (Repository.Pause): no
	// acquisition takes the row until Resume. State still says whether a
	// lease is held: one held when Pause was called runs to its end.
	// PauseReason is the reason that Pause recorded; it hides the
	// embedded JobLease.PauseReason, as StopReason hides
	// JobLease.StopReason.
	Paused      bool
	PauseReason string
	// StopRequested reports that an operator asked the row's current
	// holder to stop (Repository.RequestStop), and the holder has not
	// released the lease yet; StopReason is the request's reason.
	StopRequested bool
	StopReason    string
}

// check returns an error wrapping ErrInvalidArgument when o cannot be
// used, and o with its defaults filled in.
func (o ListOptions) check() (ListOptions, error) {
	switch o.State {
	case "", StateLive, StateExpired, StateReleased:
	default:
		return o, invalidf("list: state %q is not one of live, expired, released", o.State)
	}
	switch {
	case o.Limit < 0 || o.Limit > maxListLimit:
		return o, invalidf("list: limit %d is not between 0 and %d", o.Limit, maxListLimit)
	case o.Limit == 0:
		o.Limit = defaultListLimit
	}
	if o.Prefix != "" {
		if problem := checkText(o.Prefix, maxTargetIDLength); problem != "" {
			return o, invalidf("list: prefix %q %s", truncateUTF8(o.Prefix, 40), problem)
		}
	}
	if o.After != "" {
		if problem := checkText(o.After, maxTargetIDLength); problem != "" {
			return o, invalidf("list: after %q %s", truncateUTF8(o.After, 40), problem)
		}
	}
	return o, nil
}

// List returns the lease rows that o chooses, in the order of their keys
// (LeaseInfo.Key), a page at a time: pass the Key of a page's last row as
// o.After to get the next, until a page is shorter than the limit. Each row's state
// and ages are read on the database's clock, in one statement. A page
// walks the primary key from o.After (and o.Prefix), so paging through a
// table of any size costs each page about the same. Like Get, List reads
// the database that the Repository's *gorm.DB was opened on.
func (r *Repository) List(ctx context.Context, o ListOptions) ([]LeaseInfo, error) {
	o, err := o.check()
	if err != nil {
		return nil, err
	}
	rows, err := r.backend.List(ctx, r.db, backend.ListQuery{
		After: o.After, Prefix: o.Prefix, State: string(o.State), Limit: o.Limit,
	})
	if err != nil {
		return nil, wrapf(err, "list")
	}
	return leaseInfos(rows), nil
}

// info reads the row of targetID itself, never one of its slots' (List
// with the target as Prefix may find those first), with its state and ages
// on the database's clock, in one statement; false when there is none.
func (r *Repository) info(ctx context.Context, targetID string) (LeaseInfo, bool, error) {
	rows, err := r.backend.List(ctx, r.db, backend.ListQuery{Key: targetID, Limit: 1})
	if err != nil || len(rows) == 0 {
		return LeaseInfo{}, false, err
	}
	return leaseInfos(rows)[0], true, nil
}

// leaseInfos returns the rows that the backend listed as LeaseInfos.
func leaseInfos(rows []backend.Listed) []LeaseInfo {
	out := make([]LeaseInfo, len(rows))
	for i, row := range rows {
		out[i].JobLease = JobLease(row.Row)
		out[i].TargetID, out[i].Key = row.Row.TargetID, row.Row.TargetID
		if target, slot, ok := backend.ParseSlotKey(row.Row.TargetID); ok {
			out[i].TargetID, out[i].Slot = target, slot
		}
		out[i].fill(LeaseState(row.State), row.Age)
	}
	return out
}

// fill sets li's state and durations from state and age, as read.
func (li *LeaseInfo) fill(state LeaseState, age time.Duration) {
	li.State, li.Age = state, age
	if li.TimeoutMS != nil {
		li.Timeout = time.Duration(*li.TimeoutMS) * time.Millisecond
	}
	held := li.ReleasedAt == nil && li.HoldGeneration != nil && *li.HoldGeneration == li.Generation
	switch {
	case state == StateReleased:
	case li.ReleasedAt == nil:
		li.ExpiresIn = li.Timeout - age
	}
	li.MinHold = held && state == StateLive
	li.Paused = li.PausedAt != nil
	if li.JobLease.PauseReason != nil {
		li.PauseReason = *li.JobLease.PauseReason
	}
	if li.ReleasedAt == nil && li.StopGeneration != nil && *li.StopGeneration == li.Generation {
		li.StopRequested = true
		if li.JobLease.StopReason != nil {
			li.StopReason = *li.JobLease.StopReason
		}
	}
}
