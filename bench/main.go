// Command bench measures gormlease against the alternatives on one
// PostgreSQL, in one run: the seed design's SQL on raw pgx, advisory locks,
// and cirello.io/pglock on lib/pq and on pgx. It prints one line per point
// and writes docs/performance.md from them.
//
//	cd bench && go run . -out ../docs/performance.md
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// options are the command's flags.
type options struct {
	dsn       string
	schema    string
	duration  time.Duration
	leases    int
	hbWindow  time.Duration
	maxOps    int
	rounds    int
	out       string
	jsonOut   string
	onlyHeavy bool
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (127.0.0.1 only)")
	flag.StringVar(&o.schema, "schema", "gormlease_bench", "schema the benchmark creates and drops")
	flag.DurationVar(&o.duration, "duration", time.Second, "duration of each throughput point")
	flag.IntVar(&o.leases, "leases", 10000, "leases held at once in the heartbeat scenario")
	flag.DurationVar(&o.hbWindow, "hb-window", 5*time.Second, "measuring window of the heartbeat scenario")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds of the lock and job points; the report shows each point's best round")
	flag.IntVar(&o.maxOps, "max-ops", 200000, "bound on operations per point")
	flag.StringVar(&o.out, "out", "", "write the Markdown report to this file")
	flag.StringVar(&o.jsonOut, "json", "", "write the raw results as JSON to this file")
	flag.Parse()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := setupSchema(ctx, o.dsn, o.schema); err != nil {
		return err
	}
	defer dropSchema(o.dsn, o.schema)
	dsn := o.dsn + "&search_path=" + o.schema + "&application_name=" + appName
	admin, err := pgx.Connect(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())

	b := &bench{o: o, dsn: dsn, admin: admin}
	started := time.Now()
	if err := b.lockScenarios(ctx); err != nil {
		return err
	}
	if err := b.heartbeatScenarios(ctx); err != nil {
		return err
	}
	if err := b.saturationScenarios(ctx); err != nil {
		return err
	}
	elapsed := time.Since(started)
	if o.jsonOut != "" {
		data, _ := json.MarshalIndent(b.results, "", "  ")
		if err := os.WriteFile(o.jsonOut, data, 0o644); err != nil {
			return err
		}
	}
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report(b, elapsed)), 0o644); err != nil {
			return err
		}
	}
	return nil
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
	_ = waitUntil(ctx, 30*time.Second, func() bool {
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
	sat     []satResult
	checks  []string
}

func (b *bench) add(r result) {
	b.mu.Lock()
	b.results = append(b.results, r)
	b.mu.Unlock()
	fmt.Println(r)
}

// op is one operation of a worker: i counts the worker's operations.
type op func(ctx context.Context, worker, i int) (acquired bool, err error)

// point opens an implementation with mk, opens its connections, runs
// workers calling fn for the duration (and at most maxOps operations in all),
// closes it, and measures the operations: statements from the fresh pool's
// counter, WAL from pg_stat_wal once its backends have ended.
func (b *bench) point(ctx context.Context, section, scenario string, mk maker, workers int, fn func(im *impl) op) result {
	b.settle(ctx)
	wal0 := readWAL(ctx, b.admin)
	im, err := mk()
	if err != nil {
		return result{Section: section, Scenario: scenario, Workers: workers, Note: "open: " + err.Error()}
	}
	if err := im.warm(ctx, workers); err != nil {
		im.close()
		return result{Section: section, Scenario: scenario, Impl: im.name, Workers: workers, Note: "connect: " + err.Error()}
	}
	r := b.measure(ctx, section, scenario, im, workers, fn(im))
	im.close()
	b.settle(ctx)
	wal1 := readWAL(ctx, b.admin)
	n := float64(max(r.Ops, 1))
	r.WALSyncOp = (wal1.syncs - wal0.syncs) / n
	r.WALRecOp = (wal1.records - wal0.records) / n
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
		return autoMigrate(ctx, db)
	case "pglock, lib/pq":
		_, client, db, err := newPglock(b.dsn, 1, false, 0)
		if err != nil {
			return err
		}
		defer db.Close()
		return client.TryCreateTable()
	}
	return nil
}

// maker opens an implementation.
type maker func() (*impl, error)

func (b *bench) measure(ctx context.Context, section, scenario string, im *impl, workers int, fn op) result {
	lat := &latencies{}
	var ops, acquired, errs atomic.Int64
	var firstErr atomic.Value
	var stmts0 int64
	if im.stmts != nil {
		stmts0 = im.stmts.statements.Load()
	}
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(b.o.duration)
	perWorker := max(1, b.o.maxOps/workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			own := make([]time.Duration, 0, 1024)
			for i := 0; i < perWorker && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t := time.Now()
				ok, err := fn(ctx, w, i)
				own = append(own, time.Since(t))
				ops.Add(1)
				if ok {
					acquired.Add(1)
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
			lat.add(own)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	n := float64(max(ops.Load(), 1))
	r := result{
		Section: section, Scenario: scenario, Impl: im.name, Workers: workers,
		Ops: ops.Load(), Acquired: acquired.Load(),
		OpsPerSec: float64(ops.Load()) / elapsed.Seconds(),
		P50:       ms(lat.quantile(0.50)), P99: ms(lat.quantile(0.99)),
		StmtPerOp: -1,
		CPUPerOp:  float64(cpu.Microseconds()) / n,
		CPUCore:   100 * cpu.Seconds() / elapsed.Seconds(),
		Errors:    errs.Load(),
	}
	if im.stmts != nil {
		r.StmtPerOp = float64(im.stmts.statements.Load()-stmts0) / n
	}
	if e, ok := firstErr.Load().(error); ok {
		r.Note = "first error: " + e.Error()
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
		func() (*impl, error) { return newSeed(ctx, b.dsn, conns) },
		func() (*impl, error) { return newAdvisory(ctx, b.dsn, conns) },
		func() (*impl, error) { im, _, _, err := newPglock(b.dsn, conns, false, 0); return im, err },
		func() (*impl, error) { im, _, _, err := newPglock(b.dsn, conns, true, 0); return im, err },
	}
	for _, mk := range makers {
		if err := b.prepare(ctx, mk); err != nil {
			return err
		}
		b.refusedWrites(ctx, mk)
	}
	for round := range b.o.rounds {
		for _, workers := range []int{1, 8, 32} {
			for _, mk := range makers {
				b.addRound(round, b.point(ctx, "lock", "acquire+release", mk, workers, acquireRelease))
			}
		}
		for _, mk := range makers {
			b.addRound(round, b.contended(ctx, mk))
		}
		for _, workers := range []int{1, 8} {
			for _, mk := range makers {
				b.addRound(round, b.point(ctx, "job", "full job", mk, workers, fullJob))
			}
		}
	}
	return nil
}

func (b *bench) addRound(round int, r result) {
	r.Round = round
	b.add(r)
}

func acquireRelease(im *impl) op {
	return func(ctx context.Context, w, i int) (bool, error) {
		unlock, ok, err := im.try(ctx, fmt.Sprintf("ar-%d-%d", w, i%64))
		if !ok || err != nil {
			return false, err
		}
		return true, unlock(ctx)
	}
}

func fullJob(im *impl) op {
	return func(ctx context.Context, w, i int) (bool, error) {
		return im.job(ctx, fmt.Sprintf("job-%d-%d", w, i%64), "result")
	}
}

// contended runs 32 workers on one target, and checks that no two hold it
// at once.
func (b *bench) contended(ctx context.Context, mk maker) result {
	var holders, overlaps atomic.Int64
	r := b.point(ctx, "lock", "contended, one target", mk, 32, func(im *impl) op {
		hot := "hot-" + im.name
		return func(ctx context.Context, w, i int) (bool, error) {
			unlock, ok, err := im.try(ctx, hot)
			if !ok || err != nil {
				return false, err
			}
			if holders.Add(1) != 1 {
				overlaps.Add(1)
			}
			time.Sleep(200 * time.Microsecond)
			holders.Add(-1)
			return true, unlock(ctx)
		}
	})
	r.Overlaps = overlaps.Load()
	r.Note = fmt.Sprintf("%d of %d attempts acquired; %d overlapping holders. %s", r.Acquired, r.Ops, r.Overlaps, r.Note)
	return r
}

// prepare creates the tables an implementation needs, and warms the server
// up for it.
func (b *bench) prepare(ctx context.Context, mk maker) error {
	im, err := mk()
	if err != nil {
		return err
	}
	name := im.name
	im.close()
	if err := b.createTables(ctx, name); err != nil {
		return err
	}
	saved := b.o.duration
	b.o.duration = 200 * time.Millisecond
	b.point(ctx, "warm", "warm", mk, 8, func(im *impl) op {
		return func(ctx context.Context, w, i int) (bool, error) {
			return im.job(ctx, fmt.Sprintf("warm-%d-%d", w, i%16), "x")
		}
	})
	b.o.duration = saved
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

func (b *bench) addCheck(c string) {
	b.mu.Lock()
	b.checks = append(b.checks, c)
	b.mu.Unlock()
	fmt.Println("check", c)
}
