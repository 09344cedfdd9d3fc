package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gormlease/gormlease/admin"
)

// defaultStopWait is how long stop -wait waits without -timeout: a Runner
// finds the request at its next heartbeat, within its heartbeat interval
// (5 s by default), and a Runner in the middle of a slow heartbeat takes
// a few more.
const defaultStopWait = 2 * time.Minute

// stopPoll is how often stop -wait reads the rows it waits on: two short
// reads of the primary key's index a time.
const stopPoll = 200 * time.Millisecond

// The outcomes of a row whose holder stop -wait waits on.
const (
	// outcomeReleased: the holder released the lease (or the row was
	// pruned since).
	outcomeReleased = "released"
	// outcomeTakenOver: a later generation holds the row, or held it: the
	// lease asked to stop expired and was taken over, or was released by
	// force.
	outcomeTakenOver = "taken over"
	// outcomeEnded: the holder ended its work and keeps the row for a
	// minimum hold (gormlease.WithMinHold), which no work runs under.
	outcomeEnded = "ended, in its minimum hold"
	// outcomeRunning: the holder has not stopped.
	outcomeRunning = "running"
)

// waitJSON is what stop -wait saw, as -json writes it.
type waitJSON struct {
	// Stopped is true when every holder asked to stop has stopped.
	Stopped bool `json:"stopped"`
	// Seconds is how long stop waited.
	Seconds float64 `json:"seconds"`
	// TimeoutSeconds is -timeout.
	TimeoutSeconds float64 `json:"timeout_seconds"`
	// Rows are the rows whose holder was asked to stop, and what became of
	// each.
	Rows []waitRowJSON `json:"rows"`
}

// waitRowJSON is one row that stop -wait waited on.
type waitRowJSON struct {
	Slot int `json:"slot,omitempty"`
	// Generation is the generation asked to stop.
	Generation int64  `json:"generation"`
	Holder     string `json:"holder"`
	// Outcome is "released", "taken over", "ended, in its minimum hold",
	// or "running" when stop timed out first.
	Outcome string `json:"outcome"`
}

// waitStopped waits until the holder of each of asked, the rows whose
// current generation was asked to stop, has stopped: its lease released
// or taken over by a later generation (or its work ended under a minimum
// hold). It reads the rows every stopPoll, for at most -timeout, and then
// returns an error with exit code 6 that says what it last saw. An
// interrupt (SIGINT or SIGTERM) ends the wait with an error (exit 1); the request stays
// either way.
func (c *command) waitStopped(ctx context.Context, what string, asked []admin.LeaseInfo) error {
	start := time.Now()
	waitCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	outcomes := make([]string, len(asked))
	last := append([]admin.LeaseInfo(nil), asked...)
	if len(asked) > 0 {
		c.say("Waiting for it to stop (at most %v)...\n", c.timeout)
	}
	poll := time.NewTicker(stopPoll)
	defer poll.Stop()
	var err error
wait:
	for running(outcomes) > 0 {
		select {
		case <-waitCtx.Done():
		case <-poll.C:
			rows, rerr := c.rows(waitCtx)
			if rerr == nil {
				c.match(asked, outcomes, last, rows)
				continue
			}
			if waitCtx.Err() == nil {
				err = rerr
				break wait
			}
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("interrupted while waiting for %s to stop: the request stays", what)
		} else {
			err = c.timedOut(what, asked, outcomes, last)
		}
		break
	}
	elapsed := time.Since(start)
	if err == nil {
		for i, li := range asked {
			c.say("%s: generation %d %s after %v.\n", capitalize(c.rowName(li)),
				li.Row.Generation, outcomes[i], elapsed.Round(time.Millisecond))
		}
		if len(asked) == 0 {
			c.say("It had stopped already.\n")
		}
	}
	if c.json {
		w := &waitJSON{Stopped: err == nil, Seconds: elapsed.Seconds(), TimeoutSeconds: c.timeout.Seconds(), Rows: []waitRowJSON{}}
		for i, li := range asked {
			o := outcomes[i]
			if o == "" {
				o = outcomeRunning
			}
			w.Rows = append(w.Rows, waitRowJSON{Slot: li.Slot, Generation: li.Row.Generation, Holder: li.Row.Holder, Outcome: o})
		}
		a := c.newAction(asked)
		a.Wait = w
		var xe *exitError
		if err == nil || errors.As(err, &xe) { // the outcome, a timeout included; not an error reading the rows
			if werr := c.writeJSON(a); werr != nil && err == nil {
				err = werr
			}
		}
	}
	return err
}

// running counts the rows whose holder has not stopped, by their
// outcomes.
func running(outcomes []string) int {
	n := 0
	for _, o := range outcomes {
		if o == "" {
			n++
		}
	}
	return n
}

// match sets the outcome of each row of asked from rows, read now, and
// keeps in last how each row still running was seen.
func (c *command) match(asked []admin.LeaseInfo, outcomes []string, last, rows []admin.LeaseInfo) {
	byKey := make(map[string]admin.LeaseInfo, len(rows))
	for _, li := range rows {
		byKey[li.Key] = li
	}
	for i, a := range asked {
		if outcomes[i] != "" {
			continue
		}
		li, ok := byKey[a.Key]
		switch {
		case ok && li.Row.Generation != a.Row.Generation:
			outcomes[i] = outcomeTakenOver
		case !ok || li.State == admin.StateReleased:
			outcomes[i] = outcomeReleased
		case li.MinHold:
			outcomes[i] = outcomeEnded
		default:
			last[i] = li
		}
	}
}

// timedOut returns the error, exit 6, of a wait that -timeout ended: it
// names each holder still running and how its row was last seen.
func (c *command) timedOut(what string, asked []admin.LeaseInfo, outcomes []string, last []admin.LeaseInfo) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s has not stopped within %v; the request stays, and the holder stops at its next heartbeat if it is a Runner", what, c.timeout)
	for i, li := range last {
		if outcomes[i] != "" {
			continue
		}
		fmt.Fprintf(&b, "\n  %s: generation %d, held by %q, %s, last heartbeat %s ago", c.rowName(asked[i]), li.Row.Generation,
			li.Row.Holder, li.State, short(li.Age))
		if li.State == admin.StateExpired {
			b.WriteString(" (its holder may be gone: gormlease release ends the lease by force)")
		}
	}
	return exitf(exitTimedOut, "%s", b.String())
}
