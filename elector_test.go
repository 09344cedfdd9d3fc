package gormlease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// One Elector leads, the other waits; when the leader's lead returns it
// resigns, and the standby leads at once. Leader and IsLeader report who
// leads; the term is the lease's generation.
func TestElector_ResignHandsOver(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		a := newElector(t, db, role, gormlease.WithHolder("elector-a"))
		b := newElector(t, db, role, gormlease.WithHolder("elector-b"))

		aLeads, resign := make(chan int64, 1), make(chan struct{})
		aDone := goLead(t, context.Background(), a, func(ctx context.Context) error {
			l, _ := gormlease.LeaseFromContext(ctx)
			aLeads <- l.Generation
			<-resign
			return nil
		})
		aTerm := recv(t, aLeads, 20*time.Second, "a to lead")
		assert.True(t, a.IsLeader())
		info, leads, err := b.Leader(context.Background())
		require.NoError(t, err)
		require.True(t, leads)
		assert.Equal(t, "elector-a", info.Holder)
		assert.Equal(t, aTerm, info.Generation)

		bLeads := make(chan int64, 1)
		var resigned time.Time
		bDone := goLead(t, context.Background(), b, func(ctx context.Context) error {
			l, _ := gormlease.LeaseFromContext(ctx)
			assert.False(t, a.IsLeader(), "two leaders at once")
			bLeads <- l.Generation
			return nil
		})
		// b stands by before a resigns: a Lead whose goroutine ran late
		// would find the role free, and show nothing of a standby's wait.
		waitFor(t, 20*time.Second, "b to wait", func() bool { return waiters(t, role).Waits >= 1 })
		select {
		case <-bLeads:
			t.Fatal("b leads while a does")
		case <-time.After(300 * time.Millisecond):
		}
		assert.False(t, b.IsLeader())
		resigned = time.Now()
		close(resign)
		require.NoError(t, recv(t, aDone, 20*time.Second, "a's Lead"))
		assert.False(t, a.IsLeader())
		bTerm := recv(t, bLeads, 20*time.Second, "b to lead")
		t.Logf("b led %v after a resigned", time.Since(resigned))
		assert.Less(t, time.Since(resigned), 2*time.Second, "the standby did not lead at the resignation")
		assert.Greater(t, bTerm, aTerm, "the term did not grow")
		require.NoError(t, recv(t, bDone, 20*time.Second, "b's Lead"))
		_, leads, err = a.Leader(context.Background())
		require.NoError(t, err)
		assert.False(t, leads, "a leader after both resigned")
	})
}

// Leader reads the role's own row: the slots of a semaphore (WithSlots) of
// the same name, all held by Runners, are no leader, before anyone led,
// while someone leads (the leader is the role's holder, not a slot's), and
// after the leader resigned.
func TestElector_LeaderIgnoresSlotsOfTheSameName(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		const n = 2
		slots := newRunner(t, db, gormlease.WithSlots(n), gormlease.WithHolder("semaphore"))
		holds, free := make(chan struct{}, n), make(chan struct{})
		var slotDone []<-chan runResult[string]
		for range n {
			slotDone = append(slotDone, goRun(t, context.Background(), slots, role, func(ctx context.Context) (string, error) {
				holds <- struct{}{}
				select {
				case <-free:
				case <-ctx.Done(): // the test ended early
				}
				return "", nil
			}, func(*gorm.DB, string) error { return nil }))
		}
		for range n {
			recv(t, holds, 20*time.Second, "every slot to be held")
		}

		e := newElector(t, db, role, gormlease.WithHolder("elector"))
		leaderIs := func(want bool, when string) gormlease.JobLease {
			t.Helper()
			info, leads, err := e.Leader(context.Background())
			require.NoError(t, err)
			require.Equal(t, want, leads, "Leader %s (it reported %+v)", when, info)
			return info
		}
		leaderIs(false, "before anyone led")

		leading, resign := make(chan int64, 1), make(chan struct{})
		leadDone := goLead(t, context.Background(), e, func(ctx context.Context) error {
			l, _ := gormlease.LeaseFromContext(ctx)
			leading <- l.Generation
			select {
			case <-resign:
			case <-ctx.Done(): // the test ended early
			}
			return nil
		})
		term := recv(t, leading, 20*time.Second, "the elector to lead")
		info := leaderIs(true, "while the elector leads")
		assert.Equal(t, "elector", info.Holder)
		assert.Equal(t, term, info.Generation)
		assert.Equal(t, role, info.TargetID, "the role's own row, not a slot's, whose key is the role's and its number")

		close(resign)
		require.NoError(t, recv(t, leadDone, 20*time.Second, "Lead"))
		leaderIs(false, "after the leader resigned")

		close(free)
		for _, done := range slotDone {
			require.NoError(t, recv(t, done, 20*time.Second, "a slot's Run").Err)
		}
	})
}

// A leader whose heartbeats stop (its heartbeat pool is closed) stops
// trusting its term before its lease expires, and its lead is cancelled
// with ErrLeaseLost; the standby leads only after that, within the lease
// timeout plus an interval of the last heartbeat.
func TestElector_FailoverWhenTheLeaderStopsHeartbeating(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		hb := s.Open(t, nil)
		a := newElector(t, db, role, gormlease.WithHeartbeatDB(hb))
		b := newElector(t, db, role)

		aLeads := make(chan struct{})
		var cut time.Time
		aDone := goLead(t, context.Background(), a, func(ctx context.Context) error {
			close(aLeads)
			sqlDB, err := hb.DB()
			require.NoError(t, err)
			cut = time.Now()
			require.NoError(t, sqlDB.Close()) // every later heartbeat fails
			<-ctx.Done()
			return context.Cause(ctx)
		})
		recv(t, aLeads, 20*time.Second, "a to lead")
		bLeads := make(chan time.Duration, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		bDone := goLead(t, ctx, b, func(ctx context.Context) error {
			assert.False(t, a.IsLeader(), "the standby leads while the old leader trusts its term")
			bLeads <- time.Since(cut)
			return nil
		})
		require.ErrorIs(t, recv(t, aDone, 20*time.Second, "a's Lead"), gormlease.ErrLeaseLost)
		after := recv(t, bLeads, 20*time.Second, "b to lead")
		t.Logf("b led %v after a's heartbeats stopped", after)
		// The lease timeout is 2s and the interval 200ms; a loaded machine
		// gets a second more.
		assert.Less(t, after, 2*time.Second+200*time.Millisecond+time.Second)
		require.NoError(t, recv(t, bDone, 20*time.Second, "b's Lead"))
	})
}

// Writes fenced by the term: during the term CommitIfOwner with the lease
// saves and does not end the term; after a takeover, the deposed leader's
// term is cancelled and its write is refused.
func TestElector_DeposedLeaderWritesAreRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		e := newElector(t, db, role)
		err := e.Lead(context.Background(), func(ctx context.Context) error {
			l, ok := gormlease.LeaseFromContext(ctx)
			require.True(t, ok)
			save := func(v string) error {
				return e.Repository().CommitIfOwner(context.Background(), l, func(tx *gorm.DB) error {
					return gormlease.SaveJSON(tx, v)
				})
			}
			require.NoError(t, save("during the term"))
			assert.True(t, e.IsLeader(), "a fenced write ended the term")
			leasetest.TakeOver(t, db, role)
			<-ctx.Done()
			assert.False(t, e.IsLeader())
			assert.ErrorIs(t, save("after the takeover"), gormlease.ErrLeaseLost)
			return nil
		})
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		got, _, err := gormlease.LoadJSON[string](context.Background(), db, role)
		require.NoError(t, err)
		assert.Equal(t, "during the term", got)
	})
}

// 100 standbys wait as one: one watch of the role's row; when the leader
// resigns one of them leads, never two at once.
func TestElector_ManyStandbysWaitAsOne(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		// Long enough that the leader's heartbeats hold while 100
		// standbys campaign at once on its pool.
		opts := fast(time.Second, 20*time.Second)
		leader := newElector(t, db, role, opts...)
		leads, resign := make(chan struct{}), make(chan struct{})
		leaderDone := goLead(t, context.Background(), leader, func(ctx context.Context) error {
			close(leads)
			select {
			case <-resign:
			case <-ctx.Done(): // the test ended early
			}
			return nil
		})
		recv(t, leads, 20*time.Second, "the leader to lead")

		const n = 100
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }() // the standbys report to t: they end before it does
		var leading, most, led atomic.Int32
		first := make(chan struct{})
		var once sync.Once
		for range n {
			e := newElector(t, db, role, opts...)
			wg.Go(func() {
				err := e.Lead(ctx, func(context.Context) error {
					now := leading.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					led.Add(1)
					once.Do(func() { close(first) })
					leading.Add(-1)
					return nil
				})
				// After cancel, a Lead may end in its campaign or in its
				// term's commit, in the driver's words: only errors before
				// count.
				if err != nil && ctx.Err() == nil {
					t.Errorf("a standby's Lead: %v", err)
				}
			})
		}
		// A minute: 100 campaigns on one pool, under -race on a loaded
		// machine (20 s did not hold at a load average of 20).
		waitFor(t, time.Minute, "100 standbys on one watch", func() bool {
			return waiters(t, role).Waits == n
		})
		close(resign)
		require.NoError(t, recv(t, leaderDone, 20*time.Second, "the leader's Lead"))
		recv(t, first, 20*time.Second, "a standby to lead")
		cancel()
		wg.Wait()
		assert.EqualValues(t, 1, most.Load(), "standbys led at once")
		assert.GreaterOrEqual(t, led.Load(), int32(1))
	})
}

// Bad input is refused.
func TestElector_BadInput(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	_, err := gormlease.NewElector(db, "")
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	e := newElector(t, db, newTarget(t))
	require.ErrorIs(t, e.Lead(context.Background(), nil), gormlease.ErrInvalidArgument)
}
