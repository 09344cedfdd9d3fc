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

// The events a Runner records. The outcome of an acquire or of a fenced
// commit is its Event's Err, matched with errors.Is against the sentinel
// errors, as the caller of Run would match it.
const (
	// EventAcquire is an acquire, with its Duration. Err is nil when the
	// lease was taken, an error wrapping ErrLeaseHeld when another holder's
	// lease was live, and any other error when the acquire failed.
	EventAcquire EventKind = iota + 1
	// EventLeaseStart says that a Run now holds a lease.
	EventLeaseStart
	// EventLeaseEnd says that a Run no longer holds its lease, with
	// Duration how long it held it. The leases a process holds now are the
	// starts minus the ends.
	EventLeaseEnd
	// EventHeartbeat is one heartbeat statement: Duration its round trip,
	// Leases how many leases it renewed or tried to, Err its error.
	EventHeartbeat
	// EventLeaseLost is a Run's loss of its lease to a takeover: a
	// heartbeat, or the fenced commit, found the lease taken over or
	// released. The work was cancelled, or its result discarded; Err wraps
	// ErrLeaseLost, and Duration is how long the Run had held the lease.
	EventLeaseLost
	// EventSelfFenced is a Run that stopped trusting its lease because no
	// heartbeat confirmed it in time (see WithSafetyMargin): the work was
	// cancelled with Err, which wraps ErrLeaseLost; Duration is how long
	// the Run had held the lease.
	EventSelfFenced
	// EventMaxHoldExceeded is a Run whose work was still running when
	// WithMaxHold ran out: the work was cancelled with Err, which wraps
	// ErrMaxHoldExceeded; Duration is how long the Run had held the lease.
	EventMaxHoldExceeded
	// EventCommit is the fenced commit of a Run, with the saver inside it,
	// and its Duration. Err is nil when the result was saved; it wraps
	// ErrLeaseLost when the lease was gone and nothing was saved (an
	// EventLeaseLost follows), ErrCommitUnknown when the connection failed
	// during COMMIT and Run could not tell whether it took effect, and is
	// any other error when the saver or the transaction failed and nothing
	// was saved.
	EventCommit
	// EventRunWait is the time that a RunWait call waited for other
	// holders: from the call until its last try to run the work, or until
	// it returned. Every call records one, with Duration 0 when it did not
	// wait.
	EventRunWait
	// EventDoWait is the time that a Do call waited for other holders: from
	// the call until its last try to run the work, or until it took another
	// job's result or returned. Calls of Do that share one job in a process
	// record one between them, 0 when they did not wait.
	EventDoWait
)

// Event is one outcome of a Runner's work.
type Event struct {
	// Kind says what the event reports, and which of the other fields
	// it sets.
	Kind EventKind
	// TargetID is the target of the Run; empty for EventHeartbeat, whose
	// statement may renew the leases of many targets.
	TargetID string
	// Generation is the lease's generation, 0 when no lease was acquired.
	Generation int64
	// Holder is the Runner's holder name (WithHolder).
	Holder string
	// Duration is how long the step took, or the lease was held, by Kind.
	Duration time.Duration
	// Leases is, for EventHeartbeat, the number of leases that the
	// statement renewed or tried to.
	Leases int
	// Err is, for EventAcquire and EventCommit, the step's outcome (see
	// there); for EventHeartbeat the statement's error; for
	// EventLeaseLost, EventSelfFenced and EventMaxHoldExceeded the cause
	// that the work's context reports. It is nil otherwise.
	Err error
}

// lossName names the kind of loss kind in log lines: a takeover, self-fencing
// or the max hold.
func lossName(kind EventKind) string {
	switch kind {
	case EventSelfFenced:
		return "self_fenced"
	case EventMaxHoldExceeded:
		return "max_hold"
	}
	return "taken_over"
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
// the observer (EventLeaseLost, EventSelfFenced or EventMaxHoldExceeded).
type lossCause struct {
	kind EventKind
	err  error
}

func (e *lossCause) Error() string { return e.err.Error() }
func (e *lossCause) Unwrap() error { return e.err }

// lossKind returns the kind of loss that err reports, or 0.
func lossKind(err error) EventKind {
	var c *lossCause
	if errors.As(err, &c) {
		return c.kind
	}
	return 0
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
	switch {
	case errors.Is(err, ErrLeaseHeld):
		m.logLease(ctx, slog.LevelDebug, "gormlease: lease held by another holder", Lease{TargetID: targetID},
			slog.Duration("duration", d))
	case err != nil:
		m.logLease(ctx, slog.LevelWarn, "gormlease: acquire failed", Lease{TargetID: targetID},
			slog.Duration("duration", d), slog.Any("error", err))
	default:
		m.logLease(ctx, slog.LevelDebug, "gormlease: lease acquired", lease, slog.Duration("duration", d))
	}
	if end != nil {
		end(err)
	}
	m.record(ctx, Event{Kind: EventAcquire, TargetID: targetID, Generation: lease.Generation, Duration: d, Err: err})
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
	if kind == 0 {
		kind = EventLeaseLost
	}
	held := slog.Duration("held", time.Since(sent))
	switch kind {
	case EventMaxHoldExceeded:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: work cancelled past the max hold, nothing saved", lease,
			held, slog.Duration("max_hold", r.cfg.maxHold))
	case EventSelfFenced:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: no heartbeat confirmed it in time, work cancelled", lease,
			held, slog.String("cause", lossName(kind)), slog.Duration("trust_window", r.cfg.trustWindow()))
	default:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: taken over or released, work cancelled", lease,
			held, slog.String("cause", lossName(kind)))
	}
	r.mon.record(ctx, Event{Kind: kind, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: time.Since(sent), Err: cause})
}

// committed reports the fenced commit that began at begin, of lease,
// acquired at sent.
func (r *Runner[T]) committed(ctx context.Context, lease Lease, outcome commitOutcome, sent, begin time.Time,
	err error, end func(error),
) {
	m := &r.mon
	if m.obs == nil && m.log == nil {
		return
	}
	d := slog.Duration("duration", time.Since(begin))
	switch outcome {
	case commitSaved:
		m.logLease(ctx, slog.LevelDebug, "gormlease: result saved, lease released", lease, d)
	case commitLost:
		m.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: taken over before the commit, nothing saved", lease,
			d, slog.String("cause", lossName(EventLeaseLost)))
	case commitUnknown:
		m.logLease(ctx, slog.LevelError, "gormlease: commit outcome unknown: check what was saved before running again",
			lease, d, slog.Any("error", err))
	default:
		m.logLease(ctx, slog.LevelDebug, "gormlease: result not saved", lease, d, slog.Any("error", err))
	}
	if end != nil {
		end(err)
	}
	m.record(ctx, Event{Kind: EventCommit, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: time.Since(begin), Err: err})
	if outcome == commitLost {
		m.record(ctx, Event{Kind: EventLeaseLost, TargetID: lease.TargetID, Generation: lease.Generation,
			Duration: time.Since(sent), Err: err})
	}
}

// commitOutcome is how the fenced commit of a Run ended.
type commitOutcome uint8

const (
	commitSaved   commitOutcome = iota // the result was saved
	commitLost                         // the lease was gone, nothing saved
	commitUnknown                      // the connection failed during COMMIT and Run could not tell
	commitFailed                       // the saver or the transaction failed, nothing saved
)

// waited reports the wait of a RunWait or Do call (kind EventRunWait or
// EventDoWait) on targetID, which began at begin and waited until until
// (now, when until is zero).
func (r *Runner[T]) waited(ctx context.Context, targetID string, kind EventKind, begin, until time.Time) {
	if r.mon.obs == nil {
		return
	}
	if until.IsZero() {
		until = time.Now()
	}
	r.mon.record(ctx, Event{Kind: kind, TargetID: targetID, Duration: until.Sub(begin)})
}
