package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ory/dockertest/v3/docker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/testdb"
)

// dockerRequired reports whether GORMLEASE_TEST_DOCKER asks for the
// TestDocker_ tests, which need a Docker engine: dockerpass sets it.
func dockerRequired() bool { return os.Getenv(dockerEnv) != "" }

// killedOwnerEnv makes TestDocker_KilledOwnerLeavesNoContainer, in a child
// process, the process that is killed.
const killedOwnerEnv = "GORMLEASE_TESTDB_KILLED_OWNER"

// A process that started a container and was then killed (SIGKILL: no
// stop, no cleanup of any kind) leaves no container behind: the next
// dockerpass start removes it, and its main process runs under a timeout
// anyway.
func TestDocker_KilledOwnerLeavesNoContainer(t *testing.T) {
	if os.Getenv(killedOwnerEnv) != "" {
		beKilledOwner()
	}
	if !dockerRequired() {
		t.Skip(dockerEnv + " is not set: this test runs in the docker pass of .ci/run")
	}
	p, err := dockerPool()
	require.NoError(t, err)

	// The child starts a PostgreSQL container of its own.
	cmd := exec.Command(os.Args[0], "-test.run=^TestDocker_KilledOwnerLeavesNoContainer$",
		"-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), killedOwnerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // the child waits on it
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	waited := false
	t.Cleanup(func() {
		stdin.Close()
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	ids := make(chan string, 1)
	go func() {
		defer close(ids)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "CONTAINER "); ok {
				ids <- id
				return
			}
		}
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(2 * time.Minute):
		t.Fatal("the child did not start a container within 2 minutes")
	}
	require.NotEmpty(t, id, "the child exited without starting a container")

	c, err := p.Client.InspectContainer(id)
	require.NoError(t, err)
	assert.True(t, c.State.Running, "the child's container runs")
	assert.Equal(t, strconv.Itoa(cmd.Process.Pid), c.Config.Labels[labelPID], "its owner label")
	require.NotEmpty(t, c.Config.Entrypoint)
	assert.Equal(t, "timeout", c.Config.Entrypoint[0], "its main process runs under timeout: %v", c.Config.Entrypoint)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	waited = true
	<-ids
	// The child cleaned up nothing: its container is still there.
	c, err = p.Client.InspectContainer(id)
	require.NoError(t, err, "the killed child's container")
	assert.True(t, ownerGone(c.Config.Labels), "its owner is gone")

	// What the next dockerpass start does.
	removed, err := reapOrphans(p)
	require.NoError(t, err)
	assert.Contains(t, removed, id)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := p.Client.InspectContainer(id)
		var gone *docker.NoSuchContainer
		if errors.As(err, &gone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s still there 30s after it was removed: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.False(t, ownerGone(ownerLabels()), "this process is not gone")
}

// beKilledOwner is the child of TestDocker_KilledOwnerLeavesNoContainer: it
// starts a PostgreSQL container, as dockerpass does, prints its ID and
// waits to be killed.
func beKilledOwner() {
	c, err := startContainer(postgresSpec(6 * time.Minute)) // its -test.timeout, and a minute
	if err != nil {
		fmt.Fprintln(os.Stderr, "dockerpass:", err)
		os.Exit(1)
	}
	os.Stdout.WriteString("CONTAINER " + c.id + "\n")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed, or the parent's stdin closes
	os.Exit(1)
}

// A container that cannot serve the tests fails with an error that names
// the cause.
func TestDocker_StartupErrorsNameTheCause(t *testing.T) {
	if !dockerRequired() {
		t.Skip(dockerEnv + " is not set: this test runs in the docker pass of .ci/run")
	}
	p, err := dockerPool()
	require.NoError(t, err)
	postgres := func(env ...string) containerSpec {
		spec := postgresSpec(10 * time.Minute)
		spec.env = func(port int) []string { return append(env, "PGPORT="+strconv.Itoa(port)) }
		return spec
	}

	t.Run("ImageMissing", func(t *testing.T) {
		spec := postgres()
		spec.image = "gormlease-no-such-image:0"
		c, err := startContainer(spec)
		stopIfStarted(c)
		require.Error(t, err)
		t.Log(err)
		assert.Contains(t, err.Error(), "image gormlease-no-such-image:0 not found: run scripts/docker-images.sh")
	})

	t.Run("ExitsDuringStartup", func(t *testing.T) {
		// Neither this image nor the official one starts without
		// POSTGRES_HOST_AUTH_METHOD or POSTGRES_PASSWORD.
		c, err := startContainer(postgres())
		stopIfStarted(c)
		require.Error(t, err)
		t.Log(err)
		assert.Contains(t, err.Error(), "exited during startup; last lines of its log:\n\t")
		assert.Contains(t, err.Error(), "POSTGRES_")
	})

	t.Run("PortInUse", func(t *testing.T) {
		port, err := testdb.FreePort()
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		require.NoError(t, err)
		defer ln.Close()
		img, err := p.Client.InspectImage("postgres:15")
		require.NoError(t, err)
		c, err := runContainer(p, postgres("POSTGRES_HOST_AUTH_METHOD=trust"), img, port)
		stopIfStarted(c)
		var inUse *portInUseError
		require.ErrorAs(t, err, &inUse)
		t.Log(err)
		assert.Contains(t, err.Error(), "port "+strconv.Itoa(port)+" on 127.0.0.1 is in use")
	})
}

// stopIfStarted removes c, a container that a test expected not to start,
// when it did start.
func stopIfStarted(c *container) {
	if c != nil {
		_ = c.stop()
	}
}
