package gormlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// missingAtOnce bounds how long a step may take to report missing tables:
// well under DefaultOperationTimeout and the reconnect window, within
// which a step that retried would still be trying.
const missingAtOnce = 5 * time.Second

// requireMissing requires err to wrap ErrMissingTables, to name each of
// names and to say how to make the tables.
func requireMissing(t *testing.T, err error, what string, names ...string) {
	t.Helper()
	require.ErrorIs(t, err, gormlease.ErrMissingTables, "%s: %v", what, err)
	for _, name := range names {
		assert.Contains(t, err.Error(), name, what)
	}
	assert.Contains(t, err.Error(), "create the tables with gormlease.AutoMigrate, or run `gormlease migrate`", what)
}

// Every step on a database without the tables returns, at once and after
// one attempt, an error that wraps ErrMissingTables, names the lease table
// and says how to make it: Repository.Acquire, Run, RunWait, Do, and
// Elector.Lead, whose campaign would otherwise go on.
func TestMissingTables_StepsReturnAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		empty, st := recording(s.OpenEmpty(t, nil))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		work := func(context.Context) (string, error) { t.Error("work ran"); return "", nil }
		target := newTarget(t)
		lease := `"job_lease"`

		repo, err := gormlease.NewRepository(empty)
		require.NoError(t, err)
		r := newRunner(t, empty)
		e := newElector(t, empty, "missing-"+target)
		steps(st)
		for _, step := range []struct {
			name string
			run  func() error
		}{
			{"Acquire", func() error { _, err := repo.Acquire(ctx, target, time.Minute); return err }},
			{"AcquireSlot", func() error { _, err := repo.AcquireSlot(ctx, target, 2, time.Minute); return err }},
			{"Run", func() error { _, err := r.Run(ctx, target, work, noSave(t)); return err }},
			{"RunWait", func() error { _, err := r.RunWait(ctx, target, work, noSave(t)); return err }},
			{"Do", func() error {
				_, _, err := r.Do(ctx, target, work, noSave(t), func(*gorm.DB) (string, error) { return "", nil })
				return err
			}},
			{"Lead", func() error {
				return e.Lead(ctx, func(context.Context) error { t.Error("led"); return nil })
			}},
		} {
			begin := time.Now()
			err := step.run()
			took := time.Since(begin)
			requireMissing(t, err, step.name, lease)
			assert.Less(t, took, missingAtOnce, "%s took %v", step.name, took)
			// One attempt: at most the few statements of one acquire (or of
			// Do's first read and its acquire), never a retry's more.
			sent := steps(st)
			assert.NotEmpty(t, sent, step.name)
			assert.LessOrEqual(t, len(sent), 3, "%s sent %d statements: %q", step.name, len(sent), sent)
		}

		// admin's steps report it alike.
		op := admin.New(repo)
		_, _, err = op.Get(ctx, target)
		requireMissing(t, err, "admin Get", lease)
		_, err = op.List(ctx, admin.ListOptions{})
		requireMissing(t, err, "admin List", lease)
	})
}

// CheckTables is nil on the tables AutoMigrate made, names every table
// missing on an empty database, and names a column missing from a table
// made without it, until AutoMigrate adds it back.
func TestRepository_CheckTables(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, newRepository(t, db).CheckTables(ctx))

		empty, err := gormlease.NewRepository(s.OpenEmpty(t, nil))
		require.NoError(t, err)
		requireMissing(t, empty.CheckTables(ctx), "empty database", `table "job_lease"`, `table "job_lease_floor"`, `table "job_result"`)

		n := targetSeq.Add(1)
		lease, result := fmt.Sprintf("held_check_%d", n), fmt.Sprintf("held_check_result_%d", n)
		opt := gormlease.WithTableNames(lease, result)
		t.Cleanup(func() {
			for _, table := range []string{lease, lease + "_floor", result} {
				assert.NoError(t, db.Exec("DROP TABLE IF EXISTS "+table).Error)
			}
		})
		require.NoError(t, gormlease.AutoMigrate(ctx, db, opt))
		repo, err := gormlease.NewRepository(db, opt)
		require.NoError(t, err)
		require.NoError(t, repo.CheckTables(ctx))

		require.NoError(t, db.Exec("ALTER TABLE "+lease+" DROP COLUMN stop_by").Error)
		err = repo.CheckTables(ctx)
		requireMissing(t, err, "no stop_by", fmt.Sprintf(`column "stop_by" of table %q`, lease))
		assert.NotContains(t, err.Error(), `table "`+result+`"`)
		// A step that reads the column says so too.
		_, _, err = admin.New(repo).Get(ctx, "some-target")
		requireMissing(t, err, "admin Get without stop_by", `"stop_by"`)

		require.NoError(t, db.Exec("DROP TABLE "+result).Error)
		requireMissing(t, repo.CheckTables(ctx), "no stop_by, no result table",
			fmt.Sprintf(`column "stop_by" of table %q`, lease), fmt.Sprintf(`table %q`, result))

		require.NoError(t, gormlease.AutoMigrate(ctx, db, opt))
		require.NoError(t, repo.CheckTables(ctx))
	})
}

// A result table missing alone (the lease tables exist) is met by the
// save, after the work has run: Run's error wraps ErrMissingTables and
// names the result table, and so does LoadJSON's, at once.
func TestMissingTables_ResultTableAlone(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n := targetSeq.Add(1)
		lease, result := fmt.Sprintf("noresult_%d", n), fmt.Sprintf("noresult_result_%d", n)
		opt := gormlease.WithTableNames(lease, result)
		t.Cleanup(func() {
			for _, table := range []string{lease, lease + "_floor", result} {
				assert.NoError(t, db.Exec("DROP TABLE IF EXISTS "+table).Error)
			}
		})
		require.NoError(t, gormlease.AutoMigrate(ctx, db, opt))
		require.NoError(t, db.Exec("DROP TABLE "+result).Error)
		target := newTarget(t)

		r := newRunner(t, db, opt)
		ran := 0
		begin := time.Now()
		_, err := r.Run(ctx, target, func(context.Context) (string, error) { ran++; return "done", nil }, gormlease.SaveJSON[string])
		took := time.Since(begin)
		requireMissing(t, err, "Run's save", fmt.Sprintf("%q", result))
		assert.Equal(t, 1, ran, "the work ran once, before the save met the missing table")
		assert.Less(t, took, missingAtOnce, "Run took %v", took)

		begin = time.Now()
		_, _, err = gormlease.LoadJSON[string](ctx, db, target, opt)
		took = time.Since(begin)
		requireMissing(t, err, "LoadJSON", fmt.Sprintf("%q", result))
		assert.Less(t, took, missingAtOnce, "LoadJSON took %v", took)
	})
}
