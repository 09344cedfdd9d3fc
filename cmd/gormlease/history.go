package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

const (
	// historyPage is the events a page of history without -limit, as
	// admin.Operator.History's default.
	historyPage = 100
	// maxHistoryPage is the largest -limit of history: History's.
	maxHistoryPage = 1000
)

// eventJSON is an event as history -json writes it, a line each. Its
// names stay: scripts read them.
type eventJSON struct {
	Target string `json:"target"`
	// Slot is -slot: the slot whose row the event is of; 0 (left out)
	// for the target's own row.
	Slot int       `json:"slot,omitempty"`
	Seq  int64     `json:"seq"`
	At   time.Time `json:"at"`
	// Kind is acquired, saved, ended, paused, resumed or stop_requested.
	Kind       string `json:"kind"`
	Generation int64  `json:"generation"`
	Holder     string `json:"holder"`
	// How is what an acquisition took (new, released, expired, seized)
	// or the cause of an end (saved, failed, forced, ...).
	How string `json:"how,omitempty"`
	// FromGeneration is the generation before an acquisition, if any.
	FromGeneration int64 `json:"from_generation,omitempty"`
	// AcquiredAt and HeldForSeconds are, for an end, when the generation
	// was acquired and how long it was held, when known.
	AcquiredAt     *time.Time `json:"acquired_at,omitempty"`
	HeldForSeconds *float64   `json:"held_for_seconds,omitempty"`
	Operator       string     `json:"operator,omitempty"`
	Detail         string     `json:"detail,omitempty"`
}

func eventToJSON(target string, slot int, e admin.Event) eventJSON {
	j := eventJSON{Target: target, Slot: slot, Seq: e.Seq, At: e.At, Kind: string(e.Kind), Generation: e.Generation,
		Holder: e.Holder, How: e.How, FromGeneration: e.FromGeneration, AcquiredAt: e.AcquiredAt,
		Operator: e.Operator, Detail: e.Detail}
	if e.Kind == admin.EventEnded && e.AcquiredAt != nil {
		s := e.HeldFor().Seconds()
		j.HeldForSeconds = &s
	}
	return j
}

// historyCmd shows a page of the events of c.target's row, or with -slot
// of that slot's, newest first (admin.Operator.History). A target with no
// event and no lease row exits 3.
func historyCmd(ctx context.Context, c *command) error {
	opts := admin.HistoryOptions{Slot: c.slot, Before: c.before, Limit: c.limit}
	events, err := c.op.History(ctx, c.target, opts)
	if errors.Is(err, admin.ErrNoHistory) {
		return c.noHistory()
	}
	if err != nil {
		return invalid(err)
	}
	if len(events) == 0 {
		return c.noEvents(ctx)
	}
	if c.json {
		enc := json.NewEncoder(c.env.stdout)
		for _, e := range events {
			if err := enc.Encode(eventToJSON(c.target, c.slot, e)); err != nil {
				return err
			}
		}
	} else if err := c.writeEvents(events); err != nil {
		return err
	}
	if last := events[len(events)-1].Seq; len(events) == c.limit && last > 1 && !c.json {
		fmt.Fprintf(c.env.stderr, "(%d events: -before %d for the next page)\n", len(events), last)
	}
	return nil
}

// writeEvents writes events as a table, for a person.
func (c *command) writeEvents(events []admin.Event) error {
	row := "target " + printable(c.target)
	if c.slot > 0 {
		row += fmt.Sprintf(", slot %d", c.slot)
	}
	fmt.Fprintf(c.env.stdout, "history of %s, newest first:\n", row)
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT (UTC)\tEVENT\tGEN\tHOLDER\tHOW\tHELD FOR\tBY\tDETAIL")
	for _, e := range events {
		held := "-"
		if e.Kind == admin.EventEnded && e.AcquiredAt != nil {
			held = short(e.HeldFor())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.At.UTC().Format("2006-01-02 15:04:05.000"),
			printable(string(e.Kind)), e.Generation, orDash(printable(e.Holder)), orDash(how(e)), held,
			orDash(printable(e.Operator)), printable(e.Detail))
	}
	return tw.Flush()
}

// how is e's How for a table: an acquisition's names the generation it
// took over.
func how(e admin.Event) string {
	h := printable(e.How)
	if e.Kind == admin.EventAcquired && e.FromGeneration > 0 {
		h += fmt.Sprintf(" (from %d)", e.FromGeneration)
	}
	return h
}

// orDash is s, or "-" for "".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable is s, quoted as a Go string when it holds a character that
// would break a table's line (a tab, a newline, another control or
// invisible character).
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// noEvents explains a page without events: the target (or the slot) has
// no lease row either (exit 3), or it has one and no event in the history
// (exit 0: written before the history was turned on, or pruned); or it is
// a semaphore, whose events are its slots'.
func (c *command) noEvents(ctx context.Context) error {
	what := fmt.Sprintf("%q", c.target)
	if c.slot > 0 {
		what += fmt.Sprintf(" slot %d", c.slot)
	}
	if c.before > 0 {
		c.say("no events of %s before seq %d\n", what, c.before)
		return nil
	}
	found := false
	if c.slot > 0 {
		slots, err := c.slotRows(ctx)
		if err != nil {
			return err
		}
		for _, li := range slots {
			found = found || li.Slot == c.slot
		}
	} else {
		_, own, err := c.lookup(ctx)
		if err != nil {
			return err
		}
		found = own
		var slots []admin.LeaseInfo
		if !own {
			if slots, err = c.slotRows(ctx); err != nil {
				return err
			}
		}
		if len(slots) > 0 {
			c.say("no events of %s itself: it is a semaphore of %d slot rows, and each slot's row has its own: give -slot N\n",
				what, len(slots))
			return nil
		}
	}
	if !found {
		return exitf(exitNoTarget, "no events and no lease row for %s: never acquired, or pruned", what)
	}
	c.say("no events of %s: its lease row has had none since the table began keeping history, or they were pruned\n", what)
	return nil
}

// noHistory is the error of history on a lease table without the event
// table, with how to make it.
func (c *command) noHistory() error {
	command := "gormlease migrate -history"
	if c.leaseTable != (gormlease.JobLease{}).TableName() || c.resultTable != (gormlease.JobResult{}).TableName() {
		command += fmt.Sprintf(" -lease-table %s -result-table %s", c.leaseTable, c.resultTable)
	}
	return fmt.Errorf("the lease table %q keeps no history (there is no table %q): turn it on with %s with the same -dsn, "+
		"or gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()) from Go; events are recorded from then on",
		c.leaseTable, c.leaseTable+"_event", command)
}
