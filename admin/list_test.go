package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// List reads each row's state on the database's clock (a live lease, one
// whose last heartbeat is older than the timeout it was acquired with, a
// released one), its age and time to expiry, keeps the targets under a
// prefix whose LIKE wildcards match only themselves, filters by state and
// pages through the rows in order.
func TestList_StatesPrefixAndPages(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		base := testkit.NewTarget(t) + "/a%_"
		live, expired, released := base+"live", base+"old", base+"rel"
		_, err := repo.Acquire(ctx, live, time.Hour)
		require.NoError(t, err)
		_, err = repo.Acquire(ctx, expired, time.Minute)
		require.NoError(t, err)
		testkit.Age(t, s, db, expired, 2*time.Minute)
		l, err := repo.Acquire(ctx, released, time.Minute)
		require.NoError(t, err)
		require.NoError(t, repo.Release(ctx, l))
		// Targets that a prefix with unescaped wildcards would match.
		for _, other := range []string{testkit.NewTarget(t), base[:len(base)-2] + "XYlive", base[:len(base)-2] + "%Ylive"} {
			_, err := repo.Acquire(ctx, other, time.Hour)
			require.NoError(t, err)
		}

		all, err := op.List(ctx, admin.ListOptions{Prefix: base})
		require.NoError(t, err)
		require.Len(t, all, 3)
		byTarget := map[string]admin.LeaseInfo{}
		for _, li := range all {
			byTarget[li.TargetID] = li
			assert.Equal(t, li.TargetID, li.Key, "an ordinary row's key is its target")
		}
		assert.Equal(t, []string{live, expired, released}, []string{all[0].TargetID, all[1].TargetID, all[2].TargetID})
		if li := byTarget[live]; assert.Equal(t, admin.StateLive, li.State) {
			assert.Equal(t, time.Hour, li.Timeout)
			assert.Less(t, li.Age, time.Minute)
			assert.Greater(t, li.ExpiresIn, 59*time.Minute)
			assert.EqualValues(t, 1, li.Row.Generation)
		}
		if li := byTarget[expired]; assert.Equal(t, admin.StateExpired, li.State) {
			assert.GreaterOrEqual(t, li.Age, 2*time.Minute)
			assert.Less(t, li.ExpiresIn, -59*time.Second)
		}
		if li := byTarget[released]; assert.Equal(t, admin.StateReleased, li.State) {
			assert.NotNil(t, li.Row.ReleasedAt)
			assert.Zero(t, li.ExpiresIn)
		}

		for state, want := range map[admin.LeaseState]string{
			admin.StateLive: live, admin.StateExpired: expired, admin.StateReleased: released,
		} {
			got, err := op.List(ctx, admin.ListOptions{Prefix: base, State: state})
			require.NoError(t, err)
			if assert.Len(t, got, 1, state) {
				assert.Equal(t, want, got[0].TargetID, state)
			}
		}

		var paged []string
		after := ""
		for range 5 {
			page, err := op.List(ctx, admin.ListOptions{Prefix: base, After: after, Limit: 2})
			require.NoError(t, err)
			for _, li := range page {
				paged = append(paged, li.TargetID)
			}
			if len(page) < 2 {
				break
			}
			after = page[len(page)-1].TargetID
		}
		assert.Equal(t, []string{live, expired, released}, paged)
	})
}

// List refuses options it cannot honour, naming the option.
func TestList_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, op := newOperator(t, testdb.SQLite(t).DB(t))
	for _, o := range []admin.ListOptions{
		{State: "held"}, {Limit: -1}, {Limit: 10001}, {Prefix: "a\x00"},
	} {
		_, err := op.List(context.Background(), o)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "%+v", o)
	}
}

// Get returns the timeout that the acquisition recorded.
func TestGet_ReturnsTimeout(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo, op := newOperator(t, db)
		target, _ := testkit.AcquireNew(t, repo, 1500*time.Millisecond)
		row, found, err := op.Get(context.Background(), target)
		require.NoError(t, err)
		require.True(t, found)
		require.NotNil(t, row.TimeoutMS)
		assert.EqualValues(t, 1500, *row.TimeoutMS)
	})
}
