package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// loadJSON is Do's load for a result that SaveJSON stored.
func loadJSON(target string) func(tx *gorm.DB) (string, error) {
	return func(tx *gorm.DB) (string, error) {
		v, _, err := gormlease.LoadJSON[string](tx.Statement.Context, tx, target)
		return v, err
	}
}

// doResult is what Do returned, sent over a channel.
type doResult struct {
	value  string
	shared bool
	err    error
}

// goDo calls r.Do on a goroutine and sends its result. The Do ends before
// t does (see endsWithTest).
func goDo(t testing.TB, ctx context.Context, r *gormlease.Runner[string], target string,
	work func(context.Context) (string, error),
) <-chan doResult {
	ctx, cancel := context.WithCancel(ctx)
	ch, done := make(chan doResult, 1), make(chan struct{})
	go func() {
		defer close(done)
		v, shared, err := r.Do(ctx, target, work, gormlease.SaveJSON[string], loadJSON(target))
		ch <- doResult{v, shared, err}
	}()
	endsWithTest(t, "Do "+target, cancel, done)
	return ch
}

// waitWatched waits until waiters of the process watch target's row.
func waitWatched(t *testing.T, target string) {
	t.Helper()
	waitFor(t, 10*time.Second, "waiters watching "+target, func() bool { return waiters(t, target).Held })
}

// Many callers of Do on one target, on two Runners (whose calls are not
// shared in the process, so one waits through the database): the work runs
// once, and every caller gets the saved value; only the caller whose call
// ran the work gets shared false.
func TestDo_ConcurrentCallersShareOneJob(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		a, b := newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...), newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...)
		target := newTarget(t)
		var runs atomic.Int32
		release := make(chan struct{})
		work := func(ctx context.Context) (string, error) {
			n := runs.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
			return fmt.Sprintf("report %d", n), nil
		}
		const n = 50
		results := make([]<-chan doResult, 0, n)
		results = append(results, goDo(t, context.Background(), a, target, work))
		waitFor(t, 10*time.Second, "the work to start", func() bool { return runs.Load() == 1 })
		for i := 1; i < n; i++ {
			r := a
			if i%2 == 1 {
				r = b
			}
			results = append(results, goDo(t, context.Background(), r, target, work))
		}
		// Every caller has joined its Runner's job before the job ends: a
		// caller that began after the save would rightly run the work again.
		// b's callers wait on the database.
		waitFor(t, 10*time.Second, "every caller to join its Runner's job", func() bool {
			return gormlease.DoCallers(a, target) == (n+1)/2 && gormlease.DoCallers(b, target) == n/2
		})
		waitWatched(t, target)
		close(release)
		unshared := 0
		for i, ch := range results {
			res := recv(t, ch, 20*time.Second, "Do")
			require.NoError(t, res.err, "caller %d", i)
			assert.Equal(t, "report 1", res.value, "caller %d", i)
			if !res.shared {
				unshared++
			}
		}
		assert.EqualValues(t, 1, runs.Load(), "work ran more than once")
		assert.Equal(t, 1, unshared, "callers that got shared false")
		assert.EqualValues(t, 1, leaseRow(t, db, target).Generation)
	})
}

// errUpstream is the error of a job that fails, in the tests of what its
// waiters get.
var errUpstream = errors.New("upstream API answered 503")

// When the shared job fails, the callers that waited for it get an error
// that says so, and nobody runs the work again. They get the same error
// wherever the job ran: callers of Do that shared the job in its process,
// a caller on another Runner (which waits through the database, as another
// process does), and callers in a helper process. Each error is a
// *SharedJobError with the same text and fields, that unwraps to
// ErrSharedJobFailed and not to the job's own error, which only the caller
// that ran the job gets.
func TestDo_HolderFailsWaitersGetSharedFailure(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		a, b := newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...), newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...)
		target := newTarget(t)
		var runs atomic.Int32
		release := make(chan struct{})
		work := func(ctx context.Context) (string, error) {
			runs.Add(1)
			<-release
			return "", fmt.Errorf("fetch the report: %w", errUpstream)
		}
		holder := goDo(t, context.Background(), a, target, work)
		waitFor(t, 10*time.Second, "the work to start", func() bool { return runs.Load() == 1 })
		waiters := []<-chan doResult{goDo(t, context.Background(), a, target, work), goDo(t, context.Background(), a, target, work)}
		waitFor(t, 10*time.Second, "the callers to join the job", func() bool { return gormlease.DoCallers(a, target) == 3 })
		waiters = append(waiters, goDo(t, context.Background(), b, target, work), goDo(t, context.Background(), b, target, work))
		waitFor(t, 10*time.Second, "b's callers to join its job", func() bool { return gormlease.DoCallers(b, target) == 2 })
		waitWatched(t, target)
		proc := startDoProcs(t, s, 1, noExpiry)[0]
		proc.send(fmt.Sprintf("do %s 2 never quick", target))
		require.Equal(t, "waiting", proc.status(target, 2))
		close(release)

		res := recv(t, holder, 20*time.Second, "the holder's Do")
		require.ErrorIs(t, res.err, errUpstream, "the holder gets the job's own error")
		assert.NotErrorIs(t, res.err, gormlease.ErrSharedJobFailed, "the holder's own failure")
		var texts []string
		for i, ch := range waiters {
			res := recv(t, ch, 20*time.Second, "a waiter's Do")
			require.ErrorIs(t, res.err, gormlease.ErrSharedJobFailed, "waiter %d", i)
			assert.NotErrorIs(t, res.err, errUpstream, "waiter %d sees through to the job's own error", i)
			assert.Same(t, gormlease.ErrSharedJobFailed, errors.Unwrap(res.err), "waiter %d", i)
			var shared *gormlease.SharedJobError
			require.ErrorAs(t, res.err, &shared, "waiter %d", i)
			assert.Equal(t, gormlease.SharedJobError{TargetID: target, Generation: 1,
				Message: fmt.Sprintf("work %q: fetch the report: upstream API answered 503", target)}, *shared, "waiter %d", i)
			texts = append(texts, res.err.Error())
		}
		for _, out := range proc.outcomes(2) {
			msg, ok := strings.CutPrefix(out, "error sharedfailed ")
			require.True(t, ok, "the helper's waiter got %q", out)
			texts = append(texts, msg)
		}
		for i := range texts {
			assert.Equal(t, texts[0], texts[i], "waiter %d's text", i)
		}
		assert.Empty(t, proc.working, "the helper ran the work")
		assert.EqualValues(t, 1, runs.Load(), "a waiter ran the work again")
		row := leaseRow(t, db, target)
		require.NotNil(t, row.Failure)
		assert.Contains(t, *row.Failure, "upstream API answered 503")
		assert.Nil(t, row.SavedGeneration)
	})
}

// A load that panics is returned as a *PanicError whose Step is "load".
func TestDo_LoadPanics(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db, gormlease.WithReuseFor(time.Hour))
		target := newTarget(t)
		work := func(context.Context) (string, error) { return "report", nil }
		_, shared, err := r.Do(context.Background(), target, work, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		require.False(t, shared)
		_, _, err = r.Do(context.Background(), target, work, gormlease.SaveJSON[string],
			func(*gorm.DB) (string, error) { panic("load exploded") })
		var pe *gormlease.PanicError
		require.ErrorAs(t, err, &pe, "the reused result's load")
		assert.Equal(t, "load", pe.Step)
		assert.Equal(t, "load exploded", pe.Value)
	})
}

// A holder that stops heartbeating (frozen or dead): once its lease
// expires, exactly one waiter takes over and runs the work, and the others
// get that waiter's result. The frozen holder's save is refused.
func TestDo_ExpiredHolderTakenOverByOneWaiter(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		target := newTarget(t)
		// Never renewed, and expired by the test (aged past its timeout)
		// once every caller waits for it: a lease that expired on its own
		// after a second could be taken over, and the result saved, before
		// a caller whose goroutine ran late began, which would rightly run
		// the work again.
		frozen, err := repo.Acquire(context.Background(), target, time.Hour)
		require.NoError(t, err)

		var runs atomic.Int32
		work := func(ctx context.Context) (string, error) {
			return fmt.Sprintf("report %d", runs.Add(1)), nil
		}
		runners := []*gormlease.Runner[string]{
			newRunner(t, db, fast(50*time.Millisecond, time.Second)...),
			newRunner(t, db, fast(50*time.Millisecond, time.Second)...),
			newRunner(t, db, fast(50*time.Millisecond, time.Second)...),
		}
		var results []<-chan doResult
		for i := range 12 {
			results = append(results, goDo(t, context.Background(), runners[i%3], target, work))
		}
		waitFor(t, 10*time.Second, "every caller to wait for the frozen holder", func() bool {
			for _, r := range runners {
				if gormlease.DoCallers(r, target) != 4 {
					return false
				}
			}
			w := waiters(t, target)
			return w.Waits == len(runners) && w.Held
		})
		age(t, s, db, target, 2*time.Hour) // the holder froze two hours ago
		unshared := 0
		for _, ch := range results {
			res := recv(t, ch, 20*time.Second, "Do")
			require.NoError(t, res.err)
			assert.Equal(t, "report 1", res.value)
			if !res.shared {
				unshared++
			}
		}
		assert.EqualValues(t, 1, runs.Load(), "more than one waiter ran the work")
		assert.Equal(t, 1, unshared)
		assert.EqualValues(t, 2, leaseRow(t, db, target).Generation)

		err = repo.CommitIfOwner(context.Background(), frozen, func(tx *gorm.DB) error {
			t.Error("the frozen holder's saver ran")
			return nil
		})
		assert.ErrorIs(t, err, gormlease.ErrLeaseLost)
	})
}

// RunWait: every caller runs its own work, one at a time, each under a
// generation of its own.
func TestRunWait_CallersRunOneAtATime(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		runners := []*gormlease.Runner[string]{
			newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...),
			newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...),
		}
		target := newTarget(t)
		var inside, maxInside atomic.Int32
		var mu sync.Mutex
		generations := map[int64]bool{}
		const n = 8
		errs := make(chan error, n)
		for i := range n {
			go func() {
				_, err := runners[i%2].RunWait(context.Background(), target, func(ctx context.Context) (string, error) {
					now := inside.Add(1)
					defer inside.Add(-1)
					for m := maxInside.Load(); now > m && !maxInside.CompareAndSwap(m, now); m = maxInside.Load() {
					}
					time.Sleep(20 * time.Millisecond) // the work itself: long enough to overlap if allowed
					l, _ := gormlease.LeaseFromContext(ctx)
					mu.Lock()
					generations[l.Generation] = true
					mu.Unlock()
					return "x", nil
				}, gormlease.SaveJSON[string])
				errs <- err
			}()
		}
		for range n {
			require.NoError(t, recv(t, errs, 30*time.Second, "RunWait"))
		}
		assert.EqualValues(t, 1, maxInside.Load(), "two works ran at once")
		assert.Len(t, generations, n, "works shared a generation")
		assert.EqualValues(t, n, leaseRow(t, db, target).Generation)
	})
}

// WithReuseFor: a result saved within the window is returned without
// running the work; one saved before it is not.
func TestDo_ReuseFor(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		var runs atomic.Int32
		work := func(context.Context) (string, error) { return fmt.Sprintf("report %d", runs.Add(1)), nil }
		plain := newRunner(t, db)
		v, shared, err := plain.Do(context.Background(), target, work, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		assert.False(t, shared)
		assert.Equal(t, "report 1", v)

		reuse := newRunner(t, db, gormlease.WithReuseFor(time.Hour))
		v, shared, err = reuse.Do(context.Background(), target, work, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		assert.True(t, shared, "a result within the window was not reused")
		assert.Equal(t, "report 1", v)
		assert.EqualValues(t, 1, runs.Load())

		// The save is 10 minutes old on the database's clock: outside a
		// 5-minute window.
		require.NoError(t, db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).
			Update("saved_at", s.Ago(10*time.Minute)).Error)
		short := newRunner(t, db, gormlease.WithReuseFor(5*time.Minute))
		v, shared, err = short.Do(context.Background(), target, work, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		assert.False(t, shared, "a result older than the window was reused")
		assert.Equal(t, "report 2", v)

		// Without the option, Do runs the work again once the job has ended.
		v, shared, err = plain.Do(context.Background(), target, work, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		assert.False(t, shared)
		assert.Equal(t, "report 3", v)
	})
}

// A caller whose context ends while it waits returns at once, with an
// error wrapping the context's, and leaves nothing behind.
func TestDo_ContextEndsWhileWaiting(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		target, _ := acquireNew(t, repo, time.Hour) // held for the whole test
		r := newRunner(t, db, fast(time.Second, 5*time.Second)...)
		sqlDB, err := db.DB()
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _, err = r.Do(ctx, target, func(context.Context) (string, error) {
			t.Error("work ran while the lease was held")
			return "", nil
		}, gormlease.SaveJSON[string], loadJSON(target))
		assert.ErrorIs(t, err, context.DeadlineExceeded)

		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = r.RunWait(ctx, target, func(context.Context) (string, error) {
			t.Error("work ran while the lease was held")
			return "", nil
		}, gormlease.SaveJSON[string])
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorIs(t, err, gormlease.ErrLeaseHeld)
		waitFor(t, 5*time.Second, "connections back", func() bool { return sqlDB.Stats().InUse == 0 })
	})
}

// A work that calls runtime.Goexit ends Do's shared job without a result:
// its callers get an error, never a zero value that claims success, and the
// lease is released, so the next Do runs the work.
func TestDo_GoexitInWorkIsAnError(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		target := newTarget(t)
		_, _, err := r.Do(context.Background(), target, func(context.Context) (string, error) {
			runtime.Goexit()
			return "never", nil
		}, gormlease.SaveJSON[string], loadJSON(target))
		assert.Error(t, err)
		assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")

		v, shared, err := r.Do(context.Background(), target, func(context.Context) (string, error) {
			return "second", nil
		}, gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, err)
		assert.Equal(t, "second", v)
		assert.False(t, shared)
	})
}

// Bad input to Do and RunWait is refused, naming the problem.
func TestDo_BadInput(t *testing.T) {
	t.Parallel()
	db := testdb.All(t)[0].DB(t)
	r := newRunner(t, db)
	work := func(context.Context) (string, error) { return "", nil }
	_, _, err := r.Do(context.Background(), "t", work, gormlease.SaveJSON[string], nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.ErrorContains(t, err, "load function is nil")
	_, _, err = r.Do(context.Background(), "", work, gormlease.SaveJSON[string], loadJSON("t"))
	assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = r.RunWait(context.Background(), "t", nil, gormlease.SaveJSON[string])
	assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = gormlease.NewRunner[string](db, gormlease.WithReuseFor(-time.Second))
	assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
}

// On PostgreSQL a waiter on another pool (so not woken in-process) is woken
// by the notification that the holder's commit sends, long before its
// first poll would come.
func TestDo_PostgresWaiterWokenByNotification(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	holderDB, waiterDB := s.Open(t, nil), s.Open(t, nil)
	opts := fast(40*time.Second, 2*time.Minute) // polls 5 s apart at the least
	holder, waiter := newRunner(t, holderDB, opts...), newRunner(t, waiterDB, opts...)
	target := newTarget(t)
	release := make(chan struct{})
	held := goDo(t, context.Background(), holder, target, func(ctx context.Context) (string, error) {
		<-release
		return "report", nil
	})
	waitFor(t, 10*time.Second, "the lease held", func() bool { return countRows(t, holderDB, &gormlease.JobLease{}, target) == 1 })
	waiting := goDo(t, context.Background(), waiter, target, func(context.Context) (string, error) {
		t.Error("the waiter ran the work")
		return "", nil
	})
	waitWatched(t, target)
	waitFor(t, 10*time.Second, "the listener", func() bool { return listening(t, waiterDB) })
	waitFor(t, 10*time.Second, "the row marked as waited on", func() bool {
		var waited bool
		require.NoError(t, holderDB.Table("job_lease").Select("waiting").Where("target_id = ?", target).Scan(&waited).Error)
		return waited
	})
	close(release)
	require.NoError(t, recv(t, held, 10*time.Second, "the holder").err)
	committed := time.Now()
	res := recv(t, waiting, 4*time.Second, "the waiter, woken by notification")
	require.NoError(t, res.err)
	assert.True(t, res.shared)
	assert.Equal(t, "report", res.value)
	t.Logf("woken %v after the holder returned", time.Since(committed))
}

// A Do that finds the lease expired, and tries to take it over while its
// holder, late but still the holder, saves, loads what the holder saved
// once the save commits: it neither runs the work again nor saves a
// second result under a generation of its own.
func TestDo_LoadsWhatAnExpiredHolderSavedDuringTheTakeover(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		// A short lease timeout, so that the lease soon looks expired while
		// the holder's saver runs.
		const timeout = 300 * time.Millisecond
		holder := newRunner(t, db, fast(100*time.Millisecond, timeout)...)
		waiterDB := s.Open(t, nil)
		waiter := newRunner(t, waiterDB, fast(100*time.Millisecond, timeout)...)
		target := newTarget(t)
		type outcome struct {
			v      string
			shared bool
			err    error
		}
		done := make(chan outcome, 1)
		var generation int64
		_, err := holder.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			generation = l.Generation
			return "the holder's", nil
		}, func(tx *gorm.DB, result string) error {
			waitLooksExpired(t, s, waiterDB, target, timeout)
			go func() {
				v, shared, err := waiter.Do(context.Background(), target, func(context.Context) (string, error) {
					return "the waiter's", nil
				}, gormlease.SaveJSON[string], loadJSON(target))
				done <- outcome{v, shared, err}
			}()
			waitDoTakeoverBlocked(t, s, waiterDB)
			return gormlease.SaveJSON(tx, result)
		})
		require.NoError(t, err)
		o := recv(t, done, 10*time.Second, "the Do")
		require.NoError(t, o.err)
		assert.Equal(t, "the holder's", o.v, "the Do ran the work again")
		assert.True(t, o.shared)
		row := leaseRow(t, db, target)
		assert.Equal(t, generation, row.Generation, "the Do took a generation of its own")
		assert.NotNil(t, row.ReleasedAt)
	})
}

// waitDoTakeoverBlocked waits until the takeover of a Do on waiterDB, from
// the generation it saw expire, waits for the lock that a fenced commit
// holds. Such a takeover is an UPDATE on MariaDB too, never its upsert.
func waitDoTakeoverBlocked(t *testing.T, s *testdb.Server, waiterDB *gorm.DB) {
	t.Helper()
	waitTakeoverBlockedLike(t, s, waiterDB, acquireSQL[s.Name])
}

// Do's first read of the row is tried again while the database cannot be
// reached, as its watch's reads are: a first read that timed out does not
// end the call, which runs the work once the database answers.
func TestDo_FirstReadTriedAgainWhileUnreachable(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		target := newTarget(t)
		proxy := testdb.NewProxy(t, s.Addr)
		reads := &failedReads{Interface: logger.Discard, needle: target, failed: make(chan time.Duration, 1)}
		via := s.OpenVia(t, proxy.Addr()).Session(&gorm.Session{Logger: reads})
		r := newRunner(t, via, gormlease.WithHeartbeatInterval(200*time.Millisecond),
			gormlease.WithLeaseTimeout(2*time.Second), gormlease.WithOperationTimeout(300*time.Millisecond))
		// The first statement that carries the target is Do's first read.
		tripped := proxy.BlackholeOn(target, false)
		type outcome struct {
			v      string
			shared bool
			err    error
		}
		done := make(chan outcome, 1)
		go func() {
			v, shared, err := r.Do(untilGivenUp(t), target, func(context.Context) (string, error) { return "made", nil },
				gormlease.SaveJSON[string], loadJSON(target))
			done <- outcome{v, shared, err}
		}()
		<-tripped
		<-reads.failed // the first read timed out
		proxy.Restore()
		o := <-done
		require.NoError(t, o.err)
		assert.Equal(t, "made", o.v)
		assert.False(t, o.shared)
	})
}
