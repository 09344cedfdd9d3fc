package gormlease_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// doProc is a helper process that calls Runner.Do (see helperProcess), with
// the lines its works and savers printed.
type doProc struct {
	*proc
	working []string // "working GEN" lines
	savers  int      // "saver" lines
}

// startDoProcs starts n helper processes on s's database, ready, with
// leases that expire after leaseTimeout without a heartbeat.
func startDoProcs(t *testing.T, s *testdb.Server, n int, leaseTimeout time.Duration) []*doProc {
	t.Helper()
	require.NotEmpty(t, s.DSN, "%s cannot be opened from another process", s.Name)
	procs := make([]*doProc, n)
	for i := range procs {
		procs[i] = &doProc{proc: startProc(t, s.DSN, fmt.Sprintf("p%d", i),
			helperLeaseTimeoutEnv+"="+leaseTimeout.String())}
	}
	for _, p := range procs {
		p.expect("ready")
	}
	return procs
}

// line returns the helper's next line other than its works' and savers'.
func (p *doProc) line() string {
	p.t.Helper()
	for {
		switch line := p.next(); {
		case strings.HasPrefix(line, "working "):
			p.working = append(p.working, line)
		case line == "saver":
			p.savers++
		default:
			return line
		}
	}
}

// status asks the helper whether its n calls of Do on target hold the
// lease or wait for it, and returns "holding" or "waiting".
func (p *doProc) status(target string, n int) string {
	p.t.Helper()
	p.send(fmt.Sprintf("status %s %d", target, n))
	line := p.line()
	require.Contains(p.t, []string{"holding", "waiting"}, line, "status of %s", p.name)
	return line
}

// outcomes reads what the helper's n calls of Do returned.
func (p *doProc) outcomes(n int) []string {
	p.t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = p.line()
		require.Regexp(p.t, `^(result|error) `, out[i], "from %s", p.name)
	}
	return out
}

// noExpiry is a lease timeout that a heartbeat late on a loaded machine
// does not reach, for tests where no lease may expire.
const noExpiry = 30 * time.Second

// requireOneJob checks that every call of Do whose outcome a process
// printed returned value, and that exactly one got shared false.
func requireOneJob(t *testing.T, outcomes map[*doProc][]string, value string) {
	t.Helper()
	unshared := 0
	for p, outs := range outcomes {
		for _, out := range outs {
			switch out {
			case "result " + value + " unshared":
				unshared++
			case "result " + value + " shared":
			default:
				t.Errorf("%s: %q, want the result %s", p.name, out, value)
			}
		}
	}
	assert.Equal(t, 1, unshared, "callers that got shared false")
}

// Do across processes: 50 callers in 3 processes (each process's callers
// share one job in the process; the processes share through the database)
// all get the value that the one job saved. The work runs once, and
// exactly one caller in all gets shared false.
func TestDo_ProcessesShareOneJob(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		procs := startDoProcs(t, s, 3, noExpiry)
		callers := []int{17, 17, 16}
		for i, p := range procs {
			p.send(fmt.Sprintf("do %s %d from-%s hold", target, callers[i], p.name))
		}
		// Every caller has joined its process's job, and every job holds
		// the lease or has read it held, before the holder finishes.
		var holder *doProc
		for i, p := range procs {
			if p.status(target, callers[i]) == "holding" {
				if holder != nil {
					t.Fatalf("%s and %s both run the work", holder.name, p.name)
				}
				holder = p
			}
		}
		require.NotNil(t, holder, "no process runs the work")
		holder.send("finish")

		outcomes := map[*doProc][]string{}
		for i, p := range procs {
			outcomes[p] = p.outcomes(callers[i])
		}
		requireOneJob(t, outcomes, "from-"+holder.name)
		for _, p := range procs {
			if p == holder {
				assert.Equal(t, []string{"working 1"}, p.working, "works run in the holder")
				assert.Equal(t, 1, p.savers, "savers run in the holder")
			} else {
				assert.Empty(t, p.working, "%s ran the work too", p.name)
				assert.Zero(t, p.savers, "%s saved too", p.name)
			}
		}
		got, res, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "from-"+holder.name, got)
		assert.EqualValues(t, 1, res.Generation)
		row := leaseRow(t, db, target)
		assert.EqualValues(t, 1, row.Generation, "more than one acquisition")
		require.NotNil(t, row.SavedGeneration)
		assert.EqualValues(t, 1, *row.SavedGeneration)
	})
}

// Do across processes, with the holder frozen (SIGSTOP) past its lease
// timeout while callers in two other processes wait: exactly one of them
// takes the target over and runs the work, and every other caller gets its
// result. When the frozen holder resumes and its work returns, its save is
// refused with ErrLeaseLost: its saver never runs, and the saved result is
// the new holder's.
func TestDo_ProcessFrozenHolderTakenOver(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		// The frozen holder's lease expires when the test ages it, once
		// every caller waits for it: one that expired on its own could be
		// taken over, and the result saved, before the callers of a helper
		// that ran late began, which would rightly run the work again.
		procs := startDoProcs(t, s, 3, noExpiry)
		frozen, waiters := procs[0], procs[1:]
		frozen.send(fmt.Sprintf("do %s 1 from-%s hold", target, frozen.name))
		require.Equal(t, "holding", frozen.status(target, 1))
		frozen.signal(syscall.SIGSTOP)
		const n = 5
		for _, p := range waiters {
			p.send(fmt.Sprintf("do %s %d from-%s quick", target, n, p.name))
			require.Equal(t, "waiting", p.status(target, n))
		}
		age(t, s, db, target, 2*noExpiry) // the holder froze a minute ago
		outcomes := map[*doProc][]string{}
		for _, p := range waiters {
			outcomes[p] = p.outcomes(n)
		}
		var taker *doProc
		for _, p := range waiters {
			if len(p.working) > 0 {
				if taker != nil {
					t.Fatalf("%s and %s both took over", taker.name, p.name)
				}
				taker = p
				assert.Equal(t, []string{"working 2"}, p.working)
			}
		}
		require.NotNil(t, taker, "no waiter took over")
		requireOneJob(t, outcomes, "from-"+taker.name)

		// The frozen holder goes on as soon as it runs again.
		frozen.send("finish")
		frozen.signal(syscall.SIGCONT)
		out := frozen.outcomes(1)[0]
		assert.True(t, strings.HasPrefix(out, "error lost "), "the frozen holder's Do: %q", out)
		assert.Zero(t, frozen.savers, "the frozen holder's saver ran")

		got, res, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "from-"+taker.name, got)
		assert.EqualValues(t, 2, res.Generation)
		row := leaseRow(t, db, target)
		assert.EqualValues(t, 2, row.Generation)
		require.NotNil(t, row.SavedGeneration)
		assert.EqualValues(t, 2, *row.SavedGeneration)
		assert.NotNil(t, row.ReleasedAt, "the new holder's lease is not released")
	})
}

// Do across processes: a process whose callers wait for the holder dies
// (SIGKILL). The holder and the callers waiting in another process are
// unaffected: the holder saves, and the other waiters get its result.
func TestDo_WaiterProcessKilled(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		procs := startDoProcs(t, s, 3, noExpiry)
		holder, doomed, survivor := procs[0], procs[1], procs[2]
		holder.send(fmt.Sprintf("do %s 1 from-%s hold", target, holder.name))
		require.Equal(t, "holding", holder.status(target, 1))
		const n = 5
		for _, p := range []*doProc{doomed, survivor} {
			p.send(fmt.Sprintf("do %s %d from-%s quick", target, n, p.name))
			require.Equal(t, "waiting", p.status(target, n))
		}
		doomed.signal(syscall.SIGKILL)
		// Its output ends when it has died.
		waitFor(t, 20*time.Second, doomed.name+" to die", func() bool {
			_, open := <-doomed.lines
			return !open
		})
		holder.send("finish")

		assert.Equal(t, []string{"result from-" + holder.name + " unshared"}, holder.outcomes(1))
		for _, out := range survivor.outcomes(n) {
			assert.Equal(t, "result from-"+holder.name+" shared", out)
		}
		assert.Empty(t, survivor.working, "a waiter ran the work")
		row := leaseRow(t, db, target)
		assert.EqualValues(t, 1, row.Generation)
		require.NotNil(t, row.SavedGeneration)
		assert.EqualValues(t, 1, *row.SavedGeneration)
	})
}
