package gormlease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// failFastWithin is how soon a step must return an error that waiting
// cannot cure: far less than any retry window (the default one is 10 s).
const failFastWithin = 2 * time.Second

// untilGivenUp returns a context without a deadline, as a request handler's
// often is, that the test cancels after a while only so that a call that
// never returns cannot hang it.
func untilGivenUp(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(4*failFastWithin, cancel)
	t.Cleanup(func() { stop.Stop(); cancel() })
	return ctx
}

// failsFast runs call on a context without a deadline and checks that it
// returns, within failFastWithin, an error that says why.
func failsFast(t *testing.T, what, cause string, call func(ctx context.Context) error) {
	t.Helper()
	begin := time.Now()
	err := call(untilGivenUp(t))
	took := time.Since(begin)
	if assert.Error(t, err, what) {
		assert.ErrorContains(t, err, cause, what)
		assert.NotErrorIs(t, err, context.Canceled, "%s: it returned only when the test gave up", what)
	}
	assert.Less(t, took, failFastWithin, "%s returned after %v: %v", what, took, err)
}

// noWork is work that must not run.
func noWork(t *testing.T, what string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		t.Errorf("%s: the work ran", what)
		return "", nil
	}
}

// A pool that the application closed (at shutdown, while requests still
// arrive) cannot come back: every call returns at once, naming the cause,
// whatever its context, and writes nothing.
func TestClosedPool_EveryCallFailsAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, open *gorm.DB) {
		db := s.Open(t, nil)
		repo := newRepository(t, db)
		r := newRunner(t, db)
		slots := newRunner(t, db, gormlease.WithSlots(3))
		elector, err := gormlease.NewElector(db, newTarget(t))
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())

		const closed = "database is closed"
		target := newTarget(t)
		failsFast(t, "Acquire", closed, func(ctx context.Context) error {
			_, err := repo.Acquire(ctx, target, time.Minute)
			return err
		})
		failsFast(t, "AcquireFrom", closed, func(ctx context.Context) error {
			_, err := gormlease.AcquireFrom(repo, ctx, target, time.Minute, 0)
			return err
		})
		failsFast(t, "AcquireSlot", closed, func(ctx context.Context) error {
			_, err := repo.AcquireSlot(ctx, target, 3, time.Minute)
			return err
		})
		failsFast(t, "Run", closed, func(ctx context.Context) error {
			_, err := r.Run(ctx, target, noWork(t, "Run"), gormlease.SaveJSON[string])
			return err
		})
		failsFast(t, "Run with slots", closed, func(ctx context.Context) error {
			_, err := slots.Run(ctx, target, noWork(t, "Run with slots"), gormlease.SaveJSON[string])
			return err
		})
		failsFast(t, "RunWait", closed, func(ctx context.Context) error {
			_, err := r.RunWait(ctx, target, noWork(t, "RunWait"), gormlease.SaveJSON[string])
			return err
		})
		failsFast(t, "Do", closed, func(ctx context.Context) error {
			_, _, err := r.Do(ctx, target, noWork(t, "Do"), gormlease.SaveJSON[string],
				func(*gorm.DB) (string, error) { t.Error("Do: load ran"); return "", nil })
			return err
		})
		failsFast(t, "Elector.Lead", closed, func(ctx context.Context) error {
			return elector.Lead(ctx, func(context.Context) error { t.Error("Lead: led"); return nil })
		})

		var rows int64
		require.NoError(t, open.Model(&gormlease.JobLease{}).Where("target_id LIKE ?", t.Name()+"%").Count(&rows).Error)
		assert.Zero(t, rows, "lease rows written")
	})
}

// A lease table that does not exist (a name mistyped in WithTableNames, a
// migration not run) is not waited for: Run returns at once, saying so.
func TestMissingTable_RunFailsAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db, gormlease.WithTableNames("no_such_lease_table", "no_such_result_table"))
		failsFast(t, "Run", "no_such_lease_table", func(ctx context.Context) error {
			_, err := r.Run(ctx, newTarget(t), noWork(t, "Run"), gormlease.SaveJSON[string])
			return err
		})
	})
}

// An acquire on a database that does not answer is bounded as a Run with
// the default settings is, even under a context without a deadline: its
// attempts end within DefaultOperationTimeout, and the release of the lease
// that the last one may have taken within as long again.
func TestAcquire_BoundedWithoutDeadline(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		proxy := testdb.NewProxy(t, s.Addr)
		repo := newRepository(t, s.OpenVia(t, proxy.Addr()))
		proxy.Blackhole()
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(4*gormlease.DefaultOperationTimeout, cancel) // only so that a hang ends
		defer stop.Stop()
		defer cancel()
		eachRepositoryAcquire(ctx, repo, newTarget(t), func(name string, err error, took time.Duration) {
			assert.ErrorIs(t, err, context.DeadlineExceeded, name)
			assert.NoError(t, ctx.Err(), "%s returned only when the test gave up", name)
			assert.Less(t, took, 2*gormlease.DefaultOperationTimeout+5*time.Second, name)
		})
		proxy.Restore()
	})
}

// eachRepositoryAcquire runs the Repository's own acquires of target,
// Acquire and AcquireSlot, at once, and checks each one's error and how long
// it took, by name.
func eachRepositoryAcquire(ctx context.Context, repo *gormlease.Repository, target string,
	check func(name string, err error, took time.Duration),
) {
	var wg sync.WaitGroup
	for name, acquire := range map[string]func() error{
		"Acquire":     func() error { _, err := repo.Acquire(ctx, target, time.Minute); return err },
		"AcquireSlot": func() error { _, err := repo.AcquireSlot(ctx, target, 3, time.Minute); return err },
	} {
		wg.Go(func() {
			begin := time.Now()
			err := acquire()
			check(name, err, time.Since(begin))
		})
	}
	wg.Wait()
}

// Under a context whose deadline is far off, an acquire on a database that
// cannot be reached stops trying again within DefaultOperationTimeout of
// its call, as under one without a deadline.
func TestAcquire_RetriesBoundedUnderFarDeadline(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		proxy := testdb.NewProxy(t, s.Addr)
		repo := newRepository(t, s.OpenVia(t, proxy.Addr()))
		proxy.Close() // every connection is refused from now on
		ctx, cancel := context.WithTimeout(context.Background(), 4*gormlease.DefaultOperationTimeout)
		defer cancel()
		eachRepositoryAcquire(ctx, repo, newTarget(t), func(name string, err error, took time.Duration) {
			assert.Error(t, err, name)
			assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld, name)
			assert.NoError(t, ctx.Err(), "%s returned only when its context ended", name)
			assert.GreaterOrEqual(t, took, gormlease.DefaultOperationTimeout-time.Second, "%s tried again while the bound lasted", name)
			assert.Less(t, took, gormlease.DefaultOperationTimeout+5*time.Second, name)
		})
	})
}

// A caller that already waits for a held target when the application
// closes the pool stops waiting at the watch's next read of the row,
// within a heartbeat interval, with the pool's error: it does not wait for
// its context to end.
func TestClosedPool_WaitersStopWithTheError(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, open *gorm.DB) {
		db := s.Open(t, nil)
		const interval = 200 * time.Millisecond
		r := newRunner(t, db, fast(interval, 10*time.Second)...)
		target, _ := acquireNew(t, newRepository(t, open), time.Hour)

		ctx := untilGivenUp(t)
		errs := make(chan error, 2)
		var wg sync.WaitGroup
		t.Cleanup(wg.Wait)
		wg.Go(func() {
			_, err := r.RunWait(ctx, target, noWork(t, "RunWait"), noSave(t))
			errs <- err
		})
		wg.Go(func() {
			_, _, err := r.Do(ctx, target, noWork(t, "Do"), noSave(t),
				func(*gorm.DB) (string, error) { return "", nil })
			errs <- err
		})
		waitFor(t, 10*time.Second, "RunWait and Do wait for the holder",
			func() bool { return waiters(t, target).Waits == 2 })

		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())
		begin := time.Now()
		for range 2 {
			err := recv(t, errs, 4*failFastWithin, "a waiter's return")
			assert.ErrorContains(t, err, "database is closed")
			assert.NotErrorIs(t, err, context.Canceled, "it returned only when the test gave up")
		}
		assert.Less(t, time.Since(begin), failFastWithin, "the waiters returned so long after the pool closed")
	})
}
