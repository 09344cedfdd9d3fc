package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// loadAverage is the machine's 1-minute load average.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "n/a"
}

// rounds returns the rounds of impl in scenario at workers, by round.
func (b *bench) rounds(scenario, impl string, workers int) []result {
	var rs []result
	for _, r := range b.results {
		if r.Scenario == scenario && r.Impl == impl && r.Workers == workers {
			rs = append(rs, r)
		}
	}
	return rs
}

// find returns the median round of impl in scenario at workers (by ops/s),
// with the statements and WAL of its measuring point.
func (b *bench) find(scenario, impl string, workers int) (result, bool) {
	rs := b.rounds(scenario, impl, workers)
	if len(rs) == 0 {
		return result{}, false
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(x, y result) int { return cmp.Compare(x.OpsPerSec, y.OpsPerSec) })
	med := sorted[(len(sorted)-1)/2]
	med.WALSyncOp, med.WALRecOp = -1, -1
	for _, w := range b.walPoints {
		if w.Scenario == scenario && w.Impl == impl && w.Workers == workers {
			med.StmtPerOp, med.WALSyncOp, med.WALRecOp = w.StmtPerOp, w.WALSyncOp, w.WALRecOp
		}
	}
	var ops, acquired, errs int64
	kinds := map[string]int64{}
	for _, r := range rs {
		ops, acquired, errs = ops+r.Ops, acquired+r.Acquired, errs+r.Errors
		for m, n := range r.ErrorKinds {
			kinds[m] += n
		}
		if med.Note == "" {
			med.Note = r.Note
		}
	}
	med.Errors, med.ErrorKinds = errs, kinds
	switch {
	case contended(scenario):
		med.Note = fmt.Sprintf("%d of %d attempts acquired. %s", acquired, ops, med.Note)
	case acquired < ops:
		med.Note = fmt.Sprintf("%d of %d attempts refused or failed, on targets no other worker takes; ops/s counts only the others. %s", ops-acquired, ops, med.Note)
	}
	return med, true
}

// overlaps returns the overlapping holders seen, by implementation.
func (b *bench) overlaps() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.overlapCount)
}

// ratio is the median over the rounds of a's ops/s over c's in the same
// round, run back to back.
func (b *bench) ratio(scenario, a, c string, workers int) float64 {
	x, y := b.rounds(scenario, a, workers), b.rounds(scenario, c, workers)
	var rs []float64
	for i := range min(len(x), len(y)) {
		if y[i].OpsPerSec > 0 {
			rs = append(rs, x[i].OpsPerSec/y[i].OpsPerSec)
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	return rs[(len(rs)-1)/2]
}

// goal is one of the goals that the benchmark checks, with what the run
// measured.
type goal struct {
	name, want, got string
	met             bool
	// reference marks a row that is no goal, shown beside one to read it.
	reference bool
}

func (b *bench) goals() []goal {
	const me, plain = "gormlease", "plain-SQL lease, raw pgx"
	var ts []goal
	add := func(name, want string, got float64, format string, met bool) {
		ts = append(ts, goal{name: name, want: want, got: fmt.Sprintf(format, got), met: met})
	}
	reference := func(name string, got float64) {
		ts = append(ts, goal{name: name, want: "(reference)", got: fmt.Sprintf("%.2f×", got), reference: true})
	}
	r := b.ratio("full job", me, plain, 8)
	add("full job vs a plain-SQL lease on raw pgx, 8 workers", "≥ 1.3×", r, "%.2f×", r >= 1.3)
	// Against the faster of the two GORM configurations: the less
	// flattering ratio.
	gormAgainst, r := plainGormName, b.ratio("full job", me, plainGormName, 8)
	if d := b.ratio("full job", me, plainGormDefaultsName, 8); d > 0 && (r <= 0 || d < r) {
		gormAgainst, r = plainGormDefaultsName, d
	}
	add(fmt.Sprintf("full job vs the plain-SQL lease through GORM (what a GORM team would write by hand; the faster configuration here: %s), 8 workers", gormAgainst), "≥ 1.5×", r, "%.2f×", r >= 1.5)
	reference("full job, gormlease's SQL on raw pgx (no GORM, no database/sql) vs a plain-SQL lease on raw pgx, 8 workers",
		b.ratio("full job", rawName, plain, 8))
	reference("full job vs a plain-SQL lease on raw pgx, 1 worker", b.ratio("full job", me, plain, 1))
	// Against pglock, the target is read against its fastest configuration
	// here: the least flattering ratio.
	fastest, against := 0.0, ""
	for _, name := range pglockNames {
		if r := b.ratio("full job", me, name, 8); r > 0 && (against == "" || r < fastest) {
			fastest, against = r, name
		}
	}
	if against != "" {
		add(fmt.Sprintf("full job vs pglock's fastest configuration here (%s), 8 workers", against), "≥ 2×", fastest, "%.2f×", fastest >= 2)
	}
	withErrors := func(name string) string {
		if j, ok := b.find("full job", name, 8); ok && j.Errors > 0 {
			name += fmt.Sprintf(" (%d errors, explained below)", j.Errors)
		}
		return name
	}
	r = b.ratio("full job", me, pglockPgx, 8)
	add(fmt.Sprintf("full job vs %s, 8 workers", withErrors(pglockPgx)), "≥ 1.5×", r, "%.2f×", r >= 1.5)
	for _, name := range pglockNames {
		if r := b.ratio("full job", me, name, 8); name != against && name != pglockPgx && r > 0 {
			reference(fmt.Sprintf("full job vs %s, 8 workers", withErrors(name)), r)
		}
	}
	if j, ok := b.find("full job", me, 1); ok {
		add("queries (round trips) per full job (saver: 1 statement), 1 worker", "≤ 1 + 5", j.StmtPerOp, "%.2f", j.StmtPerOp <= 6)
		add("WAL flushes (pg_stat_wal wal_sync) per full job, 1 worker, least of 3 points", "≤ 2", j.WALSyncOp, "%.2f", j.WALSyncOp <= 2)
	}
	if r := b.ratio("full job", historyName, me, 8); r > 0 {
		add("full job with history (WithHistory's triggers) vs without, 8 workers", "≥ 0.85×", r, "%.2f×", r >= 0.85)
		reference("full job with history vs without, 1 worker", b.ratio("full job", historyName, me, 1))
		reference("acquire+release with history vs without, 8 workers", b.ratio("acquire+release", historyName, me, 8))
	}
	if j, ok := b.find("full job", historyName, 1); ok {
		add("queries (round trips) per full job with history, 1 worker", "as without: ≤ 1 + 5", j.StmtPerOp, "%.2f", j.StmtPerOp <= 6)
	}
	r = b.ratio(contendedScenario, me, plain, 32)
	add("contended attempts/s vs a plain-SQL lease's upsert, 32 workers", "≥ 5×", r, "%.2f×", r >= 5)
	for _, w := range []int{1, 8, 32} {
		r = b.ratio("acquire+release", me, plain, w)
		add(fmt.Sprintf("acquire+release vs a plain-SQL lease on raw pgx, %d workers", w), "≥ 0.9×", r, "%.2f×", r >= 0.9)
	}
	r = b.ratio(newTargetsScenario, me, plain, 32)
	add("acquire+release on targets never acquired before vs a plain-SQL lease's upsert, 32 workers", "≥ 1.0×", r, "%.2f×", r >= 1)
	if b.hotShare > 0 {
		add("HOT updates on job_lease after the throughput points (n_tup_hot_upd / n_tup_upd)", "≥ 95%", 100*b.hotShare, "%.1f%%", b.hotShare >= 0.95)
	}
	for _, h := range b.hb {
		if h.Impl != "gormlease, batched" {
			continue
		}
		add(fmt.Sprintf("heartbeat statements/s, %d leases at 1 s", h.Held), "≤ 10", h.StmtPerSec, "%.1f", h.StmtPerSec <= 10)
		add("oldest lease heartbeat age", "≤ 1.1 s", h.MaxAge, "%.3f s", h.MaxAge >= 0 && h.MaxAge <= 1.1)
		add("client CPU while holding them", "< 10% of a core", h.CPUCore, "%.1f%%", h.CPUCore < 10)
		add("leases lost while holding them", "0", float64(h.Lost), "%.0f", h.Lost == 0)
		add("connections in use, mean over 50 ms samples", "only during beats", h.InUse, "%.2f", h.InUse < 1)
	}
	for _, s := range b.sat {
		if strings.Contains(s.Setup, "WithHeartbeatDB") {
			add("leases lost with WithHeartbeatDB, saturated main pool", "0", float64(s.Lost), "%.0f", s.Lost == 0)
		}
	}
	overlaps := 0
	for _, n := range b.overlaps() {
		if n != 0 {
			overlaps++
		}
	}
	refusedWrite := true
	for _, c := range b.checks {
		if strings.HasPrefix(c, me+": after") {
			refusedWrite = !strings.Contains(c, "untouched")
		}
	}
	ts = append(ts, goal{name: "a refused acquire leaves the lease row untouched (xmin, xmax)", want: "yes", got: map[bool]string{false: "yes", true: "no"}[refusedWrite], met: !refusedWrite})
	add("implementations with overlapping holders", "0", float64(overlaps), "%.0f", overlaps == 0)
	return ts
}

var implOrder = append([]string{"gormlease", rawName, "plain-SQL lease, raw pgx", plainGormName, plainGormDefaultsName, "advisory lock"}, pglockNames...)

// explainErrors lists errors counted by message, each with its
// explanation.
func explainErrors(kinds map[string]int64) string {
	var parts []string
	for _, m := range byCount(kinds) {
		why, ok := explainedErrors[m]
		if !ok {
			why = "not explained by this report"
		}
		parts = append(parts, fmt.Sprintf("%d × “%s” (%s)", kinds[m], m, why))
	}
	return strings.Join(parts, "; ")
}

func report(b *bench, elapsed time.Duration) string {
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	var version string
	_ = b.admin.QueryRow(context.Background(), `SELECT current_setting('server_version')`).Scan(&version)
	p("# Performance\n\n")
	p("Generated by `cd bench && go run . -out ../docs/performance.md` (%s, %d CPUs, PostgreSQL %s, fsync on; run took %s). ",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), version, elapsed.Round(time.Second))
	p("Each lock and job point ran every implementation for %v in %d slices, taking turns slice by slice, each slice on a fresh pool, once the last slice's backends had exited, so that neighbours in time share the load of the machine. Before a slice counts, each of its workers runs, uncounted, at least %d operations (the acquire+release and full job points: one on each of its %d targets; for at most %v) and for at least %v, so that every connection has prepared its statements and had them planned past PostgreSQL's first five executions, and the implementation has seen its targets (see *A fresh connection's first statements*). ops/s, latencies and CPU are those of the median slice, and a ratio is the median of the slices' ratios; server CPU is that of the pool's backends (/proc/<pid>/stat) over the slice. Statements and WAL come from one more %v point per implementation, counted from its first operation, with WAL read once its connections had closed. ", b.o.duration, b.o.rounds, b.o.warmOps, targetsPerWorker, maxWarmup, b.o.warmup, b.o.walDuration)
	p("Every figure below comes from that one run against one PostgreSQL server (%s), on a machine that other processes shared (load average, 1 min, from /proc/loadavg: %s at the start, %s at the end); compare the ratios, not the absolute numbers.\n\n",
		b.server, b.loadStart, loadAverage())
	b.inflightReport(p)
	p("\n## Goals\n\n| measure | goal | measured | met |\n|---|---|---|---|\n")
	for _, t := range b.goals() {
		mark := "yes"
		switch {
		case t.reference:
			mark = ""
		case !t.met:
			mark = "**no**"
		}
		p("| %s | %s | %s | %s |\n", t.name, t.want, t.got, mark)
	}

	table := func(title, scenario string, workers []int) {
		p("\n## %s\n\n| implementation | workers | ops/s | p50 ms | p99 ms | statements/op | WAL flushes/op | WAL records/op | client CPU µs/op | server CPU µs/op | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n", title)
		for _, w := range workers {
			for _, name := range implOrder {
				r, ok := b.find(scenario, name, w)
				if !ok {
					continue
				}
				stmts := fmt.Sprintf("%.2f", r.StmtPerOp)
				if r.StmtPerOp < 0 {
					stmts = "†"
				}
				note := r.Note
				if r.Errors > 0 {
					note = fmt.Sprintf("%d %s: %s. %s", r.Errors, map[bool]string{true: "error", false: "errors"}[r.Errors == 1], explainErrors(r.ErrorKinds), note)
				}
				p("| %s | %d | %.0f | %.2f | %.2f | %s | %.2f | %.2f | %.0f | %.0f | %s |\n",
					name, w, r.OpsPerSec, r.P50, r.P99, stmts, r.WALSyncOp, r.WALRecOp, r.CPUPerOp, r.ServerOp, strings.TrimSpace(note))
			}
		}
	}
	table("Acquire + release", "acquire+release", []int{1, 8, 32})
	table("Acquire + release on targets never acquired before (one-shot IDs)", newTargetsScenario, []int{32})
	table("32 workers contending on one target (attempts; each holder sleeps 200 µs)", contendedScenario, []int{32})
	table("Full job: acquire, fenced commit of a one-row saver, release", "full job", []int{1, 8})
	b.candidatesReport(p)

	p("\n## Holding many leases at once (heartbeat every %v, lease timeout %v)\n\n", hbInterval, hbTimeout)
	p("| implementation | leases held | heartbeat statements/s | all statements/s | renewals/s | missed | oldest heartbeat | client CPU (%% of a core) | connections in use (mean) | samples with a connection in use | lost | notes |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, h := range b.hb {
		age := "n/a (no timestamp)"
		if h.MaxAge >= 0 {
			age = fmt.Sprintf("%.3f s", h.MaxAge)
		}
		all := "† " + fmt.Sprintf("%.0f", 2*h.RenewPerSec)
		if h.AllPerSec >= 0 {
			all = fmt.Sprintf("%.1f", h.AllPerSec)
		}
		p("| %s | %d | %.1f | %s | %.0f | %.1f%% | %s | %.1f%% | %.2f | %.0f%% | %d | %s |\n",
			h.Impl, h.Held, h.StmtPerSec, all, h.RenewPerSec, h.Missed, age, h.CPUCore, h.InUse, h.InUseIdle, h.Lost, h.Note)
	}

	p("\n## Work that saturates the main pool (heartbeat 200 ms, lease timeout 1 s; each job's work runs `SELECT pg_sleep(0.25)` on the main pool for 3 s)\n\n")
	p("| setup | jobs | completed | lease lost |\n|---|---|---|---|\n")
	for _, r := range b.sat {
		p("| %s | %d | %d | %d |\n", r.Setup, r.Jobs, r.Completed, r.Lost)
	}

	if len(b.wake) > 0 || b.fan != nil || b.spreadR != nil {
		b.waitReport(p)
	}

	p("\n## Safety checks\n\n")
	overlaps := b.overlaps()
	for _, name := range implOrder {
		p("- %s: %d overlapping holders over all contended rounds\n", name, overlaps[name])
	}
	for _, c := range b.checks {
		p("- %s\n", c)
	}
	p(`
## How it is measured

- **Implementations.** *gormlease*: Repository.Acquire/Release for the lock scenarios, Runner.Run for the full job, on gorm with pgx's database/sql driver. *gormlease SQL, raw pgx*: a reference, not an alternative: gormlease's PostgreSQL statements (the acquire; the fenced commit as BEGIN, the release's UPDATE as the locking statement, the saver, COMMIT, each prepared) on a pgx pool, without GORM or database/sql, on a table of its own; it tells what the design costs apart from the stack it runs on. *plain-SQL lease, raw pgx*: the baseline, a heartbeat lease written the simplest way in plain SQL, on a pgx pool: acquire with an upsert (... WHERE updated_at < now() - timeout), commit with SELECT ... FOR UPDATE, save, COMMIT, release with a DELETE; it keeps no generation. *plain-SQL lease through GORM*: the same statements on the same tables, written by hand as a GORM team would: a *gorm.DB on gorm.io/driver/postgres over pgx's database/sql driver, with PrepareStmt and SkipDefaultTransaction (the settings GORM's documentation recommends for performance), and again with GORM's defaults (*through GORM, defaults*: pgx's database/sql driver then prepares each statement once per connection itself), acquire and release with db.Exec (checking RowsAffected), the commit in db.Transaction: the token read with tx.Raw(... FOR UPDATE).Scan, then tx.Exec of the saver. *advisory lock*: pg_try_advisory_lock / pg_advisory_unlock on a connection pinned while held. *pglock*: cirello.io/pglock v1.16.0 with FailIfLocked and the 30 s lease duration every implementation has here; its full job commits the saver in a plain transaction (pglock has no fenced commit). *pglock, lib/pq* and *pglock, pgx* keep its heartbeat goroutine, which its defaults and its README's example turn on: a goroutine per lock that beats every 5 s by default, its first beat as soon as the lock is taken. lib/pq is the driver pglock.New accepts; on pgx's database/sql driver pglock needs pglock.UnsafeNew. *pglock, pgx, WithHeartbeatFrequency(0)* is configured as pglock's own tests are when the caller sends the heartbeats: no heartbeat goroutine, and the full job calls SendHeartbeat every 5 s itself (the interval gormlease's runner has here), stopping without cancelling a beat in flight; a job of milliseconds sends none, as gormlease's runner sends none in it.
- **Statements per op** are queries, that is round trips, counted on the client by a pgx tracer on every pool (BEGIN and COMMIT included). gormlease's fenced commit on PostgreSQL sends BEGIN and its locking UPDATE (prepared once per connection) in one round trip, and ends with one query that checks the transaction was not aborted and commits (SELECT 1; COMMIT), both on the connection's wire protocol, where the tracer does not see them: its full job is 4 round trips holding 6 statements, the saver's included, of which the table counts 2. *plain-SQL lease through GORM* is counted on its sockets instead, each write one round trip: with PrepareStmt, GORM caches a statement it first prepared within a transaction bound to that transaction, so database/sql prepares it again (Parse) in each later transaction and deallocates it (Close) when that one ends, round trips that pgx's tracer does not see: its full job sends the plain-SQL lease's 6 queries in 10 round trips; *through GORM, defaults*, counted the same way, sends them in 6. Their counts also take in each connection's first Parse of each statement, which the tracer leaves out of the other rows (pgx's native pools prepare their statements too): with 32 workers on a fresh pool those add up to half a round trip per operation over a short point. Server time per statement comes from pg_stat_statements where the server loads it (the candidates section). † lib/pq has no tracer; pglock sends the same statements on both drivers (see its pgx row), and each heartbeat is two statements (nextval and UPDATE).
- **WAL flushes and records** are pg_stat_wal deltas (wal_sync, wal_records) over each point divided by its operations. They are server-wide: other sessions' writes add to them, and group commit lowers them when workers commit together; the 1-worker full job is the clean figure.
- **Client CPU** is getrusage(RUSAGE_SELF) over each point: the whole benchmark process.
- **Reading the ratios.** *plain-SQL lease, raw pgx* runs on pgx's native pool, with neither database/sql nor GORM. gormlease sends its own statements straight to the pool under the *gorm.DB (docs/design.md says why), so GORM costs it client CPU only for the saver's statement, and its client CPU per operation is close to the plain-SQL lease's or below. The machine's 2 cores are shared by the client, the server and other sessions: with 8 workers a full job is bound by CPU, and group commit folds the workers' WAL flushes together, so the plain-SQL lease's third write and two extra round trips cost it less there than with 1 worker, where flushes and round trips set the pace. The reference row, *gormlease SQL, raw pgx*, separates the design from its stack: what it cannot reach, GORM and database/sql cannot either, and where gormlease's ratio is below the plain-SQL lease's, compare it with that row first. Its cycle writes two new versions of a row that stays (the takeover's UPDATE and the release's), where the plain-SQL lease inserts a row and deletes it (see *What each part of the acquire and release costs*). The plain-SQL lease's refused upserts each lock the row and wait for a WAL flush, so its contended rate follows the disk's flush latency, while a refused gormlease acquire writes nothing and is bound by CPU.
- **pglock's release errors** ("lock is already released", pglock.ErrLockAlreadyReleased) come from its default heartbeats on pgx, not from the lease settings (30 s lease, 5 s heartbeat: pglock asks for at most half the lease) nor from a cancelled context of the benchmark's. The lock's heartbeat goroutine sends its first beat (SELECT nextval, then UPDATE ... SET record_version_number = the new number WHERE record_version_number = the lock's) as soon as the lock is taken, and ReleaseContext cancels that goroutine's context before it deletes the row WHERE record_version_number = the lock's. A job of a few milliseconds is released while that first beat is often still waiting for a connection or in flight. On cancellation pgx (a driver pglock.New refuses: these rows use UnsafeNew) stops reading the reply and closes the connection, even when the server has already committed the UPDATE; pglock then keeps the old number, the DELETE matches no row, ReleaseContext returns the error, and the row stays behind under a number that no client knows. A FailIfLocked acquire never takes such a row over (only a waiting Acquire does, after the lease duration), so every later attempt on that target in the run is refused: the notes count those attempts, which ops/s leaves out. A check with a tracer on the beats found, for each failed release, the row holding the number of a heartbeat UPDATE that the client had seen fail with "context canceled". lib/pq, on a cancelled context, sends the server a cancel request over a connection of its own and still reads the reply, so pglock learns whether the UPDATE ran and its releases do not fail; but it marks the connection bad, so each beat cancelled in flight costs it two new connections. The beats a job sends before its release vary with that race, hence pglock's statements per op with its defaults. With WithHeartbeatFrequency(0) pglock starts no heartbeat goroutine, and none of this happens.
- **Saturated pool.** Each job's work keeps the 4-connection main pool busy with 250 ms queries once all 16 jobs hold their lease; a heartbeat on that pool waits behind them for longer than the 900 ms the lease is trusted without one.
- **Waiting** (Runner.Do, every runner with a 1 s heartbeat, so that waiters poll at most 1 s apart, and a 5 s lease timeout). *Wake-up latency* runs %[1]d jobs per pool, %[2]d targets at a time, each job held by Runner.Run on a pool of its own in this process and waited for by one Do on the waiters' pool: gormlease wakes in-process only the waiters on the pool that committed, so they learn of the commit as a process of their own would, by notification or by poll, and both times are read on one clock. Each job ends between 200 ms and 3 s after Do was called, so that its commit falls anywhere in the waiter's poll schedule; the latency runs from the moment the holder's client got the answer to its COMMIT (a pgx tracer on the holder's pool; the server committed a little before) to the return of Do with the job's result, its load included. *With notifications*: gorm on pgx's database/sql driver, whose connections gormlease listens on. *Polling only*: gorm on lib/pq, as an application may configure it: gormlease cannot listen on lib/pq's connections, so its waiters only poll. *1,000 waiters on one target*: 1,000 goroutines call Do on one runner, as the requests of one process would, once a job of 2 s has begun on another pool; the statements are those that the waiters' pool sent (a pgx tracer, by statement) from the first call until the holder sent its COMMIT, per 1 s poll interval; the loads are the calls of the load function. *1,000 waiters over 10 targets and 4 processes*: this command runs itself again as 4 child processes of 250 waiters each, 25 per target, each process with one runner on a pool of its own, and holds the 10 jobs from this process until every child has begun its calls and read every row, and every row is marked as waited on; meanwhile it counts the connections of each process (by application_name) whose last query in pg_stat_activity is LISTEN gormlease, every 20 ms.
- **Operations** (listing and pruning at scale, at the end of this file when present) come from another command, opsbench, which writes its section between two marker comments; this command keeps that section when it rewrites the rest of the file, and opsbench replaces only its own. Both, one after the other: `+"`cd bench && go run . -out ../docs/performance.md && go run ./opsbench -out ../docs/performance.md`"+` (about 10 minutes).
- **Heartbeats**: gormlease's Runs start with at most 4 acquires in flight on its pool of 8, so that the heartbeats of the leases already held find a connection meanwhile (a pool saturated by other statements is the saturation section's case); after all leases are held and one and a quarter intervals have passed, a window of whole intervals, its counts read when it ends (a batched heartbeat's statements are spread evenly over the interval, so a window that overran would count one more), measures the heartbeat statements (tracer; gormlease's batched ones through gorm's logger), the rows they renewed (command tags; for gormlease, whose logger reports its batched statements with placeholders for the leases, the held rows that the table shows renewed since the last reading, read at the window's start, once an interval and at its end, over the database's time between the first reading and the last; for pglock, the advance of its record-version sequence, one per beat), the oldest heartbeat time in the table every 50 ms, and the pool's connections in use every 50 ms. *missed* is 1 - renewals / (leases / interval).
`, b.o.waitSamples, wakeLanes)
	return s.String()
}
