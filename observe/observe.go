// Package observe defines what a gormlease Runner reports of itself to an
// Observer, for metrics and traces: each of its steps as a Span, and each
// outcome as an Event. Give an Observer to gormlease.NewRunner with
// gormlease.WithObserver; the module github.com/gormlease/gormlease/otel
// implements one with OpenTelemetry. Nothing here is needed to use gormlease
// without an Observer, and the package depends on nothing but the standard
// library.
//
// An Observer learns each outcome from the kind of an Event and from its
// Err, which wraps gormlease's sentinel errors as Run's own error does:
// EventSelfFenced, for instance, is a Run that stopped trusting its lease,
// and its Err wraps gormlease.ErrLeaseLost.
package observe

import (
	"context"
	"time"
)

// An Observer receives what a gormlease Runner does, for metrics and
// traces: its steps as spans (Start) and its outcomes as events (Record).
// The Runner calls it from the goroutines of its Runs and from those of
// its heartbeats: the Runner's own heartbeat goroutine, which no other
// Runner shares, and its heartbeat statements, up to four at once, each on
// a goroutine of its own. So it must be safe for concurrent use; it should
// return quickly, since the Runner waits for it.
// Without an Observer, the Runner calls nothing.
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
	// Kind says which step or statement the span covers.
	Kind SpanKind
	// TargetID is the target of the Run; empty for statements that renew
	// many leases at once.
	TargetID string
	// Generation is the lease's generation, once it is acquired (0 before:
	// in SpanRun and SpanAcquire).
	Generation int64
	// Holder is the Runner's holder name (gormlease.WithHolder).
	Holder string
	// Start is when the span began, when that was before Start was called
	// (a heartbeat span is started once its statement has returned); zero
	// means now.
	Start time.Time

	// For SpanStatement: Operation is the statement's first SQL keyword
	// (UPDATE, SELECT, INSERT, BEGIN, ...); Query the SQL text, with
	// placeholders for its values (also for the statements that PostgreSQL
	// is sent with the values written in, the batched heartbeat among
	// them), except in the one-query fenced commit, whose BEGIN and locking
	// UPDATE carry the lease's target and token as literals; System the database, as OpenTelemetry names it
	// ("postgresql", "mysql", "sqlite"); Table the lease table.
	Operation, Query, System, Table string
}

// EventKind says what an Event reports.
type EventKind uint8

// The events a Runner records. The outcome of an acquire or of a fenced
// commit is its Event's Err, matched with errors.Is against gormlease's
// sentinel errors, as the caller of Run would match it.
const (
	// EventAcquire is an acquire, with its Duration. Err is nil when the
	// lease was taken: the Run holds it from then on, until its
	// EventLeaseEnd. Err wraps gormlease.ErrLeaseHeld when another
	// holder's lease was live, and also wraps gormlease.ErrPaused when the
	// target is paused (an operator's admin.Operator.Pause): both are refusals,
	// not failures. It is any other error when the acquire failed.
	EventAcquire EventKind = iota + 1
	// EventLeaseEnd says that a Run no longer holds its lease, with
	// Duration how long it held it. The leases a process holds now are its
	// EventAcquires with a nil Err minus its EventLeaseEnds. A lease that a
	// minimum hold (gormlease.WithMinHold) leaves held, unrenewed, after
	// the Run ends has ended for the Run: its EventLeaseEnd comes as the
	// Run returns.
	EventLeaseEnd
	// EventHeartbeat is one heartbeat statement: Duration its round trip,
	// Leases how many leases it renewed or tried to, Err its error.
	EventHeartbeat
	// EventLeaseLost is a Run's loss of its lease to a takeover: a
	// heartbeat, or the fenced commit, found the lease taken over or
	// released. The work was cancelled, or its result discarded; Err wraps
	// gormlease.ErrLeaseLost, and Duration is how long the Run had held the lease.
	EventLeaseLost
	// EventSelfFenced is a Run that stopped trusting its lease because no
	// heartbeat confirmed it in time (see gormlease.WithSafetyMargin): the work was
	// cancelled with Err, which wraps gormlease.ErrLeaseLost; Duration is how long
	// the Run had held the lease.
	EventSelfFenced
	// EventMaxHoldExceeded is a Run whose work was still running when
	// gormlease.WithMaxHold ran out: the work was cancelled with Err, which wraps
	// gormlease.ErrMaxHoldExceeded; Duration is how long the Run had held the lease.
	EventMaxHoldExceeded
	// EventCommit is the fenced commit of a Run, with the saver inside it,
	// and its Duration. Err is nil when the result was saved; it wraps
	// gormlease.ErrLeaseLost when the lease was gone and nothing was saved (an
	// EventLeaseLost follows), gormlease.ErrCommitUnknown when the connection failed
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
	// EventStopRequested is a Run whose work was cancelled because an
	// operator asked the holder to stop (admin.Operator.RequestStop):
	// nothing was saved and the lease was given up, not lost (no
	// EventLeaseLost). Err wraps gormlease.ErrStopRequested, with the
	// request's reason; Duration is how long the Run had held the lease.
	EventStopRequested
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
	// Holder is the Runner's holder name (gormlease.WithHolder).
	Holder string
	// Duration is how long the step took, or the lease was held, by Kind.
	Duration time.Duration
	// Leases is, for EventHeartbeat, the number of leases that the
	// statement renewed or tried to.
	Leases int
	// Err is, for EventAcquire and EventCommit, the step's outcome (see
	// there); for EventHeartbeat the statement's error; for
	// EventLeaseLost, EventSelfFenced, EventMaxHoldExceeded and
	// EventStopRequested the cause that the work's context reports. It is
	// nil otherwise.
	Err error
}
