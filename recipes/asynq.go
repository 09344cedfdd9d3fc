package recipes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// AsynqLeaseMiddleware returns an asynq middleware that runs each task's
// handler under the gormlease lease of target(task), with runner. A task
// whose target is held elsewhere is not run: the middleware returns an
// error wrapping gormlease.ErrLeaseHeld, which asynq retries. Configure
// the server with AsynqIsFailure, so that such a retry does not count
// against the task's MaxRetry, and with AsynqRetryDelay, so that it comes
// soon. The handler's error, and a panic of the handler (recovered, as a
// *gormlease.PanicError), are the task's failure, even when the handler met
// a lease held or paused elsewhere (it called Run on another target, say,
// and returned that refusal). The handler's context carries the lease and
// is cancelled when it is lost. A target of "" runs the task without a
// lease. With a nil runner or target, every task fails with an error
// wrapping gormlease.ErrInvalidArgument, and no handler runs.
func AsynqLeaseMiddleware(runner *gormlease.Runner[struct{}], target func(task *asynq.Task) string) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			if runner == nil || target == nil {
				return fmt.Errorf("asynq middleware: runner and target are required: %w", gormlease.ErrInvalidArgument)
			}
			id := target(task)
			if id == "" {
				return next.ProcessTask(ctx, task)
			}
			_, err := runner.Run(ctx, id, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, next.ProcessTask(ctx, task)
			}, func(*gorm.DB, struct{}) error { return nil })
			if refused(err) {
				return &asynqHeld{err}
			}
			return err
		})
	}
}

// AsynqIsFailure is an asynq.Config.IsFailure: a task that
// AsynqLeaseMiddleware refused because its target was held is not a
// failure, and its retry keeps its retry count. Any other error is a
// failure, one that wraps gormlease.ErrLeaseHeld too: a handler's refusal
// of a lease of its own is the task's failure.
func AsynqIsFailure(err error) bool { return !isAsynqHeld(err) }

// asynqHeld is AsynqLeaseMiddleware's refusal of a task whose target was
// held: it wraps Run's error.
type asynqHeld struct{ err error }

func (e *asynqHeld) Error() string { return e.err.Error() }

func (e *asynqHeld) Unwrap() error { return e.err }

// isAsynqHeld reports whether err is AsynqLeaseMiddleware's refusal.
func isAsynqHeld(err error) bool {
	var held *asynqHeld
	return errors.As(err, &held)
}

// AsynqRetryDelay returns an asynq.Config.RetryDelayFunc that retries a
// task that AsynqLeaseMiddleware refused because its target was held after
// held, and any other failure as otherwise would
// (asynq.DefaultRetryDelayFunc when otherwise is nil).
func AsynqRetryDelay(held time.Duration, otherwise asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	if otherwise == nil {
		otherwise = asynq.DefaultRetryDelayFunc
	}
	return func(n int, err error, task *asynq.Task) time.Duration {
		if isAsynqHeld(err) {
			return held
		}
		return otherwise(n, err, task)
	}
}
