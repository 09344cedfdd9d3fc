package gormlease

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with errors.Is: the errors that gormlease
// returns wrap them with the target ID and the step that failed.
var (
	// ErrLeaseHeld is returned by Repository.Acquire and Runner.Run when
	// another holder's lease on the target is live: it was acquired or
	// renewed within the lease timeout and has not been released. Run returns
	// it at once, without waiting for the holder and without running the work.
	// They also return it when the acquire met a concurrent change of the
	// target's row (a serialization failure or deadlock) at every attempt:
	// another session was taking, renewing or releasing the lease.
	ErrLeaseHeld = errors.New("gormlease: lease held by another holder")

	// ErrLeaseLost is returned by Repository.Heartbeat, CommitIfOwner and
	// Release when the lease row no longer carries the caller's token: it was
	// taken over, or already released. Runner.Run returns it, and reports it
	// as the context.Cause of the work's context, when a heartbeat finds the
	// lease taken or when the lease could not be confirmed in time (see the
	// package documentation on self-fencing). Nothing is saved then.
	ErrLeaseLost = errors.New("gormlease: lease lost")

	// ErrCommitUnknown is returned by Repository.CommitIfOwner when the
	// connection failed while the fenced commit's COMMIT was in flight: the
	// database may or may not have saved the result. Runner.Run first settles
	// the question itself (see Run) and returns ErrCommitUnknown only when it
	// cannot; then look at what was saved (LoadJSON, for instance) before
	// running the work again.
	ErrCommitUnknown = errors.New("gormlease: commit outcome unknown")

	// ErrNotHeld is returned by Repository.ForceRelease when the target
	// has no lease to end: it was never acquired, its row was pruned, or
	// its lease is released already.
	ErrNotHeld = errors.New("gormlease: no lease held")

	// ErrMaxHoldExceeded is returned by Runner.Run, and reported as the
	// context.Cause of the work's context, when the work was still running
	// when the Runner's WithMaxHold ran out. Nothing is saved then, and the
	// lease is released once the work returns. It does not match
	// ErrLeaseLost: the lease was not taken from the Runner, which gave it up.
	ErrMaxHoldExceeded = errors.New("gormlease: max hold exceeded")

	// ErrSlotCountConflict is returned by Repository.AcquireSlot, and by
	// Run and RunWait of a Runner with WithSlots(n), when a slot of the
	// target is held under another count than n: the count is recorded in
	// the target's slot rows, and the holders that live under it keep it
	// until none is left. The work does not run, and nothing is written.
	ErrSlotCountConflict = errors.New("gormlease: slots held under another count")

	// ErrInvalidArgument is wrapped by every error about bad input: an empty,
	// oversized or unstorable target ID, a nil function or database, or an
	// option value that is out of range or contradicts another. Nothing is
	// written to the database when it is returned.
	ErrInvalidArgument = errors.New("gormlease: invalid argument")
)

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

// saveFailed wraps err, returned by the saver of l's fenced commit.
func saveFailed(l Lease, err error) error {
	if _, panicked := err.(*PanicError); panicked {
		return wrapf(err, "commit %q", l.TargetID) // the panic says "save panicked"
	}
	return wrapf(err, "save %q", l.TargetID)
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
// release the lease they hold (a saver's transaction is rolled back first)
// and return a *PanicError; they do not re-panic. Use errors.As to get at the value and
// the stack. When the panic value is an error, errors.Is and errors.As see
// through to it.
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

// Unwrap returns the panic value when it is an error, and nil otherwise.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
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
