// Command capacity measures how far one PostgreSQL server goes with
// gormlease, in two figures:
//
//   - jobs/s: the rate of full jobs (Runner.Run: acquire, a short piece of
//     work, the fenced commit of a one-row saver that also releases) that N
//     goroutines sustain on one Runner, each job on a target of its own;
//   - leases held: how many leases one process holds at once, each in a Run
//     whose work waits, while the Runner's batched heartbeats keep every one
//     of them renewed: the heartbeat statements' rate and time, each
//     lease's renewal period, the oldest heartbeat in the table, the
//     process's CPU and allocations, and any lease lost.
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
	"github.com/gormlease/gormlease/bench/internal/procstat"
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
	memProf  string
	analyze  bool
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
	flag.IntVar(&o.rounds, "rounds", 3, "heartbeat intervals measured at each leases-held point (and at least 30s, but with -short)")
	flag.BoolVar(&o.short, "short", false, "a quick check that the command works: -workers 8 -duration 2s -leases 1000 -interval 1s -timeout 4s -rounds 2")
	flag.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of the leases-held points' measuring windows to this `file`")
	flag.StringVar(&o.memProf, "memprofile", "", "write the allocations of the leases-held points' measuring windows to this `file` (and those before them to file.base, for pprof -base)")
	flag.BoolVar(&o.analyze, "analyze", true, "ANALYZE the lease table as autovacuum would: each time a tenth more of a leases-held point's leases are held, and once all are")
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

// window is how long each leases-held point is measured: o.rounds
// intervals, and at least 30s but in the short setting, so that the window
// of a short interval has its share of garbage collections.
func (o options) window() time.Duration {
	w := time.Duration(o.rounds) * o.interval
	if o.short {
		return w
	}
	return max(w, 30*time.Second)
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
	load    string // the load averages at the start
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
	window   time.Duration // the measuring window
	maxAge   time.Duration // oldest heartbeat seen in the table
	ageRead  time.Duration // the longest read of it
	lost     int64
	runErrs  int64 // Runs that ended with an error other than the one that ends their work
	firstErr error
	// The heartbeat statements that began in the window: how many, the
	// leases they renewed and those of the failed ones, their median and
	// longest time, and the mean number in flight (their total time over
	// the window's).
	statements, renewed, failed int
	stmtP50, stmtMax            time.Duration
	inFlight                    float64
	// The renewal period of the sampled leases (the time between two
	// heartbeats that renewed a lease, as sent, and from the last one to
	// the window's end): median and longest; sampled counts the leases,
	// unrenewed those that no heartbeat renewed in the window.
	periodP50, periodMax time.Duration
	sampled, unrenewed   int
	// cpu is the process's CPU time over the window, a fraction of one
	// core; allocRate the bytes it allocated a second; gcs the garbage
	// collections that ended in it.
	cpu, allocRate float64
	gcs            uint32
	server         serverLoad
}

// perSec is the heartbeat statements a second over the window.
func (p heldPoint) perSec() float64 { return float64(p.statements) / p.window.Seconds() }

func run(o options) (results, error) {
	ctx := context.Background()
	r := results{o: o, started: time.Now(), load: loadAverage()}
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
	db, err := gorm.Open(postgres.Open(o.dsn+sep+"search_path="+schema+"&application_name="+schema), &gorm.Config{Logger: logger.Discard})
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

// beats records the heartbeat statements of a Runner, and the renewals of
// a sample of its leases (those whose target ends in "00": one in a
// hundred), as its Observer.
type beats struct {
	mu       sync.Mutex
	stmts    []beat
	renewals map[string][]time.Time // of the sampled leases, sent in the window
	since    time.Time              // the window's start; zero before
	lost     atomic.Int64
}

// beat is one heartbeat statement.
type beat struct {
	start, end time.Time
	leases     int
	failed     bool
}

// sampled reports whether target is one of the leases whose renewals are
// recorded.
func sampled(target string) bool { return strings.HasSuffix(target, "00") }

func (b *beats) Start(ctx context.Context, s observe.Span) (context.Context, func(error)) {
	if s.Kind != observe.SpanHeartbeat || !sampled(s.TargetID) {
		return ctx, func(error) {}
	}
	// Copies, so that only a sampled lease's span allocates a closure.
	target, sent := s.TargetID, s.Start
	return ctx, func(err error) {
		if err != nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.since.IsZero() && !sent.Before(b.since) {
			b.renewals[target] = append(b.renewals[target], sent)
		}
	}
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

// begin starts the window at since.
func (b *beats) begin(since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.since, b.renewals = since, map[string][]time.Time{}
}

// measure fills p's statement and renewal figures for the window from
// since to until, for n leases whose targets are prefix and six digits.
func (b *beats) measure(p *heldPoint, since, until time.Time, prefix string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var times []time.Duration
	var busy time.Duration
	for _, s := range b.stmts {
		if s.start.Before(since) || !s.start.Before(until) {
			continue
		}
		p.statements++
		if s.failed {
			p.failed += s.leases
		} else {
			p.renewed += s.leases
		}
		d := s.end.Sub(s.start)
		times = append(times, d)
		busy += d
	}
	p.stmtP50, p.stmtMax = median(times), slices.Max(append(times, 0))
	p.inFlight = busy.Seconds() / until.Sub(since).Seconds()
	var periods []time.Duration
	for i := range n {
		target := fmt.Sprintf("%s%06d", prefix, i)
		if !sampled(target) {
			continue
		}
		p.sampled++
		sent := b.renewals[target]
		if len(sent) == 0 {
			p.unrenewed++
			continue
		}
		slices.SortFunc(sent, func(x, y time.Time) int { return x.Compare(y) })
		for j := 1; j < len(sent); j++ {
			periods = append(periods, sent[j].Sub(sent[j-1]))
		}
		// Not a period, but no more than the next one will be.
		p.periodMax = max(p.periodMax, until.Sub(sent[len(sent)-1]))
	}
	p.periodP50, p.periodMax = median(periods), max(p.periodMax, slices.Max(append(periods, 0)))
}

// median returns the median of ds, which it sorts, or 0.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// errStop ends the work of the held leases.
var errStop = errors.New("stop holding")

// hold holds n leases at once on one Runner and measures o.rounds heartbeat
// intervals after every lease is held.
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
	// The lease table's statistics, as autovacuum's analyze keeps them
	// where it runs (by default once a tenth of the rows changed): without
	// them, the planner may renew a batch by scanning the whole table.
	analyze := func() error {
		if !o.analyze {
			return nil
		}
		return admin.Exec("ANALYZE " + schema + ".job_lease").Error
	}
	analyzed := int64(0)
	for held.Load() < int64(n) {
		if runErrs.Load() > 0 || lost.Load() > 0 || time.Since(start) > 10*time.Minute {
			finish()
			return p, fmt.Errorf("holding %d leases: %d held after %v, %d lost, first error: %v",
				n, held.Load(), time.Since(start).Round(time.Second), p.lost, p.firstErr)
		}
		if h := held.Load(); h >= analyzed+int64(n/10) {
			if err := analyze(); err != nil {
				finish()
				return p, err
			}
			analyzed = h
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.acquire = time.Since(start)
	if err := analyze(); err != nil {
		finish()
		return p, err
	}
	// The window starts after a collection, so that the garbage of the n
	// acquires is not counted against the heartbeats, and two intervals
	// later, so that the heartbeats that the acquires delayed are sent.
	runtime.GC()
	time.Sleep(2 * o.interval)
	since := time.Now()
	obs.begin(since)
	// now(), not clock_timestamp(): the rows read are those of the
	// statement's snapshot, taken as it began, however long it scans.
	ageSQL := `SELECT COALESCE(CAST(EXTRACT(EPOCH FROM max(now() - updated_at)) AS double precision), 0)
FROM ` + schema + `.job_lease WHERE released_at IS NULL AND target_id LIKE '` + prefix + `%'`
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	srv0 := readServer(admin)
	writeAllocs(o.memProf, ".base")
	cpu0 := cpuTime()
	stopProfile := func() {}
	if o.profile != "" {
		if f, err := os.Create(o.profile); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
			}
		}
	}
	for until := since.Add(o.window()); time.Now().Before(until); {
		var age float64
		begin := time.Now()
		if err := admin.Raw(ageSQL).Scan(&age).Error; err == nil {
			p.maxAge = max(p.maxAge, time.Duration(age*float64(time.Second)))
		}
		p.ageRead = max(p.ageRead, time.Since(begin))
		time.Sleep(o.interval / 4)
	}
	until := time.Now()
	p.window = until.Sub(since)
	p.cpu = (cpuTime() - cpu0).Seconds() / p.window.Seconds()
	srv1 := readServer(admin)
	writeAllocs(o.memProf, "")
	runtime.ReadMemStats(&mem1)
	stopProfile()
	p.allocRate = float64(mem1.TotalAlloc-mem0.TotalAlloc) / p.window.Seconds()
	p.gcs = mem1.NumGC - mem0.NumGC
	p.server = srv1.since(srv0, p.window)
	obs.measure(&p, since, until, prefix, n)
	finish()
	return p, nil
}

func (p heldPoint) String() string {
	return fmt.Sprintf("leases held: %d leases held in %v; over %v: %d statements (%.1f/s, %d leases renewed, %d failed), "+
		"statement time median %v, max %v, %.2f in flight; renewal period median %v, max %v (%d leases sampled, %d unrenewed); "+
		"oldest heartbeat %v (longest read %v); lost %d; other errors %d; CPU %.1f%% of a core; %.1f MB/s allocated, %d GCs; "+
		"server: its backends %.1f%% of a core, WAL %.1f MB/s, %.0f records/s, %.0f full pages/s, lease table %.1f seq scans/s, %.0f index scans/s, %.0f%% HOT",
		p.leases, p.acquire.Round(time.Millisecond), p.window.Round(time.Millisecond), p.statements, p.perSec(), p.renewed, p.failed,
		p.stmtP50.Round(100*time.Microsecond), p.stmtMax.Round(100*time.Microsecond), p.inFlight,
		p.periodP50.Round(time.Millisecond), p.periodMax.Round(time.Millisecond), p.sampled, p.unrenewed,
		p.maxAge.Round(time.Millisecond), p.ageRead.Round(time.Millisecond), p.lost, p.runErrs, 100*p.cpu, p.allocRate/1e6, p.gcs,
		100*p.server.cpu, p.server.walBytes/1e6, p.server.walRecords, p.server.walFPI, p.server.seqScans, p.server.idxScans, 100*p.server.hot)
}

// onTime reports whether no lease was lost, no statement failed, and every
// sampled lease was renewed in the window, each time within a fifth of an
// interval of the interval after the last.
func (p heldPoint) onTime(interval time.Duration) bool {
	return p.sampled > 0 && p.unrenewed == 0 && p.lost == 0 && p.runErrs == 0 && p.failed == 0 &&
		p.periodMax <= interval+interval/5
}

// failures says what went wrong in the run, or "" when nothing did: errors
// of jobs, leases lost, or windows that measured no statement.
func (r results) failures() string {
	var bad []string
	for _, p := range r.jobs {
		if p.errs > 0 || p.jobs == 0 {
			bad = append(bad, fmt.Sprintf("%d workers: %d jobs, %d errors, the first: %v", p.workers, p.jobs, p.errs, p.firstErr))
		}
	}
	for _, p := range r.held {
		if p.lost > 0 || p.runErrs > 0 || p.statements == 0 {
			bad = append(bad, fmt.Sprintf("%d leases: %d lost, %d other errors (the first: %v), %d statements measured",
				p.leases, p.lost, p.runErrs, p.firstErr, p.statements))
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
	p("\n**Leases held by one process.** Each lease is held by a Run whose work waits; the Runner renews them all in batched heartbeats every %v (one statement per 1,000 leases, each batch at a phase of its own, spread over the interval; up to 4 statements at once), lease timeout %v; measured over %v a point, from two intervals after every lease was held and the garbage of the acquires collected.",
		o.interval, o.timeout, o.window())
	if o.analyze {
		p(" The lease table is analyzed each time a tenth more of the leases are held, and once all are, as autovacuum would where it runs.")
	}
	p("\n\n")
	p("| leases | time to acquire them all | heartbeat statements/s | statement time, median / max | statements in flight, mean | a lease's round (renewal period), median / max | oldest heartbeat seen | client CPU, %% of a core | allocated, MB/s (GC cycles) | renewed on time | lost |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, h := range r.held {
		p("| %d | %v | %.1f | %.1f / %.1f ms | %.2f | %v / %v | %v | %.1f%% | %.1f (%d) | %s | %d |\n", h.leases, h.acquire.Round(time.Millisecond),
			h.perSec(), ms(h.stmtP50), ms(h.stmtMax), h.inFlight, h.periodP50.Round(time.Millisecond), h.periodMax.Round(time.Millisecond),
			h.maxAge.Round(time.Millisecond), 100*h.cpu, h.allocRate/1e6, h.gcs, yes(h.onTime(o.interval)), h.lost)
	}
	p("\n*Statement time* is from a heartbeat statement's sending to its answer, and *in flight* their total time over the window's (the Runner's Observer reports each statement). *A lease's round* is the time between two heartbeats that renewed one lease, as sent, over one lease in a hundred (and from its last heartbeat to the window's end). *Oldest heartbeat seen* is the largest `now() - updated_at` over the held rows (the time of the read's snapshot less that of the last committed heartbeat), read every quarter of an interval (the read scans every held row). *Renewed on time*: no lease lost, no statement failed, and every sampled lease renewed at least once every 1.2 intervals. *Client CPU* is the process's user and system time over the window, with every lease's Run parked in its work and the age read in it.")
	for _, h := range r.held {
		p(" At %d leases, the server over the window:", h.leases)
		if h.server.cpu > 0 {
			p(" its processes that serve the pool took %.1f%% of a core;", 100*h.server.cpu)
		}
		p(" it wrote %.1f MB/s of WAL (%.0f records/s, %.0f full pages/s, the whole server's), and scanned the lease table %.1f times a second and its primary key %.0f times, %.0f%% of its updates HOT.",
			h.server.walBytes/1e6, h.server.walRecords, h.server.walFPI, h.server.seqScans, h.server.idxScans, 100*h.server.hot)
	}
	if r.load != "" {
		p(" Load average (1, 5, 15 min) at the start of the run: %s; at the end: %s.", r.load, loadAverage())
	}
	p("\n")
	return s.String()
}

// server is what the server did so far: the CPU time of the processes
// that serve the command's pool (when they run on this machine, whose /proc
// the command reads; zero otherwise) and the WAL that the whole server
// wrote.
type server struct {
	cpu                 time.Duration
	walBytes            int64
	walRecords          int64
	walFPI              int64
	seqScans, idxScans  int64 // of the lease table
	hotUpdates, updates int64 // of the lease table
}

// serverLoad is what the server did over a window, a second.
type serverLoad struct {
	cpu                          float64 // a fraction of one core; 0 when unknown
	walBytes, walRecords, walFPI float64
	seqScans, idxScans           float64 // of the lease table
	hot                          float64 // the share of the table's updates that were HOT
}

// readServer reads the server's figures so far, through admin.
func readServer(admin *gorm.DB) server {
	var s server
	var pids []int
	if err := admin.Raw("SELECT pid FROM pg_stat_activity WHERE application_name = ?", schema).Scan(&pids).Error; err == nil {
		for _, pid := range pids {
			s.cpu += procstat.CPU(pid)
		}
	}
	_ = admin.Raw("SELECT wal_bytes, wal_records, wal_fpi FROM pg_stat_wal").Row().Scan(&s.walBytes, &s.walRecords, &s.walFPI)
	_ = admin.Raw("SELECT seq_scan, COALESCE(idx_scan, 0), n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE schemaname = ? AND relname = 'job_lease'",
		schema).Row().Scan(&s.seqScans, &s.idxScans, &s.hotUpdates, &s.updates)
	return s
}

// since returns what the server did from s0 to s, over window, a second.
func (s server) since(s0 server, window time.Duration) serverLoad {
	w := window.Seconds()
	l := serverLoad{cpu: (s.cpu - s0.cpu).Seconds() / w, walBytes: float64(s.walBytes-s0.walBytes) / w,
		walRecords: float64(s.walRecords-s0.walRecords) / w, walFPI: float64(s.walFPI-s0.walFPI) / w,
		seqScans: float64(s.seqScans-s0.seqScans) / w, idxScans: float64(s.idxScans-s0.idxScans) / w}
	if n := s.updates - s0.updates; n > 0 {
		l.hot = float64(s.hotUpdates-s0.hotUpdates) / float64(n)
	}
	return l
}

// writeAllocs writes the allocations profile so far to path+suffix, unless
// path is "".
func writeAllocs(path, suffix string) {
	if path == "" {
		return
	}
	runtime.GC() // the profile is as of the last collection
	if f, err := os.Create(path + suffix); err == nil {
		_ = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
	}
}

// loadAverage returns the machine's load averages over 1, 5 and 15
// minutes, as /proc/loadavg gives them, or "" where it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], ", ")
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
