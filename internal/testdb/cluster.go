package testdb

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Cluster is a PostgreSQL cluster of a test's own, made with initdb in a
// temporary directory and run with pg_ctl on a free port, so that a test can
// stop and restart it without touching the shared server. It is stopped and
// deleted when the test ends.
//
// The binaries are found in GORMLEASE_PG_BIN, or else in the newest
// /usr/lib/postgresql/*/bin. PostgreSQL refuses to run as root, so as root
// the cluster runs as the "postgres" user (through runuser). When a
// prerequisite is missing the test is skipped loudly, or fails under CI.
type Cluster struct {
	bin, dir, data string
	port           int
	asUser         string   // the user to run the binaries as, or "" for this one
	settings       []string // "name=value" server settings of its own, for Start
}

// NewCluster makes and starts a new cluster.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c := emptyCluster(tb)
	c.initdb(tb)
	c.Start(tb)
	return c
}

// emptyCluster returns a cluster with a port and a directory but no data
// yet, stopped and deleted when tb ends, or skips tb (fails it under CI)
// when a prerequisite is missing.
func emptyCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := newCluster()
	if err != nil {
		unavailable(tb, "private PostgreSQL cluster", err)
	}
	tb.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate")
		os.RemoveAll(c.dir)
	})
	return c
}

// initdb makes the cluster's data directory.
func (c *Cluster) initdb(tb testing.TB) {
	tb.Helper()
	if err := c.run("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		tb.Fatalf("initdb: %v", err)
	}
}

func newCluster() (*Cluster, error) {
	bin := os.Getenv("GORMLEASE_PG_BIN")
	if bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
		if len(dirs) == 0 {
			return nil, fmt.Errorf("no /usr/lib/postgresql/*/bin and no GORMLEASE_PG_BIN")
		}
		bin = dirs[len(dirs)-1]
	}
	for _, tool := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
			return nil, fmt.Errorf("no %s in %s: %w", tool, bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "gormlease-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("runuser"); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, and no runuser: %w", err)
		}
		if c.asUser, err = givePostgres(dir); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root: %w", err)
		}
	}
	port, err := FreePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.port = port
	return c, nil
}

// givePostgres makes the "postgres" user the owner of dir, for a server
// that refuses to run as root, and returns that user.
func givePostgres(dir string) (string, error) {
	uid, gid, err := userIDs("postgres")
	if err != nil {
		return "", fmt.Errorf("no postgres user to run the server as: %w", err)
	}
	return "postgres", os.Chown(dir, uid, gid)
}

// version is the major version in a /usr/lib/postgresql/N/bin path.
func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Port is the port the cluster listens on, on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Addr is the cluster's "host:port".
func (c *Cluster) Addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// Open returns a new pool on the cluster's postgres database, with the
// gormlease tables made. It is closed when tb ends.
func (c *Cluster) Open(tb testing.TB) *gorm.DB {
	tb.Helper()
	return openPostgresTables(tb, c.dsn())
}

// openPostgres opens a pool on dsn, closed when tb ends.
func openPostgres(tb testing.TB, dsn string) *gorm.DB {
	tb.Helper()
	db, err := gorm.Open(postgres.Open(dsn), quiet())
	return keepPool(tb, dsn, db, err)
}

// openPostgresTables opens a pool on dsn, closed when tb ends, and makes the
// gormlease tables.
func openPostgresTables(tb testing.TB, dsn string) *gorm.DB {
	tb.Helper()
	db := openPostgres(tb, dsn)
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		tb.Fatalf("migrate %s: %v", dsn, err)
	}
	return db
}

// Start starts the cluster and waits until it accepts connections.
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	for _, s := range c.settings {
		opts += " -c " + s
	}
	if err := c.pgctl("start", "-w", "-t", "60", "-l", filepath.Join(c.dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		tb.Fatalf("pg_ctl start: %v\n%s", err, log)
	}
}

// Crash stops the cluster at once, as a crash would (pg_ctl stop -m
// immediate): connections drop and transactions in flight are lost, but
// what was committed survives, through WAL recovery at the next Start.
func (c *Cluster) Crash(tb testing.TB) {
	tb.Helper()
	if err := c.pgctl("stop", "-w", "-m", "immediate"); err != nil {
		tb.Fatalf("pg_ctl stop: %v", err)
	}
}

func (c *Cluster) pgctl(args ...string) error {
	return c.run("pg_ctl", append([]string{"-D", c.data}, args...)...)
}

// run runs one of the PostgreSQL binaries, as the cluster's user.
func (c *Cluster) run(tool string, args ...string) error {
	path := filepath.Join(c.bin, tool)
	var cmd *exec.Cmd
	if c.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", tool, err, out)
	}
	return nil
}
