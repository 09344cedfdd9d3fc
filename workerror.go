package gormlease

import (
	"fmt"
	"reflect"
	"slices"
)

// WorkError is the error of a call whose own lease was acquired and whose
// work or saver then failed: Run, RunWait and Do return it when work
// returned an error, and they and Repository.CommitIfOwner and
// CommitAndRelease when the saver did. Its presence means the work ran;
// a refusal (ErrLeaseHeld, ErrPaused) never comes as one.
//
// errors.Is and errors.As see through it to Err and to what Err wraps,
// except gormlease's outcomes: the sentinels of refusals and of leases'
// ends (ErrLeaseHeld, ErrPaused, ErrLeaseLost, ErrStopRequested, ...) and
// the error types *HeldError, *PausedError, *SharedJobError and
// *PanicError. Those always describe the call that returned them, never a
// lease that the work met inside. ErrInvalidArgument stays visible: bad
// input (a result that SaveJSON cannot store, say) is bad input wherever
// it was found. A work that calls
// Run on another target, is refused, and returns that refusal makes its
// own call return a *WorkError that matches neither ErrLeaseHeld nor
// *HeldError, so that a caller (RunWait, Do, an error switch) does not take
// the work's failure for its own refusal. The work's error, as it was
// returned, is Err.
type WorkError struct {
	// Step is "work" when the work function failed, "save" when the saver did.
	Step string
	// Target is the target of the lease that the work ran under.
	Target string
	// Generation is the generation of that lease.
	Generation int64
	// Err is the error that the work or the saver returned.
	Err error
}

// Error reads "gormlease: <step> <target>: <Err>".
func (e *WorkError) Error() string {
	return fmt.Sprintf("%s%s %q: %s", prefix, e.Step, e.Target, unprefixed(e.Err))
}

// Unwrap returns Err, with gormlease's outcomes in its chain hidden from
// errors.Is and errors.As (see WorkError).
func (e *WorkError) Unwrap() error {
	if !holdsOwnError(e.Err) {
		return e.Err
	}
	return metError{e.Err}
}

// ownSentinels are gormlease's sentinels of outcomes: in a work's error,
// they describe a lease that the work met, not the call's own.
var ownSentinels = []error{
	ErrLeaseHeld, ErrLeaseLost, ErrCommitUnknown, ErrNoLiveLease, ErrMaxHoldExceeded,
	ErrSlotCountConflict, ErrPaused, ErrStopRequested, ErrSharedJobFailed,
}

// isOwnError reports whether err, one link of a chain, is one of
// gormlease's outcomes: a sentinel of ownSentinels, or an error type.
func isOwnError(err error) bool {
	switch err.(type) {
	case *HeldError, *PausedError, *SharedJobError, *PanicError:
		return true
	}
	return slices.Contains(ownSentinels, err)
}

// holdsOwnError reports whether err's chain holds one of gormlease's
// outcomes.
func holdsOwnError(err error) bool {
	if err == nil {
		return false
	}
	if isOwnError(err) {
		return true
	}
	switch x := err.(type) {
	case interface{ Unwrap() error }:
		return holdsOwnError(x.Unwrap())
	case interface{ Unwrap() []error }:
		return slices.ContainsFunc(x.Unwrap(), holdsOwnError)
	}
	return false
}

// metError is one link of a work's error chain that holds gormlease's
// outcomes: errors.Is and errors.As see the link and the links below it as
// they are, except those outcomes, and what they wrap, which they do not
// see at all.
type metError struct{ err error }

func (m metError) Error() string { return m.err.Error() }

// Is reports whether the link is target, or says it is.
func (m metError) Is(target error) bool {
	if isOwnError(m.err) {
		return false
	}
	if t := reflect.TypeOf(target); t != nil && t.Comparable() && m.err == target {
		return true
	}
	x, ok := m.err.(interface{ Is(error) bool })
	return ok && x.Is(target)
}

// As sets *target to the link when it can hold it, as errors.As would.
func (m metError) As(target any) bool {
	if isOwnError(m.err) {
		return false
	}
	if x, ok := m.err.(interface{ As(any) bool }); ok && x.As(target) {
		return true
	}
	v := reflect.ValueOf(target)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return false
	}
	if reflect.TypeOf(m.err).AssignableTo(v.Elem().Type()) {
		v.Elem().Set(reflect.ValueOf(m.err))
		return true
	}
	return false
}

// Unwrap returns the links below, each seen as a metError.
func (m metError) Unwrap() []error {
	if isOwnError(m.err) {
		return nil
	}
	var below []error
	switch x := m.err.(type) {
	case interface{ Unwrap() error }:
		below = []error{x.Unwrap()}
	case interface{ Unwrap() []error }:
		below = x.Unwrap()
	}
	var out []error
	for _, err := range below {
		if err != nil {
			out = append(out, metError{err})
		}
	}
	return out
}
