package recipes_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/recipes"
)

var migrateMu sync.Mutex

// versionTable makes the SchemaVersion table, once at a time in this
// process, and starts each test with no version recorded.
func versionTable(t *testing.T, db *gorm.DB) {
	t.Helper()
	migrateMu.Lock()
	defer migrateMu.Unlock()
	require.NoError(t, db.AutoMigrate(&recipes.SchemaVersion{}))
}

// Four pods start at once, each on a pool of its own: the migration runs
// once, and every pod returns only after it is recorded. A later start
// runs nothing.
func TestMigrateOnce_FourPodsMigrateOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		versionTable(t, db)
		version := newTarget(t)
		var calls atomic.Int64
		migrate := func(ctx context.Context, db *gorm.DB) error {
			calls.Add(1)
			time.Sleep(200 * time.Millisecond) // a migration takes a while
			return nil
		}
		const pods = 4
		errs := make([]error, pods)
		var wg sync.WaitGroup
		for i := range pods {
			pool := s.Open(t, nil)
			runner := newRunner[bool](t, pool, gormlease.WithHolder("pod-"+string(rune('a'+i))))
			wg.Go(func() {
				errs[i] = recipes.MigrateOnce(context.Background(), pool, runner, version, migrate)
				if errs[i] == nil {
					var n int64
					errs[i] = pool.Model(&recipes.SchemaVersion{}).Where("version = ?", version).Count(&n).Error
					if errs[i] == nil && n != 1 {
						errs[i] = errors.New("returned before the version was recorded")
					}
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "pod %d", i)
		}
		assert.EqualValues(t, 1, calls.Load(), "the migration ran more than once")

		require.NoError(t, recipes.MigrateOnce(context.Background(), db, newRunner[bool](t, db), version, migrate))
		assert.EqualValues(t, 1, calls.Load(), "a later start ran the migration again")
	})
}

// A migration that fails records nothing: the next pod in line runs it.
func TestMigrateOnce_AFailedMigrationIsTriedByTheNextPod(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		versionTable(t, db)
		version := newTarget(t)
		runner := newRunner[bool](t, db)
		failed := errors.New("the disk is full")
		var calls atomic.Int64
		migrate := func(ctx context.Context, db *gorm.DB) error {
			if calls.Add(1) == 1 {
				return failed
			}
			return nil
		}
		require.ErrorIs(t, recipes.MigrateOnce(context.Background(), db, runner, version, migrate), failed)
		require.NoError(t, recipes.MigrateOnce(context.Background(), db, runner, version, migrate))
		require.NoError(t, recipes.MigrateOnce(context.Background(), db, runner, version, migrate))
		assert.EqualValues(t, 2, calls.Load())
		assert.ErrorIs(t, recipes.MigrateOnce(context.Background(), db, runner, "", migrate), gormlease.ErrInvalidArgument)
	})
}
