package testdb

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"
	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// sqlitePragmas are the PRAGMAs of every test connection to SQLite, in the
// order they are set: the busy timeout first, as the driver asks. Open's
// params override them by name. WAL mode is not among them: it is set once,
// when a file is made (see makeWAL), and stays with the file.
var sqlitePragmas = []string{"busy_timeout=10000", "synchronous=normal"}

// makeWAL makes the database file at path, in WAL mode. Switching a file to
// WAL needs it to itself: connections that each ask for it as they open
// can meet one another's switch and fail with "database is locked", which
// their busy timeout does not cover. Once made, the file stays in WAL mode.
func makeWAL(path string) error {
	pool, err := driver.Open(sqliteDSN(path, nil))
	if err != nil {
		return err
	}
	defer pool.Close()
	var mode string
	if err := pool.QueryRow("PRAGMA journal_mode=wal").Scan(&mode); err != nil {
		return fmt.Errorf("WAL mode for %s: %w", path, err)
	}
	if mode != "wal" {
		return fmt.Errorf("WAL mode for %s: the file is in %q mode", path, mode)
	}
	return nil
}

// SQLite returns this process's SQLite database: a file in a temporary
// directory of its own, removed by Close. It is always available.
func SQLite(tb testing.TB) *Server {
	tb.Helper()
	return get(tb, "sqlite", findSQLite)
}

func findSQLite() (*Server, error) {
	dir, err := os.MkdirTemp("", "gormlease-test-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	closers = append(closers, func() error { return os.RemoveAll(dir) })
	path := filepath.Join(dir, "lease.db")
	if err := makeWAL(path); err != nil {
		return nil, err
	}
	// spaceFile is the file of the database that newSpace makes for name.
	spaceFile := func(name string) string { return filepath.Join(dir, name+".db") }
	return &Server{
		newSpace: func(name string) (func() error, error) {
			file := spaceFile(name)
			drop := func() error { return removeSQLite(file) }
			if err := makeWAL(file); err != nil {
				return drop, err
			}
			return drop, nil
		},
		spaceDSN: func(name string) string { return sqliteDSN(spaceFile(name), nil) },
		Name:     "sqlite",
		DSN:      sqliteDSN(path, nil),
		Ago: func(d time.Duration) clause.Expr {
			return gorm.Expr("strftime('%Y-%m-%d %H:%M:%f', julianday('now') - ?)", d.Seconds()/86400)
		},
		open: func(params map[string]string) (*gorm.DB, error) {
			if _, ok := params[addrParam]; ok {
				return nil, fmt.Errorf("sqlite is a file: it has no address to redirect")
			}
			file := path
			if space, ok := params[spaceParam]; ok {
				file = spaceFile(space)
			}
			log := &statementLog{}
			pool, err := driver.Open(sqliteDSN(file, params), traceStatements(log))
			if err != nil {
				return nil, err
			}
			started.Store(pool, log)
			db, err := gorm.Open(gormlite.OpenDB(pool), quiet())
			if err != nil {
				pool.Close()
				return nil, err
			}
			return db, nil
		},
	}, nil
}

// sqliteDSN is the ncruces driver's DSN for the database file at path with
// sqlitePragmas, overridden or added to by params: a key that starts with
// "_" is a DSN parameter (such as "_txlock"), any other a PRAGMA name, set
// after the default ones; a PRAGMA with the value "" is left out.
func sqliteDSN(path string, params map[string]string) string {
	q := url.Values{}
	seen := map[string]bool{}
	for _, p := range sqlitePragmas {
		name, value, _ := strings.Cut(p, "=")
		seen[name] = true
		if v, ok := params[name]; ok {
			value = v
		}
		if value != "" {
			q.Add("_pragma", fmt.Sprintf("%s(%s)", name, value))
		}
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case k == spaceParam: // chose the file, above
		case strings.HasPrefix(k, "_"):
			q.Set(k, params[k])
		case !seen[k] && params[k] != "":
			q.Add("_pragma", fmt.Sprintf("%s(%s)", k, params[k]))
		}
	}
	return "file:" + filepath.ToSlash(path) + "?" + q.Encode()
}

// started counts, for each pool that testdb opened on SQLite, the
// statements that began to run on its connections.
var started sync.Map // *sql.DB -> *statementLog

// statementLog is the SQL of the statements that began to run on a pool.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

// traceStatements returns a connection hook that logs each statement to log
// as it begins to run.
func traceStatements(log *statementLog) func(*sqlite3.Conn) error {
	return func(conn *sqlite3.Conn) error {
		return conn.Trace(sqlite3.TRACE_STMT, func(_ sqlite3.TraceEvent, _, arg2 any) error {
			if sql, ok := arg2.(string); ok {
				log.mu.Lock()
				log.sql = append(log.sql, sql)
				log.mu.Unlock()
			}
			return nil
		})
	}
}

// Started counts the statements containing substr that began to run on db's
// connections, for a pool that Open made on SQLite. A statement that began
// and has not returned is waiting for the database's write lock when
// another connection holds it: SQLite's busy timeout retries it until then.
func Started(db *gorm.DB, substr string) int {
	pool, err := db.DB()
	if err != nil {
		return 0
	}
	v, ok := started.Load(pool)
	if !ok {
		return 0
	}
	log := v.(*statementLog)
	log.mu.Lock()
	defer log.mu.Unlock()
	n := 0
	for _, s := range log.sql {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

// removeSQLite removes a database file with its WAL and shared-memory files.
func removeSQLite(file string) error {
	var errs []error
	for _, f := range []string{file, file + "-wal", file + "-shm"} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
