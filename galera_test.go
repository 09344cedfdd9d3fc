package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The tests on a MariaDB Galera cluster of three nodes (see testdb.Galera).
// They run one after the other, never in parallel: some stop, pause or
// kill a node, and start it again before they end.

// galeraFixture is the shared cluster, with a pool on each node and a
// checking pool whose reads wait for the cluster (wsrep_sync_wait=1).
type galeraFixture struct {
	c     *testdb.Galera
	nodes []*gorm.DB // nodes[i] is on node i+1
	check *gorm.DB
}

func newGaleraFixture(t *testing.T) *galeraFixture {
	t.Helper()
	c := testdb.SharedGalera(t)
	f := &galeraFixture{c: c, check: c.Node(1).Open(t, map[string]string{"wsrep_sync_wait": "1"})}
	for _, n := range c.Nodes() {
		f.nodes = append(f.nodes, n.Open(t, nil))
	}
	return f
}

// galeraOpts are the Runner options of the tests that do not time leases.
func galeraOpts(extra ...gormlease.Option) []gormlease.Option {
	return append([]gormlease.Option{
		gormlease.WithHeartbeatInterval(time.Second),
		gormlease.WithLeaseTimeout(10 * time.Second),
		gormlease.WithSafetyMargin(time.Second),
		gormlease.WithOperationTimeout(8 * time.Second),
	}, extra...)
}

// newRepo makes a Repository on db, failing t on error.
func newRepo(t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Repository {
	t.Helper()
	r, err := gormlease.NewRepository(db, opts...)
	require.NoError(t, err)
	return r
}

// Races: Runners on the three nodes start Runs on the same targets at once.
// Each target has exactly one winner, whose result is saved; every other
// Run gets ErrLeaseHeld, never a driver error (Galera's certification
// failures, error 1213, are retried or turned into ErrLeaseHeld).
func TestGalera_RacesHaveOneWinnerPerTarget(t *testing.T) {
	f := newGaleraFixture(t)
	const rounds, targets, perNode = 8, 6, 2
	var runners []*gormlease.Runner[string]
	for _, db := range f.nodes {
		for range perNode {
			runners = append(runners, newRunner(t, db, galeraOpts()...))
		}
	}
	var runs, held, winners atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		for range targets {
			target := newTarget(t)
			var losers sync.WaitGroup
			losers.Add(len(runners) - 1)
			allTried := make(chan struct{})
			go func() { losers.Wait(); close(allTried) }()
			start := make(chan struct{})
			var won atomic.Int64
			for i, r := range runners {
				wg.Go(func() {
					<-start
					v, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
						won.Add(1)
						select { // hold the lease until every other Run was refused
						case <-allTried:
						case <-time.After(30 * time.Second):
							return "", errors.New("the other Runs never returned")
						}
						return fmt.Sprintf("node %d", i/perNode+1), nil
					}, gormlease.SaveJSON[string])
					runs.Add(1)
					switch {
					case err == nil:
						winners.Add(1)
						got, _, loadErr := gormlease.LoadJSON[string](context.Background(), f.check, target)
						assert.NoError(t, loadErr)
						assert.Equal(t, v, got)
					case errors.Is(err, gormlease.ErrLeaseHeld):
						held.Add(1)
						losers.Done()
					default:
						t.Errorf("round %d, %s: Run on node %d: %v", round, target, i/perNode+1, err)
						losers.Done()
					}
				})
			}
			close(start)
			wg.Wait()
			assert.EqualValues(t, 1, won.Load(), "%s: Runs whose work ran", target)
		}
	}
	assert.EqualValues(t, rounds*targets, winners.Load(), "winners")
	assert.EqualValues(t, rounds*targets*(len(runners)-1), held.Load(), "Runs refused with ErrLeaseHeld")
	t.Logf("%d Runs on %d targets from %d Runners on 3 nodes: %d winners, %d refused with ErrLeaseHeld",
		runs.Load(), rounds*targets, len(runners), winners.Load(), held.Load())
}

// Stale holder: a holder on node 1 that stopped heartbeating, whose lease
// was taken over on node 2, saves nothing, whether the takeover came
// before its fenced commit or while the commit ran. (On one server the
// takeover would wait for the commit; on Galera it does not, and the
// commit fails certification.)
func TestGalera_StaleHolderSavesNothing(t *testing.T) {
	f := newGaleraFixture(t)
	holder := newRepo(t, f.nodes[0])
	contender := newRepo(t, f.nodes[1])
	const timeout = time.Second
	takeOver := func(t *testing.T, target string) gormlease.Lease {
		t.Helper()
		var l gormlease.Lease
		waitFor(t, 10*time.Second, "the takeover on node 2", func() bool {
			var err error
			l, err = contender.Acquire(context.Background(), target, timeout)
			if err != nil && !errors.Is(err, gormlease.ErrLeaseHeld) {
				t.Fatalf("acquire on node 2: %v", err)
			}
			return err == nil
		})
		return l
	}
	check := func(t *testing.T, target string, err error, taken gormlease.Lease) {
		t.Helper()
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		_, _, loadErr := gormlease.LoadJSON[string](context.Background(), f.check, target)
		require.ErrorIs(t, loadErr, gormlease.ErrNoResult, "the stale holder's result was saved")
		row := leaseRow(t, f.check, target)
		assert.Equal(t, taken.Token, row.LeaseToken)
		assert.Nil(t, row.ReleasedAt)
		assert.Nil(t, row.SavedGeneration)
	}

	t.Run("TakenOverBeforeCommit", func(t *testing.T) {
		target, l := acquireNew(t, holder, timeout)
		taken := takeOver(t, target)
		err := holder.CommitIfOwner(context.Background(), l, func(tx *gorm.DB) error {
			return gormlease.SaveJSON(tx, "stale")
		})
		check(t, target, err, taken)
	})

	t.Run("TakenOverDuringCommit", func(t *testing.T) {
		target, l := acquireNew(t, holder, timeout)
		var taken gormlease.Lease
		calls := 0
		err := holder.CommitIfOwner(context.Background(), l, func(tx *gorm.DB) error {
			calls++
			if err := gormlease.SaveJSON(tx, "stale"); err != nil {
				return err
			}
			if calls == 1 {
				// The holder's transaction locks the row on node 1 only:
				// the takeover on node 2 does not wait for it.
				taken = takeOver(t, target)
			}
			return nil
		})
		check(t, target, err, taken)
		assert.Equal(t, 1, calls, "saver calls")
	})
}

// Own heartbeat: a heartbeat of the holder itself, sent through node 2
// while its fenced commit runs on node 1, makes that commit fail
// certification although the lease is still the holder's. The commit is
// tried again, the saver runs a second time, and the result is saved once.
func TestGalera_OwnHeartbeatOnAnotherNodeKeepsTheResult(t *testing.T) {
	f := newGaleraFixture(t)
	holder := gormlease.WithHolder("spread-over-two-nodes")
	r := newRunner(t, f.nodes[0], galeraOpts(holder, gormlease.WithHeartbeatDB(f.nodes[1]))...)
	beater := newRepo(t, f.nodes[1], holder)
	target := newTarget(t)
	var calls int
	var gen int64
	got, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		l, _ := gormlease.LeaseFromContext(ctx)
		gen = l.Generation
		return "kept", nil
	}, func(tx *gorm.DB, result string) error {
		calls++
		if err := gormlease.SaveJSON(tx, result); err != nil {
			return err
		}
		if calls == 1 {
			// The row is locked and changed on node 1, uncommitted; the
			// heartbeat on node 2 commits first.
			l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
			require.NoError(t, beater.Heartbeat(context.Background(), l))
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, "kept", got)
	assert.Equal(t, 2, calls, "saver calls: the first commit failed certification, the second saved")
	saved, res, err := gormlease.LoadJSON[string](context.Background(), f.check, target)
	require.NoError(t, err)
	assert.Equal(t, "kept", saved)
	assert.Equal(t, gen, res.Generation)
	row := leaseRow(t, f.check, target)
	assert.NotNil(t, row.ReleasedAt)
	require.NotNil(t, row.SavedGeneration)
	assert.Equal(t, gen, *row.SavedGeneration)
}

// Reads: Get waits for its node to apply the writes committed elsewhere
// (wsrep_sync_wait=1), so it shows a takeover made on another node even
// when a plain read on its node does not show it yet. Node 2 is kept from
// applying by FLUSH TABLES WITH READ LOCK, which pauses its replication.
func TestGalera_GetSeesTakeoverOnAnotherNode(t *testing.T) {
	f := newGaleraFixture(t)
	first := newRepo(t, f.nodes[0])
	reader := newRepo(t, f.nodes[1])
	target, old := acquireNew(t, first, time.Minute)
	_, _, err := reader.Get(context.Background(), target) // node 2 has the row
	require.NoError(t, err)

	sqlDB, err := f.nodes[1].DB()
	require.NoError(t, err)
	pause, err := sqlDB.Conn(context.Background())
	require.NoError(t, err)
	defer pause.Close()
	_, err = pause.ExecContext(context.Background(), "FLUSH TABLES WITH READ LOCK")
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, err := pause.ExecContext(context.Background(), "UNLOCK TABLES")
			require.NoError(t, err)
		}
	}
	defer unlock()

	// The takeover, on node 1: the holder releases, another acquires.
	require.NoError(t, first.Release(context.Background(), old))
	taken, err := first.Acquire(context.Background(), target, time.Minute)
	require.NoError(t, err)

	var plain gormlease.JobLease
	require.NoError(t, f.nodes[1].Raw("SELECT * FROM job_lease WHERE target_id = ?", target).Scan(&plain).Error)
	assert.Equal(t, old.Token, plain.LeaseToken, "a plain read on node 2 shows the lease before the takeover")

	type got struct {
		row gormlease.JobLease
		err error
	}
	done := make(chan got, 1)
	go func() {
		row, _, err := reader.Get(context.Background(), target)
		done <- got{row, err}
	}()
	// Get either answered (with what node 2 has) or waits for node 2 to
	// catch up; only then may node 2 apply again.
	var early *got
	waitFor(t, 10*time.Second, "Get to answer or wait for node 2", func() bool {
		select {
		case g := <-done:
			early = &g
			return true
		default:
		}
		var n int64
		require.NoError(t, f.nodes[1].Raw(`SELECT count(*) FROM information_schema.PROCESSLIST
			WHERE INFO LIKE 'SET STATEMENT wsrep_sync_wait%'`).Scan(&n).Error)
		return n > 0
	})
	unlock()
	g := early
	if g == nil {
		r := recv(t, done, 30*time.Second, "Get")
		g = &r
	}
	require.NoError(t, g.err)
	assert.Equal(t, taken.Token, g.row.LeaseToken, "Get showed the lease as it was before the takeover")
}
