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

// ForceRelease ends a lease by force, fenced: a new token no one holds,
// the next generation, the release time and a failure that waiters read;
// the holder's heartbeat, fenced commit and release are refused with
// ErrLeaseLost, and the next acquisition goes on above the holder's
// generation. A lease already released, or a target never acquired, has
// nothing to end: ErrNotHeld.
func TestForceRelease_FencesTheHolder(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := newRepository(t, db)
		target, l := acquireNew(t, repo, time.Hour)

		row, err := repo.ForceRelease(ctx, target)
		require.NoError(t, err)
		assert.Equal(t, l.Generation+1, row.Generation)
		assert.NotEqual(t, l.Token, row.LeaseToken)
		assert.NotNil(t, row.ReleasedAt)
		if assert.NotNil(t, row.Failure) {
			assert.Equal(t, "released by force by an operator", *row.Failure)
		}

		require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost)
		saved := false
		require.ErrorIs(t, repo.CommitIfOwner(ctx, l, func(*gorm.DB) error { saved = true; return nil }), gormlease.ErrLeaseLost)
		assert.False(t, saved, "the saver ran")
		require.ErrorIs(t, repo.Release(ctx, l), gormlease.ErrLeaseLost)

		_, err = repo.ForceRelease(ctx, target)
		require.ErrorIs(t, err, gormlease.ErrNotHeld, "released already")
		_, err = repo.ForceRelease(ctx, newTarget(t))
		require.ErrorIs(t, err, gormlease.ErrNotHeld, "never acquired")

		next, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, l.Generation+2, next.Generation)
	})
}

// A Run whose lease is released by force has its work cancelled with
// ErrLeaseLost at its next heartbeat, and saves nothing.
func TestForceRelease_CancelsRunningWork(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		r := newRunner(t, db, fast(50*time.Millisecond, 2*time.Second)...)
		target := newTarget(t)
		inside := make(chan struct{})
		res := goRun(context.Background(), r, target, func(ctx context.Context) (string, error) {
			close(inside)
			<-ctx.Done()
			return "", context.Cause(ctx)
		}, noSave(t))
		recv(t, inside, 10*time.Second, "the work to start")
		_, err := repo.ForceRelease(context.Background(), target)
		require.NoError(t, err)
		require.ErrorIs(t, recv(t, res, 10*time.Second, "Run").err, gormlease.ErrLeaseLost)
	})
}
