package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm/logger"
)

// counter is a pgx tracer that counts the statements a pool sends, and the
// heartbeat statements with the rows they renewed. pg_stat_statements needs
// shared_preload_libraries, which the shared server does not load, so the
// statements are counted on the client: every Query, QueryRow and Exec, BEGIN
// and COMMIT included.
type counter struct {
	statements atomic.Int64
	beats      atomic.Int64 // heartbeat statements
	renewed    atomic.Int64 // rows those renewed
	isBeat     func(sql string) bool
	// lastBeat, when set, records the time each heartbeat was sent, by
	// its first argument (pglock's lock name).
	lastBeat lastBeats
}

type beatKey struct{}

// lastBeats records, into the map it holds, when each pglock lock's
// heartbeat UPDATE was last sent (see counter.lastBeat).
type lastBeats = atomic.Pointer[sync.Map]

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	if c.isBeat != nil && c.isBeat(d.SQL) {
		c.beats.Add(1)
		if m := c.lastBeat.Load(); m != nil && len(d.Args) > 0 {
			if name, ok := d.Args[0].(string); ok {
				m.Store(name, time.Now())
			}
		}
		return context.WithValue(ctx, beatKey{}, lostOnly(d))
	}
	return ctx
}

// lostOnly returns, for gormlease's batched heartbeat on PostgreSQL, which
// returns only the leases it did not renew, the number of leases it was
// sent (its second argument is their tokens as an array literal); -1 for a
// statement whose rows are the ones it renewed.
func lostOnly(d pgx.TraceQueryStartData) int64 {
	if !strings.Contains(d.SQL, "WITH ORDINALITY") || len(d.Args) < 2 {
		return -1
	}
	tokens, ok := d.Args[1].(string)
	if !ok || len(tokens) <= 2 {
		return 0
	}
	return int64(strings.Count(tokens, ",") + 1)
}

// TraceBatchStart counts a batch, which pgx sends in one round trip, as one
// statement: gormlease's fenced commit sends BEGIN and its locking
// statement so.
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	sent, ok := ctx.Value(beatKey{}).(int64)
	switch {
	case !ok || d.Err != nil:
	case sent >= 0:
		c.renewed.Add(sent - d.CommandTag.RowsAffected())
	default:
		c.renewed.Add(d.CommandTag.RowsAffected())
	}
}

// isUpdateOf returns a predicate for UPDATE statements on table.
func isUpdateOf(table string) func(string) bool {
	return func(sql string) bool {
		s := strings.ToUpper(strings.Join(strings.Fields(sql), " "))
		return strings.HasPrefix(s, "UPDATE "+strings.ToUpper(table)) ||
			strings.HasPrefix(s, `UPDATE "`+strings.ToUpper(table)+`"`)
	}
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// walStats is pg_stat_wal: server-wide, so other sessions' writes show too.
type walStats struct{ records, syncs, writes, bytes float64 }

func readWAL(ctx context.Context, conn *pgx.Conn) walStats {
	var w walStats
	_ = conn.QueryRow(ctx, `SELECT wal_records, wal_sync, wal_write, wal_bytes::float8 FROM pg_stat_wal`).
		Scan(&w.records, &w.syncs, &w.writes, &w.bytes)
	return w
}

// latencies collects operation durations from many workers.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d...)
	l.mu.Unlock()
}

func (l *latencies) quantile(q float64) time.Duration {
	if len(l.all) == 0 {
		return 0
	}
	slices.Sort(l.all)
	return l.all[min(len(l.all)-1, int(q*float64(len(l.all))))]
}

// result is one measured point.
type result struct {
	Section   string  `json:"section"`
	Scenario  string  `json:"scenario"`
	Impl      string  `json:"impl"`
	Workers   int     `json:"workers"`
	Ops       int64   `json:"ops"`
	Acquired  int64   `json:"acquired"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	StmtPerOp float64 `json:"statements_per_op"` // -1: not counted
	WALSyncOp float64 `json:"wal_syncs_per_op"`
	WALRecOp  float64 `json:"wal_records_per_op"`
	CPUPerOp  float64 `json:"cpu_us_per_op"`
	// ServerOp is the CPU of the implementation's server backends per
	// operation, in µs.
	ServerOp float64 `json:"server_cpu_us_per_op"`
	CPUCore  float64 `json:"cpu_core_pct"`
	Errors   int64   `json:"errors"`
	// ErrorKinds counts the errors by message.
	ErrorKinds map[string]int64 `json:"errors_by_message,omitempty"`
	Overlaps   int64            `json:"overlapping_holders"`
	Round      int              `json:"round"`
	Note       string           `json:"note,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (r result) String() string {
	return fmt.Sprintf("%-10s %-28s %-18s w=%-3d ops/s=%9.0f p50=%7.2fms p99=%7.2fms stmt/op=%5.2f walsync/op=%5.2f walrec/op=%5.2f cpu=%6.1fus/op %5.1f%% server=%6.1fus/op err=%d %s %s",
		r.Section, r.Scenario, r.Impl, r.Workers, r.OpsPerSec, r.P50, r.P99, r.StmtPerOp, r.WALSyncOp, r.WALRecOp, r.CPUPerOp, r.CPUCore, r.ServerOp, r.Errors, errorCounts(r.ErrorKinds), r.Note)
}

// byCount returns the messages of errors counted by message, the most
// frequent first.
func byCount(kinds map[string]int64) []string {
	return slices.SortedFunc(maps.Keys(kinds), func(x, y string) int {
		return cmp.Or(cmp.Compare(kinds[y], kinds[x]), cmp.Compare(x, y))
	})
}

// errorCounts lists errors counted by message, the most frequent first.
func errorCounts(kinds map[string]int64) string {
	var parts []string
	for _, m := range byCount(kinds) {
		parts = append(parts, fmt.Sprintf("%d × %q", kinds[m], m))
	}
	return strings.Join(parts, ", ")
}

// beatLogger counts, into c, gormlease's batched heartbeats on PostgreSQL,
// which pgx's tracer does not see: they are sent as simple queries on the
// connection's wire protocol (so that their notices are read), with the
// leases written in as array literals, and reported to the gorm logger
// with placeholders in their place (and without their error: a failed one
// with rows -1). The rows they renewed are read from the table instead
// (see window).
type beatLogger struct {
	logger.Interface
	c *counter
}

func (l beatLogger) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, rows := fc()
	if rows < 0 || !strings.Contains(sql, "WITH ORDINALITY") || !l.c.isBeat(sql) {
		return
	}
	l.c.statements.Add(1)
	l.c.beats.Add(1)
}
