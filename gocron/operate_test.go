package gormleasegocron_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	gormleasegocron "github.com/gormlease/gormlease/gocron"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// warnings is a slog.Handler that keeps the messages logged at Warn and
// above, but for the warnings of slow statements, which a loaded machine
// produces: what an operator's pause or stop must not produce.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (h *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnings) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *warnings) WithGroup(string) slog.Handler            { return h }
func (h *warnings) Handle(_ context.Context, r slog.Record) error {
	// A slow statement is the machine's load, not the pause's doing.
	if r.Level >= slog.LevelWarn && !strings.HasPrefix(r.Message, "gormlease: slow ") {
		h.mu.Lock()
		h.msgs = append(h.msgs, r.Message)
		h.mu.Unlock()
	}
	return nil
}

func (h *warnings) logged() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

func newRepository(t *testing.T, db *gorm.DB) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db)
	require.NoError(t, err)
	return repo
}

// A paused job's ticks are skipped: the Locker's Lock is refused with
// ErrPaused (gocron counts the tick as skipped, and runs nothing), nothing
// is logged at Warn or above, and the job runs again once resumed.
func TestLocker_PausedJobTicksAreSkipped(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		logs := &warnings{}
		l, key := newLocker(t, db, gormlease.WithLogger(slog.New(logs))), newKey(t)
		repo := newRepository(t, db)
		require.NoError(t, admin.New(repo).Pause(context.Background(), key, "maintenance"))

		sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
		require.NoError(t, err)
		refused := make(chan error, 100)
		ran := make(chan struct{}, 100)
		var runs atomic.Int64
		_, err = sched.NewJob(gocron.DurationJob(50*time.Millisecond),
			gocron.NewTask(func() { runs.Add(1); ran <- struct{}{} }),
			gocron.WithName(key),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				select {
				case refused <- err:
				default:
				}
			})))
		require.NoError(t, err)
		sched.Start()
		defer func() { require.NoError(t, sched.Shutdown()) }()

		for range 3 {
			select {
			case err := <-refused:
				require.ErrorIs(t, err, gormlease.ErrPaused)
			case <-time.After(20 * time.Second):
				t.Fatal("no tick was refused")
			}
		}
		assert.Zero(t, runs.Load(), "a paused job ran")
		require.NoError(t, admin.New(repo).Resume(context.Background(), key))
		select {
		case <-ran:
		case <-time.After(20 * time.Second):
			t.Fatal("the resumed job did not run")
		}
		assert.Empty(t, logs.logged(), "a paused job's ticks were logged as a fault")
	})
}

// A RequestStop of a Lock's lease ends its run's lease at the next
// heartbeat: Unlock reports ErrStopRequested, not a loss, and the lease
// is released.
func TestLocker_RequestStopEndsTheLock(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		l, key := newLocker(t, db), newKey(t)
		lock, err := l.Lock(context.Background(), key)
		require.NoError(t, err)
		leasetest.WaitFor(t, db, key, admin.StateLive, 5*time.Second)
		require.NoError(t, admin.New(newRepository(t, db)).RequestStop(context.Background(), key, "drain"))
		leasetest.WaitFor(t, db, key, admin.StateReleased, 10*time.Second)
		err = lock.Unlock(context.Background())
		require.ErrorIs(t, err, gormlease.ErrStopRequested)
		assert.NotErrorIs(t, err, gormlease.ErrLeaseLost)
	})
}

// No DistributedElector leads while the role is paused: the leader in
// office when the role is paused steps down, its term ending with ErrPaused
// and its lease released, and no standby leads; once resumed, one leads
// again. Nothing is logged at Warn or above.
func TestDistributedElector_PausedRoleHasNoLeader(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		logs := &warnings{}
		role := newKey(t)
		var electors []*gormleasegocron.DistributedElector
		for _, name := range []string{"elector-a", "elector-b"} {
			e, err := gormleasegocron.NewDistributedElector(context.Background(), db, role,
				append(fast(), gormlease.WithHolder(name), gormlease.WithLogger(slog.New(logs)))...)
			require.NoError(t, err)
			t.Cleanup(e.Close)
			electors = append(electors, e)
		}
		leader := waitLeader(t, electors...)
		term, err := leader.Term()
		require.NoError(t, err)

		repo := newRepository(t, db)
		require.NoError(t, admin.New(repo).Pause(context.Background(), role, "maintenance"))
		select {
		case <-term.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the leader of a paused role goes on leading")
		}
		require.ErrorIs(t, context.Cause(term), gormlease.ErrPaused)
		leasetest.WaitFor(t, db, role, admin.StateReleased, 10*time.Second)
		// Longer than a heartbeat interval and a standby's wake-up: nobody
		// takes the paused role.
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for _, e := range electors {
				require.ErrorIs(t, e.IsLeader(context.Background()), gormleasegocron.ErrNotLeader, "a DistributedElector leads a paused role")
			}
		}
		_, leads, err := leader.Leader(context.Background())
		require.NoError(t, err)
		assert.False(t, leads, "the database shows a leader of a paused role")

		require.NoError(t, admin.New(repo).Resume(context.Background(), role))
		waitLeader(t, electors...)
		assert.Empty(t, logs.logged(), "the pause was logged as a fault")
	})
}

// A RequestStop ends the leader's term, with ErrStopRequested (not a
// loss); the campaign goes on and a later term leads.
func TestDistributedElector_RequestStopEndsTheTerm(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newKey(t)
		e := newElector(t, context.Background(), db, role, "elector")
		waitLeader(t, e)
		term, err := e.Term()
		require.NoError(t, err)
		lease, _ := gormlease.LeaseFromContext(term)

		require.NoError(t, admin.New(newRepository(t, db)).RequestStop(context.Background(), role, "drain"))
		select {
		case <-term.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the term goes on after RequestStop")
		}
		require.ErrorIs(t, context.Cause(term), gormlease.ErrStopRequested)
		assert.NotErrorIs(t, context.Cause(term), gormlease.ErrLeaseLost)
		waitLeader(t, e)
		next, err := e.Term()
		require.NoError(t, err)
		nextLease, _ := gormlease.LeaseFromContext(next)
		assert.Greater(t, nextLease.Generation, lease.Generation)
	})
}
