package gormlease

import (
	"fmt"
	"reflect"
	"slices"
)

// WorkError is the error of a call whose own lease was acquired and whose
// work or saver then returned an error (Run, RunWait, Do, and CommitIfOwner
// for its fn): the work ran. errors.Is and errors.As see through it to Err,
// except to gormlease's outcomes (ErrLeaseHeld, ErrLeaseLost, ..., and
// *HeldError, *PausedError, *SharedJobError, *PanicError), which always
// describe the call that returned them: a work that calls Run on another
// target and returns its refusal makes its own call fail, not look refused.
// ErrInvalidArgument stays visible.
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
	if e.Err == nil {
		return fmt.Sprintf("%s%s %q: failed", prefix, e.Step, e.Target)
	}
	return fmt.Sprintf("%s%s %q: %s", prefix, e.Step, e.Target, unprefixed(e.Err))
}

// Unwrap returns Err, with gormlease's outcomes in its chain hidden from
// errors.Is and errors.As (see WorkError).
func (e *WorkError) Unwrap() error { return hideOutcomes(e.Err) }

// hideOutcomes returns err as a metError, or nil for nil.
func hideOutcomes(err error) error {
	if err == nil {
		return nil
	}
	return metError{err}
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

// metError is one link of a work's error chain: errors.Is and errors.As
// see the link and the links below it as they are, except gormlease's
// outcomes and what they wrap, which they do not see at all, even when a
// link's own Is or As method would name them.
type metError struct{ err error }

func (m metError) Error() string { return m.err.Error() }

// Is reports whether the link is target, or says it is, for a target that
// is not one of gormlease's outcomes.
func (m metError) Is(target error) bool {
	if isOwnError(m.err) || isOwnError(target) {
		return false
	}
	if t := reflect.TypeOf(target); t != nil && t.Comparable() && m.err == target {
		return true
	}
	x, ok := m.err.(interface{ Is(error) bool })
	return ok && x.Is(target)
}

// As sets *target to the link when it can hold it, or when the link's own
// As method does so, as errors.As would, for a target that cannot hold one
// of gormlease's outcomes.
func (m metError) As(target any) bool {
	switch target.(type) {
	case **HeldError, **PausedError, **SharedJobError, **PanicError:
		return false
	}
	if isOwnError(m.err) {
		return false
	}
	v := reflect.ValueOf(target)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return false
	}
	if reflect.TypeOf(m.err).AssignableTo(v.Elem().Type()) {
		v.Elem().Set(reflect.ValueOf(m.err))
		return true
	}
	x, ok := m.err.(interface{ As(any) bool })
	return ok && x.As(target)
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
