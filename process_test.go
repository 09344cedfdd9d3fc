package gormlease_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// helperDSNEnv, when set, turns the test binary into a helper process that
// runs lease steps on the database it names (see helperProcess).
const helperDSNEnv = "GORMLEASE_TEST_HELPER_DSN"

// Several processes on one SQLite file, all starting at once: exactly one
// runs the work and saves, every other is refused with ErrLeaseHeld while
// the winner holds the lease.
func TestSQLite_ProcessesRunWorkOnce(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	db := s.DB(t)
	target := newTarget(t)
	const n = 6
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = startProc(t, s.DSN, fmt.Sprintf("p%d", i))
	}
	for _, p := range procs {
		p.expect("ready")
	}
	for i, p := range procs {
		p.send(fmt.Sprintf("run %s from-p%d", target, i))
	}
	var winner *proc
	for _, p := range procs {
		switch line := p.next(); {
		case strings.HasPrefix(line, "working"):
			require.Nil(t, winner, "%s works too, while %s holds the lease", p.name, winnerName(winner))
			winner = p
		case line != "held":
			t.Fatalf("%s: %q, want working or held", p.name, line)
		}
	}
	require.NotNil(t, winner, "no process ran the work")
	winner.send("finish")
	winner.expect("saving")
	winner.send("save")
	winner.expect("ok")

	got, row, err := gormlease.LoadJSON[string](context.Background(), db, target)
	require.NoError(t, err)
	assert.Equal(t, "from-"+winner.name, got)
	lease := leaseRow(t, db, target)
	assert.Equal(t, lease.Generation, row.Generation, "saved under another generation")
	assert.EqualValues(t, 1, lease.Generation, "more than one acquisition")
	assert.NotNil(t, lease.ReleasedAt, "lease not released")
	assert.Equal(t, "proc-"+winner.name, lease.Holder)
}

func winnerName(p *proc) string {
	if p == nil {
		return "none"
	}
	return p.name
}

// Across processes: a holder whose lease was taken over by another process
// is fenced off at its commit, and a takeover from a third process waits for
// the new holder's fenced commit to end.
func TestSQLite_ProcessesTakeoverAndFencedCommit(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	db := s.DB(t)
	target := newTarget(t)
	a, b, c := startProc(t, s.DSN, "a"), startProc(t, s.DSN, "b"), startProc(t, s.DSN, "c")
	for _, p := range []*proc{a, b, c} {
		p.expect("ready")
	}

	a.send("acquire " + target + " 1s")
	a.expect("acquiring")
	a.expect("acquired 1")
	age(t, s, db, target, 5*time.Second) // a stalls past the timeout
	b.send("run " + target + " from-b")
	b.expect("working 2")
	a.send("commit " + target + " from-a")
	a.expect("lost")
	assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "the stale holder saved")

	b.send("finish")
	b.expect("saving") // b's fenced commit holds the write lock
	c.send("acquire " + target + " 1us")
	c.expect("acquiring")
	c.expectNothing(300 * time.Millisecond)
	b.send("save")
	b.expect("ok")
	c.expect("acquired 3")

	got, row, err := gormlease.LoadJSON[string](context.Background(), db, target)
	require.NoError(t, err)
	assert.Equal(t, "from-b", got)
	assert.EqualValues(t, 2, row.Generation)
	assert.True(t, strings.HasSuffix(leaseRow(t, db, target).Holder, fmt.Sprintf("/%d", c.pid)),
		"the lease is not c's (pid %d)", c.pid)
}

// proc is a helper process, scripted line by line through its stdin.
type proc struct {
	t      *testing.T
	name   string
	pid    int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	killed atomic.Bool
}

// startProc starts a helper process on the database dsn (a testdb.Server's
// DSN), with env added to its environment. It is ended when t ends: told to by the end of its input, or
// killed when it does not exit within 20s.
func startProc(t *testing.T, dsn, name string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperDSNEnv+"="+dsn, "GORMLEASE_TEST_HELPER_NAME="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{t: t, name: name, pid: cmd.Process.Pid, cmd: cmd, stdin: stdin, lines: make(chan string, 256)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		go func() {
			for range p.lines { // what the test did not read
			}
		}()
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case the test left it stopped
		stdin.Close()                           // the helper exits at the end of its input
		exited := make(chan error, 1)
		go func() { <-done; exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if !p.killed.Load() {
				assert.NoError(t, err, "helper %s", name)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("helper %s did not exit", name)
		}
	})
	return p
}

// signal sends sig to the helper; after SIGKILL its exit is not checked.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if sig == syscall.SIGKILL {
		p.killed.Store(true)
	}
	require.NoError(p.t, p.cmd.Process.Signal(sig), "signal %s", p.name)
}

func (p *proc) send(line string) {
	p.t.Helper()
	_, err := fmt.Fprintln(p.stdin, line)
	require.NoError(p.t, err, "send to %s", p.name)
}

// next returns the next line that the helper prints.
func (p *proc) next() string {
	p.t.Helper()
	var line string
	var ok bool
	select {
	case line, ok = <-p.lines:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("%s printed nothing for 20s", p.name)
	}
	if !ok {
		p.t.Fatalf("%s exited", p.name)
	}
	return line
}

// expect requires the next line to be want.
func (p *proc) expect(want string) {
	p.t.Helper()
	require.Equal(p.t, want, p.next(), "from %s", p.name)
}

// expectNothing requires the helper to print nothing for d.
func (p *proc) expectNothing(d time.Duration) {
	p.t.Helper()
	select {
	case line := <-p.lines:
		p.t.Fatalf("%s printed %q, while it should wait", p.name, line)
	case <-time.After(d):
	}
}

// helperProcess runs lease steps on the database dsn (a testdb.Server's
// DSN: PostgreSQL, MySQL or SQLite), one command a line from stdin, and
// prints what came of each to stdout:
//
//	acquire TARGET TIMEOUT  prints "acquiring", then "acquired GEN" or "held"
//	commit TARGET VALUE     saves VALUE under the acquired lease: "committed" or "lost"
//	run TARGET VALUE        Runner.Run: "held", or "working GEN"; then reads
//	                        "finish", prints "saving", reads "save", saves
//	                        VALUE, and prints "ok" or "lost"
//	do TARGET N VALUE MODE  starts N calls of Runner.Do, in the background; a
//	                        work that runs prints "working GEN", and returns
//	                        VALUE at once (MODE quick) or at the next "finish"
//	                        line, whatever its context says (MODE hold); a
//	                        saver that runs prints "saver"; each call prints
//	                        "result VALUE shared|unshared" or "error KIND MSG"
//	                        (KIND: lost, held, sharedfailed, ctx or other)
//	status TARGET N         waits until N calls of Do share the job on TARGET
//	                        and it runs here ("holding") or waits for a
//	                        holder ("waiting")
//	finish                  lets the works of MODE hold return
//	lead ROLE               campaigns for ROLE with an Elector, in the
//	                        background, for one term: prints "leading GEN"
//	                        when lead is called, and "deposed GEN" when its
//	                        context is cancelled with ErrLeaseLost
//
// Anything else prints "error ..." and ends the helper with status 1. The
// helper ends when its input does, after its calls of Do have returned; it
// gives up on them, and on a work that holds, after helperLifetime.
func helperProcess(dsn string) int {
	name := os.Getenv("GORMLEASE_TEST_HELPER_NAME")
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	fail := func(format string, args ...any) int {
		say("error "+format, args...)
		return 1
	}
	db, err := testdb.OpenDSN(dsn)
	if err != nil {
		return fail("open: %v", err)
	}
	defer func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	}()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		return fail("repository: %v", err)
	}
	leaseTimeout := time.Second
	if v := os.Getenv(helperLeaseTimeoutEnv); v != "" {
		if leaseTimeout, err = time.ParseDuration(v); err != nil {
			return fail("%s: %v", helperLeaseTimeoutEnv, err)
		}
	}
	interval := 100 * time.Millisecond
	if v := os.Getenv(helperIntervalEnv); v != "" {
		if interval, err = time.ParseDuration(v); err != nil {
			return fail("%s: %v", helperIntervalEnv, err)
		}
	}
	opts := []gormlease.Option{gormlease.WithHolder("proc-" + name),
		gormlease.WithHeartbeatInterval(interval), gormlease.WithLeaseTimeout(leaseTimeout)}
	runner, err := gormlease.NewRunner[string](db, opts...)
	if err != nil {
		return fail("runner: %v", err)
	}
	// life bounds the helper's calls of Do; it ends early when the input does.
	life, endLife := context.WithTimeout(context.Background(), helperLifetime)
	defer endLife()
	var calls sync.WaitGroup
	defer calls.Wait()
	defer endLife() // runs first: the calls of Do end when the input does
	finish := make(chan struct{})
	finished := false
	var working atomic.Bool

	in := bufio.NewScanner(os.Stdin)
	readLine := func(want string) error {
		if !in.Scan() || in.Text() != want {
			return fmt.Errorf("expected %q on stdin", want)
		}
		return nil
	}
	var lease gormlease.Lease
	ctx := context.Background()
	say("ready")
	for in.Scan() {
		f := strings.Fields(in.Text())
		arity := map[string]int{"acquire": 3, "commit": 3, "run": 3, "do": 5, "status": 3, "finish": 1, "lead": 2}
		if len(f) == 0 || arity[f[0]] != len(f) {
			return fail("bad command %q", in.Text())
		}
		switch f[0] {
		case "acquire":
			timeout, err := time.ParseDuration(f[2])
			if err != nil {
				return fail("timeout: %v", err)
			}
			say("acquiring")
			lease, err = repo.Acquire(ctx, f[1], timeout)
			switch {
			case errors.Is(err, gormlease.ErrLeaseHeld):
				say("held")
			case err != nil:
				return fail("acquire: %v", err)
			default:
				say("acquired %d", lease.Generation)
			}
		case "commit":
			err := repo.CommitIfOwner(ctx, lease, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, f[2]) })
			switch {
			case errors.Is(err, gormlease.ErrLeaseLost):
				say("lost")
			case err != nil:
				return fail("commit: %v", err)
			default:
				say("committed")
			}
		case "run":
			_, err := runner.Run(ctx, f[1], func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				say("working %d", l.Generation)
				return f[2], readLine("finish")
			}, func(tx *gorm.DB, v string) error {
				say("saving")
				if err := readLine("save"); err != nil {
					return err
				}
				return gormlease.SaveJSON(tx, v)
			})
			switch {
			case errors.Is(err, gormlease.ErrLeaseHeld):
				say("held")
			case errors.Is(err, gormlease.ErrLeaseLost):
				say("lost")
			case err != nil:
				return fail("run: %v", err)
			default:
				say("ok")
			}
		case "do":
			n, err := strconv.Atoi(f[2])
			if err != nil {
				return fail("count: %v", err)
			}
			target, value, hold := f[1], f[3], f[4] == "hold"
			work := func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				working.Store(true)
				say("working %d", l.Generation)
				if hold {
					select { // deaf to ctx, as a stalled work would be
					case <-finish:
					case <-life.Done():
						return "", life.Err()
					}
				}
				return value, nil
			}
			save := func(tx *gorm.DB, v string) error {
				say("saver")
				return gormlease.SaveJSON(tx, v)
			}
			for range n {
				calls.Go(func() {
					v, shared, err := runner.Do(life, target, work, save, loadJSON(target))
					say("%s", doOutcome(v, shared, err))
				})
			}
		case "status":
			n, err := strconv.Atoi(f[2])
			if err != nil {
				return fail("count: %v", err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				joined := gormlease.DoCallers(runner, f[1]) == n
				if joined && working.Load() {
					say("holding")
					break
				}
				// The job's watch reads the row from before it acquires:
				// it waits only when the row is another process's.
				if joined && admin.New(repo).Waiters(f[1]).Held && !heldBy(db, f[1], "proc-"+name) {
					say("waiting")
					break
				}
				if time.Now().After(deadline) {
					return fail("status: %d calls of Do share the job, want %d; working: %v",
						gormlease.DoCallers(runner, f[1]), n, working.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
		case "lead":
			e, err := gormlease.NewElector(db, f[1], opts...)
			if err != nil {
				return fail("elector: %v", err)
			}
			calls.Go(func() {
				_ = e.Lead(life, func(ctx context.Context) error {
					l, _ := gormlease.LeaseFromContext(ctx)
					say("leading %d", l.Generation)
					<-ctx.Done()
					if errors.Is(context.Cause(ctx), gormlease.ErrLeaseLost) {
						say("deposed %d", l.Generation)
					}
					return nil
				})
			})
		case "finish":
			if !finished {
				close(finish)
				finished = true
			}
		}
	}
	return 0
}

// heldBy reports whether the lease on target is holder's, or cannot be read.
func heldBy(db *gorm.DB, target, holder string) bool {
	var h string
	err := db.Raw("SELECT holder FROM job_lease WHERE target_id = ?", target).Scan(&h).Error
	return err != nil || h == holder || strings.HasPrefix(h, holder+"/")
}

// helperLeaseTimeoutEnv sets the lease timeout of a helper's Runner: 1s
// when it is not set.
const helperLeaseTimeoutEnv = "GORMLEASE_TEST_HELPER_LEASE_TIMEOUT"

// helperIntervalEnv sets the heartbeat interval of a helper's Runner:
// 100ms when it is not set.
const helperIntervalEnv = "GORMLEASE_TEST_HELPER_INTERVAL"

// helperLifetime bounds a helper process's calls of Do.
const helperLifetime = time.Minute

// doOutcome is the line that a helper prints for what Do returned.
func doOutcome(v string, shared bool, err error) string {
	var kind string
	switch {
	case err == nil && shared:
		return "result " + v + " shared"
	case err == nil:
		return "result " + v + " unshared"
	case errors.Is(err, gormlease.ErrLeaseLost):
		kind = "lost"
	case errors.Is(err, gormlease.ErrLeaseHeld):
		kind = "held"
	case errors.Is(err, gormlease.ErrSharedJobFailed):
		kind = "sharedfailed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		kind = "ctx"
	default:
		kind = "other"
	}
	return "error " + kind + " " + strings.ReplaceAll(err.Error(), "\n", " ")
}
