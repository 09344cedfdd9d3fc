package gormlease_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
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

// Patroni tests run on the process's Patroni cluster (testdb.SharedPatroni):
// three members in synchronous mode and a one-node etcd, with no watchdog.
// Each test fails the cluster over in one way, checks what the Runs
// returned against what the new primary holds, and heals the cluster
// before it ends. They do not run in parallel: they share the cluster.

// patroniOptions are the settings of issue 18's reproduction: heartbeats
// every 200 ms, a lease timeout of 2 s (a trust window of 1.8 s) and an
// operation timeout of 3 s.
func patroniOptions() []gormlease.Option {
	return []gormlease.Option{
		gormlease.WithHeartbeatInterval(200 * time.Millisecond),
		gormlease.WithLeaseTimeout(2 * time.Second),
		gormlease.WithOperationTimeout(3 * time.Second),
	}
}

// patroniSaves is a test's result table on the cluster: one row per save,
// with no unique key, so that a second save of a target shows as a second
// row. It is made on the primary, which copies it to the synchronous
// standby before the CREATE returns.
type patroniSaves struct{ table string }

func newPatroniSaves(t *testing.T, db *gorm.DB) patroniSaves {
	t.Helper()
	s := patroniSaves{table: "patroni_saves_" + strings.ToLower(strings.TrimPrefix(t.Name(), "TestPatroni_"))}
	require.NoError(t, db.Exec("DROP TABLE IF EXISTS "+s.table).Error)
	require.NoError(t, db.Exec("CREATE TABLE "+s.table+
		" (id bigserial PRIMARY KEY, target_id text NOT NULL, generation bigint NOT NULL)").Error)
	return s
}

// save is the Runs' saver: it records the save under the lease's generation.
func (s patroniSaves) save(tx *gorm.DB, _ string) error {
	l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
	return tx.Exec("INSERT INTO "+s.table+" (target_id, generation) VALUES (?, ?)", l.TargetID, l.Generation).Error
}

// byTarget reads every target's saves from db, by generation.
func (s patroniSaves) byTarget(t *testing.T, db *gorm.DB) map[string][]int64 {
	t.Helper()
	var rows []struct {
		TargetID   string
		Generation int64
	}
	require.NoError(t, db.Raw("SELECT target_id, generation FROM "+s.table+" ORDER BY id").Scan(&rows).Error)
	m := map[string][]int64{}
	for _, r := range rows {
		m[r.TargetID] = append(m[r.TargetID], r.Generation)
	}
	return m
}

// stormOutcome is what one Run of a storm returned.
type stormOutcome struct {
	target     string
	generation int64 // 0 when the work never ran
	err        error
}

// storm runs Runs on new targets from many goroutines until stopped: each
// Run's work takes 50 to 1,000 ms (so that heartbeats renew it), and its
// saver holds the fenced transaction open 0 to 100 ms after its insert (so
// that some Runs are in their commit at any moment).
type storm struct {
	r     *gormlease.Runner[string]
	saves patroniSaves

	mu       sync.Mutex
	outcomes []stormOutcome
	saved    atomic.Int64
}

// run runs workers goroutines until stop is closed, and returns once every
// Run has returned.
func (s *storm) run(t *testing.T, workers int, stop <-chan struct{}) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				target := newTarget(t)
				var gen int64
				_, err := s.r.Run(ctx, target, func(ctx context.Context) (string, error) {
					l, _ := gormlease.LeaseFromContext(ctx)
					gen = l.Generation
					select {
					case <-time.After(time.Duration(50+rand.IntN(950)) * time.Millisecond):
						return "result", nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}, func(tx *gorm.DB, v string) error {
					if err := s.saves.save(tx, v); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
					return nil
				})
				if err == nil {
					s.saved.Add(1)
				}
				s.mu.Lock()
				s.outcomes = append(s.outcomes, stormOutcome{target, gen, err})
				s.mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond) // the cluster is away: do not spin
				}
			}
		})
	}
	wg.Wait()
}

// libraryError reports whether err is one of the library's: a named
// sentinel, or an error that the library wrapped with the step it failed
// in ("gormlease: <step>: ..."), never a driver's error as it came.
func libraryError(err error) bool {
	return errors.Is(err, gormlease.ErrLeaseLost) || errors.Is(err, gormlease.ErrCommitUnknown) ||
		errors.Is(err, gormlease.ErrLeaseHeld) || strings.HasPrefix(err.Error(), "gormlease: ")
}

// quoted matches the quoted targets in errors' messages, which the log of
// the kinds of errors leaves out.
var quoted = regexp.MustCompile(`"[^"]*"`)

// check checks the storm's outcomes against the saves that db, a pool on
// the new primary, holds: no target saved twice, every Run that returned
// nil saved on the new primary, no Run that returned another error than
// ErrCommitUnknown saved, and every error a library error. It returns the
// count of each kind of outcome, for the log.
func (s *storm) check(t *testing.T, db *gorm.DB) map[string]int {
	t.Helper()
	all := s.saves.byTarget(t, db)
	kinds := map[string]int{}
	for _, o := range s.outcomes {
		switch {
		case o.err == nil:
			kinds["saved"]++
			assert.Equal(t, []int64{o.generation}, all[o.target],
				"%s: Run returned nil, but the new primary does not hold its one save", o.target)
		case errors.Is(o.err, gormlease.ErrCommitUnknown):
			kinds["commit unknown"]++
			assert.LessOrEqual(t, len(all[o.target]), 1, "%s: saves", o.target)
		default:
			kinds[quoted.ReplaceAllString(errKind(o.err), "")]++
			assert.Empty(t, all[o.target], "%s: saved, though Run returned %v", o.target, o.err)
		}
		if o.err != nil {
			assert.True(t, libraryError(o.err), "%s: not a library error: %v", o.target, o.err)
		}
	}
	for target, gens := range all {
		assert.Len(t, gens, 1, "%s: saved twice", target)
	}
	return kinds
}

// stormFailover runs a storm of 50 Runs through the cluster's multi-host
// DSN, which lists the leader first, fails the leader with fault once the Runs have saved results, waits
// for a new leader, lets the storm go on for a few seconds more, heals the
// cluster and checks the outcomes on the new primary.
func stormFailover(t *testing.T, fault func(t *testing.T, leader *testdb.PatroniMember)) {
	c := testdb.SharedPatroni(t)
	old := c.Leader()
	require.NotNil(t, old, "no leader")
	db := c.Open(t, old)
	sv := newPatroniSaves(t, db)
	s := &storm{r: newRunner(t, db, patroniOptions()...), saves: sv}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { defer close(stopped); s.run(t, 50, stop) }()
	healed := false
	defer func() {
		if !healed {
			close(stop)
			<-stopped
			c.Heal(t)
		}
	}()
	waitFor(t, 30*time.Second, "the storm to save results", func() bool { return s.saved.Load() >= 50 })

	before := s.saved.Load()
	start := time.Now()
	fault(t, old)
	leader := c.WaitLeader(t, old, 30*time.Second)
	failover := time.Since(start)
	time.Sleep(3 * time.Second) // Runs go on after the failover: it takes a moment to see their effect
	close(stop)
	<-stopped
	healStart := time.Now()
	c.Heal(t)
	healed = true
	heal := time.Since(healStart)

	kinds := s.check(t, leader.Open(t))
	t.Logf("failover from %s to %s in %v; healed in %v; %d Runs (%d saved before the fault): %v",
		old.Name(), leader.Name(), failover.Round(time.Millisecond), heal.Round(time.Millisecond),
		len(s.outcomes), before, kinds)
}

// TestPatroni_KillPostmaster kills the leader's postmaster with SIGKILL
// while 50 Runs work, commit and heartbeat through the multi-host DSN:
// Patroni (primary_start_timeout 0) promotes the synchronous standby. No
// target is saved twice, every Run that returned nil has its save on the
// new primary, and every other Run returned a library error.
func TestPatroni_KillPostmaster(t *testing.T) {
	stormFailover(t, func(t *testing.T, leader *testdb.PatroniMember) { leader.KillPostmaster(t) })
}

// TestPatroni_KillPatroni kills the leader's Patroni with SIGKILL while 50
// Runs work, commit and heartbeat through the multi-host DSN. Its
// PostgreSQL stays up and read-write, first in the DSN, until the test
// heals the cluster (Patroni then rewinds it and makes it a replica): its
// commits wait for a synchronous standby that has been promoted, and those
// that the client gives up on commit there locally. No Run may return nil
// for a save that the new primary lacks.
func TestPatroni_KillPatroni(t *testing.T) {
	stormFailover(t, func(t *testing.T, leader *testdb.PatroniMember) { leader.KillPatroni(t) })
}
