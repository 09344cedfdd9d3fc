package history

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
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
)

// commitNeedle is in the statement of the fenced commit that saves and
// releases, and in no other.
const commitNeedle = "saved_generation = generation"

// scenario is one randomized run.
type scenario struct {
	duration time.Duration
	workers  int
	targets  int
	faults   []string
	seed     uint64
}

// slot is one worker, across its incarnations.
type slot struct {
	t     *testing.T
	n     int
	cfg   WorkerConfig
	proxy *testdb.Proxy
	dir   string

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
	s.incarnation++
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
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
	// faults counts the faults injected, by kind; stalls the commit
	// stalls that caught a commit.
	faults map[string]int
}

// runScenario runs sc on server: it starts the workers through proxies of
// their own, injects faults until sc.duration is over, stops the workers,
// and checks the history.
func runScenario(t *testing.T, server *testdb.Server, sc scenario) outcome {
	t.Helper()
	ctx := context.Background()
	t.Logf("scenario on %s: %v, %d workers, %d targets, faults %v, seed %d",
		server.Name, sc.duration, sc.workers, sc.targets, sc.faults, sc.seed)
	dsn := server.EmptyDSN(t)
	db, err := Open(dsn)
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	require.NoError(t, gormlease.AutoMigrate(ctx, db))
	require.NoError(t, Migrate(ctx, db))

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
	var maxTimeout time.Duration
	for i := range slots {
		// Each worker reaches a server through a proxy of its own; a SQLite
		// file has no server, and no proxy.
		var proxy *testdb.Proxy
		workerDSN := dsn
		if server.Addr != "" {
			proxy = testdb.NewProxy(t, server.Addr)
			workerDSN = strings.Replace(dsn, server.Addr, proxy.Addr(), 1)
		}
		interval := time.Duration(100+rng.IntN(101)) * time.Millisecond
		timeout := interval * time.Duration(5+rng.IntN(3))
		cfg := WorkerConfig{
			DSN: workerDSN, Targets: targets,
			Goroutines: 1 + rng.IntN(3), Interval: interval, Timeout: timeout,
			// Longer than a commit stall, so that the stalled commit
			// reaches the database.
			OpTimeout: timeout + 2*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond,
			WorkMin:   20 * time.Millisecond, WorkMax: time.Duration(100+rng.IntN(400)) * time.Millisecond,
			Seed: sc.seed + uint64(i),
		}
		maxTimeout = max(maxTimeout, timeout)
		t.Logf("worker %d: %d Run loops, heartbeat %v, lease timeout %v, operation timeout %v, work %v to %v",
			i, cfg.Goroutines, cfg.Interval, cfg.Timeout, cfg.OpTimeout, cfg.WorkMin, cfg.WorkMax)
		slots[i] = &slot{t: t, n: i, cfg: cfg, proxy: proxy, dir: dir}
	}
	// Whatever happens to the test, no worker outlives it.
	t.Cleanup(func() {
		for _, s := range slots {
			s.crash()
		}
	})
	from := Micros(time.Now())
	for _, s := range slots {
		require.NoError(t, s.start())
	}

	recovery := maxTimeout + time.Second
	window := 2500 * time.Millisecond
	var (
		mu     sync.Mutex
		faults []Fault
		counts = map[string]int{}
	)
	end := time.Now().Add(sc.duration)
	for time.Now().Add(recovery+window+4*time.Second).Before(end) && len(sc.faults) > 0 {
		// A fault phase: one or two faults at once, on distinct workers.
		var wg sync.WaitGroup
		for _, i := range rng.Perm(len(slots))[:min(len(slots), 1+rng.IntN(2))] {
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
		wg.Wait()
		// A quiet phase, long enough for a window after the recovery.
		time.Sleep(recovery + window + time.Duration(rng.IntN(1000))*time.Millisecond)
	}
	time.Sleep(time.Until(end))
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
	results, changes, err := ReadDB(ctx, db)
	require.NoError(t, err)
	in := Input{Events: events, Results: results, Changes: changes, Faults: faults, Targets: targets,
		From: from, To: to, Recovery: recovery, Window: window, VisualizeDir: visualize}
	if server.Name == "sqlite" {
		in.Resolution = time.Millisecond
	}
	rep := Check(in)
	t.Logf("checked %d Runs (%v), %d acquisitions, %d saves, %d lease row changes, %d model operations, %d quiet windows; faults %v; %d violations",
		rep.Runs, rep.Outcomes, rep.Acquisitions, rep.Saves, rep.Changes, rep.Ops, rep.Windows, counts, len(rep.Violations))
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
	return outcome{in: in, rep: rep, faults: counts}
}

// inject injects one fault of kind on s, and reports it, whether it
// caught anything (a commit stall may find no commit to stall), and a
// crashed worker's failure to start again.
func inject(s *slot, kind string, frac float64, restart time.Duration) (_ Fault, hit bool, err error) {
	f := Fault{Kind: kind, Worker: strconv.Itoa(s.n), Start: Micros(time.Now())}
	hit = true
	switch kind {
	case FaultPause:
		s.signal(syscall.SIGSTOP)
		time.Sleep(time.Duration(frac * float64(s.cfg.Timeout)))
		s.signal(syscall.SIGCONT)
	case FaultKill:
		for i := range 3 {
			if i > 0 {
				time.Sleep(150 * time.Millisecond)
			}
			s.proxy.Cut()
		}
	case FaultCrash:
		s.crash()
		time.Sleep(restart)
		err = s.start()
	case FaultStall:
		tripped := s.proxy.BlackholeOn(commitNeedle, false)
		select {
		case <-tripped:
			f.Start = Micros(time.Now())
			time.Sleep(s.cfg.Timeout + time.Second)
		case <-time.After(3 * time.Second):
			hit = false
			s.proxy.Disarm()
		}
		s.proxy.Restore()
	}
	f.End = Micros(time.Now())
	return f, hit, err
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
