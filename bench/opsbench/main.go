// Command opsbench measures the operations of gormlease on PostgreSQL
// against heartbeats: it lists 1,000,000 rows page by page, then prunes
// them, while 10,000 live leases heartbeat every second, and reports the
// listing and pruning rates and every heartbeat round's duration. A
// heartbeat is missed when a round takes longer than the interval, fails,
// or reports a lease lost.
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
	"github.com/gormlease/gormlease/bench/internal/opsection"
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

	// quiet, listing and pruning are the heartbeat rounds with nothing
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
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	if err := admin.Exec("DROP SCHEMA IF EXISTS opsbench CASCADE; CREATE SCHEMA opsbench").Error; err != nil {
		return r, err
	}
	if err := admin.Raw("SELECT current_setting('server_version')").Scan(&r.version).Error; err != nil {
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
	beatRepo, err := gormlease.NewRepository(beatDB)
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
	leases := make([]gormlease.Lease, 0, nLeases)
	for i := range nLeases {
		l, err := repo.Acquire(ctx, fmt.Sprintf("live/%06d", i), time.Minute)
		if err != nil {
			return r, err
		}
		leases = append(leases, l)
	}
	if err := db.Exec("VACUUM ANALYZE job_lease").Error; err != nil {
		return r, err
	}

	b := &beater{repo: beatRepo, leases: leases, interval: interval}
	b.start()
	time.Sleep(5 * interval)
	r.quiet = b.take()
	fmt.Println("heartbeats, nothing else running:", r.quiet)

	start = time.Now()
	r.listed, r.pages, err = listAll(ctx, repo, gormlease.ListOptions{Limit: listPage})
	if err != nil {
		b.stop()
		return r, err
	}
	r.listTook = time.Since(start)
	r.listing = b.take()
	fmt.Printf("listed %d rows in %d pages in %v: %.0f rows/s, %.1f ms a page\n",
		r.listed, r.pages, r.listTook.Round(time.Millisecond), r.listRate(), r.listTook.Seconds()*1000/float64(r.pages))
	fmt.Println("heartbeats while listing:", r.listing)

	start = time.Now()
	r.pruned, err = repo.Prune(ctx, gormlease.PruneOptions{OlderThan: time.Hour})
	r.pruneTook = time.Since(start)
	r.pruning = b.take()
	b.stop()
	if err != nil {
		return r, err
	}
	fmt.Printf("pruned %d rows in %v: %.0f rows/s\n", r.pruned, r.pruneTook.Round(time.Millisecond), r.pruneRate())
	fmt.Println("heartbeats while pruning:", r.pruning)
	r.liveLeft, _, err = listAll(ctx, repo, gormlease.ListOptions{Prefix: "live/", State: gormlease.StateLive, Limit: 10000})
	if err != nil {
		return r, err
	}
	fmt.Printf("live leases left: %d of %d\n", r.liveLeft, nLeases)
	r.took = time.Since(r.started)
	return r, admin.Exec("DROP SCHEMA opsbench CASCADE").Error
}

// listAll lists the rows that o chooses, page after page, and counts them
// and the pages.
func listAll(ctx context.Context, repo *gormlease.Repository, o gormlease.ListOptions) (listed, pages int, err error) {
	for {
		page, err := repo.List(ctx, o)
		if err != nil {
			return listed, pages, err
		}
		listed, pages = listed+len(page), pages+1
		if len(page) < o.Limit {
			return listed, pages, nil
		}
		o.After = page[len(page)-1].TargetID
	}
}

func (r results) listRate() float64  { return float64(r.listed) / r.listTook.Seconds() }
func (r results) pruneRate() float64 { return float64(r.pruned) / r.pruneTook.Seconds() }

// beater renews leases every interval, as a Runner's heartbeat group does,
// and records each round.
type beater struct {
	repo     *gormlease.Repository
	leases   []gormlease.Lease
	interval time.Duration

	mu     sync.Mutex
	rounds []time.Duration
	missed int
	lost   int
	errs   int
	done   chan struct{}
	wg     sync.WaitGroup
}

func (b *beater) start() {
	b.done = make(chan struct{})
	b.wg.Go(func() {
		t := time.NewTicker(b.interval)
		defer t.Stop()
		for {
			select {
			case <-b.done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), b.interval)
			begin := time.Now()
			lost, err := b.repo.HeartbeatMany(ctx, b.leases)
			d := time.Since(begin)
			cancel()
			b.mu.Lock()
			b.rounds = append(b.rounds, d)
			b.lost += len(lost)
			if err != nil {
				b.errs++
			}
			if d > b.interval || err != nil || len(lost) > 0 {
				b.missed++
			}
			b.mu.Unlock()
		}
	})
}

func (b *beater) stop() { close(b.done); b.wg.Wait() }

// stats are the heartbeat rounds of a window, sorted by duration.
type stats struct {
	rounds []time.Duration
	// missed counts the rounds over the interval, failed, or with a
	// lease lost.
	missed, lost, errs int
	leases             int
}

// take returns the rounds since the last take.
func (b *beater) take() stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := stats{rounds: b.rounds, missed: b.missed, lost: b.lost, errs: b.errs, leases: len(b.leases)}
	slices.Sort(s.rounds)
	b.rounds, b.missed, b.lost, b.errs = nil, 0, 0, 0
	return s
}

// quantile returns the q quantile of the rounds' durations.
func (s stats) quantile(q float64) time.Duration {
	return s.rounds[int(q*float64(len(s.rounds)-1))].Round(time.Millisecond)
}

// durations summarizes the rounds' durations.
func (s stats) durations() string {
	if len(s.rounds) == 0 {
		return "no round"
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v", s.quantile(0.5), s.quantile(0.99), s.quantile(1))
}

func (s stats) String() string {
	return fmt.Sprintf("%d rounds of %d leases, %s; missed %d, leases lost %d, errors %d",
		len(s.rounds), s.leases, s.durations(), s.missed, s.lost, s.errs)
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
	g := goal{measure: fmt.Sprintf("heartbeat rounds missed (over %v, failed, or a lease lost) while %s", r.interval, what), want: "0"}
	if len(s.rounds) == 0 {
		g.got, g.met = fmt.Sprintf("no round (%s took under one interval)", what), "n/a"
		return g
	}
	g.got = fmt.Sprintf("%d of %d (%s)", s.missed, len(s.rounds), s.durations())
	g.met = yes(s.missed == 0)
	return g
}

func (r results) goals() []goal {
	return []goal{
		{fmt.Sprintf("heartbeat rounds of %d leases every %v, alone", r.leases, r.interval), "(reference)",
			fmt.Sprintf("%d missed of %d (%s)", r.quiet.missed, len(r.quiet.rounds), r.quiet.durations()), ""},
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
	p("\n**How it is measured.** One INSERT ... SELECT FROM generate_series writes %d lease rows whose leases expired two hours ago; Repository.Acquire then takes %d leases with a one-minute timeout, and VACUUM ANALYZE runs on the table. "+
		"A goroutine renews all the live leases with Repository.HeartbeatMany every %[3]v, on a pool of its own (as WithHeartbeatDB gives a Runner), each round with a timeout of %[3]v; a round is missed when it takes longer than that, fails, or reports a lease lost. "+
		"The heartbeats first run alone for five intervals, for reference. Then Repository.List pages through every row of the table, %[4]d at a time, each page starting after the last page's target ID; then Repository.Prune(ctx, gormlease.PruneOptions{OlderThan: time.Hour}) deletes the expired rows in its default batches, while the live leases must stay, as a List of the live leases checks afterwards. "+
		"Each window counts the rounds that ended in it. The table lives in a schema of its own on the same server as the main report's, which other processes shared.\n",
		r.rows, r.leases, r.interval, listPage)
	return s.String()
}
