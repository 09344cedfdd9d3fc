package gormlease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// heartbeat renews one lease while its work runs, and cancels the work when
// the lease is lost or can no longer be confirmed.
//
// Self-fencing: a lease is confirmed until lease timeout minus the safety
// margin after the last successful heartbeat was sent (or the acquire, for
// the first). The database stamped that heartbeat after it was sent, so no
// one can take the lease over before then on the database's clock. A timer,
// independent of the heartbeat calls, cancels the work at that point; each
// successful heartbeat pushes it back. So a database that hangs or is
// unreachable stops the work in time even if a call never returns.
type heartbeat struct {
	cancel context.CancelFunc
	done   chan struct{}
	fence  *time.Timer
}

// startHeartbeat starts renewing lease, acquired by a statement sent at
// sent. It stops when stop is called or workCtx ends; cancelWork cancels
// the work with the cause of the loss.
func startHeartbeat(workCtx context.Context, repo *Repository, cfg config, lease Lease,
	sent time.Time, cancelWork context.CancelCauseFunc,
) *heartbeat {
	trust := cfg.trustWindow()
	ctx, cancel := context.WithCancel(workCtx)
	h := &heartbeat{cancel: cancel, done: make(chan struct{})}
	h.fence = time.AfterFunc(time.Until(sent.Add(trust)), func() {
		cancelWork(fmt.Errorf("gormlease: heartbeat %q: no heartbeat confirmed the lease for %v: %w",
			lease.TargetID, trust, ErrLeaseLost))
	})
	go h.loop(ctx, repo, cfg, lease, sent, cancelWork)
	return h
}

func (h *heartbeat) loop(ctx context.Context, repo *Repository, cfg config, lease Lease,
	confirmed time.Time, cancelWork context.CancelCauseFunc,
) {
	defer close(h.done)
	trust := cfg.trustWindow()
	retry := cfg.heartbeatInterval / 4
	timer := time.NewTimer(cfg.heartbeatInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sent := time.Now()
		deadline := sent.Add(cfg.operationTimeout)
		if fenced := confirmed.Add(trust); fenced.Before(deadline) {
			deadline = fenced
		}
		callCtx, cancel := context.WithDeadline(ctx, deadline)
		err := repo.Heartbeat(callCtx, lease)
		cancel()
		switch {
		case err == nil:
			confirmed = sent
			if !h.fence.Reset(time.Until(sent.Add(trust))) {
				return // the fence fired first: the work is already cancelled
			}
			timer.Reset(cfg.heartbeatInterval)
		case errors.Is(err, ErrLeaseLost):
			h.fence.Stop()
			cancelWork(err)
			return
		case ctx.Err() != nil:
			return
		default:
			// Transient: try again sooner. If nothing succeeds before the
			// fence, the fence cancels the work.
			timer.Reset(retry)
		}
	}
}

// stop stops the heartbeat and waits for its goroutine to end.
func (h *heartbeat) stop() {
	h.cancel()
	<-h.done
	h.fence.Stop()
}
