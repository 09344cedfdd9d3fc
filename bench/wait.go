package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/bench/internal/runs"
	"github.com/gormlease/gormlease/observe"
)

// The waiting section: callers of Runner.Do that find another holder's job
// in progress wait for it and share its saved result.
const (
	// waitInterval is the heartbeat interval of every runner in the
	// section, and so its waiters' longest pause between polls.
	waitInterval = time.Second
	waitTimeout  = 5 * time.Second
	// fanWaiters wait on one target for a job of fanJob.
	fanWaiters = 1000
	fanJob     = 2 * time.Second
	// spreadWaiters wait on spreadTargets targets from spreadProcs processes.
	spreadWaiters = 1000
	spreadTargets = 10
	spreadProcs   = 4
	// wakeLanes is how many targets the wake-up latency samples at once.
	wakeLanes = 8
)

// errWaiterRan is what a waiter's work returns: a waiter that runs the work
// found no job to wait for, and gets no shared result.
var errWaiterRan = errors.New("the waiter ran the work itself")

// waitTracer is a pgx tracer that counts a pool's statements by kind, with
// the time each started, and records when the pool's last fenced commit
// was answered.
type waitTracer struct {
	mu     sync.Mutex
	events []stmtEvent
	commit time.Time
	// commitSent is when the pool's last fenced commit was sent.
	commitSent time.Time
	// targets are the targets whose row the pool has read as a waiter.
	targets map[string]bool
}

type stmtEvent struct {
	at   time.Time
	kind string
}

// Statement kinds, as waitTracer tells them apart.
const (
	kindRead   = "read the row"
	kindMark   = "mark the row waited on"
	kindListen = "LISTEN"
	kindLoad   = "load"
	kindOther  = "other"
)

func statementKind(q string) string {
	switch {
	case strings.Contains(q, "released_at IS NOT NULL, COALESCE(saved_generation"):
		return kindRead
	case strings.Contains(q, "SET waiting = true"):
		return kindMark
	case strings.HasPrefix(q, "LISTEN "):
		return kindListen
	case strings.Contains(q, "FROM bench_result"):
		return kindLoad
	}
	return kindOther
}

func (t *waitTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	k := statementKind(d.SQL)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events = append(t.events, stmtEvent{time.Now(), k})
	if strings.HasSuffix(d.SQL, "COMMIT") && strings.HasPrefix(d.SQL, "SELECT 1;") {
		t.commitSent = time.Now()
		ctx = context.WithValue(ctx, fencedCommitKey{}, true)
	}
	// The target is the first argument that is a string: database/sql's
	// driver may put its own values before the statement's arguments.
	if i := slices.IndexFunc(d.Args, func(a any) bool { _, ok := a.(string); return ok }); k == kindRead && i >= 0 {
		if t.targets == nil {
			t.targets = map[string]bool{}
		}
		t.targets[d.Args[i].(string)] = true
	}
	return ctx
}

func (t *waitTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err == nil && d.CommandTag.String() == "COMMIT" && ctx.Value(fencedCommitKey{}) != nil {
		t.mu.Lock()
		t.commit = time.Now()
		t.mu.Unlock()
	}
}

// fencedCommitKey marks the context of a fenced commit's last query.
type fencedCommitKey struct{}

// lastCommitSent is when the pool's last fenced commit was sent.
func (t *waitTracer) lastCommitSent() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.commitSent
}

// lastCommit is when the pool's last COMMIT was answered.
func (t *waitTracer) lastCommit() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.commit
}

// count returns the statements that started in [from, to), by kind.
func (t *waitTracer) count(from, to time.Time) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := map[string]int{}
	for _, e := range t.events {
		if !e.at.Before(from) && e.at.Before(to) {
			n[e.kind]++
		}
	}
	return n
}

// sent reports whether the pool sent a statement of kind, and has read
// the row of every target of targets.
func (t *waitTracer) sent(kind string, targets []string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, target := range targets {
		if !t.targets[target] {
			return false
		}
	}
	return slices.ContainsFunc(t.events, func(e stmtEvent) bool { return e.kind == kind })
}

// newWaitRunner returns a Runner on db whose fenced commits tr records,
// when tr is not nil.
func newWaitRunner(db *gorm.DB, tr *waitTracer) (*gormlease.Runner[string], error) {
	opts := []gormlease.Option{gormlease.WithHeartbeatInterval(waitInterval), gormlease.WithLeaseTimeout(waitTimeout)}
	if tr != nil {
		opts = append(opts, gormlease.WithObserver(commitObserver{tr}))
	}
	return gormlease.NewRunner[string](db, opts...)
}

// commitObserver records in its tracer when each fenced commit began and
// when it returned. The fenced COMMIT itself is sent on the connection's
// wire protocol, where pgx's tracer does not see it, so the commit's span
// stands for it: it begins before the statement that locks the row and
// ends once COMMIT was answered.
type commitObserver struct{ t *waitTracer }

func (o commitObserver) Start(ctx context.Context, span observe.Span) (context.Context, func(error)) {
	if span.Kind != observe.SpanCommit {
		return ctx, func(error) {}
	}
	o.t.mu.Lock()
	o.t.commitSent = time.Now()
	o.t.mu.Unlock()
	return ctx, func(err error) {
		if err == nil {
			o.t.mu.Lock()
			o.t.commit = time.Now()
			o.t.mu.Unlock()
		}
	}
}

func (commitObserver) Record(context.Context, observe.Event) {}

// saveResult saves a job's result for target where loadResult reads it.
func saveResult(target string) func(*gorm.DB, string) error {
	return func(tx *gorm.DB, v string) error {
		return tx.Exec(`INSERT INTO bench_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`, target, v).Error
	}
}

// loadResult reads target's saved result, counting its calls in loads.
func loadResult(target string, loads *atomic.Int64) func(*gorm.DB) (string, error) {
	return func(tx *gorm.DB) (string, error) {
		loads.Add(1)
		var v string
		err := tx.Raw(`SELECT data FROM bench_result WHERE target_id = ?`, target).Row().Scan(&v)
		return v, err
	}
}

// wakeResult is the wake-up latency of waiters on one kind of pool.
type wakeResult struct {
	Mode    string  `json:"mode"`
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	// Failed counts the waiters that did not get their job's result.
	Failed int    `json:"failed"`
	Note   string `json:"note,omitempty"`
}

func (r wakeResult) String() string {
	return fmt.Sprintf("wait       wake-up, %-28s samples=%d p50=%.1fms p99=%.1fms max=%.1fms failed=%d %s",
		r.Mode, r.Samples, r.P50, r.P99, r.Max, r.Failed, r.Note)
}

// fanResult is fanWaiters waiters on one target in one process.
type fanResult struct {
	Waiters    int            `json:"waiters"`
	Got        int            `json:"got_result"`
	Loads      int64          `json:"loads"`
	Wait       float64        `json:"wait_s"`
	Statements map[string]int `json:"statements_while_waiting"`
	PerPoll    float64        `json:"statements_per_poll_interval"`
	Note       string         `json:"note,omitempty"`
}

func (r fanResult) total() int {
	n := 0
	for _, c := range r.Statements {
		n += c
	}
	return n
}

func (r fanResult) String() string {
	return fmt.Sprintf("wait       %d waiters, one target: got=%d loads=%d wait=%.2fs statements=%d %v per-interval=%.2f %s",
		r.Waiters, r.Got, r.Loads, r.Wait, r.total(), r.Statements, r.PerPoll, r.Note)
}

// spreadResult is spreadWaiters waiters over spreadTargets targets and
// spreadProcs processes.
type spreadResult struct {
	Waiters   int `json:"waiters"`
	Got       int `json:"got_result"`
	Processes int `json:"processes"`
	// Listeners is the most LISTEN connections seen for one process, and
	// ListenersAll for all of them together, in pg_stat_activity.
	Listeners    int    `json:"max_listeners_per_process"`
	ListenersAll int    `json:"max_listeners"`
	Samples      int    `json:"activity_samples"`
	Loads        int64  `json:"loads"`
	Note         string `json:"note,omitempty"`
}

func (r spreadResult) String() string {
	return fmt.Sprintf("wait       %d waiters, %d targets, %d processes: got=%d loads=%d listeners/process=%d listeners=%d samples=%d %s",
		r.Waiters, spreadTargets, r.Processes, r.Got, r.Loads, r.Listeners, r.ListenersAll, r.Samples, r.Note)
}

// waitScenarios measures Runner.Do's waiting: wake-up latency with
// notifications and with polls only, many waiters on one target, and
// waiters spread over targets and processes.
func (b *bench) waitScenarios(ctx context.Context) error {
	modes := []struct {
		name string
		open func(tr *waitTracer) (*gorm.DB, *sql.DB, error)
	}{
		{"notifications (pgx)", func(tr *waitTracer) (*gorm.DB, *sql.DB, error) { return openGorm(b.dsn, 8, tr) }},
		{"polling only (lib/pq)", func(*waitTracer) (*gorm.DB, *sql.DB, error) { return openGormPq(b.dsn, 8) }},
	}
	for _, m := range modes {
		b.settle(ctx)
		db, sqlDB, err := m.open(&waitTracer{})
		if err != nil {
			return err
		}
		r := b.wakeLatency(ctx, m.name, db)
		sqlDB.Close()
		b.mu.Lock()
		b.wake = append(b.wake, r)
		b.mu.Unlock()
		fmt.Println(r)
	}
	b.settle(ctx)
	fan, err := b.fanIn(ctx)
	if err != nil {
		return err
	}
	b.fan = &fan
	fmt.Println(fan)
	b.settle(ctx)
	spread, err := b.spread(ctx)
	if err != nil {
		return err
	}
	b.spreadR = &spread
	fmt.Println(spread)
	return nil
}

// openGormPq opens gorm on lib/pq, whose connections gormlease cannot
// listen on: its waiters only poll.
func openGormPq(dsn string, conns int) (*gorm.DB, *sql.DB, error) {
	sqlDB, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, nil, err
	}
	sqlDB.SetMaxOpenConns(conns)
	sqlDB.SetMaxIdleConns(conns)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	return db, sqlDB, nil
}

// wakeLatency measures, o.waitSamples times, the time from a holder's
// COMMIT to the return of a Do that waited for its job, on waiters' pool.
// wakeLanes targets are sampled at once, each with a holder on a pool of
// its own: gormlease wakes in-process only the waiters on the pool that
// committed, so the waiters learn of the commit as they would in another
// process, while both times are read on one clock.
func (b *bench) wakeLatency(ctx context.Context, mode string, waiters *gorm.DB) wakeResult {
	r := wakeResult{Mode: mode}
	runner, err := newWaitRunner(waiters, nil)
	if err != nil {
		r.Note = err.Error()
		return r
	}
	lat := &latencies{}
	var mu sync.Mutex
	failures := map[string]int64{}
	var wg sync.WaitGroup
	for lane := range wakeLanes {
		wg.Go(func() {
			tr := &waitTracer{}
			db, sqlDB, err := openGorm(b.dsn, 2, tr)
			if err == nil {
				defer sqlDB.Close()
			}
			var holder *gormlease.Runner[string]
			if err == nil {
				holder, err = newWaitRunner(db, tr)
			}
			var own []time.Duration
			target := fmt.Sprintf("wake-%s-%d", strings.Fields(mode)[0], lane)
			for i := lane; i < b.o.waitSamples && ctx.Err() == nil; i += wakeLanes {
				var d time.Duration
				if err == nil {
					d, err = b.wakeOnce(ctx, holder, runner, tr, target, i)
				}
				if err != nil {
					mu.Lock()
					failures[err.Error()]++
					mu.Unlock()
					err = nil
					continue
				}
				own = append(own, d)
			}
			lat.add(own)
		})
	}
	wg.Wait()
	r.Samples = len(lat.all)
	r.P50, r.P99 = ms(lat.quantile(0.50)), ms(lat.quantile(0.99))
	r.Max = ms(lat.quantile(1))
	for _, n := range failures {
		r.Failed += int(n)
	}
	r.Note = errorCounts(failures)
	return r
}

// wakeOnce runs one job on target under holder, and a Do of waiter that
// waits for it: the job ends between 200 ms and 3 s after Do was called,
// so that its commit falls anywhere in the waiter's poll schedule. It
// returns the time from the COMMIT's answer to the return of Do.
func (b *bench) wakeOnce(ctx context.Context, holder, waiter *gormlease.Runner[string], tr *waitTracer, target string, i int) (time.Duration, error) {
	want := fmt.Sprintf("%s#%d", target, i)
	started, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := holder.Run(ctx, target, func(context.Context) (string, error) {
			close(started)
			<-release
			return want, nil
		}, saveResult(target))
		held <- err
	}()
	select {
	case <-started:
	case err := <-held:
		return 0, fmt.Errorf("holder: %w", err)
	}
	type outcome struct {
		v      string
		shared bool
		err    error
		at     time.Time
	}
	waited := make(chan outcome, 1)
	var loads atomic.Int64
	go func() {
		v, shared, err := waiter.Do(ctx, target,
			func(context.Context) (string, error) { return "", errWaiterRan },
			saveResult(target), loadResult(target, &loads))
		waited <- outcome{v, shared, err, time.Now()}
	}()
	time.Sleep(200*time.Millisecond + rand.N(2800*time.Millisecond))
	close(release)
	if err := <-held; err != nil {
		<-waited
		return 0, fmt.Errorf("holder: %w", err)
	}
	commit := tr.lastCommit()
	o := <-waited
	switch {
	case o.err != nil:
		return 0, o.err
	case o.v != want || !o.shared:
		return 0, fmt.Errorf("got %q (shared %v), not the job's result", o.v, o.shared)
	}
	return o.at.Sub(commit), nil
}

// fanIn runs a job of fanJob on one target, held on a pool of its own, and
// fanWaiters calls of Do on one runner of another pool, started once the
// job has begun. It counts the statements the waiters' pool sends from the
// first call to the job's COMMIT, and the calls of load.
func (b *bench) fanIn(ctx context.Context) (fanResult, error) {
	r := fanResult{Waiters: fanWaiters}
	htr, wtr := &waitTracer{}, &waitTracer{}
	hdb, hSQL, err := openGorm(b.dsn, 2, htr)
	if err != nil {
		return r, err
	}
	defer hSQL.Close()
	wdb, wSQL, err := openGorm(b.dsn, 8, wtr)
	if err != nil {
		return r, err
	}
	defer wSQL.Close()
	holder, err := newWaitRunner(hdb, htr)
	if err != nil {
		return r, err
	}
	waiter, err := newWaitRunner(wdb, nil)
	if err != nil {
		return r, err
	}
	const target = "fan-in"
	const want = "fan-in result"
	started := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := holder.Run(ctx, target, func(ctx context.Context) (string, error) {
			close(started)
			select {
			case <-time.After(fanJob):
			case <-ctx.Done():
			}
			return want, nil
		}, saveResult(target))
		held <- err
	}()
	select {
	case <-started:
	case err := <-held:
		return r, fmt.Errorf("holder: %w", err)
	}
	var loads atomic.Int64
	var got atomic.Int64
	var mu sync.Mutex
	failures := map[string]int64{}
	first := time.Now()
	var wg sync.WaitGroup
	for range fanWaiters {
		wg.Go(func() {
			v, shared, err := waiter.Do(ctx, target,
				func(context.Context) (string, error) { return "", errWaiterRan },
				saveResult(target), loadResult(target, &loads))
			if err == nil && (v != want || !shared) {
				err = fmt.Errorf("got %q (shared %v), not the job's result", v, shared)
			}
			if err != nil {
				mu.Lock()
				failures[err.Error()]++
				mu.Unlock()
				return
			}
			got.Add(1)
		})
	}
	wg.Wait()
	if err := <-held; err != nil {
		return r, fmt.Errorf("holder: %w", err)
	}
	commit := htr.lastCommitSent()
	r.Got, r.Loads = int(got.Load()), loads.Load()
	r.Wait = commit.Sub(first).Seconds()
	r.Statements = wtr.count(first, commit)
	r.PerPoll = float64(r.total()) / (r.Wait / waitInterval.Seconds())
	r.Note = errorCounts(failures)
	return r, nil
}

// spreadChild is the report of one child process of spread.
type spreadChild struct {
	// Got counts, by target, the waiters that got each value.
	Got      map[string]map[string]int `json:"got"`
	Failures map[string]int64          `json:"failures"`
	Loads    int64                     `json:"loads"`
}

// spreadApp is the application_name of spread's child processes, followed
// by their number.
const spreadApp = "gormlease_bench_wait_"

// spread runs one job on each of spreadTargets targets, in this process,
// and spreadWaiters calls of Do for them in spreadProcs child processes
// (this command, run again with -wait-child). While they wait, it counts
// in pg_stat_activity the connections of each process that listen.
func (b *bench) spread(ctx context.Context) (spreadResult, error) {
	r := spreadResult{Waiters: spreadWaiters, Processes: spreadProcs}
	spreadTracer := &waitTracer{}
	hdb, hSQL, err := openGorm(b.dsn, spreadTargets+2, spreadTracer)
	if err != nil {
		return r, err
	}
	defer hSQL.Close()
	holder, err := newWaitRunner(hdb, spreadTracer)
	if err != nil {
		return r, err
	}
	exe, err := os.Executable()
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	targets := make([]string, spreadTargets)
	want := map[string]string{}
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()
	held := make(chan error, spreadTargets)
	var startedAll sync.WaitGroup
	for i := range targets {
		target := fmt.Sprintf("spread-%d", i)
		targets[i], want[target] = target, fmt.Sprintf("result of %s, %d", target, rand.Int64())
		startedAll.Add(1)
		go func() {
			var once sync.Once
			_, err := holder.Run(ctx, target, func(context.Context) (string, error) {
				once.Do(startedAll.Done)
				<-release
				return want[target], nil
			}, saveResult(target))
			once.Do(startedAll.Done)
			held <- err
		}()
	}
	startedAll.Wait()

	type child struct {
		cmd    *exec.Cmd
		lines  *bufio.Scanner
		report spreadChild
	}
	children := make([]*child, 0, spreadProcs)
	// On an error, end the jobs and the children before reaping them.
	defer func() {
		releaseAll()
		cancel()
		for _, c := range children {
			_ = c.cmd.Wait() // already waited for, unless there was an error
		}
	}()
	for k := range spreadProcs {
		cmd := exec.CommandContext(ctx, exe, "-wait-child", fmt.Sprint(k),
			"-dsn", b.childDSN(fmt.Sprintf("%s%d", spreadApp, k)),
			"-wait-targets", strings.Join(targets, ","),
			"-wait-waiters", fmt.Sprint(spreadWaiters/spreadProcs))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return r, err
		}
		if err := cmd.Start(); err != nil {
			return r, err
		}
		c := &child{cmd: cmd, lines: bufio.NewScanner(out)}
		c.lines.Buffer(nil, 1<<20)
		children = append(children, c)
	}
	for k, c := range children {
		if !c.lines.Scan() || c.lines.Text() != "ready" {
			return r, fmt.Errorf("child %d did not start waiting: %q", k, c.lines.Text())
		}
	}
	// Every waiter has called Do, and each process has read every row and
	// sent LISTEN. Sample the listeners for a second at least, and until
	// every row is marked as waited on.
	began := time.Now()
	err = runs.WaitUntil(ctx, 30*time.Second, func() bool {
		r.Samples++
		rows, err := b.admin.Query(ctx, `SELECT application_name, count(*) FROM pg_stat_activity
WHERE query = 'LISTEN gormlease' AND application_name LIKE $1 GROUP BY 1`, spreadApp+"%")
		if err != nil {
			return false
		}
		all := 0
		for rows.Next() {
			var app string
			var n int
			if rows.Scan(&app, &n) == nil {
				r.Listeners = max(r.Listeners, n)
				all += n
			}
		}
		rows.Close()
		r.ListenersAll = max(r.ListenersAll, all)
		var marked int
		err = b.admin.QueryRow(ctx, `SELECT count(*) FROM `+b.o.schema+`.job_lease WHERE target_id = ANY($1) AND waiting`, targets).Scan(&marked)
		return err == nil && marked == len(targets) && time.Since(began) > time.Second
	})
	if err != nil {
		r.Note = "not every row was marked as waited on: " + err.Error() + "; "
	}
	releaseAll()
	for range targets {
		if err := <-held; err != nil {
			return r, fmt.Errorf("holder: %w", err)
		}
	}
	failures := map[string]int64{}
	for k, c := range children {
		if !c.lines.Scan() {
			return r, fmt.Errorf("child %d sent no report", k)
		}
		if err := json.Unmarshal(c.lines.Bytes(), &c.report); err != nil {
			return r, fmt.Errorf("child %d: %w", k, err)
		}
		if err := c.cmd.Wait(); err != nil {
			return r, fmt.Errorf("child %d: %w", k, err)
		}
		r.Loads += c.report.Loads
		for m, n := range c.report.Failures {
			failures[m] += n
		}
		for target, values := range c.report.Got {
			for v, n := range values {
				if v == want[target] {
					r.Got += n
				} else {
					failures["got another result than its target's job's"] += int64(n)
				}
			}
		}
	}
	r.Note += errorCounts(failures)
	return r, nil
}

// childDSN is the URL of the benchmark's schema for a connection named app.
func (b *bench) childDSN(app string) string {
	sep := "?"
	if strings.Contains(b.o.dsn, "?") {
		sep = "&"
	}
	return b.o.dsn + sep + "search_path=" + b.o.schema + "&application_name=" + app
}

// waitChild is a child process of spread: o.waitWaiters calls of Do, spread
// over o.waitTargets, on one runner. It prints "ready" once every call has
// begun, the process has read the row of every target and has sent
// LISTEN, and then its spreadChild report as one line of JSON.
func waitChild(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	targets := strings.Split(o.waitTargets, ",")
	tr := &waitTracer{}
	db, sqlDB, err := openGorm(o.dsn, 8, tr)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	runner, err := newWaitRunner(db, tr)
	if err != nil {
		return err
	}
	rep := spreadChild{Got: map[string]map[string]int{}, Failures: map[string]int64{}}
	var mu sync.Mutex
	var loads atomic.Int64
	var calling atomic.Int64
	var wg sync.WaitGroup
	for i := range o.waitWaiters {
		target := targets[i%len(targets)]
		wg.Go(func() {
			calling.Add(1)
			v, _, err := runner.Do(ctx, target,
				func(context.Context) (string, error) { return "", errWaiterRan },
				func(*gorm.DB, string) error { return nil }, loadResult(target, &loads))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rep.Failures[err.Error()]++
				return
			}
			if rep.Got[target] == nil {
				rep.Got[target] = map[string]int{}
			}
			rep.Got[target][v]++
		})
	}
	if err := runs.WaitUntil(ctx, 30*time.Second, func() bool {
		return calling.Load() == int64(o.waitWaiters) && tr.sent(kindListen, targets)
	}); err != nil {
		return fmt.Errorf("waiters did not start waiting: %w", err)
	}
	fmt.Println("ready")
	wg.Wait()
	rep.Loads = loads.Load()
	data, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}

// waitReport writes the waiting section of the report with p.
func (b *bench) waitReport(p func(format string, args ...any)) {
	p("\n## Waiting for a job in progress (Runner.Do; heartbeat every %v, so waiters poll at most %v apart; lease timeout %v)\n\n", waitInterval, waitInterval, waitTimeout)
	p("| measure | goal | measured | met |\n|---|---|---|---|\n")
	row := func(name, want, got string, met bool) {
		p("| %s | %s | %s | %s |\n", name, want, got, map[bool]string{true: "yes", false: "**no**"}[met])
	}
	cap := fmt.Sprintf("%.0f ms", ms(waitInterval))
	for _, w := range b.wake {
		ok := w.Samples > 0 && w.Failed == 0
		if strings.HasPrefix(w.Mode, "notifications") {
			row("wake-up latency with notifications (pgx), p50", "≤ 20 ms", fmt.Sprintf("%.1f ms", w.P50), ok && w.P50 <= 20)
			row("wake-up latency with notifications (pgx), p99", "≤ 100 ms", fmt.Sprintf("%.1f ms", w.P99), ok && w.P99 <= 100)
			continue
		}
		row("wake-up latency, polling only (lib/pq), p50", "≤ "+cap+" (the poll cap)", fmt.Sprintf("%.0f ms", w.P50), ok && w.P50 <= ms(waitInterval))
		row("wake-up latency, polling only (lib/pq), p99", "≤ "+cap+" (the poll cap)", fmt.Sprintf("%.0f ms", w.P99), ok && w.P99 <= ms(waitInterval))
	}
	if f := b.fan; f != nil {
		row(fmt.Sprintf("statements while %d waiters on one target wait for a %v job, per poll interval (%v)", f.Waiters, fanJob, waitInterval),
			"≤ 2", fmt.Sprintf("%.2f (%d in %.2f s)", f.PerPoll, f.total(), f.Wait), f.PerPoll <= 2)
		if reads := f.Statements[kindRead]; reads > 0 {
			p("| statements per poll of their shared watch (per read of the row) | (reference) | %.2f (%d reads) |  |\n", float64(f.total())/float64(reads), reads)
		}
		row(fmt.Sprintf("calls of load for those %d waiters", f.Waiters), "1", fmt.Sprint(f.Loads), f.Loads == 1)
		row(fmt.Sprintf("of those %d waiters, those given the job's result", f.Waiters), fmt.Sprint(f.Waiters), fmt.Sprint(f.Got), f.Got == f.Waiters)
	}
	if s := b.spreadR; s != nil {
		row(fmt.Sprintf("waiters given their target's result, %d over %d targets and %d processes", s.Waiters, spreadTargets, s.Processes),
			fmt.Sprint(s.Waiters), fmt.Sprint(s.Got), s.Got == s.Waiters)
		row("listener connections per process while they wait (pg_stat_activity, most seen)", "≤ 1", fmt.Sprint(s.Listeners), s.Listeners <= 1 && s.Samples > 0)
	}
	if len(b.wake) > 0 {
		p("\n| waiters' pool | samples | p50 ms | p99 ms | max ms | failed | notes |\n|---|---|---|---|---|---|---|\n")
		for _, w := range b.wake {
			p("| %s | %d | %.1f | %.1f | %.1f | %d | %s |\n", w.Mode, w.Samples, w.P50, w.P99, w.Max, w.Failed, w.Note)
		}
	}
	if f := b.fan; f != nil {
		p("\n%d waiters on one target: from the first call of Do to the holder's COMMIT (%.2f s), their pool sent %d statements: ", f.Waiters, f.Wait, f.total())
		var parts []string
		for _, k := range []string{kindRead, kindMark, kindListen, kindLoad, kindOther} {
			if n := f.Statements[k]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s × %d", k, n))
			}
		}
		p("%s. They called load %d %s in all. %s\n", strings.Join(parts, ", "), f.Loads, map[bool]string{true: "time", false: "times"}[f.Loads == 1], f.Note)
	}
	if s := b.spreadR; s != nil {
		p("\n%d waiters over %d targets and %d processes: %d got their target's result; load was called %d times in all (one per target and process is %d); at most %d listener connections per process and %d in all over %d samples of pg_stat_activity. %s\n",
			s.Waiters, spreadTargets, s.Processes, s.Got, s.Loads, spreadTargets*s.Processes, s.Listeners, s.ListenersAll, s.Samples, s.Note)
	}
}
