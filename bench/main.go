// Command bench measures gormlease against the alternatives on one
// PostgreSQL, in one run: a plain-SQL lease on raw pgx and through GORM,
// advisory locks, and cirello.io/pglock on lib/pq and on pgx, with its
// heartbeat goroutine per lock and with heartbeats sent by the caller. It
// prints one line per point and writes docs/performance.md from them,
// keeping the operations section that the opsbench command writes there.
//
//	cd bench && go run . -out ../docs/performance.md
//
// Both commands, for the whole report:
//
//	cd bench && go run . -out ../docs/performance.md && go run ./opsbench -out ../docs/performance.md
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/gormlease/gormlease/bench/internal/opsection"
	"github.com/gormlease/gormlease/bench/internal/runs"
)

// options are the command's flags.
type options struct {
	dsn         string
	schema      string
	duration    time.Duration
	warmup      time.Duration
	warmOps     int
	walDuration time.Duration
	leases      int
	hbWindow    time.Duration
	maxOps      int
	rounds      int
	sections    string
	impls       *regexp.Regexp
	out         string
	jsonOut     string
	waitSamples int
	// holdLeases, holdWindow, holdTimeout and holdAdvisoryMax are the
	// holding section's.
	holdLeases      []int
	holdWindow      time.Duration
	holdTimeout     time.Duration
	holdAdvisoryMax int
	holdOut         string
	// waitChild, waitTargets and waitWaiters run this command as a child
	// process of the waiting section (see spread).
	waitChild   int
	waitTargets string
	waitWaiters int
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (127.0.0.1 only)")
	flag.StringVar(&o.schema, "schema", "gormlease_bench", "schema the benchmark creates and drops")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "time each implementation runs at each lock and job point, cut in -rounds slices")
	flag.DurationVar(&o.warmup, "warmup", 100*time.Millisecond, "time each point runs before it starts counting, so that it measures warm pools and server caches")
	flag.IntVar(&o.warmOps, "warm-ops", 8, "operations each worker runs, uncounted, before a point starts counting (and for at least -warmup): PostgreSQL plans a prepared statement afresh for its first five executions on a connection")
	flag.DurationVar(&o.walDuration, "wal-duration", 300*time.Millisecond, "duration of each point that counts statements and WAL")
	flag.IntVar(&o.leases, "leases", 10000, "leases held at once in the heartbeat scenario")
	flag.DurationVar(&o.hbWindow, "hb-window", 4*time.Second, "measuring window of the heartbeat scenario")
	flag.IntVar(&o.rounds, "rounds", 15, "slices of each lock and job point; ratios are the median of the slices' ratios")
	flag.IntVar(&o.maxOps, "max-ops", 200000, "bound on operations per point")
	flag.StringVar(&o.sections, "sections", "inflight,candidates,lock,heartbeat,saturation,wait", "sections to run, comma-separated (inflight, candidates, lock, heartbeat, saturation, wait, holding): -sections inflight runs only the jobs-in-flight headline (about 4 minutes); -sections wait runs only the waiting section (about 2 minutes; with -wait-samples 16, 20 s); -sections holding holds -holding-leases leases with gormlease, pglock and advisory locks for -window each, and prints its table (docs/performance.md, \"Holding many leases\")")
	holdLeases := flag.String("holding-leases", "1000,10000,100000", "leases held at once in the holding section, one point `each`, comma-separated")
	flag.DurationVar(&o.holdWindow, "window", 60*time.Second, "measuring window of each implementation at each point of the holding section")
	flag.DurationVar(&o.holdTimeout, "holding-timeout", 20*time.Second, "the lease timeout of the holding section, to which each implementation's heartbeat is scaled as its defaults are (a quarter of it)")
	flag.StringVar(&o.holdOut, "holding-out", "", "write the holding section's table as its section of this Markdown `file` (docs/performance.md), keeping the rest of the file")
	flag.IntVar(&o.holdAdvisoryMax, "holding-advisory-max", 32, "the most advisory locks, each a connection, that the holding section holds: a shared server's connections are the other sessions' too")
	flag.IntVar(&o.waitSamples, "wait-samples", 160, "wake-up latency samples of the waiting section, with notifications and with polling each")
	flag.IntVar(&o.waitChild, "wait-child", -1, "run as child process `n` of the waiting section (internal)")
	flag.StringVar(&o.waitTargets, "wait-targets", "", "targets of a child process of the waiting section (internal)")
	flag.IntVar(&o.waitWaiters, "wait-waiters", 0, "waiters of a child process of the waiting section (internal)")
	impls := flag.String("impls", "", "run only the implementations whose names match this `regexp` in the lock and job points, as in -impls 'gormlease$|pglock' for a short check")
	flag.StringVar(&o.out, "out", "", "write the Markdown report to this file")
	flag.StringVar(&o.jsonOut, "json", "", "write the raw results as JSON to this file")
	flag.Parse()
	var err error
	if o.impls, err = regexp.Compile(*impls); err != nil {
		log.Fatalf("-impls: %v", err)
	}
	for _, f := range strings.Split(*holdLeases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			log.Fatalf("-holding-leases: %q is not a positive count", f)
		}
		o.holdLeases = append(o.holdLeases, n)
	}
	if o.waitChild >= 0 {
		if err := waitChild(o); err != nil {
			log.Fatalf("wait child %d: %v", o.waitChild, err)
		}
		return
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(o.dsn)
	if err != nil {
		return fmt.Errorf("-dsn: %w", err)
	}
	if cfg.Host != "127.0.0.1" && cfg.Host != "localhost" && cfg.Host != "::1" {
		return fmt.Errorf("-dsn: host %q: the benchmark loads the server hard, so it runs on a local one only", cfg.Host)
	}
	// An operations section in -out is carried over: check it now, not
	// after the run.
	if o.out != "" {
		if _, err := operationsOf(o.out); err != nil {
			return err
		}
	}
	if err := setupSchema(ctx, o.dsn, o.schema); err != nil {
		return err
	}
	defer dropSchema(o.dsn, o.schema)
	sep := "?"
	if strings.Contains(o.dsn, "?") {
		sep = "&"
	}
	dsn := o.dsn + sep + "search_path=" + o.schema + "&application_name=" + appName
	admin, err := pgx.Connect(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())

	b := &bench{o: o, dsn: dsn, admin: admin, holding: map[string]*atomic.Int64{}, overlapCount: map[string]int64{}, loadStart: loadAverage()}
	var preload string
	_ = admin.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries')`).Scan(&preload)
	b.server = fmt.Sprintf("%s:%d, shared_preload_libraries '%s'", cfg.Host, cfg.Port, preload)
	for _, name := range []string{"gormlease", "pglock"} {
		if err := b.createTables(ctx, name); err != nil {
			return fmt.Errorf("create tables of %s: %w", name, err)
		}
	}
	started := time.Now()
	for _, section := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"inflight", b.inflightScenarios},
		{"candidates", b.candidateScenarios},
		{"lock", b.lockScenarios},
		{"heartbeat", b.heartbeatScenarios},
		{"saturation", b.saturationScenarios},
		{"wait", b.waitScenarios},
		{"holding", b.holdingScenarios},
	} {
		if !slices.Contains(strings.Split(o.sections, ","), section.name) {
			continue
		}
		begun := time.Now()
		if err := section.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", section.name, err)
		}
		fmt.Printf("section %s took %v\n", section.name, time.Since(begun).Round(time.Second))
	}
	elapsed := time.Since(started)
	if o.jsonOut != "" {
		data, _ := json.MarshalIndent(b.results, "", "  ")
		if err := os.WriteFile(o.jsonOut, data, 0o644); err != nil {
			return err
		}
	}
	if o.out != "" {
		if err := writeReport(o.out, report(b, elapsed)); err != nil {
			return err
		}
	}
	return nil
}

// operationsOf returns the file at path, after checking that its
// operations section, if any, can be carried over.
func operationsOf(path string) (string, error) {
	old, err := opsection.Read(path)
	if err != nil {
		return "", err
	}
	if _, _, err := opsection.Find(old); err != nil {
		return "", fmt.Errorf("-out %s: %w", path, err)
	}
	return old, nil
}

// writeReport replaces the file at path with doc, carrying over the
// operations section that opsbench wrote there, if any (see opsection).
func writeReport(path, doc string) error {
	old, err := operationsOf(path)
	if err != nil {
		return err
	}
	if doc, err = opsection.Carry(old, doc); err != nil {
		return err
	}
	return opsection.Write(path, doc)
}

// appName marks the benchmark's own connections, to wait for them to end.
const appName = "gormlease_bench"

// settle waits until every connection of the benchmark has ended, so that
// their backends have reported their WAL statistics (PostgreSQL 15 reports
// them at most once a second while busy, and at exit).
func (b *bench) settle(ctx context.Context) {
	defer func(t time.Time) {
		if d := time.Since(t); d > 200*time.Millisecond {
			fmt.Printf("settle took %v\n", d.Round(time.Millisecond))
		}
		rows, _ := b.admin.Query(ctx, `SELECT state, left(query, 60), backend_start::text FROM pg_stat_activity WHERE application_name = $1`, appName)
		for rows.Next() {
			var a, q, c string
			_ = rows.Scan(&a, &q, &c)
			fmt.Println("  lingering:", a, q, c)
		}
		rows.Close()
	}(time.Now())
	_ = runs.WaitUntil(ctx, 30*time.Second, func() bool {
		var n int
		err := b.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n)
		return err == nil && n == 0
	})
}

func dropSchema(dsn, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
}

// bench holds the run's settings and results.
type bench struct {
	o       options
	dsn     string
	admin   *pgx.Conn
	mu      sync.Mutex
	results []result
	hb      []hbResult
	// walPoints are the points run to count statements and WAL.
	walPoints []result
	// holding and overlapCount check the contended target's holders.
	holding      map[string]*atomic.Int64
	overlapCount map[string]int64
	sat          []satResult
	checks       []string
	// wake, fan and spreadR are the waiting section's results.
	// cands are the candidates section's results; freshCands and hotCands
	// are the candidates it measured on targets never acquired before and
	// on one contended target.
	cands                []candidateResult
	freshCands, hotCands []candidate
	// server describes the server; loadStart is the load average when the
	// run began.
	server, loadStart string
	// hotShare is the share of HOT updates on job_lease after the
	// throughput points, or 0.
	hotShare float64
	// inflight are the in-flight section's results.
	inflight []inflightResult
	wake     []wakeResult
	fan      *fanResult
	spreadR  *spreadResult
}

func (b *bench) add(r result) {
	b.mu.Lock()
	b.results = append(b.results, r)
	b.mu.Unlock()
	fmt.Println(r)
}

// op is one operation of a worker: i counts the worker's operations.
type op func(ctx context.Context, worker, i int) (acquired bool, err error)

// spec describes a point: a scenario at a number of workers.
type spec struct {
	section, scenario string
	workers           int
	fn                func(im *impl) op
	// warmOps, when above -warm-ops, is the operations each worker runs
	// before the point starts counting.
	warmOps int
}

// point opens an implementation with mk, opens its connections, runs
// workers calling fn for dur (and at most maxOps operations in all), closes
// it, and measures the operations. With wal set it also measures the WAL
// they wrote, from pg_stat_wal once their backends have ended (PostgreSQL
// 15 reports a busy backend's WAL statistics at most once a second, and all
// of them at exit); other sessions' writes add to it.
func (b *bench) point(ctx context.Context, sp spec, mk maker, dur time.Duration, wal bool) result {
	// The backends of the last point's pool exit after it closes: wait, so
	// that this point does not share the machine with their exits.
	b.settle(ctx)
	var wal0 walStats
	if wal {
		wal0 = readWAL(ctx, b.admin)
	}
	im, err := mk()
	if err != nil {
		return result{Section: sp.section, Scenario: sp.scenario, Workers: sp.workers, Note: "open: " + err.Error()}
	}
	if err := im.warm(ctx, sp.workers); err != nil {
		im.close()
		return result{Section: sp.section, Scenario: sp.scenario, Impl: im.name, Workers: sp.workers, Note: "connect: " + err.Error()}
	}
	// WAL statistics cannot be split at the warm-up's end, since busy
	// backends report them late: WAL points count every operation.
	warmup, warmOps := b.o.warmup, max(b.o.warmOps, sp.warmOps)
	if wal {
		warmup, warmOps = 0, 0
	}
	r := b.measure(ctx, sp, im, warmup, warmOps, dur)
	im.close()
	r.WALSyncOp, r.WALRecOp = -1, -1
	if wal {
		b.settle(ctx)
		wal1 := readWAL(ctx, b.admin)
		n := float64(max(r.Ops, 1))
		r.WALSyncOp = (wal1.syncs - wal0.syncs) / n
		r.WALRecOp = (wal1.records - wal0.records) / n
	}
	return r
}

// createTables creates the tables of the implementation called name, on a
// connection closed before it returns.
func (b *bench) createTables(ctx context.Context, name string) error {
	switch name {
	case "gormlease":
		db, sqlDB, err := openGorm(b.dsn, 1, &counter{})
		if err != nil {
			return err
		}
		defer sqlDB.Close()
		if err := autoMigrate(ctx, db); err != nil {
			return err
		}
		if err := autoMigrateHistory(ctx, db); err != nil {
			return err
		}
		if err := db.Exec(rawTable).Error; err != nil {
			return err
		}
		return db.Exec(rawFloorTable).Error
	case "pglock":
		return createPglockTables(b.dsn)
	}
	return nil
}

// maker opens an implementation.
type maker func() (*impl, error)

func (b *bench) measure(ctx context.Context, sp spec, im *impl, warmup time.Duration, warmOps int, dur time.Duration) result {
	workers, fn := sp.workers, sp.fn(im)
	lat := &latencies{}
	var ops, acquired, errs atomic.Int64
	var errMu sync.Mutex
	errKinds := map[string]int64{}
	// The workers run the warm-up first, uncounted: a fresh pool's
	// connections prepare their statements, their backends load their
	// caches, and PostgreSQL plans each prepared statement afresh for its
	// first five executions on a connection before it settles on a plan
	// (docs/performance.md, "A fresh connection's first statements"). Each
	// worker runs at least warmOps operations (for at most maxWarmup) and
	// for at least warmup;
	// the window starts once every worker has, so that it measures warm
	// pools whatever the time their first statements took.
	warmEnd := time.Now().Add(warmup)
	// An implementation that takes seconds for its warm-up operations
	// (pglock with its heartbeats on lib/pq) stops warming after warmCap.
	warmCap := time.Now().Add(max(warmup, maxWarmup))
	var start, deadline time.Time
	var ready sync.WaitGroup
	ready.Add(workers)
	begin := make(chan struct{})
	perWorker := max(1, b.o.maxOps/workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			i := 0
			for ; (i < warmOps && time.Now().Before(warmCap) || time.Now().Before(warmEnd)) && ctx.Err() == nil; i++ {
				_, _ = fn(ctx, w, i)
			}
			ready.Done()
			<-begin
			own := make([]time.Duration, 0, 1024)
			for counted := 0; counted < perWorker && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t := time.Now()
				ok, err := fn(ctx, w, i)
				counted++
				own = append(own, time.Since(t))
				ops.Add(1)
				if ok {
					acquired.Add(1)
				}
				if err != nil {
					errs.Add(1)
					errMu.Lock()
					errKinds[err.Error()]++
					errMu.Unlock()
				}
			}
			lat.add(own)
		})
	}
	ready.Wait()
	var stmts0 int64
	if im.stmts != nil {
		stmts0 = im.stmts.statements.Load()
	}
	server0 := b.serverCPU(ctx)
	cpu0 := cpuTime()
	start = time.Now()
	deadline = start.Add(dur)
	close(begin)
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	var server time.Duration
	for pid, t := range b.serverCPU(ctx) {
		server += t - server0[pid] // a backend that began in the window, from 0
	}
	n := float64(max(ops.Load(), 1))
	// Where no other worker takes a worker's targets, a refused attempt
	// is no operation done: only the contended scenario counts attempts.
	done := acquired.Load()
	if contended(sp.scenario) {
		done = ops.Load()
	}
	r := result{
		Section: sp.section, Scenario: sp.scenario, Impl: im.name, Workers: workers,
		Ops: ops.Load(), Acquired: acquired.Load(),
		OpsPerSec: float64(done) / elapsed.Seconds(),
		P50:       ms(lat.quantile(0.50)), P99: ms(lat.quantile(0.99)),
		StmtPerOp: -1,
		CPUPerOp:  float64(cpu.Microseconds()) / n,
		ServerOp:  float64(server.Microseconds()) / n,
		CPUCore:   100 * cpu.Seconds() / elapsed.Seconds(),
		Errors:    errs.Load(),
	}
	if im.stmts != nil {
		r.StmtPerOp = float64(im.stmts.statements.Load()-stmts0) / n
	}
	if len(errKinds) > 0 {
		r.ErrorKinds = errKinds
	}
	return r
}

// lockScenarios runs the acquire+release, contention and full job points.
// Each point runs every implementation back to back, on a pool of its own
// that is closed before the next, and the whole set runs o.rounds times, so
// that the load from other processes falls on all of them alike.
func (b *bench) lockScenarios(ctx context.Context) error {
	const conns = 34
	makers := []maker{
		func() (*impl, error) { return newGormlease(b.dsn, conns) },
		func() (*impl, error) { return newGormleaseHistory(b.dsn, conns) },
		func() (*impl, error) { return newPlain(ctx, b.dsn, conns) },
		func() (*impl, error) { return newPlainGorm(b.dsn, conns, true) },
		func() (*impl, error) { return newPlainGorm(b.dsn, conns, false) },
		func() (*impl, error) { return newRawLease(ctx, b.dsn, conns) },
		func() (*impl, error) { return newAdvisory(ctx, b.dsn, conns) },
		func() (*impl, error) { im, _, _, err := newPglock(b.dsn, conns, false, 0); return im, err },
		func() (*impl, error) { im, _, _, err := newPglock(b.dsn, conns, true, 0); return im, err },
		func() (*impl, error) { im, _, _, err := newPglock(b.dsn, conns, true, callerBeats); return im, err },
	}
	makers, err := b.selected(makers)
	if err != nil {
		return err
	}
	for _, mk := range makers {
		if err := b.prepare(ctx, mk); err != nil {
			return err
		}
		b.refusedWrites(ctx, mk)
	}
	specs := []spec{
		{"lock", "acquire+release", 1, acquireRelease, targetsPerWorker},
		{"lock", "acquire+release", 8, acquireRelease, targetsPerWorker},
		{"lock", "acquire+release", 32, acquireRelease, targetsPerWorker},
		{"lock", newTargetsScenario, 32, acquireReleaseNew, 0},
		{"lock", contendedScenario, 32, b.contendedOp, 0},
		{"job", "full job", 1, fullJob, targetsPerWorker},
		{"job", "full job", 8, fullJob, targetsPerWorker},
	}
	// Throughput: short slices, every implementation in turn, round after
	// round, so that neighbours in time share the machine's load.
	slice := b.o.duration / time.Duration(b.o.rounds)
	for _, sp := range specs {
		for round := range b.o.rounds {
			for i := range makers {
				mk := makers[(i+round)%len(makers)]
				b.addRound(round, b.point(ctx, sp, mk, slice, false))
			}
		}
	}
	b.settle(ctx)
	b.hotUpdates(ctx, "after the throughput points")
	// Statements and WAL: one longer point each, WAL measured.
	// With one worker, where WAL flushes per operation are exact, they are
	// measured three times and the least kept: other sessions only add.
	for _, sp := range specs {
		for _, mk := range makers {
			var best result
			for try := range map[bool]int{true: 3, false: 1}[sp.workers == 1] {
				r := b.point(ctx, sp, mk, b.o.walDuration, true)
				fmt.Println("wal", r)
				if try == 0 || r.WALSyncOp < best.WALSyncOp {
					best = r
				}
			}
			b.mu.Lock()
			b.walPoints = append(b.walPoints, best)
			b.mu.Unlock()
		}
	}
	return nil
}

// selected returns the makers whose implementations -impls selects.
func (b *bench) selected(makers []maker) ([]maker, error) {
	var kept []maker
	for _, mk := range makers {
		im, err := mk()
		if err != nil {
			return nil, err
		}
		im.close()
		if b.o.impls.MatchString(im.name) {
			kept = append(kept, mk)
		}
	}
	return kept, nil
}

func (b *bench) addRound(round int, r result) {
	r.Round = round
	b.add(r)
}

// maxWarmup bounds the time a point's workers spend on their warm-up
// operations.
const maxWarmup = 2 * time.Second

// targetsPerWorker is how many targets each worker of the acquire+release
// and full job points takes in turn. Their warm-up takes each once, so
// that the points measure targets acquired before, as a long-lived
// process would.
const targetsPerWorker = 64

func acquireRelease(im *impl) op {
	return func(ctx context.Context, w, i int) (bool, error) {
		unlock, ok, err := im.try(ctx, fmt.Sprintf("ar-%d-%d", w, i%targetsPerWorker))
		if !ok || err != nil {
			return false, err
		}
		return true, unlock(ctx)
	}
}

// newTargetsScenario is acquire+release on a target never acquired
// before at each operation: a webhook's ID, a payment's ID.
const newTargetsScenario = "acquire+release, new targets"

// newTargets numbers the targets of newTargetsScenario, over every point.
var newTargets atomic.Int64

func acquireReleaseNew(im *impl) op {
	return func(ctx context.Context, w, i int) (bool, error) {
		unlock, ok, err := im.try(ctx, fmt.Sprintf("new-%d", newTargets.Add(1)))
		if !ok || err != nil {
			return false, err
		}
		return true, unlock(ctx)
	}
}

func fullJob(im *impl) op {
	return func(ctx context.Context, w, i int) (bool, error) {
		return im.job(ctx, fmt.Sprintf("job-%d-%d", w, i%targetsPerWorker), "result")
	}
}

// contendedScenario is 32 workers on one target; contendedOp checks that
// no two of them ever hold it at once.
const contendedScenario = "contended, one target"

// contended reports whether scenario is one of workers contending on one
// target, whose attempts count, refused or not.
func contended(scenario string) bool {
	return scenario == contendedScenario || scenario == contendedCandidatesScenario
}

func (b *bench) contendedOp(im *impl) op {
	hot := "hot-" + im.name
	holders := b.holders(im.name)
	return func(ctx context.Context, w, i int) (bool, error) {
		unlock, ok, err := im.try(ctx, hot)
		if !ok || err != nil {
			return false, err
		}
		if holders.Add(1) != 1 {
			b.overlapsSeen(im.name)
		}
		time.Sleep(200 * time.Microsecond)
		holders.Add(-1)
		return true, unlock(ctx)
	}
}

// holders returns the counter of current holders of impl's hot target.
func (b *bench) holders(impl string) *atomic.Int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holding[impl] == nil {
		b.holding[impl] = &atomic.Int64{}
	}
	return b.holding[impl]
}

func (b *bench) overlapsSeen(impl string) {
	b.mu.Lock()
	b.overlapCount[impl]++
	b.mu.Unlock()
}

// prepare creates the tables an implementation needs, and warms the server
// up for it.
func (b *bench) prepare(ctx context.Context, mk maker) error {
	im, err := mk()
	if err != nil {
		return err
	}
	im.close()
	b.point(ctx, spec{"warm", "warm", 8, func(im *impl) op {
		return func(ctx context.Context, w, i int) (bool, error) {
			return im.job(ctx, fmt.Sprintf("warm-%d-%d", w, i%16), "x")
		}
	}, 0}, mk, 200*time.Millisecond, false)
	return nil
}

// refusedWrites checks that refused acquires leave the lease row alone: its
// xmin (last writer) and xmax (last locker) stay as they were after 100 of
// them. A row lock is a write: it takes a transaction ID and is logged.
func (b *bench) refusedWrites(ctx context.Context, mk maker) {
	im, err := mk()
	if err != nil {
		return
	}
	defer im.close()
	if im.rowOf == "" {
		return
	}
	const target = "refused-check"
	unlock, ok, err := im.try(ctx, target)
	if !ok || err != nil {
		b.addCheck(fmt.Sprintf("%s: refused-acquire check could not acquire: %v", im.name, err))
		return
	}
	defer unlock(ctx)
	cfg, err := pgx.ParseConfig(b.dsn)
	if err != nil {
		return
	}
	conn := stdlib.OpenDB(*cfg)
	defer conn.Close()
	row := func() string {
		var x string
		_ = conn.QueryRowContext(ctx, `SELECT xmin::text || '/' || xmax::text `+im.rowOf, target).Scan(&x)
		return x
	}
	before := row()
	refused := 0
	for range 100 {
		if _, ok, err := im.try(ctx, target); !ok && err == nil {
			refused++
		}
	}
	after := row()
	verdict := "untouched"
	if after != before {
		verdict = "WRITTEN (locked or updated)"
	}
	b.addCheck(fmt.Sprintf("%s: after %d refused acquires the lease row is %s (xmin/xmax %s -> %s)", im.name, refused, verdict, before, after))
}

// hotUpdates records the share of HOT updates on the lease tables of
// gormlease and of its SQL on raw pgx, as pg_stat_user_tables counts them
// once the backends that updated them have exited.
func (b *bench) hotUpdates(ctx context.Context, when string) {
	for _, table := range []string{"job_lease", "raw_lease"} {
		var hot, upd int64
		if err := b.admin.QueryRow(ctx, `SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
			b.o.schema, table).Scan(&hot, &upd); err != nil || upd == 0 {
			continue
		}
		if table == "job_lease" {
			b.hotShare = float64(hot) / float64(upd)
		}
		b.addCheck(fmt.Sprintf("%s %s: %.1f%% of the updates were HOT (n_tup_hot_upd %d of n_tup_upd %d)", table, when, 100*float64(hot)/float64(upd), hot, upd))
	}
}

func (b *bench) addCheck(c string) {
	b.mu.Lock()
	b.checks = append(b.checks, c)
	b.mu.Unlock()
	fmt.Println("check", c)
}
