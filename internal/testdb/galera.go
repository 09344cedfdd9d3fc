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

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// Galera is a MariaDB Galera cluster of three nodes on 127.0.0.1, each a
// mariadbd process with its own ports and data directory in a temporary
// directory. One cluster is started per test process, on first use, and
// shared by the tests that need one; Close stops it. Each test works on
// targets and tables of its own. A test that stops or kills a node starts it
// again before it ends, so that the next test finds three nodes.
//
// The first node bootstraps the cluster (--wsrep-new-cluster); the others
// join it and get their data by a state transfer (SST) with rsync, or by an
// incremental one (IST) when they rejoin. The rsync transfer fails when the
// nodes run as root, so as root they run as the "mysql" user. When a
// prerequisite is missing (mariadbd, mariadb-install-db, the Galera library,
// rsync) the test is skipped loudly, or fails under CI.
type Galera struct {
	mariaHome
	nodes []*GaleraNode
}

// mariaHome is where MariaDB servers of the harnesses keep their data and
// logs, a temporary directory, and the user they run as.
type mariaHome struct {
	dir      string
	uid, gid int // the servers' user, or -1 for this process's
}

// GaleraNode is one node of a Galera cluster.
type GaleraNode struct {
	c                     *Galera
	n                     int // 1-based
	port, gcomm, ist, sst int
	data                  string
	proc                  process // its mariadbd
}

// galeraNodes is the size of the cluster.
const galeraNodes = 3

// galeraStarts is how many times a cluster start is tried.
const galeraStarts = 3

// galeraDatabase is the database that the tests' pools open on each node.
const galeraDatabase = "gormlease"

var sharedGalera = sharedHarness[*Galera]{name: "MariaDB Galera cluster", start: startGaleraTries}

// SharedGalera returns the process's Galera cluster, starting it on first
// use, or skips (fails under CI) tb when it cannot be started.
func SharedGalera(tb testing.TB) *Galera {
	tb.Helper()
	c := sharedGalera.get(tb)
	for _, n := range c.nodes {
		if !n.proc.running() {
			tb.Fatalf("Galera node %d is not running: a test that stopped it did not start it again", n.n)
		}
	}
	return c
}

// startGaleraTries starts the cluster, trying again when a start fails for
// a reason outside the cluster (another process took a port before a node
// bound it), on new ports, up to galeraStarts times; it logs each failure
// to tb.
func startGaleraTries(tb testing.TB) (*Galera, error) {
	var missing *missingError
	for attempt := 1; ; attempt++ {
		c, err := startGalera()
		if err == nil || errors.As(err, &missing) {
			return c, err
		}
		tb.Logf("start the Galera cluster, attempt %d of %d: %v", attempt, galeraStarts, err)
		if attempt == galeraStarts {
			return nil, err
		}
	}
}

// missingError is a prerequisite of the cluster that this machine lacks.
type missingError struct{ what string }

func (e *missingError) Error() string { return e.what }

// galeraProvider finds the Galera library.
func galeraProvider() (string, error) {
	if p := os.Getenv("GORMLEASE_GALERA_PROVIDER"); p != "" {
		return p, nil
	}
	for _, p := range []string{"/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so",
		"/usr/lib64/galera-4/libgalera_smm.so", "/usr/lib/galera-4/libgalera_smm.so"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", &missingError{"no Galera library (libgalera_smm.so; Debian package galera-4)"}
}

// lookTool finds a binary in PATH or /usr/sbin.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", &missingError{fmt.Sprintf("no %s (Debian packages mariadb-server, galera-4, rsync)", name)}
}

func startGalera() (*Galera, error) {
	provider, err := galeraProvider()
	if err != nil {
		return nil, err
	}
	home, err := newMariaHome("gormlease-galera-", "rsync", "wsrep_sst_rsync")
	if err != nil {
		return nil, err
	}
	c := &Galera{mariaHome: home}
	ports, err := freePorts(4 * galeraNodes)
	if err != nil {
		os.RemoveAll(home.dir)
		return nil, err
	}
	for i := 1; i <= galeraNodes; i++ {
		n := &GaleraNode{c: c, n: i, data: filepath.Join(home.dir, fmt.Sprintf("node%d", i))}
		n.port, n.gcomm, n.ist, n.sst = ports[0], ports[1], ports[2], ports[3]
		ports = ports[4:]
		n.proc.name = fmt.Sprintf("Galera node %d", i)
		n.proc.log = filepath.Join(home.dir, fmt.Sprintf("node%d.err", i))
		c.nodes = append(c.nodes, n)
	}
	fail := func(err error) (*Galera, error) {
		c.close()
		return nil, err
	}
	first := c.nodes[0]
	if err := c.installDB(first.data); err != nil {
		return fail(err)
	}
	if err := first.start(provider, nil, "--wsrep-new-cluster"); err != nil {
		return fail(err)
	}
	if err := mysqlExec(first.admin(5*time.Second), "CREATE DATABASE IF NOT EXISTS "+galeraDatabase); err != nil {
		return fail(err)
	}
	for _, n := range c.nodes[1:] {
		if err := c.own(n.data); err != nil {
			return fail(err)
		}
		if err := n.start(provider, nil); err != nil {
			return fail(err)
		}
	}
	if err := c.waitSize(first, galeraNodes); err != nil {
		return fail(err)
	}
	if err := makeTables(mysql.Open(first.dsn(nil))); err != nil {
		return fail(err)
	}
	return c, nil
}

// newMariaHome finds mariadbd, mariadb-install-db and the other tools that
// the servers need, and makes their directory, with a name that starts with
// prefix. As root, the servers run as the "mysql" user: the rsync state
// transfer fails as root.
func newMariaHome(prefix string, tools ...string) (mariaHome, error) {
	for _, tool := range append([]string{"mariadbd", "mariadb-install-db"}, tools...) {
		if _, err := lookTool(tool); err != nil {
			return mariaHome{}, err
		}
	}
	h := mariaHome{uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		var err error
		if h.uid, h.gid, err = userIDs("mysql"); err != nil {
			return mariaHome{}, &missingError{"running as root, and no mysql user to run MariaDB as"}
		}
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return mariaHome{}, err
	}
	h.dir = dir
	if err := h.own(dir); err != nil {
		os.RemoveAll(dir)
		return mariaHome{}, err
	}
	return h, nil
}

// own makes the servers' user the owner of path, made if missing.
func (c mariaHome) own(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	if c.uid < 0 {
		return nil
	}
	return os.Chown(path, c.uid, c.gid)
}

// installDB makes the system tables of a new data directory.
func (c mariaHome) installDB(data string) error {
	if err := c.own(data); err != nil {
		return err
	}
	tool, _ := lookTool("mariadb-install-db")
	cmd := exec.Command(tool, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--innodb-log-file-size=8M")
	cmd.Dir = c.dir
	c.as(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mariadb-install-db: %w\n%s", err, out)
	}
	return nil
}

// as makes cmd run as the servers' user.
func (c mariaHome) as(cmd *exec.Cmd) {
	if c.uid >= 0 {
		runAs(cmd, c.uid, c.gid)
	}
}

// Node returns node i, from 1.
func (c *Galera) Node(i int) *GaleraNode { return c.nodes[i-1] }

// Nodes returns the nodes, in order.
func (c *Galera) Nodes() []*GaleraNode { return c.nodes }

// Addr is the node's "host:port" for clients.
func (n *GaleraNode) Addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }

// N is the node's number, from 1.
func (n *GaleraNode) N() int { return n.n }

func (n *GaleraNode) dsn(params map[string]string) string {
	cfg := mysqldriver.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", n.Addr(), galeraDatabase
	cfg.ParseTime, cfg.Loc, cfg.Timeout = true, time.UTC, 5*time.Second
	cfg.ReadTimeout, cfg.WriteTimeout = 30*time.Second, 30*time.Second
	dsn, _ := mysqlDSN(cfg, params)
	return dsn
}

// DSN is the node's DSN, with params added as by Server.Open.
func (n *GaleraNode) DSN(params map[string]string) string { return n.dsn(params) }

// Open returns a new pool on the node, with the gormlease tables made, closed
// when tb ends. params are DSN parameters, as for Server.Open.
func (n *GaleraNode) Open(tb testing.TB, params map[string]string) *gorm.DB {
	tb.Helper()
	db, err := gorm.Open(mysql.Open(n.dsn(params)), quiet())
	return keepPool(tb, fmt.Sprintf("Galera node %d", n.n), db, err)
}

// admin is the configuration of a connection as root to the node, outside
// any database, for setup and for its status.
func (n *GaleraNode) admin(timeout time.Duration) *mysqldriver.Config {
	return mysqlRoot(n.Addr(), timeout)
}

// OpenVia returns a new pool on the node that connects to addr ("host:port")
// instead of the node's own address, as through a Proxy. It is closed when
// tb ends.
func (n *GaleraNode) OpenVia(tb testing.TB, addr string) *gorm.DB {
	tb.Helper()
	return n.Open(tb, map[string]string{addrParam: addr})
}

// Faketime returns the environment that shifts a node's clock by offset
// (whole seconds, ahead when positive) through libfaketime, for Start. When
// libfaketime is missing (Debian package faketime) tb is skipped loudly, or
// fails under CI.
func Faketime(tb testing.TB, offset time.Duration) []string {
	tb.Helper()
	lib := os.Getenv("GORMLEASE_FAKETIME_LIB")
	if lib == "" {
		found, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1")
		if len(found) == 0 {
			unavailable(tb, "libfaketime", errors.New("no /usr/lib/*/faketime/libfaketime.so.1 (Debian package faketime)"))
		}
		lib = found[0]
	}
	return []string{"LD_PRELOAD=" + lib, fmt.Sprintf("FAKETIME=%+ds", int(offset.Seconds())),
		"FAKETIME_DONT_FAKE_MONOTONIC=1"}
}

// args are the node's mariadbd arguments.
func (n *GaleraNode) args(provider string) []string {
	var peers []string
	for _, p := range n.c.nodes {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", p.gcomm))
	}
	sock := filepath.Join(n.c.dir, fmt.Sprintf("node%d.sock", n.n))
	return []string{
		"--no-defaults",
		"--datadir=" + n.data,
		"--port=" + strconv.Itoa(n.port),
		"--bind-address=127.0.0.1",
		"--socket=" + sock,
		"--pid-file=" + filepath.Join(n.c.dir, fmt.Sprintf("node%d.pid", n.n)),
		"--log-error=" + n.proc.log,
		"--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=8M",
		"--innodb-flush-log-at-trx-commit=0",
		"--performance-schema=OFF",
		"--binlog-format=ROW",
		"--innodb-autoinc-lock-mode=2",
		"--default-storage-engine=InnoDB",
		"--max-connections=300",
		"--wsrep-on=ON",
		"--wsrep-provider=" + provider,
		"--wsrep-cluster-name=gormlease",
		"--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
		fmt.Sprintf("--wsrep-node-address=127.0.0.1:%d", n.gcomm),
		fmt.Sprintf("--wsrep-node-name=node%d", n.n),
		fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", n.sst),
		"--wsrep-sst-method=rsync",
		"--wsrep-slave-threads=2",
		// A node killed is declared gone in a few seconds, not the default
		// fifteen, so that the others' commits stall only that long.
		fmt.Sprintf("--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;"+
			"gcache.size=32M;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S;evs.install_timeout=PT4S;"+
			"evs.inactive_check_period=PT0.5S;evs.keepalive_period=PT0.5S", n.gcomm, n.ist),
	}
}

// start starts the node's mariadbd with env added to its environment and
// extra arguments, and waits until it is synced with the cluster.
func (n *GaleraNode) start(provider string, env []string, extra ...string) error {
	tool, _ := lookTool("mariadbd")
	cmd := exec.Command(tool, append(n.args(provider), extra...)...)
	cmd.Dir = n.c.dir
	cmd.Env = append(os.Environ(), env...)
	n.c.as(cmd)
	if err := n.proc.start(cmd); err != nil {
		return err
	}
	return n.proc.waitReady(90*time.Second, 200*time.Millisecond, func() error {
		var state string
		if err := n.status("wsrep_local_state_comment", &state); err != nil {
			return err
		}
		if state != "Synced" {
			return fmt.Errorf("state %q", state)
		}
		return nil
	})
}

// Kill kills the node's mariadbd with SIGKILL, as a crash would, and waits
// until the process is gone.
func (n *GaleraNode) Kill(tb testing.TB) {
	tb.Helper()
	n.proc.kill()
}

// Stop shuts the node down cleanly, and waits until the process is gone.
func (n *GaleraNode) Stop(tb testing.TB) {
	tb.Helper()
	n.proc.stop(syscall.SIGTERM, time.Minute)
}

// Start starts the node again, after Kill or Stop, with env added to its
// environment (as LD_PRELOAD and FAKETIME, to shift its clock), and waits
// until it has rejoined the cluster and is synced.
func (n *GaleraNode) Start(tb testing.TB, env ...string) {
	tb.Helper()
	provider, _ := galeraProvider()
	// A rejoin that fails (its state transfer can) is tried once more.
	if err := n.start(provider, env); err != nil {
		tb.Logf("start Galera node %d again, first try: %v", n.n, err)
		n.proc.kill()
		if err := n.start(provider, env); err != nil {
			tb.Fatal(err)
		}
	}
	if err := n.c.waitSize(n, galeraNodes); err != nil {
		tb.Fatal(err)
	}
}

// WaitSize waits until the cluster, as the node sees it, has size nodes,
// all synced.
func (n *GaleraNode) WaitSize(tb testing.TB, size int) {
	tb.Helper()
	if err := n.c.waitSize(n, size); err != nil {
		tb.Fatal(err)
	}
}

func (c *Galera) waitSize(n *GaleraNode, size int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got int
		err := n.status("wsrep_cluster_size", &got)
		if err == nil && got == size {
			var ready string
			err = n.status("wsrep_ready", &ready)
			if err == nil && ready == "ON" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster size %d not reached on node %d (got %d, %v)", size, n.n, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// status reads the node's status variable name (a constant of the
// callers) into dest.
func (n *GaleraNode) status(name string, dest any) error {
	return mysqlQueryRow(n.admin(2*time.Second),
		"SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = '"+name+"'", dest)
}

// close stops every node and deletes the cluster's directory.
func (c *Galera) close() error {
	for _, n := range c.nodes {
		n.proc.kill()
	}
	return os.RemoveAll(c.dir)
}
