package testdb

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTestProcess returns a process whose log is in a directory of tb's own.
func newTestProcess(tb testing.TB) *process {
	dir := tb.TempDir()
	return &process{name: "test server", log: filepath.Join(dir, "log")}
}

// forkingServer starts, as p, a shell that starts a child of its own,
// writes the child's pid into a file and waits; it returns the child's pid
// once the file is written.
func forkingServer(t *testing.T, p *process) int {
	t.Helper()
	pidFile := filepath.Join(filepath.Dir(p.log), "child")
	require.NoError(t, p.start(exec.Command("sh", "-c", "sleep 300 & echo $! > "+pidFile+"; wait")))
	t.Cleanup(p.kill)
	var child int
	require.NoError(t, p.waitReady(10*time.Second, 10*time.Millisecond, func() error {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return err
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	}))
	return child
}

// gone reports whether pid has exited: no such process, or a zombie that
// waits for its parent (init, which may be slow to reap it).
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err != nil || strings.Contains(string(b), ") Z ")
}

// processState is the state letter of pid in /proc (R, S, T, Z, ...).
func processState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(b), ") ")
	require.True(t, ok, "stat of %d: %q", pid, b)
	return after[:1]
}

// waitGone waits until pid has exited, failing t after 10s.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive 10s after its group was stopped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stopping a server stops what it forked too (a state transfer's rsync,
// Patroni's helpers): the signal goes to its whole process group.
func TestProcess_StopEndsTheWholeGroup(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(p *process)
	}{
		{"Terminate", func(p *process) { p.stop(syscall.SIGTERM, time.Minute) }},
		{"Kill", func(p *process) { p.kill() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProcess(t)
			child := forkingServer(t, p)
			require.True(t, p.running())

			tc.stop(p)
			assert.False(t, p.running())
			waitGone(t, child)
		})
	}
}

// pause stops the whole group, as a hung server, and resume continues it.
func TestProcess_PauseStopsTheGroupUntilResume(t *testing.T) {
	p := newTestProcess(t)
	child := forkingServer(t, p)
	cmd, _ := p.latest()

	p.pause()
	deadline := time.Now().Add(10 * time.Second)
	for processState(t, child) != "T" || processState(t, cmd.Process.Pid) != "T" {
		if time.Now().After(deadline) {
			t.Fatalf("not stopped 10s after pause: the shell is %s, its child %s",
				processState(t, cmd.Process.Pid), processState(t, child))
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.True(t, p.running(), "a paused process is alive")

	p.resume()
	deadline = time.Now().Add(10 * time.Second)
	for processState(t, child) == "T" || processState(t, cmd.Process.Pid) == "T" {
		if time.Now().After(deadline) {
			t.Fatal("still stopped 10s after resume")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A server that exits while starting ends the wait at once, and the error
// shows the end of its log.
func TestProcess_WaitReadyReportsAnExitWithTheLog(t *testing.T) {
	p := newTestProcess(t)
	require.NoError(t, p.start(exec.Command("sh", "-c", "echo no such data directory >&2; exit 3")))

	start := time.Now()
	err := p.waitReady(time.Minute, 10*time.Millisecond, func() error { return errors.New("no answer") })
	require.Error(t, err)
	assert.Less(t, time.Since(start), 30*time.Second, "waited for the timeout, not for the exit")
	assert.Contains(t, err.Error(), "test server exited while starting (no answer)")
	assert.Contains(t, err.Error(), "no such data directory")
	assert.False(t, p.running())
}

// A server that never answers fails the wait after the timeout, naming
// why, with the end of its log.
func TestProcess_WaitReadyTimesOut(t *testing.T) {
	p := newTestProcess(t)
	require.NoError(t, p.start(exec.Command("sh", "-c", "echo listening nowhere; exec sleep 300")))
	t.Cleanup(p.kill)
	require.NoError(t, p.waitReady(10*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(p.logTail(), "listening nowhere") {
			return errors.New("not written yet")
		}
		return nil
	}))

	err := p.waitReady(200*time.Millisecond, 10*time.Millisecond, func() error { return errors.New("connection refused") })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "test server not ready after 200ms (connection refused)")
	assert.Contains(t, err.Error(), "listening nowhere")
	assert.True(t, p.running())
}

// A server stopped can be started again; the log keeps what each start
// wrote.
func TestProcess_StartsAgainAfterKill(t *testing.T) {
	p := newTestProcess(t)
	assert.False(t, p.running(), "before the first start")
	p.kill() // nothing to kill yet

	for i := 1; i <= 2; i++ {
		require.NoError(t, p.start(exec.Command("sh", "-c", fmt.Sprintf("echo start %d; exec sleep 300", i))))
		require.NoError(t, p.waitReady(10*time.Second, 10*time.Millisecond, func() error {
			if !strings.Contains(p.logTail(), fmt.Sprintf("start %d", i)) {
				return errors.New("not written yet")
			}
			return nil
		}))
		assert.True(t, p.running())
		p.kill()
		assert.False(t, p.running())
	}
	assert.Contains(t, p.logTail(), "start 1\nstart 2\n")
}

// counted is a harness that counts its starts.
type counted struct{ starts int }

func (*counted) close() error { return nil }

// A shared harness starts once, however many tests ask for it.
func TestSharedHarness_StartsOnce(t *testing.T) {
	var starts int
	h := sharedHarness[*counted]{name: "counted", start: func(testing.TB) (*counted, error) {
		starts++
		return &counted{starts: starts}, nil
	}}
	for i := 0; i < 3; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			assert.Equal(t, 1, h.get(t).starts)
		})
	}
	assert.Equal(t, 1, starts)
}
