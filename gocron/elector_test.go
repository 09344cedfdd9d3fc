package gormleasegocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	gormleasegocron "github.com/gormlease/gormlease/gocron"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

func newElector(t *testing.T, ctx context.Context, db *gorm.DB, role, holder string) *gormleasegocron.DistributedElector {
	t.Helper()
	e, err := gormleasegocron.NewDistributedElector(ctx, db, role, append(fast(), gormlease.WithHolder(holder))...)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// waitLeader waits until one of electors leads, and returns it.
func waitLeader(t *testing.T, electors ...*gormleasegocron.DistributedElector) *gormleasegocron.DistributedElector {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range electors {
			if e.IsLeader(context.Background()) == nil {
				return e
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no elector leads")
	return nil
}

// Of two Electors one leads: its IsLeader returns nil and its Term carries
// the role's lease; the other's returns ErrNotLeader. When the leader is
// closed it resigns, and the other leads.
func TestDistributedElector_OneLeadsAndCloseHandsOver(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newKey(t)
		a := newElector(t, context.Background(), db, role, "elector-a")
		b := newElector(t, context.Background(), db, role, "elector-b")
		leader := waitLeader(t, a, b)
		other, otherName := b, "elector-b"
		if leader == b {
			other, otherName = a, "elector-a"
		}
		require.ErrorIs(t, other.IsLeader(context.Background()), gormleasegocron.ErrNotLeader)
		_, err := other.Term()
		require.ErrorIs(t, err, gormleasegocron.ErrNotLeader)
		term, err := leader.Term()
		require.NoError(t, err)
		lease, ok := gormlease.LeaseFromContext(term)
		require.True(t, ok)
		info, leads, err := other.Leader(context.Background())
		require.NoError(t, err)
		require.True(t, leads)
		assert.Equal(t, lease.Generation, info.Generation)

		closed := time.Now()
		leader.Close()
		assert.Error(t, term.Err(), "the term goes on after Close")
		require.ErrorIs(t, leader.IsLeader(context.Background()), gormleasegocron.ErrNotLeader)
		assert.Same(t, other, waitLeader(t, other))
		t.Logf("%s led %v after the leader was closed", otherName, time.Since(closed))
		// The resignation wakes the standby; it does not wait for the
		// 2s lease timeout.
		assert.Less(t, time.Since(closed), 2*time.Second)
		next, err := other.Term()
		require.NoError(t, err)
		nextLease, _ := gormlease.LeaseFromContext(next)
		assert.Greater(t, nextLease.Generation, lease.Generation, "the term did not grow")
	})
}

// A leader deposed by a takeover stops leading: its term is cancelled with
// ErrLeaseLost and IsLeader returns ErrNotLeader; its writes fenced by the
// term are refused. It campaigns again, and leads once the role is free.
func TestDistributedElector_DeposedLeaderStopsAndCampaignsAgain(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newKey(t)
		e := newElector(t, context.Background(), db, role, "elector")
		waitLeader(t, e)
		term, err := e.Term()
		require.NoError(t, err)
		lease, _ := gormlease.LeaseFromContext(term)

		thief := leasetest.TakeOver(t, db, role)
		select {
		case <-term.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the deposed leader's term goes on")
		}
		require.ErrorIs(t, context.Cause(term), gormlease.ErrLeaseLost)
		require.ErrorIs(t, e.IsLeader(context.Background()), gormleasegocron.ErrNotLeader)
		err = e.Repository().CommitIfOwner(context.Background(), lease, func(tx *gorm.DB) error { return nil })
		require.ErrorIs(t, err, gormlease.ErrLeaseLost, "a deposed leader's write was not refused")

		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		require.NoError(t, repo.Release(context.Background(), thief))
		waitLeader(t, e)
	})
}

// The campaign ends with its context, and Close then waits for it; the
// lease is released.
func TestDistributedElector_EndsWithItsContext(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newKey(t)
		ctx, cancel := context.WithCancel(context.Background())
		e := newElector(t, ctx, db, role, "elector")
		waitLeader(t, e)
		cancel()
		e.Close()
		require.ErrorIs(t, e.IsLeader(context.Background()), gormleasegocron.ErrNotLeader)
		info, ok := leasetest.State(t, db, role)
		require.True(t, ok)
		assert.Equal(t, admin.StateReleased, info.State)
		e.Close() // again: returns at once
	})
}

// A campaign that fails with an error that waiting cannot cure (here, a
// lease table that does not exist) ends at once, and IsLeader says why,
// instead of campaigning again every second without a word.
func TestDistributedElector_IncurableErrorEndsTheCampaign(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		missing := "no_such_lease"
		e, err := gormleasegocron.NewDistributedElector(context.Background(), db, newKey(t),
			append(fast(), gormlease.WithTableNames(missing, missing+"_result"))...)
		require.NoError(t, err)
		defer e.Close()
		deadline := time.Now().Add(5 * time.Second)
		for err = e.IsLeader(context.Background()); err == gormleasegocron.ErrNotLeader; err = e.IsLeader(context.Background()) {
			if time.Now().After(deadline) {
				t.Fatal("the campaign did not end on a missing table within 5s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.ErrorIs(t, err, gormleasegocron.ErrNotLeader)
		require.ErrorContains(t, err, missing, "IsLeader does not say why the campaign ended")
	})
}

// Bad input gets an error wrapping ErrInvalidArgument, and starts nothing.
func TestDistributedElector_BadInput(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	//lint:ignore SA1012 a nil context is the bad input under test
	_, err := gormleasegocron.NewDistributedElector(nil, db, "role")
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = gormleasegocron.NewDistributedElector(context.Background(), db, "")
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = gormleasegocron.NewDistributedElector(context.Background(), db, "role", gormlease.WithLeaseTimeout(-time.Millisecond))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
}
