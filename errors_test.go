package gormlease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Every error that gormlease returns reads "gormlease: " once, at the start,
// however many layers wrapped it, and still matches its sentinel.
func TestErrors_PrefixOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		r := newRunner(t, db)
		fastRunner := newRunner(t, db, fast(50*time.Millisecond, time.Minute)...)
		repo := r.Repository()
		ok := func(context.Context) (string, error) { return "x", nil }
		type failure struct {
			name string
			err  error
			is   error // the sentinel it must match, or nil
		}
		var got []failure
		add := func(name string, err error, is error) { got = append(got, failure{name, err, is}) }

		heldTarget, held := acquireNew(t, repo, time.Minute)
		_, err := r.Run(ctx, heldTarget, ok, noSave(t))
		add("Held", err, gormlease.ErrLeaseHeld)

		_, err = fastRunner.Run(ctx, newTarget(t), func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			steal(t, s, db, l.TargetID)
			select { // the heartbeat finds the lease lost
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("the heartbeat did not find the lease lost")
			}
			return "", context.Cause(ctx)
		}, noSave(t))
		add("LostOnHeartbeat", err, gormlease.ErrLeaseLost)

		_, err = r.Run(ctx, newTarget(t), func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			steal(t, s, db, l.TargetID) // no heartbeat before the commit
			return "x", nil
		}, noSave(t))
		add("LostOnCommit", err, gormlease.ErrLeaseLost)

		steal(t, s, db, heldTarget)
		add("HeartbeatLost", repo.Heartbeat(ctx, held), gormlease.ErrLeaseLost)
		add("CommitIfOwnerLost", repo.CommitIfOwner(ctx, held, func(*gorm.DB) error { return nil }), gormlease.ErrLeaseLost)
		add("ReleaseLost", repo.Release(ctx, held), gormlease.ErrLeaseLost)

		_, err = r.Run(ctx, "", ok, noSave(t))
		add("InvalidTarget", err, gormlease.ErrInvalidArgument)
		tx := db.Begin()
		require.NoError(t, tx.Error)
		_, err = gormlease.NewRunner[string](db, gormlease.WithHeartbeatDB(tx))
		require.NoError(t, tx.Rollback().Error)
		add("InvalidHeartbeatDB", err, gormlease.ErrInvalidArgument)
		_, err = gormlease.NewRunner[string](db, gormlease.WithLeaseTimeout(-1))
		add("InvalidOption", err, gormlease.ErrInvalidArgument)

		boom := errors.New("boom")
		_, err = r.Run(ctx, newTarget(t), func(context.Context) (string, error) { return "", boom }, noSave(t))
		add("WorkError", err, boom)
		_, err = r.Run(ctx, newTarget(t), ok, func(*gorm.DB, string) error { return boom })
		add("SaveError", err, boom)
		_, err = r.Run(ctx, newTarget(t), ok, func(tx *gorm.DB, _ string) error { return tx.Commit().Error })
		add("SaverCommits", err, nil)
		_, err = r.Run(ctx, newTarget(t), func(context.Context) (string, error) { panic("boom") }, noSave(t))
		add("WorkPanics", err, nil)
		_, err = r.Run(ctx, newTarget(t), ok, func(*gorm.DB, string) error { panic(boom) })
		add("SavePanics", err, boom)
		cctx, cancel := context.WithCancel(ctx)
		_, err = r.Run(cctx, newTarget(t), func(context.Context) (string, error) { cancel(); return "", nil }, noSave(t))
		add("Cancelled", err, context.Canceled)
		_, _, err = gormlease.LoadJSON[string](ctx, db, newTarget(t))
		add("NoResult", err, gormlease.ErrNoResult)
		if s.Name == "mysql" {
			err = gormlease.AutoMigrate(context.Background(), s.OpenEmpty(t, map[string]string{"parseTime": "false"}))
			add("MigrateRefused", err, gormlease.ErrInvalidArgument)
		}

		for _, f := range got {
			require.Error(t, f.err, f.name)
			msg := f.err.Error()
			assert.True(t, strings.HasPrefix(msg, "gormlease: "), "%s: %q", f.name, msg)
			assert.Equal(t, 1, strings.Count(msg, "gormlease:"), "%s: %q", f.name, msg)
			if f.is != nil {
				assert.ErrorIs(t, f.err, f.is, f.name)
			}
		}
	})
}
