package testdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/sys/unix"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Netns is a network namespace of the test process's own, for tests of
// real network faults: a partition that drops packets, rather than a proxy
// that closes sockets, leaves connections hanging until a timeout, as a
// cable pulled out does.
//
// A PostgreSQL and a MariaDB server of the process's own run inside it
// (Postgres, MariaDB), each started on first use and listening on every
// address of the namespace. The test process reaches them over veth pairs
// (NewLink): each test makes links of its own, with addresses of a /30 of
// 169.254.100.0-169.254.163.255 (link-local, never routed; clear of the
// cloud metadata address 169.254.169.254) that no other interface of the
// machine uses, and drops packets on them with iptables rules inside the
// namespace, so that one test's faults never touch another's links. The namespace is named
// gormlease-<pid>, so test processes running at the same time never share
// one.
//
// The servers die with the test process (a parent-death signal); Close
// stops them, each with its process group, and deletes the namespace, and
// each link and its rules go when its test ends. A namespace left by a
// test process that was killed is deleted by the next one. When a
// prerequisite is missing (root, ip, iptables, the servers' binaries) the
// test is skipped loudly, or fails under CI.
type Netns struct {
	name  string
	admin *Link // the link the servers are set up through

	pg, maria sharedHarness[*NetServer]
}

var (
	sharedNetns = sharedHarness[*Netns]{
		name:  "network namespace",
		start: func(testing.TB) (*Netns, error) { return newNetns() },
	}
	linkSeq atomic.Int64
)

// netnsPrefix starts the name of every namespace that testdb makes.
const netnsPrefix = "gormlease-"

// netnsLock serialises, between test processes, the choice of link
// addresses and the removal of namespaces left behind.
const netnsLock = "/run/gormlease-netns.lock"

// SharedNetns returns the process's network namespace, making it on first
// use, or skips (fails under CI) tb when it cannot be made.
func SharedNetns(tb testing.TB) *Netns {
	tb.Helper()
	return sharedNetns.get(tb)
}

func newNetns() (*Netns, error) {
	if os.Geteuid() != 0 {
		return nil, &missingError{"network namespaces need root"}
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := lookTool(tool); err != nil {
			return nil, &missingError{fmt.Sprintf("no %s (Debian packages iproute2, iptables)", tool)}
		}
	}
	unlock, err := lockNetns()
	if err != nil {
		return nil, err
	}
	removeStaleNetns()
	unlock()
	n := &Netns{name: fmt.Sprintf("%s%d", netnsPrefix, os.Getpid())}
	n.pg.name = "PostgreSQL in a network namespace"
	n.pg.start = func(testing.TB) (*NetServer, error) { return n.startPostgres() }
	n.maria.name = "MariaDB in a network namespace"
	n.maria.start = func(testing.TB) (*NetServer, error) { return n.startMariaDB() }
	if err := run("ip", "netns", "add", n.name); err != nil {
		return nil, err
	}
	if err := run("ip", "-n", n.name, "link", "set", "lo", "up"); err != nil {
		n.close()
		return nil, err
	}
	if n.admin, err = n.newLink(); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// lockNetns takes netnsLock, and returns the function that lets it go.
func lockNetns() (func(), error) {
	f, err := os.OpenFile(netnsLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// removeStaleNetns deletes the namespaces of test processes that are gone,
// with the servers still in them. netnsLock is held.
func removeStaleNetns() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), netnsPrefix))
		if !strings.HasPrefix(e.Name(), netnsPrefix) || err != nil || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		ip, _ := lookTool("ip")
		out, _ := exec.Command(ip, "netns", "pids", e.Name()).Output()
		for _, f := range strings.Fields(string(out)) {
			if p, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		_ = run("ip", "netns", "delete", e.Name())
	}
}

// close deletes the namespace with its links. Its servers, closed before
// it, are gone.
func (n *Netns) close() error {
	if n.admin != nil {
		n.admin.remove()
	}
	return run("ip", "netns", "delete", n.name)
}

// run runs a command, returning its output in the error when it fails.
func run(name string, args ...string) error {
	if path, err := lookTool(name); err == nil {
		name = path
	}
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// Link is a veth pair between the test process and its namespace: a path
// to the servers inside that can be cut, or made to lose packets, on its
// own.
type Link struct {
	ns           *Netns
	host, peer   string // the interfaces: this side's, the namespace's
	hostIP, nsIP net.IP

	mu    sync.Mutex
	rules [][]string // the iptables rules in force, as appended
}

// NewLink makes a new link into the namespace, removed with its rules when
// tb ends.
func (n *Netns) NewLink(tb testing.TB) *Link {
	tb.Helper()
	l, err := n.newLink()
	if err != nil {
		tb.Fatalf("link into %s: %v", n.name, err)
	}
	tb.Cleanup(l.remove)
	return l
}

func (n *Netns) newLink() (*Link, error) {
	seq := linkSeq.Add(1)
	l := &Link{ns: n, host: fmt.Sprintf("gl%dh%d", os.Getpid(), seq), peer: fmt.Sprintf("gl%dn%d", os.Getpid(), seq)}
	unlock, err := lockNetns()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if l.hostIP, l.nsIP, err = freeSubnet(); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"link", "add", l.host, "type", "veth", "peer", "name", l.peer, "netns", n.name},
		{"addr", "add", l.hostIP.String() + "/30", "dev", l.host},
		{"link", "set", l.host, "up"},
		{"-n", n.name, "addr", "add", l.nsIP.String() + "/30", "dev", l.peer},
		{"-n", n.name, "link", "set", l.peer, "up"},
	}
	for _, step := range steps {
		if err := run("ip", step...); err != nil {
			l.remove()
			return nil, err
		}
	}
	return l, nil
}

// freeSubnet picks a /30 that no interface of the machine has an address
// in, and returns its two host addresses. netnsLock is held.
func freeSubnet() (host, ns net.IP, err error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, nil, err
	}
	for tries := 0; tries < 100; tries++ {
		r := rand.IntN(64 * 64)
		base := net.IPv4(169, 254, byte(100+r/64), byte(r%64*4)).To4()
		subnet := &net.IPNet{IP: base, Mask: net.CIDRMask(30, 32)}
		taken := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && subnet.Contains(ipn.IP) {
				taken = true
			}
		}
		if !taken {
			return net.IPv4(base[0], base[1], base[2], base[3]+1), net.IPv4(base[0], base[1], base[2], base[3]+2), nil
		}
	}
	return nil, nil, errors.New("no free /30 in 169.254.100.0-169.254.163.255")
}

// remove deletes the link, which deletes both ends and the namespace's
// rules on it.
func (l *Link) remove() {
	l.mu.Lock()
	l.rules = nil
	l.mu.Unlock()
	_ = run("ip", "link", "delete", l.host)
}

// Host is the address of the server end of the link, in the namespace.
func (l *Link) Host() string { return l.nsIP.String() }

// Partition drops every packet on the link, both ways, until Heal:
// connections over it stay open and hang, and new ones cannot be made.
func (l *Link) Partition(tb testing.TB) {
	tb.Helper()
	l.drop(tb, nil)
}

// Lose drops each packet on the link, each way, with probability p (0 < p
// < 1), until Heal.
func (l *Link) Lose(tb testing.TB, p float64) {
	tb.Helper()
	if p <= 0 || p >= 1 {
		tb.Fatalf("Lose: probability %v is not between 0 and 1", p)
	}
	l.drop(tb, []string{"-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(p, 'f', -1, 64)})
}

// drop adds rules that drop the packets that match, both ways.
func (l *Link) drop(tb testing.TB, match []string) {
	tb.Helper()
	for _, way := range [][]string{{"INPUT", "-i", l.peer}, {"OUTPUT", "-o", l.peer}} {
		rule := append(append(way, match...), "-j", "DROP")
		if err := l.iptables("-A", rule); err != nil {
			tb.Fatal(err)
		}
		l.mu.Lock()
		l.rules = append(l.rules, rule)
		l.mu.Unlock()
	}
}

// Heal removes the link's rules: packets flow again.
func (l *Link) Heal(tb testing.TB) {
	tb.Helper()
	l.mu.Lock()
	rules := l.rules
	l.rules = nil
	l.mu.Unlock()
	for i := len(rules) - 1; i >= 0; i-- {
		if err := l.iptables("-D", rules[i]); err != nil {
			tb.Fatal(err)
		}
	}
}

func (l *Link) iptables(op string, rule []string) error {
	return run("ip", append([]string{"netns", "exec", l.ns.name, "iptables", "-w", op}, rule...)...)
}

// NetServer is a database server inside a Netns.
type NetServer struct {
	// Name is the gorm dialector name: "postgres" or "mysql".
	Name string
	port int
	dir  string // its data and logs, deleted by close
	// open opens a pool; conns counts its connections not yet closed,
	// and the attempts to open one.
	open func(host string, port int) (db *gorm.DB, conns *atomic.Int64, err error)
	quit syscall.Signal // what stops it at once
	proc process
}

// countedConn is a connection counted in open until it is closed.
type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed sync.Once
}

func (c *countedConn) Close() error {
	c.closed.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// Addr is the server's "host:port" over link l.
func (s *NetServer) Addr(l *Link) string { return net.JoinHostPort(l.Host(), strconv.Itoa(s.port)) }

// Open returns a new pool on the server that connects to addr: its address
// over a link, or a Proxy's. It is closed when tb ends. The gormlease
// tables exist.
func (s *NetServer) Open(tb testing.TB, addr string) *gorm.DB {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatalf("open %s: %v", s.Name, err)
	}
	p, _ := strconv.Atoi(port)
	db, conns, err := s.open(host, p)
	if err != nil {
		tb.Fatalf("open %s at %s: %v", s.Name, addr, err)
	}
	tb.Cleanup(func() {
		closeDB(db)
		deadline := time.Now().Add(20 * time.Second)
		for conns.Load() > 0 {
			if time.Now().After(deadline) {
				tb.Errorf("%d connections of a pool on %s still open 20s after it was closed", conns.Load(), s.Name)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return db
}

// Postgres returns the namespace's PostgreSQL server, started on first use
// from the binaries that Cluster uses.
func (n *Netns) Postgres(tb testing.TB) *NetServer {
	tb.Helper()
	return n.server(tb, &n.pg)
}

// MariaDB returns the namespace's MariaDB server, started on first use.
func (n *Netns) MariaDB(tb testing.TB) *NetServer {
	tb.Helper()
	return n.server(tb, &n.maria)
}

// server returns the server of h, started on first use, and fails tb when
// it has exited since.
func (n *Netns) server(tb testing.TB, h *sharedHarness[*NetServer]) *NetServer {
	tb.Helper()
	s := h.get(tb)
	if !s.proc.running() {
		tb.Fatalf("%s has exited:\n%s", h.name, s.proc.logTail())
	}
	return s
}

func (n *Netns) startPostgres() (*NetServer, error) {
	c, err := newCluster()
	if err != nil {
		return nil, &missingError{err.Error()}
	}
	if err := c.run("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	// Clients come over the links, from 169.254.x.y.
	hba, err := os.OpenFile(filepath.Join(c.data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = hba.WriteString("host all all 169.254.0.0/16 trust\n")
		hba.Close()
	}
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	s := &NetServer{Name: "postgres", port: 5432, dir: c.dir, quit: syscall.SIGQUIT}
	s.proc = n.process("PostgreSQL", filepath.Join(c.dir, "log"))
	s.open = func(host string, port int) (*gorm.DB, *atomic.Int64, error) {
		cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", host, port))
		if err != nil {
			return nil, nil, err
		}
		// When a query's context ends, pgx closes the connection on a
		// goroutine of its own: it dials the server to cancel the query,
		// sends Terminate, and reads until the server closes, for up to
		// 15 s; across a partition each step waits. The pool's
		// connections are counted until closed, so that closing the pool
		// can wait for that goroutine, and no goroutine of the driver
		// outlives the test.
		conns := new(atomic.Int64)
		dialer := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 5 * time.Minute}
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conns.Add(1)
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				conns.Add(-1)
				return nil, err
			}
			return &countedConn{Conn: c, open: conns}, nil
		}
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: stdlib.OpenDB(*cfg)}), quiet())
		return db, conns, err
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", c.data, "-p", strconv.Itoa(s.port), "-k", c.dir,
		"-c", "listen_addresses=*", "-c", "fsync=off", "-c", "shared_buffers=16MB", "-c", "max_connections=200")
	if c.asUser != "" {
		uid, gid, err := userIDs(c.asUser)
		if err != nil {
			os.RemoveAll(c.dir)
			return nil, err
		}
		runAs(cmd, uid, gid)
	}
	if err := n.start(s, cmd); err != nil {
		return nil, err
	}
	return s, nil
}

func (n *Netns) startMariaDB() (*NetServer, error) {
	// The directory and the user of galera.go's nodes, for one server.
	home, err := newMariaHome("gormlease-netns-mariadb-")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(home.dir, "data")
	if err := home.installDB(data); err != nil {
		os.RemoveAll(home.dir)
		return nil, err
	}
	s := &NetServer{Name: "mysql", port: 3306, dir: home.dir, quit: syscall.SIGKILL}
	s.proc = n.process("MariaDB", filepath.Join(home.dir, "err"))
	s.open = func(host string, port int) (*gorm.DB, *atomic.Int64, error) {
		cfg := mysqlRoot(net.JoinHostPort(host, strconv.Itoa(port)), 5*time.Second)
		cfg.DBName, cfg.ParseTime, cfg.Loc = galeraDatabase, true, time.UTC
		db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), quiet())
		return db, new(atomic.Int64), err // the driver dials on the caller's goroutine only
	}
	tool, _ := lookTool("mariadbd")
	// Without grant tables any client may connect, from the link's
	// addresses too; without name resolution, a connection waits for no
	// DNS that the namespace does not have.
	cmd := exec.Command(tool, "--no-defaults", "--datadir="+data, "--port="+strconv.Itoa(s.port),
		"--bind-address=0.0.0.0", "--socket="+filepath.Join(home.dir, "sock"), "--pid-file="+filepath.Join(home.dir, "pid"),
		"--log-error="+s.proc.log, "--skip-grant-tables", "--skip-name-resolve", "--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=8M", "--innodb-flush-log-at-trx-commit=0", "--performance-schema=OFF",
		"--max-connections=300")
	home.as(cmd)
	if err := n.start(s, cmd); err != nil {
		return nil, err
	}
	return s, nil
}

// process returns the process of a server called name that runs inside
// the namespace, with its output in log.
func (n *Netns) process(name, log string) process {
	return process{name: name + " in " + n.name, log: log, launch: n.startIn}
}

// start starts s's server with cmd inside the namespace, waits until it
// answers over the admin link, and makes the gormlease tables (on MariaDB,
// in database galeraDatabase, which it makes first). When it fails, it
// closes s.
func (n *Netns) start(s *NetServer, cmd *exec.Cmd) (err error) {
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	cmd.Dir = s.dir
	if err := s.proc.start(cmd); err != nil {
		return err
	}
	err = s.proc.waitReady(60*time.Second, 100*time.Millisecond, func() error { return s.ping(n.admin.Host(), s.port) })
	if err != nil {
		return err
	}
	if s.Name == "mysql" {
		if err := mysqlExec(mysqlRoot(s.Addr(n.admin), 5*time.Second), "CREATE DATABASE IF NOT EXISTS "+galeraDatabase); err != nil {
			return err
		}
	}
	return n.migrate(s)
}

// ping connects to s at host and port, and pings it.
func (s *NetServer) ping(host string, port int) error {
	driver, dsn := "pgx", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=2", host, port)
	if s.Name == "mysql" {
		driver, dsn = "mysql", mysqlRoot(net.JoinHostPort(host, strconv.Itoa(port)), 2*time.Second).FormatDSN()
	}
	return Ping(driver, dsn)
}

// migrate makes the gormlease tables on s.
func (n *Netns) migrate(s *NetServer) error {
	db, _, err := s.open(n.admin.Host(), s.port)
	if err != nil {
		return err
	}
	defer closeDB(db)
	return gormlease.AutoMigrate(context.Background(), db)
}

// startIn starts cmd inside the namespace, and closes exited when it has
// exited. It forks from an OS thread that entered the namespace and keeps
// that thread, which no other goroutine runs on, until the process has
// exited: the parent-death signal is sent when the thread that forked
// ends, and the runtime ends a locked thread when its goroutine returns.
func (n *Netns) startIn(cmd *exec.Cmd, exited chan<- struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is in the namespace
		f, err := os.Open(filepath.Join("/run/netns", n.name))
		if err != nil {
			started <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			started <- fmt.Errorf("setns %s: %w", n.name, err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	return <-started
}

// close stops the server, and deletes its directory.
func (s *NetServer) close() error {
	s.proc.stop(s.quit, 10*time.Second)
	return os.RemoveAll(s.dir)
}
