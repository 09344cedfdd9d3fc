package gormlease

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
)

// Sentinel errors. Match them with errors.Is: the errors that gormlease
// returns wrap them with the target ID and the step that failed.
var (
	// ErrLeaseHeld is returned by Repository.Acquire and Runner.Run when
	// another holder's lease on the target is live: it was acquired or
	// renewed within the lease timeout and has not been released. Run returns
	// it at once, without waiting for the holder and without running the work.
	// The error is then a *HeldError, which says who holds the lease, at
	// which generation and for how long. They also return ErrLeaseHeld,
	// without a HeldError, when the acquire met a concurrent change of the
	// target's row (a serialization failure or deadlock) at every attempt:
	// another session was taking, renewing or releasing the lease.
	ErrLeaseHeld = errors.New("gormlease: lease held by another holder")

	// ErrLeaseLost is returned by Repository.Heartbeat, Hold, CommitIfOwner,
	// CommitAndRelease, Release and ReleaseFailed when the lease row no
	// longer carries the caller's token: it was taken over, or already
	// released. Runner.Run returns it, and reports it
	// as the context.Cause of the work's context, when a heartbeat finds the
	// lease taken or when the lease could not be confirmed in time (see the
	// package documentation on self-fencing). Nothing is saved then.
	ErrLeaseLost = errors.New("gormlease: lease lost")

	// ErrCommitUnknown is returned by Repository.CommitIfOwner and
	// CommitAndRelease when the fenced commit's COMMIT was sent but its
	// outcome is not known to be durable, in three cases: the connection
	// failed (or the server ended it) while COMMIT was in flight, so that no
	// answer came; the server committed locally but cut short its wait for
	// the synchronous standbys (on PostgreSQL with synchronous replication,
	// when another party cancelled the wait), so that a failover may lose
	// the commit; or the caller's context ended while COMMIT was in flight.
	// The database may or may not have saved the result. Runner.Run first
	// settles the question itself (see Run) and returns ErrCommitUnknown
	// only when it cannot; then look at what was saved (LoadJSON, for
	// instance) before running the work again.
	ErrCommitUnknown = errors.New("gormlease: commit outcome unknown")

	// ErrNoLiveLease is returned by Repository.ForceRelease when the
	// target has no live lease to end: it was never acquired, its row was
	// pruned, or its lease is released already. (ErrLeaseHeld is the
	// opposite: an acquire found a live lease.)
	ErrNoLiveLease = errors.New("gormlease: no live lease")

	// ErrNotHeld is ErrNoLiveLease under its former name.
	//
	// Deprecated: use ErrNoLiveLease, whose name cannot be read as
	// ErrLeaseHeld's.
	ErrNotHeld = ErrNoLiveLease

	// ErrMaxHoldExceeded is returned by Runner.Run, and reported as the
	// context.Cause of the work's context, when the work was still running
	// when the Runner's WithMaxHold ran out. Nothing is saved then, and the
	// lease is released once the work returns (with WithMinHold, held to the
	// hold's end first). It does not match
	// ErrLeaseLost: the lease was not taken from the Runner, which gave it up.
	ErrMaxHoldExceeded = errors.New("gormlease: max hold exceeded")

	// ErrSlotCountConflict is returned by Repository.AcquireSlot, and by
	// Run and RunWait of a Runner with WithSlots(n), when a slot of the
	// target is held under another count than n: the count is recorded in
	// the target's slot rows, and the holders that live under it keep it
	// until none is left. The work does not run, and nothing is written.
	ErrSlotCountConflict = errors.New("gormlease: slots held under another count")

	// ErrPaused: the target is paused (Repository.Pause). Run, Acquire,
	// AcquireFrom and AcquireSlot return an error wrapping it, a
	// *PausedError, at once, without running the work; RunWait, Do and
	// Elector.Lead wait instead, until Resume or the end of their context.
	// An error that wraps it also matches ErrLeaseHeld, so code written for
	// "someone else is on it" still does the right thing.
	ErrPaused = errors.New("gormlease: target paused")

	// ErrStopRequested: an operator asked the holder to stop
	// (Repository.RequestStop). Runner.Run returns an error wrapping it,
	// with the request's reason, and reports it as the context.Cause of the
	// work's context; nothing is saved, and the lease is released. It does
	// not match ErrLeaseLost: the lease was given up, not taken.
	ErrStopRequested = errors.New("gormlease: stop requested")

	// ErrInvalidArgument is wrapped by every error about bad input: an empty,
	// oversized or unstorable target ID, a nil function or database, or an
	// option value that is out of range or contradicts another. Nothing is
	// written to the database when it is returned.
	ErrInvalidArgument = errors.New("gormlease: invalid argument")
)

// HeldError is the error of an acquire refused by a live lease. errors.Is(err, ErrLeaseHeld)
// is true; errors.As gives the lease as the refusing statement saw it.
//
// Repository.Acquire, AcquireFrom and AcquireSlot, and Runner.Run, return
// it; RunWait, Do and Elector.Lead return it, wrapped with the context's
// error, when their context ends while they wait, describing the lease as
// they last read it. With WithSlots(n) it describes the slot that frees
// first. The statements that refuse the acquire read it on the database,
// without a round trip of their own (see Repository.Acquire). An acquire
// refused without seeing the lease that refused it returns an error that
// wraps ErrLeaseHeld but is not a HeldError: one that lost a race for the
// row to another acquire that took it while its statement ran, one that
// kept meeting concurrent changes of the row (see ErrLeaseHeld), and an
// AcquireFrom whose generation ended and whose row is free at a later one.
//
// An HTTP handler can answer 409 Conflict with a Retry-After of ExpiresIn,
// rounded up to a second: the lease may end sooner (its holder releases
// it) or later (its holder renews it).
type HeldError struct {
	Target     string        // the target asked for
	Holder     string        // the live lease's holder (WithHolder)
	Generation int64         // the live lease's generation
	ExpiresIn  time.Duration // how long it lives without another heartbeat, on the database's clock
}

// Error says which target is held, by whom, at which generation, and for
// how long without another heartbeat.
func (e *HeldError) Error() string {
	holder := ""
	if e.Holder != "" {
		holder = fmt.Sprintf(" by %q", e.Holder)
	}
	left := e.ExpiresIn
	if left >= time.Millisecond {
		left = left.Round(time.Millisecond)
	}
	return fmt.Sprintf("gormlease: lease on %q held%s (generation %d), expires in %v", e.Target, holder, e.Generation, left)
}

// Unwrap returns ErrLeaseHeld.
func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

// newHeldError is the HeldError of an acquire of targetID refused by h.
func newHeldError(targetID string, h *backend.Held) *HeldError {
	return &HeldError{Target: targetID, Holder: h.Holder, Generation: h.Generation, ExpiresIn: h.ExpiresIn}
}

// PausedError is the error of an acquire refused because its target is
// paused (Repository.Pause): errors.Is(err, ErrPaused) and
// errors.Is(err, ErrLeaseHeld) are both true. Repository.Acquire,
// AcquireFrom and AcquireSlot, and Runner.Run, return it; RunWait, Do and
// Elector.Lead return it, wrapped with the context's error, when their
// context ends while they wait for the target to be resumed.
type PausedError struct {
	Target string // the target asked for
	Reason string // the reason that Pause recorded
}

// Error says which target is paused, and why.
func (e *PausedError) Error() string {
	return fmt.Sprintf("gormlease: target %q paused: %s", e.Target, e.Reason)
}

// Unwrap returns ErrPaused and ErrLeaseHeld.
func (e *PausedError) Unwrap() []error { return []error{ErrPaused, ErrLeaseHeld} }

// stopRequestedError is the cause of the work's context, and Run's error,
// when an operator asked the holder to stop: it wraps ErrStopRequested and
// says why.
type stopRequestedError struct {
	target string
	reason string
}

func (e *stopRequestedError) Error() string {
	return fmt.Sprintf("gormlease: run %q: stop requested: %s", e.target, e.reason)
}

func (e *stopRequestedError) Unwrap() error { return ErrStopRequested }

// stoppedWaitingError is the error of a wait for a held lease that ended
// with its context: it wraps both the context's error and the refusal, a
// *HeldError when the wait read the lease.
type stoppedWaitingError struct{ cause, held error }

func (e *stoppedWaitingError) Error() string {
	return "stopped waiting: " + e.cause.Error() + ": " + unprefixed(e.held)
}

func (e *stoppedWaitingError) Unwrap() []error { return []error{e.cause, e.held} }

// prefix starts every message of gormlease's errors, once.
const prefix = "gormlease: "

// invalidf returns an error that wraps ErrInvalidArgument and says what is wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// stepError is the error of a step: it reads "gormlease: <step>: <cause>",
// with the cause's own "gormlease: " dropped, so that the prefix reads once
// however deep the wrapping.
type stepError struct {
	step  string
	cause error
}

// wrapf returns cause wrapped as a stepError, the step written by format.
func wrapf(cause error, format string, args ...any) error {
	return &stepError{step: fmt.Sprintf(format, args...), cause: cause}
}

func (e *stepError) Error() string { return prefix + e.step + ": " + unprefixed(e.cause) }

func (e *stepError) Unwrap() error { return e.cause }

// unprefixed returns err's message without its leading "gormlease: ".
func unprefixed(err error) string { return strings.TrimPrefix(err.Error(), prefix) }

// saveFailed wraps err, returned by the saver of l's fenced commit: in a
// *WorkError, or, for a panic, in the commit's step.
func saveFailed(l Lease, err error) error {
	if _, panicked := err.(*PanicError); panicked {
		return wrapf(err, "commit %q", l.TargetID) // the panic says "save panicked"
	}
	return &WorkError{Step: "save", Target: l.TargetID, Generation: l.Generation, Err: err}
}

// cleanupError is an error after which cleaning up (releasing the lease)
// failed too: it reads "<err>; then <cleanup>", and errors.Is and errors.As
// see both.
type cleanupError struct{ err, cleanup error }

func (e *cleanupError) Error() string { return e.err.Error() + "; then " + unprefixed(e.cleanup) }

func (e *cleanupError) Unwrap() []error { return []error{e.err, e.cleanup} }

// commitUnknownError is an error from the fenced commit's COMMIT that the
// database did not answer: it wraps both ErrCommitUnknown and the cause.
type commitUnknownError struct {
	targetID string
	cause    error
}

func (e *commitUnknownError) Error() string {
	return fmt.Sprintf("gormlease: commit %q: outcome unknown, the result may have been saved: %v", e.targetID, e.cause)
}

func (e *commitUnknownError) Unwrap() []error { return []error{ErrCommitUnknown, e.cause} }

// PanicError is returned by Runner.Run, RunWait and Do when the work or the
// saver panics, and by Do when its load panics. They recover the panic,
// release the lease they hold (a saver's transaction is rolled back first;
// with WithMinHold the lease stays held to the hold's end) and return a
// *PanicError; they do not re-panic. Use errors.As to get at the value and
// the stack. When the panic value is an error, errors.Is and errors.As see
// through to it, but not to gormlease's outcomes in it (see Unwrap).
type PanicError struct {
	// Step names the function that panicked, and is one of:
	//   - "work": the work function of Run, RunWait or Do;
	//   - "save": the saver, inside the fenced commit;
	//   - "load": the load function of Do, which reads a shared result.
	Step string
	// Value is the value passed to panic.
	Value any
	// Stack is the stack of the panicking goroutine, as runtime/debug.Stack
	// printed it.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string {
	return fmt.Sprintf("gormlease: %s panicked: %v", e.Step, e.Value)
}

// Unwrap returns the panic value when it is an error, and nil otherwise;
// gormlease's outcomes in it are hidden from errors.Is and errors.As, as in
// a WorkError's: a panic with a refusal that the work met is not the
// call's refusal.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return hideOutcomes(err)
}

// errWorkExited is the reason logged for the release of a lease whose work
// or saver called runtime.Goexit: Run never returns to its caller then.
var errWorkExited = errors.New("gormlease: work or save called runtime.Goexit")

// unwrapStep returns the cause of err when err is a step's error, so that
// it is not prefixed twice.
func unwrapStep(err error) error {
	var s *stepError
	if errors.As(err, &s) {
		return s.cause
	}
	return err
}
