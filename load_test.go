package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Load: 1,000 concurrent Runs over 100 targets (ten rounds of them under
// GORMLEASE_SOAK), with random work durations, failures and panics. At no instant
// do two works run for one target; every save is made under the lease that
// the row carries at commit, once per generation; and afterwards the
// goroutines and the pool's connections are back to their baseline.
//
// It is not parallel: it compares the process's goroutine count with its
// baseline, which other tests' goroutines would disturb. (Parallel tests
// wait until the sequential ones have finished.)
func TestLoad_ConcurrentRuns(t *testing.T) {
	s := testdb.Postgres(t)
	db := s.Open(t, nil)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(20)
	sqlDB.SetMaxIdleConns(4)
	r, err := gormlease.NewRunner[int64](db,
		gormlease.WithHeartbeatInterval(20*time.Millisecond),
		gormlease.WithLeaseTimeout(5*time.Second),
		gormlease.WithOperationTimeout(5*time.Second))
	require.NoError(t, err)

	const runs = 1000
	rounds := soakOr(1, 10)
	const targets = 100
	prefix := newTarget(t)
	target := func(i int) string { return fmt.Sprintf("%s/%d", prefix, i%targets) }
	errFailed := errors.New("work failed")

	var running [targets]atomic.Int32
	var overlaps, badSaves atomic.Int32
	var savedMu sync.Mutex
	saved := map[string]map[int64]int{} // target -> generation -> saves
	var outcomes sync.Map               // outcome -> *atomic.Int32
	count := func(kind string) {
		v, _ := outcomes.LoadOrStore(kind, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
	}

	runOnce := func(slot *atomic.Int32, i int) error {
		_, err := r.Run(context.Background(), target(i), func(ctx context.Context) (int64, error) {
			if slot.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer slot.Add(-1)
			l, _ := gormlease.LeaseFromContext(ctx)
			select {
			case <-time.After(time.Duration(rand.IntN(40)) * time.Millisecond):
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
			switch n := rand.IntN(20); {
			case n == 0:
				panic("work panicked")
			case n < 3:
				return 0, errFailed
			}
			return l.Generation, nil
		}, func(tx *gorm.DB, gen int64) error {
			// The fenced commit holds the row: it must carry this lease. (Run
			// releases it in this same transaction, before the saver, so
			// released_at is already set here; other transactions do not see
			// that until the commit.)
			l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
			var row gormlease.JobLease
			if err := tx.Where("target_id = ?", l.TargetID).Take(&row).Error; err != nil {
				return err
			}
			if row.LeaseToken != l.Token || row.Generation != gen {
				badSaves.Add(1)
			}
			savedMu.Lock()
			if saved[l.TargetID] == nil {
				saved[l.TargetID] = map[int64]int{}
			}
			saved[l.TargetID][gen]++
			savedMu.Unlock()
			return gormlease.SaveJSON(tx, gen)
		})
		return err
	}

	for range rounds {
		runRound(runs, func(i int) {
			slot := &running[i%targets]
			// A refused Run tries again a few times, so that leases change
			// hands often.
			err := gormlease.ErrLeaseHeld
			for attempt := 0; attempt < 5 && errors.Is(err, gormlease.ErrLeaseHeld); attempt++ {
				if attempt > 0 {
					time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				}
				err = runOnce(slot, i)
			}
			var pe *gormlease.PanicError
			switch {
			case err == nil:
				count("saved")
			case errors.Is(err, gormlease.ErrLeaseHeld):
				count("refused: lease held")
			case errors.As(err, &pe):
				count("work panicked")
			case errors.Is(err, errFailed):
				count("work failed")
			case errors.Is(err, gormlease.ErrLeaseLost):
				count("lease lost (fenced)")
			case errors.Is(err, context.DeadlineExceeded):
				count("database call timed out")
			case errors.Is(err, gormlease.ErrInvalidArgument), errors.Is(err, gormlease.ErrCommitUnknown):
				t.Errorf("unexpected error: %v", err)
			default:
				// A connection lost under load (other test processes share
				// the server and kill backends): transient, and harmless to
				// the invariants checked below.
				count("database error")
				t.Logf("database error: %v", err)
			}
		})
	}

	assert.Zero(t, overlaps.Load(), "two works ran at once for one target")
	assert.Zero(t, badSaves.Load(), "saves not made under the current lease")
	for tg, gens := range saved {
		for gen, n := range gens {
			assert.Equal(t, 1, n, "%s generation %d saved %d times", tg, gen, n)
		}
		var res gormlease.JobResult
		require.NoError(t, db.Where("target_id = ?", tg).Take(&res).Error)
		maxGen := int64(0)
		for gen := range gens {
			maxGen = max(maxGen, gen)
		}
		assert.Equal(t, maxGen, res.Generation, "%s: the saved result is not the latest save", tg)
	}
	var held int64
	require.NoError(t, db.Model(&gormlease.JobLease{}).
		Where("target_id LIKE ? AND released_at IS NULL", prefix+"/%").Count(&held).Error)
	assert.Zero(t, held, "leases left held")
	summary := ""
	outcomes.Range(func(k, v any) bool {
		summary += fmt.Sprintf(" %s=%d", k, v.(*atomic.Int32).Load())
		return true
	})
	t.Logf("%d rounds of %d Runs over %d targets:%s", rounds, runs, targets, summary)

	// Nothing leaks: no Run left a goroutine of gormlease's behind (the
	// drivers' and pools' own goroutines come and go with connections,
	// which other tests open too). Heartbeat groups wind down after their
	// last Run: wait generously on a busy machine, and show what is left.
	deadline := time.Now().Add(30 * time.Second)
	for libraryGoroutines() != "" {
		if time.Now().After(deadline) {
			t.Fatalf("gormlease goroutines left 30s after the Runs:\n%s", libraryGoroutines())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stats := sqlDB.Stats()
	assert.Zero(t, stats.InUse, "connections still in use")
	assert.LessOrEqual(t, stats.OpenConnections, 4, "more open connections than the idle limit")
}

// runRound calls run(i) for i from 0 to n-1, each on a goroutine of its own,
// all released at once, and waits for them all.
func runRound(n int, run func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			run(i)
		}()
	}
	close(start)
	wg.Wait()
}

// libraryGoroutines returns the stacks of the goroutines that run
// gormlease's own code (not its tests'), or "" when there are none.
func libraryGoroutines() string {
	buf := make([]byte, 1<<20)
	var left []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "\ngithub.com/gormlease/gormlease.") {
			left = append(left, g)
		}
	}
	return strings.Join(left, "\n\n")
}
