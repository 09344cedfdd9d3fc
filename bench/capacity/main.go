// Command capacity measures how far one PostgreSQL server goes with
// gormlease, in two figures:
//
//   - jobs/s: the rate of full jobs (Runner.Run: acquire, a short piece of
//     work, the fenced commit of a one-row saver that also releases) that N
//     goroutines sustain on one Runner, each job on a target of its own;
//   - leases held: how many leases one process holds at once, each in a Run
//     whose work waits, while the Runner's batched heartbeats keep every one
//     of them renewed: the duration of each heartbeat round against the
//     interval, the oldest heartbeat in the table, and any lease lost.
//
// The full setting (the defaults) takes about ten minutes and uses the
// library's default heartbeat interval and lease timeout:
//
//	cd bench && go run ./capacity -out ../docs/scaling.md
//
// writes its results as the capacity section of docs/scaling.md, between the
// markers <!-- capacity:begin --> and <!-- capacity:end -->. The short
// setting, -short, runs one small point of each in about half a minute, with
// a 1 s heartbeat, and checks that the command works; its figures are not
// meant to be published.
//
// It works in a schema of its own, gormlease_capacity, dropped at the start
// and at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/bench/internal/opsection"
	"github.com/gormlease/gormlease/observe"
)

// schema is where the command makes its tables.
const schema = "gormlease_capacity"

// options are the command's flags.
type options struct {
	dsn      string
	workers  []int
	duration time.Duration
	work     time.Duration
	pool     int
	leases   []int
	interval time.Duration
	timeout  time.Duration
	rounds   int
	short    bool
	out      string
	profile  string
}

func main() {
	var o options
	workers := flag.String("workers", "8,32,128", "goroutines running jobs at once, one point `each`, comma-separated")
	leases := flag.String("leases", "1000,10000,50000", "leases held at once, one point `each`, comma-separated")
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long each jobs/s point runs")
	flag.DurationVar(&o.work, "work", time.Millisecond, "the work of each job (a sleep)")
	flag.IntVar(&o.pool, "pool", 32, "the connection pool's size (SetMaxOpenConns)")
	flag.DurationVar(&o.interval, "interval", gormlease.DefaultHeartbeatInterval, "heartbeat interval of the leases-held points")
	flag.DurationVar(&o.timeout, "timeout", gormlease.DefaultLeaseTimeout, "lease timeout of the leases-held points")
	flag.IntVar(&o.rounds, "rounds", 3, "heartbeat rounds measured at each leases-held point")
	flag.BoolVar(&o.short, "short", false, "a quick check that the command works: -workers 8 -duration 2s -leases 1000 -interval 1s -timeout 4s -rounds 2")
	flag.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of the leases-held points' measuring windows to this `file`")
	flag.StringVar(&o.out, "out", "", "write the results as the capacity section of this Markdown `file` (docs/scaling.md)")
	flag.Parse()
	var err error
	if o.workers, err = ints(*workers); err != nil {
		log.Fatalf("-workers: %v", err)
	}
	if o.leases, err = ints(*leases); err != nil {
		log.Fatalf("-leases: %v", err)
	}
	if o.short {
		o.workers, o.duration, o.leases, o.interval, o.timeout, o.rounds = []int{8}, 2*time.Second, []int{1000}, time.Second, 4*time.Second, 2
	}
	if err := measureAndWrite(o); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// ints parses a comma-separated list of positive integers.
func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func measureAndWrite(o options) error {
	// Check the file's markers before the run, not after it.
	if o.out != "" {
		if _, err := sectionPut(o.out, ""); err != nil {
			return err
		}
	}
	r, err := run(o)
	if err != nil {
		return err
	}
	if bad := r.failures(); bad != "" {
		return errors.New("capacity: " + bad)
	}
	if o.out == "" {
		return nil
	}
	doc, err := sectionPut(o.out, r.section())
	if err != nil {
		return err
	}
	return opsection.Write(o.out, doc)
}

// sectionPut returns the file at path with section as its capacity
// section.
func sectionPut(path, section string) (string, error) {
	return opsection.Capacity.PutIn(path, section)
}

// results are what a run measured.
type results struct {
	o       options
	version string
	maxConn string
	started time.Time
	took    time.Duration
	jobs    []jobPoint
	held    []heldPoint
}

// jobPoint is one jobs/s point.
type jobPoint struct {
	workers  int
	jobs     int
	took     time.Duration
	p50, p99 time.Duration
	errs     int
	firstErr error
}

func (p jobPoint) rate() float64 { return float64(p.jobs) / p.took.Seconds() }

// heldPoint is one leases-held point.
type heldPoint struct {
	leases   int
	acquire  time.Duration // until every lease was held
	rounds   []round
	maxAge   time.Duration // oldest heartbeat seen in the table
	lost     int64
	runErrs  int64 // Runs that ended with an error other than the one that ends their work
	firstErr error
	// cpu is the process's CPU time over the measuring window, a fraction
	// of one core; perSec the heartbeat statements a second over it.
	cpu, perSec float64
}

// round is one heartbeat round: the statements of a beat of the Runner's
// heartbeat group, from the first one's start to the last one's end.
type round struct {
	start, end time.Time
	statements int
	renewed    int
	failed     int
}

func (r round) duration() time.Duration { return r.end.Sub(r.start) }

func run(o options) (results, error) {
	ctx := context.Background()
	r := results{o: o, started: time.Now()}
	admin, err := gorm.Open(postgres.Open(o.dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	if sqlDB, err := admin.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := admin.Exec("DROP SCHEMA IF EXISTS " + schema + " CASCADE; CREATE SCHEMA " + schema).Error; err != nil {
		return r, err
	}
	defer admin.Exec("DROP SCHEMA IF EXISTS " + schema + " CASCADE")
	if err := admin.Raw("SELECT current_setting('server_version')").Scan(&r.version).Error; err != nil {
		return r, err
	}
	if err := admin.Raw("SELECT current_setting('max_connections')").Scan(&r.maxConn).Error; err != nil {
		return r, err
	}
	sep := "?"
	if strings.Contains(o.dsn, "?") {
		sep = "&"
	}
	db, err := gorm.Open(postgres.Open(o.dsn+sep+"search_path="+schema), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return r, err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(o.pool)
	sqlDB.SetMaxIdleConns(o.pool)
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return r, err
	}
	for _, n := range o.workers {
		p, err := jobs(ctx, db, o, n)
		if err != nil {
			return r, err
		}
		fmt.Printf("jobs/s: %d workers: %d jobs in %v: %.0f jobs/s, p50 %v, p99 %v, %d errors\n",
			n, p.jobs, p.took.Round(time.Millisecond), p.rate(), p.p50, p.p99, p.errs)
		r.jobs = append(r.jobs, p)
	}
	for _, n := range o.leases {
		p, err := hold(ctx, db, admin, o, n)
		if err != nil {
			return r, err
		}
		fmt.Println(p)
		r.held = append(r.held, p)
	}
	r.took = time.Since(r.started)
	return r, nil
}

// jobs runs full jobs on workers goroutines for o.duration, each job on a
// target of its own, and measures them.
func jobs(ctx context.Context, db *gorm.DB, o options, workers int) (jobPoint, error) {
	p := jobPoint{workers: workers}
	runner, err := gormlease.NewRunner[int](db)
	if err != nil {
		return p, err
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		seq       atomic.Int64
		wg        sync.WaitGroup
	)
	deadline := time.Now().Add(o.duration)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				target := fmt.Sprintf("job/%d/%d", workers, seq.Add(1))
				begin := time.Now()
				_, err := runner.Run(ctx, target, func(context.Context) (int, error) {
					time.Sleep(o.work)
					return w, nil
				}, gormlease.SaveJSON[int])
				if err != nil {
					mu.Lock()
					p.errs++
					if p.firstErr == nil {
						p.firstErr = err
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, time.Since(begin))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	p.took = time.Since(start)
	p.jobs = len(latencies)
	slices.Sort(latencies)
	if len(latencies) > 0 {
		p.p50 = latencies[len(latencies)/2].Round(10 * time.Microsecond)
		p.p99 = latencies[len(latencies)*99/100].Round(10 * time.Microsecond)
	}
	return p, nil
}

// beats records the heartbeat statements of a Runner, as its Observer.
type beats struct {
	mu    sync.Mutex
	stmts []beat
	lost  atomic.Int64
}

// beat is one heartbeat statement.
type beat struct {
	start, end time.Time
	leases     int
	failed     bool
}

func (b *beats) Start(ctx context.Context, _ observe.Span) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (b *beats) Record(_ context.Context, e observe.Event) {
	switch e.Kind {
	case observe.EventHeartbeat:
		end := time.Now()
		b.mu.Lock()
		b.stmts = append(b.stmts, beat{start: end.Add(-e.Duration), end: end, leases: e.Leases, failed: e.Err != nil})
		b.mu.Unlock()
	case observe.EventLeaseLost, observe.EventSelfFenced, observe.EventMaxHoldExceeded:
		b.lost.Add(1)
	}
}

// rounds groups the statements that started at or after since into rounds
// of leases each: a statement starts a new round when the round so far has
// renewed (or failed) that many, or when it starts more than half an
// interval after the last one began, so that rounds that run back to back,
// as a round that lasts the whole interval does, stay apart. The first
// round may have begun before since: callers leave it out.
func (b *beats) rounds(since time.Time, interval time.Duration, leases int) []round {
	b.mu.Lock()
	stmts := slices.Clone(b.stmts)
	b.mu.Unlock()
	slices.SortFunc(stmts, func(x, y beat) int { return x.start.Compare(y.start) })
	var out []round
	var last time.Time
	for _, s := range stmts {
		if s.start.Before(since) {
			continue
		}
		if len(out) == 0 || s.start.Sub(last) > interval/2 || out[len(out)-1].renewed+out[len(out)-1].failed >= leases {
			out = append(out, round{start: s.start, end: s.end})
		}
		last = s.start
		r := &out[len(out)-1]
		if s.end.After(r.end) {
			r.end = s.end
		}
		r.statements++
		if s.failed {
			r.failed += s.leases
		} else {
			r.renewed += s.leases
		}
	}
	return out
}

// errStop ends the work of the held leases.
var errStop = errors.New("stop holding")

// hold holds n leases at once on one Runner and measures o.rounds heartbeat
// rounds after every lease is held.
func hold(ctx context.Context, db, admin *gorm.DB, o options, n int) (heldPoint, error) {
	p := heldPoint{leases: n}
	obs := &beats{}
	opts := []gormlease.Option{gormlease.WithObserver(obs)}
	if o.interval != gormlease.DefaultHeartbeatInterval || o.timeout != gormlease.DefaultLeaseTimeout {
		opts = append(opts, gormlease.WithHeartbeatInterval(o.interval), gormlease.WithLeaseTimeout(o.timeout))
	}
	runner, err := gormlease.NewRunner[int](db, opts...)
	if err != nil {
		return p, err
	}
	stop := make(chan struct{})
	var (
		held, lost, runErrs atomic.Int64
		wg                  sync.WaitGroup
		mu                  sync.Mutex
	)
	start := time.Now()
	prefix := fmt.Sprintf("held/%d/", n)
	// At most half the pool's connections acquire at once, so that the
	// heartbeats of the leases already held find a connection while the
	// rest are acquired, as in a process whose jobs start over time.
	acquiring := make(chan struct{}, max(1, o.pool/2))
	for i := range n {
		acquiring <- struct{}{}
		wg.Go(func() {
			var once sync.Once
			free := func() { once.Do(func() { <-acquiring }) }
			defer free()
			_, err := runner.Run(ctx, fmt.Sprintf("%s%06d", prefix, i), func(ctx context.Context) (int, error) {
				free()
				held.Add(1)
				select {
				case <-stop:
					return 0, errStop
				case <-ctx.Done():
					return 0, context.Cause(ctx)
				}
			}, gormlease.SaveJSON[int])
			switch {
			case errors.Is(err, errStop):
			case errors.Is(err, gormlease.ErrLeaseLost):
				lost.Add(1)
			default:
				runErrs.Add(1)
				mu.Lock()
				if p.firstErr == nil {
					p.firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	finish := func() {
		close(stop)
		wg.Wait()
		p.lost = max(lost.Load(), obs.lost.Load())
		p.runErrs = runErrs.Load()
	}
	// Every lease held: the acquires take a connection each, n of them.
	for held.Load() < int64(n) {
		if runErrs.Load() > 0 || lost.Load() > 0 || time.Since(start) > 10*time.Minute {
			finish()
			return p, fmt.Errorf("holding %d leases: %d held after %v, %d lost, first error: %v",
				n, held.Load(), time.Since(start).Round(time.Second), p.lost, p.firstErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.acquire = time.Since(start)
	allHeld := time.Now()
	// o.rounds whole rounds that began after every lease was held: wait for
	// the one after them to begin, or its time to pass.
	ageSQL := `SELECT COALESCE(CAST(EXTRACT(EPOCH FROM max(clock_timestamp() - updated_at)) AS double precision), 0)
FROM ` + schema + `.job_lease WHERE released_at IS NULL AND target_id LIKE '` + prefix + `%'`
	limit := allHeld.Add(time.Duration(o.rounds+3) * o.interval)
	cpu0 := cpuTime()
	stopProfile := func() {}
	if o.profile != "" {
		if f, err := os.Create(o.profile); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
			}
		}
	}
	for len(obs.rounds(allHeld, o.interval, n)) <= o.rounds+1 && time.Now().Before(limit) {
		var age float64
		if err := admin.Raw(ageSQL).Scan(&age).Error; err == nil {
			p.maxAge = max(p.maxAge, time.Duration(age*float64(time.Second)))
		}
		time.Sleep(o.interval / 4)
	}
	window := time.Since(allHeld)
	p.cpu = (cpuTime() - cpu0).Seconds() / window.Seconds()
	stopProfile()
	rounds := obs.rounds(allHeld, o.interval, n)
	if len(rounds) > 0 {
		rounds = rounds[1:]
	}
	p.rounds = rounds[:min(len(rounds), o.rounds)]
	if len(p.rounds) > 1 {
		// From the first measured round's start to the next round's start.
		var stmts int
		for _, r := range p.rounds[:len(p.rounds)-1] {
			stmts += r.statements
		}
		p.perSec = float64(stmts) / p.rounds[len(p.rounds)-1].start.Sub(p.rounds[0].start).Seconds()
	}
	finish()
	return p, nil
}

func (p heldPoint) String() string {
	return fmt.Sprintf("leases held: %d leases held in %v; rounds %s; oldest heartbeat %v; lost %d; other errors %d; CPU %.1f%% of a core; %.1f statements/s",
		p.leases, p.acquire.Round(time.Millisecond), p.roundSummary(), p.maxAge.Round(time.Millisecond), p.lost, p.runErrs, 100*p.cpu, p.perSec)
}

// roundSummary is the rounds' durations and what they renewed.
func (p heldPoint) roundSummary() string {
	if len(p.rounds) == 0 {
		return "none measured"
	}
	var parts []string
	for _, r := range p.rounds {
		parts = append(parts, fmt.Sprintf("%v (%d statements, %d renewed, %d failed)",
			r.duration().Round(time.Millisecond), r.statements, r.renewed, r.failed))
	}
	return strings.Join(parts, ", ")
}

// longest is the longest round's duration.
func (p heldPoint) longest() time.Duration {
	var d time.Duration
	for _, r := range p.rounds {
		d = max(d, r.duration())
	}
	return d
}

// onTime reports whether every measured round renewed every lease within
// the interval, and nothing was lost.
func (p heldPoint) onTime(interval time.Duration) bool {
	if len(p.rounds) == 0 || p.lost > 0 || p.runErrs > 0 {
		return false
	}
	for _, r := range p.rounds {
		if r.failed > 0 || r.renewed < p.leases || r.duration() > interval {
			return false
		}
	}
	return true
}

// failures says what went wrong in the run, or "" when nothing did: errors
// of jobs, leases lost, or rounds that measured nothing.
func (r results) failures() string {
	var bad []string
	for _, p := range r.jobs {
		if p.errs > 0 || p.jobs == 0 {
			bad = append(bad, fmt.Sprintf("%d workers: %d jobs, %d errors, the first: %v", p.workers, p.jobs, p.errs, p.firstErr))
		}
	}
	for _, p := range r.held {
		if p.lost > 0 || p.runErrs > 0 || len(p.rounds) == 0 {
			bad = append(bad, fmt.Sprintf("%d leases: %d lost, %d other errors (the first: %v), %d rounds measured",
				p.leases, p.lost, p.runErrs, p.firstErr, len(p.rounds)))
		}
	}
	return strings.Join(bad, "; ")
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// section returns the results as the capacity section of docs/scaling.md.
func (r results) section() string {
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	o := r.o
	cmd := strings.Join(append([]string{"cd bench && go run ./capacity"}, os.Args[1:]...), " ")
	p("Generated by `%s` (%s, %d CPUs, PostgreSQL %s, max_connections %s; run took %s).",
		cmd, r.started.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), r.version, r.maxConn, r.took.Round(time.Second))
	if o.short {
		p(" **Short setting: a check that the command works, not figures to rely on.**")
	}
	p("\n\n**Jobs per second.** Full jobs (Runner.Run: acquire, %v of work, fenced commit of SaveJSON that also releases), each on a target of its own, on one Runner with a pool of %d connections, for %v a point.\n\n",
		o.work, o.pool, o.duration)
	p("| goroutines | jobs/s | p50 ms | p99 ms | jobs | errors |\n|---|---|---|---|---|---|\n")
	for _, j := range r.jobs {
		p("| %d | %.0f | %.2f | %.2f | %d | %d |\n", j.workers, j.rate(), ms(j.p50), ms(j.p99), j.jobs, j.errs)
	}
	p("\n**Leases held by one process.** Each lease is held by a Run whose work waits; the Runner renews them all in batched heartbeats (one statement per 1,000 leases, up to 4 at once) every %v, lease timeout %v; %d rounds measured per point, after every lease was held.\n\n",
		o.interval, o.timeout, o.rounds)
	p("| leases | time to acquire them all | longest heartbeat round | round / interval | heartbeat statements/s | oldest heartbeat seen | client CPU, %% of a core | renewed on time | lost |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, h := range r.held {
		p("| %d | %v | %v | %.1f%% | %.1f | %v | %.1f%% | %s | %d |\n", h.leases, h.acquire.Round(time.Millisecond), h.longest().Round(time.Millisecond),
			100*h.longest().Seconds()/o.interval.Seconds(), h.perSec, h.maxAge.Round(time.Millisecond), 100*h.cpu, yes(h.onTime(o.interval)), h.lost)
	}
	p("\n*Round* runs from the start of a round's first heartbeat statement to the end of its last (the Runner's Observer reports each statement). *Oldest heartbeat seen* is the largest `clock_timestamp() - updated_at` over the held rows, read every quarter of an interval (the read scans every held row): a lease is renewed on time while it stays under the interval plus a round. *Renewed on time*: every measured round renewed every lease and took less than the interval, and no Run lost its lease.\n")
	return s.String()
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
