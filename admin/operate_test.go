package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// runNothing is work that fails the test if it ever runs.
func runNothing(t *testing.T) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		t.Errorf("work ran on a paused target")
		return "", nil
	}
}

// A paused target refuses Run at once with ErrPaused, which also matches
// ErrLeaseHeld and names the target and the reason, and the refused
// acquire writes nothing: the row is the same before and after. Resume
// lets the next Run take it.
func TestPause_RefusesRunAndWritesNothing(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		r := testkit.NewRunner(t, db)
		repo := r.Repository()
		op := admin.New(repo)
		for _, ran := range []bool{false, true} { // a target never acquired, and one acquired before
			target := testkit.NewTarget(t)
			if ran {
				_, err := r.Run(ctx, target, func(context.Context) (string, error) { return "x", nil }, func(*gorm.DB, string) error { return nil })
				require.NoError(t, err)
			}
			require.NoError(t, op.Pause(ctx, target, "deploy in progress"))
			before := testkit.LeaseRow(t, db, target)
			require.NotNil(t, before.PausedAt)
			require.NotNil(t, before.PauseReason)
			assert.Equal(t, "deploy in progress", *before.PauseReason)

			_, err := r.Run(ctx, target, runNothing(t), testkit.NoSave(t))
			require.ErrorIs(t, err, gormlease.ErrPaused)
			require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
			assert.NotErrorIs(t, err, gormlease.ErrLeaseLost)
			var pe *gormlease.PausedError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, target, pe.Target)
			assert.Contains(t, err.Error(), target)
			assert.Contains(t, err.Error(), "deploy in progress")
			_, err = repo.Acquire(ctx, target, time.Minute)
			require.ErrorIs(t, err, gormlease.ErrPaused)
			after := testkit.LeaseRow(t, db, target)
			assert.Equal(t, before.Generation, after.Generation, "a refused acquire wrote the row")
			assert.Equal(t, before.LeaseToken, after.LeaseToken, "a refused acquire wrote the row")
			assert.True(t, before.UpdatedAt.Equal(after.UpdatedAt), "a refused acquire wrote the row")

			require.NoError(t, op.Pause(ctx, target, "still deploying"))
			again := testkit.LeaseRow(t, db, target)
			assert.Equal(t, "still deploying", *again.PauseReason, "pausing again updates the reason")
			assert.True(t, before.PausedAt.Equal(*again.PausedAt), "pausing again keeps the time of the pause")

			require.NoError(t, op.Resume(ctx, target))
			got, err := r.Run(ctx, target, func(context.Context) (string, error) { return "ran", nil }, func(*gorm.DB, string) error { return nil })
			require.NoError(t, err)
			assert.Equal(t, "ran", got)
			row := testkit.LeaseRow(t, db, target)
			assert.Nil(t, row.PausedAt)
			assert.Equal(t, before.Generation+1, row.Generation)
		}
	})
}

// List shows a paused target as paused, with the reason.
func TestPause_ListShowsIt(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		_, op := newOperator(t, db)
		target := testkit.NewTarget(t)
		require.NoError(t, op.Pause(ctx, target, "maintenance"))
		page, err := op.List(ctx, admin.ListOptions{Prefix: target})
		require.NoError(t, err)
		require.Len(t, page, 1)
		assert.True(t, page[0].Paused)
		assert.Equal(t, "maintenance", page[0].PauseReason)
		assert.Equal(t, admin.StateReleased, page[0].State)
		require.NoError(t, op.Resume(ctx, target))
		page, err = op.List(ctx, admin.ListOptions{Prefix: target})
		require.NoError(t, err)
		require.Len(t, page, 1)
		assert.False(t, page[0].Paused)
		assert.Empty(t, page[0].PauseReason)
	})
}

// RunWait and Do wait while their target is paused, and run the work once
// it is resumed.
func TestPause_RunWaitAndDoWaitForResume(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A lease timeout of 5 s, and with it the operation timeout that
		// bounds each acquire: with 1 s, dialling a new connection to a
		// container's PostgreSQL on a loaded machine ran out (CI's docker
		// pass). The waits poll at the interval either way.
		r := testkit.NewRunner(t, db, testkit.Fast(100*time.Millisecond, 5*time.Second)...)
		waitTarget, doTarget := testkit.NewTarget(t), testkit.NewTarget(t)
		repo := r.Repository()
		op := admin.New(repo)
		require.NoError(t, op.Pause(ctx, waitTarget, "hold on"))
		require.NoError(t, op.Pause(ctx, doTarget, "hold on"))
		resumed := make(chan struct{})
		work := func(context.Context) (string, error) {
			select {
			case <-resumed:
				return "ran", nil
			default:
				t.Errorf("work ran before Resume")
				return "", nil
			}
		}
		save := func(*gorm.DB, string) error { return nil }
		waitDone, doDone := make(chan error, 1), make(chan error, 1)
		go func() { _, err := r.RunWait(ctx, waitTarget, work, save); waitDone <- err }()
		go func() {
			_, _, err := r.Do(ctx, doTarget, work, save, func(*gorm.DB) (string, error) { return "loaded", nil })
			doDone <- err
		}()
		// Both wait, before the window in which they must go on waiting: a
		// call whose goroutine ran late would otherwise begin after the
		// Resume, and the test would pass without either having waited.
		testkit.WaitFor(t, 10*time.Second, "RunWait and Do to wait for the Resume", func() bool {
			return op.Waiters(waitTarget).Waits == 1 && op.Waiters(doTarget).Waits == 1
		})
		select {
		case err := <-waitDone:
			t.Fatalf("RunWait returned while paused: %v", err)
		case err := <-doDone:
			t.Fatalf("Do returned while paused: %v", err)
		case <-time.After(500 * time.Millisecond): // several polls, none of which may run the work
		}
		close(resumed)
		require.NoError(t, op.Resume(ctx, waitTarget))
		require.NoError(t, op.Resume(ctx, doTarget))
		require.NoError(t, testkit.Recv(t, waitDone, 10*time.Second, "RunWait"))
		require.NoError(t, testkit.Recv(t, doDone, 10*time.Second, "Do"))
	})
}

// A RunWait whose context ends while the target is paused returns an
// error wrapping ErrPaused and the context's error.
func TestPause_RunWaitStopsWaitingWithErrPaused(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := testkit.NewRunner(t, db, testkit.Fast(100*time.Millisecond, time.Second)...)
		target := testkit.NewTarget(t)
		require.NoError(t, admin.New(r.Repository()).Pause(context.Background(), target, "frozen"))
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		_, err := r.RunWait(ctx, target, runNothing(t), testkit.NoSave(t))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, gormlease.ErrPaused)
		assert.Contains(t, err.Error(), "frozen")
	})
}

// RequestStop stops a Run within about a heartbeat interval: its work's
// context is cancelled with a cause wrapping ErrStopRequested, not
// ErrLeaseLost; nothing is saved; Run returns the error with the reason;
// and the lease is released, at once, so that the next Run takes it.
func TestRequestStop_StopsRunWithoutSaving(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		const interval = 100 * time.Millisecond
		r := testkit.NewRunner(t, db, testkit.Fast(interval, 10*time.Second)...)
		repo := r.Repository()
		op := admin.New(repo)
		target := testkit.NewTarget(t)
		started := make(chan struct{})
		var cause error
		var stoppedAt time.Time
		var requested time.Time
		go func() {
			<-started
			requested = time.Now()
			assert.NoError(t, op.RequestStop(ctx, target, "drain"))
		}()
		_, err := r.Run(ctx, target, func(work context.Context) (string, error) {
			close(started)
			<-work.Done()
			stoppedAt = time.Now()
			cause = context.Cause(work)
			return "result", nil
		}, testkit.NoSave(t))
		require.ErrorIs(t, err, gormlease.ErrStopRequested)
		assert.NotErrorIs(t, err, gormlease.ErrLeaseLost)
		assert.Contains(t, err.Error(), "drain")
		require.ErrorIs(t, cause, gormlease.ErrStopRequested)
		assert.NotErrorIs(t, cause, gormlease.ErrLeaseLost)
		// Within an interval of the request, and a margin for a loaded
		// machine: the request rides on the next heartbeat.
		assert.Less(t, stoppedAt.Sub(requested), interval+2*time.Second)
		row := testkit.LeaseRow(t, db, target)
		require.NotNil(t, row.ReleasedAt, "the lease was not released")
		assert.Nil(t, row.SavedGeneration, "something was saved")

		// The request applied to that lease only: the next one runs to its end.
		got, err := r.Run(ctx, target, func(context.Context) (string, error) { return "next", nil },
			func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		assert.Equal(t, "next", got)
	})
}

// A stop request applies to the lease live when it was made, never to a
// later one: once that lease has ended, the next holder's heartbeats do
// not stop it.
func TestRequestStop_DoesNotHitALaterLease(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		const interval = 50 * time.Millisecond
		r := testkit.NewRunner(t, db, testkit.Fast(interval, 10*time.Second)...)
		repo := r.Repository()
		op := admin.New(repo)
		target, l := testkit.AcquireNew(t, repo, time.Minute)
		require.NoError(t, op.RequestStop(ctx, target, "old"))
		require.NoError(t, repo.Release(ctx, l))
		page, err := op.List(ctx, admin.ListOptions{Prefix: target})
		require.NoError(t, err)
		require.Len(t, page, 1)
		assert.False(t, page[0].StopRequested, "a released lease shows a pending stop")

		beats := 0
		_, err = r.Run(ctx, target, func(work context.Context) (string, error) {
			// Several heartbeats, each of which would find a request that
			// applied to this lease.
			for beats = 0; beats < 5; beats++ {
				before := testkit.LeaseRow(t, db, target).UpdatedAt
				testkit.WaitFor(t, 10*time.Second, "a heartbeat", func() bool {
					return work.Err() != nil || testkit.LeaseRow(t, db, target).UpdatedAt.After(before)
				})
				if work.Err() != nil {
					return "", context.Cause(work)
				}
			}
			return "done", nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		assert.Equal(t, 5, beats)
	})
}

// A request made again, with the same reason, while the lease is still
// held is no error: the lease is held, and the request stands (MySQL counts
// the rows a statement changed, and this one changes none).
func TestRequestStop_AgainWhileHeld(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		target, l := testkit.AcquireNew(t, repo, time.Minute)
		require.NoError(t, op.RequestStop(ctx, target, "drain"))
		require.NoError(t, op.RequestStop(ctx, target, "drain"), "asked again")
		row := testkit.LeaseRow(t, db, target)
		require.NotNil(t, row.StopGeneration)
		assert.Equal(t, l.Generation, *row.StopGeneration)
	})
}

// With no live lease, RequestStop returns ErrNoLiveLease, as ForceRelease
// does, and writes nothing.
func TestRequestStop_NoLiveLease(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		require.ErrorIs(t, op.RequestStop(ctx, testkit.NewTarget(t), "x"), gormlease.ErrNoLiveLease, "never acquired")
		target, l := testkit.AcquireNew(t, repo, time.Minute)
		require.NoError(t, repo.Release(ctx, l))
		require.ErrorIs(t, op.RequestStop(ctx, target, "x"), gormlease.ErrNoLiveLease, "released")
		assert.Nil(t, testkit.LeaseRow(t, db, target).StopGeneration)
	})
}

// afterStatement is a logger that calls after with each statement, once
// it has run (gormlease reports its statements to the pool's logger).
type afterStatement struct {
	logger.Interface
	after func(sql string)
}

func (l afterStatement) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.after(sql)
}

func (l afterStatement) LogMode(logger.LogLevel) logger.Interface { return l }

// RequestStop answers for the lease its request reached: on a target
// whose lease was released when the request ran, and that another holder
// acquired before RequestStop read the row back (which it does when its
// UPDATE changed no row, as MySQL counts a request made again), it returns
// ErrNoLiveLease, and the new holder is not asked to stop. It returned nil
// there, saying that a holder was asked to stop when none was: the
// history checker found it (history/, the operator's stop with no
// stop_requested event).
func TestRequestStop_TargetTakenBetweenItsStatements(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := testkit.NewRepository(t, db)
		target, l := testkit.AcquireNew(t, repo, time.Minute)
		require.NoError(t, repo.Release(ctx, l))
		var next gormlease.Lease
		var err error
		hooked := db.Session(&gorm.Session{Logger: afterStatement{Interface: logger.Discard, after: func(sql string) {
			if strings.Contains(sql, "SET stop_generation = generation") && next.Generation == 0 {
				next, err = repo.Acquire(ctx, target, time.Minute) // on a pool of its own
			}
		}}})
		op := admin.New(testkit.NewRepository(t, hooked))
		stopErr := op.RequestStop(ctx, target, "drain")
		require.NoError(t, err)
		require.NotZero(t, next.Generation, "no acquisition between the request's statements")
		require.ErrorIs(t, stopErr, gormlease.ErrNoLiveLease)
		row := testkit.LeaseRow(t, db, target)
		assert.True(t, row.StopGeneration == nil || *row.StopGeneration != next.Generation, "the new holder asked to stop")
	})
}

// Prune never deletes a paused target's row, however long ago it was
// released; ForceRelease ends a live lease but leaves the pause in place.
func TestPause_SurvivesPruneAndForceRelease(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		repo, op := newOperator(t, db)
		l, err := repo.Acquire(ctx, "paused", time.Minute)
		require.NoError(t, err)
		require.NoError(t, op.Pause(ctx, "paused", "keep"))
		_, err = op.ForceRelease(ctx, "paused")
		require.NoError(t, err)
		assert.NotNil(t, testkit.LeaseRow(t, db, "paused").PausedAt, "ForceRelease resumed the target")
		_, err = repo.Acquire(ctx, "paused", time.Minute)
		require.ErrorIs(t, err, gormlease.ErrPaused)
		ageRelease(t, s, db, "paused", 2*time.Hour)
		_, err = repo.Acquire(ctx, "unpaused", time.Minute)
		require.NoError(t, err)
		testkit.Age(t, s, db, "unpaused", 2*time.Hour)

		deleted, err := op.Prune(ctx, admin.PruneOptions{OlderThan: time.Hour})
		require.NoError(t, err)
		assert.EqualValues(t, 1, deleted, "only the row that is not paused")
		row := testkit.LeaseRow(t, db, "paused")
		assert.NotNil(t, row.PausedAt)
		assert.Equal(t, l.Generation+1, row.Generation)
	})
}

// With WithSlots, pausing the target pauses every slot, those that exist
// and those made later; RequestStop on the target stops every slot's
// holder, and RequestStopSlot one.
func TestPause_Slots(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		r := testkit.NewRunner(t, db, append(testkit.Fast(50*time.Millisecond, 10*time.Second), gormlease.WithSlots(2))...)
		repo := r.Repository()
		op := admin.New(repo)
		save := func(*gorm.DB, string) error { return nil }
		ok := func(context.Context) (string, error) { return "ok", nil }

		fresh := testkit.NewTarget(t) // paused before its slot rows exist
		require.NoError(t, op.Pause(ctx, fresh, "no slots yet"))
		_, err := r.Run(ctx, fresh, runNothing(t), testkit.NoSave(t))
		require.ErrorIs(t, err, gormlease.ErrPaused)
		assert.Contains(t, err.Error(), "no slots yet")

		target := testkit.NewTarget(t) // paused after
		_, err = r.Run(ctx, target, ok, save)
		require.NoError(t, err)
		require.NoError(t, op.Pause(ctx, target, "slots"))
		_, err = r.Run(ctx, target, runNothing(t), testkit.NoSave(t))
		require.ErrorIs(t, err, gormlease.ErrPaused)
		require.NoError(t, op.Resume(ctx, target))
		require.NoError(t, op.Resume(ctx, fresh))
		_, err = r.Run(ctx, fresh, ok, save)
		require.NoError(t, err)

		// Two holders, one per slot: RequestStop on the target stops both.
		started := make(chan struct{}, 2)
		work := func(w context.Context) (string, error) {
			started <- struct{}{}
			<-w.Done()
			return "", context.Cause(w)
		}
		first, second := testkit.GoRun(t, ctx, r, target, work, testkit.NoSave(t)), testkit.GoRun(t, ctx, r, target, work, testkit.NoSave(t))
		testkit.Recv(t, started, 10*time.Second, "the first holder")
		testkit.Recv(t, started, 10*time.Second, "the second holder")
		require.NoError(t, op.RequestStop(ctx, target, "all slots"))
		require.ErrorIs(t, testkit.Recv(t, first, 10*time.Second, "the first Run").Err, gormlease.ErrStopRequested)
		require.ErrorIs(t, testkit.Recv(t, second, 10*time.Second, "the second Run").Err, gormlease.ErrStopRequested)

		// RequestStopSlot stops one slot's holder only.
		one := testkit.GoRun(t, ctx, r, target, work, testkit.NoSave(t))
		testkit.Recv(t, started, 10*time.Second, "a holder")
		l := recvLease(t, op, target)
		require.ErrorIs(t, op.RequestStopSlot(ctx, target, 3-l, "other slot"), gormlease.ErrNoLiveLease)
		require.NoError(t, op.RequestStopSlot(ctx, target, l, "this slot"))
		require.ErrorIs(t, testkit.Recv(t, one, 10*time.Second, "the Run").Err, gormlease.ErrStopRequested)
	})
}

// recvLease returns the slot of target whose lease is live.
func recvLease(t *testing.T, op *admin.Operator, target string) int {
	t.Helper()
	page, err := op.List(context.Background(), admin.ListOptions{Prefix: target, State: admin.StateLive})
	require.NoError(t, err)
	require.Len(t, page, 1)
	return page[0].Slot
}

// When an operator stops a job that callers of Do wait for, in this
// process and in another (a Runner of its own), they do not get a
// SharedJobError: one of them takes over and runs the work.
func TestRequestStop_DoWaitersTakeOver(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		holder := testkit.NewRunner(t, db, testkit.Fast(50*time.Millisecond, 10*time.Second)...)
		other := testkit.NewRunner(t, db, testkit.Fast(50*time.Millisecond, 10*time.Second)...)
		target := testkit.NewTarget(t)
		save := func(*gorm.DB, string) error { return nil }
		load := func(*gorm.DB) (string, error) { return "loaded", nil }
		started := make(chan struct{})
		stopped := func(w context.Context) (string, error) {
			close(started)
			<-w.Done()
			return "", context.Cause(w)
		}
		type out struct {
			v   string
			err error
		}
		first, local, remote := make(chan out, 1), make(chan out, 1), make(chan out, 1)
		go func() { v, _, err := holder.Do(ctx, target, stopped, save, load); first <- out{v, err} }()
		testkit.Recv(t, started, 10*time.Second, "the job")
		takeOver := func(context.Context) (string, error) { return "taken over", nil }
		go func() { v, _, err := holder.Do(ctx, target, takeOver, save, load); local <- out{v, err} }()
		go func() { v, _, err := other.Do(ctx, target, takeOver, save, load); remote <- out{v, err} }()
		// Whether they wait for the job, or come after it ended, neither
		// may share its failure.
		require.NoError(t, admin.New(holder.Repository()).RequestStop(ctx, target, "redo"))
		require.ErrorIs(t, testkit.Recv(t, first, 10*time.Second, "the stopped Do").err, gormlease.ErrStopRequested)
		for _, ch := range []chan out{local, remote} {
			o := testkit.Recv(t, ch, 10*time.Second, "a waiting Do")
			require.NoError(t, o.err)
			assert.Contains(t, []string{"taken over", "loaded"}, o.v)
		}
	})
}

// An Elector's term ends when an operator asks the leader to stop: Lead
// returns an error wrapping ErrStopRequested, and a standby leads. While
// the role is paused, no Elector leads; Resume lets one lead.
func TestRequestStop_ElectorTermEnds(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		role := testkit.NewTarget(t)
		a, b := testkit.NewElector(t, db, role), testkit.NewElector(t, db, role)
		leading := make(chan string, 2)
		lead := func(name string) func(context.Context) error {
			return func(term context.Context) error {
				leading <- name
				<-term.Done()
				return context.Cause(term)
			}
		}
		aDone := testkit.GoLead(t, ctx, a, lead("a"))
		require.Equal(t, "a", testkit.Recv(t, leading, 10*time.Second, "a leads"))
		require.NoError(t, admin.New(a.Repository()).Pause(ctx, role, "no leader"))
		bDone := testkit.GoLead(t, ctx, b, lead("b"))
		// b campaigns before a's term ends: a Lead whose goroutine ran late
		// would begin only after the window below.
		testkit.WaitFor(t, 10*time.Second, "b to wait for a's term", func() bool {
			return admin.New(a.Repository()).Waiters(role).Waits == 1
		})
		require.NoError(t, admin.New(a.Repository()).RequestStop(ctx, role, "step down"))
		err := testkit.Recv(t, aDone, 10*time.Second, "a's Lead")
		require.ErrorIs(t, err, gormlease.ErrStopRequested)
		assert.NotErrorIs(t, err, gormlease.ErrLeaseLost)
		select {
		case name := <-leading:
			t.Fatalf("%s leads a paused role", name)
		case err := <-bDone:
			t.Fatalf("b's Lead returned while paused: %v", err)
		case <-time.After(500 * time.Millisecond): // several polls of b's
		}
		require.NoError(t, admin.New(a.Repository()).Resume(ctx, role))
		require.Equal(t, "b", testkit.Recv(t, leading, 10*time.Second, "b leads"))
	})
}
