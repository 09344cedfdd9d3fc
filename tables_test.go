package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// WithTableNames moves every step, and the result helpers, to the tables it
// names: nothing touches the default tables.
func TestTableNames_EveryStepUsesTheNamedTables(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		names := gormlease.WithTableNames("app_lease", "app_result")
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db, names))
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db, names), "on tables that exist")
		r, err := gormlease.NewRunner[string](db, append(fast(20*time.Millisecond, time.Second), names)...)
		require.NoError(t, err)
		target := newTarget(t)

		got, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			// Let a few batched heartbeats renew the lease in app_lease.
			var before time.Time
			require.NoError(t, db.Table("app_lease").Select("updated_at").Where("target_id = ?", target).Scan(&before).Error)
			waitFor(t, 5*time.Second, "a heartbeat in app_lease", func() bool {
				var now time.Time
				require.NoError(t, db.Table("app_lease").Select("updated_at").Where("target_id = ?", target).Scan(&now).Error)
				return now.After(before)
			})
			return "report", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.Equal(t, "report", got)

		assert.Zero(t, countRows(t, db, &gormlease.JobLease{}, target), "a row in job_lease")
		assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "a row in job_result")
		row, found, err := admin.New(r.Repository()).Get(context.Background(), target)
		require.NoError(t, err)
		require.True(t, found)
		assert.EqualValues(t, 1, row.Generation)
		assert.NotNil(t, row.ReleasedAt)

		loaded, res, err := gormlease.LoadJSON[string](context.Background(), db, target, names)
		require.NoError(t, err)
		assert.Equal(t, "report", loaded)
		assert.EqualValues(t, 1, res.Generation)
		_, _, err = gormlease.LoadJSON[string](context.Background(), db, target)
		assert.ErrorIs(t, err, gormlease.ErrNoResult, "LoadJSON without the option reads job_result")

		// Fencing holds in the named table: a stolen lease saves nothing.
		repo, err := gormlease.NewRepository(db, names)
		require.NoError(t, err)
		l, err := repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err)
		require.NoError(t, db.Table("app_lease").Where("target_id = ?", target).
			Update("lease_token", "00000000-0000-4000-8000-000000000001").Error)
		err = repo.CommitIfOwner(context.Background(), l, func(*gorm.DB) error {
			t.Error("saver called on a stolen lease")
			return nil
		})
		assert.ErrorIs(t, err, gormlease.ErrLeaseLost)
		assert.ErrorIs(t, repo.Heartbeat(context.Background(), l), gormlease.ErrLeaseLost)
	})
}

// gorm's TablePrefix does not move the leases: without WithTableNames they
// stay in job_lease, so that a gorm setting cannot split the leases of a
// running application between two tables.
func TestTableNames_GormTablePrefixDoesNotApply(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		prefixed := db.Session(&gorm.Session{NewDB: true})
		prefixed.Config = &gorm.Config{}
		*prefixed.Config = *db.Config
		prefixed.NamingStrategy = schema.NamingStrategy{TablePrefix: "pfx_"}
		r := newRunner(t, prefixed)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) { return "x", nil },
			func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		assert.EqualValues(t, 1, countRows(t, db, &gormlease.JobLease{}, target))
	})
}

// A bad table name is refused with an error that names the problem, and
// nothing is created.
func TestTableNames_BadNamesWriteNothing(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		for _, c := range []struct{ lease, result, want string }{
			{"", "r", "empty"},
			{"Lease", "r", "'L'"},
			{"a;drop", "r", "';'"},
			{"a.b.c", "r", "more than one dot"},
			{"1lease", "r", "digit"},
			{"same", "same", "must differ"},
			{"l", "r-x", "'-'"},
		} {
			names := gormlease.WithTableNames(c.lease, c.result)
			err := gormlease.AutoMigrate(context.Background(), db, names)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "%q/%q", c.lease, c.result)
			assert.ErrorContains(t, err, c.want)
			_, err = gormlease.NewRunner[string](db, names)
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			_, err = gormlease.NewRepository(db, names)
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			_, _, err = gormlease.LoadJSON[string](context.Background(), db, "t", names)
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		}
		assert.False(t, db.Migrator().HasTable("same"))
		assert.False(t, db.Migrator().HasTable("l"))
	})
}
