package gormlease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"
)

// An Observer receives what a Runner does, for metrics and traces: its
// steps as spans (Start) and its outcomes as events (Record). Give one to
// NewRunner with WithObserver; the module github.com/gormlease/gormlease/otel
// implements it with OpenTelemetry. The Runner calls it from the goroutines
// of its Runs and from the heartbeat goroutine it shares with other Runners,
// so it must be safe for concurrent use; it should return quickly, since the
// Runner waits for it. Without an Observer, the Runner calls nothing.
type Observer interface {
	// Start is called as a span begins: a Run, one of its steps, or one of
	// the lease's own SQL statements. Spans nest by context: the context
	// that Start returns for a Run is the one the Run's steps are started
	// with, and a step's the one its statements are; a Run's work gets the
	// Run's. end is called exactly once, when the span ends, with the
	// span's error (nil on success; for a Run, what Run returns).
	Start(ctx context.Context, span Span) (_ context.Context, end func(err error))
	// Record is called with each event as it happens.
	Record(ctx context.Context, event Event)
}

// SpanKind says what a Span covers.
type SpanKind uint8

// The spans a Runner starts.
const (
	// SpanRun covers a Run, from before its acquire until it returns; RunWait
	// and Do start one for each Run they make.
	SpanRun SpanKind = iota + 1
	// SpanAcquire covers the acquire of a Run, a child of its SpanRun.
	SpanAcquire
	// SpanHeartbeat covers one heartbeat that renewed (or tried to renew) a
	// Run's lease, a child of its SpanRun. Heartbeats are batched, so one
	// statement may stand behind the heartbeat spans of many Runs.
	SpanHeartbeat
	// SpanCommit covers the fenced commit with the saver inside it, a
	// child of its SpanRun.
	SpanCommit
	// SpanStatement covers one SQL statement of the lease's own (acquire,
	// heartbeat, release, the fenced commit's lock, the reads of Do and
	// RunWait), which gorm's callbacks, and so gorm's tracing plugins, do
	// not see. The saver's statements go through gorm, not here.
	SpanStatement
)

// String returns the span's name: "run", "acquire", "heartbeat", "commit" or
// "statement".
func (k SpanKind) String() string {
	switch k {
	case SpanRun:
		return "run"
	case SpanAcquire:
		return "acquire"
	case SpanHeartbeat:
		return "heartbeat"
	case SpanCommit:
		return "commit"
	case SpanStatement:
		return "statement"
	}
	return "unknown"
}

// Span describes a span as it starts.
type Span struct {
	Kind SpanKind
	// TargetID is the target of the Run; empty for statements that renew
	// many leases at once.
	TargetID string
	// Generation is the lease's generation, once it is acquired (0 before:
	// in SpanRun and SpanAcquire).
	Generation int64
	// Holder is the Runner's holder name (WithHolder).
	Holder string
	// Start is when the span began, when that was before Start was called
	// (a heartbeat span is started once its statement has returned); zero
	// means now.
	Start time.Time

	// For SpanStatement: Operation is the statement's first SQL keyword
	// (UPDATE, SELECT, INSERT, BEGIN, ...); Query the SQL text, with
	// placeholders for its values, except in the one-query fenced commit,
	// whose BEGIN and locking UPDATE carry the lease's target and token as
	// literals; System the database, as OpenTelemetry names it
	// ("postgresql", "mysql", "sqlite"); Table the lease table.
	Operation, Query, System, Table string
}

// EventKind says what an Event reports.
type EventKind uint8

// The events a Runner records.
const (
	// EventAcquire is an acquire's outcome (OutcomeAcquired, OutcomeHeld,
	// OutcomeError) and Duration.
	EventAcquire EventKind = iota + 1
	// EventLeaseStart says that a Run now holds a lease; EventLeaseEnd that
	// it no longer does, with Duration how long it held it. The leases a
	// process holds now are the starts minus the ends.
	EventLeaseStart
	EventLeaseEnd
	// EventHeartbeat is one heartbeat statement: Duration its round trip,
	// Leases how many leases it renewed or tried to, Err its error.
	EventHeartbeat
	// EventLeaseLost is a Run's loss of its lease, by Outcome: LostTakenOver,
	// LostSelfFenced or LostMaxHold.
	EventLeaseLost
	// EventCommit is the outcome of a Run that reached its fenced commit:
	// CommitSaved, CommitLost, CommitUnknown or CommitFailed, and Duration.
	EventCommit
	// EventWait is the time that a RunWait or Do call (Outcome WaitRunWait,
	// WaitDo) waited for other holders: from the call until its last try
	// to run the work, or until it took another job's result or returned.
	// Every call records one, 0 when it did not wait. Calls of Do that
	// share one job in a process record one between them.
	EventWait
)

// Outcomes of events, as Event.Outcome carries them.
const (
	OutcomeAcquired = "acquired" // EventAcquire: the lease was taken
	OutcomeHeld     = "held"     // EventAcquire: another holder's lease is live
	OutcomeError    = "error"    // EventAcquire: the acquire failed

	LostTakenOver  = "taken_over"  // EventLeaseLost: a heartbeat found the lease taken or released
	LostSelfFenced = "self_fenced" // EventLeaseLost: no heartbeat confirmed the lease in time
	LostMaxHold    = "max_hold"    // EventLeaseLost: the work ran past WithMaxHold

	CommitSaved   = "saved"   // EventCommit: the result was saved
	CommitLost    = "lost"    // EventCommit: the lease was gone, nothing saved
	CommitUnknown = "unknown" // EventCommit: the connection failed during COMMIT and Run could not tell
	CommitFailed  = "failed"  // EventCommit: the saver or the transaction failed, nothing saved

	WaitRunWait = "run_wait" // EventWait: of RunWait
	WaitDo      = "do"       // EventWait: of Do
)

// Event is one outcome of a Runner's work.
type Event struct {
	Kind       EventKind
	TargetID   string // empty for EventHeartbeat
	Generation int64  // 0 when no lease was acquired
	Holder     string
	// Outcome is one of the Outcome, Lost, Commit or Wait constants, by Kind.
	Outcome  string
	Duration time.Duration
	Leases   int   // EventHeartbeat only
	Err      error // EventHeartbeat, EventAcquire and EventCommit: the error, if any
}

// slowHeartbeatFraction defines a slow heartbeat: one whose statement took
// longer than the heartbeat interval divided by it (half the interval). A
// heartbeat that slow leaves the lease less time before self-fencing than
// the settings meant; it is logged at Warn.
const slowHeartbeatFraction = 2

// monitor is what a Runner tells of itself, and to whom: its logger (nil
// when none was given) and observer (nil when none was given). Every call
// is guarded so that without either nothing is built.
type monitor struct {
	log    *slog.Logger
	obs    Observer
	holder string
	table  string
}

// logs reports whether m logs at level.
func (m *monitor) logs(ctx context.Context, level slog.Level) bool {
	return m.log != nil && m.log.Enabled(ctx, level)
}

// logLease logs msg at level with the lease's attributes and attrs.
func (m *monitor) logLease(ctx context.Context, level slog.Level, msg string, l Lease, attrs ...slog.Attr) {
	if !m.logs(ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, 3+len(attrs))
	all = append(all, slog.String("target", l.TargetID))
	if l.Generation > 0 {
		all = append(all, slog.Int64("generation", l.Generation))
	}
	all = append(all, slog.String("holder", m.holder))
	m.log.LogAttrs(ctx, level, msg, append(all, attrs...)...)
}

// record records e, stamped with the holder, when m has an observer.
func (m *monitor) record(ctx context.Context, e Event) {
	if m.obs == nil {
		return
	}
	e.Holder = m.holder
	m.obs.Record(ctx, e)
}

// start starts a span when m has an observer; end is then not nil.
func (m *monitor) start(ctx context.Context, s Span) (context.Context, func(error)) {
	if m.obs == nil {
		return ctx, nil
	}
	s.Holder = m.holder
	return m.obs.Start(ctx, s)
}

// statementsKey is the context key under which a Run's context carries the
// monitor that its statements are reported to.
type statementsKey struct{}

// withStatements returns ctx, whose lease statements are reported to m's
// observer; with a nil m, to none (a Run without an observer inside the
// work of a Run with one).
func withStatements(ctx context.Context, m *monitor) context.Context {
	return context.WithValue(ctx, statementsKey{}, m)
}

// statementObserver returns the monitor that ctx's statements are reported
// to, or nil.
func statementObserver(ctx context.Context) *monitor {
	m, _ := ctx.Value(statementsKey{}).(*monitor)
	if m == nil || m.obs == nil {
		return nil
	}
	return m
}

// startStatement starts query's span, on the database dialector names.
func (m *monitor) startStatement(ctx context.Context, dialector, query string) (context.Context, func(error)) {
	return m.start(ctx, Span{
		Kind: SpanStatement, Operation: sqlOperation(query), Query: query,
		System: dbSystem(dialector), Table: m.table,
	})
}

// sqlOperation returns the first keyword of query, in upper case.
func sqlOperation(query string) string {
	query = strings.TrimLeft(query, " \t\n(")
	if i := strings.IndexAny(query, " \t\n;("); i >= 0 {
		query = query[:i]
	}
	return strings.ToUpper(query)
}

// dbSystem returns OpenTelemetry's name of the database that gorm's
// dialector names.
func dbSystem(dialector string) string {
	switch dialector {
	case "postgres":
		return "postgresql"
	case "mysql":
		return "mysql"
	case "sqlite":
		return "sqlite"
	}
	return dialector
}

// lossCause is the cause with which a Run's work is cancelled when its
// lease is lost or its hold too long: the error, and the kind of loss for
// the observer (one of the Lost constants).
type lossCause struct {
	kind string
	err  error
}

func (e *lossCause) Error() string { return e.err.Error() }
func (e *lossCause) Unwrap() error { return e.err }

// lossKind returns the kind of loss that err reports, or "".
func lossKind(err error) string {
	var c *lossCause
	if errors.As(err, &c) {
		return c.kind
	}
	return ""
}

// acquired reports the acquire that began at sent: its log line, event and
// span.
func (r *Runner[T]) acquired(ctx context.Context, targetID string, lease Lease, sent time.Time,
	err error, end func(error),
) {
	m := &r.mon
	if m.obs == nil && m.log == nil {
		return
	}
	d := time.Since(sent)
	outcome := OutcomeAcquired
	switch {
	case errors.Is(err, ErrLeaseHeld):
		outcome = OutcomeHeld
		m.logLease(ctx, slog.LevelDebug, "gormlease: lease held by another holder", Lease{TargetID: targetID},
			slog.Duration("duration", d))
	case err != nil:
		outcome = OutcomeError
		m.logLease(ctx, slog.LevelWarn, "gormlease: acquire failed", Lease{TargetID: targetID},
			slog.Duration("duration", d), slog.Any("error", err))
	default:
		m.logLease(ctx, slog.LevelDebug, "gormlease: lease acquired", lease, slog.Duration("duration", d))
	}
	if end != nil {
		end(err)
	}
	m.record(ctx, Event{Kind: EventAcquire, TargetID: targetID, Generation: lease.Generation,
		Outcome: outcome, Duration: d, Err: err})
	if err == nil {
		m.record(ctx, Event{Kind: EventLeaseStart, TargetID: targetID, Generation: lease.Generation})
	}
}

// leaseEnded reports that the Run no longer holds lease, acquired at sent.
func (r *Runner[T]) leaseEnded(ctx context.Context, lease Lease, sent time.Time) {
	if r.mon.obs == nil {
		return
	}
	r.mon.record(ctx, Event{Kind: EventLeaseEnd, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: time.Since(sent)})
}

// lost reports the loss of lease, acquired at sent, with cause.
func (r *Runner[T]) lost(ctx context.Context, lease Lease, sent time.Time, cause error) {
	kind := lossKind(cause)
	if kind == "" {
		kind = LostTakenOver
	}
	held := slog.Duration("held", time.Since(sent))
	switch kind {
	case LostMaxHold:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: work cancelled past the max hold, nothing saved", lease,
			held, slog.Duration("max_hold", r.cfg.maxHold))
	case LostSelfFenced:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: no heartbeat confirmed it in time, work cancelled", lease,
			held, slog.String("cause", kind), slog.Duration("trust_window", r.cfg.trustWindow()))
	default:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: taken over or released, work cancelled", lease,
			held, slog.String("cause", kind))
	}
	r.mon.record(ctx, Event{Kind: EventLeaseLost, TargetID: lease.TargetID, Generation: lease.Generation,
		Outcome: kind, Duration: time.Since(sent)})
}

// committed reports the fenced commit of lease that began at begin.
func (r *Runner[T]) committed(ctx context.Context, lease Lease, outcome string, begin time.Time,
	err error, end func(error),
) {
	m := &r.mon
	if m.obs == nil && m.log == nil {
		return
	}
	d := slog.Duration("duration", time.Since(begin))
	switch outcome {
	case CommitSaved:
		m.logLease(ctx, slog.LevelDebug, "gormlease: result saved, lease released", lease, d)
	case CommitLost:
		m.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: taken over before the commit, nothing saved", lease,
			d, slog.String("cause", LostTakenOver))
	case CommitUnknown:
		m.logLease(ctx, slog.LevelError, "gormlease: commit outcome unknown: check what was saved before running again",
			lease, d, slog.Any("error", err))
	default:
		m.logLease(ctx, slog.LevelDebug, "gormlease: result not saved", lease, d, slog.Any("error", err))
	}
	if end != nil {
		end(err)
	}
	m.record(ctx, Event{Kind: EventCommit, TargetID: lease.TargetID, Generation: lease.Generation,
		Outcome: outcome, Duration: time.Since(begin), Err: err})
	if outcome == CommitLost {
		m.record(ctx, Event{Kind: EventLeaseLost, TargetID: lease.TargetID, Generation: lease.Generation,
			Outcome: LostTakenOver})
	}
}

// waited reports the wait of a RunWait or Do call (kind WaitRunWait or
// WaitDo) on targetID, which began at begin and waited until until (now,
// when until is zero).
func (r *Runner[T]) waited(ctx context.Context, targetID, kind string, begin, until time.Time) {
	if r.mon.obs == nil {
		return
	}
	if until.IsZero() {
		until = time.Now()
	}
	r.mon.record(ctx, Event{Kind: EventWait, TargetID: targetID, Outcome: kind, Duration: until.Sub(begin)})
}
