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

	"github.com/gormlease/gormlease"
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
  prune    delete rows released or expired long ago: prune -older-than 720h [-keep-results] [-batch N]
  release  end a lease by force, fenced: release [-yes] TARGET

every command takes:
  -dsn DSN            the database (or $GORMLEASE_DSN): ` + dsnForms + `
  -lease-table NAME   the lease table (default job_lease)
  -result-table NAME  the result table (default job_result)

Run "gormlease COMMAND -h" for a command's flags.
`

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
	cmds := map[string]func(context.Context, *command) error{
		"list": listCmd, "show": showCmd, "prune": pruneCmd, "release": releaseCmd,
	}
	fn, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "gormlease: unknown command %q: give list, show, prune or release\n\n%s", args[0], usage)
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
	olderThan   time.Duration
	keepResults bool
	batch       int
	// release
	yes bool

	target string
	repo   *gormlease.Repository
}

// listPage is the rows per page of list without -limit.
const listPage = 100

func newCommand(name string, e env) *command {
	c := &command{name: name, env: e, flags: flag.NewFlagSet("gormlease "+name, flag.ContinueOnError)}
	f := c.flags
	f.SetOutput(e.stderr)
	f.StringVar(&c.dsn, "dsn", "", "the database (default $"+dsnEnv+"): "+dsnForms)
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
		f.DurationVar(&c.olderThan, "older-than", 0, "delete rows released or expired at least this long ago, e.g. 720h (required)")
		f.BoolVar(&c.keepResults, "keep-results", false, "keep the result rows of the targets pruned")
		f.IntVar(&c.batch, "batch", 0, "rows deleted per transaction, up to 10000 (0: Prune's default, 1000)")
	case "release":
		f.BoolVar(&c.yes, "yes", false, "release without asking")
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
	case "show", "release":
		if len(rest) != 1 {
			return usagef("give one target: gormlease %s [flags] TARGET (flags go before the target)", c.name)
		}
		c.target = rest[0]
	default:
		if len(rest) > 0 {
			return usagef("unexpected argument %q (flags go before arguments)", rest[0])
		}
	}
	if c.name == "prune" && c.olderThan == 0 {
		return usagef("give -older-than, e.g. -older-than 720h: rows released or expired that long ago are deleted")
	}
	if c.dsn == "" {
		c.dsn = c.env.getenv(dsnEnv)
	}
	if _, err := dialector(c.dsn); err != nil {
		return err
	}
	return nil
}

// run opens the database and runs fn, and explains fn's error when a
// table does not exist.
func (c *command) run(ctx context.Context, fn func(context.Context, *command) error) error {
	db, err := open(c.dsn)
	if err != nil {
		return err
	}
	defer closeDB(db)
	c.repo, err = gormlease.NewRepository(db, gormlease.WithTableNames(c.leaseTable, c.resultTable))
	if errors.Is(err, gormlease.ErrInvalidArgument) {
		return usagef("%s", strings.TrimPrefix(err.Error(), "gormlease: "))
	}
	if err != nil {
		return err
	}
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
	case strings.Contains(err.Error(), "timeout_ms"):
		return fmt.Errorf("%w\nthe tables were made by an earlier version: run gormlease.AutoMigrate, "+
			"which adds the new column and table and keeps every row", err)
	}
	return err
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
}

func toJSON(li gormlease.LeaseInfo) leaseJSON {
	j := leaseJSON{
		Target: li.Target, Slot: li.Slot, State: string(li.State), Generation: li.Generation, Holder: li.Holder,
		Token: li.LeaseToken.String(), UpdatedAt: li.UpdatedAt, ReleasedAt: li.ReleasedAt,
		AgeSeconds: li.Age.Seconds(), SavedGeneration: li.SavedGeneration, SavedAt: li.SavedAt, Failure: li.Failure,
	}
	if li.TimeoutMS != nil {
		t := li.Timeout.Seconds()
		j.TimeoutSeconds = &t
		if li.ReleasedAt == nil {
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
	o := gormlease.ListOptions{Prefix: c.prefix, State: gormlease.LeaseState(c.state), After: c.after, Limit: c.limit}
	var tw *tabwriter.Writer
	enc := json.NewEncoder(c.env.stdout)
	if !c.json {
		tw = tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TARGET\tSTATE\tGEN\tHOLDER\tAGE\tEXPIRES IN\tTIMEOUT\tSAVED GEN\tSLOT")
	}
	n, last := 0, ""
	for {
		page, err := c.repo.List(ctx, o)
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
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", li.Target, li.State, li.Generation, li.Holder,
				short(li.Age), expiresIn(li), timeout(li), optInt(li.SavedGeneration), slot(li))
		}
		n += len(page)
		if len(page) > 0 {
			last = page[len(page)-1].TargetID
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
	fmt.Fprintf(tw, "state:\t%s\n", li.State)
	fmt.Fprintf(tw, "generation:\t%d\n", li.Generation)
	fmt.Fprintf(tw, "holder:\t%s\n", li.Holder)
	fmt.Fprintf(tw, "token:\t%s\n", li.LeaseToken)
	fmt.Fprintf(tw, "updated at:\t%s (%s ago)\n", li.UpdatedAt.UTC().Format(time.RFC3339Nano), short(li.Age))
	if li.ReleasedAt != nil {
		fmt.Fprintf(tw, "released at:\t%s\n", li.ReleasedAt.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(tw, "timeout:\t%s\n", timeout(li))
	fmt.Fprintf(tw, "expires in:\t%s\n", expiresIn(li))
	fmt.Fprintf(tw, "saved generation:\t%s\n", optInt(li.SavedGeneration))
	if li.Failure != nil {
		fmt.Fprintf(tw, "failure:\t%s\n", *li.Failure)
	}
	return tw.Flush()
}

// showSlots shows the holders of c.target's slots (see
// gormlease.WithSlots): a slotted target has no row of its own, but one per
// slot, whose keys follow the target's.
func (c *command) showSlots(ctx context.Context) error {
	page, err := c.repo.List(ctx, gormlease.ListOptions{Prefix: c.target + "\x1f", Limit: gormlease.MaxSlots})
	if err != nil {
		return invalid(err)
	}
	var slots []gormlease.LeaseInfo
	for _, li := range page {
		if li.Slot > 0 && li.Target == c.target {
			slots = append(slots, li)
		}
	}
	if len(slots) == 0 {
		return fmt.Errorf("no lease row for target %q: never acquired, or pruned", c.target)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Slot < slots[j].Slot })
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
		if li.State == gormlease.StateLive {
			held++
		}
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "target:\t%s\n", c.target)
	fmt.Fprintf(tw, "slot rows:\t%d, %d held\n", len(slots), held)
	fmt.Fprintln(tw, "SLOT\tSTATE\tGEN\tHOLDER\tAGE\tEXPIRES IN\tTOKEN")
	for _, li := range slots {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\n", li.Slot, li.State, li.Generation, li.Holder,
			short(li.Age), expiresIn(li), li.LeaseToken)
	}
	return tw.Flush()
}

// slot is li's slot, or "-" for a row that is not a slot's.
func slot(li gormlease.LeaseInfo) string {
	if li.Slot == 0 {
		return "-"
	}
	return strconv.Itoa(li.Slot)
}

// lookup reads c.target's row: the first row under the target as a prefix
// is the target's own, when it has one.
func (c *command) lookup(ctx context.Context) (gormlease.LeaseInfo, bool, error) {
	page, err := c.repo.List(ctx, gormlease.ListOptions{Prefix: c.target, Limit: 1})
	if err != nil {
		return gormlease.LeaseInfo{}, false, invalid(err)
	}
	if len(page) == 0 || page[0].TargetID != c.target {
		return gormlease.LeaseInfo{}, false, nil
	}
	return page[0], true, nil
}

func pruneCmd(ctx context.Context, c *command) error {
	start := time.Now()
	var opts []gormlease.PruneOption
	if c.keepResults {
		opts = append(opts, gormlease.WithKeepResults())
	}
	if c.batch != 0 {
		opts = append(opts, gormlease.WithBatchSize(c.batch))
	}
	if c.env.terminal {
		opts = append(opts, gormlease.WithProgress(func(n int64) {
			fmt.Fprintf(c.env.stderr, "\rpruned %d rows (%.0f rows/s)", n, float64(n)/time.Since(start).Seconds())
		}))
	}
	n, err := c.repo.Prune(ctx, c.olderThan, opts...)
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
		n, what, c.olderThan, elapsed.Round(time.Millisecond), float64(n)/max(elapsed.Seconds(), 1e-9))
	return invalid(err)
}

func releaseCmd(ctx context.Context, c *command) error {
	li, ok, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no lease row for target %q: never acquired, or pruned; nothing to release", c.target)
	}
	if li.ReleasedAt != nil {
		return fmt.Errorf("the lease on %q (generation %d) is released already; nothing to release", c.target, li.Generation)
	}
	fmt.Fprintf(c.env.stdout, "This ends the %s lease on %q held by %q (generation %d, last heartbeat %s ago):\n"+
		"it gets a new token and generation %d, and is marked released. Its holder's heartbeats and save will be\n"+
		"refused (lease lost); work in progress stops at its next heartbeat. The next acquisition gets generation %d or more.\n",
		li.State, li.TargetID, li.Holder, li.Generation, short(li.Age), li.Generation+1, li.Generation+2)
	if !c.yes {
		fmt.Fprint(c.env.stdout, "Release it? [y/N] ")
		answer, _ := bufio.NewReader(c.env.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			fmt.Fprintln(c.env.stdout, "Not released.")
			return errors.New("not confirmed: nothing changed (-yes releases without asking)")
		}
	}
	row, err := c.repo.ForceRelease(ctx, c.target)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Released %q: generation %d, token %s.\n", row.TargetID, row.Generation, row.LeaseToken)
	return nil
}

// short writes d rounded for a table.
func short(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + short(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func expiresIn(li gormlease.LeaseInfo) string {
	switch {
	case li.ReleasedAt != nil:
		return "-"
	case li.TimeoutMS == nil:
		return "unknown"
	case li.ExpiresIn < 0:
		return "expired " + short(-li.ExpiresIn) + " ago"
	}
	return short(li.ExpiresIn)
}

func timeout(li gormlease.LeaseInfo) string {
	if li.TimeoutMS == nil {
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
