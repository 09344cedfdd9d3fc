package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: the database is unreachable (blackholed) past the lease timeout,
// another holder takes over, and then the network comes back while the old
// work, which ignores its context, still returns a result. The old Run is
// fenced off before the takeover could happen, saves nothing, leaves the new
// holder's lease alone, and its runner works again afterwards. This extends
// TestRun_SelfFencesWhenDatabaseUnreachable to work that ignores its context
// and to a network that comes back before the old Run ends.
func TestFault_UnreachableThenBack(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	const timeout = 1500 * time.Millisecond
	// The safety margin is the time the work has to notice the cancellation
	// before the lease can be taken over; here, that includes this test's
	// own check, on a loaded machine.
	r := newRunner(t, s.OpenVia(t, proxy.Addr()),
		gormlease.WithHeartbeatInterval(100*time.Millisecond),
		gormlease.WithLeaseTimeout(timeout),
		gormlease.WithSafetyMargin(700*time.Millisecond),
		gormlease.WithOperationTimeout(300*time.Millisecond))
	other := newRepository(t, direct)
	target := newTarget(t)

	var fencedEarly error
	var newLease gormlease.Lease
	_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		proxy.Blackhole()
		<-ctx.Done()
		_, fencedEarly = other.Acquire(context.Background(), target, timeout)
		waitFor(t, 5*time.Second, "the takeover", func() bool {
			l, err := other.Acquire(context.Background(), target, timeout)
			newLease = l
			return err == nil
		})
		proxy.Restore()
		return "stale result", nil // ignores the cancellation
	}, noSave(t))
	require.ErrorIs(t, err, gormlease.ErrLeaseLost)
	require.ErrorIs(t, fencedEarly, gormlease.ErrLeaseHeld, "the work still ran when the lease could be taken over")
	row := leaseRow(t, direct, target)
	assert.Equal(t, newLease.Token, row.LeaseToken, "the new holder's token changed")
	assert.Nil(t, row.ReleasedAt, "the old Run released the new holder's lease")
	assert.Zero(t, countRows(t, direct, &gormlease.JobResult{}, target), "results saved")

	// The runner recovers: with the short operation timeout, the first
	// connections through the proxy may take too long on a loaded machine.
	waitFor(t, 10*time.Second, "a Run to succeed after the database came back", func() bool {
		_, err := r.Run(context.Background(), newTarget(t), func(context.Context) (string, error) {
			return "back", nil
		}, gormlease.SaveJSON[string])
		return err == nil
	})
}

// Fault: an outage shorter than the trust window (lease timeout minus safety
// margin). Heartbeats fail for a while, then succeed again before the fence;
// the work is never cancelled and saves once.
func TestFault_ShortOutageRidesThrough(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	r := newRunner(t, s.OpenVia(t, proxy.Addr()),
		gormlease.WithHeartbeatInterval(100*time.Millisecond),
		gormlease.WithLeaseTimeout(6*time.Second),
		gormlease.WithOperationTimeout(time.Second))
	target := newTarget(t)
	_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		before := leaseRow(t, direct, target).UpdatedAt
		proxy.Blackhole()
		select {
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-time.After(700 * time.Millisecond): // several heartbeats fail
		}
		proxy.Cut()
		proxy.Restore()
		waitFor(t, 3*time.Second, "a heartbeat after the outage", func() bool {
			return leaseRow(t, direct, target).UpdatedAt.After(before)
		})
		return "done", context.Cause(ctx)
	}, func(tx *gorm.DB, v string) error { return gormlease.SaveJSON(tx, v) })
	require.NoError(t, err)
	assert.EqualValues(t, 1, countRows(t, direct, &gormlease.JobResult{}, target))
}
