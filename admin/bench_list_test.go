package admin_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// fill100k inserts 100,000 rows into db's empty lease table, in one
// statement, as a busy table might hold them: 85% released a day ago, 10%
// live (renewed within the last 50 s, of a day's timeout, so that they stay
// live while the benchmark runs), 5% expired an hour ago (2-minute
// timeout); every 13th without acquired_at (acquired before the column),
// every 2,000th paused (50 rows), five holders. It then analyzes the table,
// as autovacuum would soon.
func fill100k(tb testing.TB, db *gorm.DB) {
	tb.Helper()
	require.NoError(tb, db.Exec(`
INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms, acquired_at, paused_at)
SELECT 'bench/' || lpad(i::text, 6, '0'), gen_random_uuid(), i % 7 + 1, 'host-' || (i % 5),
	clock_timestamp() - CASE WHEN i % 100 < 85 THEN interval '1 day'
		WHEN i % 100 < 95 THEN (i % 50) * interval '1 second' ELSE interval '1 hour' END,
	CASE WHEN i % 100 < 85 THEN clock_timestamp() - interval '1 day' END,
	CASE WHEN i % 100 >= 85 AND i % 100 < 95 THEN 86400000 ELSE 120000 END,
	CASE WHEN i % 13 <> 0 THEN clock_timestamp() - interval '1 day' - (i % 1000) * interval '1 second' END,
	CASE WHEN i % 2000 = 7 THEN clock_timestamp() END
FROM generate_series(1, 100000) AS i`).Error)
	require.NoError(tb, db.Exec("ANALYZE job_lease").Error)
}

// statementLog keeps the last statement that its session ran, for EXPLAIN.
type statementLog struct {
	logger.Interface
	mu   sync.Mutex
	last string
}

func (l *statementLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.mu.Lock()
	l.last = sql
	l.mu.Unlock()
}

func (l *statementLog) LogMode(logger.LogLevel) logger.Interface { return l }

// BenchmarkList100k measures List (each state, order and a holder, the
// first page and one from the middle of the rows by cursor) and Count on a
// table of 100,000 rows on PostgreSQL (see fill100k), and reports each
// one's median in ms (docs/operating.md, "At 100,000 rows", has the
// figures). With GORMLEASE_EXPLAIN=1 it logs each statement's plan, from
// EXPLAIN ANALYZE. Run it with:
//
//	go test -run '^$' -bench List100k -benchtime 7x ./admin/
func BenchmarkList100k(b *testing.B) {
	ctx := context.Background()
	s := testdb.Postgres(b)
	db := s.OpenEmpty(b, nil)
	require.NoError(b, gormlease.AutoMigrate(ctx, db))
	fill100k(b, db)
	log := &statementLog{Interface: logger.Discard}
	repo, err := gormlease.NewRepository(db.Session(&gorm.Session{Logger: log}))
	require.NoError(b, err)
	op := admin.New(repo)
	explain := os.Getenv("GORMLEASE_EXPLAIN") != ""

	measure := func(b *testing.B, run func() error) {
		b.Helper()
		require.NoError(b, run()) // warm the cache and the plan
		if explain {
			plan := explainAnalyze(b, db, log.last)
			b.Logf("%s\n%s", log.last, plan)
		}
		times := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := run(); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2])/float64(time.Millisecond), "ms-median")
	}

	b.Run("Count", func(b *testing.B) {
		measure(b, func() error { _, err := op.Count(ctx, ""); return err })
	})
	orders := []admin.Order{admin.OrderKey, admin.OrderAge, admin.OrderHeldSince, admin.OrderExpiry}
	type variant struct {
		name string
		opts admin.ListOptions
	}
	var variants []variant
	for _, state := range []admin.LeaseState{"", admin.StateLive, admin.StateExpired, admin.StateReleased, admin.StatePaused} {
		for _, order := range orders {
			name := fmt.Sprintf("state=%s/order=%s", orDash(string(state)), orDash(string(order)))
			variants = append(variants, variant{name, admin.ListOptions{State: state, Order: order}})
		}
	}
	for _, order := range orders {
		variants = append(variants, variant{fmt.Sprintf("holder/order=%s", orDash(string(order))),
			admin.ListOptions{Holder: "host-3", Order: order}})
	}
	for _, v := range variants {
		b.Run(v.name+"/first", func(b *testing.B) {
			measure(b, func() error { _, err := op.List(ctx, v.opts); return err })
		})
		b.Run(v.name+"/deep", func(b *testing.B) {
			deep := v.opts
			deep.After = middleCursor(b, op, v.opts)
			measure(b, func() error { _, err := op.List(ctx, deep); return err })
		})
	}
}

// orDash is s, or "-" for "".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// middleCursor returns the Cursor of the row halfway through the rows that
// opts lists.
func middleCursor(b *testing.B, op *admin.Operator, opts admin.ListOptions) string {
	b.Helper()
	var cursors []string
	opts.Limit = 10000
	for {
		page, err := op.List(context.Background(), opts)
		require.NoError(b, err)
		for _, li := range page {
			cursors = append(cursors, li.Cursor)
		}
		if len(page) < opts.Limit {
			break
		}
		opts.After = page[len(page)-1].Cursor
	}
	require.NotEmpty(b, cursors)
	return cursors[len(cursors)/2]
}

// explainAnalyze returns the plan of query, as it ran.
func explainAnalyze(b *testing.B, db *gorm.DB, query string) string {
	b.Helper()
	var lines []string
	require.NoError(b, db.Raw("EXPLAIN (ANALYZE, BUFFERS) "+query).Scan(&lines).Error)
	return strings.Join(lines, "\n")
}
