// Package testdb opens the real databases that gormlease's tests run
// against. Each server is found once per test process, in this order:
//
//  1. a DSN from the environment: GORMLEASE_TEST_POSTGRES_DSN (or
//     GORMLEASE_TEST_DSN) for PostgreSQL, as a URL or in the keyword form,
//     GORMLEASE_TEST_MYSQL_DSN, in the go-sql-driver/mysql form (or with
//     the commands' mysql:// before it), for MySQL or MariaDB: read by
//     package dsn, as the commands read theirs;
//  2. the local server: PostgreSQL on 127.0.0.1:5432 (user postgres,
//     database test), MySQL or MariaDB on 127.0.0.1:3306 (user root, no
//     password).
//
// A DSN from the environment is the only way when it is set: a server that
// does not answer there fails (or skips) the tests that need it, rather
// than falling back to the local server. The docker pass, the command
// tests/dockerpass (a module of its own, so that the Docker client's
// dependencies stay out of this module's graph), starts postgres:15 and
// mariadb:10.11 in containers and runs the tests with the two DSNs naming
// them and GORMLEASE_TEST_DOCKER set; with that set, a test process
// without a PostgreSQL DSN in the environment fails at once.
//
// When no server answers, the tests that need it are skipped with a loud
// message, or fail when the CI environment variable (or
// GORMLEASE_TEST_DOCKER) is set, so that CI never counts a skipped
// database test as a pass.
//
// Each test process works in a schema (PostgreSQL) or database (MySQL) of
// its own, dropped by Close, so test packages running at the same time never
// see each other's rows. SQLite needs no server: each test process gets a
// database file in a temporary directory of its own (see SQLite).
package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/dsn"
)

// Server is one database server reached by the tests, with a schema (or
// database) of this process's own.
type Server struct {
	// Name is the gorm dialector name: "postgres", "mysql" or "sqlite".
	Name string
	// Version is the server's version string.
	Version string
	// Addr is the server's "host:port", for a Proxy in front of it.
	Addr string
	// DSN opens the same database from another process (for SQLite, the
	// same file); empty when there is none.
	DSN string
	// Ago returns the SQL for the database's time d ago, to age a lease row.
	Ago func(d time.Duration) clause.Expr
	// Isolation returns the Open params that make level ("repeatable read",
	// "serializable") the default isolation of the pool's sessions.
	Isolation func(level string) map[string]string
	// LockWaits counts the sessions that wait for a row lock while running
	// a statement that matches the SQL LIKE pattern, asking through db. On
	// MySQL it reads information_schema.INNODB_TRX, which InnoDB refreshes
	// only when it was last read more than 100ms ago: poll it more slowly.
	LockWaits func(db *gorm.DB, like string) (int64, error)

	open     func(params map[string]string) (*gorm.DB, error)
	newSpace func(name string) (drop func() error, err error)
	spaceDSN func(name string) string // the DSN of the space newSpace made

	findErr error // why the server could not be found; set before it is shared

	once    sync.Once
	shared  *gorm.DB
	openErr error
}

var (
	mu      sync.Mutex
	servers = map[string]*Server{}
	closers []func() error
)

// dockerEnv, set to any value, says that the tests run in the docker pass
// (tests/dockerpass sets it): the servers are those of the DSNs in the
// environment, and a database test that cannot reach its server fails
// rather than skips.
const dockerEnv = "GORMLEASE_TEST_DOCKER"

// dockerRequired reports whether GORMLEASE_TEST_DOCKER is set.
func dockerRequired() bool { return os.Getenv(dockerEnv) != "" }

// Postgres returns the PostgreSQL server, or skips (fails under CI) tb when
// none can be reached.
func Postgres(tb testing.TB) *Server {
	tb.Helper()
	return get(tb, "postgres", findPostgres)
}

// All returns every supported server, for the guarantee tests that run on
// each database. Under CI every one of them must be reachable.
func All(tb testing.TB) []*Server {
	tb.Helper()
	return []*Server{Postgres(tb), MySQL(tb), SQLite(tb)}
}

func get(tb testing.TB, name string, find func() (*Server, error)) *Server {
	tb.Helper()
	s := lookup(name, find)
	if s.findErr != nil {
		unavailable(tb, name, s.findErr)
	}
	return s
}

// lookup finds the server called name once per process.
func lookup(name string, find func() (*Server, error)) *Server {
	mu.Lock()
	defer mu.Unlock()
	s, ok := servers[name]
	if !ok {
		var err error
		s, err = find()
		if err != nil {
			s = &Server{Name: name, findErr: err}
		}
		servers[name] = s
	}
	return s
}

// unavailable skips tb, loudly, or fails it under CI or
// GORMLEASE_TEST_DOCKER.
func unavailable(tb testing.TB, name string, err error) {
	tb.Helper()
	msg := fmt.Sprintf("DATABASE TESTS NOT RUN: no %s server: %v", name, err)
	switch {
	case os.Getenv("CI") != "":
		tb.Fatal(msg + " (CI is set, so this fails instead of skipping)")
	case dockerRequired():
		tb.Fatal(msg + " (" + dockerEnv + " is set, so this fails instead of skipping)")
	}
	tb.Skip(msg)
}

// closeAtEnd has Close call close, after what was registered before it.
func closeAtEnd(close func() error) {
	mu.Lock()
	closers = append(closers, close)
	mu.Unlock()
}

// startFailed ends tb after a shared cluster named name failed to start
// with err: skipped (failed under CI) when a prerequisite is missing,
// failed otherwise.
func startFailed(tb testing.TB, name string, err error) {
	tb.Helper()
	var missing *missingError
	if errors.As(err, &missing) {
		unavailable(tb, name, err)
	}
	tb.Fatalf("start the %s: %v", name, err)
}

// DB returns the process's shared pool on s, with the gormlease tables made.
func (s *Server) DB(tb testing.TB) *gorm.DB {
	tb.Helper()
	db, err := s.sharedDB()
	if err != nil {
		tb.Fatalf("open %s: %v", s.Name, err)
	}
	return db
}

func (s *Server) sharedDB() (*gorm.DB, error) {
	s.once.Do(func() {
		s.shared, s.openErr = s.open(nil)
		if s.openErr == nil {
			s.openErr = gormlease.AutoMigrate(context.Background(), s.shared)
		}
	})
	return s.shared, s.openErr
}

// Open returns a new pool on s, closed when tb ends. params are session
// settings: for PostgreSQL, run-time parameters such as
// default_transaction_isolation; for MySQL, DSN parameters, which are the
// driver's settings (clientFoundRows=true) or session variables that it
// SETs on each connection; for SQLite, PRAGMAs such as busy_timeout, or DSN
// parameters such as _txlock (see sqliteDSN). The tables exist: DB made them.
func (s *Server) Open(tb testing.TB, params map[string]string) *gorm.DB {
	tb.Helper()
	s.DB(tb)
	db, err := s.open(params)
	return keepPool(tb, s.Name, db, err)
}

// OpenVia returns a new pool on s that connects to addr ("host:port")
// instead of the server's own address, as through a proxy. It is closed when
// tb ends.
func (s *Server) OpenVia(tb testing.TB, addr string) *gorm.DB {
	tb.Helper()
	return s.Open(tb, map[string]string{addrParam: addr})
}

// OpenEmpty returns a new pool on s, with params as for Open, in a schema
// (PostgreSQL) or database (MySQL) of its own, without the gormlease
// tables. Both are dropped when tb ends.
func (s *Server) OpenEmpty(tb testing.TB, params map[string]string) *gorm.DB {
	tb.Helper()
	withSpace := map[string]string{spaceParam: s.newEmpty(tb)}
	for k, v := range params {
		withSpace[k] = v
	}
	db, err := s.open(withSpace)
	return keepPool(tb, s.Name, db, err)
}

// EmptyDSN returns a DSN, in the form of s.DSN, for a schema (PostgreSQL),
// database (MySQL) or file (SQLite) of its own, without the gormlease
// tables, for a command run on a database that has none. It is dropped
// when tb ends.
func (s *Server) EmptyDSN(tb testing.TB) string {
	tb.Helper()
	return s.spaceDSN(s.newEmpty(tb))
}

// newEmpty makes an empty schema, database or file on s, dropped when tb
// ends, and returns its name.
func (s *Server) newEmpty(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("gormlease_empty_%d_%d", os.Getpid(), spaceSeq.Add(1))
	drop, err := s.newSpace(name)
	if err != nil {
		tb.Fatalf("create %s on %s: %v", name, s.Name, err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("drop %s on %s: %v", name, s.Name, err)
		}
	})
	return name
}

var spaceSeq atomic.Int64

// addrParam is the pseudo-parameter by which OpenVia redirects a pool, and
// spaceParam the one by which OpenEmpty puts it in another schema or
// database.
const (
	addrParam  = "gormlease.addr"
	spaceParam = "gormlease.space"
)

// Close drops the schemas the process made, stops the servers it started
// and closes the shared pools. Call it from TestMain after m.Run.
func Close() {
	mu.Lock()
	defer mu.Unlock()
	for _, s := range servers {
		if s.shared != nil {
			closeDB(s.shared)
		}
	}
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil {
			fmt.Fprintln(os.Stderr, "testdb: close:", err)
		}
	}
	servers, closers = map[string]*Server{}, nil
}

// keepPool returns db, a pool that opening what returned with err, and
// closes it when tb ends; it fails tb when err is not nil.
func keepPool(tb testing.TB, what string, db *gorm.DB, err error) *gorm.DB {
	tb.Helper()
	if err != nil {
		tb.Fatalf("open %s: %v", what, err)
	}
	tb.Cleanup(func() { closeDB(db) })
	return db
}

// makeTables makes the gormlease tables through a pool of its own on
// dialector, closed before it returns.
func makeTables(dialector gorm.Dialector) error {
	db, err := gorm.Open(dialector, quiet())
	if err != nil {
		return err
	}
	defer closeDB(db)
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

// quiet is the gorm config of every test pool: the tests check errors
// themselves, and expected failures should not flood the output.
func quiet() *gorm.Config {
	return &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)}
}

func findPostgres() (*Server, error) {
	dsn, err := postgresDSN()
	if err != nil {
		return nil, err
	}
	base, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	admin := stdlib.OpenDB(*base)
	defer admin.Close()
	var version string
	if err := admin.QueryRow("SHOW server_version").Scan(&version); err != nil {
		return nil, fmt.Errorf("read version: %w", err)
	}
	newSpace := func(name string) (func() error, error) {
		if err := postgresExec(base, "CREATE SCHEMA "+name); err != nil {
			return nil, err
		}
		return func() error { return postgresExec(base, "DROP SCHEMA "+name+" CASCADE") }, nil
	}
	schema := fmt.Sprintf("gormlease_test_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	drop, err := newSpace(schema)
	if err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	closers = append(closers, drop)
	return &Server{
		Name:    "postgres",
		Version: version,
		Addr:    fmt.Sprintf("%s:%d", base.Host, base.Port),
		DSN:     postgresURL(base, schema),
		Ago: func(d time.Duration) clause.Expr {
			return gorm.Expr("clock_timestamp() - CAST(? AS bigint) * interval '1 microsecond'", d.Microseconds())
		},
		Isolation: func(level string) map[string]string {
			return map[string]string{"default_transaction_isolation": level}
		},
		LockWaits: func(db *gorm.DB, like string) (int64, error) {
			var n int64
			err := db.Raw(`SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE ?`, like).Scan(&n).Error
			return n, err
		},
		newSpace: newSpace,
		spaceDSN: func(name string) string { return postgresURL(base, name) },
		open: func(params map[string]string) (*gorm.DB, error) {
			cfg := base.Copy()
			cfg.RuntimeParams["search_path"] = schema
			for k, v := range params {
				if k == spaceParam {
					cfg.RuntimeParams["search_path"] = v
					continue
				}
				if k == addrParam {
					host, port, ok := strings.Cut(v, ":")
					if !ok {
						return nil, fmt.Errorf("address %q has no port", v)
					}
					var p uint16
					fmt.Sscan(port, &p)
					cfg.Host, cfg.Port, cfg.Fallbacks = host, p, nil
					continue
				}
				cfg.RuntimeParams[k] = v
			}
			return gorm.Open(postgres.New(postgres.Config{Conn: stdlib.OpenDB(*cfg)}), quiet())
		},
	}, nil
}

// postgresURL is a postgres:// URL for base's server, database and user,
// working in schema.
func postgresURL(base *pgx.ConnConfig, schema string) string {
	u := url.URL{
		Scheme: "postgres",
		User:   url.User(base.User),
		Host:   net.JoinHostPort(base.Host, strconv.Itoa(int(base.Port))),
		Path:   "/" + base.Database,
	}
	if base.Password != "" {
		u.User = url.UserPassword(base.User, base.Password)
	}
	q := url.Values{"search_path": {schema}, "sslmode": {"disable"}}
	if base.TLSConfig != nil {
		q.Set("sslmode", "require")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// postgresDSN finds a PostgreSQL server: from the environment, or on this
// machine.
func postgresDSN() (string, error) {
	for _, env := range []string{"GORMLEASE_TEST_POSTGRES_DSN", "GORMLEASE_TEST_DSN"} {
		if s := os.Getenv(env); s != "" {
			if p, err := dsn.Parse(s); err != nil || p.Kind != dsn.KindPostgres {
				return "", fmt.Errorf("%s is not a PostgreSQL DSN (postgres://… or host=… dbname=…): %v", env, err)
			}
			return s, Ping("pgx", s)
		}
	}
	if dockerRequired() {
		return "", fmt.Errorf("%s is set, and GORMLEASE_TEST_POSTGRES_DSN is not: run the tests with tests/dockerpass", dockerEnv)
	}
	dsn := "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable connect_timeout=5"
	if err := Ping("pgx", dsn); err != nil {
		return "", fmt.Errorf("no DSN in GORMLEASE_TEST_POSTGRES_DSN, and the local server: %w", err)
	}
	return dsn, nil
}

// postgresExec runs one statement on the server.
func postgresExec(cfg *pgx.ConnConfig, query string) error {
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	_, err := db.Exec(query)
	return err
}

// Ping connects to the database of dsn with driver, a database/sql driver
// that this package registers ("pgx" or "mysql"), within 5 s.
func Ping(driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}
