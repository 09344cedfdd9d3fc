package admin_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// A Pause that races the first acquire of a semaphore's slots, which makes
// the slot rows, leaves no slot free to take once it has returned: the two
// transactions are serialized on the target, so either the rows are made
// first and Pause pauses them, or Pause comes first and the rows are made
// paused. Run on many fresh targets, so that the two meet in every order.
func TestPause_RacingTheSlotRowsLeavesNoSlotFree(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo, op := newOperator(t, db)
		const rounds, n = 60, 3
		for i := range rounds {
			target := fmt.Sprintf("%s-%d", testkit.NewTarget(t), i)
			var wg sync.WaitGroup
			wg.Go(func() {
				l, err := repo.AcquireSlot(context.Background(), target, n, time.Minute)
				if err == nil {
					_ = repo.Release(context.Background(), l)
				}
			})
			wg.Go(func() { require.NoError(t, op.Pause(context.Background(), target, "race")) })
			wg.Wait()
			_, err := repo.AcquireSlot(context.Background(), target, n, time.Minute)
			require.ErrorIs(t, err, gormlease.ErrPaused, "round %d: a slot of the paused target was taken", i)
			var free int64
			require.NoError(t, db.Raw("SELECT COUNT(*) FROM job_lease WHERE target_id LIKE ? AND paused_at IS NULL",
				target+"\x1f%").Scan(&free).Error)
			require.Zero(t, free, "round %d: slot rows left unpaused", i)
		}
	})
}
