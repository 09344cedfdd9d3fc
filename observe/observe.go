// Package observe defines what a gormlease Runner reports of itself to an
// Observer, for metrics and traces: each of its steps as a Span, and each
// outcome as an Event. An Elector reports, besides its Runs', its
// campaigns and terms (EventCampaign, EventTermBegun, EventTermEnded). Give an Observer to gormlease.NewRunner with
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
// a goroutine of its own; an Elector's, besides, from the goroutine that
// calls Lead. So it must be safe for concurrent use; it should return
// quickly, since the Runner waits for it.
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
	// EventCampaign is a call of gormlease.Elector.Lead that begins to
	// campaign for its role, whose name is TargetID: from now on, until
	// the call returns, the process is a candidate for the role. It comes
	// once per call, before the call's first acquire.
	EventCampaign
	// EventTermBegun is an Elector that begins a term of its role
	// (TargetID), as Lead is about to call its lead function: Generation is
	// the term, and Duration how long the role had been without a leader
	// before it, from the end of the previous term's lease (its release,
	// or its expiry if that came first, as the role's row records them on
	// the database's clock) until now. Duration is negative when the
	// process could not tell: the role's first term, or a term whose
	// campaign did not read the row after the previous term ended (see
	// gormlease.Elector.Lead). Every EventTermBegun is followed by one
	// EventTermEnded of the same Generation.
	EventTermBegun
	// EventTermEnded is the end of the term that an EventTermBegun of the
	// same Generation began: lead has returned and the lease was released
	// (or left held for a minimum hold, or found lost). TermEnd says why the
	// term ended, Duration how long it lasted, and Err is the error that
	// Lead returns (nil when the leader resigned).
	EventTermEnded
)

// TermEnd says why an Elector's term ended (Event.TermEnd). The causes
// are few and fixed, so that a metric may be labelled with them.
type TermEnd uint8

// The causes of a term's end.
const (
	// TermResigned: lead returned nil, and the lease was released (or held
	// for a minimum hold): the leader stepped down.
	TermResigned TermEnd = iota + 1
	// TermFailed: lead returned an error, or panicked, while its term went
	// on.
	TermFailed
	// TermCancelled: the context of Lead ended, and with it the term.
	TermCancelled
	// TermTakenOver: the lease was found taken over, or released by an
	// operator (admin.Operator.ForceRelease), by a heartbeat or by the
	// fenced commit after lead returned (gormlease.ErrLeaseLost).
	TermTakenOver
	// TermSelfFenced: no heartbeat confirmed the lease in time, and the
	// leader stopped trusting it (gormlease.WithSafetyMargin).
	TermSelfFenced
	// TermMaxHold: the term lasted gormlease.WithMaxHold
	// (gormlease.ErrMaxHoldExceeded).
	TermMaxHold
	// TermStopRequested: an operator asked the leader to stop
	// (admin.Operator.RequestStop; gormlease.ErrStopRequested).
	TermStopRequested
)

var termEndNames = [...]string{
	TermResigned:      "resigned",
	TermFailed:        "failed",
	TermCancelled:     "cancelled",
	TermTakenOver:     "taken_over",
	TermSelfFenced:    "self_fenced",
	TermMaxHold:       "max_hold",
	TermStopRequested: "stop_requested",
}

// String names the cause in lower case with underscores, as a metric's
// label would: "resigned", "failed", "cancelled", "taken_over",
// "self_fenced", "max_hold" or "stop_requested"; "unknown" for any
// other value.
func (c TermEnd) String() string {
	if int(c) < len(termEndNames) && termEndNames[c] != "" {
		return termEndNames[c]
	}
	return "unknown"
}

// Event is one outcome of a Runner's work.
type Event struct {
	// Kind says what the event reports, and which of the other fields
	// it sets.
	Kind EventKind
	// TargetID is the target of the Run; empty for EventHeartbeat, whose
	// statement may renew the leases of many targets. For the events of an
	// Elector (EventCampaign, EventTermBegun, EventTermEnded) it is the
	// role's name.
	TargetID string
	// Generation is the lease's generation, 0 when no lease was acquired.
	Generation int64
	// Holder is the Runner's holder name (gormlease.WithHolder).
	Holder string
	// Duration is how long the step took, the lease was held, the term
	// lasted, or the role was without a leader, by Kind (see each).
	Duration time.Duration
	// Leases is, for EventHeartbeat, the number of leases that the
	// statement renewed or tried to.
	Leases int
	// Err is, for EventAcquire and EventCommit, the step's outcome (see
	// there); for EventHeartbeat the statement's error; for
	// EventLeaseLost, EventSelfFenced, EventMaxHoldExceeded and
	// EventStopRequested the cause that the work's context reports; for
	// EventTermEnded the error that Lead returns. It is nil otherwise.
	Err error
	// TermEnd is, for EventTermEnded, why the term ended; 0 otherwise.
	TermEnd TermEnd
}
