package recipes_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/recipes"
)

// cronLog is a cron.Logger that counts what the wrapper logs.
type cronLog struct{ skips, errors atomic.Int64 }

func (l *cronLog) Info(msg string, _ ...any) {
	if msg == "skip" {
		l.skips.Add(1)
	}
}

func (l *cronLog) Error(error, string, ...any) { l.errors.Add(1) }

// Two pods' crons fire one job: while pod a's run goes on, pod b's is
// skipped, and logged as a skip; once a's has ended, b's runs.
func TestCronSkipIfHeld_SkipsWhileAnotherPodRuns(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		var runs atomic.Int64
		started, release := make(chan struct{}, 2), make(chan struct{})
		job := cron.FuncJob(func() {
			runs.Add(1)
			started <- struct{}{}
			<-release
		})
		var logA, logB cronLog
		a := cron.NewChain(recipes.CronSkipIfHeld(newRunner[struct{}](t, db, gormlease.WithHolder("pod-a")), target, &logA)).Then(job)
		b := cron.NewChain(recipes.CronSkipIfHeld(newRunner[struct{}](t, s.Open(t, nil), gormlease.WithHolder("pod-b")), target, &logB)).Then(job)

		aDone := make(chan struct{})
		go func() { defer close(aDone); a.Run() }()
		recvT(t, started, "pod a's run")
		bDone := make(chan struct{})
		go func() { defer close(bDone); b.Run() }()
		select {
		case <-bDone: // skipped
		case <-started:
			close(release)
			<-aDone
			<-bDone
			t.Fatal("pod b ran while pod a did")
		}
		assert.EqualValues(t, 1, runs.Load())
		assert.EqualValues(t, 1, logB.skips.Load())
		close(release)
		recvT(t, aDone, "pod a's run to end")
		b.Run()
		assert.EqualValues(t, 2, runs.Load(), "pod b skipped after pod a's run ended")
		assert.Zero(t, logA.errors.Load()+logB.errors.Load())
	})
}

// Two real crons fire a job every second that takes 1.5s: across both,
// the job never runs twice at once, and the runs it overlaps are skipped.
func TestCronSkipIfHeld_TwoCronsNeverOverlap(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		var flight inFlight
		var runs atomic.Int64
		job := cron.FuncJob(func() {
			flight.enter()
			defer flight.leave()
			runs.Add(1)
			time.Sleep(1500 * time.Millisecond) // the job's own work
		})
		var logs [2]cronLog
		var crons []*cron.Cron
		for i := range 2 {
			runner := newRunner[struct{}](t, s.Open(t, nil))
			c := cron.New(cron.WithSeconds())
			_, err := c.AddJob("* * * * * *", cron.NewChain(recipes.CronSkipIfHeld(runner, target, &logs[i])).Then(job))
			if !assert.NoError(t, err) {
				return
			}
			crons = append(crons, c)
		}
		for _, c := range crons {
			c.Start()
		}
		time.Sleep(3200 * time.Millisecond) // three ticks or more
		var wg sync.WaitGroup
		for _, c := range crons {
			ctx := c.Stop()
			wg.Go(func() { <-ctx.Done() }) // the running jobs to end
		}
		wg.Wait()
		assert.EqualValues(t, 1, flight.most.Load(), "the job ran twice at once")
		assert.Positive(t, runs.Load())
		assert.Positive(t, logs[0].skips.Load()+logs[1].skips.Load(), "no run was skipped")
		assert.Zero(t, logs[0].errors.Load()+logs[1].errors.Load())
		t.Logf("%d runs, %d skips", runs.Load(), logs[0].skips.Load()+logs[1].skips.Load())
	})
}

// A job whose own code calls Run on another target, held or paused, and
// panics with that refusal (a cron job returns no error) failed: the
// wrapper logs it as an error, not as a skip. The job ran once.
func TestCronSkipIfHeld_JobRefusedInsideIsAnError(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		runner := newRunner[struct{}](t, db)
		for _, nested := range nestedJobs(t, db) {
			if !nested.Panic {
				continue // cron.Job.Run returns nothing
			}
			var runs atomic.Int64
			var log cronLog
			cron.NewChain(recipes.CronSkipIfHeld(runner, nested.Target, &log)).Then(cron.FuncJob(func() {
				runs.Add(1)
				_ = nested.run(context.Background(), runner)
			})).Run()
			assert.EqualValues(t, 1, runs.Load(), nested.Name)
			assert.Zero(t, log.skips.Load(), "%s: the job's failure was logged as a skip", nested.Name)
			assert.EqualValues(t, 1, log.errors.Load(), "%s: errors logged", nested.Name)
		}
	})
}
