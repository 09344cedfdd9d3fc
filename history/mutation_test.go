package history

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		faults: []string{FaultStall}, failovers: allFailovers, seed: seed(t), breakFence: true, runOnly: true}))
}

// With the Do mutation (the build tag gormlease_mutation_do_first_read,
// which puts back the old Do: a call whose first reads of the row cannot
// reach the database, and which so never saw the job in progress, runs
// the work again when its first read that works finds that job saved and
// released), the workers' calls of Do that begin while their connections
// are refused run a second job for a wave that saved. The checker must
// catch it.
func TestHistory_MutatedDoIsCaught_Postgres(t *testing.T) {
	t.Parallel()
	checkDoCaught(t, testdb.Postgres(t))
}

func TestHistory_MutatedDoIsCaught_MariaDB(t *testing.T) {
	t.Parallel()
	checkDoCaught(t, testdb.MySQL(t))
}

// doMutationTag is the build tag of the Do mutation, in the root package.
const doMutationTag = "gormlease_mutation_do_first_read"

func checkDoCaught(t *testing.T, s *testdb.Server) {
	bin := workerBinary(t, doMutationTag)
	o := runScenario(t, s, scenario{duration: duration(t, 30e9), workers: 4, targets: 1,
		faults: []string{FaultRefuse}, seed: seed(t), doOnly: true, workerBin: bin})
	require.NotZero(t, o.faults[FaultRefuse], "no connection was refused")
	kinds := map[string]int{}
	for _, v := range o.rep.Violations {
		kinds[v.Kind]++
	}
	assert.NotZero(t, kinds[ViolationDoRanAgain], "no second job of a wave found; violations: %v", kinds)
}

// workerBinary builds this package's test binary with the build tag tag,
// for the workers to run, and returns its path.
func workerBinary(t *testing.T, tag string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "history.test")
	args := []string{"test", "-c", "-o", bin, "-tags", tag}
	if raceEnabled {
		args = append(args, "-race")
	}
	started := time.Now()
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), out)
	t.Logf("the workers built with -tags %s in %v", tag, time.Since(started).Round(time.Millisecond))
	return bin
}

func checkCaught(t *testing.T, s *testdb.Server) {
	requireCaught(t, runScenario(t, s, scenario{duration: duration(t, 25e9), workers: 4, targets: 2,
		faults: []string{FaultStall}, seed: seed(t), breakFence: true, runOnly: true}))
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
