package testdb

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// process is a server process that a harness runs, and may stop and start
// again: a Galera node's mariadbd, a Patroni member's Patroni, etcd, a
// network namespace's server, PgBouncer.
//
// Each start runs in a process group of its own, so that a signal reaches
// what the server forks too (a state transfer's rsync, the helpers that
// Patroni runs), and with a parent-death signal, so that it dies with the
// test process even when that is killed and no cleanup runs. Its output is
// appended to its log file, which errors quote the end of.
type process struct {
	name string // in errors, such as "Galera node 1"
	log  string // the file its output goes to
	// launch starts cmd and closes exited once cmd has exited and been
	// reaped; nil starts it from this goroutine's thread. A network
	// namespace launches from a thread of its own (see Netns.startIn).
	launch func(cmd *exec.Cmd, exited chan<- struct{}) error

	mu     sync.Mutex
	cmd    *exec.Cmd     // the latest start's, nil before the first
	exited chan struct{} // closed once that start's process has exited
	paused bool          // SIGSTOPped by pause, until resume
}

// start starts cmd as the process, with its output appended to the log
// file, which is made if missing and owned by the user that cmd runs as.
func (p *process) start(cmd *exec.Cmd) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if cred := cmd.SysProcAttr.Credential; cred != nil {
		if err := logf.Chown(int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	launch := p.launch
	if launch == nil {
		launch = startReaped
	}
	exited := make(chan struct{})
	if err := launch(cmd, exited); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.mu.Lock()
	p.cmd, p.exited, p.paused = cmd, exited, false
	p.mu.Unlock()
	return nil
}

// startReaped starts cmd, and closes exited once it has exited.
func startReaped(cmd *exec.Cmd, exited chan<- struct{}) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return nil
}

// latest returns the latest start's command and exited channel, nil before
// the first start.
func (p *process) latest() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// waitReady calls ready every interval until it returns nil, and fails
// when the latest start's process exits first, or after timeout, with the
// end of the log.
func (p *process) waitReady(timeout, interval time.Duration, ready func() error) error {
	_, exited := p.latest()
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting (%v):\n%s", p.name, err, p.logTail())
		case <-time.After(interval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (%v):\n%s", p.name, timeout, err, p.logTail())
		}
	}
}

// running reports whether the latest start's process is alive.
func (p *process) running() bool {
	cmd, exited := p.latest()
	if cmd == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// stop sends sig to the process's group and waits until the process has
// exited, sending SIGKILL when it has not after grace. It does nothing
// before the first start.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	cmd, exited := p.latest()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// kill kills the process's group with SIGKILL, as a crash would, and waits
// until the process has exited.
func (p *process) kill() { p.stop(syscall.SIGKILL, time.Minute) }

// pause stops the process's group with SIGSTOP, as a hung process, until
// resume.
func (p *process) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP)
		p.paused = true
	}
}

// resume continues a process that pause stopped.
func (p *process) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.paused {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
		p.paused = false
	}
}

// userIDs returns the uid and gid of the user called name, for runAs.
func userIDs(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, err
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// runAs makes cmd run as the user with uid and gid.
func runAs(cmd *exec.Cmd, uid, gid int) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// logTail is the end of the process's log.
func (p *process) logTail() string { return tail(p.log) }

// tail is the end of the file at path.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// sharedHarness is a harness that a test process starts once, on first use,
// and shares between its tests; Close closes it.
type sharedHarness[T interface{ close() error }] struct {
	name string // in messages, such as "Patroni cluster"
	// start starts the harness; it may log to tb, the test that first
	// asked for it, and leaves nothing running when it fails.
	start func(tb testing.TB) (T, error)

	once sync.Once
	h    T
	err  error
}

// get returns the harness, starting it on first use, or ends tb when it
// could not be started: skipped (failed under CI) when a prerequisite is
// missing, failed otherwise.
func (s *sharedHarness[T]) get(tb testing.TB) T {
	tb.Helper()
	s.once.Do(func() {
		s.h, s.err = s.start(tb)
		if s.err == nil {
			closeAtEnd(s.h.close)
		}
	})
	if s.err != nil {
		startFailed(tb, s.name, s.err)
	}
	return s.h
}
