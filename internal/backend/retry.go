package backend

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the pause between two attempts of a step: it starts at a first
// pause and doubles after each wait, up to a ceiling. Each wait is jittered
// (between half and one and a half times the pause), so that sessions that
// failed together do not try again together.
type Backoff struct {
	Pause, Max time.Duration
}

// Wait waits out the current pause, then doubles it, up to the ceiling. It
// reports false, having returned early, when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Pause/2 + rand.N(b.Pause+1))
	defer t.Stop()
	b.Pause = min(2*b.Pause, b.Max)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// StatementBackoff is the pause between attempts of a statement that failed
// with a serialization failure, or whose outcome is checked and sent again:
// 2ms at first, up to 100ms.
func StatementBackoff() Backoff {
	return Backoff{Pause: 2 * time.Millisecond, Max: 100 * time.Millisecond}
}

// ReconnectBackoff is the pause between attempts to reach a database that
// could not be reached (a failover, a restart): 20ms at first, up to 500ms.
func ReconnectBackoff() Backoff {
	return Backoff{Pause: 20 * time.Millisecond, Max: 500 * time.Millisecond}
}

// StatementAttempts is how often a statement that fails with a
// serialization failure is tried in all.
const StatementAttempts = 5

// Retry runs stmt, a single statement in a transaction of its own, again
// while it fails with a serialization failure, up to attempts times in all
// and while ctx lasts, and returns its last error. stmt's context is marked
// by MarkRetried. Re-running such a statement after its rollback is the
// same as running it for the first time.
func Retry(ctx context.Context, attempts int, stmt func(ctx context.Context) error) error {
	ctx = MarkRetried(ctx)
	b := StatementBackoff()
	for attempt := 1; ; attempt++ {
		err := stmt(ctx)
		if err == nil || attempt >= attempts || !IsSerializationFailure(err) || !b.Wait(ctx) {
			return err
		}
	}
}
