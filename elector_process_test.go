package gormlease_test

import (
	"fmt"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/testdb"
)

// nextLine waits for the next line that one of procs prints, up to
// timeout, and returns that process and its line.
func nextLine(t *testing.T, procs []*proc, timeout time.Duration) (*proc, string) {
	t.Helper()
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(timeout))}}
	for _, p := range procs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.lines)})
	}
	i, v, ok := reflect.Select(cases)
	if i == 0 {
		t.Fatalf("no process printed anything for %v", timeout)
	}
	p := procs[i-1]
	if !ok {
		t.Fatalf("%s exited", p.name)
	}
	return p, v.String()
}

// without returns procs without p.
func without(procs []*proc, p *proc) []*proc {
	var out []*proc
	for _, q := range procs {
		if q != p {
			out = append(out, q)
		}
	}
	return out
}

// An Elector's standby in another process leads within the lease timeout
// plus one heartbeat interval of its leader's process dying (SIGKILL) or
// freezing (SIGSTOP), under the next fencing term; the frozen leader, once
// it runs again, finds itself deposed.
func TestElector_ProcessFailover(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const timeout, interval = 2 * time.Second, 500 * time.Millisecond
		require.NotEmpty(t, s.DSN, "%s cannot be opened from another process", s.Name)
		role := newTarget(t)
		var procs []*proc
		for i := range 3 {
			p := startProc(t, s.DSN, fmt.Sprintf("e%d", i),
				helperLeaseTimeoutEnv+"="+timeout.String(), helperIntervalEnv+"="+interval.String())
			p.expect("ready")
			procs = append(procs, p)
		}
		for _, p := range procs {
			p.send("lead " + role)
		}
		leader, line := nextLine(t, procs, 20*time.Second)
		var gen int64
		_, err := fmt.Sscanf(line, "leading %d", &gen)
		require.NoError(t, err, "from %s: %q", leader.name, line)

		// failover ends the leader's process with sig, and returns the
		// standby that leads next, under the next term.
		failover := func(sig syscall.Signal) *proc {
			t.Helper()
			standbys := without(procs, leader)
			leader.signal(sig)
			sent := time.Now()
			next, line := nextLine(t, standbys, 20*time.Second)
			took := time.Since(sent)
			require.Equal(t, fmt.Sprintf("leading %d", gen+1), line, "from %s after %s of %s", next.name, sig, leader.name)
			t.Logf("%s: %s leads %v after %s of %s", s.Name, next.name, took, sig, leader.name)
			require.LessOrEqual(t, took, timeout+interval, "failover after %s", sig)
			gen++
			return next
		}

		killed := leader
		leader = failover(syscall.SIGKILL)
		procs = without(procs, killed)

		frozen := leader
		leader = failover(syscall.SIGSTOP)
		frozen.signal(syscall.SIGCONT)
		frozen.expect(fmt.Sprintf("deposed %d", gen-1))
		// Only one leads: the thawed leader campaigns no more, and the
		// new one is not deposed.
		leader.expectNothing(2 * interval)
	})
}
