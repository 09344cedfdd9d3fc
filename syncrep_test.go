package gormlease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Sync-rep tests run on a primary with a synchronous standby of their own
// (testdb.PgPair with sync) whose standby stops receiving WAL: from then on
// every commit on the primary commits locally, then waits for the standby
// for ever. That is the primary that a Patroni failover leaves running
// when its Patroni died (see TestPatroni_KillPatroni), made on purpose and
// at a known moment.

// cancelSyncRepWaits cancels, every 20 ms until stopped, every statement
// on the primary of db that waits for synchronous replication, as
// pg_cancel_backend (or a driver's cancel request) does: the server stops
// waiting and answers it as a success, with a WARNING. The function it
// returns stops it, and returns how many it cancelled; the test's end stops
// it too.
func cancelSyncRepWaits(t *testing.T, db *gorm.DB) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var n int64
	wg.Go(func() {
		for ctx.Err() == nil {
			var cancelled int64
			if db.WithContext(ctx).Raw(`WITH w AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep')
				SELECT count(*) FROM w WHERE pg_cancel_backend(pid)`).Scan(&cancelled).Error == nil {
				n += cancelled
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	stop = func() int64 {
		cancel()
		wg.Wait()
		return n
	}
	t.Cleanup(func() { stop() })
	return stop
}

// gatedRun starts a Run of target on r whose work returns once finish is
// closed, and waits until the work has started.
func gatedRun(t *testing.T, r *gormlease.Runner[string], target string, save func(*gorm.DB, string) error,
) (finish chan struct{}, done <-chan runResult[string]) {
	working := make(chan struct{})
	finish = make(chan struct{})
	done = goRun(t, context.Background(), r, target, func(context.Context) (string, error) {
		close(working)
		<-finish
		return "lost", nil
	}, save)
	recv(t, working, 10*time.Second, "the work to start")
	return finish, done
}

// rareHeartbeats are options under which no heartbeat is sent between the
// moment the standby stops and the fenced commit, which follows at once: a
// heartbeat would wait for the standby holding the lease row's lock, and
// the commit would wait for the row, not for the standby.
func rareHeartbeats(operationTimeout time.Duration) []gormlease.Option {
	return []gormlease.Option{gormlease.WithHeartbeatInterval(10 * time.Second),
		gormlease.WithLeaseTimeout(60 * time.Second), gormlease.WithOperationTimeout(operationTimeout)}
}

// TestSyncRep_CancelledCommitIsNotSuccess cancels the fenced COMMIT of a
// Run while it waits for a synchronous standby that no longer receives:
// the server commits it locally and answers success with a warning. Run
// must not return nil, since the standby, which a failover promotes, does
// not have the save: it returns ErrCommitUnknown (nothing that the standby
// confirms can settle it), and the promoted standby has no save.
func TestSyncRep_CancelledCommitIsNotSuccess(t *testing.T) {
	t.Parallel()
	cancelledCommit(t)
}

// TestSyncRep_CancelledMinHoldCommitIsNotSuccess is
// TestSyncRep_CancelledCommitIsNotSuccess for a Run under a minimum hold,
// whose fenced commit saves without releasing (CommitIfOwner's).
func TestSyncRep_CancelledMinHoldCommitIsNotSuccess(t *testing.T) {
	t.Parallel()
	cancelledCommit(t, gormlease.WithMinHold(time.Minute))
}

// cancelledCommit is TestSyncRep_CancelledCommitIsNotSuccess on a Runner
// with opts too.
func cancelledCommit(t *testing.T, opts ...gormlease.Option) {
	pair := testdb.NewPgPair(t, true)
	db := pair.Open(t)
	sv := newSaves(t, db)
	r := newRunner(t, db, append(rareHeartbeats(2*time.Second), opts...)...)
	target := newTarget(t)
	finish, done := gatedRun(t, r, target, sv.save)
	ctl := pair.Primary().Open(t) // before the standby stops: opening it migrates, which writes
	pair.WaitReplayed(t)
	pair.DetachStandby(t)
	cancelled := cancelSyncRepWaits(t, ctl)
	close(finish)
	res := recv(t, done, 20*time.Second, "the Run whose COMMIT was cancelled")
	require.Greater(t, cancelled(), int64(0), "no statement waited for the standby")
	require.Error(t, res.Err, "Run returned nil for a commit that the synchronous standby never confirmed")
	assert.ErrorIs(t, res.Err, gormlease.ErrCommitUnknown)
	t.Logf("Run: %v", res.Err)

	pair.Failover(t)
	assert.EqualValues(t, 0, sv.count(t, pair.Primary().Open(t), target), "the promoted standby has the save")
}

// TestSyncRep_CancelledHeartbeatIsNotRenewal holds a lease while its
// heartbeats wait for a synchronous standby that no longer receives, and
// cancels each of them: the server answers each as a success, with a
// warning, though the standby has none of them. The holder must not count
// them: it self-fences within its trust window after the last heartbeat
// the standby confirmed, as if the database did not answer at all.
func TestSyncRep_CancelledHeartbeatIsNotRenewal(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, true)
	db := pair.Open(t)
	const lease, margin = 3 * time.Second, 300 * time.Millisecond
	r := newRunner(t, db, gormlease.WithHeartbeatInterval(100*time.Millisecond),
		gormlease.WithLeaseTimeout(lease), gormlease.WithSafetyMargin(margin),
		gormlease.WithOperationTimeout(time.Second))
	trust := lease - margin
	working := make(chan struct{})
	fenced := make(chan time.Time, 1)
	done := goRun(t, context.Background(), r, newTarget(t), func(ctx context.Context) (string, error) {
		close(working)
		<-ctx.Done()
		fenced <- time.Now()
		return "", context.Cause(ctx)
	}, noSave(t))
	recv(t, working, 10*time.Second, "the work to start")
	ctl := pair.Primary().Open(t) // before the standby stops: opening it migrates, which writes
	pair.WaitReplayed(t)
	pair.DetachStandby(t)
	detached := time.Now() // after the last heartbeat that the standby confirmed was sent
	cancelled := cancelSyncRepWaits(t, ctl)
	// Loaded machines delay the fence's timer and the work's wake-up; 3 s
	// more is still far less than the time a renewed lease would run on.
	at := recv(t, fenced, trust+3*time.Second, "the holder to self-fence")
	res := recv(t, done, 10*time.Second, "the Run")
	waits := cancelled()
	assert.ErrorIs(t, res.Err, gormlease.ErrLeaseLost)
	assert.Less(t, at.Sub(detached), trust+3*time.Second)
	assert.Greater(t, waits, int64(0), "no heartbeat waited for the standby")
	t.Logf("self-fenced %v after the standby stopped (trust window %v); %d waits cancelled meanwhile",
		at.Sub(detached).Round(time.Millisecond), trust, waits)
}

// TestSyncRep_SettleOnIsolatedPrimary lets a Run's fenced COMMIT wait for a
// synchronous standby that no longer receives until the operation timeout
// ends it; pgx then closes the connection with a cancel request, and the
// primary commits locally. Settling that commit by reading the row on the
// same primary would find the save and return nil, though the standby,
// which a failover promotes, lacks it. Run returns ErrCommitUnknown, and
// the promoted standby has no save.
func TestSyncRep_SettleOnIsolatedPrimary(t *testing.T) {
	t.Parallel()
	pair := testdb.NewPgPair(t, true)
	db := pair.Open(t)
	sv := newSaves(t, db)
	r := newRunner(t, db, rareHeartbeats(time.Second)...)
	target := newTarget(t)
	finish, done := gatedRun(t, r, target, sv.save)
	pair.WaitReplayed(t)
	pair.DetachStandby(t)
	close(finish)
	res := recv(t, done, 20*time.Second, "the Run whose COMMIT timed out")
	require.Error(t, res.Err, "Run returned nil for a commit that the synchronous standby never confirmed")
	assert.True(t, errors.Is(res.Err, gormlease.ErrCommitUnknown), "Run: %v", res.Err)
	t.Logf("Run: %v", res.Err)

	pair.Failover(t)
	assert.EqualValues(t, 0, sv.count(t, pair.Primary().Open(t), target), "the promoted standby has the save")
}
