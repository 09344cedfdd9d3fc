package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
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

// spec is what the usage text and a command's -h say of it.
type spec struct {
	// synopsis is the command's line in the usage text: its flags, and
	// TARGET where it takes one.
	synopsis string
	// what says in a line what the command does.
	what string
}

// order is the order of the commands in the usage text.
var order = []string{"list", "show", "history", "prune", "release", "pause", "resume", "stop", "migrate", "serve"}

// specs are the commands' synopses: the package doc's synopsis says the
// same (TestDocs_NameEveryCommandAndFlag checks that both name every flag).
var specs = map[string]spec{
	"list": {"[-prefix P] [-state live|expired|released|paused] [-holder H] [-order key|age|held|expiry] [-after CURSOR] [-limit N] [-all] [-json]",
		"list leases, 100 a page"},
	"show": {"[-json] TARGET", "show a target's lease row, or a semaphore's slots"},
	"history": {"[-slot N] [-limit N] [-before SEQ] [-json] TARGET",
		"show a target's history (or a slot's), newest first, 100 events a page"},
	"prune": {"-older-than 30d [-keep-events N] [-keep-results] [-batch N] [-dry-run] [-json]",
		"delete rows released or expired long ago, and old events"},
	"release": {"[-yes] [-json] [-as NAME] [-slot N] TARGET", "end a lease (with -slot N, one slot's) by force, fenced"},
	"pause":   {"[-yes] [-json] [-as NAME] [-new] -reason R TARGET", "stop new acquisitions of a target until resume"},
	"resume":  {"[-yes] [-json] [-as NAME] TARGET", "let a paused target be acquired again"},
	"stop": {"[-yes] [-json] [-as NAME] -reason R [-slot N] [-wait [-timeout 2m]] TARGET",
		"ask a target's holder (with -slot N, one slot's) to stop, and with -wait wait until it has"},
	"migrate": {"[-history] [-json]", "create the tables, or add what an earlier version's lack (gormlease.AutoMigrate); with -history, keep each target's history"},
	"serve": {"[-addr 127.0.0.1:8080] [-actions] [-trusted-network] [-json]",
		"serve the operator's console (package console) until interrupted"},
}

// commonFlags says what every command takes, in the usage text.
const commonFlags = `every command takes:
  -dsn DSN            the database (or $GORMLEASE_DSN), one of:
                        postgres://USER@HOST:5432/DB (or postgresql://...)
                        host=HOST user=USER dbname=DB (PostgreSQL's keyword form)
                        mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or USER:PASSWORD@tcp(HOST:3306)/DB
                        sqlite:PATH or file:PATH (SQLite; created when missing)
                        PATH (an existing SQLite file)
  -lease-table NAME   the lease table (default job_lease)
  -result-table NAME  the result table (default job_result)
  -json               write the outcome as JSON on stdout (list and show: an object a row;
                      history: an object an event);
                      errors still go to stderr, with the exit code
`

// usage is the usage text: every command, what every command takes, and
// the exit codes.
var usage = func() string {
	var b strings.Builder
	b.WriteString("usage: gormlease COMMAND [flags] [TARGET]\n\ncommands:\n")
	for _, name := range order {
		fmt.Fprintf(&b, "  %-8s %s\n           gormlease %s %s\n", name, specs[name].what, name, specs[name].synopsis)
	}
	b.WriteString("\n" + commonFlags + "\n" + exitCodes + "\nRun \"gormlease COMMAND -h\" for a command's flags.\n")
	return b.String()
}()

// commands are the commands, by name.
var commands = map[string]func(context.Context, *command) error{
	"list": listCmd, "show": showCmd, "history": historyCmd, "prune": pruneCmd, "release": releaseCmd, "migrate": migrateCmd,
	"pause": pauseCmd, "resume": resumeCmd, "stop": stopCmd, "serve": serveCmd,
}

// run runs the command that args name and returns its exit code (see
// exit.go): 0 on success, 1 on failure, 2 on bad usage, and the codes of
// the outcomes that a script tells apart.
func run(ctx context.Context, args []string, e env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(e.stderr, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	fn, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "gormlease: unknown command %q: give list, show, history, prune, release, pause, resume, stop, migrate or serve\n\n%s", args[0], usage)
		return exitUsage
	}
	c := newCommand(args[0], e)
	err := c.parse(args[1:])
	if err == nil {
		err = c.run(ctx, fn)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	code := exitFailure
	var xe *exitError
	if errors.As(err, &xe) {
		code = xe.code
	}
	fmt.Fprintf(e.stderr, "gormlease %s: %s\n", c.name, strings.TrimPrefix(err.Error(), "gormlease: "))
	return code
}

// command is one command's flags and what it works on.
type command struct {
	name                         string
	env                          env
	flags                        *flag.FlagSet
	dsn, leaseTable, resultTable string
	json                         bool

	// list and show
	prefix, state, holder, after string
	order                        admin.Order
	limit                        int
	all                          bool
	// history
	before int64
	// prune
	olderThan   age
	keepResults bool
	keepEvents  int
	batch       int
	dryRun      bool
	// migrate
	history bool
	// release, pause, resume, stop
	yes bool
	as  string
	// pause, stop
	reason string
	slot   int
	// pause
	newRow bool
	// stop
	wait    bool
	timeout time.Duration
	// serve
	addr           string
	actions        bool
	trustedNetwork bool
	auth           auth

	// operator is who acts, for release, pause, resume and stop: -as,
	// $GORMLEASE_OPERATOR, or the user and host that run the command.
	operator string
	target   string
	db       *gorm.DB
	repo     *gormlease.Repository
	op       *admin.Operator
}

// listPage is the rows per page of list without -limit.
const listPage = 100

// acts reports whether the command acts on a target, and asks first.
func (c *command) acts() bool {
	switch c.name {
	case "release", "pause", "resume", "stop":
		return true
	}
	return false
}

func newCommand(name string, e env) *command {
	c := &command{name: name, env: e, flags: flag.NewFlagSet("gormlease "+name, flag.ContinueOnError)}
	f := c.flags
	f.SetOutput(e.stderr)
	f.Usage = func() {
		fmt.Fprintf(f.Output(), "usage: gormlease %s %s\n\n%s.\n\nflags:\n", name, specs[name].synopsis, specs[name].what)
		f.PrintDefaults()
		fmt.Fprintf(f.Output(), "\n%s", exitCodes)
	}
	f.StringVar(&c.dsn, "dsn", "", "the database (default $"+dsnEnv+"): "+dsnpkg.Forms)
	f.StringVar(&c.leaseTable, "lease-table", gormlease.JobLease{}.TableName(), "the lease table")
	f.StringVar(&c.resultTable, "result-table", gormlease.JobResult{}.TableName(), "the result table")
	switch name {
	case "list":
		f.StringVar(&c.prefix, "prefix", "", "only targets that start with this")
		f.StringVar(&c.state, "state", "", "only the rows in this state: live, expired or released; or paused, the paused targets' rows")
		f.StringVar(&c.holder, "holder", "", "only the rows whose holder is exactly this")
		f.Func("order", "the order of the rows: key (the default), age (the longest silent first), "+
			"held (the longest held first), expiry (the soonest to expire first)", c.setOrder)
		f.StringVar(&c.after, "after", "", "start after this `CURSOR`: the cursor of the previous page's last row "+
			"(-json's \"cursor\"; by key, its target)")
		f.IntVar(&c.limit, "limit", listPage, "rows per page, 1 to 10000")
		f.BoolVar(&c.all, "all", false, "list every page, not only the first")
		f.BoolVar(&c.json, "json", false, "write JSON, an object a line")
	case "show":
		f.BoolVar(&c.json, "json", false, "write JSON (a semaphore: an object a slot, a line each)")
	case "history":
		f.IntVar(&c.slot, "slot", 0, "the history of this slot's row (a target with WithSlots), from 1 to 100")
		f.IntVar(&c.limit, "limit", historyPage, "events per page, 1 to 1000")
		f.Int64Var(&c.before, "before", 0, "only the events before this `SEQ`: the seq of the previous page's last event")
		f.BoolVar(&c.json, "json", false, "write JSON, an object an event, a line each")
	case "prune":
		f.Var(&c.olderThan, "older-than", "delete rows released or expired at least this long ago, at least 1m: "+
			"a Go duration (720h) with days before it if you like (30d, 1d12h) (required)")
		f.BoolVar(&c.keepResults, "keep-results", false, "keep the result rows of the targets pruned")
		f.IntVar(&c.keepEvents, "keep-events", 0, "where the table keeps history, keep at most this many newest events "+
			"of each target (0: no cap; events older than -older-than go anyway)")
		f.IntVar(&c.batch, "batch", 0, "rows deleted per transaction, up to 10000 (0: Prune's default, 1000)")
		f.BoolVar(&c.dryRun, "dry-run", false, "count the rows that would be deleted now, and delete nothing")
	case "migrate":
		f.BoolVar(&c.history, "history", false, "keep each target's history: make the event table and the triggers "+
			"that write it (gormlease.WithHistory); without it, a history kept stays")
	case "serve":
		c.serveFlags()
	}
	if c.acts() {
		f.BoolVar(&c.yes, "yes", false, c.name+" without asking")
		f.StringVar(&c.as, "as", "", "act as the operator `NAME`, which release, pause and stop record in the row (default $"+operatorEnv+", or USER@HOST of this process)")
	}
	switch name {
	case "prune", "release", "pause", "resume", "stop", "migrate", "serve":
		what := "write the outcome as one JSON object on stdout"
		if c.acts() {
			what += " (needs -yes: nothing is asked)"
		}
		if name == "serve" {
			what = "write the address served as a JSON object on stdout, and the log as JSON lines on stderr"
		}
		f.BoolVar(&c.json, "json", false, what)
	}
	switch name {
	case "pause", "stop":
		f.StringVar(&c.reason, "reason", "", "why, recorded in the row for others to read (required)")
	}
	switch name {
	case "pause":
		f.BoolVar(&c.newRow, "new", false, "pause a target that has no lease row yet (never acquired, or pruned): one is made")
	case "stop":
		f.IntVar(&c.slot, "slot", 0, "stop the holder of this slot only (a target with WithSlots), from 1 to 100")
		f.BoolVar(&c.wait, "wait", false, "then wait until the holder has stopped: its lease released or taken over")
		f.DurationVar(&c.timeout, "timeout", defaultStopWait, "with -wait, wait at most this long, then exit 6")
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
	case "show", "history", "release", "pause", "resume", "stop":
		if len(rest) > 1 {
			// Flags after the target.
			if err := c.flags.Parse(rest[1:]); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return err
				}
				return usagef("%v", err)
			}
			rest = append(rest[:1], c.flags.Args()...)
		}
		if len(rest) != 1 {
			return usagef("give one target: gormlease %s [flags] TARGET", c.name)
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
	if c.name == "history" && (c.limit < 1 || c.limit > maxHistoryPage) {
		return usagef("-limit %d: give 1 to %d events per page", c.limit, maxHistoryPage)
	}
	if c.before < 0 {
		return usagef("-before %d: give the seq of the previous page's last event (the events before it are shown)", c.before)
	}
	if c.keepEvents < 0 {
		return usagef("-keep-events %d: give the most events to keep of each target, or 0 for no cap", c.keepEvents)
	}
	if (c.name == "pause" || c.name == "stop") && strings.TrimSpace(c.reason) == "" {
		return usagef("give -reason, e.g. -reason \"deploy in progress\": it is recorded in the row")
	}
	if c.acts() && c.json && !c.yes {
		return usagef("-json needs -yes: %s asks for y on stdin otherwise, and no question comes in the middle of JSON", c.name)
	}
	if c.flagSet("timeout") && !c.wait {
		return usagef("-timeout bounds -wait: give -wait too, or leave -timeout out")
	}
	if c.wait && c.timeout <= 0 {
		return usagef("-timeout %v: give how long to wait for the holder to stop, e.g. -timeout 2m", c.timeout)
	}
	if c.acts() {
		if err := c.resolveOperator(); err != nil {
			return err
		}
	}
	if c.name == "prune" {
		if err := c.checkOlderThan(); err != nil {
			return err
		}
	}
	if c.name == "serve" {
		if err := c.checkServe(); err != nil {
			return err
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

// orders are the values of list's -order.
var orders = map[string]admin.Order{
	"key": admin.OrderKey, "age": admin.OrderAge, "held": admin.OrderHeldSince, "expiry": admin.OrderExpiry,
}

// setOrder sets list's -order.
func (c *command) setOrder(s string) error {
	o, ok := orders[s]
	if !ok {
		return fmt.Errorf("%q is not an order: give key, age, held or expiry", s)
	}
	c.order = o
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
	if c.acts() {
		c.op = c.op.As(c.operator)
	}
	return c.explainMissingTable(ctx, db, fn(ctx, c))
}

// say writes a line of text for the operator on stdout, unless -json:
// then stdout holds the JSON only.
func (c *command) say(format string, args ...any) {
	if !c.json {
		fmt.Fprintf(c.env.stdout, format, args...)
	}
}

// writeJSON writes v on stdout as one JSON object, on a line.
func (c *command) writeJSON(v any) error { return json.NewEncoder(c.env.stdout).Encode(v) }

// confirm asks question on stdout and reads the answer from stdin, unless
// -yes was given: anything but y or yes says no, and confirm then writes
// declined and returns an error, exit 5, saying that nothing changed
// (verb: what -yes does, "releases").
func (c *command) confirm(question, declined, verb string) error {
	if c.yes {
		return nil
	}
	fmt.Fprint(c.env.stdout, question+" [y/N] ")
	answer, _ := bufio.NewReader(c.env.stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		fmt.Fprintln(c.env.stdout, declined)
		return exitf(exitNotConfirmed, "not confirmed: nothing changed (-yes %s without asking)", verb)
	}
	return nil
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
	"paused_at", "pause_reason", "stop_generation", "stop_reason", "acquired_at", "paused_by", "stop_by",
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
