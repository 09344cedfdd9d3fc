package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// countingLogger counts the statements reported to it, without formatting
// them.
type countingLogger struct {
	logger.Interface
	n atomic.Int64
}

func (c *countingLogger) Trace(context.Context, time.Time, func() (string, int64), error) { c.n.Add(1) }

// BenchmarkMariaDBAcquireThroughput measures the acquire on MariaDB, with MySQL's
// statements (an UPDATE, and a second statement for a first acquire and a
// first refusal) against MariaDB's one statement, on three workloads, the
// implementations taking turns in rounds within one run, once, whatever
// b.N (go test -run '^$' -bench BenchmarkMariaDBAcquireThroughput -benchtime 1x -v), and
// logs a table for docs/performance.md.
func BenchmarkMariaDBAcquireThroughput(b *testing.B) {
	t := b
	s := mariaDB(t)
	const rounds, slice = 4, 1500 * time.Millisecond
	impls := []string{"mysql", "mariadb"}
	if v := os.Getenv("GORMLEASE_BENCH_IMPLS"); v != "" {
		impls = strings.Split(v, ",")
	}
	workloads := []struct {
		name    string
		workers int
	}{{"new targets", 8}, {"re-acquired targets", 8}, {"contended target", 32}}
	type result struct{ ops, stmts float64 }
	results := map[string][]result{}
	open := func(impl string) (*gormlease.Repository, *countingLogger, func()) {
		db := s.Open(t, nil)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(33)
		sqlDB.SetMaxIdleConns(33)
		cl := &countingLogger{Interface: logger.Discard}
		on := db
		if impl == "mysql" {
			on = asMySQL(b, db)
		}
		repo, err := gormlease.NewRepository(on.Session(&gorm.Session{Logger: cl}), gormlease.WithHolder(impl))
		require.NoError(t, err)
		return repo, cl, func() { _ = sqlDB.Close() }
	}
	for round := range rounds {
		for _, w := range workloads {
			order := slices.Clone(impls)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, impl := range order {
				repo, cl, closePool := open(impl)
				prefix := newTarget(t)
				ctx, cancel := context.WithTimeout(context.Background(), slice)
				var ops atomic.Int64
				var wg sync.WaitGroup
				// Warm the pool and the Repository's probe.
				_, err := repo.Acquire(context.Background(), prefix+"-warm", time.Minute)
				require.NoError(t, err)
				cl.n.Store(0)
				start := time.Now()
				for i := range w.workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := 0; ctx.Err() == nil; n++ {
							var target string
							switch w.name {
							case "new targets":
								target = fmt.Sprintf("%s-%d-%d", prefix, i, n)
							case "re-acquired targets":
								target = fmt.Sprintf("%s-%d-%d", prefix, i, n%10)
							default:
								target = prefix
							}
							l, err := repo.Acquire(context.Background(), target, time.Minute)
							switch {
							case errors.Is(err, gormlease.ErrLeaseHeld):
								ops.Add(1)
								continue
							case err != nil:
								t.Error(err)
								return
							}
							if w.name == "contended target" {
								time.Sleep(200 * time.Microsecond) // the holder's work
							}
							if err := repo.Release(context.Background(), l); err != nil {
								t.Error(err)
								return
							}
							ops.Add(1)
						}
					}()
				}
				wg.Wait()
				cancel()
				closePool()
				elapsed := time.Since(start).Seconds()
				stmts := float64(cl.n.Load())
				if w.name != "contended target" {
					stmts -= float64(ops.Load()) // the releases
				}
				key := w.name + "|" + impl
				results[key] = append(results[key], result{float64(ops.Load()) / elapsed, stmts / float64(ops.Load())})
			}
		}
	}
	var sb strings.Builder
	sb.WriteString("\n| workload | workers | implementation | ops/s, median (min–max) of rounds | acquire statements/op |\n|---|---|---|---|---|\n")
	for _, w := range workloads {
		for _, impl := range impls {
			rs := results[w.name+"|"+impl]
			ops := make([]float64, len(rs))
			for i, r := range rs {
				ops[i] = r.ops
			}
			sort.Float64s(ops)
			med := (ops[len(ops)/2] + ops[(len(ops)-1)/2]) / 2
			fmt.Fprintf(&sb, "| %s | %d | %s | %.0f (%.0f–%.0f) | %.2f |\n", w.name, w.workers, impl, med, ops[0], ops[len(ops)-1], rs[len(rs)-1].stmts)
		}
	}
	t.Log(sb.String())
}

// timingLogger sums the time of the statements reported to it, by their
// first word.
type timingLogger struct {
	logger.Interface
	mu    sync.Mutex
	spent map[string]time.Duration
	count map[string]int
}

func (l *timingLogger) Trace(_ context.Context, begin time.Time, fc func() (string, int64), _ error) {
	elapsed := time.Since(begin)
	sql, _ := fc()
	verb, _, _ := strings.Cut(strings.TrimSpace(sql), " ")
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spent[verb] += elapsed
	l.count[verb]++
}

// BenchmarkSQLiteRefusalCost measures what the second statement of a refused
// acquire on SQLite, the read of the live lease, costs, against the
// acquire's own statement, and what a refusal in one statement would
// write: ON CONFLICT DO UPDATE answers, in RETURNING, only a row that it
// updated, so one statement would have to update the refusing row, as an
// UPDATE that sets a column to itself does. It runs once, whatever b.N
// (go test -run '^$' -bench BenchmarkSQLiteRefusalCost -benchtime 1x -v), and logs the
// figures for docs/performance.md.
func BenchmarkSQLiteRefusalCost(b *testing.B) {
	t := b
	s := testdb.SQLite(t)
	db := s.Open(t, nil)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	ctx := context.Background()
	tl := &timingLogger{Interface: logger.Discard, spent: map[string]time.Duration{}, count: map[string]int{}}
	repo, err := gormlease.NewRepository(db.Session(&gorm.Session{Logger: tl}), gormlease.WithHolder("pod-b"))
	require.NoError(t, err)
	target, _ := acquireNew(t, holderRepository(t, db, "pod-a"), time.Hour)
	const n = 2000
	tl.spent, tl.count = map[string]time.Duration{}, map[string]int{}
	start := time.Now()
	for range n {
		_, err := repo.Acquire(ctx, target, time.Hour)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	}
	whole := time.Since(start)
	// data_version, read on a connection of its own, changes when another
	// connection commits a write to the file.
	watcher := s.Open(t, nil)
	wconn, err := watcher.DB()
	require.NoError(t, err)
	wconn.SetMaxOpenConns(1)
	version := func() (v int64) {
		require.NoError(t, watcher.Raw("PRAGMA data_version").Row().Scan(&v))
		return v
	}
	v0 := version()
	_, err = repo.Acquire(ctx, target, time.Hour)
	require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	refusalWrote := version() != v0
	v0 = version()
	require.NoError(t, db.Exec("UPDATE job_lease SET holder = holder WHERE target_id = ?", target).Error)
	noopWrote := version() != v0
	v0 = version()
	require.NoError(t, db.Exec("UPDATE job_lease SET holder = holder || '' WHERE target_id = ?", target).Error)
	require.NoError(t, db.Exec("UPDATE job_lease SET failure = 'x' WHERE target_id = ?", target).Error)
	require.NoError(t, db.Exec("UPDATE job_lease SET failure = NULL WHERE target_id = ?", target).Error)
	changeWrote := version() != v0
	changes := func() (c int64) {
		require.NoError(t, db.Raw("SELECT total_changes()").Row().Scan(&c))
		return c
	}
	c0 := changes()
	noop := time.Now()
	for range n {
		require.NoError(t, db.Exec("UPDATE job_lease SET holder = holder WHERE target_id = ?", target).Error)
	}
	noopTime := time.Since(noop)
	c1 := changes()
	t.Logf("refused Acquire: %.1f µs a call; its INSERT %.1f µs (%d), its SELECT %.1f µs (%d)",
		float64(whole.Microseconds())/n, float64(tl.spent["INSERT"].Microseconds())/float64(tl.count["INSERT"]), tl.count["INSERT"],
		float64(tl.spent["SELECT"].Microseconds())/float64(tl.count["SELECT"]), tl.count["SELECT"])
	t.Logf("UPDATE that sets a column to itself: %.1f µs a statement, %d rows changed for %d; it commits a write to the file: %v (a refused Acquire: %v; an UPDATE that changes the row: %v)",
		float64(noopTime.Microseconds())/n, c1-c0, n, noopWrote, refusalWrote, changeWrote)
}
