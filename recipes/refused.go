package recipes

import (
	"errors"

	"github.com/gormlease/gormlease"
)

// refused reports whether err, from runner.Run, is Run's own refusal: the
// target was held, or paused (a *gormlease.PausedError matches
// ErrLeaseHeld too). The work's failure never is, even when it met a
// refusal of a lease of its own: Run returns a work's error as a
// *gormlease.WorkError, which hides that refusal, and a panic as a
// *gormlease.PanicError, whatever its value.
func refused(err error) bool {
	var panicked *gormlease.PanicError
	return errors.Is(err, gormlease.ErrLeaseHeld) && !errors.As(err, &panicked)
}
