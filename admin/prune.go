package admin

import (
	"context"
	"errors"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/ops"
)

// Retention. Lease rows are kept on release, so that a target's generation
// keeps increasing; Prune deletes the rows that have been released, or
// expired, for long enough. A deleted row would restart its target's
// generation, so each batch of deletions also raises the generation floor:
// a one-row table, named after the lease table with "_floor" appended,
// holding the highest generation ever deleted. An acquire that finds no
// row for its target starts above the floor; one that finds a row goes on
// from the row's generation, as before, so the floor costs the acquire
// nothing but on a target's first acquisition (and one subquery that the
// statement evaluates only when it takes the lease, on PostgreSQL).
//
// On PostgreSQL an acquire's insert may have read the floor before a Prune
// that deletes its target's row committed, and insert after it, once the
// row is gone: that is why the insert also starts above the row it saw.
// What remains is an acquire statement that stalls, between reading and
// inserting, for longer than another acquire, a release and olderThan
// together: minPruneAge keeps olderThan far beyond any statement's life.

const (
	// defaultPruneBatchSize is the number of rows that Prune deletes in
	// one transaction when PruneOptions.BatchSize is 0.
	defaultPruneBatchSize = 1000
	// maxPruneBatchSize is the largest PruneOptions.BatchSize.
	maxPruneBatchSize = 10000
	// minPruneAge is the shortest olderThan that Prune accepts: a row is
	// deleted only when it was released, or expired, at least this long
	// ago on the database's clock, far longer than any statement of a
	// lease step runs.
	minPruneAge = time.Minute
)

// PruneOptions says what Operator.Prune deletes, and how, as ListOptions
// says what List reads. Prune validates them together and names the field
// at fault.
type PruneOptions struct {
	// OlderThan is the age, on the database's clock, past which a row that
	// was released, or whose lease expired, is deleted: at least a minute.
	// It has no default: Prune refuses 0.
	OlderThan time.Duration
	// BatchSize is the most rows that Prune deletes in one transaction,
	// from 1 to 10,000; 0 means 1,000.
	BatchSize int
	// KeepResults keeps the result table's rows (SaveJSON's) of the
	// targets whose lease rows Prune deletes. By default they are deleted
	// with them, in the same transaction.
	KeepResults bool
	// Progress, when set, is called after each batch that deleted rows, on
	// Prune's goroutine, with the number of lease rows deleted so far. By
	// default Prune reports only its total, when it returns.
	Progress func(deleted int64)
	// DryRun deletes nothing: Prune counts, in one statement, the lease
	// rows that it would delete now, and returns that count (Progress is
	// not called); and, in another, the events (EventsDeleted). The
	// options are checked as for a real prune.
	DryRun bool

	// KeepEvents caps each row's history, where the table keeps one
	// (gormlease.WithHistory): Prune also deletes a row's events beyond
	// its KeepEvents newest, whatever their age (on PostgreSQL, where one
	// row of the event table may hold a generation's acquisition and
	// end, the two go together: a row may keep KeepEvents + 1 in the
	// table, and History may show one more, pending in the lease row).
	// 0, the default, sets no cap; it cannot be negative.
	KeepEvents int
	// EventsDeleted, when not nil, is set to the number of events that
	// Prune deleted (with DryRun, that it would delete now), also when it
	// returns an error; 0 where the table keeps no history. The count
	// that Prune returns is of lease rows only.
	EventsDeleted *int64
	// EventProgress, when set, is called after each batch that deleted
	// events, on Prune's goroutine, with the number of events deleted so
	// far.
	EventProgress func(deleted int64)
}

// Prune deletes the lease rows that were released, or whose lease expired
// (by the timeout its acquisition recorded; a row without one counts as
// expired since its last heartbeat), more than opts.OlderThan ago on the
// database's clock, with the result rows of their targets (unless
// opts.KeepResults). It never deletes a live lease, nor a paused target's
// row. It works in batches (opts.BatchSize), each a short transaction of
// its own that also raises the generation floor, so that a target
// acquired again later gets a generation above every one it had. It is
// safe to run at any time, from several processes at once, while leases
// are acquired, renewed and released: a row acquired meanwhile stays.
//
// Where the table keeps history (gormlease.WithHistory), Prune then
// deletes the events older than opts.OlderThan, and with opts.KeepEvents
// those of each row beyond its newest KeepEvents, in batches of
// opts.BatchSize rows of the event table (on PostgreSQL a row may hold a
// generation's acquisition and end, which go together, judged by the end),
// each a statement that reads the event table in
// key order from where the last one stopped, and one that deletes what it
// read: a whole Prune reads the event table about once. It keeps the
// newest event of each row whose lease row is not prunable when the events
// are read, whatever its age, so that the row's Seq goes on from it (a row
// that comes of age between the two passes can lose all its events); a row's history ends with its lease
// row, once Prune has deleted that and its events have aged. Where the
// table keeps no history, there is nothing to delete, and no error.
//
// It returns the number of lease rows deleted, also when it stops early:
// when ctx is done, with an error wrapping ctx.Err(), or on a database
// error; the events deleted are counted apart (opts.EventsDeleted). With
// opts.DryRun it deletes nothing, and returns the number of rows that it
// would delete now. Options it cannot honour return an error wrapping
// gormlease.ErrInvalidArgument that names the field, and delete nothing.
func (o *Operator) Prune(ctx context.Context, opts PruneOptions) (deleted int64, err error) {
	var events int64
	if opts.EventsDeleted != nil {
		defer func() { *opts.EventsDeleted = events }()
	}
	r, err := o.parts()
	if err != nil {
		return 0, err
	}
	batchSize := opts.BatchSize
	if batchSize == 0 {
		batchSize = defaultPruneBatchSize
	}
	switch {
	case opts.OlderThan <= 0:
		return 0, ops.Invalidf("prune: PruneOptions.OlderThan is %v: give the age past which released and expired rows go, at least %v", opts.OlderThan, minPruneAge)
	case opts.OlderThan < minPruneAge:
		return 0, ops.Invalidf("prune: PruneOptions.OlderThan %v is less than the minimum, %v", opts.OlderThan, minPruneAge)
	case batchSize < 1 || batchSize > maxPruneBatchSize:
		return 0, ops.Invalidf("prune: PruneOptions.BatchSize %d is not between 1 and %d", batchSize, maxPruneBatchSize)
	case opts.KeepEvents < 0:
		return 0, ops.Invalidf("prune: PruneOptions.KeepEvents is %d: give the most events to keep of each row, or 0 for no cap", opts.KeepEvents)
	}
	eq := backend.EventPruneQuery{OlderThan: opts.OlderThan, Keep: opts.KeepEvents, BatchSize: batchSize}
	if opts.DryRun {
		var n int64
		err := r.Retry(ctx, func(ctx context.Context) (err error) {
			n, err = r.Backend.PruneCount(ctx, r.DB, opts.OlderThan)
			return err
		})
		if err != nil {
			return 0, ops.Wrapf(err, "prune (dry run)")
		}
		err = r.Retry(ctx, func(ctx context.Context) (err error) {
			events, err = r.Backend.PruneEventsCount(ctx, r.DB, eq)
			return err
		})
		if err != nil && !errors.Is(err, backend.ErrNoEvents) {
			return n, ops.Wrapf(err, "prune events (dry run)")
		}
		return n, nil
	}
	after := ""
	for {
		if err := ctx.Err(); err != nil {
			return deleted, ops.Wrapf(err, "prune")
		}
		var batch []string
		more := false
		err := r.Retry(ctx, func(ctx context.Context) (err error) {
			batch, more, err = r.Backend.PruneBatch(ctx, r.DB, backend.PruneQuery{
				OlderThan: opts.OlderThan, BatchSize: batchSize, After: after, KeepResults: opts.KeepResults,
			})
			return err
		})
		deleted += int64(len(batch))
		if err != nil {
			return deleted, ops.Wrapf(err, "prune")
		}
		if len(batch) > 0 && opts.Progress != nil {
			opts.Progress(deleted)
		}
		if !more || len(batch) == 0 {
			break
		}
		after = batch[len(batch)-1]
	}
	return deleted, pruneEvents(ctx, r, eq, &events, opts.EventProgress)
}

// pruneEvents deletes the events that q chooses, in batches, adding each
// batch's to *deleted, until none is left or ctx is done; nothing, and no
// error, where the table keeps no history.
func pruneEvents(ctx context.Context, r ops.Repository, q backend.EventPruneQuery, deleted *int64, progress func(int64)) error {
	for {
		if err := ctx.Err(); err != nil {
			return ops.Wrapf(err, "prune events")
		}
		var (
			n    int64
			last string
			more bool
		)
		err := r.Retry(ctx, func(ctx context.Context) (err error) {
			n, last, more, err = r.Backend.PruneEvents(ctx, r.DB, q)
			return err
		})
		switch {
		case errors.Is(err, backend.ErrNoEvents):
			return nil
		case err != nil:
			return ops.Wrapf(err, "prune events")
		}
		*deleted += n
		if n > 0 && progress != nil {
			progress(*deleted)
		}
		if !more {
			return nil
		}
		q.After = last
	}
}
