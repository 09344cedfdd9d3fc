package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// actionJSON is the outcome of release, pause, resume and stop, as -json
// writes it.
type actionJSON struct {
	// Command is the command: "release", "pause", "resume" or "stop".
	Command string `json:"command"`
	Target  string `json:"target"`
	// Slot is -slot, or 0 for the whole target.
	Slot int `json:"slot,omitempty"`
	// Operator is who acted (-as).
	Operator string `json:"operator"`
	// Reason is -reason (pause, stop).
	Reason string `json:"reason,omitempty"`
	// NewRow is true when pause made the target's row (-new).
	NewRow bool `json:"new_row,omitempty"`
	// Rows are the rows acted on, as the action left them: those that
	// release ended; the target's rows after pause or resume; the rows
	// whose holder stop asked to stop, as they were right after.
	Rows []leaseJSON `json:"rows"`
	// Wait is what stop -wait saw.
	Wait *waitJSON `json:"wait,omitempty"`
}

// newAction returns c's outcome, for -json, with rows.
func (c *command) newAction(rows []admin.LeaseInfo) actionJSON {
	a := actionJSON{Command: c.name, Target: c.target, Slot: c.slot, Operator: c.operator, Reason: c.reason,
		Rows: []leaseJSON{}}
	for _, li := range rows {
		a.Rows = append(a.Rows, toJSON(li))
	}
	return a
}

// releaseCmd ends by force the lease of c.target, or with -slot that of
// one slot of it; without -slot, on a semaphore, every slot's lease that
// is not released (admin.Operator.ForceRelease).
func releaseCmd(ctx context.Context, c *command) error {
	before, err := c.releasable(ctx)
	if err != nil {
		return err
	}
	for _, li := range before {
		c.say("This ends the %s lease on %s held by %q (generation %d, last heartbeat %s ago):\n"+
			"it gets a new token and generation %d, and is marked released.\n",
			li.State, c.rowName(li), li.Row.Holder, li.Row.Generation, short(li.Age), li.Row.Generation+1)
	}
	c.say("Each holder's heartbeats and save will be refused (lease lost); work in progress stops at its next\n" +
		"heartbeat. The next acquisition gets a higher generation.\n")
	question := "Release it?"
	if len(before) > 1 {
		question = fmt.Sprintf("Release these %d leases?", len(before))
	}
	if err := c.confirm(question, "Not released.", "releases"); err != nil {
		return err
	}
	var row gormlease.JobLease
	if c.slot != 0 {
		row, err = c.op.ForceReleaseSlot(ctx, c.target, c.slot)
	} else {
		row, err = c.op.ForceRelease(ctx, c.target)
	}
	if errors.Is(err, gormlease.ErrNoLiveLease) {
		return exitf(exitNothingToDo, "%s was released meanwhile; nothing to release", c.what())
	}
	if err != nil {
		return invalid(err)
	}
	// The rows that ForceRelease ended all carry the token it minted.
	after, err := c.rows(ctx)
	if err != nil {
		return err
	}
	var ended []admin.LeaseInfo
	for _, li := range after {
		if li.Row.LeaseToken == row.LeaseToken {
			ended = append(ended, li)
			c.say("Released %s: generation %d, token %s.\n", c.rowName(li), li.Row.Generation, li.Row.LeaseToken)
		}
	}
	if c.json {
		return c.writeJSON(c.newAction(ended))
	}
	return nil
}

// what names c's target, or its slot with -slot, in a sentence.
func (c *command) what() string {
	if c.slot != 0 {
		return fmt.Sprintf("slot %d of %q", c.slot, c.target)
	}
	return fmt.Sprintf("target %q", c.target)
}

// releasable reads the rows that release would end: c.target's own and
// its slots' (or, with -slot, that slot's) whose lease is not released;
// it returns an error saying why when there is none: exit 3 without a
// row, 4 when every one is released.
func (c *command) releasable(ctx context.Context) ([]admin.LeaseInfo, error) {
	rows, err := c.rows(ctx)
	if err != nil {
		return nil, err
	}
	var live []admin.LeaseInfo
	for _, li := range rows {
		if li.State != admin.StateReleased {
			live = append(live, li)
		}
	}
	switch {
	case len(rows) == 0:
		return nil, exitf(exitNoTarget, "no lease row for %s: never acquired, or pruned; nothing to release", c.what())
	case len(live) == 0 && len(rows) == 1:
		return nil, exitf(exitNothingToDo, "the lease on %s (generation %d) is released already; nothing to release",
			c.what(), rows[0].Row.Generation)
	case len(live) == 0:
		return nil, exitf(exitNothingToDo, "the leases on %s and its %d slots are released already; nothing to release",
			c.what(), len(rows)-1)
	}
	return live, nil
}

// rows reads c.target's own row and its slots' rows, or with -slot that
// slot's row only, those that exist, the own row first and the slots in
// their order.
func (c *command) rows(ctx context.Context) ([]admin.LeaseInfo, error) {
	var out []admin.LeaseInfo
	if c.slot == 0 {
		li, ok, err := c.lookup(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, li)
		}
	}
	slots, err := c.slotRows(ctx)
	if err != nil {
		return nil, err
	}
	for _, li := range slots {
		if c.slot == 0 || li.Slot == c.slot {
			out = append(out, li)
		}
	}
	return out, nil
}

// rowName names li's row in a sentence: the target, or a slot of it.
func (c *command) rowName(li admin.LeaseInfo) string {
	if li.Slot > 0 {
		return fmt.Sprintf("slot %d of %q", li.Slot, li.TargetID)
	}
	return fmt.Sprintf("%q", li.TargetID)
}

// pausedRow returns the first of rows that is paused, or nil.
func pausedRow(rows []admin.LeaseInfo) *admin.LeaseInfo {
	for i := range rows {
		if rows[i].Paused {
			return &rows[i]
		}
	}
	return nil
}

// pauseCmd pauses c.target (admin.Operator.Pause): a target without a row
// only with -new, which makes it.
func pauseCmd(ctx context.Context, c *command) error {
	rows, err := c.rows(ctx)
	if err != nil {
		return err
	}
	paused := pausedRow(rows)
	switch {
	case len(rows) == 0 && !c.newRow:
		return exitf(exitNoTarget, "no lease row for target %q: never acquired, or pruned (a typo?); "+
			"-new pauses it all the same, making its row, so that no one takes it until resume", c.target)
	case len(rows) == 0:
		c.say("This pauses %q, which has no lease row yet (one is made): no Run or Acquire takes it\n"+
			"until resume; RunWait, Do and Elector.Lead wait.\n", c.target)
	case paused != nil:
		c.say("%q is paused already (reason %q); this records the reason %q.\n", c.target, paused.PauseReason, c.reason)
	default:
		c.say("This pauses %q (its lease is %s, generation %d): no Run or Acquire takes it until resume;\n"+
			"RunWait, Do and Elector.Lead wait. A lease held now runs to its end (stop asks its holder to stop).\n",
			c.target, rows[0].State, rows[0].Row.Generation)
	}
	if err := c.confirm("Pause it?", "Not paused.", "pauses"); err != nil {
		return err
	}
	if err := c.op.Pause(ctx, c.target, c.reason); err != nil {
		return invalid(err)
	}
	c.say("Paused %q: %s.\n", c.target, c.reason)
	if !c.json {
		return nil
	}
	after, err := c.rows(ctx)
	if err != nil {
		return err
	}
	a := c.newAction(after)
	a.NewRow = len(rows) == 0
	return c.writeJSON(a)
}

// resumeCmd resumes c.target (admin.Operator.Resume): exit 3 when it has
// no row, 4 when it is not paused.
func resumeCmd(ctx context.Context, c *command) error {
	rows, err := c.rows(ctx)
	if err != nil {
		return err
	}
	paused := pausedRow(rows)
	switch {
	case len(rows) == 0:
		return exitf(exitNoTarget, "no lease row for target %q: never acquired, or pruned; nothing to resume", c.target)
	case paused == nil:
		return exitf(exitNothingToDo, "%q is not paused; nothing to resume", c.target)
	}
	c.say("This resumes %q, paused since %s (reason %q): it can be acquired again, and those that wait for it are woken.\n",
		c.target, paused.Row.PausedAt.UTC().Format(time.RFC3339), paused.PauseReason)
	if err := c.confirm("Resume it?", "Not resumed.", "resumes"); err != nil {
		return err
	}
	if err := c.op.Resume(ctx, c.target); err != nil {
		return invalid(err)
	}
	c.say("Resumed %q.\n", c.target)
	if !c.json {
		return nil
	}
	after, err := c.rows(ctx)
	if err != nil {
		return err
	}
	return c.writeJSON(c.newAction(after))
}

// stopCmd asks the holder of c.target, or of its slot -slot, to stop
// (admin.Operator.RequestStop), and with -wait waits until it has: exit
// 3 when the target (or slot) has no row, 4 when no lease is held, 6 when
// -timeout passed first.
func stopCmd(ctx context.Context, c *command) error {
	what := fmt.Sprintf("the holder of %q", c.target)
	if c.slot != 0 {
		what = fmt.Sprintf("the holder of slot %d of %q", c.slot, c.target)
	}
	rows, err := c.rows(ctx)
	if err != nil {
		return err
	}
	var held []admin.LeaseInfo
	for _, li := range rows {
		if li.State != admin.StateReleased {
			held = append(held, li)
		}
	}
	switch {
	case len(rows) == 0:
		return exitf(exitNoTarget, "no lease row for %s: never acquired, or pruned; nothing to stop", c.what())
	case len(held) == 0:
		return exitf(exitNothingToDo, "%s: no lease is held now; nothing to stop", what)
	}
	for _, li := range held {
		c.say("%s is %s, held by %q (generation %d, last heartbeat %s ago).\n",
			capitalize(c.rowName(li)), li.State, li.Row.Holder, li.Row.Generation, short(li.Age))
	}
	c.say("This asks %s to stop: at its next heartbeat its work is cancelled, nothing is saved,\n"+
		"and the lease is released, so that a waiting caller can take over (pause first to keep anyone from starting).\n", what)
	if err := c.confirm("Stop it?", "Not stopped.", "stops"); err != nil {
		return err
	}
	if c.slot != 0 {
		err = c.op.RequestStopSlot(ctx, c.target, c.slot, c.reason)
	} else {
		err = c.op.RequestStop(ctx, c.target, c.reason)
	}
	if errors.Is(err, gormlease.ErrNoLiveLease) {
		return exitf(exitNothingToDo, "%s: no lease is held now; nothing to stop", what)
	}
	if err != nil {
		return invalid(err)
	}
	c.say("Asked %s to stop: %s.\n", what, c.reason)
	// The rows whose holder the request reached: their generation is the
	// one asked to stop.
	after, err := c.rows(ctx)
	if err != nil {
		return err
	}
	var asked []admin.LeaseInfo
	for _, li := range after {
		if li.StopRequested {
			asked = append(asked, li)
		}
	}
	if !c.wait {
		if c.json {
			return c.writeJSON(c.newAction(asked))
		}
		return nil
	}
	return c.waitStopped(ctx, what, asked)
}
