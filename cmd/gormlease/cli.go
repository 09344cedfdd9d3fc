package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	dsnpkg "github.com/gormlease/gormlease/internal/dsn"
)

// env is what a command reads and writes besides its arguments, so that
// tests can give their own.
type env struct {
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
	// terminal reports whether stderr is a terminal: prune then shows its
	// progress there.
	terminal bool
}

const usage = `usage: gormlease COMMAND [flags] [TARGET]

commands:
  list     list leases: -prefix P, -state live|expired|released, -after T, -limit N, -all, -json
  show     show one lease: show [-json] TARGET
  prune    delete rows released or expired long ago: prune -older-than 30d [-keep-results] [-batch N]
  release  end a lease (with -slot N, one slot's) by force, fenced: release [-yes] [-slot N] TARGET
  pause    stop new acquisitions of a target until resume: pause [-yes] -reason R TARGET
  resume   let a paused target be acquired again: resume [-yes] TARGET
  stop     ask a target's holder (with -slot N, one slot's) to stop: stop [-yes] -reason R [-slot N] TARGET
  migrate  create the tables, or add what an earlier version's lack (gormlease.AutoMigrate)
  serve    serve the operator's console (package console): serve [-addr 127.0.0.1:8080] [-actions]

every command takes:
  -dsn DSN            the database (or $GORMLEASE_DSN), one of:
                        postgres://USER@HOST:5432/DB (or postgresql://...)
                        host=HOST user=USER dbname=DB (PostgreSQL's keyword form)
                        mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or USER:PASSWORD@tcp(HOST:3306)/DB
                        sqlite:PATH or file:PATH (SQLite; created when missing)
                        PATH (an existing SQLite file)
  -lease-table NAME   the lease table (default job_lease)
  -result-table NAME  the result table (default job_result)

Run "gormlease COMMAND -h" for a command's flags.
`

// commands are the commands, by name.
var commands = map[string]func(context.Context, *command) error{
	"list": listCmd, "show": showCmd, "prune": pruneCmd, "release": releaseCmd, "migrate": migrateCmd,
	"pause": pauseCmd, "resume": resumeCmd, "stop": stopCmd, "serve": serveCmd,
}

// run runs the command that args name and returns its exit code: 0 on
// success, 1 on failure, 2 on bad usage.
func run(ctx context.Context, args []string, e env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(e.stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	fn, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "gormlease: unknown command %q: give list, show, prune, release, pause, resume, stop, migrate or serve\n\n%s", args[0], usage)
		return 2
	}
	c := newCommand(args[0], e)
	err := c.parse(args[1:])
	if err == nil {
		err = c.run(ctx, fn)
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "gormlease %s: %v\n", c.name, err)
		return 2
	}
	fmt.Fprintf(e.stderr, "gormlease %s: %v\n", c.name, strings.TrimPrefix(err.Error(), "gormlease: "))
	return 1
}

// command is one command's flags and what it works on.
type command struct {
	name                         string
	env                          env
	flags                        *flag.FlagSet
	dsn, leaseTable, resultTable string

	// list and show
	prefix, state, after string
	limit                int
	all, json            bool
	// prune
	olderThan   age
	keepResults bool
	batch       int
	// release, pause, resume, stop
	yes bool
	// pause, stop
	reason string
	slot   int
	// serve
	addr    string
	actions bool

	target string
	db     *gorm.DB
	repo   *gormlease.Repository
	op     *admin.Operator
}

// listPage is the rows per page of list without -limit.
const listPage = 100

func newCommand(name string, e env) *command {
	c := &command{name: name, env: e, flags: flag.NewFlagSet("gormlease "+name, flag.ContinueOnError)}
	f := c.flags
	f.SetOutput(e.stderr)
	f.StringVar(&c.dsn, "dsn", "", "the database (default $"+dsnEnv+"): "+dsnpkg.Forms)
	f.StringVar(&c.leaseTable, "lease-table", gormlease.JobLease{}.TableName(), "the lease table")
	f.StringVar(&c.resultTable, "result-table", gormlease.JobResult{}.TableName(), "the result table")
	switch name {
	case "list":
		f.StringVar(&c.prefix, "prefix", "", "only targets that start with this")
		f.StringVar(&c.state, "state", "", "only leases in this state: live, expired or released")
		f.StringVar(&c.after, "after", "", "start after this target (the last of the previous page)")
		f.IntVar(&c.limit, "limit", listPage, "rows per page, 1 to 10000")
		f.BoolVar(&c.all, "all", false, "list every page, not only the first")
		f.BoolVar(&c.json, "json", false, "write JSON, one object a line")
	case "show":
		f.BoolVar(&c.json, "json", false, "write JSON")
	case "prune":
		f.Var(&c.olderThan, "older-than", "delete rows released or expired at least this long ago, at least 1m: "+
			"a Go duration (720h) with days before it if you like (30d, 1d12h) (required)")
		f.BoolVar(&c.keepResults, "keep-results", false, "keep the result rows of the targets pruned")
		f.IntVar(&c.batch, "batch", 0, "rows deleted per transaction, up to 10000 (0: Prune's default, 1000)")
	case "release", "pause", "resume", "stop":
		f.BoolVar(&c.yes, "yes", false, c.name+" without asking")
	case "serve":
		c.serveFlags()
	}
	switch name {
	case "pause", "stop":
		f.StringVar(&c.reason, "reason", "", "why, recorded in the row for others to read (required)")
	}
	switch name {
	case "stop":
		f.IntVar(&c.slot, "slot", 0, "stop the holder of this slot only (a target with WithSlots), from 1 to 100")
	case "release":
		f.IntVar(&c.slot, "slot", 0, "release the lease of this slot only (a target with WithSlots), from 1 to 100")
	}
	return c
}

// parse reads args: the flags, then the target where the command takes one.
func (c *command) parse(args []string) error {
	if err := c.flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	rest := c.flags.Args()
	switch c.name {
	case "show", "release", "pause", "resume", "stop":
		if len(rest) != 1 {
			return usagef("give one target: gormlease %s [flags] TARGET (flags go before the target)", c.name)
		}
		c.target = rest[0]
	default:
		if len(rest) > 0 {
			return usagef("unexpected argument %q (flags go before arguments)", rest[0])
		}
	}
	if c.flagSet("slot") && (c.slot < 1 || c.slot > gormlease.MaxSlots) {
		return usagef("-slot %d: give a slot's number, from 1 to %d (leave -slot out for every slot)", c.slot, gormlease.MaxSlots)
	}
	if (c.name == "pause" || c.name == "stop") && strings.TrimSpace(c.reason) == "" {
		return usagef("give -reason, e.g. -reason \"deploy in progress\": it is recorded in the row (flags go before the target)")
	}
	if c.name == "prune" {
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
	}
	if c.dsn == "" {
		c.dsn = c.env.getenv(dsnEnv)
	}
	if _, err := dialector(c.dsn); err != nil {
		return err
	}
	return nil
}

// flagSet reports whether the flag name was given.
func (c *command) flagSet(name string) bool {
	set := false
	c.flags.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// run opens the database and runs fn, and explains fn's error when a
// table does not exist.
func (c *command) run(ctx context.Context, fn func(context.Context, *command) error) error {
	db, err := open(c.dsn)
	if err != nil {
		return err
	}
	defer closeDB(db)
	c.db = db
	c.repo, err = gormlease.NewRepository(db, gormlease.WithTableNames(c.leaseTable, c.resultTable))
	if errors.Is(err, gormlease.ErrInvalidArgument) {
		return usagef("%s", strings.TrimPrefix(err.Error(), "gormlease: "))
	}
	if err != nil {
		return err
	}
	c.op = admin.New(c.repo)
	return c.explainMissingTable(ctx, db, fn(ctx, c))
}

// invalid turns an error about bad input into a usage error, and adds
// the fix to an error about a column that an earlier version did not make.
// (run explains tables that do not exist.)
func invalid(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gormlease.ErrInvalidArgument):
		return usagef("%s", strings.TrimPrefix(err.Error(), "gormlease: "))
	case laterColumn(err):
		return fmt.Errorf("%w\nthe tables were made by an earlier version: run gormlease migrate (or gormlease.AutoMigrate from Go), "+
			"which adds the new columns and table and keeps every row", err)
	}
	return err
}

// laterColumns are the lease table's columns that versions after the first
// added: AutoMigrate adds them to tables an earlier version made.
var laterColumns = []string{
	"saved_generation", "saved_at", "failure", "waiting", "timeout_ms", "slots", "hold_generation",
	"paused_at", "pause_reason", "stop_generation", "stop_reason",
}

// laterColumn reports whether err names one of laterColumns: the database
// refused a statement that reads or writes it, as it does on the tables of
// an earlier version.
func laterColumn(err error) bool {
	for _, col := range laterColumns {
		if strings.Contains(err.Error(), col) {
			return true
		}
	}
	return false
}

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
	// StopRequested and StopReason say whether an operator asked the
	// current holder to stop (gormlease stop), and why.
	StopRequested bool   `json:"stop_requested,omitempty"`
	StopReason    string `json:"stop_reason,omitempty"`
}

func toJSON(li admin.LeaseInfo) leaseJSON {
	j := leaseJSON{
		Target: li.TargetID, Slot: li.Slot, State: string(li.State), Generation: li.Row.Generation, Holder: li.Row.Holder,
		Token: li.Row.LeaseToken.String(), UpdatedAt: li.Row.UpdatedAt, ReleasedAt: li.Row.ReleasedAt,
		AgeSeconds: li.Age.Seconds(), SavedGeneration: li.Row.SavedGeneration, SavedAt: li.Row.SavedAt, Failure: li.Row.Failure,
		MinHold: li.MinHold, Paused: li.Paused, PausedAt: li.Row.PausedAt, PauseReason: li.PauseReason,
		StopRequested: li.StopRequested, StopReason: li.StopReason,
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

func listCmd(ctx context.Context, c *command) error {
	if c.limit < 1 || c.limit > 10000 {
		// The library's 0 would mean its default page, which -all would
		// then never see end short of the limit.
		return usagef("list: -limit %d: give 1 to 10000 rows per page", c.limit)
	}
	o := admin.ListOptions{Prefix: c.prefix, State: admin.LeaseState(c.state), After: c.after, Limit: c.limit}
	var tw *tabwriter.Writer
	enc := json.NewEncoder(c.env.stdout)
	if !c.json {
		tw = tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TARGET\tSTATE\tGEN\tHOLDER\tAGE\tEXPIRES IN\tTIMEOUT\tSAVED GEN\tSLOT")
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
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", li.TargetID, state(li), li.Row.Generation, li.Row.Holder,
				short(li.Age), expiresIn(li), timeout(li), optInt(li.Row.SavedGeneration), slot(li))
		}
		n += len(page)
		if len(page) > 0 {
			last = page[len(page)-1].Key
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
			fmt.Fprintf(c.env.stderr, "(the first %d rows: -all lists every page, -after %q the next one)\n", n, last)
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
		fmt.Fprintf(tw, "paused:\tsince %s: %s\n", li.Row.PausedAt.UTC().Format(time.RFC3339Nano), li.PauseReason)
	}
	if li.StopRequested {
		fmt.Fprintf(tw, "stop requested:\t%s\n", li.StopReason)
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
		return fmt.Errorf("no lease row for target %q: never acquired, or pruned", c.target)
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
	fmt.Fprintln(tw, "SLOT\tSTATE\tGEN\tHOLDER\tAGE\tEXPIRES IN\tTOKEN")
	for _, li := range slots {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\n", li.Slot, state(li), li.Row.Generation, li.Row.Holder,
			short(li.Age), expiresIn(li), li.Row.LeaseToken)
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

func pruneCmd(ctx context.Context, c *command) error {
	start := time.Now()
	opts := admin.PruneOptions{OlderThan: c.olderThan.d, BatchSize: c.batch, KeepResults: c.keepResults}
	if c.env.terminal {
		opts.Progress = func(n int64) {
			fmt.Fprintf(c.env.stderr, "\rpruned %d rows (%.0f rows/s)", n, float64(n)/time.Since(start).Seconds())
		}
	}
	n, err := c.op.Prune(ctx, opts)
	if c.env.terminal && n > 0 {
		fmt.Fprintln(c.env.stderr)
	}
	if err != nil && n == 0 {
		return invalid(err)
	}
	elapsed := time.Since(start)
	what := "lease rows and their results"
	if c.keepResults {
		what = "lease rows (results kept)"
	}
	fmt.Fprintf(c.env.stdout, "pruned %d %s released or expired more than %v ago, in %v (%.0f rows/s)\n",
		n, what, c.olderThan.String(), elapsed.Round(time.Millisecond), float64(n)/max(elapsed.Seconds(), 1e-9))
	return invalid(err)
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
		fmt.Fprintf(c.env.stdout, "This ends the %s lease on %s held by %q (generation %d, last heartbeat %s ago):\n"+
			"it gets a new token and generation %d, and is marked released.\n",
			li.State, c.rowName(li), li.Row.Holder, li.Row.Generation, short(li.Age), li.Row.Generation+1)
	}
	fmt.Fprintf(c.env.stdout, "Each holder's heartbeats and save will be refused (lease lost); work in progress stops at its next\n"+
		"heartbeat. The next acquisition gets a higher generation.\n")
	question := "Release it?"
	if len(before) > 1 {
		question = fmt.Sprintf("Release these %d leases?", len(before))
	}
	if err := c.confirm(question, "Not released.", "releases"); err != nil {
		return err
	}
	if c.slot != 0 {
		row, err := c.op.ForceReleaseSlot(ctx, c.target, c.slot)
		if err != nil {
			return invalid(err)
		}
		fmt.Fprintf(c.env.stdout, "Released slot %d of %q: generation %d, token %s.\n", c.slot, c.target, row.Generation, row.LeaseToken)
		return nil
	}
	row, err := c.op.ForceRelease(ctx, c.target)
	if err != nil {
		return invalid(err)
	}
	// The rows that ForceRelease ended all carry the token it minted.
	after, err := c.rows(ctx)
	if err != nil {
		return err
	}
	for _, li := range after {
		if li.Row.LeaseToken == row.LeaseToken {
			fmt.Fprintf(c.env.stdout, "Released %s: generation %d, token %s.\n", c.rowName(li), li.Row.Generation, li.Row.LeaseToken)
		}
	}
	return nil
}

// releasable reads the rows that release would end: c.target's own and
// its slots' (or, with -slot, that slot's) whose lease is not released;
// it returns an error saying why when there is none.
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
	what := fmt.Sprintf("target %q", c.target)
	if c.slot != 0 {
		what = fmt.Sprintf("slot %d of %q", c.slot, c.target)
	}
	switch {
	case len(rows) == 0:
		return nil, fmt.Errorf("no lease row for %s: never acquired, or pruned; nothing to release", what)
	case len(live) == 0 && len(rows) == 1:
		return nil, fmt.Errorf("the lease on %s (generation %d) is released already; nothing to release", what, rows[0].Row.Generation)
	case len(live) == 0:
		return nil, fmt.Errorf("the leases on %s and its %d slots are released already; nothing to release", what, len(rows)-1)
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

// confirm asks question on stdout and reads the answer from stdin, unless
// -yes was given: anything but y or yes says no, and confirm then writes
// declined and returns an error saying that nothing changed (verb: what
// -yes does, "releases").
func (c *command) confirm(question, declined, verb string) error {
	if c.yes {
		return nil
	}
	fmt.Fprint(c.env.stdout, question+" [y/N] ")
	answer, _ := bufio.NewReader(c.env.stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		fmt.Fprintln(c.env.stdout, declined)
		return fmt.Errorf("not confirmed: nothing changed (-yes %s without asking)", verb)
	}
	return nil
}

func pauseCmd(ctx context.Context, c *command) error {
	li, ok, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	switch {
	case !ok:
		fmt.Fprintf(c.env.stdout, "This pauses %q, which has no lease row yet (one is made): no Run or Acquire takes it\n"+
			"until resume; RunWait, Do and Elector.Lead wait.\n", c.target)
	case li.Paused:
		fmt.Fprintf(c.env.stdout, "%q is paused already (reason %q); this records the reason %q.\n", c.target, li.PauseReason, c.reason)
	default:
		fmt.Fprintf(c.env.stdout, "This pauses %q (its lease is %s, generation %d): no Run or Acquire takes it until resume;\n"+
			"RunWait, Do and Elector.Lead wait. A lease held now runs to its end (stop asks its holder to stop).\n",
			c.target, li.State, li.Row.Generation)
	}
	if err := c.confirm("Pause it?", "Not paused.", "pauses"); err != nil {
		return err
	}
	if err := c.op.Pause(ctx, c.target, c.reason); err != nil {
		return invalid(err)
	}
	fmt.Fprintf(c.env.stdout, "Paused %q: %s.\n", c.target, c.reason)
	return nil
}

func resumeCmd(ctx context.Context, c *command) error {
	li, ok, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	if !ok || !li.Paused {
		return fmt.Errorf("%q is not paused; nothing to resume", c.target)
	}
	fmt.Fprintf(c.env.stdout, "This resumes %q, paused since %s (reason %q): it can be acquired again, and those that wait for it are woken.\n",
		c.target, li.Row.PausedAt.UTC().Format(time.RFC3339), li.PauseReason)
	if err := c.confirm("Resume it?", "Not resumed.", "resumes"); err != nil {
		return err
	}
	if err := c.op.Resume(ctx, c.target); err != nil {
		return invalid(err)
	}
	fmt.Fprintf(c.env.stdout, "Resumed %q.\n", c.target)
	return nil
}

func stopCmd(ctx context.Context, c *command) error {
	what := fmt.Sprintf("the holder of %q", c.target)
	if c.slot != 0 {
		what = fmt.Sprintf("the holder of slot %d of %q", c.slot, c.target)
	}
	fmt.Fprintf(c.env.stdout, "This asks %s to stop: at its next heartbeat its work is cancelled, nothing is saved,\n"+
		"and the lease is released, so that a waiting caller can take over (pause first to keep anyone from starting).\n", what)
	if err := c.confirm("Stop it?", "Not stopped.", "stops"); err != nil {
		return err
	}
	var err error
	if c.slot != 0 {
		err = c.op.RequestStopSlot(ctx, c.target, c.slot, c.reason)
	} else {
		err = c.op.RequestStop(ctx, c.target, c.reason)
	}
	if errors.Is(err, gormlease.ErrNoLiveLease) {
		return fmt.Errorf("%s: no lease is held now; nothing to stop", what)
	}
	if err != nil {
		return invalid(err)
	}
	fmt.Fprintf(c.env.stdout, "Asked %s to stop: %s.\n", what, c.reason)
	return nil
}

// short writes d rounded for a table: to the millisecond under a second,
// to the hundredth of a second under ten seconds (1.5s, not 2s).
func short(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + short(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// state is li's state for a table: a minimum hold says so.
func state(li admin.LeaseInfo) string {
	s := string(li.State)
	if li.MinHold {
		s += " (min hold)"
	}
	if li.StopRequested {
		s += ", stop requested"
	}
	if li.Paused {
		s += ", paused"
	}
	return s
}

// holdEnd is when the minimum hold of li, a row that it kept, ended or
// ends: its last stamp plus the timeout the hold recorded.
func holdEnd(li admin.LeaseInfo) time.Time { return li.Row.UpdatedAt.Add(li.Timeout) }

func expiresIn(li admin.LeaseInfo) string {
	switch {
	case li.State == admin.StateReleased:
		return "-"
	case li.Row.TimeoutMS == nil:
		return "unknown"
	case li.ExpiresIn < 0:
		return "expired " + short(-li.ExpiresIn) + " ago"
	}
	return short(li.ExpiresIn)
}

func timeout(li admin.LeaseInfo) string {
	if li.Row.TimeoutMS == nil {
		return "unknown"
	}
	return short(li.Timeout)
}

func optInt(v *int64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
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

// migrateCmd creates the tables, or adds what an earlier version's lack.
func migrateCmd(ctx context.Context, c *command) error {
	lease, result := c.repo.Tables()
	if err := gormlease.AutoMigrate(ctx, c.db, gormlease.WithTableNames(lease, result)); err != nil {
		return invalid(err)
	}
	fmt.Fprintf(c.env.stdout, "the tables %s, %s and %s_floor are ready\n", lease, result, lease)
	return nil
}
