package gormleasegocron_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	gormleasegocron "github.com/gormlease/gormlease/gocron"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The child processes' settings, by environment.
const (
	childModeEnv = "GORMLEASE_GOCRON_CHILD" // "locker" or "elector"
	childDSNEnv  = "GORMLEASE_GOCRON_DSN"
	childNameEnv = "GORMLEASE_GOCRON_NAME"
	childJobEnv  = "GORMLEASE_GOCRON_JOB" // the job's name, the role's too
)

// The schedule of the scheduler tests: a job every second, for ticks
// seconds, from a start that the test sends to every child.
const ticks = 10

// The elector children's lease: the timeout is long enough that a leader
// keeps its term on a loaded machine, the interval short enough to show
// failover within timeout + interval.
const (
	electorInterval = 250 * time.Millisecond
	electorTimeout  = 2 * time.Second
	// lockerMinHold keeps a tick's target held past the spread of the
	// children's timers, and ends before the next tick.
	lockerMinHold = 700 * time.Millisecond
)

// tickRun is a row that a child writes for each run of the job in the
// test's window: which process ran which tick (the second the run began).
type tickRun struct {
	ID   int64  `gorm:"primaryKey"`
	Job  string `gorm:"size:191;index"`
	Tick int64
	Proc string `gorm:"size:64"`
	AtMs int64  // when the run began, in Unix milliseconds
}

func (tickRun) TableName() string { return "gocron_tick_run" }

var migrateMu sync.Mutex

// runsTable makes the tickRun table on db, once per server and test
// process (AutoMigrate is not safe to run twice at once on a table).
func runsTable(t *testing.T, db *gorm.DB) {
	t.Helper()
	migrateMu.Lock()
	defer migrateMu.Unlock()
	require.NoError(t, db.AutoMigrate(&tickRun{}))
}

// eachDB runs fn as a parallel subtest on PostgreSQL, MariaDB and SQLite.
func eachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			db := s.DB(t)
			runsTable(t, db)
			fn(t, s, db)
		})
	}
}

// Three schedulers, each in a process of its own, run a fast job on every
// second's tick with the Locker and WithMinHold: each tick runs exactly
// once, though all three timers fire for it.
func TestLocker_ThreeSchedulersRunEachTickOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		job := "tick-" + uuid.NewString()[:8]
		children := startChildren(t, s, "locker", job)
		start := startSchedules(t, children)
		waitUntil(start.Add(ticks*time.Second + time.Second))
		stopChildren(t, children)

		runs := readRuns(t, db, job)
		for i := range int64(ticks) {
			tick := start.Unix() + i
			assert.Len(t, runs[tick], 1, "tick %d: runs by %v", i, runs[tick])
		}
		t.Logf("ticks by process: %s", byProcess(runs))
	})
}

// Three schedulers, each in a process of its own, with the
// DistributedElector: only the leader runs the job, once a tick; when the
// leader is killed, another leads within the lease timeout plus an interval
// and runs the job from then on.
func TestDistributedElector_ThreeSchedulersOnlyTheLeaderRuns(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := "leader-" + uuid.NewString()[:8]
		children := startChildren(t, s, "elector", role)
		watch, err := gormlease.NewElector(db, role)
		require.NoError(t, err)
		leader := func() string {
			info, leads, err := watch.Leader(context.Background())
			require.NoError(t, err)
			if !leads {
				return ""
			}
			return strings.TrimPrefix(info.Holder, "proc-")
		}
		// The children campaign from the moment they are ready; one of
		// them leads once its first acquire has been answered.
		deadline := time.Now().Add(20 * time.Second)
		for leader() == "" {
			require.True(t, time.Now().Before(deadline), "nobody leads 20s after the children are ready")
			time.Sleep(10 * time.Millisecond)
		}
		start := startSchedules(t, children)
		first := leader()
		require.NotEmpty(t, first, "nobody leads when the schedule starts")

		waitUntil(start.Add(4*time.Second + 500*time.Millisecond))
		require.Equal(t, first, leader(), "the leadership changed before the leader was killed")
		children[first].kill()
		killed := time.Now()
		var second string
		for second == "" || second == first {
			require.Less(t, time.Since(killed), 20*time.Second, "nobody took over after the leader was killed")
			time.Sleep(10 * time.Millisecond)
			second = leader()
		}
		took := time.Since(killed)
		t.Logf("%s led %v after %s was killed (lease timeout %v, interval %v)", second, took, first, electorTimeout, electorInterval)
		// A loaded machine gets a second more.
		assert.Less(t, took, electorTimeout+electorInterval+time.Second, "the takeover took too long")

		waitUntil(start.Add(ticks*time.Second + time.Second))
		stopChildren(t, children)
		runs := readRuns(t, db, role)
		var firstAfter time.Time
		for i := range int64(ticks) {
			tick := start.Unix() + i
			require.LessOrEqual(t, len(runs[tick]), 1, "tick %d ran more than once: %v", i, runs[tick])
			at := time.Unix(tick, 0)
			switch {
			case at.Before(killed.Truncate(time.Second)):
				assert.Len(t, runs[tick], 1, "tick %d, before the kill: runs by %v", i, runs[tick])
			case at.After(killed.Add(took)):
				assert.Len(t, runs[tick], 1, "tick %d, after the takeover: runs by %v", i, runs[tick])
			}
			for _, r := range runs[tick] {
				ranAt := time.UnixMilli(r.AtMs)
				if ranAt.Before(killed) {
					assert.Equal(t, first, r.Proc, "tick %d ran on a process that did not lead", i)
					continue
				}
				assert.Equal(t, second, r.Proc, "tick %d ran on a process that did not lead", i)
				if firstAfter.IsZero() {
					firstAfter = ranAt
				}
			}
		}
		require.False(t, firstAfter.IsZero(), "no tick ran after the leader was killed")
		t.Logf("the first run after the kill began %v after it", firstAfter.Sub(killed))
	})
}

// waitUntil sleeps until the wall clock reaches at: the schedule, not a
// synchronisation, decides when each step of the scheduler tests comes.
func waitUntil(at time.Time) { time.Sleep(time.Until(at)) }

// startSchedules tells every child to start its scheduler, with the
// window starting at a whole second at least two seconds away, and
// returns that start.
func startSchedules(t *testing.T, children map[string]*child) time.Time {
	t.Helper()
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	for _, c := range children {
		c.send(fmt.Sprintf("start %d", start.Unix()))
	}
	for _, c := range children {
		c.expect("started")
	}
	return start
}

// readRuns returns job's runs by tick.
func readRuns(t *testing.T, db *gorm.DB, job string) map[int64][]tickRun {
	t.Helper()
	var rows []tickRun
	require.NoError(t, db.Where("job = ?", job).Order("id").Find(&rows).Error)
	runs := map[int64][]tickRun{}
	for _, r := range rows {
		runs[r.Tick] = append(runs[r.Tick], r)
	}
	return runs
}

// byProcess says how many ticks each process ran.
func byProcess(runs map[int64][]tickRun) string {
	n := map[string]int{}
	for _, rs := range runs {
		for _, r := range rs {
			n[r.Proc]++
		}
	}
	var out []string
	for p, c := range n {
		out = append(out, fmt.Sprintf("%s:%d", p, c))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// child is a scheduler in a process of its own: this test binary, run
// again with childModeEnv set.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{} // closed when its output has ended
	killed bool
}

// startChildren starts three children, a, b and c, in mode, scheduling
// job on s, and waits until each is ready.
func startChildren(t *testing.T, s *testdb.Server, mode, job string) map[string]*child {
	t.Helper()
	children := map[string]*child{}
	for _, name := range []string{"a", "b", "c"} {
		children[name] = startChild(t, s.DSN, mode, name, job)
	}
	for _, c := range children {
		c.expect("ready")
	}
	return children
}

func startChild(t *testing.T, dsn, mode, name, job string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childDSNEnv+"="+dsn,
		childNameEnv+"="+name, childJobEnv+"="+job)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{t: t, name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 256), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *child) send(line string) {
	c.t.Helper()
	_, err := fmt.Fprintln(c.stdin, line)
	require.NoError(c.t, err, "send to %s", c.name)
}

// expect waits for the child's next line, which must be want.
func (c *child) expect(want string) {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		require.True(c.t, ok, "%s exited, want %q", c.name, want)
		require.Equal(c.t, want, line, "from %s", c.name)
	case <-time.After(30 * time.Second):
		c.t.Fatalf("%s: no %q in 30s", c.name, want)
	}
}

// kill kills the child with SIGKILL and waits for it to exit.
func (c *child) kill() {
	c.t.Helper()
	c.killed = true
	require.NoError(c.t, c.cmd.Process.Signal(syscall.SIGKILL))
	c.stop()
}

// stop ends the child's input, on which it shuts its scheduler down and
// exits, and waits for it; the lines it printed meanwhile must be none
// (the children print only errors once started). It is killed after 20s.
func (c *child) stop() {
	c.t.Helper()
	if c.cmd.ProcessState != nil {
		return
	}
	c.stdin.Close()
	var extra []string
	exited := make(chan error, 1)
	go func() {
		for line := range c.lines {
			extra = append(extra, line)
		}
		exited <- c.cmd.Wait()
	}()
	select {
	case err := <-exited:
		if !c.killed {
			assert.NoError(c.t, err, "child %s", c.name)
		}
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-exited
		c.t.Errorf("child %s did not exit", c.name)
	}
	assert.Empty(c.t, extra, "child %s said", c.name)
}

// stopChildren stops every child that is still running.
func stopChildren(t *testing.T, children map[string]*child) {
	t.Helper()
	for _, c := range children {
		c.stop()
	}
}

// schedulerChild is a child process: a gocron scheduler in mode, with a
// Locker or a DistributedElector on the database of childDSNEnv, running a
// job every second that records its ticks in the test's window. It says
// "ready", starts on "start <unix second>", says "started", and shuts down
// at the end of its input. It prints only errors after that.
func schedulerChild(mode string) int {
	name, job := os.Getenv(childNameEnv), os.Getenv(childJobEnv)
	fail := func(format string, args ...any) int {
		fmt.Printf("error "+format+"\n", args...)
		return 1
	}
	db, err := testdb.OpenDSN(os.Getenv(childDSNEnv))
	if err != nil {
		return fail("open: %v", err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	holder := gormlease.WithHolder("proc-" + name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opt gocron.SchedulerOption
	var elector *gormleasegocron.DistributedElector
	switch mode {
	case "locker":
		locker, err := gormleasegocron.NewLocker(db, holder, gormlease.WithMinHold(lockerMinHold))
		if err != nil {
			return fail("locker: %v", err)
		}
		opt = gocron.WithDistributedLocker(locker)
	case "elector":
		elector, err = gormleasegocron.NewDistributedElector(ctx, db, job, holder,
			gormlease.WithHeartbeatInterval(electorInterval), gormlease.WithLeaseTimeout(electorTimeout))
		if err != nil {
			return fail("elector: %v", err)
		}
		defer elector.Close()
		opt = gocron.WithDistributedElector(elector)
	default:
		return fail("mode %q", mode)
	}
	s, err := gocron.NewScheduler(opt)
	if err != nil {
		return fail("scheduler: %v", err)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	var start int64
	if !in.Scan() {
		return 0
	}
	if _, err := fmt.Sscanf(in.Text(), "start %d", &start); err != nil {
		return fail("%q: %v", in.Text(), err)
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		began := time.Now()
		tick := began.Truncate(time.Second).Unix()
		if tick < start || tick >= start+ticks {
			return
		}
		run := tickRun{Job: job, Tick: tick, Proc: name, AtMs: began.UnixMilli()}
		if err := db.Create(&run).Error; err != nil {
			fmt.Printf("error tick %d: %v\n", tick, err)
		}
	}), gocron.WithName(job))
	if err != nil {
		return fail("job: %v", err)
	}
	s.Start()
	fmt.Println("started")
	for in.Scan() {
	}
	if err := s.Shutdown(); err != nil {
		return fail("shutdown: %v", err)
	}
	return 0
}
