// Command opsbench measures the operations of gormlease on PostgreSQL
// against heartbeats: it lists 1,000,000 rows page by page, then prunes
// them (package admin), while a Runner holds 10,000 live leases that its
// heartbeat group renews every second, and reports the listing and pruning
// rates and every heartbeat statement's duration. A heartbeat statement is
// missed when it takes longer than the interval or fails; a lease lost is
// counted apart.
//
//	cd bench && go run ./opsbench [-dsn postgres://...] [-rows 1000000] [-leases 10000] [-out ../docs/performance.md]
//
// With -out it also writes its results as the operations section of that
// file, between the markers <!-- operations:begin --> and
// <!-- operations:end -->, replacing what is between them, or at the end
// of the file when it has no markers. The bench command, which rewrites the
// rest of docs/performance.md, carries that section over.
//
// It works in a schema of its own, opsbench, dropped at the start.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/bench/internal/opsection"
	"github.com/gormlease/gormlease/bench/internal/runs"
	"github.com/gormlease/gormlease/observe"
)

// listPage is the page size of the listing.
const listPage = 1000

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	rows := flag.Int("rows", 1_000_000, "expired rows to list and prune")
	leases := flag.Int("leases", 10_000, "live leases heartbeating")
	interval := flag.Duration("interval", time.Second, "heartbeat interval")
	out := flag.String("out", "", "write the results as the operations section of this Markdown `file` (docs/performance.md)")
	flag.Parse()
	if err := measureAndWrite(*dsn, *rows, *leases, *interval, *out); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func measureAndWrite(dsn string, rows, leases int, interval time.Duration, out string) error {
	// Check the file's markers before the run, not after it.
	if out != "" {
		if _, err := sectionPut(out, ""); err != nil {
			return err
		}
	}
	r, err := run(dsn, rows, leases, interval)
	if err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	doc, err := sectionPut(out, r.section())
	if err != nil {
		return err
	}
	return opsection.Write(out, doc)
}

// sectionPut returns the file at path with section as its operations
// section.
func sectionPut(path, section string) (string, error) {
	return opsection.Operations.PutIn(path, section)
}

// results are what a run measured.
type results struct {
	rows, leases int
	interval     time.Duration
	version      string
	started      time.Time
	took         time.Duration

	// quiet, listing and pruning are the heartbeat statements with nothing
	// else running, while listing, and while pruning.
	quiet, listing, pruning stats

	listed, pages int
	listTook      time.Duration
	pruned        int64
	pruneTook     time.Duration
	// liveLeft is the live leases left after the pruning.
	liveLeft int
}

func run(dsn string, rows, nLeases int, interval time.Duration) (results, error) {
	ctx := context.Background()
	r := results{rows: rows, leases: nLeases, interval: interval, started: time.Now()}
	setup, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	if err := setup.Exec("DROP SCHEMA IF EXISTS opsbench CASCADE; CREATE SCHEMA opsbench").Error; err != nil {
		return r, err
	}
	if err := setup.Raw("SELECT current_setting('server_version')").Scan(&r.version).Error; err != nil {
		return r, err
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := gorm.Open(postgres.Open(dsn+sep+"search_path=opsbench"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return r, err
	}
	// A separate pool for the heartbeats, as WithHeartbeatDB gives them.
	beatDB, err := gorm.Open(postgres.Open(dsn+sep+"search_path=opsbench"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		return r, err
	}
	op := admin.New(repo)
	b := &beater{interval: interval}
	runner, err := gormlease.NewRunner[string](db, gormlease.WithHeartbeatDB(beatDB),
		gormlease.WithHeartbeatInterval(interval), gormlease.WithLeaseTimeout(time.Minute), gormlease.WithObserver(b))
	if err != nil {
		return r, err
	}

	start := time.Now()
	if err := db.Exec(`INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, timeout_ms)
SELECT 'dead/' || lpad(i::text, 8, '0'), gen_random_uuid(), 1, 'bench', clock_timestamp() - interval '2 hours', 60000
FROM generate_series(1, ?) AS i`, rows).Error; err != nil {
		return r, err
	}
	fmt.Printf("seeded %d expired rows in %v\n", rows, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	held, err := runs.Hold(ctx, runner, nLeases, "live/")
	if err == nil {
		fmt.Printf("holding %d leases after %v\n", nLeases, time.Since(start).Round(time.Millisecond))
		err = measure(ctx, &r, db, op, b)
	}
	held.End() // the Runs end, and release their leases
	if err != nil {
		return r, err
	}
	r.took = time.Since(r.started)
	return r, setup.Exec("DROP SCHEMA opsbench CASCADE").Error
}

// measure lists and prunes the table through op while the Runner holds
// the live leases, and records the heartbeat statements that b saw in
// each window.
func measure(ctx context.Context, r *results, db *gorm.DB, op *admin.Operator, b *beater) error {
	if err := db.Exec("VACUUM ANALYZE job_lease").Error; err != nil {
		return err
	}
	time.Sleep(r.interval + r.interval/4) // every lease renewed once
	b.take()                              // the statements sent while the leases were taken
	time.Sleep(5 * r.interval)
	r.quiet = b.take()
	fmt.Println("heartbeats, nothing else running:", r.quiet)

	start := time.Now()
	var err error
	r.listed, r.pages, err = listAll(ctx, op, admin.ListOptions{Limit: listPage})
	if err != nil {
		return err
	}
	r.listTook = time.Since(start)
	r.listing = b.take()
	fmt.Printf("listed %d rows in %d pages in %v: %.0f rows/s, %.1f ms a page\n",
		r.listed, r.pages, r.listTook.Round(time.Millisecond), r.listRate(), r.listTook.Seconds()*1000/float64(r.pages))
	fmt.Println("heartbeats while listing:", r.listing)

	start = time.Now()
	r.pruned, err = op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour})
	r.pruneTook = time.Since(start)
	r.pruning = b.take()
	if err != nil {
		return err
	}
	fmt.Printf("pruned %d rows in %v: %.0f rows/s\n", r.pruned, r.pruneTook.Round(time.Millisecond), r.pruneRate())
	fmt.Println("heartbeats while pruning:", r.pruning)
	r.liveLeft, _, err = listAll(ctx, op, admin.ListOptions{Prefix: "live/", State: admin.StateLive, Limit: 10000})
	if err != nil {
		return err
	}
	fmt.Printf("live leases left: %d of %d\n", r.liveLeft, r.leases)
	return nil
}

// listAll lists the rows that o chooses, page after page, and counts them
// and the pages.
func listAll(ctx context.Context, op *admin.Operator, o admin.ListOptions) (listed, pages int, err error) {
	for {
		page, err := op.List(ctx, o)
		if err != nil {
			return listed, pages, err
		}
		listed, pages = listed+len(page), pages+1
		if len(page) < o.Limit {
			return listed, pages, nil
		}
		o.After = page[len(page)-1].Key
	}
}

func (r results) listRate() float64  { return float64(r.listed) / r.listTook.Seconds() }
func (r results) pruneRate() float64 { return float64(r.pruned) / r.pruneTook.Seconds() }

// beater is the Runner's Observer: it records each heartbeat statement
// that the Runner's heartbeat group sends, and each lease the Runner lost.
type beater struct {
	interval time.Duration

	mu         sync.Mutex
	statements []time.Duration
	leases     int // the leases that the statements renewed, or tried to
	missed     int
	lost       int
	errs       int
}

// Start starts no span: only the events count.
func (b *beater) Start(ctx context.Context, _ observe.Span) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// Record records a heartbeat statement, missed when it took longer than
// the interval or failed, and a lease lost to a takeover or to
// self-fencing.
func (b *beater) Record(_ context.Context, e observe.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e.Kind {
	case observe.EventHeartbeat:
		b.statements = append(b.statements, e.Duration)
		b.leases += e.Leases
		if e.Err != nil {
			b.errs++
		}
		if e.Duration > b.interval || e.Err != nil {
			b.missed++
		}
	case observe.EventLeaseLost, observe.EventSelfFenced:
		b.lost++
	}
}

// stats are the heartbeat statements of a window, sorted by duration.
type stats struct {
	statements []time.Duration
	// missed counts the statements over the interval, or failed.
	missed, lost, errs int
	leases             int
}

// take returns the statements since the last take.
func (b *beater) take() stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := stats{statements: b.statements, missed: b.missed, lost: b.lost, errs: b.errs, leases: b.leases}
	slices.Sort(s.statements)
	b.statements, b.leases, b.missed, b.lost, b.errs = nil, 0, 0, 0, 0
	return s
}

// quantile returns the q quantile of the statements' durations.
func (s stats) quantile(q float64) time.Duration {
	return s.statements[int(q*float64(len(s.statements)-1))].Round(time.Millisecond)
}

// durations summarizes the statements' durations.
func (s stats) durations() string {
	if len(s.statements) == 0 {
		return "no statement"
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v", s.quantile(0.5), s.quantile(0.99), s.quantile(1))
}

func (s stats) String() string {
	return fmt.Sprintf("%d statements renewing %d leases in all, %s; missed %d, leases lost %d, errors %d",
		len(s.statements), s.leases, s.durations(), s.missed, s.lost, s.errs)
}

// goal is a row of the section's table: met is "" for a figure.
type goal struct{ measure, want, got, met string }

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// missedGoal is the goal of no missed heartbeat while what ran.
func (r results) missedGoal(what string, s stats) goal {
	g := goal{measure: fmt.Sprintf("heartbeat statements missed (over %v, or failed) while %s", r.interval, what), want: "0"}
	if len(s.statements) == 0 {
		g.got, g.met = fmt.Sprintf("no statement (%s took under one interval)", what), "n/a"
		return g
	}
	g.got = fmt.Sprintf("%d of %d (%s)", s.missed, len(s.statements), s.durations())
	g.met = yes(s.missed == 0)
	return g
}

func (r results) goals() []goal {
	return []goal{
		{fmt.Sprintf("heartbeat statements for %d leases every %v, alone", r.leases, r.interval), "(reference)",
			fmt.Sprintf("%d missed of %d (%s)", r.quiet.missed, len(r.quiet.statements), r.quiet.durations()), ""},
		r.missedGoal(fmt.Sprintf("listing %d rows", r.listed), r.listing),
		{"leases lost while listing", "0", fmt.Sprint(r.listing.lost), yes(r.listing.lost == 0)},
		{fmt.Sprintf("rows listed per second, pages of %d", listPage), "(figure)",
			fmt.Sprintf("%.0f (%d rows in %v, %.1f ms a page)", r.listRate(), r.listed, r.listTook.Round(time.Millisecond), r.listTook.Seconds()*1000/float64(r.pages)), ""},
		r.missedGoal(fmt.Sprintf("pruning %d rows", r.rows), r.pruning),
		{"leases lost while pruning", "0", fmt.Sprint(r.pruning.lost), yes(r.pruning.lost == 0)},
		{"expired rows pruned; live leases kept", "all; all",
			fmt.Sprintf("%d of %d; %d of %d", r.pruned, r.rows, r.liveLeft, r.leases), yes(r.pruned == int64(r.rows) && r.liveLeft == r.leases)},
		{"rows pruned per second", "(figure)",
			fmt.Sprintf("%.0f (%d rows in %v)", r.pruneRate(), r.pruned, r.pruneTook.Round(time.Millisecond)), ""},
	}
}

// section returns the results as the operations section of
// docs/performance.md.
func (r results) section() string {
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	p("## Operations: listing and pruning at scale\n\n")
	p("Generated by `cd bench && go run ./opsbench -out ../docs/performance.md` (%s, %d CPUs, PostgreSQL %s, fsync on; run took %s), with %d expired rows and %d live leases heartbeating every %v.\n\n",
		r.started.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), r.version, r.took.Round(time.Second), r.rows, r.leases, r.interval)
	p("| measure | goal | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.goals() {
		p("| %s | %s | %s | %s |\n", g.measure, g.want, g.got, g.met)
	}
	p("\n**How it is measured.** One INSERT ... SELECT FROM generate_series writes %d lease rows whose leases expired two hours ago; a Runner then takes %d leases with a one-minute timeout, each in a Run whose work waits, and VACUUM ANALYZE runs on the table. "+
		"The Runner's heartbeat group renews the live leases every %[3]v, on a pool of its own (WithHeartbeatDB), in statements of up to 1,000 leases each spread over the interval, and an Observer (WithObserver) records each statement: one is missed when it takes longer than the interval or fails; a lease lost (the Runner's EventLeaseLost or EventSelfFenced) is counted apart. "+
		"The heartbeats first run alone for five intervals, for reference. Then admin.Operator.List pages through every row of the table, %[4]d at a time, each page starting after the last page's target ID; then admin.Operator.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour}) deletes the expired rows in its default batches, while the live leases must stay, as a List of the live leases checks afterwards. "+
		"Each window counts the statements that ended in it. The table lives in a schema of its own on the same server as the main report's, which other processes shared.\n",
		r.rows, r.leases, r.interval, listPage)
	return s.String()
}
