package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The kinds of fault the driver injects.
const (
	// FaultPause stops a worker (SIGSTOP) for 1.5 to 2.5 of its lease
	// timeouts, then continues it.
	FaultPause = "pause"
	// FaultKill closes every connection of a worker, three times, 150 ms
	// apart (its proxy's Cut).
	FaultKill = "connection kill"
	// FaultCrash kills a worker (SIGKILL) and starts it again, 0.2 to 0.8 s
	// later.
	FaultCrash = "crash"
	// FaultStall withholds a worker's next fenced commit (and everything
	// else it sends) for its lease timeout plus a second, then delivers
	// it: another worker may take the lease over meanwhile.
	FaultStall = "commit stall"
	// FaultRefuse refuses a worker's new connections for 1.5 to 2.5 of its
	// lease timeouts, and at least 1.5 s (see WorkerConfig.RefuseFile), and closes its open
	// ones as the refusal begins, three times, 150 ms apart (its proxy's
	// Cut), so that its next statements need new connections.
	// It ends, if it can within 2 s more, when no lease is held.
	FaultRefuse = "connection refusal"
)

// callLag is Input.CallLag: on this machine, loaded and under -race, a
// call of Do begins well within it of its log line.
const callLag = 250 * time.Millisecond

// The kinds of failover of the Patroni cluster, the faults of the cluster
// rather than of one worker. After each, the driver waits for the new
// leader, then heals the cluster (Heal rejoins the old leader as a
// standby) before anything else fails over.
const (
	// FailoverPostmaster kills the leader's postmaster (SIGKILL): Patroni
	// promotes the synchronous standby at once (2 to 3 s).
	FailoverPostmaster = "failover: postmaster kill"
	// FailoverPatroni kills the leader's Patroni (SIGKILL) and leaves its
	// PostgreSQL running and read-write, first in the DSN of the workers
	// started while it led: the synchronous standby is promoted once the
	// leader key expires (about 7 s), and the old primary, which nobody
	// stopped, runs on until the heal, its commits waiting for a standby
	// that has moved on (issue 18's case).
	FailoverPatroni = "failover: Patroni kill"
	// FailoverSwitchover hands the leadership to the synchronous standby
	// (patronictl switchover, about 3 s): a planned failover.
	FailoverSwitchover = "failover: switchover"
)

// The operator's actions on a target, in a fault phase, beside the
// workers' faults and, on the Patroni cluster, during the phase's failover:
// Pause, then Resume 0.5 to 2 s later, with RequestStop before the Pause
// (the holder stops, and nobody starts again until Resume), after it (the
// holder of a paused target stops), or not at all.
const (
	OperatePause         = "operator: pause"
	OperateStopThenPause = "operator: stop, then pause"
	OperatePauseThenStop = "operator: pause, then stop"
)

var allOperations = []string{OperatePause, OperateStopThenPause, OperatePauseThenStop}

// The counts of outcome.faults that say how the operator's actions met the
// failovers: the actions that overlapped a failover of the cluster (from
// its fault to the heal's end), the attempts of their calls that failed
// and were sent again, and the Resumes answered nil but lost in the
// failover (see operate).
const (
	operatedAcrossFailover = "operator actions across a failover"
	operatorRetries        = "operator calls sent again"
	operatorResumeLost     = "operator resumes lost in a failover"
)

// The bounds of an operator's call, as a careful operator's script sets
// them: each attempt may take operatorAttempt, and a failed one is sent
// again operatorBackoff later, until operatorBound after the first. The
// bound outlasts the longest failover with its heal (a Patroni kill: the
// promotion after about 7 s, the old primary kept up to 9 s more, a heal
// of up to 17.5 s), during which a call either finds no primary or waits
// on the old one for a standby that has moved on.
const (
	operatorAttempt = 3 * time.Second
	operatorBackoff = 200 * time.Millisecond
	operatorBound   = time.Minute
)

// land sends call until it lands: an attempt that fails, whether it never
// reached the database or its answer was lost (then it may have landed),
// is sent again, until one returns nil or an error that sending again
// cannot cure (bad input), or operatorBound has passed. It returns how
// many attempts failed, and the last one's error.
func land(call func(ctx context.Context) error) (failed int, err error) {
	first := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), operatorAttempt)
		err = call(ctx)
		cancel()
		if err == nil || errors.Is(err, gormlease.ErrInvalidArgument) || time.Since(first) > operatorBound {
			return failed, err
		}
		failed++
		time.Sleep(operatorBackoff)
	}
}

// operations numbers the operator's actions (see operate).
var operations atomic.Int64

// operatorName is the name the driver's operator records as its actions'
// operator (admin.Operator.As), which the history's events carry.
const operatorName = "history-driver"

// operate pauses target with repo as kind says, holds the pause for hold,
// and resumes it, each call sent until it lands (land), as the operator
// operatorName. When settled is not nil, it is closed once the failover of
// the phase is healed: the Resume is then confirmed on the primary that
// survived (see below). The fault covers it all, from the first call to
// the end of the Resume and its confirmation; the pause is certain from
// the answer to Pause to the first Resume sent (see Pause). It also
// returns each call made (see OperatorCall), how many attempts failed and
// were sent again, and whether the Resume was lost in the failover.
func operate(repo *gormlease.Repository, kind, target string, hold time.Duration, settled <-chan struct{}) (
	_ Fault, _ Pause, calls []OperatorCall, retries int, lost bool, _ error,
) {
	f := Fault{Kind: kind, Worker: "operator", Start: Micros(time.Now())}
	op := admin.New(repo).As(operatorName)
	// A reason of its own, so that each call that lands changes the row,
	// and records its event, even on a row that an earlier call left
	// paused or asked to stop (see OperatorCall).
	reason := fmt.Sprintf("history %d", operations.Add(1))
	var errs []error
	// send lands call, an operator's call of the event kind event with
	// reason, recording it: attempt returns the attempt's answer, and
	// whether the error it returns is one for which the call is not sent
	// again though it was not answered nil (see OperatorCall.Answered).
	send := func(step, event, reason string, attempt func(ctx context.Context) (answered bool, err error)) bool {
		c := OperatorCall{Target: target, Kind: event, Operator: operatorName, Reason: reason, Sent: Micros(time.Now())}
		n, err := land(func(ctx context.Context) error {
			answered, err := attempt(ctx)
			if answered && c.Answered == 0 {
				c.Answered = Micros(time.Now())
			}
			return err
		})
		c.Done = Micros(time.Now())
		calls = append(calls, c)
		retries += n
		if err != nil {
			errs = append(errs, fmt.Errorf("%s after %d attempts: %w", step, n+1, err))
		}
		return err == nil
	}
	stop := func() {
		send("stop", string(admin.EventStopRequested), reason, func(ctx context.Context) (bool, error) {
			// No live lease: nobody to stop, or an attempt whose answer
			// was lost stopped it.
			err := op.RequestStop(ctx, target, reason)
			if errors.Is(err, gormlease.ErrNoLiveLease) {
				return false, nil
			}
			return err == nil, err
		})
	}
	if kind == OperateStopThenPause {
		stop()
	}
	p := Pause{Target: target, Sent: Micros(time.Now())}
	if send("pause", string(admin.EventPaused), reason, func(ctx context.Context) (bool, error) {
		err := op.Pause(ctx, target, reason)
		return err == nil, err
	}) {
		p.Committed = Micros(time.Now())
	}
	if kind == OperatePauseThenStop {
		stop()
	}
	time.Sleep(hold)
	p.Resumed = Micros(time.Now())
	resume := func(ctx context.Context) (bool, error) {
		err := op.Resume(ctx, target)
		return err == nil, err
	}
	// The Resume must land, or the target stays paused for good.
	send("resume", string(admin.EventResumed), "", resume)
	if settled != nil {
		// Its nil may come from an old primary that nobody stopped (a
		// Patroni kill), whose commits the failover throws away: when an
		// attempt cut short there in its wait for the standby had
		// committed locally, the next one changes no row, and so commits
		// without waiting for the standby. Once the cluster is healed,
		// read the row on its primary, and resume again while it is paused.
		<-settled
		send("confirm the resume", "", "", func(ctx context.Context) (bool, error) {
			row, _, err := op.Get(ctx, target)
			if err != nil || row.PausedAt == nil {
				return false, err
			}
			lost = true
			if !send("resume again", string(admin.EventResumed), "", resume) {
				return false, nil // its error is recorded
			}
			return false, errors.New("resumed again: read the row again")
		})
	}
	f.End = Micros(time.Now())
	// The confirmation's own record is no call that records an event.
	calls = slices.DeleteFunc(calls, func(c OperatorCall) bool { return c.Kind == "" })
	return f, p, calls, retries, lost, errors.Join(errs...)
}

// operatorDelay is how long after the start of a phase whose failover is
// kind the operator's action begins: while the cluster has no primary (a
// postmaster kill or a switchover promotes the standby 1.5 to 6 s after it
// began), or, after a Patroni kill, around the promotion (6.3 to 7.5 s
// after the kill), after which the old primary, read-write and first in
// the DSN, holds each commit for a standby that has moved on until the
// heal demotes it.
func operatorDelay(kind string, rng *rand.Rand) time.Duration {
	if kind == FailoverPatroni {
		return 5*time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
	}
	return time.Duration(rng.IntN(1500)) * time.Millisecond
}

// acrossFailovers counts the operator's actions in faults that overlapped
// a failover of the cluster.
func acrossFailovers(faults []Fault) int {
	n := 0
	for _, op := range faults {
		if op.Worker != "operator" {
			continue
		}
		for _, f := range faults {
			if f.Worker == "cluster" && op.Start <= f.End && f.Start <= op.End {
				n++
				break
			}
		}
	}
	return n
}

// FailoverUnplanned is a failover of the Patroni cluster that the driver
// did not inject, but saw.
const FailoverUnplanned = "failover: unplanned"

// allFailovers are the failovers of the Patroni scenarios; issue 18's,
// the Patroni kill, first.
var allFailovers = []string{FailoverPatroni, FailoverPostmaster, FailoverSwitchover}

// commitNeedle is in the statement of the fenced commit that saves and
// releases, and in no other.
const commitNeedle = "saved_generation = generation"

// scenario is one randomized run.
type scenario struct {
	duration time.Duration
	workers  int
	targets  int
	faults   []string
	// failovers, when set, are the failovers of the Patroni cluster that
	// the fault phases inject, one per phase, every kind in turn.
	failovers []string
	seed      uint64
	// breakFence runs the workers with the fence broken (see
	// WorkerConfig.BreakFence).
	breakFence bool
	// runOnly leaves the Do and RunWait loops out: the workers make Runs
	// only. Otherwise each has 1 to maxDoers Do loops (2 when 0) and 0 or 1
	// RunWait loop.
	runOnly bool
	// doOnly makes each worker's loops those of Do only, puts worker 0
	// alone under a fault in each phase, a refusal that ends as another
	// worker's wave ends (see liftAfterWave), with no operator (whose
	// pauses stop the waves), and makes the quiet phases short: for the Do mutation, whose second jobs show in the
	// calls that worker 0 begins while refused (see runOn).
	doOnly bool
	// workerBin, when set, is the test binary that the workers run, built
	// otherwise than this one (see workerBinary).
	workerBin string
}

// slot is one worker, across its incarnations.
type slot struct {
	t   *testing.T
	n   int
	cfg WorkerConfig
	db  *database
	// proxies are the worker's own, one per server address of db.
	proxies []*testdb.Proxy
	dir     string
	// bin, when set, is the binary the worker runs (see scenario.workerBin).
	bin string
	// lift, when set, ends a refusal of the worker's connections (see
	// scenario.doOnly).
	lift func() error

	mu          sync.Mutex
	incarnation int
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	exited      chan error
}

// start starts the slot's next incarnation.
func (s *slot) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.cfg
	cfg.Name = fmt.Sprintf("w%d.%d", s.n, s.incarnation)
	cfg.Log = filepath.Join(s.dir, cfg.Name+".jsonl")
	cfg.Seed += uint64(s.incarnation) << 32
	cfg.DSN = s.db.workerDSN(s.proxies)
	s.incarnation++
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	bin := os.Args[0]
	if s.bin != "" {
		bin = s.bin
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(b))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %s: %w", cfg.Name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.cmd, s.stdin, s.exited = cmd, stdin, exited
	return nil
}

func (s *slot) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// crash kills the incarnation, if one runs, and waits for it to end.
func (s *slot) crash() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop ends the incarnation: its input ends, it finishes its Runs and
// exits. It is killed when it has not within 30 s.
func (s *slot) stop() error {
	s.mu.Lock()
	cmd, stdin, exited := s.cmd, s.stdin, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("worker %d is not running", s.n)
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	stdin.Close()
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("worker %d: %w", s.n, err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("worker %d did not exit within 30 s", s.n)
	}
}

// outcome is a scenario's history and what Check found in it.
type outcome struct {
	in  Input
	rep Report
	// faults counts the faults injected, by kind (a commit stall that
	// caught no commit apart).
	faults map[string]int
	// syncWaits counts how the old primaries' waits for the synchronous
	// standby ended (on the Patroni cluster).
	syncWaits syncWaits
}

// database is what a scenario's workers run on, and what its checker
// reads.
type database struct {
	name string
	// db is the scenario's own pool, on which it migrates.
	db *gorm.DB
	// addrs are the servers' addresses, each of which a worker reaches
	// through a proxy of its own; none on SQLite, which has no server.
	addrs []string
	// workerDSN is the DSN of a worker's new incarnation, whose proxies
	// (one per address, in order) are proxies.
	workerDSN func(proxies []*testdb.Proxy) string
	// read reads what Check judges the Runs by: every saved result,
	// every lease row change, and every event of the history.
	read func(t *testing.T) ([]Result, []Change, []LeaseEvent)
	// patroni, when set, is the Patroni cluster that the failovers fail.
	patroni *testdb.Patroni
	// resolution is Input.Resolution's.
	resolution time.Duration
	// clusterFault, when set, may inject a fault of the servers (a Galera
	// node's crash) in a fault phase, at the same time as the workers'
	// faults, and returns it when it did.
	clusterFault func(t *testing.T, rng *rand.Rand) (Fault, bool)
	// migrate, when set, makes the history tables instead of Migrate.
	migrate func(ctx context.Context, db *gorm.DB) error
}

// await waits, up to bound, until d.held() is held.
func (d *database) await(held bool, bound time.Duration) {
	for end := time.Now().Add(bound); time.Now().Before(end) && d.held() != held; {
		time.Sleep(5 * time.Millisecond)
	}
}

// liftAfterWave ends the refusal of slots[0]'s connections when another
// worker's wave has just ended: it waits, up to 5 s each, until a lease is
// held and then until none is, refuses the other workers' connections,
// lifts slots[0]'s refusal and, 300 ms later, theirs. The calls of Do of
// slots[0] that began refused while that wave ran read the row free then,
// with no other worker to begin the next wave.
func liftAfterWave(d *database, slots []*slot) error {
	d.await(true, 5*time.Second)
	d.await(false, 5*time.Second)
	var errs []error
	for _, s := range slots[1:] {
		errs = append(errs, os.WriteFile(s.cfg.RefuseFile, nil, 0o644))
		for _, p := range s.proxies {
			p.Cut()
		}
	}
	errs = append(errs, os.Remove(slots[0].cfg.RefuseFile))
	time.Sleep(300 * time.Millisecond)
	for _, s := range slots[1:] {
		errs = append(errs, os.Remove(s.cfg.RefuseFile))
	}
	return errors.Join(errs...)
}

// held reports whether a lease row of d is unreleased, or, when d cannot
// be read, true.
func (d *database) held() bool {
	var n int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.db.WithContext(ctx).Raw("SELECT count(*) FROM job_lease WHERE released_at IS NULL").Scan(&n).Error; err != nil {
		return true
	}
	return n > 0
}

// serverDatabase is a database of its own on server.
func serverDatabase(t *testing.T, server *testdb.Server) *database {
	dsn := server.EmptyDSN(t)
	d := &database{name: server.Name, db: openDB(t, dsn)}
	d.workerDSN = func([]*testdb.Proxy) string { return dsn }
	if server.Addr != "" {
		d.addrs = []string{server.Addr}
		d.workerDSN = func(p []*testdb.Proxy) string { return strings.Replace(dsn, server.Addr, p[0].Addr(), 1) }
	}
	if server.Name == "sqlite" {
		d.resolution = time.Millisecond
	}
	d.read = func(t *testing.T) ([]Result, []Change, []LeaseEvent) {
		results, changes, err := ReadDB(context.Background(), d.db)
		require.NoError(t, err)
		events, err := ReadEvents(context.Background(), d.db)
		require.NoError(t, err)
		return results, changes, events
	}
	return d
}

var patroniDatabases atomic.Int64

// patroniDatabase is a database of its own on the Patroni cluster c. The
// workers reach it through the cluster's multi-host DSN (every member,
// with target_session_attrs=read-write). Its records are read on the
// primary after the last heal, the one that survived: a failover throws
// away the commits that only the old primary had, and a Run that returned
// nil must have its result there.
func patroniDatabase(t *testing.T, c *testdb.Patroni) *database {
	name := fmt.Sprintf("history_%d_%d", os.Getpid(), patroniDatabases.Add(1))
	in := func(dsn string) string { return strings.Replace(dsn, "dbname=postgres", "dbname="+name, 1) }
	require.NoError(t, openDB(t, c.DSN()).Exec("CREATE DATABASE "+name).Error)
	// A replica has the database once it has replayed the CREATE, and a
	// connection to one that has not yet is refused, which ends pgx's
	// search for a read-write host of the multi-host DSN: wait for every
	// member to have it (a scenario after a failover lists a replica first).
	for _, m := range c.Members() {
		require.Eventually(t, func() bool { return reachable(in(m.DSN())) }, 30*time.Second, 50*time.Millisecond,
			"%s has no database %s", m.Name(), name)
	}
	d := &database{name: "patroni", db: openDB(t, in(c.DSN())), patroni: c}
	members := c.Members()
	for _, m := range members {
		d.addrs = append(d.addrs, m.Addr())
	}
	d.workerDSN = func(proxies []*testdb.Proxy) string {
		// As an application configured while the current leader led
		// lists it: first, so that its new connections go there for as
		// long as it accepts writes.
		leader := c.Leader()
		var hosts, ports []string
		for _, first := range []bool{true, false} {
			for i, m := range members {
				if (m == leader) == first {
					host, port, _ := net.SplitHostPort(proxies[i].Addr())
					hosts, ports = append(hosts, host), append(ports, port)
				}
			}
		}
		return fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=disable connect_timeout=2"+
			" target_session_attrs=read-write", strings.Join(hosts, ","), strings.Join(ports, ","), name)
	}
	d.read = func(t *testing.T) ([]Result, []Change, []LeaseEvent) {
		c.Heal(t) // healthy: one primary, its synchronous standby, a replica
		leader := c.Leader()
		require.NotNil(t, leader, "no Patroni leader after the last heal")
		db := openDB(t, in(leader.DSN())) // that member alone
		var inRecovery bool
		require.NoError(t, db.Raw("SELECT pg_is_in_recovery()").Scan(&inRecovery).Error)
		require.False(t, inRecovery, "%s, the Patroni leader, is in recovery", leader.Name())
		results, changes, err := ReadDB(context.Background(), db)
		require.NoError(t, err)
		events, err := ReadEvents(context.Background(), db)
		require.NoError(t, err)
		require.Same(t, leader, c.Leader(), "the Patroni leader changed while the checker read %s", leader.Name())
		t.Logf("the checker read %s, the primary after the last heal", leader.Name())
		return results, changes, events
	}
	return d
}

// reachable reports whether a connection to dsn can be made.
func reachable(dsn string) bool {
	db, err := Open(dsn)
	if err != nil {
		return false
	}
	sqlDB, err := db.DB()
	if err != nil {
		return false
	}
	defer sqlDB.Close()
	return sqlDB.Ping() == nil
}

// openDB opens dsn, closed when t ends.
func openDB(t *testing.T, dsn string) *gorm.DB {
	db, err := Open(dsn)
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return db
}

// runScenario runs sc on a database of its own on server.
func runScenario(t *testing.T, server *testdb.Server, sc scenario) outcome {
	t.Helper()
	return runOn(t, serverDatabase(t, server), sc)
}

// runPatroniScenario runs sc on a database of its own on the Patroni
// cluster c, which sc's failovers fail over.
func runPatroniScenario(t *testing.T, c *testdb.Patroni, sc scenario) outcome {
	t.Helper()
	// Whatever happens to the test, the next one finds the cluster healed
	// (after the workers are gone: this runs after runOn's cleanups).
	t.Cleanup(func() { c.Heal(t) })
	return runOn(t, patroniDatabase(t, c), sc)
}

// runOn runs sc on d: it starts the workers through proxies of their own,
// injects faults until sc.duration is over, stops the workers, and checks
// the history.
func runOn(t *testing.T, d *database, sc scenario) outcome {
	t.Helper()
	ctx := context.Background()
	t.Logf("scenario on %s: %v, %d workers, %d targets, faults %v, failovers %v, seed %d",
		d.name, sc.duration, sc.workers, sc.targets, sc.faults, sc.failovers, sc.seed)
	// With the history kept (the event table and its triggers), which
	// Check cross-checks.
	require.NoError(t, gormlease.AutoMigrate(ctx, d.db, gormlease.WithHistory()))
	migrate := Migrate
	if d.migrate != nil {
		migrate = d.migrate
	}
	require.NoError(t, migrate(ctx, d.db))

	dir, visualize := t.TempDir(), ""
	if keep := os.Getenv("GORMLEASE_HISTORY_DIR"); keep != "" {
		dir = filepath.Join(keep, fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), sc.seed))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		t.Logf("logs kept in %s", dir)
		visualize = dir
	}
	rng := rand.New(rand.NewPCG(sc.seed, 0))
	targets := make([]string, sc.targets)
	for i := range targets {
		targets[i] = fmt.Sprintf("target-%d", i)
	}
	slots := make([]*slot, sc.workers)
	var maxTimeout, maxOpTimeout time.Duration
	refuseAddr := refusingAddr(t)
	for i := range slots {
		// Each worker reaches each server through a proxy of its own.
		var proxies []*testdb.Proxy
		for _, addr := range d.addrs {
			proxies = append(proxies, testdb.NewProxy(t, addr))
		}
		interval := time.Duration(100+rng.IntN(101)) * time.Millisecond
		timeout := interval * time.Duration(5+rng.IntN(3))
		if len(sc.failovers) > 0 && i%2 == 1 {
			// Every other worker on the cluster has a lease timeout of 3.5
			// to 5 s, above the failover times of a postmaster kill and a
			// switchover (2 to 3 s) and below a Patroni kill's (about 7 s,
			// the old primary running on); the others' (0.5 to 1.4 s) are
			// below all three.
			interval = time.Duration(250+rng.IntN(81)) * time.Millisecond
			timeout = interval * time.Duration(14+rng.IntN(2))
		}
		cfg := WorkerConfig{
			Targets:    targets,
			Goroutines: 1 + rng.IntN(3), Interval: interval, Timeout: timeout,
			// Longer than a commit stall, so that the stalled commit
			// reaches the database.
			OpTimeout: timeout + 2*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond,
			WorkMin:   20 * time.Millisecond, WorkMax: time.Duration(100+rng.IntN(400)) * time.Millisecond,
			// Longer, so that a call of Do often begins while another's
			// job has more than callLag to go.
			DoWorkMin: 100 * time.Millisecond, DoWorkMax: time.Duration(400+rng.IntN(600)) * time.Millisecond,
			Seed: sc.seed + uint64(i), BreakFence: sc.breakFence,
		}
		switch {
		case sc.doOnly:
			// Worker 0, whose connections are refused, has 8 Do loops and
			// gives up each call after 1 to 3 s, so that its calls begin
			// while it is refused, several of them in progress when the
			// refusal ends, and reads the row often (its watch reads it
			// every heartbeat interval). The others make the waves: one
			// loop each, with long works and long pauses, so that worker
			// 0's calls begin in a wave that saves during the refusal,
			// which ends as that wave ends (see liftAfterWave).
			cfg.Goroutines, cfg.Doers, cfg.CallPause = 0, 1, 3*time.Second
			cfg.DoWorkMin, cfg.DoWorkMax = 2*time.Second, 3*time.Second
			if i == 0 {
				cfg.Doers, cfg.CallPause, cfg.DoTimeout = 8, 0, 2*time.Second
				// Short works, which end within the timeout.
				cfg.DoWorkMin, cfg.DoWorkMax = 50*time.Millisecond, 200*time.Millisecond
				cfg.Interval, cfg.Timeout = 50*time.Millisecond, 400*time.Millisecond
			}
		case !sc.runOnly:
			cfg.Doers, cfg.RunWaiters = 1+rng.IntN(2), rng.IntN(2)
		}
		if len(d.addrs) > 0 && slices.Contains(sc.faults, FaultRefuse) {
			cfg.RefuseFile, cfg.RefuseAddr = filepath.Join(dir, fmt.Sprintf("refuse-%d", i)), refuseAddr
		}
		maxTimeout, maxOpTimeout = max(maxTimeout, timeout), max(maxOpTimeout, cfg.OpTimeout)
		t.Logf("worker %d: %d Run loops, %d Do loops, %d RunWait loops, heartbeat %v, lease timeout %v, operation timeout %v, "+
			"work %v to %v, Do's %v to %v", i, cfg.Goroutines, cfg.Doers, cfg.RunWaiters, cfg.Interval, cfg.Timeout, cfg.OpTimeout,
			cfg.WorkMin, cfg.WorkMax, cfg.DoWorkMin, cfg.DoWorkMax)
		slots[i] = &slot{t: t, n: i, cfg: cfg, db: d, proxies: proxies, dir: dir, bin: sc.workerBin}
	}
	// Whatever happens to the test, no worker outlives it.
	t.Cleanup(func() {
		for _, s := range slots {
			s.crash()
		}
	})
	repo, err := gormlease.NewRepository(d.db)
	require.NoError(t, err)
	from := Micros(time.Now())
	for _, s := range slots {
		require.NoError(t, s.start())
	}
	var (
		mu     sync.Mutex
		faults []Fault
		pauses []Pause
		calls  []OperatorCall
	)
	if sc.doOnly {
		slots[0].lift = func() error { return liftAfterWave(d, slots) }
	}

	recovery := maxTimeout + time.Second
	window := 2500 * time.Millisecond
	var (
		counts   = map[string]int{}
		next     []string // the failovers to come, in turn
		turns    int
		syncWait syncWaits
		// How long each failover takes, from the fault to the heal's end
		// and without the hold: the last one measured, or a first guess.
		expect = map[string]time.Duration{
			FailoverPostmaster: 9 * time.Second, FailoverPatroni: 12 * time.Second, FailoverSwitchover: 8 * time.Second}
	)
	// On the cluster, the leader since the last heal, and an unplanned
	// failover's check: Patroni may fail a loaded cluster over by itself
	// (it once did while a heal waited). Such a failover, once seen, is a
	// fault of the cluster from the last heal on, and is healed; the
	// checker's safety checks hold across it as across any other.
	var leader *testdb.PatroniMember
	healed := from
	unplanned := func() {
		if d.patroni == nil || d.patroni.Leader() == leader {
			return
		}
		d.patroni.Heal(t)
		f := Fault{Kind: FailoverUnplanned, Worker: "cluster", Start: healed, End: Micros(time.Now()), HeldUp: true}
		now := d.patroni.Leader()
		t.Logf("%s: the leader was %s, and is %s after the heal", f.Kind, memberName(leader), memberName(now))
		leader, healed = now, f.End
		faults = append(faults, f)
		counts[f.Kind]++
	}
	if d.patroni != nil {
		leader = d.patroni.Leader()
		require.NotNil(t, leader, "no Patroni leader")
	}
	end := time.Now().Add(sc.duration)
	for len(sc.faults) > 0 || len(sc.failovers) > 0 {
		// A fault phase: one or two faults at once, on distinct workers,
		// and on the cluster a failover at the same time.
		phase, hold := 4*time.Second, time.Duration(0)
		if len(sc.failovers) > 0 {
			if len(next) == 0 {
				// Each kind once in every turn, at random; the first turn
				// starts with sc.failovers[0].
				first := turns == 0
				turns++
				for _, i := range rng.Perm(len(sc.failovers)) {
					if first && i == 0 {
						next = append([]string{sc.failovers[i]}, next...)
					} else {
						next = append(next, sc.failovers[i])
					}
				}
			}
			// How long the old primary that a Patroni kill leaves runs on
			// after the new leader is seen: the longer, the more of the
			// commits that wait on it are cut short by their client.
			hold = time.Second + time.Duration(rng.Int64N(int64(maxOpTimeout)))
			phase = expect[next[0]]
			if next[0] == FailoverPatroni {
				phase += hold
			}
		}
		tail := phase + recovery + window
		if sc.doOnly {
			tail = phase // no quiet window to leave room for
		}
		if !time.Now().Add(tail).Before(end) {
			break
		}
		perm, n := rng.Perm(len(slots)), 1+rng.IntN(2)
		if sc.doOnly {
			perm, n = []int{0}, 1 // see runOn's doOnly
		}
		if len(sc.faults) == 0 {
			n = 0
		}
		func() {
			var wg sync.WaitGroup
			// The worker faults end before the phase does, even when a
			// failover fails the test.
			defer wg.Wait()
			for _, i := range perm[:min(len(slots), n)] {
				kind := sc.faults[rng.IntN(len(sc.faults))]
				s := slots[i]
				delay := time.Duration(rng.IntN(500)) * time.Millisecond
				frac := 1.5 + rng.Float64()
				restart := time.Duration(200+rng.IntN(600)) * time.Millisecond
				wg.Go(func() {
					time.Sleep(delay) // when the fault strikes is the schedule's choice
					f, hit, err := inject(s, kind, frac, restart)
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					defer mu.Unlock()
					faults = append(faults, f)
					if hit {
						counts[kind]++
					} else {
						counts[kind+" (caught nothing)"]++
					}
				})
			}
			if len(sc.faults) > 0 && !sc.doOnly {
				kind := allOperations[rng.IntN(len(allOperations))]
				target := targets[rng.IntN(len(targets))]
				delay := time.Duration(rng.IntN(1000)) * time.Millisecond
				if len(sc.failovers) > 0 {
					delay = operatorDelay(next[0], rng) // during the failover
				}
				hold := time.Duration(500+rng.IntN(1500)) * time.Millisecond
				var settled chan struct{}
				if len(sc.failovers) > 0 {
					settled = make(chan struct{})
					// Closed when the failover below is healed, or the
					// test failed: before wg.Wait.
					defer close(settled)
				}
				wg.Go(func() {
					time.Sleep(delay)
					f, p, made, retries, lost, err := operate(repo, kind, target, hold, settled)
					if err != nil {
						t.Errorf("%s on %s: %v", kind, target, err)
					}
					t.Logf("%s on %s from %s to %s: pause sent at %s, confirmed at %s, resume sent at %s; "+
						"%d attempts sent again, the resume lost in the failover: %v",
						kind, target, micros(f.Start), micros(f.End), micros(p.Sent), micros(p.Committed), micros(p.Resumed), retries, lost)
					mu.Lock()
					defer mu.Unlock()
					faults, pauses, calls = append(faults, f), append(pauses, p), append(calls, made...)
					counts[kind]++
					counts[operatorRetries] += retries
					if lost {
						counts[operatorResumeLost]++
					}
				})
			}
			if d.clusterFault != nil {
				if f, ok := d.clusterFault(t, rng); ok {
					mu.Lock()
					defer mu.Unlock()
					faults = append(faults, f)
					counts[f.Kind]++
				}
			}
			if len(sc.failovers) > 0 {
				kind := next[0]
				next = next[1:]
				f, w, kept := failover(t, d.patroni, kind, hold)
				expect[kind] = time.Duration(f.End-f.Start)*time.Microsecond - kept
				leader, healed = d.patroni.Leader(), f.End
				mu.Lock()
				defer mu.Unlock()
				faults = append(faults, f)
				counts[kind]++
				syncWait.add(w)
			}
		}()
		// A quiet phase, long enough for a window after the recovery.
		quiet := recovery + window
		if sc.doOnly {
			quiet = time.Second
		}
		time.Sleep(quiet + time.Duration(rng.IntN(1000))*time.Millisecond)
		unplanned()
	}
	time.Sleep(time.Until(end))
	unplanned()
	to := Micros(time.Now())
	var stopErrs []string
	for _, s := range slots {
		if err := s.stop(); err != nil {
			stopErrs = append(stopErrs, err.Error())
		}
	}
	require.Empty(t, stopErrs, "workers")

	events, err := ReadLogs(dir)
	require.NoError(t, err)
	results, changes, leaseEvents := d.read(t)
	if d.patroni != nil {
		counts[operatedAcrossFailover] = acrossFailovers(faults)
	}
	in := Input{Events: events, Results: results, Changes: changes, Faults: faults, Pauses: pauses, Targets: targets,
		EventsKept: true, LeaseEvents: leaseEvents, OperatorCalls: calls,
		From: from, To: to, Recovery: recovery, Window: window, Resolution: d.resolution, CallLag: callLag, VisualizeDir: visualize}
	rep := Check(in)
	t.Logf("checked %d calls (%v; %v), %d acquisitions, %d saves, %d lease row changes, "+
		"%d events (%d by %d operator calls; ends by how %v, %d judged by their call), "+
		"%d model operations, %d quiet windows; faults %v; %d violations",
		rep.Runs, rep.Calls, rep.Outcomes, rep.Acquisitions, rep.Saves, rep.Changes,
		rep.Events, rep.OperatorEvents, len(calls), rep.Ends, rep.EndsJudged,
		rep.Ops, rep.Windows, counts, len(rep.Violations))
	if d.patroni != nil {
		t.Logf("on the old primaries: %d waits for synchronous replication cancelled by their client, %d cut by the shutdown",
			syncWait.cancelled, syncWait.terminated)
	}
	if dir := os.Getenv("GORMLEASE_HISTORY_DIR"); dir != "" {
		b, err := json.Marshal(faults)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(in.VisualizeDir, "faults.json"), b, 0o644))
	}
	byKind := map[string]int{}
	for _, v := range rep.Violations {
		byKind[v.Kind]++
	}
	if len(byKind) > 0 {
		t.Logf("violations by kind: %v", byKind)
	}
	for outcome, msg := range rep.Errors {
		t.Logf("first %s error: %s", outcome, msg)
	}
	for i, v := range rep.Violations {
		if i == 20 {
			t.Logf("... and %d more", len(rep.Violations)-i)
			break
		}
		t.Logf("violation: %s", v)
	}
	return outcome{in: in, rep: rep, faults: counts, syncWaits: syncWait}
}

// syncWaits counts the COMMITs of an old primary whose wait for the
// synchronous standby was cut short, as its log says: cancelled by their
// client (a cancel request, on the operation timeout) or cut by the
// server's shutdown (the heal's demotion). Each committed there without
// the standby's confirmation: after a Patroni kill, there alone, and it is
// lost with the old primary's timeline.
type syncWaits struct{ cancelled, terminated int }

func (w *syncWaits) add(o syncWaits) {
	w.cancelled, w.terminated = w.cancelled+o.cancelled, w.terminated+o.terminated
}

// The log lines of syncWaits.
const (
	syncWaitCancelled  = "canceling wait for synchronous replication due to user request"
	syncWaitTerminated = "canceling the wait for synchronous replication and terminating connection"
)

func countSyncWaits(log string) syncWaits {
	return syncWaits{strings.Count(log, syncWaitCancelled), strings.Count(log, syncWaitTerminated)}
}

// memberName is m's name, or "none".
func memberName(m *testdb.PatroniMember) string {
	if m == nil {
		return "none"
	}
	return m.Name()
}

// failover fails the Patroni cluster c over by kind, waits for the new
// leader, lets the old primary run on for hold when nobody stopped it (a
// Patroni kill), and heals the cluster. It returns the fault, from the
// failover's start to the heal's end, how the old primary's commits that
// waited for the synchronous standby ended, and how long it kept the old
// primary running.
func failover(t *testing.T, c *testdb.Patroni, kind string, hold time.Duration) (_ Fault, _ syncWaits, kept time.Duration) {
	t.Helper()
	old := c.Leader()
	require.NotNil(t, old, "no Patroni leader to fail over")
	before := countSyncWaits(old.Log())
	start := time.Now()
	f := Fault{Kind: kind, Worker: "cluster", Start: Micros(start), HeldUp: true}
	switch kind {
	case FailoverPostmaster:
		old.KillPostmaster(t)
	case FailoverPatroni:
		old.KillPatroni(t)
	case FailoverSwitchover:
		standby := c.SyncStandby()
		require.NotNil(t, standby, "no synchronous standby to switch over to")
		c.Switchover(t, old, standby)
	default:
		t.Fatalf("no failover %q", kind)
	}
	leader := c.WaitLeader(t, old, time.Minute)
	seen := time.Since(start)
	if kind == FailoverPatroni {
		time.Sleep(hold) // the old primary runs on, read-write: nobody stopped it
		kept = hold
	}
	healing := time.Now()
	c.Heal(t)
	f.End = Micros(time.Now())
	after := countSyncWaits(old.Log())
	w := syncWaits{after.cancelled - before.cancelled, after.terminated - before.terminated}
	t.Logf("%s from %s to %s: the new leader seen after %v, the old primary kept %v, healed in %v; "+
		"waits for synchronous replication on the old primary: %d cancelled, %d cut by the shutdown",
		kind, old.Name(), leader.Name(), seen.Round(time.Millisecond), kept.Round(time.Millisecond),
		time.Since(healing).Round(time.Millisecond), w.cancelled, w.terminated)
	return f, w, kept
}

// inject injects one fault of kind on s, and reports it, whether it
// caught anything (a commit stall may find no commit to stall), and a
// crashed worker's failure to start again.
func inject(s *slot, kind string, frac float64, restart time.Duration) (_ Fault, hit bool, err error) {
	f := Fault{Kind: kind, Worker: strconv.Itoa(s.n), Start: Micros(time.Now())}
	hit = true
	switch kind {
	case FaultPause:
		f.HeldUp = true
		s.signal(syscall.SIGSTOP)
		time.Sleep(time.Duration(frac * float64(s.cfg.Timeout)))
		s.signal(syscall.SIGCONT)
	case FaultRefuse:
		if s.cfg.RefuseFile == "" {
			return f, false, fmt.Errorf("worker %d refuses no connections: no server", s.n)
		}
		if err := os.WriteFile(s.cfg.RefuseFile, nil, 0o644); err != nil {
			return f, false, err
		}
		for i := range 3 {
			if i > 0 {
				time.Sleep(150 * time.Millisecond)
			}
			for _, p := range s.proxies {
				p.Cut()
			}
		}
		time.Sleep(time.Until(time.UnixMicro(f.Start).Add(time.Duration(frac * float64(max(s.cfg.Timeout, time.Second))))))
		if s.lift != nil {
			err = s.lift()
			break
		}
		// The refusal ends, if it can within 2 s, while no lease is held:
		// then a call of Do that began refused, when its first read works,
		// finds its target free, and the wave it began in may have saved.
		s.db.await(false, 2*time.Second)
		err = os.Remove(s.cfg.RefuseFile)
	case FaultKill:
		for i := range 3 {
			if i > 0 {
				time.Sleep(150 * time.Millisecond)
			}
			for _, p := range s.proxies {
				p.Cut()
			}
		}
	case FaultCrash:
		s.crash()
		time.Sleep(restart)
		err = s.start()
	case FaultStall:
		// Armed on every proxy; the first that trips stalls the commit.
		cases := make([]reflect.SelectCase, 0, len(s.proxies)+1)
		for _, p := range s.proxies {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.BlackholeOn(commitNeedle, false))})
		}
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(3 * time.Second))})
		chosen, _, _ := reflect.Select(cases)
		for _, p := range s.proxies {
			p.Disarm()
		}
		if chosen < len(s.proxies) {
			f.Start, f.HeldUp = Micros(time.Now()), true
			time.Sleep(s.cfg.Timeout + time.Second)
		} else {
			hit = false
		}
		for _, p := range s.proxies {
			p.Restore()
		}
	}
	f.End = Micros(time.Now())
	return f, hit, err
}

// refusingAddr returns a loopback address where the kernel refuses every
// connection: a socket bound to it, which does not listen, and which no
// other socket can bind while it is open, until t ends.
func refusingAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// seed is GORMLEASE_HISTORY_SEED, or a new one.
func seed(t *testing.T) uint64 {
	if v := os.Getenv("GORMLEASE_HISTORY_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "GORMLEASE_HISTORY_SEED")
		return n
	}
	return uint64(time.Now().UnixNano())
}

// duration is GORMLEASE_HISTORY_DURATION, or short. (The logs, and the
// model check's drawings of histories that are not linearizable, are kept
// in GORMLEASE_HISTORY_DIR, when set.)
func duration(t *testing.T, short time.Duration) time.Duration {
	if v := os.Getenv("GORMLEASE_HISTORY_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "GORMLEASE_HISTORY_DURATION")
		return d
	}
	return short
}
