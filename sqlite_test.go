package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// A DSN whose busy timeout is missing or too short is refused up front, by
// NewRepository, NewRunner and AutoMigrate, with an error that says how to
// fix it, rather than failing later with "database is locked". The driver's
// own default (a minute, when the DSN sets no PRAGMA) is accepted.
func TestSQLite_RefusesDSNWithoutBusyTimeout(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	for _, ms := range []string{"0", "500"} {
		t.Run("busy_timeout="+ms, func(t *testing.T) {
			db := s.Open(t, map[string]string{"busy_timeout": ms})
			_, err := gormlease.NewRepository(db)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.ErrorContains(t, err, "busy_timeout is")
			assert.ErrorContains(t, err, "_pragma=busy_timeout(10000)")
			_, err = gormlease.NewRunner[string](db)
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			err = gormlease.AutoMigrate(context.Background(), db)
			assert.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.ErrorContains(t, err, "database is locked")
		})
	}
	t.Run("FilesAreInWALMode", func(t *testing.T) {
		// The test files are switched to WAL once, when made, not by each
		// connection (which can fail with "database is locked" when two
		// open a new file at once); every connection still finds WAL.
		for name, db := range map[string]*gorm.DB{"shared": s.DB(t), "empty": s.OpenEmpty(t, nil)} {
			var mode string
			require.NoError(t, db.Raw("PRAGMA journal_mode").Scan(&mode).Error)
			assert.Equal(t, "wal", mode, name)
		}
	})
	t.Run("DriverDefault", func(t *testing.T) {
		db := s.Open(t, map[string]string{"busy_timeout": "", "journal_mode": "", "synchronous": ""})
		var ms int64
		require.NoError(t, db.Raw("PRAGMA busy_timeout").Scan(&ms).Error)
		require.EqualValues(t, time.Minute.Milliseconds(), ms, "the driver's default busy timeout")
		_, err := gormlease.NewRepository(db)
		assert.NoError(t, err)
		assert.NoError(t, gormlease.AutoMigrate(context.Background(), db))
	})
}

// The fenced commit holds SQLite's write lock from its first statement,
// even when the DSN asks for deferred transactions: a write from another
// connection cannot get in while the commit runs.
func TestSQLite_FenceTakesWriteLockWhateverTxlock(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	deferred := s.Open(t, map[string]string{"_txlock": "deferred"})
	impatient := s.Open(t, map[string]string{"busy_timeout": "0"}) // fails at once on a held lock
	repo := newRepository(t, deferred)
	ctx := context.Background()
	target := newTarget(t)
	l, err := repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	// Other tests write to the same file: after the commit, wait for
	// the lock as any writer would.
	patient := s.Open(t, map[string]string{"busy_timeout": "10000"})
	write := func(db *gorm.DB) error {
		return db.Exec("UPDATE job_lease SET holder = holder WHERE target_id = ?", target).Error
	}
	require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
		err := write(impatient)
		assert.ErrorContains(t, err, "database is locked", "another connection wrote during the fenced commit")
		return gormlease.SaveJSON(tx, "x")
	}))
	assert.NoError(t, write(patient), "after the commit")
}
