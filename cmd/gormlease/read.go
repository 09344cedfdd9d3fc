package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// leaseJSON is a lease as the -json output writes it.
type leaseJSON struct {
	Target          string     `json:"target"`
	Slot            int        `json:"slot,omitempty"`
	State           string     `json:"state"`
	Generation      int64      `json:"generation"`
	Holder          string     `json:"holder"`
	Token           string     `json:"token"`
	UpdatedAt       time.Time  `json:"updated_at"`
	ReleasedAt      *time.Time `json:"released_at,omitempty"`
	AgeSeconds      float64    `json:"age_seconds"`
	TimeoutSeconds  *float64   `json:"timeout_seconds,omitempty"`
	ExpiresInSecs   *float64   `json:"expires_in_seconds,omitempty"`
	SavedGeneration *int64     `json:"saved_generation,omitempty"`
	SavedAt         *time.Time `json:"saved_at,omitempty"`
	Failure         *string    `json:"failure,omitempty"`
	// MinHold is true while the row is held only by its minimum hold.
	MinHold bool `json:"min_hold,omitempty"`
	// Paused, PausedAt and PauseReason say whether the target is paused
	// (gormlease pause), since when and why.
	Paused      bool       `json:"paused,omitempty"`
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	PauseReason string     `json:"pause_reason,omitempty"`
	// PausedBy is the operator who paused it (gormlease pause -as), or "".
	PausedBy string `json:"paused_by,omitempty"`
	// StopRequested and StopReason say whether an operator asked the
	// current holder to stop (gormlease stop), and why; StopBy who.
	StopRequested bool   `json:"stop_requested,omitempty"`
	StopReason    string `json:"stop_reason,omitempty"`
	StopBy        string `json:"stop_by,omitempty"`
	// AcquiredAt is when the current generation was acquired, when the
	// row records it; HeldForSeconds how long it has been held since, for
	// a lease not released.
	AcquiredAt     *time.Time `json:"acquired_at,omitempty"`
	HeldForSeconds *float64   `json:"held_for_seconds,omitempty"`
	// Cursor is the row's place in list's order: list -after takes the
	// last row's, with the same -order, for the next page.
	Cursor string `json:"cursor"`
}

func toJSON(li admin.LeaseInfo) leaseJSON {
	j := leaseJSON{
		Target: li.TargetID, Slot: li.Slot, State: string(li.State), Generation: li.Row.Generation, Holder: li.Row.Holder,
		Token: li.Row.LeaseToken.String(), UpdatedAt: li.Row.UpdatedAt, ReleasedAt: li.Row.ReleasedAt,
		AgeSeconds: li.Age.Seconds(), SavedGeneration: li.Row.SavedGeneration, SavedAt: li.Row.SavedAt, Failure: li.Row.Failure,
		MinHold: li.MinHold, Paused: li.Paused, PausedAt: li.Row.PausedAt, PauseReason: li.PauseReason,
		StopRequested: li.StopRequested, StopReason: li.StopReason,
	}
	j.PausedBy, j.StopBy, j.Cursor = li.PausedBy, li.StopBy, li.Cursor
	j.AcquiredAt = li.Row.AcquiredAt
	if d, ok := heldFor(li); ok {
		x := d.Seconds()
		j.HeldForSeconds = &x
	}
	if j.ReleasedAt == nil && li.State == admin.StateReleased {
		end := holdEnd(li)
		j.ReleasedAt = &end
	}
	if li.Row.TimeoutMS != nil {
		t := li.Timeout.Seconds()
		j.TimeoutSeconds = &t
		if li.State != admin.StateReleased {
			x := li.ExpiresIn.Seconds()
			j.ExpiresInSecs = &x
		}
	}
	return j
}

// orderName is o as -order names it.
func orderName(o admin.Order) string {
	for name, v := range orders {
		if v == o {
			return name
		}
	}
	return string(o)
}

// listCmd lists the rows that -prefix, -state and -holder choose, in
// -order, a page (-limit) or every page (-all).
func listCmd(ctx context.Context, c *command) error {
	if c.limit < 1 || c.limit > 10000 {
		// The library's 0 would mean its default page, which -all would
		// then never see end short of the limit.
		return usagef("list: -limit %d: give 1 to 10000 rows per page", c.limit)
	}
	o := admin.ListOptions{Prefix: c.prefix, State: admin.LeaseState(c.state), Holder: c.holder, Order: c.order,
		After: c.after, Limit: c.limit}
	var tw *tabwriter.Writer
	enc := json.NewEncoder(c.env.stdout)
	if !c.json {
		tw = tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TARGET\tSTATE\tGEN\tHOLDER\tHELD FOR\tAGE\tEXPIRES IN\tTIMEOUT\tSAVED GEN\tSLOT")
	}
	n, last := 0, ""
	for {
		page, err := c.op.List(ctx, o)
		if err != nil {
			return invalid(err)
		}
		for _, li := range page {
			if c.json {
				if err := enc.Encode(toJSON(li)); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", li.TargetID, state(li), li.Row.Generation, li.Row.Holder,
				heldForText(li), short(li.Age), expiresIn(li), timeout(li), optInt(li.Row.SavedGeneration), slot(li))
		}
		n += len(page)
		if len(page) > 0 {
			last = page[len(page)-1].Cursor
		}
		if !c.all || len(page) < o.Limit {
			break
		}
		o.After = last
		if tw != nil {
			tw.Flush()
		}
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
		if n == o.Limit && !c.all {
			more := ""
			if c.order != admin.OrderKey {
				more = " -order " + orderName(c.order)
			}
			fmt.Fprintf(c.env.stderr, "(the first %d rows: -all lists every page,%s -after %q the next one)\n", n, more, last)
		}
	}
	return nil
}

func showCmd(ctx context.Context, c *command) error {
	li, ok, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return c.showSlots(ctx)
	}
	if c.json {
		return json.NewEncoder(c.env.stdout).Encode(toJSON(li))
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "target:\t%s\n", li.TargetID)
	switch {
	case li.MinHold:
		fmt.Fprintf(tw, "state:\t%s (a minimum hold: the work has ended; the target stays held, unrenewed, until the hold ends)\n", li.State)
	case li.State == admin.StateReleased && li.Row.ReleasedAt == nil:
		fmt.Fprintf(tw, "state:\t%s (the work had ended; its minimum hold has passed)\n", li.State)
	default:
		fmt.Fprintf(tw, "state:\t%s\n", li.State)
	}
	fmt.Fprintf(tw, "generation:\t%d\n", li.Row.Generation)
	fmt.Fprintf(tw, "holder:\t%s\n", li.Row.Holder)
	fmt.Fprintf(tw, "token:\t%s\n", li.Row.LeaseToken)
	if d, ok := heldFor(li); ok {
		fmt.Fprintf(tw, "held since:\t%s (held for %s)\n", li.Row.AcquiredAt.UTC().Format(time.RFC3339Nano), short(d))
	} else if li.Row.AcquiredAt != nil {
		fmt.Fprintf(tw, "acquired at:\t%s\n", li.Row.AcquiredAt.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(tw, "updated at:\t%s (%s ago)\n", li.Row.UpdatedAt.UTC().Format(time.RFC3339Nano), short(li.Age))
	if li.Row.ReleasedAt != nil {
		fmt.Fprintf(tw, "released at:\t%s\n", li.Row.ReleasedAt.UTC().Format(time.RFC3339Nano))
	} else if li.State == admin.StateReleased {
		fmt.Fprintf(tw, "released at:\t%s (the end of its minimum hold)\n", holdEnd(li).UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(tw, "timeout:\t%s\n", timeout(li))
	if li.MinHold {
		fmt.Fprintf(tw, "hold ends in:\t%s\n", expiresIn(li))
	} else {
		fmt.Fprintf(tw, "expires in:\t%s\n", expiresIn(li))
	}
	fmt.Fprintf(tw, "saved generation:\t%s\n", optInt(li.Row.SavedGeneration))
	if li.Row.Failure != nil {
		fmt.Fprintf(tw, "failure:\t%s\n", *li.Row.Failure)
	}
	if li.Paused {
		fmt.Fprintf(tw, "paused:\tsince %s%s: %s\n", li.Row.PausedAt.UTC().Format(time.RFC3339Nano), by(li.PausedBy), li.PauseReason)
	}
	if li.StopRequested {
		fmt.Fprintf(tw, "stop requested:\t%s%s\n", li.StopReason, by(li.StopBy))
	}
	return tw.Flush()
}

// showSlots shows the holders of c.target's slots (see
// gormlease.WithSlots): a slotted target has no row of its own, but one per
// slot, whose keys follow the target's.
func (c *command) showSlots(ctx context.Context) error {
	slots, err := c.slotRows(ctx)
	if err != nil {
		return err
	}
	if len(slots) == 0 {
		return exitf(exitNoTarget, "no lease row for target %q: never acquired, or pruned", c.target)
	}
	if c.json {
		enc := json.NewEncoder(c.env.stdout)
		for _, li := range slots {
			if err := enc.Encode(toJSON(li)); err != nil {
				return err
			}
		}
		return nil
	}
	held := 0
	for _, li := range slots {
		if li.State == admin.StateLive {
			held++
		}
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "target:\t%s\n", c.target)
	fmt.Fprintf(tw, "slot rows:\t%d, %d held\n", len(slots), held)
	fmt.Fprintln(tw, "SLOT\tSTATE\tGEN\tHOLDER\tHELD FOR\tAGE\tEXPIRES IN\tTOKEN")
	for _, li := range slots {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", li.Slot, state(li), li.Row.Generation, li.Row.Holder,
			heldForText(li), short(li.Age), expiresIn(li), li.Row.LeaseToken)
	}
	return tw.Flush()
}

// slotRows reads the rows of c.target's slots, in the order of their
// numbers.
func (c *command) slotRows(ctx context.Context) ([]admin.LeaseInfo, error) {
	page, err := c.op.List(ctx, admin.ListOptions{Prefix: c.target + "\x1f", Limit: gormlease.MaxSlots})
	if err != nil {
		return nil, invalid(err)
	}
	var slots []admin.LeaseInfo
	for _, li := range page {
		if li.Slot > 0 && li.TargetID == c.target {
			slots = append(slots, li)
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Slot < slots[j].Slot })
	return slots, nil
}

// slot is li's slot, or "-" for a row that is not a slot's.
func slot(li admin.LeaseInfo) string {
	if li.Slot == 0 {
		return "-"
	}
	return strconv.Itoa(li.Slot)
}

// lookup reads c.target's row: the first row under the target as a prefix
// is the target's own, when it has one.
func (c *command) lookup(ctx context.Context) (admin.LeaseInfo, bool, error) {
	page, err := c.op.List(ctx, admin.ListOptions{Prefix: c.target, Limit: 1})
	if err != nil {
		return admin.LeaseInfo{}, false, invalid(err)
	}
	if len(page) == 0 || page[0].Key != c.target {
		return admin.LeaseInfo{}, false, nil
	}
	return page[0], true, nil
}
