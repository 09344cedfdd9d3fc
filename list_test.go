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

// List reads each row's state on the database's clock (a live lease, one
// whose last heartbeat is older than the timeout it was acquired with, a
// released one), its age and time to expiry, keeps the targets under a
// prefix whose LIKE wildcards match only themselves, filters by state and
// pages through the rows in order.
func TestList_StatesPrefixAndPages(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := newRepository(t, db)
		base := newTarget(t) + "/a%_"
		live, expired, released := base+"live", base+"old", base+"rel"
		_, err := repo.Acquire(ctx, live, time.Hour)
		require.NoError(t, err)
		_, err = repo.Acquire(ctx, expired, time.Minute)
		require.NoError(t, err)
		age(t, s, db, expired, 2*time.Minute)
		l, err := repo.Acquire(ctx, released, time.Minute)
		require.NoError(t, err)
		require.NoError(t, repo.Release(ctx, l))
		// Targets that a prefix with unescaped wildcards would match.
		for _, other := range []string{newTarget(t), base[:len(base)-2] + "XYlive", base[:len(base)-2] + "%Ylive"} {
			_, err := repo.Acquire(ctx, other, time.Hour)
			require.NoError(t, err)
		}

		all, err := repo.List(ctx, gormlease.ListOptions{Prefix: base})
		require.NoError(t, err)
		require.Len(t, all, 3)
		byTarget := map[string]gormlease.LeaseInfo{}
		for _, li := range all {
			byTarget[li.TargetID] = li
			assert.Equal(t, li.TargetID, li.Key, "an ordinary row's key is its target")
		}
		assert.Equal(t, []string{live, expired, released}, []string{all[0].TargetID, all[1].TargetID, all[2].TargetID})
		if li := byTarget[live]; assert.Equal(t, gormlease.StateLive, li.State) {
			assert.Equal(t, time.Hour, li.Timeout)
			assert.Less(t, li.Age, time.Minute)
			assert.Greater(t, li.ExpiresIn, 59*time.Minute)
			assert.EqualValues(t, 1, li.Generation)
		}
		if li := byTarget[expired]; assert.Equal(t, gormlease.StateExpired, li.State) {
			assert.GreaterOrEqual(t, li.Age, 2*time.Minute)
			assert.Less(t, li.ExpiresIn, -59*time.Second)
		}
		if li := byTarget[released]; assert.Equal(t, gormlease.StateReleased, li.State) {
			assert.NotNil(t, li.ReleasedAt)
			assert.Zero(t, li.ExpiresIn)
		}

		for state, want := range map[gormlease.LeaseState]string{
			gormlease.StateLive: live, gormlease.StateExpired: expired, gormlease.StateReleased: released,
		} {
			got, err := repo.List(ctx, gormlease.ListOptions{Prefix: base, State: state})
			require.NoError(t, err)
			if assert.Len(t, got, 1, state) {
				assert.Equal(t, want, got[0].TargetID, state)
			}
		}

		var paged []string
		after := ""
		for range 5 {
			page, err := repo.List(ctx, gormlease.ListOptions{Prefix: base, After: after, Limit: 2})
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
	repo := newRepository(t, testdb.SQLite(t).DB(t))
	for _, o := range []gormlease.ListOptions{
		{State: "held"}, {Limit: -1}, {Limit: 10001}, {Prefix: "a\x00"},
	} {
		_, err := repo.List(context.Background(), o)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "%+v", o)
	}
}

// Get returns the timeout that the acquisition recorded.
func TestGet_ReturnsTimeout(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		target, _ := acquireNew(t, repo, 1500*time.Millisecond)
		row, found, err := repo.Get(context.Background(), target)
		require.NoError(t, err)
		require.True(t, found)
		require.NotNil(t, row.TimeoutMS)
		assert.EqualValues(t, 1500, *row.TimeoutMS)
	})
}

// oldLeaseTables is the lease table as the first version made it, before
// the columns that AutoMigrate adds.
var oldLeaseTables = map[string]string{
	"postgres": `CREATE TABLE job_lease (target_id varchar(255) PRIMARY KEY, lease_token uuid NOT NULL,
		generation bigint NOT NULL, holder varchar(255) NOT NULL DEFAULT '', updated_at timestamptz NOT NULL,
		released_at timestamptz)`,
	"mysql": `CREATE TABLE job_lease (target_id varbinary(255) NOT NULL PRIMARY KEY,
		lease_token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, generation bigint NOT NULL,
		holder varchar(255) NOT NULL DEFAULT '', updated_at datetime(6) NOT NULL, released_at datetime(6) NULL)`,
	"sqlite": `CREATE TABLE job_lease (target_id varchar(255) NOT NULL PRIMARY KEY, lease_token varchar(36) NOT NULL,
		generation integer NOT NULL, holder varchar(255) NOT NULL DEFAULT '', updated_at datetime NOT NULL,
		released_at datetime)`,
}

// AutoMigrate upgrades a lease table made before timeout_ms existed
// without losing its rows; such a row has no timeout, lists as expired,
// and its next acquisition records one and goes on with its generation.
func TestAutoMigrate_AddsTimeoutKeepingRows(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := s.OpenEmpty(t, nil)
		require.NoError(t, db.Exec(oldLeaseTables[s.Name]).Error)
		target := newTarget(t)
		require.NoError(t, db.Exec("INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at) VALUES (?, ?, 7, 'old', ?)",
			target, "6f1c1d56-2a8e-4a55-9f4c-3f1f0b6a8c11", s.Ago(time.Hour)).Error)
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db))

		repo := newRepository(t, db)
		got, err := repo.List(ctx, gormlease.ListOptions{})
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, "old", got[0].Holder)
		assert.EqualValues(t, 7, got[0].Generation)
		assert.Nil(t, got[0].TimeoutMS)
		assert.Equal(t, gormlease.StateExpired, got[0].State)
		assert.Zero(t, got[0].Timeout)

		l, err := repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		assert.EqualValues(t, 8, l.Generation)
		row, _, err := repo.Get(ctx, target)
		require.NoError(t, err)
		require.NotNil(t, row.TimeoutMS)
		assert.EqualValues(t, 60000, *row.TimeoutMS)
	})
}
