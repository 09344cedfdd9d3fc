package admin

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
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
	// StatePaused is a filter, for ListOptions.State and Counts: the rows
	// whose target is paused (Operator.Pause), whatever their lease's
	// state. A row's LeaseInfo.State is never StatePaused: its Paused
	// field says it.
	StatePaused LeaseState = "paused"
)

// Order is the order of the rows that List returns (ListOptions.Order).
// Every order breaks ties by key, and is the statement's own, on the
// database's clock.
type Order string

const (
	// OrderKey orders the rows by key (LeaseInfo.Key): the default ("").
	OrderKey Order = ""
	// OrderAge orders the rows by their last heartbeat or update
	// (Row.UpdatedAt), the oldest first: the longest silent first (the
	// largest Age).
	OrderAge Order = "age"
	// OrderHeldSince orders the rows by their acquisition
	// (Row.AcquiredAt), the oldest first: the longest held first (the
	// largest HeldFor). Rows whose lease is released (StateReleased), and
	// rows that do not record their acquisition, come last.
	OrderHeldSince Order = "held"
	// OrderExpiry orders the rows by when their lease expires without
	// another heartbeat (Row.UpdatedAt plus the timeout it records), the
	// soonest first: the expired first, the longest expired (the lowest
	// ExpiresIn) before the others. Released rows come last.
	OrderExpiry Order = "expiry"
)

const (
	// defaultListLimit is the number of rows that List returns when
	// ListOptions.Limit is 0.
	defaultListLimit = 100
	// maxListLimit is the largest ListOptions.Limit that List accepts.
	maxListLimit = 10000
)

// ListOptions choose the rows that Operator.List returns, and their
// order. The zero value lists the first 100 rows of every state, by key.
// Every filter and the order are done by the database, in List's
// statement.
type ListOptions struct {
	// Prefix keeps the targets whose ID starts with it, byte for byte
	// (no wildcards); "" keeps all.
	Prefix string
	// State keeps the rows in this state: StateLive, StateExpired,
	// StateReleased, or StatePaused (the rows paused, whatever their
	// lease's state); "" keeps all.
	State LeaseState
	// Holder keeps the rows whose holder (Row.Holder: the holder name of
	// their last acquisition, see gormlease.WithHolder) is exactly this;
	// "" keeps all.
	Holder string
	// Order is the order of the rows: OrderKey (""), OrderAge,
	// OrderHeldSince or OrderExpiry.
	Order Order
	// After is the Cursor of the last row of the previous page: List
	// returns the rows after it, in Order. "" starts at the first. In
	// OrderKey a row's Cursor is its Key, so a Key works as well.
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
	Key string
	// Cursor is the row's place in the order of the List that returned
	// it: give the last row's Cursor as ListOptions.After, with the same
	// Order, to read the next page. It is opaque (but in OrderKey it is
	// the Key), and means nothing in another order.
	Cursor string
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
	// HeldFor is, for a row whose lease is not released (State live or
	// expired), the time since its acquisition (Row.AcquiredAt) on the
	// database's clock: how long the holder has held it. It is 0 for a
	// released row, and for one that does not record its acquisition
	// (acquired before gormlease recorded it, or created by Pause).
	HeldFor time.Duration
	// PausedBy is the operator who paused the target (Operator.As), or ""
	// when it is not paused or the pause named none.
	PausedBy string
	// StopBy is the operator who made the request that StopRequested
	// reports (Operator.As), or "".
	StopBy string
}

// check returns an error wrapping gormlease.ErrInvalidArgument when o
// cannot be used, and o with its defaults filled in, and the backend's
// query of it.
func (o ListOptions) check() (backend.ListQuery, error) {
	q := backend.ListQuery{Prefix: o.Prefix, State: string(o.State), Holder: o.Holder, Limit: o.Limit}
	switch o.State {
	case "", StateLive, StateExpired, StateReleased, StatePaused:
	default:
		return q, ops.Invalidf("list: state %q is not one of live, expired, released, paused", o.State)
	}
	var ok bool
	if q.Order, ok = listOrders[o.Order]; !ok {
		return q, ops.Invalidf("list: order %q is not one of %q (by key), age, held, expiry", o.Order, OrderKey)
	}
	switch {
	case o.Limit < 0 || o.Limit > maxListLimit:
		return q, ops.Invalidf("list: limit %d is not between 0 and %d", o.Limit, maxListLimit)
	case o.Limit == 0:
		q.Limit = defaultListLimit
	}
	for _, f := range []struct{ name, value string }{{"prefix", o.Prefix}, {"holder", o.Holder}} {
		if f.value == "" {
			continue
		}
		if problem := ops.CheckText(f.value, ops.MaxTargetIDLength); problem != "" {
			return q, ops.Invalidf("list: %s %q %s", f.name, ops.TruncateUTF8(f.value, 40), problem)
		}
	}
	if o.After != "" {
		var err error
		if q.After, q.AfterSort, err = parseCursor(o.Order, o.After); err != nil {
			return q, err
		}
	}
	return q, nil
}

// listOrders are the backend's orders of List's.
var listOrders = map[Order]backend.ListOrder{
	OrderKey: backend.ByKey, OrderAge: backend.ByAge, OrderHeldSince: backend.ByHeldSince, OrderExpiry: backend.ByExpiry,
}

// A cursor, in an order other than OrderKey, is the base64 (URL-safe,
// unpadded) of the order's name, the row's sort value (microseconds since
// the Unix epoch, or "" for a row that sorts last) and the row's key,
// separated by ":". The key is last, and may hold ":" itself.

// maxCursorLength is the longest Cursor: the base64 of an order's name, a
// sort value, a key of up to 255 bytes and two separators.
const maxCursorLength = (len(OrderHeldSince+OrderExpiry) + 20 + ops.MaxTargetIDLength + 2 + 2) * 4 / 3

// cursor is the Cursor of the row l, listed in order.
func cursor(order Order, l backend.Listed) string {
	if order == OrderKey {
		return l.Row.TargetID
	}
	sort := ""
	if l.Sort != nil {
		sort = strconv.FormatInt(*l.Sort, 10)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(string(order) + ":" + sort + ":" + l.Row.TargetID))
}

// parseCursor returns the key and the sort value of after, a Cursor of a
// List in order, or an error wrapping gormlease.ErrInvalidArgument when it
// is not one.
func parseCursor(order Order, after string) (key string, sort *int64, err error) {
	bad := func(problem string) error {
		return ops.Invalidf("list: after %q is not the Cursor of a row listed in order %q: %s",
			ops.TruncateUTF8(after, 40), order, problem)
	}
	if order == OrderKey {
		if problem := ops.CheckText(after, ops.MaxTargetIDLength); problem != "" {
			return "", nil, bad("as a key, it " + problem)
		}
		return after, nil, nil
	}
	if len(after) > maxCursorLength {
		return "", nil, bad(fmt.Sprintf("it is %d bytes long, more than a cursor's %d", len(after), maxCursorLength))
	}
	raw, err := base64.RawURLEncoding.DecodeString(after)
	if err != nil {
		return "", nil, bad("it is not base64")
	}
	parts := strings.SplitN(string(raw), ":", 3)
	if len(parts) != 3 {
		return "", nil, bad("it has no sort value and key")
	}
	if Order(parts[0]) != order {
		return "", nil, bad(fmt.Sprintf("it is a cursor of order %q", ops.TruncateUTF8(parts[0], 20)))
	}
	if parts[1] != "" {
		v, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return "", nil, bad("its sort value is not an integer")
		}
		sort = &v
	}
	if problem := ops.CheckText(parts[2], ops.MaxTargetIDLength); problem != "" {
		return "", nil, bad("its key " + problem)
	}
	return parts[2], sort, nil
}

// List returns the lease rows that opts chooses, in opts.Order, a page at
// a time: pass the Cursor of a page's last row as opts.After, with the
// same options, to get the next, until a page is shorter than the limit.
// Each row's state and ages are read on the database's clock, and the
// filters and the order are the database's, in one statement. It reads the
// database that the Repository's *gorm.DB was opened on, never a replica.
// Options it cannot honour (an After that is not a Cursor of opts.Order
// among them) return an error wrapping gormlease.ErrInvalidArgument that
// names the option.
//
// Paging is by the values of the last row read (keyset paging), not by
// offset, so a page costs about the same at any depth, and rows that come
// or go between pages do not shift the others. A row is listed once, on
// the page its place in the order falls in, as long as that place does
// not change between pages. In OrderKey it never does: each row that
// exists throughout is listed exactly once, whatever happens to it, and
// rows made or pruned meanwhile are listed or not. In the other orders a
// row's place moves when its lease changes: a heartbeat moves it later
// in OrderAge and OrderExpiry, so that it may be listed again on a later
// page; an acquisition moves it in OrderHeldSince, and a release moves it
// to the end in OrderHeldSince and OrderExpiry. A row whose place moves
// from after the last row read to before it (an acquisition with a
// shorter timeout, in OrderExpiry) is not listed by the pages that
// follow. State and Holder filter each page as it is read.
func (o *Operator) List(ctx context.Context, opts ListOptions) ([]LeaseInfo, error) {
	r, err := o.parts()
	if err != nil {
		return nil, err
	}
	q, err := opts.check()
	if err != nil {
		return nil, err
	}
	rows, err := r.Backend.List(ctx, r.DB, q)
	if err != nil {
		return nil, ops.Wrapf(err, "list")
	}
	out := make([]LeaseInfo, len(rows))
	for i, row := range rows {
		out[i] = leaseInfo(row)
		out[i].Cursor = cursor(opts.Order, row)
	}
	return out, nil
}

// Counts are the lease rows of each state, as Operator.Count counts them
// on the database's clock. Live, Expired and Released add up to Total;
// Paused and StopRequested count rows of any state. Each row of a slot
// (WithSlots) counts as a row.
type Counts struct {
	// Total is every row.
	Total int64
	// Live, Expired and Released are the rows in StateLive, StateExpired
	// and StateReleased: those that List with that State returns.
	Live, Expired, Released int64
	// Paused is the rows whose target is paused: those that List with
	// StatePaused returns.
	Paused int64
	// StopRequested is the rows whose holder an operator asked to stop
	// and has not released the lease yet (LeaseInfo.StopRequested).
	StopRequested int64
}

// Count counts the lease rows whose key starts with prefix, byte for byte
// ("" counts all), in each state: in one statement, on the database's
// clock, so that the counts agree with each other. It reads every such
// row (no index holds the states: see docs/operating.md), and the
// database that the Repository's *gorm.DB was opened on, never a replica.
// A prefix that cannot be a target ID's start returns an error wrapping
// gormlease.ErrInvalidArgument.
func (o *Operator) Count(ctx context.Context, prefix string) (Counts, error) {
	r, err := o.parts()
	if err != nil {
		return Counts{}, err
	}
	if prefix != "" {
		if problem := ops.CheckText(prefix, ops.MaxTargetIDLength); problem != "" {
			return Counts{}, ops.Invalidf("count: prefix %q %s", ops.TruncateUTF8(prefix, 40), problem)
		}
	}
	n, err := r.Backend.Count(ctx, r.DB, prefix)
	if err != nil {
		return Counts{}, ops.Wrapf(err, "count")
	}
	return Counts(n), nil
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
	if li.State != StateReleased && row.AcquiredAt != nil {
		li.HeldFor = listed.HeldFor
	}
	li.Paused = row.PausedAt != nil
	if li.Paused {
		li.PauseReason = deref(row.PauseReason)
		li.PausedBy = deref(row.PausedBy)
	}
	if row.ReleasedAt == nil && row.StopGeneration != nil && *row.StopGeneration == row.Generation {
		li.StopRequested = true
		li.StopReason = deref(row.StopReason)
		li.StopBy = deref(row.StopBy)
	}
	return li
}

// deref is *s, or "" when s is nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
