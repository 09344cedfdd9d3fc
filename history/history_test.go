package history

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/gormlease/gormlease/internal/testdb"
)

// Several worker processes, with different heartbeat intervals, lease
// timeouts and operation timeouts, run Run loops on three targets while
// the driver pauses, cuts, stalls and crashes them: the checker finds no
// violation in their logs and the database's records.
func TestHistory_Postgres(t *testing.T) {
	t.Parallel()
	checkScenario(t, testdb.Postgres(t), allFaults)
}

func TestHistory_MariaDB(t *testing.T) {
	t.Parallel()
	checkScenario(t, testdb.MySQL(t), allFaults)
}

// On SQLite, processes on one file: pauses and crashes (no server, so no
// connection to kill or stall).
func TestHistory_SQLite(t *testing.T) {
	t.Parallel()
	checkScenario(t, testdb.SQLite(t), []string{FaultPause, FaultCrash})
}

// On the Patroni cluster (etcd and three members in strict synchronous
// mode), through its multi-host DSN: the faults above, and in each fault
// phase a failover (a postmaster kill, a Patroni kill that leaves the old
// primary running, a switchover, in turn), healed before the next, during
// which the operator pauses, stops and resumes a target, sending each call
// until it lands. The checker judges the Runs by the primary after the
// last heal.
func TestHistory_Patroni(t *testing.T) {
	t.Parallel()
	started := time.Now()
	c := testdb.SharedPatroni(t)
	t.Logf("the Patroni cluster ready after %v", time.Since(started).Round(time.Millisecond))
	o := runPatroniScenario(t, c, scenario{duration: duration(t, 45e9), workers: 4, targets: 3,
		faults: allFaults, failovers: allFailovers, seed: seed(t)})
	assert.Empty(t, o.rep.Violations, "violations")
	assert.NotZero(t, o.rep.Saves, "nothing saved")
	assert.NotZero(t, o.rep.Windows, "no quiet window was checked")
	assert.NotZero(t, failovers(o), "no failover was injected")
	assert.NotZero(t, o.faults[operatedAcrossFailover], "no operator action overlapped a failover")
}

// failovers counts o's failovers.
func failovers(o outcome) int {
	n := 0
	for _, kind := range allFailovers {
		n += o.faults[kind]
	}
	return n
}

var allFaults = []string{FaultPause, FaultKill, FaultCrash, FaultStall, FaultRefuse}

func checkScenario(t *testing.T, s *testdb.Server, faults []string) {
	o := runScenario(t, s, scenario{duration: duration(t, 30e9), workers: 4, targets: 3, faults: faults, seed: seed(t)})
	assert.Empty(t, o.rep.Violations, "violations")
	assert.NotZero(t, o.rep.Saves, "nothing saved")
	assert.NotZero(t, o.rep.Windows, "no quiet window was checked")
}
