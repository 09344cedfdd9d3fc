package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/ncruces/go-sqlite3/driver"
	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// sqlitePragmas are the SQLite settings the demo uses, and that gormlease
// needs: a busy timeout (first), and WAL mode so that readers never wait.
const sqlitePragmas = "_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"

// database is the demo's database: one pool that every tab shares, and the
// gorm dialector to open over a connection pool.
type database struct {
	// about describes the database for the header.
	about     string
	pool      *sql.DB
	dialector func(gorm.ConnPool) gorm.Dialector
	cleanup   func()
}

// openDatabase opens the database that dsn names: "" for an SQLite file in
// a new temporary directory, removed by close; "file:..." for an SQLite
// file; "postgres://..." for PostgreSQL; "mysql://" and the MySQL driver's
// DSN for MySQL or MariaDB.
func openDatabase(dsn string) (*database, error) {
	switch {
	case dsn == "":
		dir, err := os.MkdirTemp("", "leasedemo-")
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "demo.db")
		d, err := openSQLite("file:" + filepath.ToSlash(path) + "?" + sqlitePragmas)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		d.about = "SQLite file " + path + " (temporary; WAL, busy_timeout 10s)"
		d.cleanup = func() { os.RemoveAll(dir) }
		return d, nil
	case strings.HasPrefix(dsn, "file:"):
		return openSQLite(dsn)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		pool, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, err
		}
		return &database{
			about: "PostgreSQL " + redact(dsn),
			pool:  pool,
			dialector: func(c gorm.ConnPool) gorm.Dialector {
				return postgres.New(postgres.Config{Conn: c})
			},
		}, nil
	case strings.HasPrefix(dsn, "mysql://"):
		return openMySQL(strings.TrimPrefix(dsn, "mysql://"))
	default:
		return nil, fmt.Errorf("unsupported -dsn %q: give file:PATH?%s for SQLite, postgres://USER@HOST/DB for PostgreSQL, "+
			"or mysql://USER:PASSWORD@tcp(HOST:3306)/DB for MySQL or MariaDB", redact(dsn), sqlitePragmas)
	}
}

// openMySQL opens MySQL or MariaDB with the driver's DSN, adding the
// settings gormlease needs: datetimes read as time.Time, in UTC.
func openMySQL(dsn string) (*database, error) {
	cfg, err := mysqldriver.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql DSN: %w", err)
	}
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	return &database{
		about: fmt.Sprintf("MySQL %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName),
		pool:  pool,
		dialector: func(c gorm.ConnPool) gorm.Dialector {
			return mysql.New(mysql.Config{Conn: c})
		},
	}, nil
}

func openSQLite(dsn string) (*database, error) {
	pool, err := driver.Open(dsn)
	if err != nil {
		return nil, err
	}
	return &database{
		about:     "SQLite " + dsn,
		pool:      pool,
		dialector: func(c gorm.ConnPool) gorm.Dialector { return gormlite.OpenDB(c) },
	}, nil
}

// redact hides the password in a URL-shaped DSN.
func redact(dsn string) string {
	scheme, rest, ok := strings.Cut(dsn, "://")
	if !ok {
		return dsn
	}
	at := strings.LastIndex(rest, "@")
	colon := strings.Index(rest, ":")
	if at < 0 || colon < 0 || colon > at {
		return dsn
	}
	return scheme + "://" + rest[:colon] + ":***" + rest[at:]
}

// gorm opens gorm on conn, a pool over d's pool.
func (d *database) gorm(conn gorm.ConnPool) (*gorm.DB, error) {
	return gorm.Open(d.dialector(conn), &gorm.Config{Logger: logger.Discard})
}

func (d *database) close() {
	d.pool.Close()
	if d.cleanup != nil {
		d.cleanup()
	}
}

// stallable is one tab's way to the shared pool. While frozen, every call
// through it hangs until it thaws (or its context ends): from the
// database's side, the tab's process has stalled, as in a long GC pause, a
// suspended VM, or a network partition. Its heartbeats stop, and so does
// everything else it would send.
type stallable struct {
	pool *sql.DB

	mu     sync.Mutex
	thawed chan struct{} // closed while not frozen
}

func newStallable(pool *sql.DB) *stallable {
	s := &stallable{pool: pool, thawed: make(chan struct{})}
	close(s.thawed)
	return s
}

// freeze makes every later call hang until thaw.
func (s *stallable) freeze() {
	s.mu.Lock()
	s.thawed = make(chan struct{})
	s.mu.Unlock()
}

// thaw lets the calls through again.
func (s *stallable) thaw() {
	s.mu.Lock()
	close(s.thawed)
	s.mu.Unlock()
}

// wait returns once s is not frozen, or ctx's error when ctx ends first.
func (s *stallable) wait(ctx context.Context) error {
	s.mu.Lock()
	thawed := s.thawed
	s.mu.Unlock()
	select {
	case <-thawed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PrepareContext implements gorm.ConnPool.
func (s *stallable) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.pool.PrepareContext(ctx, query)
}

// ExecContext implements gorm.ConnPool.
func (s *stallable) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.pool.ExecContext(ctx, query, args...)
}

// QueryContext implements gorm.ConnPool.
func (s *stallable) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.pool.QueryContext(ctx, query, args...)
}

// QueryRowContext implements gorm.ConnPool. When ctx ends while frozen, the
// row carries ctx's error.
func (s *stallable) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	_ = s.wait(ctx)
	return s.pool.QueryRowContext(ctx, query, args...)
}

// BeginTx implements gorm.TxBeginner.
func (s *stallable) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.pool.BeginTx(ctx, opts)
}

// GetDBConn implements gorm.GetDBConnector.
func (s *stallable) GetDBConn() (*sql.DB, error) { return s.pool, nil }
