package gormleaseotel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ncruces/go-sqlite3/gormlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/observe"
	gormleaseotel "github.com/gormlease/gormlease/otel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// database is one database the tests run on.
type database struct {
	name, system string
	open         func(t *testing.T) (gorm.Dialector, error)
}

// databases are the local servers, or those named by the environment, and
// a SQLite file.
var databases = []database{
	{"postgres", "postgresql", func(*testing.T) (gorm.Dialector, error) {
		return postgres.Open(env("GORMLEASE_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")), nil
	}},
	{"mysql", "mysql", func(*testing.T) (gorm.Dialector, error) {
		return mysql.Open(env("GORMLEASE_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test") + "?parseTime=true"), nil
	}},
	{"sqlite", "sqlite", func(t *testing.T) (gorm.Dialector, error) {
		file := filepath.Join(t.TempDir(), "lease.db")
		return gormlite.Open("file:" + file + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)"), nil
	}},
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

var tableSeq atomic.Int64

// openDB opens d with tables of the test's own, and returns the option
// that names them. Without the database the test is skipped, or fails
// under CI.
func openDB(t *testing.T, d database) (*gorm.DB, gormlease.TableOption, string) {
	t.Helper()
	dial, err := d.open(t)
	require.NoError(t, err)
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err == nil {
		err = db.Exec("SELECT 1").Error
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s unavailable under CI: %v", d.name, err)
		}
		t.Skipf("DATABASE TESTS NOT RUN: %s unavailable: %v", d.name, err)
	}
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	n := fmt.Sprintf("%d_%d", os.Getpid(), tableSeq.Add(1))
	lease, result := "otel_lease_"+n, "otel_result_"+n
	tables := gormlease.WithTableNames(lease, result)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db, tables))
	t.Cleanup(func() { _ = db.Migrator().DropTable(lease, result) })
	return db, tables, lease
}

// eachDB runs fn on every database.
func eachDB(t *testing.T, fn func(t *testing.T, d database, db *gorm.DB, tables gormlease.TableOption, table string)) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			db, tables, table := openDB(t, d)
			fn(t, d, db, tables, table)
		})
	}
}

// instrumented returns an Observer on in-memory providers.
func instrumented(t *testing.T) (*gormleaseotel.Observer, *tracetest.SpanRecorder, *sdkmetric.ManualReader) {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := gormleaseotel.New(gormleaseotel.WithTracerProvider(tp), gormleaseotel.WithMeterProvider(mp))
	require.NoError(t, err)
	return obs, spans, reader
}

// sums returns the data points of the Int64 sum named name, by the value of
// attribute key.
func sums(t *testing.T, rm metricdata.ResourceMetrics, name, key string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is a sum", name)
			for _, p := range sum.DataPoints {
				v, _ := p.Attributes.Value(attribute.Key(key))
				out[v.String()] += p.Value
			}
		}
	}
	return out
}

// histogramCount returns how many values the histogram named name holds.
func histogramCount(rm metricdata.ResourceMetrics, name string) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, p := range h.DataPoints {
					n += p.Count
				}
			}
		}
	}
	return n
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

func TestObserver_Run(t *testing.T) {
	eachDB(t, func(t *testing.T, d database, db *gorm.DB, tables gormlease.TableOption, table string) {
		obs, spans, reader := instrumented(t)
		r, err := gormlease.NewRunner[string](db, tables, gormlease.WithObserver(obs), gormlease.WithHolder("otel-test"),
			gormlease.WithHeartbeatInterval(100*time.Millisecond), gormlease.WithLeaseTimeout(2*time.Second))
		require.NoError(t, err)
		target := "otel-" + uuid.NewString()
		var heartbeats atomic.Int64
		_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			// Run until a heartbeat statement has ended.
			deadline := time.Now().Add(5 * time.Second)
			for heartbeats.Load() == 0 && time.Now().Before(deadline) {
				for _, s := range spans.Ended() {
					if s.Name() == gormleaseotel.SpanNameHeartbeat {
						heartbeats.Add(1)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			return "done", nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		require.Positive(t, heartbeats.Load(), "a heartbeat")

		// A refusal, by a second Runner while a lease is held.
		repo, err := gormlease.NewRepository(db, tables)
		require.NoError(t, err)
		l, err := repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err)
		_, err = r.Run(context.Background(), target, func(context.Context) (string, error) { return "", nil },
			func(*gorm.DB, string) error { return nil })
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
		require.NoError(t, repo.Release(context.Background(), l))

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		assert.Equal(t, map[string]int64{"acquired": 1, "held": 1}, sums(t, rm, gormleaseotel.MetricAcquires, gormleaseotel.AttrOutcome))
		assert.Equal(t, map[string]int64{"saved": 1}, sums(t, rm, gormleaseotel.MetricCommits, gormleaseotel.AttrOutcome))
		assert.Equal(t, map[string]int64{"": 0}, sums(t, rm, gormleaseotel.MetricLeasesHeld, "none"), "held now")
		assert.EqualValues(t, 2, histogramCount(rm, gormleaseotel.MetricAcquireDuration))
		assert.EqualValues(t, 1, histogramCount(rm, gormleaseotel.MetricHoldDuration))
		assert.EqualValues(t, 1, histogramCount(rm, gormleaseotel.MetricCommitDuration))
		assert.Positive(t, histogramCount(rm, gormleaseotel.MetricHeartbeatRTT))

		ended := spans.Ended()
		var runs []sdktrace.ReadOnlySpan
		byName := map[string]int{}
		for _, s := range ended {
			byName[s.Name()]++
			if s.Name() == gormleaseotel.SpanNameRun {
				runs = append(runs, s)
			}
		}
		require.Len(t, runs, 2)
		saved := runs[0]
		assert.Equal(t, target, attrs(saved.Attributes())[gormleaseotel.AttrTarget])
		assert.Equal(t, "otel-test", attrs(saved.Attributes())[gormleaseotel.AttrHolder])
		assert.Equal(t, "Unset", saved.Status().Code.String(), "a saved run is no error")
		assert.Equal(t, "Unset", runs[1].Status().Code.String(), "a refusal is no error")
		for _, s := range ended {
			switch s.Name() {
			case gormleaseotel.SpanNameAcquire, gormleaseotel.SpanNameCommit, gormleaseotel.SpanNameHeartbeat:
				assert.Equal(t, target, attrs(s.Attributes())[gormleaseotel.AttrTarget], s.Name())
				if s.Parent().SpanID() == saved.SpanContext().SpanID() {
					continue
				}
				assert.Equal(t, runs[1].SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of its run", s.Name())
			}
		}
		assert.Equal(t, 2, byName[gormleaseotel.SpanNameAcquire])
		assert.Equal(t, 1, byName[gormleaseotel.SpanNameCommit])

		// The lease's own statements, as database client spans.
		stmts := 0
		for _, s := range ended {
			a := attrs(s.Attributes())
			if _, ok := a[gormleaseotel.AttrDBSystem]; !ok {
				continue
			}
			stmts++
			assert.Equal(t, trace.SpanKindClient, s.SpanKind())
			assert.Equal(t, d.system, a[gormleaseotel.AttrDBSystem])
			assert.Equal(t, table, a[gormleaseotel.AttrDBCollection])
			assert.NotEmpty(t, a[gormleaseotel.AttrDBQueryText])
			assert.Equal(t, a[gormleaseotel.AttrDBOperation]+" "+a[gormleaseotel.AttrDBCollection], s.Name())
		}
		assert.GreaterOrEqual(t, stmts, 3, "acquire, heartbeat and commit statements at least")
	})
}

// histogramCounts returns how many values the histogram named name holds,
// by the value of attribute key.
func histogramCounts(rm metricdata.ResourceMetrics, name, key string) map[string]uint64 {
	out := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, p := range h.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(key))
					out[v.String()] += p.Count
				}
			}
		}
	}
	return out
}

// Record names each outcome from the event's kind and its error, as the
// gormlease documentation of each EventKind says.
func TestObserver_RecordNamesOutcomes(t *testing.T) {
	obs, _, reader := instrumented(t)
	ctx := context.Background()
	wrap := func(err error) error { return fmt.Errorf("gormlease: step %q: %w", "t", err) }
	for _, e := range []observe.Event{
		{Kind: observe.EventAcquire},
		{Kind: observe.EventAcquire, Err: wrap(gormlease.ErrLeaseHeld)},
		{Kind: observe.EventAcquire, Err: wrap(&gormlease.PausedError{Target: "t", Reason: "maintenance"})},
		{Kind: observe.EventAcquire, Err: errors.New("connection refused")},
		{Kind: observe.EventCommit},
		{Kind: observe.EventCommit, Err: wrap(gormlease.ErrLeaseLost)},
		{Kind: observe.EventCommit, Err: wrap(gormlease.ErrCommitUnknown)},
		{Kind: observe.EventCommit, Err: errors.New("saver failed")},
		{Kind: observe.EventLeaseLost, Err: wrap(gormlease.ErrLeaseLost)},
		{Kind: observe.EventSelfFenced, Err: wrap(gormlease.ErrLeaseLost)},
		{Kind: observe.EventMaxHoldExceeded, Err: wrap(gormlease.ErrMaxHoldExceeded)},
		{Kind: observe.EventStopRequested, Err: wrap(gormlease.ErrStopRequested)},
		{Kind: observe.EventRunWait, Duration: time.Second},
		{Kind: observe.EventDoWait},
		{Kind: observe.EventDoWait},
	} {
		obs.Record(ctx, e)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	assert.Equal(t, map[string]int64{"acquired": 1, "held": 1, "paused": 1, "error": 1},
		sums(t, rm, gormleaseotel.MetricAcquires, gormleaseotel.AttrOutcome))
	assert.Equal(t, map[string]int64{"": 1}, sums(t, rm, gormleaseotel.MetricLeasesHeld, "none"),
		"held now: the one acquire that took its lease")
	assert.Equal(t, map[string]int64{"saved": 1, "lost": 1, "unknown": 1, "failed": 1},
		sums(t, rm, gormleaseotel.MetricCommits, gormleaseotel.AttrOutcome))
	assert.Equal(t, map[string]int64{"taken_over": 1, "self_fenced": 1, "max_hold": 1},
		sums(t, rm, gormleaseotel.MetricLeasesLost, gormleaseotel.AttrLostCause))
	assert.Equal(t, map[string]int64{"": 1}, sums(t, rm, gormleaseotel.MetricLeasesStopped, "none"),
		"a stop is counted apart from the losses")
	assert.Equal(t, map[string]uint64{"run_wait": 1, "do": 2},
		histogramCounts(rm, gormleaseotel.MetricWaitDuration, gormleaseotel.AttrWaitCall))
}

// A span that ended because its acquire was refused (held or paused), or
// because an operator asked its holder to stop, is not an error; any other
// error is.
func TestObserver_RefusalsAndStopsAreNotErrors(t *testing.T) {
	obs, spans, _ := instrumented(t)
	ctx := context.Background()
	for _, err := range []error{
		fmt.Errorf("run: %w", gormlease.ErrLeaseHeld),
		fmt.Errorf("run: %w", &gormlease.PausedError{Target: "t", Reason: "maintenance"}),
		fmt.Errorf("run: %w", gormlease.ErrStopRequested),
		errors.New("connection refused"),
	} {
		_, end := obs.Start(ctx, observe.Span{Kind: observe.SpanRun, TargetID: "t"})
		end(err)
	}
	ended := spans.Ended()
	require.Len(t, ended, 4)
	for i, s := range ended[:3] {
		assert.Equal(t, codes.Unset, s.Status().Code, "span %d", i)
		assert.Empty(t, s.Events(), "span %d recorded an error", i)
	}
	assert.Equal(t, codes.Error, ended[3].Status().Code)
}
