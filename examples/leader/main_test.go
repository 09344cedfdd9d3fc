package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/testdb"
)

// childArgs, in a child process of the test, holds the arguments of the
// program that the child runs, one a line.
const childArgs = "LEADER_EXAMPLE_ARGS"

// TestMain runs the tests (testdb.Main: goroutine leaks fail the run), or,
// in a child process of TestLeader_SIGTERMHandsOver, the program itself.
func TestMain(m *testing.M) {
	if args := os.Getenv(childArgs); args != "" {
		os.Args = append([]string{"leader"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	testdb.Main(m)
}

// copyProc is a running copy of the program, with the lines it prints.
type copyProc struct {
	name   string
	cmd    *exec.Cmd
	lines  chan string   // closed when its output ends
	exited chan struct{} // closed when it has exited
	err    error         // how it exited, once exited is closed
}

// startCopy starts a copy of the program named name on dsn, and stops it
// (SIGKILL) at the end of the test if it is still running.
func startCopy(t *testing.T, dsn, name string, leaseTimeout time.Duration) *copyProc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childArgs+"="+strings.Join([]string{
		"-dsn", dsn, "-holder", name, "-lease-timeout", leaseTimeout.String()}, "\n"))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	p := &copyProc{name: name, cmd: cmd, lines: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range p.lines {
		}
		<-p.exited
	})
	return p
}

// next returns the next line p prints, failing t after timeout or when p
// exits first.
func (p *copyProc) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s exited", p.name)
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("%s printed nothing for %v", p.name, timeout)
		return ""
	}
}

// A rolling deploy stops the leader's process with SIGTERM: with
// signal.NotifyContext the leader releases the role as it stops, and the
// standby in another process leads far sooner than the lease timeout after
// which it would lead had the leader died holding it. On SQLite (one file,
// two processes) and PostgreSQL.
func TestLeader_SIGTERMHandsOver(t *testing.T) {
	const leaseTimeout = 20 * time.Second // a standby polls a quarter of it apart
	dsns := map[string]string{
		"sqlite":   filepath.Join(t.TempDir(), "leader.db"),
		"postgres": testdb.Postgres(t).DSN,
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			a := startCopy(t, dsn, "pod-a", leaseTimeout)
			require.Equal(t, "standing by", a.next(t, 30*time.Second))
			var term int64
			line := a.next(t, 30*time.Second)
			_, err := fmt.Sscanf(line, "leading, term %d", &term)
			require.NoError(t, err, "pod-a: %q", line)

			b := startCopy(t, dsn, "pod-b", leaseTimeout)
			require.Equal(t, "standing by", b.next(t, 30*time.Second))

			require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
			sent := time.Now()
			assert.Equal(t, fmt.Sprintf("leading, term %d", term+1), b.next(t, leaseTimeout+10*time.Second))
			took := time.Since(sent)
			t.Logf("pod-b led %v after pod-a's SIGTERM", took)
			assert.Less(t, took, leaseTimeout/2, "the standby waited for the lease to time out")
			assert.Equal(t, "stopped", a.next(t, 10*time.Second))
			select {
			case <-a.exited:
				assert.NoError(t, a.err, "pod-a's exit")
			case <-time.After(10 * time.Second):
				t.Fatal("pod-a did not exit after SIGTERM")
			}
			require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
			assert.Equal(t, "stopped", b.next(t, 10*time.Second))
		})
	}
}
