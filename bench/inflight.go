package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"cirello.io/pglock"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// The in-flight section measures what gormlease exists for: how many jobs
// whose work holds no database connection (an external call of inflightWork)
// each design keeps in flight on a pool of a given size. inflightJobs jobs
// are offered at once over inflightTargets targets, each target's jobs one
// after another in a lane of its own, so that no job is refused and every
// design runs the same work: a lane takes its target's lock, runs the work,
// saves a one-row result under the lock, and gives the lock back.
const (
	inflightJobs    = 1000
	inflightTargets = 100
	inflightWork    = 2 * time.Second
	// inflightLimit bounds each point: the offered work needs
	// inflightJobs / inflightTargets × inflightWork (20 s) where the pool
	// does not bound it.
	inflightLimit = 24 * time.Second
)

// inflightPools are the pool sizes measured.
var inflightPools = []int{4, 16, 64}

// inflightResult is one design on one pool.
type inflightResult struct {
	Design      string        `json:"design"`
	Pool        int           `json:"pool"`
	Completed   int           `json:"completed"`
	Failed      int           `json:"failed"`
	Elapsed     time.Duration `json:"elapsed"`
	P50, P99    time.Duration
	MaxInFlight int64   `json:"max_in_flight"`
	MaxConns    int     `json:"max_conns_in_use"`
	MeanConns   float64 `json:"mean_conns_in_use"`
	Ceiling     string  `json:"ceiling"`
	Errors      map[string]int
}

// inflightDesign is one way of running a job under a lock: run holds the
// lock on target around work and saves the result under it.
type inflightDesign struct {
	name    string
	run     func(ctx context.Context, target string, work func(context.Context) error) error
	inUse   func() int
	ceiling func(pool int) string
	close   func()
}

func (b *bench) inflightScenarios(ctx context.Context) error {
	for _, pool := range inflightPools {
		for _, mk := range []func(int) (*inflightDesign, error){
			func(n int) (*inflightDesign, error) { return b.inflightAdvisory(ctx, n) },
			b.inflightPglock,
			b.inflightGormlease,
		} {
			b.settle(ctx)
			d, err := mk(pool)
			if err != nil {
				return err
			}
			r := runInflight(ctx, d, pool)
			d.close()
			b.inflight = append(b.inflight, r)
			fmt.Printf("inflight %-10s pool=%-3d completed=%4d failed=%d in %v: %.1f jobs/s p50=%v p99=%v in flight max %d, conns max %d mean %.1f %v\n",
				r.Design, r.Pool, r.Completed, r.Failed, r.Elapsed.Round(time.Millisecond), float64(r.Completed)/r.Elapsed.Seconds(),
				r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.MaxInFlight, r.MaxConns, r.MeanConns, r.Errors)
		}
	}
	return nil
}

// runInflight offers the jobs to d and measures them.
func runInflight(ctx context.Context, d *inflightDesign, pool int) inflightResult {
	ctx, cancel := context.WithTimeout(ctx, inflightLimit)
	defer cancel()
	var (
		inFlight, most atomic.Int64
		mu             sync.Mutex
		lat            []time.Duration
		failed         int
		errs           = map[string]int{}
	)
	work := func(ctx context.Context) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-time.After(inflightWork):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stop := make(chan struct{})
	samples := make(chan [2]float64, 1)
	go func() {
		var sum float64
		var n, top int
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				samples <- [2]float64{sum / float64(max(n, 1)), float64(top)}
				return
			case <-t.C:
				u := d.inUse()
				sum, n, top = sum+float64(u), n+1, max(top, u)
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for t := range inflightTargets {
		wg.Go(func() {
			target := fmt.Sprintf("inflight-%d-%d", pool, t)
			for range inflightJobs / inflightTargets {
				if ctx.Err() != nil {
					return
				}
				begun := time.Now()
				err := d.run(ctx, target, work)
				mu.Lock()
				switch {
				case err == nil:
					lat = append(lat, time.Since(begun))
				case ctx.Err() == nil:
					failed++
					errs[err.Error()]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	s := <-samples
	l := &latencies{all: lat}
	return inflightResult{
		Design: d.name, Pool: pool, Completed: len(lat), Failed: failed, Elapsed: elapsed,
		P50: l.quantile(0.5), P99: l.quantile(0.99), MaxInFlight: most.Load(),
		MeanConns: s[0], MaxConns: int(s[1]), Ceiling: d.ceiling(pool), Errors: errs,
	}
}

// offeredCeiling is the bound of the offered work itself: each target runs
// one job at a time.
func offeredCeiling(int) string {
	return fmt.Sprintf("%d targets / %v = %.0f", inflightTargets, inflightWork, float64(inflightTargets)/inflightWork.Seconds())
}

// inflightAdvisory holds a pool connection for the whole job, with
// pg_try_advisory_lock on it, and saves the result on it.
func (b *bench) inflightAdvisory(ctx context.Context, n int) (*inflightDesign, error) {
	pool, err := openPool(ctx, b.dsn, n, &counter{})
	if err != nil {
		return nil, err
	}
	return &inflightDesign{
		name: "advisory lock",
		run: func(ctx context.Context, target string, work func(context.Context) error) error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			var ok bool
			if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1))`, target).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errors.New("advisory lock held")
			}
			err = work(ctx)
			if err == nil {
				err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, saverSQL, target, "result")
					return err
				})
			}
			_, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext($1))`, target)
			return errors.Join(err, uerr)
		},
		inUse: func() int { return int(pool.Stat().AcquiredConns()) },
		ceiling: func(n int) string {
			return fmt.Sprintf("pool / %v = %.0f", inflightWork, float64(min(n, inflightTargets))/inflightWork.Seconds())
		},
		close: pool.Close,
	}, nil
}

// inflightPglock is cirello.io/pglock with its recommended settings (its
// Default* constants: 20 s lease, a heartbeat every 5 s from its goroutine
// per lock) on lib/pq, as pglock.New accepts.
func (b *bench) inflightPglock(n int) (*inflightDesign, error) {
	db, err := sql.Open("postgres", b.dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	client, err := pglock.New(db, pglock.WithCustomTable(pglockTable(false, 0)))
	if err != nil {
		db.Close()
		return nil, err
	}
	return &inflightDesign{
		name: "pglock",
		run: func(ctx context.Context, target string, work func(context.Context) error) error {
			l, err := client.AcquireContext(ctx, target, pglock.FailIfLocked())
			if err != nil {
				return err
			}
			err = work(ctx)
			if err == nil {
				var tx *sql.Tx
				if tx, err = db.BeginTx(ctx, nil); err == nil {
					if _, err = tx.ExecContext(ctx, saverSQL, target, "result"); err == nil {
						err = tx.Commit()
					} else {
						_ = tx.Rollback()
					}
				}
			}
			return errors.Join(err, client.ReleaseContext(context.WithoutCancel(ctx), l))
		},
		inUse:   func() int { return db.Stats().InUse },
		ceiling: offeredCeiling,
		close:   func() { db.Close() },
	}, nil
}

// inflightGormlease is Runner.Run with the library's defaults.
func (b *bench) inflightGormlease(n int) (*inflightDesign, error) {
	db, sqlDB, err := openGorm(b.dsn, n, &counter{})
	if err != nil {
		return nil, err
	}
	runner, err := gormlease.NewRunner[string](db)
	if err != nil {
		sqlDB.Close()
		return nil, err
	}
	return &inflightDesign{
		name: "gormlease",
		run: func(ctx context.Context, target string, work func(context.Context) error) error {
			_, err := runner.Run(ctx, target,
				func(ctx context.Context) (string, error) { return "result", work(ctx) },
				func(tx *gorm.DB, v string) error {
					return tx.Exec(`INSERT INTO bench_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`, target, v).Error
				})
			return err
		},
		inUse:   func() int { return sqlDB.Stats().InUse },
		ceiling: offeredCeiling,
		close:   func() { sqlDB.Close() },
	}, nil
}

// inflightReport writes the in-flight section.
func (b *bench) inflightReport(p func(string, ...any)) {
	if len(b.inflight) == 0 {
		return
	}
	p("\n## Jobs in flight per database connection (%d jobs offered at once over %d targets, each job's work a %v external call that uses no connection)\n\n",
		inflightJobs, inflightTargets, inflightWork)
	p("| design | pool | jobs/s | completed | p50 job s | p99 job s | most jobs in flight | connections in use, most (mean) | ceiling, jobs/s | notes |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.inflight {
		note := ""
		if r.Completed+r.Failed < inflightJobs {
			note = fmt.Sprintf("%d jobs not begun or cut off at the %v limit", inflightJobs-r.Completed-r.Failed, inflightLimit)
		}
		if r.Failed > 0 {
			note += fmt.Sprintf("; %d failed: %v", r.Failed, r.Errors)
		}
		p("| %s | %d | %.1f | %d of %d in %.1f s | %.2f | %.2f | %d | %d (%.1f) | %s | %s |\n",
			r.Design, r.Pool, float64(r.Completed)/r.Elapsed.Seconds(), r.Completed, inflightJobs, r.Elapsed.Seconds(),
			r.P50.Seconds(), r.P99.Seconds(), r.MaxInFlight, r.MaxConns, r.MeanConns, r.Ceiling, note)
	}
	p("\nEach target's %d jobs run one after another, in %d lanes at once, so the offered work itself allows at most %d jobs in flight and %.0f jobs/s. A job's latency runs from the moment its lane begins it (its target free) to the return of its last step, waiting for a connection included. *advisory lock*: pg_try_advisory_lock on a pgx pool connection held from before the lock until after the unlock, the result saved on it. *pglock*: cirello.io/pglock v1.16.0 as pglock.New on lib/pq with its recommended settings (DefaultLeaseDuration 20 s, DefaultHeartbeatFrequency 5 s: a goroutine per lock), FailIfLocked, the result saved in a transaction of its own. *gormlease*: Runner.Run with the defaults (heartbeat %v, lease timeout %v), the result saved in the fenced commit that releases. Connections in use are sampled every 50 ms (pgxpool's acquired connections, database/sql's InUse). A point ends when its jobs are done or at %v.\n",
		inflightJobs/inflightTargets, inflightTargets, inflightTargets, float64(inflightTargets)/inflightWork.Seconds(),
		gormlease.DefaultHeartbeatInterval, gormlease.DefaultLeaseTimeout, inflightLimit)
}
