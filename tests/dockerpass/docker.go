package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"

	"github.com/gormlease/gormlease/internal/testdb"
)

// The containers: dockerpass starts one container per server, in the
// host's network (NetworkMode "host") on a free port of 127.0.0.1, so that
// the tests reach it on loopback and never on a bridge's private addresses.
// The images are asked for by the official images' names; where no
// registry is reachable, scripts/docker-images.sh builds them. dockerpass
// never pulls an image.
//
// No container outlives its dockerpass process for long, even one that is
// killed: every container is labelled with its process (host name, pid and
// the pid's start time), and each dockerpass start removes those whose
// process is gone (reapOrphans); and its main process runs under
// timeout(1), which kills it once the tests' time, and a minute, have
// passed. AutoRemove then removes the stopped container.
const (
	labelHost     = "org.gormlease.dockerpass.host"      // the owner process's host name
	labelPID      = "org.gormlease.dockerpass.pid"       // its process id
	labelPIDStart = "org.gormlease.dockerpass.pid-start" // its start, in clock ticks after boot: a reused pid is another process
)

var (
	poolOnce sync.Once
	pool     *dockertest.Pool
	poolErr  error
)

// dockerPool returns the process's dockertest pool when a Docker engine
// answers a ping within a few seconds. The first call also removes the
// containers of processes that are gone (see reapOrphans).
func dockerPool() (*dockertest.Pool, error) {
	poolOnce.Do(func() {
		pool, poolErr = newDockerPool()
		if poolErr == nil {
			removed, err := reapOrphans(pool)
			for _, id := range removed {
				fmt.Fprintf(os.Stderr, "dockerpass: removed container %.12s, whose process is gone\n", id)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "dockerpass: removing the containers of processes that are gone:", err)
			}
		}
	})
	return pool, poolErr
}

func newDockerPool() (*dockertest.Pool, error) {
	p, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("no Docker client: %w", err)
	}
	// Client.Ping has no timeout of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := p.Client.PingWithContext(ctx); err != nil {
		return nil, fmt.Errorf("no Docker engine answers at %s: %w", p.Client.Endpoint(), err)
	}
	return p, nil
}

// containerSpec is a database server to run in a container.
type containerSpec struct {
	image   string                  // repository:tag, such as "postgres:15"
	env     func(port int) []string // the container's environment
	cmd     func(port int) []string // the arguments to the image's entrypoint
	ready   func(port int) error    // nil once the server accepts the tests' connections
	maxWait time.Duration           // for ready to return nil
	// lifetime is how long the container's main process may run: it runs
	// under timeout(1), which kills it then. 0 is no bound.
	lifetime time.Duration
}

// container is a running container of a containerSpec.
type container struct {
	image string
	id    string
	port  int // its server's, on 127.0.0.1
	// stop removes the container, and returns once its output has ended.
	stop func() error
}

// portTries is how many free ports startContainer tries, one after another,
// when another process took the port before the container's server did.
const portTries = 3

// startContainer starts spec's image on a free port of 127.0.0.1 and waits
// until spec.ready answers. The caller removes the container with its stop.
// Its errors say why: no engine, no image, the port in use, or the server
// exiting or not answering, with the last lines of its log.
func startContainer(spec containerSpec) (*container, error) {
	p, err := dockerPool()
	if err != nil {
		return nil, err
	}
	img, err := p.Client.InspectImage(spec.image)
	if errors.Is(err, docker.ErrNoSuchImage) {
		return nil, fmt.Errorf("image %s not found: run scripts/docker-images.sh (or docker pull %[1]s)", spec.image)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect image %s: %w", spec.image, err)
	}
	for try := 1; ; try++ {
		// Below the kernel's ephemeral range: see testdb.FreePort.
		port, err := testdb.FreePort()
		if err != nil {
			return nil, err
		}
		c, err := runContainer(p, spec, img, port)
		var inUse *portInUseError
		if err == nil || !errors.As(err, &inUse) || try == portTries {
			return c, err
		}
	}
}

// portInUseError says that the container's server could not listen on its
// port, which another process took first.
type portInUseError struct {
	image string
	port  int
	log   string
}

func (e *portInUseError) Error() string {
	return fmt.Sprintf("%s: port %d on 127.0.0.1 is in use (by another process); last lines of its log:\n%s",
		e.image, e.port, e.log)
}

// runContainer runs one container of spec on port and waits for it.
func runContainer(p *dockertest.Pool, spec containerSpec, img *docker.Image, port int) (*container, error) {
	var entrypoint []string
	if img.Config != nil {
		entrypoint = img.Config.Entrypoint
	}
	if spec.lifetime > 0 && len(entrypoint) > 0 {
		entrypoint = append([]string{"timeout", "-s", "KILL", strconv.Itoa(int(spec.lifetime.Seconds()))}, entrypoint...)
	}
	c, err := p.Client.CreateContainer(docker.CreateContainerOptions{
		Config: &docker.Config{
			Image:      spec.image,
			Env:        spec.env(port),
			Cmd:        spec.cmd(port),
			Entrypoint: entrypoint,
			Labels:     ownerLabels(),
		},
		HostConfig: &docker.HostConfig{
			NetworkMode:   "host",
			AutoRemove:    true,
			RestartPolicy: docker.NeverRestart(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create a container of %s: %w", spec.image, err)
	}
	remove := func() error {
		err := p.Client.RemoveContainer(docker.RemoveContainerOptions{ID: c.ID, Force: true, RemoveVolumes: true})
		var gone *docker.NoSuchContainer
		if errors.As(err, &gone) {
			return nil // it had exited, and AutoRemove removed it
		}
		return err
	}

	// Attached before it starts, so that the log of a container that exits
	// at once, and is removed with it, is still read.
	logs := &logTail{}
	attached := make(chan struct{})
	cw, err := p.Client.AttachToContainerNonBlocking(docker.AttachToContainerOptions{
		Container: c.ID, OutputStream: logs, ErrorStream: logs,
		Stream: true, Stdout: true, Stderr: true, Success: attached,
	})
	if err != nil {
		_ = remove()
		return nil, fmt.Errorf("attach to the container of %s: %w", spec.image, err)
	}
	<-attached
	attached <- struct{}{}
	exited := make(chan struct{}) // the container's output ended: it stopped
	go func() {
		_ = cw.Wait()
		close(exited)
	}()
	stop := func() error {
		err := remove()
		_ = cw.Close()
		<-exited
		return err
	}

	if err := p.Client.StartContainer(c.ID, nil); err != nil {
		_ = stop()
		return nil, fmt.Errorf("start the container of %s: %w", spec.image, err)
	}
	deadline := time.Now().Add(spec.maxWait)
	for {
		err := spec.ready(port)
		if err == nil {
			// Still running: what answered was its server, not another
			// process's that took the port first.
			if st, ierr := p.Client.InspectContainer(c.ID); ierr == nil && st.State.Running {
				break
			}
		}
		select {
		case <-exited:
			_ = stop()
			if strings.Contains(logs.String(), "Address already in use") {
				return nil, &portInUseError{image: spec.image, port: port, log: logs.last(20)}
			}
			return nil, fmt.Errorf("the container of %s exited during startup; last lines of its log:\n%s",
				spec.image, logs.last(20))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = stop()
			return nil, fmt.Errorf("%s did not answer on 127.0.0.1:%d within %v: %v; last lines of its log:\n%s",
				spec.image, port, spec.maxWait, err, logs.last(20))
		}
	}
	fmt.Fprintf(os.Stderr, "dockerpass: %s in container %.12s on 127.0.0.1:%d\n", spec.image, c.ID, port)
	return &container{image: spec.image, id: c.ID, port: port, stop: stop}, nil
}

// ownerLabels are the labels of this process's containers.
func ownerLabels() map[string]string {
	host, _ := os.Hostname()
	_, start := procStat(os.Getpid())
	return map[string]string{labelHost: host, labelPID: strconv.Itoa(os.Getpid()), labelPIDStart: start}
}

// reapOrphans removes the containers, on this host, of the processes that
// are gone, and returns their IDs.
func reapOrphans(p *dockertest.Pool) (removed []string, err error) {
	host, _ := os.Hostname()
	list, err := p.Client.ListContainers(docker.ListContainersOptions{
		All:     true,
		Filters: map[string][]string{"label": {labelHost + "=" + host}},
	})
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, c := range list {
		if !ownerGone(c.Labels) {
			continue
		}
		err := p.Client.RemoveContainer(docker.RemoveContainerOptions{ID: c.ID, Force: true, RemoveVolumes: true})
		var gone *docker.NoSuchContainer
		if err != nil && !errors.As(err, &gone) {
			errs = append(errs, fmt.Errorf("remove %.12s: %w", c.ID, err))
			continue
		}
		removed = append(removed, c.ID)
	}
	return removed, errors.Join(errs...)
}

// ownerGone reports whether the process that labels name is gone: no
// such process, a zombie, or another process under a reused pid.
func ownerGone(labels map[string]string) bool {
	pid, err := strconv.Atoi(labels[labelPID])
	if err != nil || pid <= 0 {
		return false // not one of ours
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	state, start := procStat(pid)
	if state == "Z" {
		return true
	}
	want := labels[labelPIDStart]
	return want != "" && start != "" && start != want
}

// procStat returns the state and the start time (in clock ticks after
// boot) of process pid, from /proc/PID/stat, or empty strings when unknown.
func procStat(pid int) (state, start string) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", ""
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", ""
	}
	return f[0], f[19] // fields 3 and 22 of proc(5)
}

// logTail keeps the end of a container's output.
type logTail struct {
	mu  sync.Mutex
	buf []byte
}

// logTailMax is how much of a container's output logTail keeps.
const logTailMax = 64 << 10

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - logTailMax; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// last returns the last n lines, indented, or a note that there were none.
func (l *logTail) last(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "\t(nothing)"
	}
	return "\t" + strings.Join(lines, "\n\t")
}
