package recipes

import (
	"context"
	"fmt"

	"github.com/robfig/cron/v3"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// CronSkipIfHeld returns a robfig/cron JobWrapper that is
// cron.SkipIfStillRunning across pods: each run of the wrapped job runs
// under the gormlease lease of target, with runner, and a run that finds
// the target held, by this pod's previous run or another pod's, is
// skipped, and logged at Info on logger. A run's failure to reach the
// database is logged with logger.Error, and so is a panic of the job, which
// the wrapper recovers, releasing the lease: a job that panicked with a
// refusal that it met (it called Run on another target, held or paused)
// failed, and is not logged as a skip. The job's cron.Job.Run takes no
// context, so a lost lease cannot stop it (see the gocron module's package
// doc for the same limit): jobs that must be fenced call runner.Run
// themselves. A nil logger logs nothing (cron.DiscardLogger). With a nil
// runner, no run runs, and each is logged with logger.Error.
func CronSkipIfHeld(runner *gormlease.Runner[struct{}], target string, logger cron.Logger) cron.JobWrapper {
	if logger == nil {
		logger = cron.DiscardLogger
	}
	return func(job cron.Job) cron.Job {
		return cron.FuncJob(func() {
			if runner == nil {
				logger.Error(fmt.Errorf("cron wrapper: runner is required: %w", gormlease.ErrInvalidArgument), "run", "target", target)
				return
			}
			_, err := runner.Run(context.Background(), target, func(context.Context) (struct{}, error) {
				job.Run()
				return struct{}{}, nil
			}, func(*gorm.DB, struct{}) error { return nil })
			switch {
			case refused(err):
				logger.Info("skip", "target", target)
			case err != nil:
				logger.Error(err, "run", "target", target)
			}
		})
	}
}
