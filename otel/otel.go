// Package gormleaseotel reports what gormlease Runners do to OpenTelemetry:
// metrics (acquires, leases held, heartbeat round trips, losses, commits,
// waits, and for Electors the leader metrics: who leads each role, terms
// begun and ended, time without a leader) and traces (a span per Run with its acquire, heartbeats and fenced
// commit as children, and a client span per lease statement, following
// OpenTelemetry's semantic conventions for database calls). It is a module
// of its own, so that gormlease itself depends on no OpenTelemetry package.
//
//	obs, err := gormleaseotel.New() // the global providers; or WithTracerProvider, WithMeterProvider
//	runner, err := gormlease.NewRunner[*Report](db, gormlease.WithObserver(obs))
package gormleaseotel

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/observe"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/gormlease/gormlease/otel"

// Metric names.
const (
	MetricAcquires        = "gormlease.acquires"           // counter, by AttrOutcome: acquired, held, paused, error
	MetricAcquireDuration = "gormlease.acquire.duration"   // histogram, seconds, by AttrOutcome
	MetricLeasesHeld      = "gormlease.leases.held"        // up-down counter: leases held now
	MetricHoldDuration    = "gormlease.lease.duration"     // histogram, seconds: how long each lease was held
	MetricHeartbeatRTT    = "gormlease.heartbeat.duration" // histogram, seconds, per heartbeat statement; AttrErrorType on failure
	MetricLeasesLost      = "gormlease.leases.lost"        // counter, by AttrLostCause: taken_over, self_fenced, max_hold
	MetricCommits         = "gormlease.commits"            // counter, by AttrOutcome: saved, lost, unknown, failed
	MetricCommitDuration  = "gormlease.commit.duration"    // histogram, seconds, by AttrOutcome
	MetricWaitDuration    = "gormlease.wait.duration"      // histogram, seconds, by AttrWaitCall: run_wait, do
	MetricLeasesStopped   = "gormlease.leases.stopped"     // counter: leases given up because an operator asked the holder to stop
)

// Metric names of the leader metrics, which an Elector's campaigns and
// terms report (observe.EventCampaign, EventTermBegun, EventTermEnded):
// one series per role (AttrRole, the role's name), however many targets
// the process's Runners run. A Prometheus exporter names them
// gormlease_leader_status, gormlease_leader_terms_begun_total,
// gormlease_leader_terms_ended_total and
// gormlease_leader_leaderless_duration_seconds; docs/operating.md, section
// "Leader metrics", has queries and alerts.
const (
	// MetricLeaderStatus is 1 while this process leads the role, from the
	// beginning of its term until the term is over (lead returned and the
	// lease was released or found lost), and 0 from the first campaign of
	// the role (a call of Elector.Lead) until then and after: an up-down
	// counter, which Prometheus reads as a gauge. Summed over the
	// processes, it is the number of leaders of the role.
	MetricLeaderStatus = "gormlease.leader.status"
	// MetricTermsBegun counts the terms that this process began.
	MetricTermsBegun = "gormlease.leader.terms.begun"
	// MetricTermsEnded counts the terms that ended, by AttrTermCause.
	MetricTermsEnded = "gormlease.leader.terms.ended"
	// MetricLeaderless is a histogram, in seconds, of how long the role had
	// been without a leader when this process began a term: from the end
	// of the previous term's lease (its release, or its expiry if that
	// came first, as the row records them) to the new term. A term whose
	// process could not tell (the role's first) records nothing.
	MetricLeaderless = "gormlease.leader.leaderless.duration"
	// MetricClientGoLeaderStatus is client-go's name of the leader status
	// (Kubernetes' leader election), 1 while the process leads the lease
	// named by the attribute "name" and 0 otherwise: with
	// WithClientGoLeaderStatus, MetricLeaderStatus is reported under this
	// name too, with the role as "name", so that dashboards and alerts
	// written for Kubernetes controllers show gormlease's roles.
	MetricClientGoLeaderStatus = "leader_election_master_status"
)

// Span names of the lease's steps: SpanNameRun is the name of a span of
// kind observe.SpanRun, and so on. A statement's span (observe.SpanStatement)
// is named after its operation and table, as the semantic conventions say:
// "UPDATE job_lease".
const (
	SpanNameRun       = "gormlease.run"
	SpanNameAcquire   = "gormlease.acquire"
	SpanNameHeartbeat = "gormlease.heartbeat"
	SpanNameCommit    = "gormlease.commit"
)

// Attribute names.
const (
	AttrTarget     = "gormlease.target"     // spans: the target ID
	AttrGeneration = "gormlease.generation" // spans: the lease's generation
	AttrHolder     = "gormlease.holder"     // spans: WithHolder's name
	AttrOutcome    = "gormlease.outcome"    // metrics: acquire and commit outcomes
	AttrLostCause  = "gormlease.lost.cause" // metrics: why a lease was lost
	AttrWaitCall   = "gormlease.wait.call"  // metrics: run_wait or do
	AttrRole       = "gormlease.role"       // leader metrics: the role's name (an Elector's)
	AttrTermCause  = "gormlease.term.cause" // leader metrics: why a term ended (observe.TermEnd's names)
	// AttrClientGoName is client-go's attribute of the lease's name, for
	// MetricClientGoLeaderStatus.
	AttrClientGoName = "name"

	// OpenTelemetry's semantic conventions for database client calls.
	AttrDBSystem     = "db.system.name"
	AttrDBOperation  = "db.operation.name"
	AttrDBQueryText  = "db.query.text"
	AttrDBCollection = "db.collection.name"
	AttrErrorType    = "error.type"
)

// Observer is an observe.Observer that reports to OpenTelemetry. Make it
// with New; it is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer

	acquires, lost, commits, stopped  metric.Int64Counter
	held                              metric.Int64UpDownCounter
	acquireDur, holdDur, heartbeatDur metric.Float64Histogram
	commitDur, waitDur                metric.Float64Histogram

	leaderStatus, clientGoStatus metric.Int64UpDownCounter // clientGoStatus is nil without WithClientGoLeaderStatus
	termsBegun, termsEnded       metric.Int64Counter
	leaderless                   metric.Float64Histogram
}

var _ observe.Observer = (*Observer)(nil)

// An Option configures New.
type Option func(*settings)

type settings struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	clientGo bool
}

// WithTracerProvider sets the provider of the tracer. The default is
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(s *settings) { s.tp = tp }
}

// WithMeterProvider sets the provider of the meter. The default is
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(s *settings) { s.mp = mp }
}

// WithClientGoLeaderStatus reports each role's leader status also as
// client-go's leader_election_master_status (MetricClientGoLeaderStatus),
// with the role's name as the attribute "name", for the dashboards and
// alerts that chart Kubernetes controllers. It is off by default, since a
// process that runs client-go's leader election too would report that name
// twice.
func WithClientGoLeaderStatus() Option {
	return func(s *settings) { s.clientGo = true }
}

// leaderlessBuckets are the bounds of MetricLeaderless's buckets, in
// seconds: a handover at a resignation takes milliseconds; one after a
// leader died, the lease timeout (20 s by default) and a little more.
var leaderlessBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 25, 30, 45, 60, 120, 300, 600}

// New returns an Observer for gormlease.WithObserver (of a Runner, or of
// an Elector for the leader metrics).
func New(opts ...Option) (*Observer, error) {
	s := settings{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&s)
	}
	if s.tp == nil || s.mp == nil {
		return nil, errors.New("gormleaseotel: nil tracer or meter provider")
	}
	m := s.mp.Meter(ScopeName)
	o := &Observer{tracer: s.tp.Tracer(ScopeName)}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return h
	}
	o.acquires = counter(MetricAcquires, "Acquire attempts of gormlease Runs, by outcome.")
	o.lost = counter(MetricLeasesLost, "Leases lost while their work ran, by cause.")
	o.commits = counter(MetricCommits, "Fenced commits of gormlease Runs, by outcome.")
	o.stopped = counter(MetricLeasesStopped, "Leases given up because an operator asked their holder to stop.")
	held, err := m.Int64UpDownCounter(MetricLeasesHeld, metric.WithDescription("Leases that Runs hold now."))
	errs = append(errs, err)
	o.held = held
	o.acquireDur = seconds(MetricAcquireDuration, "Duration of acquires.")
	o.holdDur = seconds(MetricHoldDuration, "How long Runs held their leases.")
	o.heartbeatDur = seconds(MetricHeartbeatRTT, "Round trip of heartbeat statements.")
	o.commitDur = seconds(MetricCommitDuration, "Duration of fenced commits, with the saver.")
	o.waitDur = seconds(MetricWaitDuration, "Time RunWait and Do calls waited for other holders.")
	updown := func(name, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	o.leaderStatus = updown(MetricLeaderStatus, "1 while this process leads the role, 0 while it campaigns.")
	if s.clientGo {
		o.clientGoStatus = updown(MetricClientGoLeaderStatus,
			"1 while this process leads the lease (a gormlease role) that name names, 0 while it stands by.")
	}
	o.termsBegun = counter(MetricTermsBegun, "Terms that this process began as the role's leader.")
	o.termsEnded = counter(MetricTermsEnded, "Terms of this process that ended, by cause.")
	o.leaderless, err = m.Float64Histogram(MetricLeaderless,
		metric.WithDescription("How long the role had been without a leader when this process began a term."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(leaderlessBuckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gormleaseotel: %w", err)
	}
	return o, nil
}

// Start implements observe.Observer.
func (o *Observer) Start(ctx context.Context, s observe.Span) (context.Context, func(error)) {
	opts := make([]trace.SpanStartOption, 0, 3)
	if !s.Start.IsZero() {
		opts = append(opts, trace.WithTimestamp(s.Start))
	}
	var name string
	var attrs []attribute.KeyValue
	if s.Kind == observe.SpanStatement {
		name = s.Operation
		if s.Table != "" {
			name += " " + s.Table
		}
		opts = append(opts, trace.WithSpanKind(trace.SpanKindClient))
		attrs = []attribute.KeyValue{
			attribute.String(AttrDBSystem, s.System),
			attribute.String(AttrDBOperation, s.Operation),
			attribute.String(AttrDBQueryText, s.Query),
			attribute.String(AttrDBCollection, s.Table),
		}
	} else {
		name = spanNames[s.Kind]
		attrs = []attribute.KeyValue{attribute.String(AttrTarget, s.TargetID), attribute.String(AttrHolder, s.Holder)}
		if s.Generation > 0 {
			attrs = append(attrs, attribute.Int64(AttrGeneration, s.Generation))
		}
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	ctx, span := o.tracer.Start(ctx, name, opts...)
	return ctx, func(err error) {
		if err != nil && !refusedOrStopped(err) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

var spanNames = map[observe.SpanKind]string{
	observe.SpanRun:       SpanNameRun,
	observe.SpanAcquire:   SpanNameAcquire,
	observe.SpanHeartbeat: SpanNameHeartbeat,
	observe.SpanCommit:    SpanNameCommit,
}

// Record implements observe.Observer.
func (o *Observer) Record(ctx context.Context, e observe.Event) {
	secs := e.Duration.Seconds()
	switch e.Kind {
	case observe.EventAcquire:
		set := metric.WithAttributes(attribute.String(AttrOutcome, acquireOutcome(e.Err)))
		o.acquires.Add(ctx, 1, set)
		o.acquireDur.Record(ctx, secs, set)
		if e.Err == nil {
			o.held.Add(ctx, 1)
		}
	case observe.EventLeaseEnd:
		o.held.Add(ctx, -1)
		o.holdDur.Record(ctx, secs)
	case observe.EventHeartbeat:
		if e.Err != nil {
			o.heartbeatDur.Record(ctx, secs, metric.WithAttributes(attribute.String(AttrErrorType, errorType(e.Err))))
			return
		}
		o.heartbeatDur.Record(ctx, secs)
	case observe.EventLeaseLost:
		o.lost.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrLostCause, "taken_over")))
	case observe.EventSelfFenced:
		o.lost.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrLostCause, "self_fenced")))
	case observe.EventMaxHoldExceeded:
		o.lost.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrLostCause, "max_hold")))
	case observe.EventStopRequested:
		o.stopped.Add(ctx, 1)
	case observe.EventCommit:
		set := metric.WithAttributes(attribute.String(AttrOutcome, commitOutcome(e.Err)))
		o.commits.Add(ctx, 1, set)
		o.commitDur.Record(ctx, secs, set)
	case observe.EventRunWait:
		o.waitDur.Record(ctx, secs, metric.WithAttributes(attribute.String(AttrWaitCall, "run_wait")))
	case observe.EventDoWait:
		o.waitDur.Record(ctx, secs, metric.WithAttributes(attribute.String(AttrWaitCall, "do")))
	case observe.EventCampaign:
		o.leading(ctx, e.TargetID, 0) // the role's series, at 0 while the process campaigns
	case observe.EventTermBegun:
		role := metric.WithAttributes(attribute.String(AttrRole, e.TargetID))
		o.leading(ctx, e.TargetID, 1)
		o.termsBegun.Add(ctx, 1, role)
		if e.Duration >= 0 {
			o.leaderless.Record(ctx, secs, role)
		}
	case observe.EventTermEnded:
		o.leading(ctx, e.TargetID, -1)
		o.termsEnded.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrRole, e.TargetID),
			attribute.String(AttrTermCause, e.TermEnd.String())))
	}
}

// leading adds n to the leader status of role.
func (o *Observer) leading(ctx context.Context, role string, n int64) {
	o.leaderStatus.Add(ctx, n, metric.WithAttributes(attribute.String(AttrRole, role)))
	if o.clientGoStatus != nil {
		o.clientGoStatus.Add(ctx, n, metric.WithAttributes(attribute.String(AttrClientGoName, role)))
	}
}

// refusedOrStopped reports whether a span that ended with err ended as
// asked rather than failed: its acquire refused because another holder's
// lease was live or the target is paused (ErrLeaseHeld, which ErrPaused's
// errors match too), or its work stopped at an operator's request
// (ErrStopRequested). Such spans get no error status.
func refusedOrStopped(err error) bool {
	return errors.Is(err, gormlease.ErrLeaseHeld) || errors.Is(err, gormlease.ErrStopRequested)
}

// acquireOutcome names the outcome of an acquire that ended with err, for
// AttrOutcome: acquired, held, paused or error.
func acquireOutcome(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, gormlease.ErrPaused):
		return "paused"
	case errors.Is(err, gormlease.ErrLeaseHeld):
		return "held"
	}
	return "error"
}

// commitOutcome names the outcome of a fenced commit that ended with err,
// for AttrOutcome: saved, lost, unknown or failed.
func commitOutcome(err error) string {
	switch {
	case err == nil:
		return "saved"
	case errors.Is(err, gormlease.ErrLeaseLost):
		return "lost"
	case errors.Is(err, gormlease.ErrCommitUnknown):
		return "unknown"
	}
	return "failed"
}

// errorType names err for error.type: a timeout, or "other".
func errorType(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "_OTHER"
}
