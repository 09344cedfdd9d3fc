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
	// ErrLeaseHeld is returned by Runner.Run and the Repository's acquires
	// (Acquire, AcquireSlot), at once, when another holder's lease on the
	// target (on a semaphore, on every slot) is live: as a *HeldError, or
	// alone when the acquire lost a race for the row, or kept meeting
	// concurrent changes of it (WithStatementAttempts). A *PausedError
	// matches it too.
	ErrLeaseHeld = errors.New("gormlease: lease held by another holder")

	// ErrLeaseLost is returned by the Repository's steps on a Lease when its
	// row no longer carries its token (taken over, or released), and by
	// Runner.Run then: as the cause of the work's context too when a
	// heartbeat finds it so, or the lease could not be confirmed in time.
	// Nothing is saved then.
	ErrLeaseLost = errors.New("gormlease: lease lost")

	// ErrCommitUnknown is returned by the fenced commit (CommitIfOwner) when
	// its COMMIT is not known to be durable: no answer came, or a PostgreSQL
	// server cut short its wait for its synchronous standbys. Run (and so
	// RunWait and Do) returns it only when it cannot settle that itself:
	// check what was saved.
	ErrCommitUnknown = errors.New("gormlease: commit outcome unknown")

	// ErrNoLiveLease is returned by admin.Operator's ForceRelease and
	// RequestStop (and their Slot forms) when the target has no lease to act
	// on: it was never acquired, its row was pruned, or its lease is
	// released already. (ErrLeaseHeld is the opposite: an acquire found a
	// live lease.)
	ErrNoLiveLease = errors.New("gormlease: no live lease")

	// ErrMaxHoldExceeded is returned by Runner.Run, as the cause of the
	// work's context too, when the work outlasted WithMaxHold. Nothing is
	// saved. It does not match ErrLeaseLost: the Runner gave the lease up.
	ErrMaxHoldExceeded = errors.New("gormlease: max hold exceeded")

	// ErrSlotCountConflict is returned by the acquires of slots (WithSlots,
	// Repository.AcquireSlot) when a slot of the target is held under
	// another count. Nothing runs, and nothing is written.
	ErrSlotCountConflict = errors.New("gormlease: slots held under another count")

	// ErrPaused: the target is paused (admin.Operator.Pause). Run and the
	// Repository's acquires return a *PausedError at once; RunWait, Do and
	// Elector.Lead wait until Resume or the end of their context.
	ErrPaused = errors.New("gormlease: target paused")

	// ErrStopRequested: an operator asked the holder to stop
	// (admin.Operator.RequestStop). Runner.Run returns it, with the reason,
	// as the cause of the work's context too; nothing is saved. It does not
	// match ErrLeaseLost.
	ErrStopRequested = errors.New("gormlease: stop requested")

	// ErrMissingTables: a table (the lease table, its generation floor, the
	// result table) or a column that gormlease reads or writes does not
	// exist. Every step of a Runner, an Elector or a Repository (and of
	// admin.Operator) that meets one returns, at once and without retrying
	// or waiting, an error that wraps it, names the table (and the column)
	// when the database or the statement says which, and says how to make
	// them: create the tables with AutoMigrate, or run `gormlease migrate`.
	// Repository.CheckTables finds them all at startup. Only a table
	// dropped while a Run or a leader holds its lease is met otherwise:
	// the heartbeats that fail on it are tried again, each failure logged,
	// until the lease can no longer be trusted, and the work then ends
	// with ErrLeaseLost.
	ErrMissingTables = backend.ErrMissingTables

	// ErrInvalidArgument is wrapped by every error about bad input: a bad
	// target ID, a nil function or database, an option out of range or at
	// odds with another. Nothing was written then.
	ErrInvalidArgument = errors.New("gormlease: invalid argument")
)

// HeldError is the error of an acquire refused by a live lease: it matches
// ErrLeaseHeld, and describes the lease (with WithSlots, the slot that frees
// first) as the refusing statement saw it (or, where that statement
// cannot answer the lease, the read that follows it: on MySQL and SQLite,
// for AcquireFrom on MariaDB, and for slots), on the database's clock:
// HeldFor and RetryAfter cost no statement of their own. RunWait, Do and
// Elector.Lead wrap it with their context's error when that ends while
// they wait. An HTTP handler answers 409 Conflict with Retry-After:
// int(RetryAfter().Seconds()).
type HeldError struct {
	Target     string        // the target asked for
	Holder     string        // the live lease's holder (WithHolder)
	Generation int64         // the live lease's generation
	ExpiresIn  time.Duration // how long it lives without another heartbeat, on the database's clock
	// HeldFor is how long the lease has been held, since the acquire that
	// began its generation, on the database's clock; 0 when the row does
	// not record it (a row acquired before the acquired_at column existed).
	HeldFor time.Duration

	// minHold reports that the holder has ended its work and only a
	// minimum hold (WithMinHold) keeps the lease, for ExpiresIn.
	minHold bool
}

// RetryAfter is a wait to tell a client that was refused, derived from
// what the row records, in whole seconds: as long again as the holder has
// held the lease so far (HeldFor, rounded up), at least 1 s, and at most
// ExpiresIn rounded up (at least 1 s), which the lease cannot outlive
// without another heartbeat. Under a minimum hold (WithMinHold, Repository.Hold), which
// lasts exactly ExpiresIn, it is ExpiresIn rounded up. A job that usually
// takes seconds is so retried after seconds, not after the lease timeout,
// while its holder is alive and renewing it; a row that does not record
// HeldFor gives 1 s. The lease may still end sooner (released) or later
// (renewed again).
func (e *HeldError) RetryAfter() time.Duration {
	limit := max(e.ExpiresIn, time.Second)
	limit = (limit + time.Second - 1) / time.Second * time.Second
	if e.minHold {
		return limit
	}
	wait := (max(e.HeldFor, time.Second) + time.Second - 1) / time.Second * time.Second
	return min(wait, limit)
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
	return &HeldError{Target: targetID, Holder: h.Holder, Generation: h.Generation, ExpiresIn: h.ExpiresIn, HeldFor: h.HeldFor,
		minHold: h.MinHold}
}

// PausedError is the error of an acquire refused because its target is
// paused (admin.Operator.Pause): it matches ErrPaused and ErrLeaseHeld. Run and
// the Repository's acquires return it; RunWait, Do and Elector.Lead wrap it
// with their context's error when that ends while they wait for Resume.
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

// PanicError is returned by Runner.Run, RunWait and Do when the work, the
// saver or Do's load panics: they recover, release the lease as after any
// failure, and do not re-panic. Unwrap gives a panic value that is an error.
type PanicError struct {
	// Step names the function that panicked: "work", "save" or "load".
	Step string
	// Value is the value passed to panic.
	Value any
	// Stack is the panicking goroutine's stack, from runtime/debug.Stack.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string {
	return fmt.Sprintf("gormlease: %s panicked: %v", e.Step, e.Value)
}

// Unwrap returns the panic value when it is an error, and nil otherwise,
// with gormlease's outcomes in it hidden, as in a WorkError.
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
