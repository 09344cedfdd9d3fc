package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cirello.io/pglock"
	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/bench/internal/runs"
)

// hbInterval and hbTimeout are the heartbeat scenario's settings.
const (
	hbInterval = time.Second
	hbTimeout  = 5 * time.Second
)

// perLeaseConns is the pool size of the implementations that send one
// statement per lease: they need many connections to keep up at all.
const perLeaseConns = 24

// pglockAcquireFor bounds the time pglock takes its locks in.
const pglockAcquireFor = 20 * time.Second

// hbResult is one implementation holding many leases at once.
type hbResult struct {
	Impl        string  `json:"impl"`
	Leases      int     `json:"leases"`
	Held        int64   `json:"held"`
	StmtPerSec  float64 `json:"heartbeat_statements_per_sec"`
	AllPerSec   float64 `json:"all_statements_per_sec"`
	RenewPerSec float64 `json:"renewals_per_sec"`
	Missed      float64 `json:"missed_pct"`
	MaxAge      float64 `json:"max_age_s"` // -1: not measurable
	CPUCore     float64 `json:"cpu_core_pct"`
	InUse       float64 `json:"conns_in_use_mean"`
	InUseIdle   float64 `json:"conns_in_use_between_beats_pct"`
	Lost        int64   `json:"lost"`
	Note        string  `json:"note,omitempty"`
}

func (r hbResult) String() string {
	return fmt.Sprintf("heartbeat  %-26s leases=%d held=%d hb-stmt/s=%.1f all-stmt/s=%.1f renew/s=%.0f missed=%.1f%% maxage=%.2fs cpu=%.1f%% inuse=%.2f lost=%d %s",
		r.Impl, r.Leases, r.Held, r.StmtPerSec, r.AllPerSec, r.RenewPerSec, r.Missed, r.MaxAge, r.CPUCore, r.InUse, r.Lost, r.Note)
}

// window measures a heartbeat scenario for o.hbWindow: statements from c,
// CPU, the oldest lease (age, when the table keeps a heartbeat time) and
// the connections in use (inUse, when there is a database/sql pool). The
// counts are read when the window ends, to the timer's precision, not at
// the next sample: a batched heartbeat's statements are spread evenly over
// the interval, so a window that overran by a sample would count one or two
// more than its length holds. The renewals come from c's command tags, or
// from beats, a count that each renewal advances, or, with renewedSince
// set, from the table: that query answers, for a time on the database's
// clock ($1), the held rows renewed since then and the database's time
// now; it is read at the window's start, at each whole heartbeat interval
// and at its end, each reading counting the rows renewed since the last
// (each at most once), over the database's time between the first and the
// last.
func (b *bench) window(ctx context.Context, r *hbResult, c *counter, age string, inUse func() int, beats func() int64, renewedSince string) {
	var stmts0, beats0, renewed0 int64
	if c != nil {
		stmts0, beats0, renewed0 = c.statements.Load(), c.beats.Load(), c.renewed.Load()
	}
	var ext0 int64
	if beats != nil {
		ext0 = beats()
	}
	cpu0 := cpuTime()
	start := time.Now()
	end := start.Add(b.o.hbWindow)
	var renewals int64
	var since, first time.Time
	readRenewed := func() {
		var n int64
		var now time.Time
		if err := b.admin.QueryRow(ctx, renewedSince, since).Scan(&n, &now); err == nil {
			renewals, since = renewals+n, now
		}
	}
	if renewedSince != "" {
		since = time.Now().Add(time.Hour) // none renewed since: only the time
		readRenewed()
		renewals, first = 0, since
	}
	nextRead := start.Add(hbInterval)
	var samples, busy, inUseSum int
	r.MaxAge = -1
	for ctx.Err() == nil {
		time.Sleep(min(50*time.Millisecond, time.Until(end)))
		if !time.Now().Before(end) {
			break
		}
		if renewedSince != "" && !time.Now().Before(nextRead) {
			readRenewed()
			nextRead = nextRead.Add(hbInterval)
		}
		if inUse != nil {
			n := inUse()
			samples++
			inUseSum += n
			if n > 0 {
				busy++
			}
		}
		if age != "" {
			var a float64
			if err := b.admin.QueryRow(ctx, age).Scan(&a); err == nil && a > r.MaxAge {
				r.MaxAge = a
			}
		}
	}
	secs := time.Since(start).Seconds()
	r.CPUCore = 100 * (cpuTime() - cpu0).Seconds() / secs
	r.AllPerSec = -1
	if c != nil {
		r.AllPerSec = float64(c.statements.Load()-stmts0) / secs
		r.StmtPerSec = float64(c.beats.Load()-beats0) / secs
		r.RenewPerSec = float64(c.renewed.Load()-renewed0) / secs
	}
	if beats != nil {
		r.RenewPerSec = float64(beats()-ext0) / secs
	}
	if renewedSince != "" {
		readRenewed()
		if span := since.Sub(first).Seconds(); span > 0 {
			r.RenewPerSec = float64(renewals) / span
		}
	}
	r.Missed = max(0, 100*(1-r.RenewPerSec/(float64(r.Held)/hbInterval.Seconds())))
	if samples > 0 {
		r.InUse = float64(inUseSum) / float64(samples)
		r.InUseIdle = 100 * float64(busy) / float64(samples)
	}
}

func (b *bench) addHB(r hbResult) {
	b.mu.Lock()
	b.hb = append(b.hb, r)
	b.mu.Unlock()
	fmt.Println(r)
}

// heartbeatScenarios holds o.leases leases at once with a 1 s heartbeat:
// gormlease's batched heartbeats, then one statement per lease (the
// plain-SQL lease's UPDATE on raw pgx, and pglock on pgx and on lib/pq).
func (b *bench) heartbeatScenarios(ctx context.Context) error {
	if err := b.hbGormlease(ctx); err != nil {
		return err
	}
	if err := b.hbPlain(ctx); err != nil {
		return err
	}
	for _, onPgx := range []bool{true, false} {
		if err := b.hbPglock(ctx, onPgx); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) hbGormlease(ctx context.Context) error {
	defer func(t time.Time) { fmt.Printf("gormlease heartbeats took %v\n", time.Since(t).Round(time.Second)) }(time.Now())
	c := &counter{isBeat: func(sql string) bool { return strings.Contains(sql, "unnest(") }}
	db, sqlDB, err := openGorm(b.dsn, 8, c)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	db = db.Session(&gorm.Session{Logger: beatLogger{Interface: logger.Discard, c: c}})
	runner, err := gormlease.NewRunner[string](db, gormlease.WithHeartbeatInterval(hbInterval),
		gormlease.WithLeaseTimeout(hbTimeout), gormlease.WithOperationTimeout(hbTimeout))
	if err != nil {
		return err
	}
	r := hbResult{Impl: "gormlease, batched", Leases: b.o.leases}
	h, err := runs.Hold(ctx, runner, b.o.leases, "hb-")
	defer h.End()
	if err != nil {
		return fmt.Errorf("gormlease: %w", err)
	}
	time.Sleep(hbInterval + hbInterval/4) // every lease renewed once
	r.Held = h.Held.Load()
	renewed := fmt.Sprintf(`SELECT count(*), clock_timestamp() FROM %s.job_lease
WHERE released_at IS NULL AND target_id LIKE 'hb-%%' AND updated_at > $1`, b.o.schema)
	b.window(ctx, &r, c, b.ageSQL("job_lease", "released_at IS NULL AND "), func() int { return sqlDB.Stats().InUse }, nil, renewed)
	r.Lost = h.Lost.Load()
	b.addHB(r)
	return nil
}

func (b *bench) ageSQL(table, where string) string {
	return fmt.Sprintf(`SELECT COALESCE(EXTRACT(epoch FROM max(clock_timestamp() - updated_at))::float8, 0)
FROM %s.%s WHERE %s target_id LIKE 'hb-%%'`, b.o.schema, table, where)
}

// parallel calls fn(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// hbPlain is the plain-SQL lease's heartbeat: one UPDATE per lease per interval, each
// lease with its own goroutine and timer, on raw pgx.
func (b *bench) hbPlain(ctx context.Context) error {
	im, err := newPlain(ctx, b.dsn, perLeaseConns)
	if err != nil {
		return err
	}
	defer im.close()
	pool := im.pool
	r := hbResult{Impl: "plain-SQL lease, raw pgx, per lease", Leases: b.o.leases}
	tokens := make([]string, b.o.leases)
	var acquireErr atomic.Value
	parallel(b.o.leases, perLeaseConns, func(i int) {
		tokens[i] = uuid.NewString()
		if _, err := pool.Exec(ctx, plainAcquire, fmt.Sprintf("hb-%d", i), tokens[i], hbTimeout.Seconds()); err != nil {
			acquireErr.CompareAndSwap(nil, err)
		}
	})
	if err, ok := acquireErr.Load().(error); ok {
		return err
	}
	hbCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range b.o.leases {
		wg.Go(func() {
			t := time.NewTicker(hbInterval)
			defer t.Stop()
			for {
				select {
				case <-hbCtx.Done():
					return
				case <-t.C:
				}
				_, _ = pool.Exec(hbCtx, plainHeartbeat, fmt.Sprintf("hb-%d", i), tokens[i])
			}
		})
	}
	time.Sleep(hbInterval + hbInterval/4)
	r.Held = int64(b.o.leases)
	b.window(ctx, &r, im.stmts, b.ageSQL("plain_lease", ""), func() int { return int(pool.Stat().AcquiredConns()) }, nil, "")
	cancel()
	wg.Wait()
	_, err = pool.Exec(ctx, `DELETE FROM plain_lease WHERE target_id LIKE 'hb-%'`)
	b.addHB(r)
	return err
}

// hbPglock holds the leases with pglock, whose every lock has a goroutine
// sending two statements a beat (nextval and UPDATE). Beats are counted
// from the lock table's sequence, which each one advances once.
func (b *bench) hbPglock(ctx context.Context, onPgx bool) error {
	defer func(t time.Time) {
		fmt.Printf("pglock heartbeats (pgx %v) took %v\n", onPgx, time.Since(t).Round(time.Second))
	}(time.Now())
	im, client, db, err := newPglock(b.dsn, perLeaseConns, onPgx, hbInterval)
	if err != nil {
		return err
	}
	table := pglockTable(onPgx, hbInterval)
	defer im.close()
	r := hbResult{Impl: im.name + ", per lock", Leases: b.o.leases, Note: "beats counted from the rvn sequence"}
	prefix := "hb-pq-"
	if onPgx {
		prefix = "hb-pgx-"
	}
	// The locks' heartbeats run on a context of their own, cancelled at the
	// end: releasing 10,000 locks one by one would only slow the run down.
	beatCtx, stopBeats := context.WithCancel(ctx)
	defer stopBeats()
	// Taking the locks is bounded in time: on lib/pq, the heartbeats of the
	// locks already held crowd out the acquires.
	acquireCtx, cancel := context.WithTimeout(ctx, pglockAcquireFor)
	defer cancel()
	locks, _ := acquirePglocks(acquireCtx, beatCtx, client, b.o.leases, prefix)
	if r.Held = int64(len(locks)); r.Held < int64(b.o.leases) {
		r.Note += fmt.Sprintf("; took only %d locks in %v", r.Held, pglockAcquireFor)
	}
	time.Sleep(hbInterval + hbInterval/4)
	seq := func() int64 {
		var v int64
		_ = b.admin.QueryRow(ctx, `SELECT last_value FROM `+b.o.schema+`.`+table+`_rvn`).Scan(&v)
		return v
	}
	b.window(ctx, &r, im.stmts, "", func() int { return db.Stats().InUse }, seq, "")
	if im.stmts == nil {
		r.StmtPerSec = 2 * r.RenewPerSec
		r.Note += "; 2 statements a beat"
	}
	stopBeats()
	if _, err := b.admin.Exec(ctx, `DELETE FROM `+b.o.schema+`.`+table+` WHERE name LIKE $1`, prefix+"%"); err != nil {
		return err
	}
	b.addHB(r)
	return nil
}

// acquirePglocks takes the pglock locks prefix0 to prefix<n-1> through
// client, on perLeaseConns goroutines, until acquireCtx ends, with their
// heartbeats on beatCtx, and returns those it took, with their names.
func acquirePglocks(acquireCtx, beatCtx context.Context, client *pglock.Client, n int, prefix string) ([]*pglock.Lock, []string) {
	var mu sync.Mutex
	var locks []*pglock.Lock
	var names []string
	parallel(n, perLeaseConns, func(i int) {
		if acquireCtx.Err() != nil {
			return
		}
		name := fmt.Sprintf("%s%d", prefix, i)
		l, err := client.AcquireContext(acquireCtx, name, pglock.FailIfLocked(), pglock.WithCustomHeartbeatContext(beatCtx))
		if err == nil {
			mu.Lock()
			locks, names = append(locks, l), append(names, name)
			mu.Unlock()
		}
	})
	return locks, names
}

// satResult is one run of the pool saturation scenario.
type satResult struct {
	Setup     string  `json:"setup"`
	Jobs      int     `json:"jobs"`
	Completed int64   `json:"completed"`
	Lost      int64   `json:"lost"`
	MaxAge    float64 `json:"max_age_s"`
}

// saturationScenarios runs jobs whose work keeps the main pool busy, with
// and without WithHeartbeatDB, and counts the leases lost.
func (b *bench) saturationScenarios(ctx context.Context) error {
	for _, separate := range []bool{false, true} {
		if err := b.saturation(ctx, separate); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) saturation(ctx context.Context, separate bool) error {
	const (
		jobs     = 16
		conns    = 4
		interval = 200 * time.Millisecond
		timeout  = time.Second
		workFor  = 3 * time.Second
	)
	db, sqlDB, err := openGorm(b.dsn, conns, &counter{})
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	opts := []gormlease.Option{gormlease.WithHeartbeatInterval(interval), gormlease.WithLeaseTimeout(timeout),
		gormlease.WithOperationTimeout(5 * time.Second)}
	setup := fmt.Sprintf("%d jobs, main pool of %d, heartbeats on the main pool", jobs, conns)
	if separate {
		hbDB, hbSQL, err := openGorm(b.dsn, 1, &counter{})
		if err != nil {
			return err
		}
		defer hbSQL.Close()
		opts = append(opts, gormlease.WithHeartbeatDB(hbDB))
		setup = fmt.Sprintf("%d jobs, main pool of %d, WithHeartbeatDB (pool of 1)", jobs, conns)
	}
	runner, err := gormlease.NewRunner[string](db, opts...)
	if err != nil {
		return err
	}
	r := satResult{Setup: setup, Jobs: jobs, MaxAge: -1}
	var completed, lost atomic.Int64
	var wg, inside sync.WaitGroup
	inside.Add(jobs)
	for i := range jobs {
		wg.Go(func() {
			_, err := runner.Run(ctx, fmt.Sprintf("sat-%v-%d", separate, i), func(ctx context.Context) (string, error) {
				// Saturate the pool only once every job holds its lease.
				inside.Done()
				inside.Wait()
				for begun := time.Now(); time.Since(begun) < workFor; {
					if err := db.WithContext(ctx).Exec(`SELECT pg_sleep(0.25)`).Error; err != nil {
						return "", err
					}
				}
				return "ok", nil
			}, func(tx *gorm.DB, v string) error { return nil })
			switch {
			case err == nil:
				completed.Add(1)
			case errors.Is(err, gormlease.ErrLeaseLost):
				lost.Add(1)
			}
		})
	}
	wg.Wait()
	r.Completed, r.Lost = completed.Load(), lost.Load()
	b.mu.Lock()
	b.sat = append(b.sat, r)
	b.mu.Unlock()
	fmt.Printf("saturation %-60s completed=%d lost=%d\n", r.Setup, r.Completed, r.Lost)
	return nil
}
