// Package runs holds leases for the benchmark commands as an application
// would: each in a Run of a gormlease Runner whose work waits, so that the
// Runner's heartbeat group renews them all.
package runs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// errDone is the error of a work that End ended: nothing is saved.
var errDone = errors.New("done")

// Held are leases held at once by Runs whose work waits.
type Held struct {
	// Held counts the Runs whose work began, and Lost those that returned
	// an error wrapping gormlease.ErrLeaseLost.
	Held, Lost atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup
}

// End ends the works, and waits for their Runs to return.
func (h *Held) End() {
	close(h.stop)
	h.wg.Wait()
}

// Hold holds n leases through runner, on the targets prefix0 to
// prefix<n-1>, each in a Run whose work waits for End, and returns once
// all are held, or an error (with End still to call) when they are not
// within two minutes. At most 4 Runs acquire at once, so that the
// heartbeats of the leases already held find a connection of the pool
// meanwhile.
func Hold(ctx context.Context, runner *gormlease.Runner[string], n int, prefix string) (*Held, error) {
	h := &Held{stop: make(chan struct{})}
	acquiring := make(chan struct{}, 4)
	for i := range n {
		acquiring <- struct{}{}
		h.wg.Go(func() {
			var once sync.Once
			free := func() { once.Do(func() { <-acquiring }) }
			defer free()
			_, err := runner.Run(ctx, fmt.Sprintf("%s%d", prefix, i), func(ctx context.Context) (string, error) {
				free()
				h.Held.Add(1)
				select {
				case <-h.stop:
					return "", errDone
				case <-ctx.Done():
					return "", context.Cause(ctx)
				}
			}, func(*gorm.DB, string) error { return nil })
			if errors.Is(err, gormlease.ErrLeaseLost) {
				h.Lost.Add(1)
			}
		})
	}
	if err := WaitUntil(ctx, 120*time.Second, func() bool { return h.Held.Load() == int64(n) }); err != nil {
		return h, fmt.Errorf("%d of %d leases held: %w", h.Held.Load(), n, err)
	}
	return h, nil
}

// WaitUntil polls cond every 20ms until it holds, and returns an error
// when it does not within limit, or ctx ends first.
func WaitUntil(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("timed out after %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
