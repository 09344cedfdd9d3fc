package testdb

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// PgBouncerConfig is how NewPgBouncer configures its PgBouncer.
type PgBouncerConfig struct {
	// PoolMode is PgBouncer's pool_mode: "transaction" or "session".
	PoolMode string
	// PoolSize is the number of server connections PgBouncer keeps to the
	// database (default_pool_size).
	PoolSize int
	// MaxPreparedStatements is max_prepared_statements, which PgBouncer
	// 1.21 and later use to track protocol-level prepared statements in
	// transaction pooling. Zero leaves it out of the configuration, as
	// versions before 1.21 do not know it.
	MaxPreparedStatements int
}

// PgBouncer is a PgBouncer of a test's own, in front of the PostgreSQL
// server, on a free port of 127.0.0.1. Its clients work in the server's
// schema of this process, with the gormlease tables. It is stopped when the
// test ends.
//
// The binary is GORMLEASE_PGBOUNCER, or else pgbouncer on the PATH or in
// /usr/sbin (the Debian package pgbouncer). PgBouncer refuses to run as
// root, so as root it runs as the "postgres" user (pgbouncer -u). When the
// binary is missing the test is skipped loudly, or fails under CI.
type PgBouncer struct {
	// Version is PgBouncer's version, such as "1.18.0".
	Version string
	// Major and Minor are the numbers of Version.
	Major, Minor int

	port   int
	server *pgx.ConnConfig // the server's user, password and database
}

// pgbouncerVersion matches the first line of pgbouncer --version.
var pgbouncerVersion = regexp.MustCompile(`PgBouncer (\d+)\.(\d+)(\.\d+)?`)

// FindPgBouncer returns the pgbouncer binary and its version, or why there
// is none.
func FindPgBouncer() (bin, version string, major, minor int, err error) {
	bin = os.Getenv("GORMLEASE_PGBOUNCER")
	if bin == "" {
		if bin, err = exec.LookPath("pgbouncer"); err != nil {
			bin = "/usr/sbin/pgbouncer"
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", 0, 0, fmt.Errorf("no pgbouncer binary (install the pgbouncer package, or set GORMLEASE_PGBOUNCER): %w", err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", "", 0, 0, fmt.Errorf("%s --version: %w\n%s", bin, err, out)
	}
	m := pgbouncerVersion.FindSubmatch(out)
	if m == nil {
		return "", "", 0, 0, fmt.Errorf("%s --version: no version in %q", bin, out)
	}
	major, _ = strconv.Atoi(string(m[1]))
	minor, _ = strconv.Atoi(string(m[2]))
	return bin, string(m[0][len("PgBouncer "):]), major, minor, nil
}

// NewPgBouncer starts a PgBouncer in front of s, a PostgreSQL server, and
// waits until it answers.
func NewPgBouncer(tb testing.TB, s *Server, cfg PgBouncerConfig) *PgBouncer {
	tb.Helper()
	if s.Name != "postgres" {
		tb.Fatalf("PgBouncer in front of %s: PostgreSQL only", s.Name)
	}
	s.DB(tb) // the tables
	bin, version, major, minor, err := FindPgBouncer()
	if err != nil {
		unavailable(tb, "PgBouncer", err)
	}
	server, err := pgx.ParseConfig(s.DSN)
	if err != nil {
		tb.Fatalf("parse %s DSN: %v", s.Name, err)
	}
	dir, err := os.MkdirTemp("", "gormlease-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	var runAs []string
	if os.Geteuid() == 0 {
		name, err := givePostgres(dir)
		if err != nil {
			unavailable(tb, "PgBouncer", fmt.Errorf("running as root: %w", err))
		}
		runAs = []string{"-u", name}
	}
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	b := &PgBouncer{Version: version, Major: major, Minor: minor, port: port, server: server}
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := writeFiles(dir, map[string]string{
		"pgbouncer.ini": b.ini(dir, cfg),
		"userlist.txt":  fmt.Sprintf("%q %q\n", server.User, server.Password),
	}, runAs != nil); err != nil {
		tb.Fatal(err)
	}

	proc := &process{name: fmt.Sprintf("PgBouncer %s on port %d", version, port), log: filepath.Join(dir, "log")}
	if err := proc.start(exec.Command(bin, append(runAs, ini)...)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { proc.stop(syscall.SIGTERM, 10*time.Second) }) // SIGTERM: immediate shutdown
	if err := proc.waitReady(30*time.Second, 50*time.Millisecond, b.ping); err != nil {
		tb.Fatal(err)
	}
	return b
}

// ini is PgBouncer's configuration. The schema comes from connect_query,
// run on each new server connection: PgBouncer refuses search_path as a
// startup parameter. server_reset_query, which session pooling runs when a
// client leaves, is DEALLOCATE ALL rather than the default DISCARD ALL,
// which would reset search_path too.
func (b *PgBouncer) ini(dir string, cfg PgBouncerConfig) string {
	srv := b.server
	db := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", srv.Host, srv.Port, srv.Database, srv.User)
	if srv.Password != "" {
		db += " password=" + srv.Password
	}
	if schema := srv.RuntimeParams["search_path"]; schema != "" {
		db += fmt.Sprintf(" connect_query='SET search_path TO %s'", schema)
	}
	s := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 200
server_reset_query = DEALLOCATE ALL
ignore_startup_parameters = extra_float_digits
admin_users = %s
`, srv.Database, db, b.port, filepath.Join(dir, "userlist.txt"), cfg.PoolMode, cfg.PoolSize, srv.User)
	if cfg.MaxPreparedStatements > 0 {
		s += fmt.Sprintf("max_prepared_statements = %d\n", cfg.MaxPreparedStatements)
	}
	return s
}

// writeFiles writes files into dir, owned by dir's owner when chown is set.
func writeFiles(dir string, files map[string]string, chown bool) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			return err
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && chown {
			if err := os.Chown(path, int(sys.Uid), int(sys.Gid)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ping connects to PgBouncer and runs a query.
func (b *PgBouncer) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg, err := b.connConfig("simple_protocol")
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// Addr is PgBouncer's "host:port".
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// AtLeast reports whether PgBouncer's version is major.minor or later.
func (b *PgBouncer) AtLeast(major, minor int) bool {
	return b.Major > major || b.Major == major && b.Minor >= minor
}

func (b *PgBouncer) connConfig(mode string) (*pgx.ConnConfig, error) {
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable connect_timeout=5",
		b.port, b.server.User, b.server.Database)
	if b.server.Password != "" {
		dsn += " password=" + b.server.Password
	}
	if mode != "" {
		dsn += " default_query_exec_mode=" + mode
	}
	return pgx.ParseConfig(dsn)
}

// Open returns a new pool through PgBouncer, of at most maxOpen connections,
// with pgx's default_query_exec_mode set to mode ("" for pgx's default,
// cache_statement). It is closed when tb ends.
func (b *PgBouncer) Open(tb testing.TB, mode string, maxOpen int) *gorm.DB {
	tb.Helper()
	cfg, err := b.connConfig(mode)
	if err != nil {
		tb.Fatalf("PgBouncer DSN: %v", err)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), quiet())
	if err != nil {
		sqlDB.Close()
		tb.Fatalf("open through PgBouncer: %v", err)
	}
	tb.Cleanup(func() { closeDB(db) })
	return db
}

// PgBouncerPool is what PgBouncer's SHOW POOLS says of the test's pool.
type PgBouncerPool struct {
	// ClientsActive are the clients linked to a server connection, or idle
	// (cl_active); ClientsWaiting wait for one (cl_waiting).
	ClientsActive, ClientsWaiting int
	// ServersActive are the server connections linked to a client
	// (sv_active); ServersIdle and ServersUsed are free for the next one
	// (sv_idle, sv_used).
	ServersActive, ServersIdle, ServersUsed int
}

// Servers is the number of server connections open to PostgreSQL.
func (p PgBouncerPool) Servers() int { return p.ServersActive + p.ServersIdle + p.ServersUsed }

// Pool asks PgBouncer's admin console for the state of the test's pool.
func (b *PgBouncer) Pool(tb testing.TB) PgBouncerPool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := b.connConfig("simple_protocol")
	if err != nil {
		tb.Fatalf("PgBouncer DSN: %v", err)
	}
	cfg.Database = "pgbouncer"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("PgBouncer's admin console: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW POOLS")
	if err != nil {
		tb.Fatalf("SHOW POOLS: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		tb.Fatalf("SHOW POOLS: %v", err)
	}
	for _, l := range lines {
		if l["database"] != b.server.Database || l["user"] != b.server.User {
			continue
		}
		n := func(col string) int {
			v, err := strconv.Atoi(fmt.Sprint(l[col]))
			if err != nil {
				tb.Fatalf("SHOW POOLS: %s = %v: %v", col, l[col], err)
			}
			return v
		}
		return PgBouncerPool{
			ClientsActive: n("cl_active"), ClientsWaiting: n("cl_waiting"),
			ServersActive: n("sv_active"), ServersIdle: n("sv_idle"), ServersUsed: n("sv_used"),
		}
	}
	tb.Fatalf("SHOW POOLS: no pool for %s/%s in %v", b.server.Database, b.server.User, lines)
	return PgBouncerPool{}
}
