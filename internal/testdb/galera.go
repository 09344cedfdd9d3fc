package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
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
	dir   string
	uid   int // the user the nodes run as, or -1 for this process's
	gid   int
	nodes []*GaleraNode
}

// GaleraNode is one node of a Galera cluster.
type GaleraNode struct {
	c                     *Galera
	n                     int // 1-based
	port, gcomm, ist, sst int
	data                  string
	mu                    sync.Mutex
	cmd                   *exec.Cmd
	exited                chan struct{}
	env                   []string // extra environment of the running process
}

// galeraNodes is the size of the cluster.
const galeraNodes = 3

// galeraStarts is how many times a cluster start is tried.
const galeraStarts = 3

// galeraDatabase is the database that the tests' pools open on each node.
const galeraDatabase = "gormlease"

var (
	galeraOnce    sync.Once
	galeraCluster *Galera
	galeraErr     error
)

// SharedGalera returns the process's Galera cluster, starting it on first
// use, or skips (fails under CI) tb when it cannot be started.
func SharedGalera(tb testing.TB) *Galera {
	tb.Helper()
	galeraOnce.Do(func() {
		// A start can fail for reasons outside the cluster (another
		// process took a port before a node bound it), so a failed start
		// is tried again, on new ports; each failure is shown.
		var missing *missingError
		for attempt := 1; attempt <= galeraStarts; attempt++ {
			galeraCluster, galeraErr = startGalera()
			if galeraErr == nil || errors.As(galeraErr, &missing) {
				break
			}
			tb.Logf("start the Galera cluster, attempt %d of %d: %v", attempt, galeraStarts, galeraErr)
		}
		if galeraErr == nil {
			closeAtEnd(galeraCluster.close)
		}
	})
	if galeraErr != nil {
		startFailed(tb, "MariaDB Galera cluster", galeraErr)
	}
	for _, n := range galeraCluster.nodes {
		if !n.running() {
			tb.Fatalf("Galera node %d is not running: a test that stopped it did not start it again", n.n)
		}
	}
	return galeraCluster
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
	for _, tool := range []string{"mariadbd", "mariadb-install-db", "rsync", "wsrep_sst_rsync"} {
		if _, err := lookTool(tool); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "gormlease-galera-")
	if err != nil {
		return nil, err
	}
	c := &Galera{dir: dir, uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			os.RemoveAll(dir)
			return nil, &missingError{"running as root, and no mysql user to run the nodes as"}
		}
		c.uid, _ = strconv.Atoi(u.Uid)
		c.gid, _ = strconv.Atoi(u.Gid)
	}
	if err := c.own(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ports, err := freePorts(4 * galeraNodes)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for i := 1; i <= galeraNodes; i++ {
		n := &GaleraNode{c: c, n: i, data: filepath.Join(dir, fmt.Sprintf("node%d", i))}
		n.port, n.gcomm, n.ist, n.sst = ports[0], ports[1], ports[2], ports[3]
		ports = ports[4:]
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
	if err := c.exec(first, "CREATE DATABASE IF NOT EXISTS "+galeraDatabase); err != nil {
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
	db, err := gorm.Open(mysql.Open(first.dsn(nil)), quiet())
	if err != nil {
		return fail(err)
	}
	defer closeDB(db)
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		return fail(fmt.Errorf("migrate: %w", err))
	}
	return c, nil
}

// own makes the nodes' user the owner of path, made if missing.
func (c *Galera) own(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	if c.uid < 0 {
		return nil
	}
	return os.Chown(path, c.uid, c.gid)
}

// installDB makes the system tables of a new data directory.
func (c *Galera) installDB(data string) error {
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

// as makes cmd run as the nodes' user.
func (c *Galera) as(cmd *exec.Cmd) {
	if c.uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.gid)}}
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
	if err != nil {
		tb.Fatalf("open Galera node %d: %v", n.n, err)
	}
	tb.Cleanup(func() { closeDB(db) })
	return db
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
		"--log-error=" + n.logPath(),
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

func (n *GaleraNode) logPath() string {
	return filepath.Join(n.c.dir, fmt.Sprintf("node%d.err", n.n))
}

// start starts the node's mariadbd with env added to its environment and
// extra arguments, and waits until it is synced with the cluster.
func (n *GaleraNode) start(provider string, env []string, extra ...string) error {
	tool, _ := lookTool("mariadbd")
	cmd := exec.Command(tool, append(n.args(provider), extra...)...)
	cmd.Dir = n.c.dir
	cmd.Env = append(os.Environ(), env...)
	n.c.as(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true // a kill reaches the state transfer's rsync too
	// The node dies with the test process, even when that is killed and
	// Close never runs.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start node %d: %w", n.n, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited, n.env = cmd, exited, env
	n.mu.Unlock()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var state string
		err := n.c.queryRow(n, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_local_state_comment'", &state)
		if err == nil && state == "Synced" {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("node %d exited while starting:\n%s", n.n, n.logTail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d not synced after 90s (state %q, %v):\n%s", n.n, state, err, n.logTail())
		}
	}
}

// logTail is the end of the node's error log.
func (n *GaleraNode) logTail() string {
	b, _ := os.ReadFile(n.logPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (n *GaleraNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Kill kills the node's mariadbd with SIGKILL, as a crash would, and waits
// until the process is gone.
func (n *GaleraNode) Kill(tb testing.TB) {
	tb.Helper()
	n.signal(syscall.SIGKILL)
}

// Stop shuts the node down cleanly, and waits until the process is gone.
func (n *GaleraNode) Stop(tb testing.TB) {
	tb.Helper()
	n.signal(syscall.SIGTERM)
}

func (n *GaleraNode) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
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
		n.signal(syscall.SIGKILL)
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
		err := c.queryRow(n, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_cluster_size'", &got)
		if err == nil && got == size {
			var ready string
			err = c.queryRow(n, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_ready'", &ready)
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

func (c *Galera) queryRow(n *GaleraNode, query string, dest ...any) error {
	cfg := mysqldriver.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.Timeout = "root", "tcp", n.Addr(), 2*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRow(query).Scan(dest...)
}

func (c *Galera) exec(n *GaleraNode, query string) error {
	cfg := mysqldriver.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.Timeout = "root", "tcp", n.Addr(), 5*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(query)
	return err
}

// close stops every node and deletes the cluster's directory.
func (c *Galera) close() error {
	for _, n := range c.nodes {
		n.signal(syscall.SIGKILL)
	}
	return os.RemoveAll(c.dir)
}
