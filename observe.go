package gormlease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/observe"
)

// lossName names the kind of loss kind in log lines: a takeover, self-fencing
// or the max hold.
func lossName(kind observe.EventKind) string {
	switch kind {
	case observe.EventSelfFenced:
		return "self_fenced"
	case observe.EventMaxHoldExceeded:
		return "max_hold"
	}
	return "taken_over"
}

// slowHeartbeatFraction defines a slow heartbeat: one whose statement took
// longer than the heartbeat interval divided by it (half the interval). A
// heartbeat that slow leaves the lease less time before self-fencing than
// the settings meant; it is logged at Warn, and so is any other lease
// statement that slow.
const slowHeartbeatFraction = 2

// monitor is what a Runner tells of itself, and to whom: its logger (nil
// when none was given) and observer (nil when none was given). Every call
// is guarded so that without either nothing is built.
type monitor struct {
	log    *slog.Logger
	obs    observe.Observer
	holder string
	table  string
	slow   time.Duration // a lease statement that took longer is logged at Warn
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
	all := make([]slog.Attr, 0, 4+len(attrs))
	all = append(all, slog.String("target", l.TargetID))
	if l.Slot > 0 {
		all = append(all, slog.Int("slot", l.Slot))
	}
	if l.Generation > 0 {
		all = append(all, slog.Int64("generation", l.Generation))
	}
	all = append(all, slog.String("holder", m.holder))
	m.log.LogAttrs(ctx, level, msg, append(all, attrs...)...)
}

// record records e, stamped with the holder, when m has an observer.
func (m *monitor) record(ctx context.Context, e observe.Event) {
	if m.obs == nil {
		return
	}
	e.Holder = m.holder
	m.obs.Record(ctx, e)
}

// start starts a span when m has an observer; end is then not nil.
func (m *monitor) start(ctx context.Context, s observe.Span) (context.Context, func(error)) {
	if m.obs == nil {
		return ctx, nil
	}
	s.Holder = m.holder
	return m.obs.Start(ctx, s)
}

// withStatements returns ctx, whose lease statements are reported to m's
// logger and observer; with a nil m, or one with neither, to none (a Run
// without them inside the work of a Run with them).
func withStatements(ctx context.Context, m *monitor) context.Context {
	if m == nil || (m.obs == nil && m.log == nil) {
		if !backend.HasStatementHook(ctx) {
			return ctx
		}
		return backend.WithStatementHook(ctx, nil)
	}
	return backend.WithStatementHook(ctx, m.startStatement)
}

// startStatement starts query's span, on the database dialector names; its
// end logs the statement when it was slow or failed (see statementEnded).
func (m *monitor) startStatement(ctx context.Context, dialector, query string) (context.Context, func(error)) {
	ctx, end := m.start(ctx, observe.Span{
		Kind: observe.SpanStatement, Operation: sqlOperation(query), Query: query,
		System: dbSystem(dialector), Table: m.table,
	})
	if !m.logs(ctx, slog.LevelWarn) {
		return ctx, end
	}
	begin := time.Now()
	return ctx, func(err error) {
		m.statementEnded(ctx, query, time.Since(begin), err)
		if end != nil {
			end(err)
		}
	}
}

// statementEnded logs a lease statement, query, that ran for d and ended
// with err, on ctx: at Warn when it took longer than m.slow, and at Debug
// when it failed other than as a normal outcome (the step that sent it logs
// what the failure meant). These are what gorm's logger is not told of the
// library's statements (see backend.QuietLogger).
func (m *monitor) statementEnded(ctx context.Context, query string, d time.Duration, err error) {
	failed := err != nil && !backend.ExpectedFailure(ctx, err)
	attrs := []slog.Attr{slog.String("operation", sqlOperation(query)), slog.String("sql", query),
		slog.Duration("duration", d)}
	if failed {
		attrs = append(attrs, slog.Any("error", err))
	}
	switch {
	case m.slow > 0 && d > m.slow:
		m.log.LogAttrs(ctx, slog.LevelWarn, "gormlease: slow lease statement",
			append(attrs, slog.Duration("threshold", m.slow))...)
	case failed && m.logs(ctx, slog.LevelDebug):
		m.log.LogAttrs(ctx, slog.LevelDebug, "gormlease: lease statement failed", attrs...)
	}
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
	kind observe.EventKind
	err  error
}

func (e *lossCause) Error() string { return e.err.Error() }
func (e *lossCause) Unwrap() error { return e.err }

// lossKind returns the kind of loss that err reports, or 0.
func lossKind(err error) observe.EventKind {
	var c *lossCause
	if errors.As(err, &c) {
		return c.kind
	}
	return 0
}

// acquired reports the acquire that began at began: its log line, event and
// span.
func (r *Runner[T]) acquired(ctx context.Context, targetID string, lease Lease, began time.Time,
	err error, end func(error),
) {
	m := &r.mon
	if m.obs == nil && m.log == nil {
		return
	}
	d := time.Since(began)
	switch {
	case errors.Is(err, ErrPaused):
		m.logLease(ctx, slog.LevelDebug, "gormlease: target paused, not acquired", Lease{TargetID: targetID},
			slog.Duration("duration", d), slog.Any("reason", err))
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
	m.record(ctx, observe.Event{Kind: observe.EventAcquire, TargetID: targetID, Generation: lease.Generation, Duration: d, Err: err})
}

// leaseEnded reports that the Run no longer holds lease, acquired at sent.
func (r *Runner[T]) leaseEnded(ctx context.Context, lease Lease, sent time.Time) {
	if r.mon.obs == nil {
		return
	}
	r.mon.record(ctx, observe.Event{Kind: observe.EventLeaseEnd, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: time.Since(sent)})
}

// stopped reports a Run of lease, acquired at sent, whose work was
// cancelled because an operator asked the holder to stop, with cause: an
// Info line (the library did as asked) and an EventStopRequested.
func (r *Runner[T]) stopped(ctx context.Context, lease Lease, sent time.Time, cause error) {
	held := time.Since(sent)
	r.mon.logLease(ctx, slog.LevelInfo, "gormlease: an operator asked the holder to stop; work cancelled, nothing saved", lease,
		slog.Duration("held", held), slog.Any("reason", cause))
	r.mon.record(ctx, observe.Event{Kind: observe.EventStopRequested, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: held, Err: cause})
}

// lost reports the loss of lease, acquired at sent, with cause.
func (r *Runner[T]) lost(ctx context.Context, lease Lease, sent time.Time, cause error) {
	kind := lossKind(cause)
	if kind == 0 {
		kind = observe.EventLeaseLost
	}
	held := slog.Duration("held", time.Since(sent))
	switch kind {
	case observe.EventMaxHoldExceeded:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: work cancelled past the max hold, nothing saved", lease,
			held, slog.Duration("max_hold", r.cfg.maxHold))
	case observe.EventSelfFenced:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: no heartbeat confirmed it in time, work cancelled", lease,
			held, slog.String("cause", lossName(kind)), slog.Duration("trust_window", r.cfg.trustWindow()))
	default:
		r.mon.logLease(ctx, slog.LevelWarn, "gormlease: lease lost: taken over or released, work cancelled", lease,
			held, slog.String("cause", lossName(kind)))
	}
	r.mon.record(ctx, observe.Event{Kind: kind, TargetID: lease.TargetID, Generation: lease.Generation,
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
			d, slog.String("cause", lossName(observe.EventLeaseLost)))
	case commitUnknown:
		m.logLease(ctx, slog.LevelError, "gormlease: commit outcome unknown: check what was saved before running again",
			lease, d, slog.Any("error", err))
	default:
		m.logLease(ctx, slog.LevelDebug, "gormlease: result not saved", lease, d, slog.Any("error", err))
	}
	if end != nil {
		end(err)
	}
	m.record(ctx, observe.Event{Kind: observe.EventCommit, TargetID: lease.TargetID, Generation: lease.Generation,
		Duration: time.Since(begin), Err: err})
	if outcome == commitLost {
		m.record(ctx, observe.Event{Kind: observe.EventLeaseLost, TargetID: lease.TargetID, Generation: lease.Generation,
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
func (r *Runner[T]) waited(ctx context.Context, targetID string, kind observe.EventKind, begin, until time.Time) {
	if r.mon.obs == nil {
		return
	}
	if until.IsZero() {
		until = time.Now()
	}
	r.mon.record(ctx, observe.Event{Kind: kind, TargetID: targetID, Duration: until.Sub(begin)})
}

// termReport reports one call of Elector.Lead to the Elector's observer:
// its campaign, and its term with the time the role had been without a
// leader before it and the cause of its end. It lives on the goroutine of
// the call. A nil *termReport, for an Elector without an observer,
// reports nothing.
type termReport struct {
	mon      *monitor
	role     string
	fallback time.Duration // the lease timeout by which a row that records none is judged

	// seen is the last read of the role's row before the acquire that
	// began the term (its Read is zero when there was none).
	seen backend.State
	// The term begun and not yet ended (gen is 0 when none): when it
	// began; whether lead returned, with leadErr, and the cause of the
	// term's context when it did (nil when it was not cancelled).
	gen     int64
	began   time.Time
	done    bool
	leadErr error
	cause   error
}

// campaign reports the beginning of a campaign of a call of Lead, and
// reads the role's row once, so that a term that this call begins without
// having waited can tell how long the role was without a leader: nil
// without an observer.
func (e *Elector) campaign(ctx context.Context) *termReport {
	m := &e.runner.mon
	if m.obs == nil {
		return nil
	}
	m.record(ctx, observe.Event{Kind: observe.EventCampaign, TargetID: e.name})
	t := &termReport{mon: m, role: e.name, fallback: e.runner.cfg.leaseTimeout}
	if st, _, err := e.runner.readState(ctx, e.name); err == nil {
		t.seen = st // a failed read leaves the time without a leader unknown
	}
	return t
}

// saw keeps st, a read of the role's row that found no live lease, after
// which the campaign tries to acquire again.
func (t *termReport) saw(st backend.State) { t.seen = st }

// begin reports the beginning of the term of term, lead's context.
func (t *termReport) begin(term context.Context) {
	if t == nil {
		return
	}
	lease, _ := LeaseFromContext(term)
	*t = termReport{mon: t.mon, role: t.role, fallback: t.fallback, seen: t.seen, gen: lease.Generation, began: time.Now()}
	t.mon.record(term, observe.Event{Kind: observe.EventTermBegun, TargetID: t.role, Generation: t.gen,
		Duration: vacancy(t.seen, t.gen, t.began, t.fallback)})
}

// returned notes that lead returned err, with its context term.
func (t *termReport) returned(term context.Context, err error) {
	if t == nil {
		return
	}
	t.done, t.leadErr, t.cause = true, err, context.Cause(term)
}

// ended reports the end of the term, whose Run returned runErr, and whose
// Lead returns leadErr.
func (t *termReport) ended(ctx context.Context, runErr, leadErr error) {
	if t == nil || t.gen == 0 {
		return
	}
	end := termEnd(t.done, t.leadErr, t.cause, runErr)
	t.mon.record(ctx, observe.Event{Kind: observe.EventTermEnded, TargetID: t.role, Generation: t.gen,
		Duration: time.Since(t.began), Err: leadErr, TermEnd: end})
	t.gen = 0
}

// exited reports the end of a term that lead left by runtime.Goexit, when
// Lead did not return.
func (t *termReport) exited(ctx context.Context) {
	if t == nil || t.gen == 0 {
		return
	}
	t.ended(ctx, errWorkExited, errWorkExited)
}

// termEnd says why a term ended: lead returned (done) with leadErr, or
// did not (it panicked or exited); its context had cause when it did (nil
// when it was not cancelled); and the term's Run returned runErr.
func termEnd(done bool, leadErr, cause, runErr error) observe.TermEnd {
	if !done {
		return observe.TermFailed
	}
	// The term's context says why it was cancelled; a loss found after
	// lead returned, by a heartbeat before it stopped or by the fenced
	// commit, is in Run's error.
	for _, err := range []error{cause, runErr} {
		switch lossKind(err) {
		case observe.EventLeaseLost:
			return observe.TermTakenOver
		case observe.EventSelfFenced:
			return observe.TermSelfFenced
		case observe.EventMaxHoldExceeded:
			return observe.TermMaxHold
		}
		if errors.Is(err, ErrStopRequested) {
			return observe.TermStopRequested
		}
	}
	switch {
	case cause != nil:
		return observe.TermCancelled // Lead's context, the term's parent, ended
	case leadErr != nil:
		return observe.TermFailed
	case errors.Is(runErr, ErrLeaseLost):
		return observe.TermTakenOver // the fenced commit found the lease gone
	}
	return observe.TermResigned
}

// vacancy is how long a role had been without a leader when the term of
// generation began, at began: from the end of the previous term's lease,
// its release or its expiry, whichever came first, as st, the last read of
// the role's row before the acquire, shows them. The read's ages are on
// the database's clock and its Read on this process's, so that the clocks
// need not agree; the end it finds is late by at most the read's answer's
// trip back. It is -1 when st cannot tell: no read, no row, a lease still
// live when read, or a read of another generation than the one just before
// this term.
func vacancy(st backend.State, generation int64, began time.Time, fallback time.Duration) time.Duration {
	if st.Read.IsZero() || !st.Found || st.Generation+1 != generation || st.Live(fallback) {
		return -1
	}
	timeout := st.Timeout
	if timeout <= 0 {
		timeout = fallback
	}
	end := st.Read.Add(timeout - st.Age) // the expiry
	if st.Released && st.ReleasedAge >= 0 {
		if released := st.Read.Add(-st.ReleasedAge); released.Before(end) {
			end = released
		}
	}
	return max(began.Sub(end), 0)
}
