package gormlease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// A Do that begins while a job is live, but whose first reads of the row
// are refused (the server or a pooler turns its connections away), loads
// that job's result once its reads work again, after the job saved and
// released: it does not take the released row and run the work a second
// time.
func TestDo_FirstReadsRefusedSharesTheJobThatSavedMeanwhile(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		holder := newRunner(t, db)
		working, finish := make(chan struct{}), make(chan struct{})
		held := make(chan error, 1)
		go func() {
			_, err := holder.Run(context.Background(), target, func(context.Context) (string, error) {
				close(working)
				<-finish
				return "the holder's", nil
			}, gormlease.SaveJSON[string])
			held <- err
		}()
		<-working

		proxy := testdb.NewProxy(t, s.Addr)
		late := newRunner(t, s.OpenVia(t, proxy.Addr()), fast(100*time.Millisecond, 2*time.Second)...)
		proxy.Refuse()
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := goDo(t, ctx, late, target, func(context.Context) (string, error) {
			runs.Add(1)
			return "a second result", nil
		})
		// The Do watches the row only after its first read failed: the
		// proxy refused every connection since before the Do began.
		waitFor(t, 10*time.Second, "the Do watching "+target, func() bool { return waiters(t, target).Waits > 0 })

		close(finish)
		require.NoError(t, <-held)
		require.NoError(t, proxy.Admit())

		r := <-res
		require.NoError(t, r.err)
		assert.Equal(t, "the holder's", r.value)
		assert.True(t, r.shared, "shared")
		assert.Zero(t, runs.Load(), "the Do ran the work after the job it began under saved")
	})
}
