package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
	"github.com/gormlease/gormlease/leasetest"
)

// The command itself, on PostgreSQL, with a job of an hour at work: a
// SIGTERM makes it wait SHUTDOWN_GRACE, cancel the job, release its
// target (not left live for the lease's timeout), answer its client 503,
// and exit 0.
func TestSIGTERM_ReleasesTheTargetAndExits(t *testing.T) {
	s := testdb.Postgres(t)
	db := s.DB(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HTTPSERVICE_MAIN=1", "DATABASE_URL="+s.DSN, "ADDR=127.0.0.1:0",
		"MIGRATE=1", "WORK=1h", "SHUTDOWN_GRACE=300ms")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var exitErr error
	addr := make(chan string, 1)
	logged := make(chan string, 100)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "serving" {
				addr <- rec.Addr
			}
			select {
			case logged <- lines.Text():
			default:
			}
		}
		exitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	svc := &service{base: "http://" + testkit.Recv(t, addr, 60*time.Second, "the service's address")}
	id := newID()
	answer := svc.goCall(t.Context(), "POST", "/refresh/"+id)
	leasetest.WaitFor(t, db, "refresh:"+id, admin.StateLive, 10*time.Second)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	r := testkit.Recv(t, answer, 10*time.Second, "the answer")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
	assert.Equal(t, "shutting down: nothing saved; try again\n", r.body)
	testkit.Recv(t, exited, 10*time.Second, "the command's exit")
	for len(logged) > 0 {
		t.Log(<-logged)
	}
	require.NoError(t, exitErr, "the command's exit")
	released(t, db, "refresh:"+id)
}
