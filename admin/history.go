package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/ops"
)

// History. A lease table migrated with gormlease.WithHistory keeps an
// event for each change of a lease row that a person would ask about: an
// acquisition, a save, the end of a generation, and each operator's
// action. The lease table's triggers write them, in the transaction of the
// change, into the event table: the lease table's name with "_event"
// appended (on PostgreSQL an acquisition may stay pending in the lease row
// until the row's next event, and History reads it there). History reads them; Prune deletes the old ones
// (PruneOptions.OlderThan, KeepEvents). See docs/operating.md, History.

// ErrNoHistory is the error, wrapped, of History when the lease table
// keeps no history: its event table does not exist. Turn history on with
// gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()) or `gormlease
// migrate -history`; the events begin then.
var ErrNoHistory = errors.New("admin: the lease table keeps no history")

// EventKind is the kind of an Event, as the event table stores it. A kind
// that a later version writes is returned as it is stored.
type EventKind string

const (
	// EventAcquired is an acquisition: a generation began. Event.How says
	// what it took: HowNew, HowReleased, HowExpired or HowSeized.
	EventAcquired EventKind = "acquired"
	// EventSaved is a fenced commit that saved without ending the
	// generation (Repository.CommitIfOwner).
	EventSaved EventKind = "saved"
	// EventEnded is the end of a generation, one per generation; Event.How
	// is the cause (HowSaved, HowFailed, HowForced, ...) and Event.Detail
	// the failure's text, if any.
	EventEnded EventKind = "ended"
	// EventPaused is an operator's Pause: Event.Operator and Event.Detail
	// (the reason).
	EventPaused EventKind = "paused"
	// EventResumed is an operator's Resume: Event.Operator.
	EventResumed EventKind = "resumed"
	// EventStopRequested is an operator's RequestStop of the holder of
	// Event.Generation: Event.Operator and Event.Detail (the reason).
	EventStopRequested EventKind = "stop_requested"
)

// The values of Event.How. An acquisition (EventAcquired) took the row in
// one of these states:
const (
	// HowNew: there was no row, or one that no acquisition had taken (made
	// by Pause or by a semaphore's first acquire); Event.FromGeneration is 0.
	HowNew = "new"
	// HowReleased: a released row.
	HowReleased = "released"
	// HowExpired: a lease not released, past its timeout, of the
	// generation Event.FromGeneration.
	HowExpired = "expired"
	// HowSeized: a lease not released and not past its timeout (a
	// takeover by the test kit, leasetest, or another statement that takes
	// a live lease).
	HowSeized = "seized"
)

// The causes of an end of a generation (EventEnded), in Event.How, besides
// HowReleased (released without a save and without a failure:
// Repository.Release), HowExpired and HowSeized (written by the takeover
// that took the lease over, before its EventAcquired):
const (
	// HowSaved: the generation saved before it ended: a fenced commit that
	// saved and released, or a release or minimum hold after a save.
	HowSaved = "saved"
	// HowFailed: the work returned an error (Event.Detail).
	HowFailed = "failed"
	// HowSaveFailed: the saver, or the fenced commit around it, failed
	// (Event.Detail).
	HowSaveFailed = "save_failed"
	// HowLost: the Run ended because its lease was lost.
	HowLost = "lost"
	// HowStopped: an operator's stop request ended it (RequestStop).
	HowStopped = "stopped"
	// HowMaxHold: the work outlasted gormlease.WithMaxHold.
	HowMaxHold = "max_hold"
	// HowPanic: the work or the saver panicked.
	HowPanic = "panic"
	// HowCancelled: the caller's context ended.
	HowCancelled = "cancelled"
	// HowForced: an operator's ForceRelease (Event.Operator).
	HowForced = "forced"
)

// Event is one change of a lease row that its history recorded (see
// History). The fields that an event of its Kind does not have are zero.
type Event struct {
	// Key is the row's key: the target, or a slot's key (see
	// HistoryOptions.Slot).
	Key string
	// Seq is the event's place in the row's history, from 1, in the order
	// written: a later event has a higher Seq, whatever the clocks say.
	Seq int64
	// At is the database's time of the change.
	At time.Time
	// Kind is what happened.
	Kind EventKind
	// Generation is the generation the event is about: the one acquired,
	// saved or ended, or the row's when an operator acted (for
	// EventStopRequested, the generation asked to stop).
	Generation int64
	// Holder is that generation's holder.
	Holder string
	// How is, for EventAcquired, what the acquisition took (HowNew,
	// HowReleased, HowExpired, HowSeized), and for EventEnded the cause
	// (HowSaved, HowFailed, ...); "" for the other kinds.
	How string
	// FromGeneration is, for EventAcquired, the row's generation before;
	// 0 for none (HowNew).
	FromGeneration int64
	// AcquiredAt is, for EventEnded, when the generation was acquired;
	// nil when unknown (and for the other kinds).
	AcquiredAt *time.Time
	// Operator is the operator who acted (Operator.As), "" for none.
	Operator string
	// Detail is the failure's text (EventEnded) or the operator's reason
	// (EventPaused, EventStopRequested); "" for none.
	Detail string
}

// HeldFor returns how long the generation that e ended was held: At less
// AcquiredAt, for an EventEnded whose acquisition is known; 0 otherwise.
func (e Event) HeldFor() time.Duration {
	if e.Kind != EventEnded || e.AcquiredAt == nil {
		return 0
	}
	return max(e.At.Sub(*e.AcquiredAt), 0)
}

const (
	// defaultHistoryLimit is the number of events that History returns
	// when HistoryOptions.Limit is 0.
	defaultHistoryLimit = 100
	// maxHistoryLimit is the largest HistoryOptions.Limit.
	maxHistoryLimit = 1000
)

// HistoryOptions choose the events that Operator.History returns: a page
// of one row's history. The zero value is the newest 100 events of the
// target's own row.
type HistoryOptions struct {
	// Slot chooses the row: 0 for the target's own, 1 to
	// gormlease.MaxSlots for that slot's row of a semaphore
	// (gormlease.WithSlots), whose events are its own.
	Slot int
	// Before pages back: only the events whose Seq is below it; 0 starts
	// from the newest. The next page's Before is the last event's Seq.
	Before int64
	// Limit is the most events returned, from 1 to 1,000; 0 means 100.
	Limit int
}

// History returns the events of targetID's row (or, with opts.Slot, of
// that slot's row), newest first: a page of at most opts.Limit, below
// opts.Before. It reads them in one statement, from the event table's
// primary key (on PostgreSQL with the lease row, whose acquisition the
// trigger may leave pending until the generation's end: docs/design.md,
// History), so a page costs the same however long the history. A row
// that has no event (a target never acquired, nor paused, since history
// was turned on; or whose events were pruned) returns none, and no error.
//
// When the lease table keeps no history (its event table does not exist),
// it returns an error wrapping ErrNoHistory, found from the database's
// answer to that statement. An invalid targetID, a Slot outside 0 to
// gormlease.MaxSlots, a negative Before or a Limit outside 0 to 1,000
// return an error wrapping gormlease.ErrInvalidArgument that names it,
// and read nothing.
func (o *Operator) History(ctx context.Context, targetID string, opts HistoryOptions) ([]Event, error) {
	r, err := o.parts()
	if err != nil {
		return nil, err
	}
	if err := ops.CheckTargetID(targetID); err != nil {
		return nil, err
	}
	limit := opts.Limit
	if limit == 0 {
		limit = defaultHistoryLimit
	}
	switch {
	case opts.Slot < 0 || opts.Slot > gormlease.MaxSlots:
		return nil, ops.Invalidf("history %q: HistoryOptions.Slot must be between 0 (the target's own row) and %d, got %d",
			targetID, gormlease.MaxSlots, opts.Slot)
	case opts.Before < 0:
		return nil, ops.Invalidf("history %q: HistoryOptions.Before is %d: give the Seq of the last event of the previous page, or 0 for the newest",
			targetID, opts.Before)
	case limit < 1 || limit > maxHistoryLimit:
		return nil, ops.Invalidf("history %q: HistoryOptions.Limit %d is not between 1 and %d (0 means %d)",
			targetID, opts.Limit, maxHistoryLimit, defaultHistoryLimit)
	}
	key, step := targetID, fmt.Sprintf("history %q", targetID)
	if opts.Slot > 0 {
		key, step = backend.SlotKey(targetID, opts.Slot), fmt.Sprintf("history %q slot %d", targetID, opts.Slot)
	}
	var rows []backend.Event
	err = r.Retry(ctx, func(ctx context.Context) (err error) {
		rows, err = r.Backend.History(ctx, r.DB, backend.HistoryQuery{Key: key, Before: opts.Before, Limit: limit})
		return err
	})
	if errors.Is(err, backend.ErrNoEvents) {
		return nil, ops.Wrapf(fmt.Errorf("%w (its event table %s_event does not exist): turn it on with "+
			"gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()), or `gormlease migrate -history`", ErrNoHistory, r.LeaseTable), "%s", step)
	}
	if err != nil {
		return nil, ops.Wrapf(err, "%s", step)
	}
	events := make([]Event, len(rows))
	for i, row := range rows {
		events[i] = toEvent(row)
	}
	return events, nil
}

// toEvent is the Event of row, with the columns it lacks as zeros.
func toEvent(row backend.Event) Event {
	e := Event{
		Key: row.Key, Seq: row.Seq, At: row.At, Kind: EventKind(row.Kind), Generation: row.Generation, Holder: row.Holder,
		How: deref(row.How), Operator: deref(row.Operator), Detail: deref(row.Detail), AcquiredAt: row.AcquiredAt,
	}
	if row.FromGeneration != nil {
		e.FromGeneration = *row.FromGeneration
	}
	return e
}
