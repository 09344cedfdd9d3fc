package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gormlease/gormlease/admin"
)

// pruneJSON is the outcome of prune, as -json writes it.
type pruneJSON struct {
	Command string `json:"command"`
	// DryRun is -dry-run.
	DryRun bool `json:"dry_run"`
	// Deleted is the number of lease rows deleted: 0 with -dry-run.
	Deleted int64 `json:"deleted"`
	// WouldDelete is, with -dry-run, the number of lease rows that prune
	// would delete now.
	WouldDelete *int64 `json:"would_delete,omitempty"`
	// OlderThanSeconds is -older-than.
	OlderThanSeconds float64 `json:"older_than_seconds"`
	// KeepResults is -keep-results.
	KeepResults bool `json:"keep_results"`
	// EventsDeleted is the number of events deleted, where the table
	// keeps history: 0 with -dry-run, and where it keeps none.
	EventsDeleted int64 `json:"events_deleted"`
	// WouldDeleteEvents is, with -dry-run, the number of events that
	// prune would delete now.
	WouldDeleteEvents *int64 `json:"would_delete_events,omitempty"`
	// KeepEvents is -keep-events.
	KeepEvents int `json:"keep_events"`
	// Seconds is how long prune took.
	Seconds float64 `json:"seconds"`
}

// pruneCmd deletes the rows released or expired at least -older-than
// ago (admin.Operator.Prune), or with -dry-run counts them. It writes what
// it deleted also when it failed after a batch or more.
func pruneCmd(ctx context.Context, c *command) error {
	start := time.Now()
	var events int64
	opts := admin.PruneOptions{OlderThan: c.olderThan.d, BatchSize: c.batch, KeepResults: c.keepResults, DryRun: c.dryRun,
		KeepEvents: c.keepEvents, EventsDeleted: &events}
	what := "lease rows and their results"
	if c.keepResults {
		what = "lease rows (results kept)"
	}
	if c.dryRun {
		n, err := c.op.Prune(ctx, opts)
		if err != nil {
			return invalid(err)
		}
		if c.json {
			return c.writeJSON(pruneJSON{Command: "prune", DryRun: true, WouldDelete: &n, OlderThanSeconds: c.olderThan.d.Seconds(),
				KeepResults: c.keepResults, WouldDeleteEvents: &events, KeepEvents: c.keepEvents, Seconds: time.Since(start).Seconds()})
		}
		fmt.Fprintf(c.env.stdout, "would prune %d %s released or expired more than %v ago%s (-dry-run: nothing deleted)\n",
			n, what, c.olderThan.String(), c.eventsPruned(events))
		return nil
	}
	progress := false // a line of progress is on stderr
	if c.env.terminal {
		opts.Progress = func(n int64) {
			progress = true
			fmt.Fprintf(c.env.stderr, "\rpruned %d rows (%.0f rows/s)", n, float64(n)/time.Since(start).Seconds())
		}
		eventStart := time.Time{}
		opts.EventProgress = func(n int64) {
			if eventStart.IsZero() {
				if progress {
					fmt.Fprintln(c.env.stderr)
				}
				eventStart = time.Now()
			}
			progress = true
			fmt.Fprintf(c.env.stderr, "\rpruned %d events (%.0f events/s)", n, float64(n)/time.Since(eventStart).Seconds())
		}
	}
	n, err := c.op.Prune(ctx, opts)
	if progress {
		fmt.Fprintln(c.env.stderr)
	}
	if err != nil && n == 0 && events == 0 {
		return invalid(err)
	}
	elapsed := time.Since(start)
	if c.json {
		if err := c.writeJSON(pruneJSON{Command: "prune", Deleted: n, OlderThanSeconds: c.olderThan.d.Seconds(),
			KeepResults: c.keepResults, EventsDeleted: events, KeepEvents: c.keepEvents, Seconds: elapsed.Seconds()}); err != nil {
			return err
		}
		return invalid(err)
	}
	fmt.Fprintf(c.env.stdout, "pruned %d %s released or expired more than %v ago%s, in %v (%.0f rows/s)\n",
		n, what, c.olderThan.String(), c.eventsPruned(events), elapsed.Round(time.Millisecond), float64(n)/max(elapsed.Seconds(), 1e-9))
	return invalid(err)
}

// eventsPruned says, after prune's count of lease rows, how many events
// it deleted (or would delete): "" when none, and no -keep-events, as on
// a table that keeps no history.
func (c *command) eventsPruned(events int64) string {
	switch {
	case c.keepEvents > 0:
		return fmt.Sprintf(", and %d events older than that or beyond the newest %d of a target", events, c.keepEvents)
	case events > 0:
		return fmt.Sprintf(", and %d events older than that", events)
	}
	return ""
}

// checkOlderThan returns a usage error when -older-than is missing or
// less than Prune's minimum.
func (c *command) checkOlderThan() error {
	switch {
	case !c.olderThan.set:
		return usagef("give -older-than, e.g. -older-than 30d: rows released or expired that long ago are deleted")
	case c.olderThan.d <= 0:
		return usagef("-older-than %v: the age must be positive; with %v every row that has ended would go, "+
			"and Prune keeps each for at least %v after it ended, longer than any lease step runs: give 1m or more, e.g. 30d",
			c.olderThan.d, c.olderThan.d, minPruneAge)
	case c.olderThan.d < minPruneAge:
		return usagef("-older-than %v is less than the minimum, %v: Prune keeps each row that long after it ended, "+
			"longer than any lease step runs; give e.g. 30d", c.olderThan.d, minPruneAge)
	}
	return nil
}

// minPruneAge is the shortest -older-than: admin.Operator.Prune's minimum.
const minPruneAge = time.Minute

// age is the value of -older-than: a Go duration, with a whole or
// fractional number of days before it if given ("30d", "1d12h", "1.5d").
type age struct {
	d   time.Duration
	set bool
}

// String writes a in days and the rest, as it was given.
func (a *age) String() string {
	if a == nil || !a.set {
		return ""
	}
	days := a.d / (24 * time.Hour)
	rest := a.d % (24 * time.Hour)
	switch {
	case days == 0:
		return a.d.String()
	case rest == 0:
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%v", days, rest)
}

// Set parses s.
func (a *age) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	a.d, a.set = d, true
	return nil
}

// parseAge parses s, a Go duration with days before it if given.
func parseAge(s string) (time.Duration, error) {
	days, rest, hasDays := strings.Cut(s, "d")
	if !hasDays {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%q is not an age: give a duration such as 720h, 30d or 1d12h", s)
		}
		return d, nil
	}
	n, err := strconv.ParseFloat(days, 64)
	if err != nil || strings.ContainsAny(days, "eEnNiI") {
		return 0, fmt.Errorf("%q is not an age: give a duration such as 720h, 30d or 1d12h (days first)", s)
	}
	d := time.Duration(n * float64(24*time.Hour))
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return 0, fmt.Errorf("%q is not an age: give a duration such as 720h, 30d or 1d12h (days first)", s)
		}
		if n < 0 {
			r = -r
		}
		d += r
	}
	return d, nil
}
