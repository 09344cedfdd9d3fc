package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
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

	dsnpkg "github.com/gormlease/gormlease/internal/dsn"
)

// sqlitePragmas are the SQLite settings the demo uses, and that gormlease
// needs: a busy timeout (first), and WAL mode so that readers never wait.
const sqlitePragmas = "_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"

// database is the demo's database: a pool for the story's own reads, a way
// to open one more pool on it for each tab, and the gorm dialector to open
// over a connection pool.
type database struct {
	// about describes the database for the header.
	about     string
	pool      *sql.DB
	open      func() (*sql.DB, error)
	dialector func(gorm.ConnPool) gorm.Dialector
	// nowSQL reads the database's clock, the one that stamps
	// job_lease.updated_at.
	nowSQL  string
	cleanup func()
}

// newDatabase returns the database that open opens pools on, with its
// first pool open.
func newDatabase(about, nowSQL string, open func() (*sql.DB, error), dialector func(gorm.ConnPool) gorm.Dialector) (*database, error) {
	pool, err := open()
	if err != nil {
		return nil, err
	}
	return &database{about: about, pool: pool, open: open, dialector: dialector, nowSQL: nowSQL}, nil
}

// openDatabase opens the database that dsn names: "" for an SQLite file in
// a new temporary directory, removed by close; otherwise any form that
// package dsn reads (dsnpkg.Forms): PostgreSQL, MySQL or MariaDB, or
// SQLite.
func openDatabase(dsn string) (*database, error) {
	if dsn == "" {
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
	}
	p, err := dsnpkg.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	switch p.Kind {
	case dsnpkg.KindPostgres:
		return newDatabase("PostgreSQL "+redact(dsn), "SELECT clock_timestamp()",
			func() (*sql.DB, error) { return sql.Open("pgx", p.Driver) },
			func(c gorm.ConnPool) gorm.Dialector { return postgres.New(postgres.Config{Conn: c}) })
	case dsnpkg.KindMySQL:
		return openMySQL(p.MySQL)
	}
	return openSQLite(p.Driver)
}

// openMySQL opens MySQL or MariaDB with cfg, which has the settings
// gormlease needs (datetimes read as time.Time, in UTC), interpolating
// the statements' arguments.
func openMySQL(cfg *mysqldriver.Config) (*database, error) {
	cfg.InterpolateParams = true
	return newDatabase(fmt.Sprintf("MySQL %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName), "SELECT UTC_TIMESTAMP(6)",
		func() (*sql.DB, error) { return sql.Open("mysql", cfg.FormatDSN()) },
		func(c gorm.ConnPool) gorm.Dialector { return mysql.New(mysql.Config{Conn: c}) })
}

func openSQLite(dsn string) (*database, error) {
	return newDatabase("SQLite "+dsn, "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
		func() (*sql.DB, error) { return driver.Open(dsn) },
		func(c gorm.ConnPool) gorm.Dialector { return gormlite.OpenDB(c) })
}

// now reads the database's clock. SQLite answers with the text that
// gormlease writes to updated_at, in UTC.
func (d *database) now(ctx context.Context) (time.Time, error) {
	var v any
	if err := d.pool.QueryRowContext(ctx, d.nowSQL).Scan(&v); err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	switch v := v.(type) {
	case time.Time:
		return v, nil
	case string:
		return time.ParseInLocation(time.DateTime, v, time.UTC)
	case []byte:
		return time.ParseInLocation(time.DateTime, string(v), time.UTC)
	}
	return time.Time{}, fmt.Errorf("read the database's clock: %T is not a time", v)
}

// redact hides the password in dsn.
func redact(dsn string) string { return dsnpkg.Redact(dsn) }

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

// stallable is one tab's way to the database, a pool of its own. While
// frozen, every call through it hangs until it thaws (or its context
// ends): from the database's side, the tab's process has stalled, as in a
// long GC pause, a suspended VM, or a network partition. Its heartbeats
// stop, and so does everything else it would send.
type stallable struct {
	pool *sql.DB

	mu       sync.Mutex
	idle     *sync.Cond    // signalled when inFlight drops to zero
	inFlight int           // calls on their way to the database
	thawed   chan struct{} // closed while not frozen
}

// stallableConns is the size of a tab's pool: a heartbeat and the tab's
// other call.
const stallableConns = 2

// newStallable opens a pool on d for one tab.
func newStallable(d *database) (*stallable, error) {
	pool, err := d.open()
	if err != nil {
		return nil, err
	}
	pool.SetMaxOpenConns(stallableConns)
	s := &stallable{pool: pool, thawed: make(chan struct{})}
	s.idle = sync.NewCond(&s.mu)
	close(s.thawed)
	return s, nil
}

// close closes the tab's pool.
func (s *stallable) close() { s.pool.Close() }

// freeze makes every later call hang until thaw. It returns once what the
// tab already sent is over, so that the database records nothing of the
// tab's after freeze returns: a heartbeat either landed before the freeze
// or waits for the thaw. Over means the call returned and its connection
// is back in the pool: a driver may return rows before the statement runs
// (SQLite runs it when the first row is read; on PostgreSQL the row
// description can come back first).
func (s *stallable) freeze() {
	s.mu.Lock()
	s.thawed = make(chan struct{})
	for s.inFlight > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
	// No call can start now: once every connection of the pool is free,
	// nothing of the tab's is left in the database.
	var conns []*sql.Conn
	for range stallableConns {
		c, err := s.pool.Conn(context.Background())
		if err != nil {
			break // the pool is closed: nothing is running either
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
}

// thaw lets the calls through again.
func (s *stallable) thaw() {
	s.mu.Lock()
	close(s.thawed)
	s.mu.Unlock()
}

// enter waits until s is not frozen and counts a call on its way; the
// caller calls leave when the call returns. It returns ctx's error, and
// counts nothing, when ctx ends first.
func (s *stallable) enter(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		thawed := s.thawed
		select {
		case <-thawed:
			s.inFlight++
			return nil
		default:
		}
		s.mu.Unlock()
		select {
		case <-thawed:
		case <-ctx.Done():
			s.mu.Lock()
			return ctx.Err()
		}
		s.mu.Lock()
	}
}

// leave ends a call that enter counted.
func (s *stallable) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight--; s.inFlight == 0 {
		s.idle.Broadcast()
	}
}

// PrepareContext implements gorm.ConnPool.
func (s *stallable) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	return s.pool.PrepareContext(ctx, query)
}

// ExecContext implements gorm.ConnPool.
func (s *stallable) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	return s.pool.ExecContext(ctx, query, args...)
}

// QueryContext implements gorm.ConnPool.
func (s *stallable) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	return s.pool.QueryContext(ctx, query, args...)
}

// QueryRowContext implements gorm.ConnPool. When ctx ends while frozen, the
// row carries ctx's error.
func (s *stallable) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if err := s.enter(ctx); err == nil {
		defer s.leave()
	}
	return s.pool.QueryRowContext(ctx, query, args...)
}

// BeginTx implements gorm.TxBeginner. The transaction's own statements do
// not go through s: a tab freezes while it works, outside any transaction.
func (s *stallable) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	return s.pool.BeginTx(ctx, opts)
}

// GetDBConn implements gorm.GetDBConnector.
func (s *stallable) GetDBConn() (*sql.DB, error) { return s.pool, nil }
