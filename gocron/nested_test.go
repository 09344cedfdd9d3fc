package gormleasegocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// jobError is the error of one run of a job, as gocron reported it.
type jobError struct {
	job string
	err error
}

// refusedInside schedules on sched, every 50ms, one job for each way a
// job's own code meets a refusal: it calls Run on another target, held by
// another holder or paused by an operator, and returns that refusal. The
// runs' errors go to the channel returned; a Lock refused fails the test.
func refusedInside(t *testing.T, db *gorm.DB, sched gocron.Scheduler) <-chan jobError {
	t.Helper()
	runner, err := gormlease.NewRunner[struct{}](db, fast()...)
	require.NoError(t, err)
	held, paused := newKey(t), newKey(t)
	leasetest.Occupy(t, db, held)
	require.NoError(t, admin.New(newRepository(t, db)).Pause(context.Background(), paused, "maintenance"))
	errs := make(chan jobError, 100)
	for _, other := range []string{held, paused} {
		_, err := sched.NewJob(gocron.DurationJob(50*time.Millisecond),
			gocron.NewTask(func() error {
				_, err := runner.Run(context.Background(), other, func(context.Context) (struct{}, error) {
					return struct{}{}, nil
				}, func(*gorm.DB, struct{}) error { return nil })
				return err
			}),
			gocron.WithName(newKey(t)),
			gocron.WithSingletonMode(gocron.LimitModeReschedule), // a tick does not meet its previous run
			gocron.WithEventListeners(
				gocron.AfterJobRunsWithError(func(_ uuid.UUID, name string, err error) {
					select {
					case errs <- jobError{name, err}:
					default:
					}
				}),
				gocron.AfterLockError(func(_ uuid.UUID, name string, err error) {
					t.Errorf("job %s: Lock refused: %v", name, err)
				})))
		require.NoError(t, err)
	}
	return errs
}

// waitRuns waits until each of the two jobs failed twice, its second run
// neither skipped nor refused after the first's failure, with the refusal
// that it met (gormlease.ErrLeaseHeld) as its own error.
func waitRuns(t *testing.T, errs <-chan jobError) {
	t.Helper()
	runs := map[string]int{}
	for twice := 0; twice < 2; {
		select {
		case e := <-errs:
			require.ErrorIs(t, e.err, gormlease.ErrLeaseHeld, "job %s: the job's own error", e.job)
			if runs[e.job]++; runs[e.job] == 2 {
				twice++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("jobs' failed runs in 20s: %v", runs)
		}
	}
}

// A job under a Locker that meets a refusal of a lease of its own and
// returns it fails, and gocron reports its error as the job's, not as a
// Lock refused: its lease was taken, and released when the run ended,
// so that the next tick runs it again.
func TestLocker_JobRefusedInsideIsTheJobsFailure(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(newLocker(t, db)))
		require.NoError(t, err)
		errs := refusedInside(t, db, sched)
		sched.Start()
		defer func() { require.NoError(t, sched.Shutdown()) }()
		waitRuns(t, errs)
	})
}

// A leader's job that meets a refusal of a lease of its own and returns it
// fails, and the DistributedElector goes on leading in the same term: the
// job's error never reaches the role's lease.
func TestDistributedElector_JobRefusedInsideKeepsTheTerm(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		e := newElector(t, context.Background(), db, newKey(t), "elector")
		waitLeader(t, e)
		term, err := e.Term()
		require.NoError(t, err)
		sched, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
		require.NoError(t, err)
		errs := refusedInside(t, db, sched)
		sched.Start()
		defer func() { require.NoError(t, sched.Shutdown()) }()
		waitRuns(t, errs)
		assert.NoError(t, term.Err(), "the term ended")
		assert.NoError(t, e.IsLeader(context.Background()))
	})
}
