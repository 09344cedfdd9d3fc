package history

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/testdb"
)

// FaultNodeCrash kills a node of the Galera cluster (SIGKILL to its
// mariadbd) 2 to 3 s into a fault phase, starts it again 0.5 to 2 s after
// the others dropped it from the cluster (about 4 s), and lasts until it
// has rejoined (a state transfer from the others) and is synced.
const FaultNodeCrash = "node crash"

// The ways the workers of a Galera scenario reach the cluster.
const (
	// WritersSpread connects worker i to node 1 + (i mod 3): every node
	// takes writes at once, and the fenced commits of one target meet in
	// certification.
	WritersSpread = "spread"
	// WritersOne connects every worker to node 1, as a proxy that sends
	// the writes to one node does: the fenced commits meet in node 1's row
	// locks, and the other nodes only apply.
	WritersOne = "one"
)

// galeraSettings are the server settings a Galera scenario runs under.
type galeraSettings struct {
	// syncWait is the workers' wsrep_sync_wait (a session variable of
	// their connections): 0, the default, lets a read run on a node that
	// has not applied what the cluster committed; gormlease makes its
	// own causal reads where a step decides on a read.
	syncWait int
	// flush is every node's innodb_flush_log_at_trx_commit: 1 writes and
	// flushes the redo log at each commit, 2 writes it and flushes it once
	// a second, 0 does both once a second.
	flush int
	// writers is WritersSpread or WritersOne.
	writers string
}

// galeraSettingsFor reads the settings from GORMLEASE_HISTORY_GALERA_SYNC_WAIT
// (default 0), GORMLEASE_HISTORY_GALERA_FLUSH (default 0, as Galera's
// documentation recommends and as the harness starts its nodes) and
// GORMLEASE_HISTORY_GALERA_WRITERS (by default one or the other, by seed).
func galeraSettingsFor(t *testing.T, seed uint64) galeraSettings {
	s := galeraSettings{writers: WritersSpread}
	if seed%2 == 1 {
		s.writers = WritersOne
	}
	number := func(name string, dest *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, name)
			*dest = n
		}
	}
	number("GORMLEASE_HISTORY_GALERA_SYNC_WAIT", &s.syncWait)
	number("GORMLEASE_HISTORY_GALERA_FLUSH", &s.flush)
	if v := os.Getenv("GORMLEASE_HISTORY_GALERA_WRITERS"); v != "" {
		require.Contains(t, []string{WritersSpread, WritersOne}, v, "GORMLEASE_HISTORY_GALERA_WRITERS")
		s.writers = v
	}
	return s
}

// On the Galera cluster of three nodes (testdb.Galera), the workers
// spread over the nodes or all on one (galeraSettings): the faults of the
// other scenarios, and a node's crash in every other fault phase, the
// first among them. Once every node is back, the checker requires each
// node to hold as many saved results as node 1, and the same lease row
// changes and events, then judges the calls by node 1's records.
func TestHistory_Galera(t *testing.T) {
	t.Parallel()
	started := time.Now()
	c := testdb.SharedGalera(t)
	t.Logf("the Galera cluster ready after %v", time.Since(started).Round(time.Millisecond))
	sc := scenario{duration: duration(t, 40e9), workers: 4, targets: 3, faults: allFaults, seed: seed(t)}
	d, crashes := galeraDatabase(t, c, galeraSettingsFor(t, sc.seed))
	o := runOn(t, d, sc)
	assert.Empty(t, o.rep.Violations, "violations")
	assert.NotZero(t, o.rep.Saves, "nothing saved")
	assert.NotZero(t, o.rep.Windows, "no quiet window was checked")
	assert.NotZero(t, crashes.Load(), "no node was crashed")
}

var (
	galeraDatabases atomic.Int64
	galeraScenarios sync.Mutex
)

// galeraDatabase is a database of its own on the Galera cluster c, under
// settings s, and the count of the node crashes its fault phases inject.
// The records are read on every node, with causal reads; each node must
// hold as many saved results as node 1, and the same lease row changes
// (see galeraSchema) and events, and the calls are judged by node 1's.
func galeraDatabase(t *testing.T, c *testdb.Galera, s galeraSettings) (*database, *atomic.Int64) {
	// The process's scenarios on the cluster run one at a time: two node
	// crashes at once would leave the cluster without a majority, and each
	// sets innodb_flush_log_at_trx_commit on every node.
	galeraScenarios.Lock()
	t.Cleanup(galeraScenarios.Unlock) // after every other cleanup of the scenario
	name := fmt.Sprintf("history_%d_%d", os.Getpid(), galeraDatabases.Add(1))
	first := c.Node(1)
	require.NoError(t, first.Open(t, nil).Exec("CREATE DATABASE "+name).Error)
	t.Cleanup(func() { _ = first.Open(t, nil).Exec("DROP DATABASE " + name).Error })
	// in is the DSN of node n's database name, through addr, with params.
	in := func(n *testdb.GaleraNode, addr string, params map[string]string) string {
		cfg, err := mysqldriver.ParseDSN(n.DSN(params))
		require.NoError(t, err)
		cfg.Addr, cfg.DBName = addr, name
		return "mysql://" + cfg.FormatDSN()
	}
	setFlush := func(n *testdb.GaleraNode) {
		require.NoError(t, n.Open(t, nil).Exec(fmt.Sprintf("SET GLOBAL innodb_flush_log_at_trx_commit = %d", s.flush)).Error)
	}
	for _, n := range c.Nodes() {
		setFlush(n)
	}
	// The next test of the process finds the harness's setting.
	t.Cleanup(func() {
		for _, n := range c.Nodes() {
			_ = n.Open(t, nil).Exec("SET GLOBAL innodb_flush_log_at_trx_commit = 0").Error
		}
	})
	t.Logf("Galera settings: workers' wsrep_sync_wait=%d, innodb_flush_log_at_trx_commit=%d on every node, writers %s",
		s.syncWait, s.flush, s.writers)

	d := &database{name: "galera", db: openDB(t, in(first, first.Addr(), nil)), migrate: migrateGalera}
	for _, n := range c.Nodes() {
		d.addrs = append(d.addrs, n.Addr())
	}
	// Each worker has a node of its own (its proxies[0] names it), which
	// its incarnations connect to, unless a node crash is under way there:
	// then to the next node, as a load balancer sends new connections
	// away from a node that is down. (A worker that cannot reach its
	// database at startup tries again for up to 30 s: see RunWorker.)
	var (
		mu   sync.Mutex
		home = map[*testdb.Proxy]int{}
		down [3]atomic.Bool
	)
	d.workerDSN = func(proxies []*testdb.Proxy) string {
		mu.Lock()
		i, ok := home[proxies[0]]
		if !ok {
			if s.writers == WritersSpread {
				i = len(home) % len(proxies)
			}
			home[proxies[0]] = i
		}
		mu.Unlock()
		for down[i].Load() { // one node at a time crashes
			i = (i + 1) % len(proxies)
		}
		return in(c.Node(i+1), proxies[i].Addr(), map[string]string{"wsrep_sync_wait": strconv.Itoa(s.syncWait)})
	}
	d.read = func(t *testing.T) ([]Result, []Change, []LeaseEvent) {
		var results []Result
		var changes []Change
		var events []LeaseEvent
		for _, n := range c.Nodes() {
			db := openDB(t, in(n, n.Addr(), map[string]string{"wsrep_sync_wait": "1"}))
			r, ch, err := readDB(context.Background(), db, galeraSchema)
			require.NoError(t, err, "read node %d", n.N())
			evs, err := ReadEvents(context.Background(), db)
			require.NoError(t, err, "read node %d's events", n.N())
			if n == first {
				results, changes, events = r, ch, evs
				continue
			}
			require.Equal(t, len(results), len(r), "saved results on node %d and node 1", n.N())
			// The changes and the events are rows replicated as they are:
			// the same on every node.
			require.Equal(t, changes, ch, "lease row changes on node %d and node 1", n.N())
			require.Equal(t, events, evs, "events on node %d and node 1", n.N())
		}
		return results, changes, events
	}
	var crashes atomic.Int64
	phases := 0
	d.clusterFault = func(t *testing.T, rng *rand.Rand) (Fault, bool) {
		phases++
		if phases%2 == 0 {
			return Fault{}, false
		}
		i := rng.IntN(3)
		n, survivor := c.Node(1+i), c.Node(1+(i+1)%3)
		// No worker starts on it from now on; one that started just before
		// has 2 to 3 s to get through NewRunner first.
		down[i].Store(true)
		defer down[i].Store(false)
		time.Sleep(2*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond)
		// Held up: the survivors hold commits, and reads that wait for the
		// cluster (wsrep_sync_wait), until they have dropped the node.
		f := Fault{Kind: FaultNodeCrash, Worker: "cluster", Start: Micros(time.Now()), HeldUp: true}
		n.Kill(t)
		// It starts again once the others have dropped it, as after a
		// restart by a supervisor: a node that comes back while the others
		// still count it in may find the cluster stuck.
		survivor.WaitSize(t, 2)
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		n.Start(t)
		setFlush(n) // it starts with the harness's setting
		f.End = Micros(time.Now())
		crashes.Add(1)
		t.Logf("%s: node %d from %s to %s", f.Kind, n.N(), micros(f.Start), micros(f.End))
		return f, true
	}
	return d, &crashes
}

// galeraSchema is the history's tables on the Galera cluster: the result
// table as on MariaDB, and the lease row changes recorded by triggers, as
// on PostgreSQL and SQLite, not by system versioning (see migrateGalera).
// Each trigger numbers its target's changes from the last one (seq): the
// statement holds the lease row's lock, and its INSERT … SELECT reads the
// last committed rows; two nodes' writes of one row meet in
// certification. An auto-increment would not do: each node hands out
// values of its own, out of order across the nodes. These Changes have
// no At.
var galeraSchema = schema{
	ddl: []string{mysqlSchema.ddl[0],
		`CREATE TABLE history_lease_log (target_id varbinary(255) NOT NULL, seq bigint NOT NULL, op char(1) NOT NULL,
			old_generation bigint, new_generation bigint, old_token char(36), new_token char(36),
			old_holder varchar(255), new_holder varchar(255),
			old_updated_us bigint, new_updated_us bigint, old_released_us bigint, new_released_us bigint,
			old_timeout_ms bigint, new_timeout_ms bigint, new_acquired_us bigint,
			PRIMARY KEY (target_id, seq)) ENGINE=InnoDB`,
		`CREATE TRIGGER history_lease_insert AFTER INSERT ON job_lease FOR EACH ROW
			INSERT INTO history_lease_log (target_id, seq, op, new_generation, new_token, new_holder, new_updated_us,
				new_released_us, new_timeout_ms, new_acquired_us)
			SELECT NEW.target_id, COALESCE(MAX(seq), 0) + 1, 'I', NEW.generation, NEW.lease_token, NEW.holder,
				` + fmt.Sprintf(myMicros, "NEW.updated_at") + `, ` + fmt.Sprintf(myMicros, "NEW.released_at") + `,
				NEW.timeout_ms, ` + fmt.Sprintf(myMicros, "NEW.acquired_at") + `
			FROM history_lease_log WHERE target_id = NEW.target_id`,
		`CREATE TRIGGER history_lease_update AFTER UPDATE ON job_lease FOR EACH ROW
			INSERT INTO history_lease_log (target_id, seq, op, old_generation, new_generation, old_token, new_token,
				old_holder, new_holder, old_updated_us, new_updated_us, old_released_us, new_released_us,
				old_timeout_ms, new_timeout_ms, new_acquired_us)
			SELECT NEW.target_id, COALESCE(MAX(seq), 0) + 1, 'U', OLD.generation, NEW.generation, OLD.lease_token,
				NEW.lease_token, OLD.holder, NEW.holder,
				` + fmt.Sprintf(myMicros, "OLD.updated_at") + `, ` + fmt.Sprintf(myMicros, "NEW.updated_at") + `,
				` + fmt.Sprintf(myMicros, "OLD.released_at") + `, ` + fmt.Sprintf(myMicros, "NEW.released_at") + `,
				OLD.timeout_ms, NEW.timeout_ms, ` + fmt.Sprintf(myMicros, "NEW.acquired_at") + `
			FROM history_lease_log WHERE target_id = NEW.target_id`,
	},
	nowMicros: mysqlSchema.nowMicros,
	changes: `SELECT op = 'I', target_id, COALESCE(old_generation, 0), COALESCE(new_generation, 0),
		COALESCE(old_token, ''), COALESCE(new_token, ''), COALESCE(old_holder, ''), COALESCE(new_holder, ''),
		COALESCE(old_updated_us, 0), COALESCE(new_updated_us, 0),
		COALESCE(old_released_us, 0), COALESCE(new_released_us, 0), COALESCE(old_timeout_ms, 0), COALESCE(new_timeout_ms, 0),
		COALESCE(new_acquired_us, 0), 0 FROM history_lease_log ORDER BY target_id, seq`,
	events: mysqlSchema.events,
}

// migrateGalera makes the history tables of galeraSchema. The lease rows'
// changes are not recorded by system versioning, as on MariaDB: versioned
// by transaction IDs, which are each node's own, a change is replicated as
// a statement, which the other nodes fail to apply (a server-side prepared
// one goes out with its placeholders, a heartbeat's multi-table UPDATE
// fails there), and the cluster then votes the writing node out; versioned
// by timestamps, a version that a transaction wrote after a later-begun one
// had taken its timestamp may be missing: a takeover that waited for a
// release's row lock on the same node leaves the release out (once in
// about 800 saves with every worker on one node), which made a takeover
// look early. A trigger records every change, and costs gormlease's MySQL
// backend a read back of each acquisition (it gets no insert ID), as the
// history's own triggers (gormlease.WithHistory) do.
func migrateGalera(ctx context.Context, db *gorm.DB) error {
	for _, stmt := range galeraSchema.ddl {
		if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("history: migrate on Galera: %w", err)
		}
	}
	return nil
}

// On the Galera cluster, with every worker on node 1 and node crashes
// (galeraDatabase), the mutation of TestHistory_MutatedFenceIsCaught_MariaDB:
// the checker must catch it there too. The workers are not spread: a
// stale commit on another node than the takeover meets it in
// certification, which may roll it back whatever the statements check,
// and then there is nothing to catch.
func TestHistory_MutatedFenceIsCaught_Galera(t *testing.T) {
	t.Parallel()
	c := testdb.SharedGalera(t)
	sc := scenario{duration: duration(t, 30e9), workers: 4, targets: 2, faults: []string{FaultStall}, seed: seed(t), breakFence: true, runOnly: true}
	s := galeraSettingsFor(t, sc.seed)
	s.writers = WritersOne
	d, _ := galeraDatabase(t, c, s)
	requireCaught(t, runOn(t, d, sc))
}
