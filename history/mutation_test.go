package history

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/testdb"
)

// With the fence broken (WorkerConfig.BreakFence), the fenced commit no
// longer compares the token: a worker whose commit was stalled past its
// lease timeout saves over the holder that took the lease over meanwhile. The checker must catch it, by the direct
// check and by the model check.
func TestHistory_MutatedFenceIsCaught_Postgres(t *testing.T) {
	t.Parallel()
	checkCaught(t, testdb.Postgres(t))
}

func TestHistory_MutatedFenceIsCaught_MariaDB(t *testing.T) {
	t.Parallel()
	checkCaught(t, testdb.MySQL(t))
}

// On the Patroni cluster, the commit stalls come with failovers, and the
// checker reads the primary after the last heal.
func TestHistory_MutatedFenceIsCaught_Patroni(t *testing.T) {
	t.Parallel()
	c := testdb.SharedPatroni(t)
	requireCaught(t, runPatroniScenario(t, c, scenario{duration: duration(t, 45e9), workers: 4, targets: 2,
		faults: []string{FaultStall}, failovers: allFailovers, seed: seed(t), breakFence: true}))
}

func checkCaught(t *testing.T, s *testdb.Server) {
	requireCaught(t, runScenario(t, s, scenario{duration: duration(t, 25e9), workers: 4, targets: 2,
		faults: []string{FaultStall}, seed: seed(t), breakFence: true}))
}

func requireCaught(t *testing.T, o outcome) {
	require.NotZero(t, o.faults[FaultStall], "no commit was stalled")
	kinds := map[string]int{}
	for _, v := range o.rep.Violations {
		kinds[v.Kind]++
	}
	assert.NotZero(t, kinds[ViolationStaleSave], "no stale save found; violations: %v", kinds)
	assert.NotZero(t, kinds[ViolationNotLinearizable], "the model check found nothing; violations: %v", kinds)
}
