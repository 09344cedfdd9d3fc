package recipes

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// RiverSnoozeOnHeld returns a River worker middleware, for river.Config.Middleware, that runs each job's
// work under the gormlease lease of target(job), with runner: a job whose
// target is held (by another job, in this process or any other) is
// snoozed for snooze, without counting as an attempt, instead of running
// at the same time. The job's work gets a context that carries the lease
// (gormlease.LeaseFromContext) and is cancelled when it is lost, so its
// writes can be fenced with runner.Repository().CommitIfOwner. A target of
// "" runs the job without a lease. Only the job's own target being held
// snoozes it: the job's failure is returned to River as a failure, even
// when the job met a lease held or paused elsewhere (it called Run on
// another target, say, and returned that refusal), and so is a panic. It returns an error wrapping
// gormlease.ErrInvalidArgument when runner or target is nil or snooze is
// negative.
func RiverSnoozeOnHeld(runner *gormlease.Runner[struct{}], target func(job *rivertype.JobRow) string,
	snooze time.Duration,
) (rivertype.WorkerMiddleware, error) {
	switch {
	case runner == nil || target == nil:
		return nil, fmt.Errorf("river middleware: runner and target are required: %w", gormlease.ErrInvalidArgument)
	case snooze < 0:
		return nil, fmt.Errorf("river middleware: snooze must be >= 0, got %v: %w", snooze, gormlease.ErrInvalidArgument)
	}
	return river.WorkerMiddlewareFunc(func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
		id := target(job)
		if id == "" {
			return doInner(ctx)
		}
		_, err := runner.Run(ctx, id, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, doInner(ctx)
		}, func(*gorm.DB, struct{}) error { return nil })
		if refused(err) {
			return river.JobSnooze(snooze)
		}
		return err
	}), nil
}
