package history

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

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

// After a clean run, its history is corrupted in the event table, one
// flaw at a time, each in a transaction that is rolled back: an event
// deleted, a how changed (an acquisition's, which the audit log
// contradicts, and an end's, which the worker's call does), an operator's
// event deleted, and, the table's key dropped, a seq made a duplicate.
// The checker, reading the table as after any run, must find each.
func TestHistory_MutatedEventsAreCaught_Postgres(t *testing.T) {
	t.Parallel()
	checkEventsCaught(t, testdb.Postgres(t), allFaults)
}

func TestHistory_MutatedEventsAreCaught_MariaDB(t *testing.T) {
	t.Parallel()
	checkEventsCaught(t, testdb.MySQL(t), allFaults)
}

func TestHistory_MutatedEventsAreCaught_SQLite(t *testing.T) {
	t.Parallel()
	checkEventsCaught(t, testdb.SQLite(t), []string{FaultPause, FaultCrash})
}

// errRollback rolls a corruption's transaction back.
var errRollback = errors.New("rolled back")

func checkEventsCaught(t *testing.T, s *testdb.Server, faults []string) {
	d := serverDatabase(t, s)
	o := runOn(t, d, scenario{duration: duration(t, 15e9), workers: 3, targets: 2, faults: faults, seed: seed(t)})
	require.Empty(t, o.rep.Violations, "the clean run")
	require.NotZero(t, o.rep.Events, "no event was recorded")
	ctx := context.Background()

	// corrupt runs stmts (each a statement and its arguments) in a
	// transaction, checks the run with the events read there, and rolls
	// it back; Check must report want.
	corrupt := func(name, want string, stmts ...[]any) {
		t.Helper()
		err := d.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			for _, st := range stmts {
				require.NoError(t, tx.Exec(st[0].(string), st[1:]...).Error, "%s: %s", name, st[0])
			}
			events, err := ReadEvents(ctx, tx)
			require.NoError(t, err)
			in := o.in
			in.LeaseEvents = events
			got := kinds(Check(in))
			t.Logf("%s: found %v", name, got)
			assert.NotZero(t, got[want], "%s: %q not found; found %v", name, want, got)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
	}
	// first finds the first event that is k's.
	first := func(k func(e LeaseEvent) bool) LeaseEvent {
		t.Helper()
		i := slices.IndexFunc(o.in.LeaseEvents, k)
		require.GreaterOrEqual(t, i, 0, "no such event")
		return o.in.LeaseEvents[i]
	}
	saved := first(func(e LeaseEvent) bool { return e.Kind == "ended" && e.How == "saved" })
	// An end is a row of its own, or, on PostgreSQL, the second half of
	// its generation's row (seq - 1, with end_cause): each corruption of
	// one is two statements, of which one finds its row.
	corrupt("an end deleted", ViolationEventMissing,
		[]any{"DELETE FROM job_lease_event WHERE target_id = ? AND seq = ?", saved.Target, saved.Seq},
		[]any{"UPDATE job_lease_event SET ended_at = NULL, end_cause = NULL, operator = NULL, detail = NULL" +
			" WHERE target_id = ? AND seq = ? AND end_cause IS NOT NULL", saved.Target, saved.Seq - 1})
	released := first(func(e LeaseEvent) bool { return e.Kind == "acquired" && e.How == "released" })
	corrupt("an acquisition's how changed", ViolationEventWrong,
		[]any{"UPDATE job_lease_event SET how = 'seized' WHERE target_id = ? AND seq = ?", released.Target, released.Seq})
	corrupt("a save's end changed to a failure", ViolationEventOutcome,
		[]any{"UPDATE job_lease_event SET how = 'failed', detail = 'boom' WHERE target_id = ? AND seq = ?", saved.Target, saved.Seq},
		[]any{"UPDATE job_lease_event SET end_cause = 'failed', detail = 'boom' WHERE target_id = ? AND seq = ? AND end_cause IS NOT NULL",
			saved.Target, saved.Seq - 1})
	paused := first(func(e LeaseEvent) bool { return e.Kind == "paused" })
	corrupt("a pause's event deleted", ViolationEventMissing,
		[]any{"DELETE FROM job_lease_event WHERE target_id = ? AND seq = ?", paused.Target, paused.Seq})

	// The key dropped (for good: the run is over), a seq made the same as
	// the one before.
	switch d.name {
	case "postgres":
		require.NoError(t, d.db.Exec("ALTER TABLE job_lease_event DROP CONSTRAINT job_lease_event_pkey").Error)
	case "mysql":
		require.NoError(t, d.db.Exec("ALTER TABLE job_lease_event DROP PRIMARY KEY").Error)
	case "sqlite":
		// No DROP CONSTRAINT: a copy without the key takes the table's
		// name (the lease table's triggers follow the old one).
		require.NoError(t, d.db.Exec("ALTER TABLE job_lease_event RENAME TO job_lease_event_keyed").Error)
		require.NoError(t, d.db.Exec("CREATE TABLE job_lease_event AS SELECT * FROM job_lease_event_keyed").Error)
	default:
		t.Fatalf("no way to drop the event table's key on %s", d.name)
	}
	corrupt("a seq duplicated", ViolationEventSeq,
		[]any{"UPDATE job_lease_event SET seq = seq - 1 WHERE target_id = ? AND seq = ?", paused.Target, paused.Seq})
}
