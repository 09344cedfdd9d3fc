package testdb

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Patroni is a PostgreSQL cluster managed by Patroni, as production runs
// one: a one-node etcd and three Patroni members on 127.0.0.1, each with
// its own PostgreSQL and REST API ports and data directory in a temporary
// directory. One cluster is started per test process, on first use, and
// shared by the tests that need one (see SharedPatroni); Close stops it.
// Each test works on targets of its own. A test that fails a member over
// calls Heal before it ends, so that the next test finds three members,
// one of them the synchronous standby.
//
// The cluster runs in strict synchronous mode (synchronous_mode and
// synchronous_mode_strict): the leader names one standby in
// synchronous_standby_names, only that one may be promoted, and commits
// wait while there is none, rather than go asynchronous. ttl, loop_wait
// and retry_timeout are 7, 1 and 3 seconds, and primary_start_timeout is
// 0, so that a crashed postmaster fails over at once instead of being
// restarted in place (under load, only because Patroni reaches its own
// PostgreSQL through the Unix socket: see yaml). There is no watchdog: a
// member whose Patroni dies leaves its PostgreSQL running, as on a machine
// without a watchdog device.
//
// Patroni and PostgreSQL run as the "postgres" user. Readiness is read from
// Patroni's REST API (/primary, /sync, /replica). Every process is stopped
// by its pid when the cluster closes: Patroni with its process group, each
// postmaster by the pid in its postmaster.pid, etcd by its own; the
// postmasters of a test process killed before it closed its cluster are
// stopped by the next one that starts a cluster (sweepPatroni). When a
// prerequisite is missing (patroni, patronictl, etcd, PostgreSQL) the test
// is skipped loudly, or fails under CI.
type Patroni struct {
	dir      string
	bin      string // PostgreSQL's binaries
	uid, gid int    // the postgres user's
	etcd     process
	etcdPort int
	scope    string
	members  []*PatroniMember
}

// PatroniMember is one member of a Patroni cluster: a Patroni process and
// the PostgreSQL that it manages.
type PatroniMember struct {
	c               *Patroni
	name            string
	pgPort, apiPort int
	data, config    string
	proc            process // its Patroni
}

// patroniMembers is the size of the cluster.
const patroniMembers = 3

var sharedPatroni = sharedHarness[*Patroni]{
	name:  "Patroni cluster",
	start: func(testing.TB) (*Patroni, error) { return startPatroni() },
}

// SharedPatroni returns the process's Patroni cluster, starting it on first
// use, or skips (fails under CI) tb when it cannot be started. It fails tb
// when the cluster is not healthy: a test before it left it failed over.
// When tb fails, it shows what the cluster logged meanwhile (see
// keepLogsOnFailure).
func SharedPatroni(tb testing.TB) *Patroni {
	tb.Helper()
	c := sharedPatroni.get(tb)
	c.keepLogsOnFailure(tb)
	if err := c.healthy(30 * time.Second); err != nil {
		tb.Fatalf("Patroni cluster not healthy: a test before this one did not heal it: %v", err)
	}
	return c
}

// patroniLogQuote is how much of each log written during a failed test
// keepLogsOnFailure quotes in the test's output: its beginning (the fault
// and what Patroni did at once) and its end (what it was doing when the
// test gave up), half each.
const patroniLogQuote = 24 << 10

// keepLogsOnFailure makes tb, if it fails, show what the cluster's
// processes logged while it ran, from where their logs were when tb asked
// for the cluster: each member's log (Patroni's, and its PostgreSQL's) and
// etcd's, quoted in tb's output (see quoteLog), with the cluster's state
// as Patroni sees it; and, with go test -artifacts, the whole logs copied
// to tb's artifact directory. The cluster's directory, where the logs are,
// is deleted when the test process ends, so without this a failover that
// went wrong leaves no trace of why.
func (c *Patroni) keepLogsOnFailure(tb testing.TB) {
	type logFile struct {
		name, path string
		from       int64 // its size when tb began
	}
	logs := []logFile{{name: "etcd", path: c.etcd.log}}
	for _, m := range c.members {
		logs = append(logs, logFile{name: m.name, path: m.proc.log})
	}
	for i := range logs {
		if fi, err := os.Stat(logs[i].path); err == nil {
			logs[i].from = fi.Size()
		}
	}
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		tb.Logf("the Patroni cluster as its members see it: %s", c.clusterState())
		for _, l := range logs {
			tb.Logf("the log of %s during the test:\n%s", l.name, quoteLog(l.path, l.from, patroniLogQuote))
		}
		if f := flag.Lookup("test.artifacts"); f == nil || f.Value.String() != "true" {
			return
		}
		dir := tb.ArtifactDir()
		for _, l := range logs {
			if b, err := os.ReadFile(l.path); err == nil {
				_ = os.WriteFile(filepath.Join(dir, filepath.Base(l.path)), b, 0o644)
			}
		}
		tb.Logf("the whole logs of the Patroni cluster: %s", dir)
	})
}

// quoteLog returns what the file at path holds from offset from on, for a
// test's output: at most limit bytes, the beginning and the end of it when
// it is longer, with what was left out between them counted.
func quoteLog(path string, from int64, limit int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if from > int64(len(b)) {
		from = 0 // not the same file
	}
	b = b[from:]
	if len(b) <= limit {
		return string(b)
	}
	return fmt.Sprintf("%s\n[... %d bytes left out ...]\n%s", b[:limit/2], len(b)-limit, b[len(b)-limit/2:])
}

// startPatroni starts etcd, then the first member, which bootstraps the
// cluster and leads it, then the others, which copy it with pg_basebackup,
// and waits until the cluster is healthy.
func startPatroni() (*Patroni, error) {
	for _, tool := range []string{"patroni", "patronictl", "etcd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, &missingError{fmt.Sprintf("no %s (Debian packages patroni, etcd-server, python3-etcd; scripts/patroni.sh installs them)", tool)}
		}
	}
	pg, err := newCluster() // for its binaries only
	if err != nil {
		return nil, &missingError{err.Error()}
	}
	os.RemoveAll(pg.dir)
	uid, gid, err := userIDs("postgres")
	if err != nil {
		return nil, &missingError{"no postgres user to run Patroni as"}
	}
	sweepPatroni()
	dir, err := os.MkdirTemp("", patroniDirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Patroni{dir: dir, bin: pg.bin, uid: uid, gid: gid, scope: filepath.Base(dir)}
	if err := os.Chown(dir, c.uid, c.gid); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ports, err := freePorts(2 + 2*patroniMembers)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	fail := func(err error) (*Patroni, error) {
		c.close()
		return nil, err
	}
	if err := c.startEtcd(ports[0], ports[1]); err != nil {
		return fail(err)
	}
	ports = ports[2:]
	for i := 1; i <= patroniMembers; i++ {
		m := &PatroniMember{c: c, name: fmt.Sprintf("m%d", i), pgPort: ports[0], apiPort: ports[1]}
		ports = ports[2:]
		m.data = filepath.Join(dir, m.name)
		m.config = filepath.Join(dir, m.name+".yml")
		// Patroni writes here, and PostgreSQL's stderr before its own
		// logging starts.
		m.proc.name, m.proc.log = "Patroni "+m.name, filepath.Join(dir, m.name+".log")
		if err := c.writeFile(m.config, m.yaml()); err != nil {
			return fail(err)
		}
		c.members = append(c.members, m)
	}
	first := c.members[0]
	if err := first.start(); err != nil {
		return fail(err)
	}
	if err := first.waitStatus("/primary", 60*time.Second); err != nil {
		return fail(err)
	}
	for _, m := range c.members[1:] {
		if err := m.start(); err != nil {
			return fail(err)
		}
	}
	if err := c.healthy(90 * time.Second); err != nil {
		return fail(err)
	}
	if err := makeTables(postgres.Open(c.DSN())); err != nil {
		return fail(err)
	}
	return c, nil
}

// patroniDirPrefix names the clusters' temporary directories.
const patroniDirPrefix = "gormlease-patroni-"

// sweepPatroni stops what a test process that was killed before it could
// close its cluster left running: Patroni and etcd die with the process
// that started them (a parent-death signal), but each postmaster, which
// Patroni starts in a session of its own, outlives it. It kills the
// postmaster of each member of every cluster whose owner (the pid in its
// directory's owner file) is gone, and deletes the directory.
func sweepPatroni() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), patroniDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		if owner, err := strconv.Atoi(string(b)); err != nil || syscall.Kill(owner, 0) == nil {
			continue // alive, or not ours to judge
		}
		pidFiles, _ := filepath.Glob(filepath.Join(dir, "m*", "postmaster.pid"))
		for _, f := range pidFiles {
			m := &PatroniMember{data: filepath.Dir(f)}
			if pid := m.postmasterPID(); pid != 0 {
				killWait(pid)
			}
		}
		os.RemoveAll(dir)
	}
}

// startEtcd starts the one-node etcd on client port client and peer port
// peer, and waits until it answers.
func (c *Patroni) startEtcd(client, peer int) error {
	c.etcdPort = client
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	c.etcd.name, c.etcd.log = "etcd", filepath.Join(c.dir, "etcd.log")
	cmd := exec.Command("etcd", "--name", "etcd", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd="+peerURL, "--unsafe-no-fsync")
	if err := c.etcd.start(cmd); err != nil {
		return err
	}
	return c.etcd.waitReady(30*time.Second, 100*time.Millisecond, func() error { return httpOK(clientURL + "/health") })
}

// writeFile writes a file that the postgres user owns.
func (c *Patroni) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Chown(path, c.uid, c.gid)
}

// yaml is the member's Patroni configuration.
//
// Patroni connects to its own PostgreSQL through the Unix socket
// (use_unix_socket, use_unix_socket_repl), not through the TCP port that
// the tests' clients dial, so that its connections do not queue behind
// theirs. When a primary's postmaster dies, its Patroni (with
// primary_start_timeout 0) asks the synchronous standby's REST API, waiting
// 2 s for the answer, whether it can take over: it fails over when it can,
// and otherwise, an unanswered request included, restarts its PostgreSQL in
// place and keeps the lead. To answer, the standby's Patroni opens a
// replication connection to its own PostgreSQL (IDENTIFY_SYSTEM, for the
// timeline, which it cannot read from a WAL receiver that has stopped),
// with a connect timeout of 3 s. Over TCP, on a loaded machine, that
// connection timed out behind the clients' redials (a storm's pools,
// finding the old primary refusing, open and close a session on each
// standby of the multi-host DSN in turn: the first standby's accept queue
// held 105 connections): "Member m2 is not reachable", and the old primary
// came back as the leader, in 4 of 8 runs of TestPatroni_KillPostmaster.
// The postmaster accepts from each of its sockets in turn: through the
// socket, each of 30 failovers under the same load went to the synchronous
// standby.
func (m *PatroniMember) yaml() string {
	c := m.c
	return fmt.Sprintf(`scope: %[1]s
namespace: /gormlease/
name: %[2]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  host: 127.0.0.1:%[4]d
bootstrap:
  dcs:
    ttl: 7
    loop_wait: 1
    retry_timeout: 3
    primary_start_timeout: 0
    synchronous_mode: true
    synchronous_mode_strict: true
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_level: replica
        wal_log_hints: "on"
        hot_standby: "on"
        wal_keep_size: 128MB
  initdb:
    - encoding: UTF8
    - username: postgres
postgresql:
  listen: 127.0.0.1:%[5]d
  connect_address: 127.0.0.1:%[5]d
  data_dir: %[6]s
  bin_dir: %[7]s
  pgpass: %[8]s
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  use_unix_socket: true
  use_unix_socket_repl: true
  pg_hba:
    - local all all trust
    - local replication all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: %[9]s
    shared_buffers: 16MB
    fsync: "off"
    wal_receiver_status_interval: 1s
    wal_retrieve_retry_interval: 500ms
`, c.scope, m.name, m.apiPort, c.etcdPort, m.pgPort, m.data, c.bin,
		filepath.Join(c.dir, m.name+".pgpass"), c.dir)
}

// start starts the member's Patroni, which starts its PostgreSQL. Patroni
// dies with the test process, but its postmaster does not (see
// sweepPatroni): close kills it by its pid.
func (m *PatroniMember) start() error {
	cmd := exec.Command("patroni", m.config)
	cmd.Dir = m.c.dir
	cmd.Env = append(os.Environ(), "HOME="+m.c.dir)
	runAs(cmd, m.c.uid, m.c.gid)
	return m.proc.start(cmd)
}

// Log returns the member's Patroni log, and PostgreSQL's, since the cluster
// started.
func (m *PatroniMember) Log() string {
	b, _ := os.ReadFile(m.proc.log)
	return string(b)
}

// httpStatus returns the status code of a GET of url, with a short timeout.
func httpStatus(url string) (int, error) {
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// httpOK returns nil when a GET of url answers 200 OK, with a short
// timeout, and what it answered otherwise.
func httpOK(url string) error {
	code, err := httpStatus(url)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, code)
	}
	return nil
}

// status returns the status code of the member's REST endpoint path
// (/primary, /sync, /replica, /health), 0 when it does not answer.
func (m *PatroniMember) status(path string) int {
	code, _ := httpStatus(fmt.Sprintf("http://127.0.0.1:%d%s", m.apiPort, path))
	return code
}

// waitStatus waits until the member's endpoint path answers 200.
func (m *PatroniMember) waitStatus(path string, timeout time.Duration) error {
	return m.proc.waitReady(timeout, 100*time.Millisecond, func() error {
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d%s", m.apiPort, path))
	})
}

// healthy waits until one member is the primary, one the synchronous
// standby, and the third a streaming replica, as their REST APIs say.
func (c *Patroni) healthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var primary, sync, replica int
		for _, m := range c.members {
			if !m.proc.running() {
				return fmt.Errorf("Patroni %s is not running", m.name)
			}
			switch {
			case m.status("/primary") == http.StatusOK:
				primary++
			case m.status("/sync") == http.StatusOK:
				sync++
			case m.status("/replica?lag=1MB") == http.StatusOK:
				replica++
			}
		}
		if primary == 1 && sync == 1 && replica == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d primary, %d synchronous standby, %d replica; the cluster as Patroni sees it: %s",
				timeout, primary, sync, replica, c.clusterState())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// clusterState is what the first member that answers says of the cluster
// (Patroni's /cluster), for error messages.
func (c *Patroni) clusterState() string {
	client := http.Client{Timeout: time.Second}
	for _, m := range c.members {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/cluster", m.apiPort))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	return "(no member answers)"
}

// Members returns the members, in order.
func (c *Patroni) Members() []*PatroniMember { return c.members }

// Leader returns the member whose REST API says it is the primary, or nil.
func (c *Patroni) Leader() *PatroniMember {
	for _, m := range c.members {
		if m.status("/primary") == http.StatusOK {
			return m
		}
	}
	return nil
}

// SyncStandby returns the member whose REST API says it is the synchronous
// standby, or nil.
func (c *Patroni) SyncStandby() *PatroniMember {
	for _, m := range c.members {
		if m.status("/sync") == http.StatusOK {
			return m
		}
	}
	return nil
}

// WaitLeader waits until a member other than old is the primary and
// returns it, failing tb after timeout.
func (c *Patroni) WaitLeader(tb testing.TB, old *PatroniMember, timeout time.Duration) *PatroniMember {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, m := range c.members {
			if m != old && m.status("/primary") == http.StatusOK {
				return m
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no new Patroni leader after %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DSN is the cluster's multi-host DSN: every member's PostgreSQL, in the
// order of the members, with target_session_attrs=read-write, as
// docs/scaling.md recommends.
func (c *Patroni) DSN() string { return c.DSNFirst(nil) }

// DSNFirst is DSN with first's PostgreSQL listed first, as an application
// configured while first led lists it: after a failover that leaves first
// running and read-write, new connections still go to it.
func (c *Patroni) DSNFirst(first *PatroniMember) string {
	members := []*PatroniMember{}
	if first != nil {
		members = append(members, first)
	}
	for _, m := range c.members {
		if m != first {
			members = append(members, m)
		}
	}
	hosts := make([]string, len(members))
	ports := make([]string, len(members))
	for i, m := range members {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(m.pgPort)
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable connect_timeout=2"+
		" target_session_attrs=read-write", strings.Join(hosts, ","), strings.Join(ports, ","))
}

// Open returns a new pool on DSNFirst(first). It is closed when tb ends.
func (c *Patroni) Open(tb testing.TB, first *PatroniMember) *gorm.DB {
	tb.Helper()
	return openPostgres(tb, c.DSNFirst(first))
}

// Name is the member's name in the cluster (m1, m2, m3).
func (m *PatroniMember) Name() string { return m.name }

// Addr is the address ("host:port") of the member's PostgreSQL.
func (m *PatroniMember) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.pgPort) }

// DSN is the DSN of the member's PostgreSQL alone.
func (m *PatroniMember) DSN() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=2", m.pgPort)
}

// Open returns a new pool on the member's PostgreSQL alone, whatever its
// role, once it accepts a connection: it tries again for up to 30 s. Just
// after a failover on a loaded machine, the new primary has taken longer
// than the DSN's connect_timeout of 2 s to accept one, while it promoted
// itself and the clients' redials queued before; the tests check what it
// holds, not how soon it answers. It is closed when tb ends.
func (m *PatroniMember) Open(tb testing.TB) *gorm.DB {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		db, err := gorm.Open(postgres.Open(m.DSN()), quiet())
		if err == nil || time.Now().After(deadline) {
			return keepPool(tb, m.DSN(), db, err)
		}
		if db != nil {
			closeDB(db)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// postmasterPID is the pid in the member's postmaster.pid, 0 when there is
// none.
func (m *PatroniMember) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(m.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// KillPostmaster kills the member's postmaster with SIGKILL, as a crash of
// PostgreSQL would, and waits until it is gone. Patroni keeps running.
func (m *PatroniMember) KillPostmaster(tb testing.TB) {
	tb.Helper()
	pid := m.postmasterPID()
	if pid == 0 {
		tb.Fatalf("Patroni %s: no postmaster.pid", m.name)
	}
	killWait(pid)
}

// killWait kills pid with SIGKILL and waits until it no longer exists (it
// is not this process's child: Patroni or init reaps it).
func killWait(pid int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 1000 && syscall.Kill(pid, 0) == nil; i++ {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return // a zombie, waiting for its parent
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// KillPatroni kills the member's Patroni with SIGKILL, leaving its
// PostgreSQL running and read-write: nothing stops it, as on a machine
// without a watchdog. Start brings Patroni back.
func (m *PatroniMember) KillPatroni(tb testing.TB) {
	tb.Helper()
	m.proc.kill()
}

// StopPatroni stops the member's Patroni with SIGSTOP, as a hung process,
// leaving its PostgreSQL running. Continue resumes it.
func (m *PatroniMember) StopPatroni(tb testing.TB) {
	tb.Helper()
	m.proc.pause()
}

// Continue resumes a Patroni that StopPatroni stopped.
func (m *PatroniMember) Continue(tb testing.TB) {
	tb.Helper()
	m.proc.resume()
}

// Switchover asks Patroni (patronictl switchover) to hand the leadership
// from the current leader to candidate, and returns once patronictl has.
func (c *Patroni) Switchover(tb testing.TB, leader, candidate *PatroniMember) {
	tb.Helper()
	cmd := exec.Command("patronictl", "-c", leader.config, "switchover", "--leader", leader.name,
		"--candidate", candidate.name, "--force", c.scope)
	cmd.Env = append(os.Environ(), "HOME="+c.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("patronictl switchover: %v\n%s", err, out)
	}
}

// Heal brings every member back after a test's faults: it resumes a
// stopped Patroni, starts a killed one again (which rewinds a diverged old
// primary with pg_rewind and makes it a replica), and waits until the
// cluster has a primary, a synchronous standby and a replica again. A
// member that Patroni has not made a replica by then (a replica left
// recovering on the old timeline after a switchover, seen once under
// load) is made one anew from the primary (patronictl reinit), and the
// cluster is waited for once more.
func (c *Patroni) Heal(tb testing.TB) {
	tb.Helper()
	for _, m := range c.members {
		m.Continue(tb)
		if !m.proc.running() {
			if err := m.start(); err != nil {
				tb.Fatal(err)
			}
		}
	}
	err := c.healthy(120 * time.Second)
	if err == nil {
		return
	}
	tb.Logf("heal the Patroni cluster: %v; reinitializing the members that are not in it", err)
	for _, m := range c.members {
		if m.status("/primary") == http.StatusOK || m.status("/sync") == http.StatusOK || m.status("/replica?lag=1MB") == http.StatusOK {
			continue
		}
		cmd := exec.Command("patronictl", "-c", m.config, "reinit", "--force", c.scope, m.name)
		cmd.Env = append(os.Environ(), "HOME="+c.dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Logf("patronictl reinit %s: %v\n%s", m.name, err, out)
		}
	}
	if err := c.healthy(120 * time.Second); err != nil {
		tb.Fatalf("heal the Patroni cluster: %v", err)
	}
}

// close stops every process of the cluster by its pid and deletes its
// directory.
func (c *Patroni) close() error {
	for _, m := range c.members {
		m.proc.kill()
		if pid := m.postmasterPID(); pid != 0 {
			killWait(pid)
		}
	}
	c.etcd.kill()
	return os.RemoveAll(c.dir)
}
