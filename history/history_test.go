//go:build !gormlease_mutate_fence

package history

import (
	"testing"

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

var allFaults = []string{FaultPause, FaultKill, FaultCrash, FaultStall}

func checkScenario(t *testing.T, s *testdb.Server, faults []string) {
	o := runScenario(t, s, scenario{duration: duration(t, 30e9), workers: 4, targets: 3, faults: faults, seed: seed(t)})
	assert.Empty(t, o.rep.Violations, "violations")
	assert.NotZero(t, o.rep.Saves, "nothing saved")
	assert.NotZero(t, o.rep.Windows, "no quiet window was checked")
}
