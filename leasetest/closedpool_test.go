package leasetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// On a pool that the test closed, every helper fails the test at once,
// saying why, and writes nothing.
func TestHelpers_ClosedPoolFailsAtOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, open *gorm.DB) {
		db := s.Open(t, nil)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())
		target := newTarget(t)
		for name, helper := range map[string]func(tb testing.TB){
			"Occupy":   func(tb testing.TB) { leasetest.Occupy(tb, db, target) },
			"TakeOver": func(tb testing.TB) { leasetest.TakeOver(tb, db, target) },
			"Expire":   func(tb testing.TB) { leasetest.Expire(tb, db, target) },
			"State":    func(tb testing.TB) { leasetest.State(tb, db, target) },
			"WaitFor": func(tb testing.TB) {
				leasetest.WaitFor(tb, db, target, admin.StateReleased, time.Minute)
			},
		} {
			begin := time.Now()
			msg := fails(t, helper)
			took := time.Since(begin)
			assert.Contains(t, msg, "leasetest."+name, name)
			assert.Contains(t, msg, "database is closed", name)
			assert.Less(t, took, 2*time.Second, "%s failed the test after %v: %s", name, took, msg)
		}
		_, found := leasetest.State(t, open, target)
		assert.False(t, found, "a lease row written")
	})
}
