package backend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

// The history's reads and deletes: the event table, named after the lease
// table with "_event" appended (Tables.Event), holds the events of a lease
// row, keyed by the row's key and seq, 1, 2, ... in the order written. A
// row of it is one event, or, written by PostgreSQL's trigger, the two
// events of a generation that nothing interrupted: its acquisition, at
// seq, and its end, at seq + 1, which no other row holds (ended_at and
// end_cause set; see Event). The statements that write it are the lease
// table's triggers, which a migration with history installs; these only
// read and delete.

// ErrNoEvents says that the event table does not exist: the lease table
// keeps no history. History, PruneEvents and PruneEventsCount return an
// error wrapping it, found from the database's error on the statement
// itself (see MissingTables), never by a statement of its own.
var ErrNoEvents = errors.New("no event table")

// The kinds of the events that a generation's row holds.
const (
	EventAcquired = "acquired"
	EventEnded    = "ended"
)

// Event is an event of a lease row, as History returns it. The columns
// that an event of its kind does not have are nil.
type Event struct {
	Key            string
	Seq            int64
	At             time.Time
	Kind           string
	Generation     int64
	Holder         string
	How            *string
	FromGeneration *int64
	AcquiredAt     *time.Time
	Operator       *string
	Detail         *string
	// EndedAt and EndCause are set only in a row of the event table that
	// holds a generation's two events: the row is the acquisition (Kind
	// EventAcquired, at Seq), and these, with Operator and Detail, its
	// end (at Seq + 1). History returns the two apart.
	EndedAt  *time.Time
	EndCause *string
}

// EventColumns are the columns of an event that History reads, in the
// order of Event.Columns.
const EventColumns = "target_id, seq, at, kind, generation, holder, how, from_generation, acquired_at, operator, detail, ended_at, end_cause"

// Columns returns where to scan EventColumns into e.
func (e *Event) Columns() []any {
	return []any{&e.Key, &e.Seq, &e.At, &e.Kind, &e.Generation, &e.Holder, &e.How, &e.FromGeneration,
		&e.AcquiredAt, &e.Operator, &e.Detail, &e.EndedAt, &e.EndCause}
}

// split returns the events that e holds, newest first: e itself, or, for
// a row that holds a generation's two events, its end and its acquisition.
func (e Event) split() []Event {
	if e.EndCause == nil || e.EndedAt == nil {
		return []Event{e}
	}
	acquired := e
	acquired.AcquiredAt, acquired.Operator, acquired.Detail, acquired.EndedAt, acquired.EndCause = nil, nil, nil, nil, nil
	at := e.At
	ended := Event{Key: e.Key, Seq: e.Seq + 1, At: *e.EndedAt, Kind: EventEnded, Generation: e.Generation, Holder: e.Holder,
		How: e.EndCause, AcquiredAt: &at, Operator: e.Operator, Detail: e.Detail}
	return []Event{ended, acquired}
}

// HistoryQuery chooses the events of a History: those of the row Key
// whose seq is below Before (all when 0), the newest Limit of them.
type HistoryQuery struct {
	Key    string
	Before int64
	Limit  int
}

// EventPruneQuery chooses the events of a PruneEvents: those older than
// OlderThan on the database's clock, except the newest of a key whose
// lease row stays (not prunable by OlderThan), so that its seq goes on
// from there; and, when Keep is above 0, those of a key beyond its Keep
// newest. A batch deletes up to
// BatchSize of them, from the key After on.
type EventPruneQuery struct {
	OlderThan time.Duration
	Keep      int
	BatchSize int
	After     string
}

// noEvents returns err wrapping ErrNoEvents when it says that the event
// table does not exist, and err as it is otherwise: a missing column of
// the event table, or a missing lease table, stays an error wrapping
// ErrMissingTables.
func (c *Common) noEvents(err error) error {
	var missing *MissingTablesError
	if errors.As(err, &missing) && missing.Column == "" && missing.Table == unqualified(c.tables.Event()) {
		return fmt.Errorf("%w: table %s does not exist", ErrNoEvents, c.tables.Event())
	}
	return err
}

// History reads the newest q.Limit events of the row q.Key below q.Before,
// newest first, in one statement that reads the event table's primary key
// backwards from there (and, where the dialect has pending acquisitions,
// the lease row's: see SetPendingEvent).
func (c *Common) History(ctx context.Context, db *gorm.DB, q HistoryQuery) ([]Event, error) {
	query := "SELECT " + EventColumns + " FROM " + c.tables.Event() + " WHERE target_id = ?"
	args := []any{q.Key}
	if q.Before > 0 {
		query, args = query+" AND seq < ?", append(args, q.Before)
	}
	if c.pending != "" {
		query, args = query+" UNION ALL "+c.pending, append(args, q.Key)
		if q.Before > 0 {
			query, args = query+" AND event_seq + 1 < ?", append(args, q.Before)
		}
	}
	// A row may hold two events: as many rows as events asked for are
	// enough.
	query += " ORDER BY seq DESC LIMIT " + strconv.Itoa(q.Limit)
	rows, err := Query(ctx, db, c.d.Rebind(query), args...)
	if err != nil {
		return nil, c.noEvents(err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		if err := rows.Scan(e.Columns()...); err != nil {
			return nil, err
		}
		for _, e := range e.split() {
			if (q.Before == 0 || e.Seq < q.Before) && len(out) < q.Limit {
				out = append(out, e)
			}
		}
	}
	return out, rows.Err()
}

// SetPendingEvent gives History the query of a row's pending acquisition,
// which the dialect's trigger has not yet written to the event table: a
// SELECT of EventColumns from the lease table, whose WHERE ends with
// target_id = ? (and then History may add a condition on event_seq).
// PostgreSQL's trigger leaves the acquisition of a released row, and of a
// row that the acquire inserts, pending, and writes it with the row's next
// event (docs/design.md, History).
func (c *Common) SetPendingEvent(query string) { c.pending = query }

// prunableEvent is the condition on an event row e that PruneEvents
// deletes it by, and its arguments: older than q.OlderThan (a row of two
// events by its end, the newer), but not the
// newest of a key whose lease row Prune keeps (one not prunable: the
// trigger numbers the next event from it); or, with q.Keep, when all its
// events are beyond its key's q.Keep newest. Each reads the key's highest
// seq from the primary key, for the event alone. A lease row that Prune
// would delete counts as gone already, so that a dry run, made before the
// lease rows are deleted, counts what Prune deletes after them (but for
// the acquisitions that PostgreSQL's trigger writes as it deletes a lease
// row whose acquisition was pending).
func (c *Common) prunableEvent(q EventPruneQuery) (string, []any) {
	secs := q.OlderThan.Seconds()
	// Not MAX(m.seq), which a server may compute by reading every event
	// of the key for each event (MySQL's correlated subqueries): the
	// newest entry of the key in the primary key's index, read backwards.
	newest := " FROM " + c.tables.Event() + " m WHERE m.target_id = e.target_id ORDER BY m.seq DESC LIMIT 1)"
	cond := "(" + c.d.SecondsSince("COALESCE(e.ended_at, e.at)") + " > ? AND (e.seq < (SELECT m.seq" + newest +
		" OR NOT EXISTS (SELECT 1 FROM " + c.tables.Lease + " l WHERE l.target_id = e.target_id AND NOT " + c.prunable() + ")))"
	args := []any{secs, secs, secs}
	if q.Keep > 0 {
		cond = "(" + cond + " OR e.seq + " + eventsIn("e") + " - 1 <= (SELECT m.seq + " + eventsIn("m") + " - 1" + newest + " - ?)"
		args = append(args, int64(q.Keep))
	}
	return cond, args
}

// eventsIn is the number of events in the event row alias, 1 or 2 (see
// Event).
func eventsIn(alias string) string {
	return "(CASE WHEN " + alias + ".end_cause IS NULL THEN 1 ELSE 2 END)"
}

// PruneEvents deletes up to q.BatchSize prunable event rows (see
// EventPruneQuery), the first in key and seq order from the key q.After
// on: it reads their keys in one statement, which reads the event table's
// primary key in order from there, and deletes them by key in a second,
// each run of consecutive rows of a key as one range.
// It returns the number of events deleted (a row may hold two), the key of
// the last one read, for the next batch's After, and whether more may
// follow. A key's events that are kept are read again only by the batch
// that starts at that key.
// It needs no transaction: an event that the first statement chose stays
// prunable (time passes, and keys only get newer events), and one that a
// concurrent prune deleted in between is not counted.
func (c *Common) PruneEvents(ctx context.Context, db *gorm.DB, q EventPruneQuery) (deleted int64, last string, more bool, err error) {
	cond, cargs := c.prunableEvent(q)
	rows, err := Query(ctx, db, c.d.Rebind("SELECT e.target_id, e.seq, "+eventsIn("e")+" FROM "+c.tables.Event()+" e WHERE e.target_id >= ? AND "+cond+
		" ORDER BY e.target_id, e.seq LIMIT "+strconv.Itoa(q.BatchSize)), append([]any{q.After}, cargs...)...)
	if err != nil {
		return 0, "", false, c.noEvents(err)
	}
	// The events to delete, as runs of consecutive rows of one key: the
	// triggers number a key's events without gaps, a row takes the seqs
	// of its events, and a prune deletes the oldest, so a batch is mostly
	// one run per key.
	var (
		where  []string
		args   []any
		n      int
		events int64
		next   int64 // the seq that the run's next row would have
	)
	for rows.Next() {
		var key string
		var s, w int64
		if err := rows.Scan(&key, &s, &w); err != nil {
			rows.Close()
			return 0, "", false, err
		}
		n, events = n+1, events+w
		if n > 1 && key == last && s == next {
			args[len(args)-1], next = s, s+w // the run goes on
			continue
		}
		where, args, last, next = append(where, "(target_id = ? AND seq BETWEEN ? AND ?)"), append(args, key, s, s), key, s+w
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, "", false, err
	}
	if n == 0 {
		return 0, "", false, nil
	}
	_, deleted, err = Exec(ctx, db, c.d.Rebind("DELETE FROM "+c.tables.Event()+" WHERE "+strings.Join(where, " OR ")), args...)
	if err != nil {
		return 0, "", false, c.noEvents(err)
	}
	if deleted == int64(n) {
		// Every row chosen: count their events. (When a concurrent prune
		// took some, the rows deleted, a count that may be low.)
		deleted = events
	}
	return deleted, last, n == q.BatchSize, nil
}

// PruneEventsCount counts, in one statement, the events that PruneEvents
// would delete now.
func (c *Common) PruneEventsCount(ctx context.Context, db *gorm.DB, q EventPruneQuery) (int64, error) {
	cond, args := c.prunableEvent(q)
	var n int64
	_, err := QueryRow(ctx, db, c.d.Rebind("SELECT COALESCE(SUM("+eventsIn("e")+"), 0) FROM "+c.tables.Event()+" e WHERE "+cond), args, &n)
	return n, c.noEvents(err)
}
