package testdb

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gormlease/gormlease/internal/dsn"
)

// MySQL returns the MySQL or MariaDB server, or skips (fails under CI) tb
// when none can be reached.
func MySQL(tb testing.TB) *Server {
	tb.Helper()
	return get(tb, "mysql", findMySQL)
}

func findMySQL() (*Server, error) {
	base, err := mysqlConfig()
	if err != nil {
		return nil, err
	}
	// The settings gormlease needs (see docs/schema-mysql.sql).
	base.ParseTime, base.Loc = true, time.UTC
	newSpace := func(name string) (func() error, error) {
		if err := mysqlExec(base, "CREATE DATABASE "+name); err != nil {
			return nil, err
		}
		return func() error { return mysqlExec(base, "DROP DATABASE "+name) }, nil
	}
	name := fmt.Sprintf("gormlease_test_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	drop, err := newSpace(name)
	if err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	closers = append(closers, drop)

	// MariaDB before 11.1 knows the isolation variable as tx_isolation only;
	// MySQL 8 knows it as transaction_isolation only.
	isolationVar := "transaction_isolation"
	var version string
	if err := mysqlQueryRow(base, "SELECT VERSION()", &version); err != nil {
		return nil, err
	}
	if strings.Contains(version, "MariaDB") {
		isolationVar = "tx_isolation"
	}

	cfg := base.Clone()
	cfg.DBName = name
	return &Server{
		Name:    "mysql",
		Version: version,
		Addr:    cfg.Addr,
		DSN:     "mysql://" + cfg.FormatDSN(),
		Ago: func(d time.Duration) clause.Expr {
			return gorm.Expr("UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND", d.Microseconds())
		},
		Isolation: func(level string) map[string]string {
			return map[string]string{isolationVar: "'" + strings.ReplaceAll(strings.ToUpper(level), " ", "-") + "'"}
		},
		LockWaits: func(db *gorm.DB, like string) (int64, error) {
			// Sessions of this process's database whose statement waits
			// for a row lock.
			var n int64
			err := db.Raw(`SELECT count(*) FROM information_schema.INNODB_TRX t
				JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
				WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE() AND t.trx_query LIKE ?`, like).Scan(&n).Error
			return n, err
		},
		newSpace: newSpace,
		spaceDSN: func(name string) string {
			c := cfg.Clone()
			c.DBName = name
			return "mysql://" + c.FormatDSN()
		},
		open: func(params map[string]string) (*gorm.DB, error) {
			c := cfg.Clone()
			dsn, err := mysqlDSN(c, params)
			if err != nil {
				return nil, err
			}
			return gorm.Open(mysql.Open(dsn), quiet())
		},
	}, nil
}

// mysqlDSN is cfg's DSN with params added: the driver's own settings (such
// as clientFoundRows) or session variables, which the driver SETs on every
// new connection. The value of a string variable must be quoted: "'x'".
func mysqlDSN(cfg *mysqldriver.Config, params map[string]string) (string, error) {
	var extra []string
	for k, v := range params {
		switch k {
		case addrParam:
			cfg.Addr = v
			continue
		case spaceParam:
			cfg.DBName = v
			continue
		}
		extra = append(extra, url.QueryEscape(k)+"="+url.QueryEscape(v))
	}
	dsn := cfg.FormatDSN()
	if len(extra) > 0 {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + strings.Join(extra, "&")
	}
	if _, err := mysqldriver.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("params %v: %w", params, err)
	}
	return dsn, nil
}

// mysqlConfig finds a MySQL or MariaDB server: from the environment, or on
// this machine.
func mysqlConfig() (*mysqldriver.Config, error) {
	if s := os.Getenv("GORMLEASE_TEST_MYSQL_DSN"); s != "" {
		// The driver's own DSN, or the commands' mysql:// form.
		cfg, err := dsn.MySQL(s)
		if err != nil {
			return nil, fmt.Errorf("GORMLEASE_TEST_MYSQL_DSN: %w", err)
		}
		return cfg, Ping("mysql", cfg.FormatDSN())
	}
	if dockerRequired() {
		return nil, fmt.Errorf("%s is set, and GORMLEASE_TEST_MYSQL_DSN is not: run the tests with tests/dockerpass", dockerEnv)
	}
	cfg := mysqlRoot("127.0.0.1:3306", 5*time.Second)
	if err := Ping("mysql", cfg.FormatDSN()); err != nil {
		return nil, fmt.Errorf("no DSN in GORMLEASE_TEST_MYSQL_DSN, and the local server: %w", err)
	}
	return cfg, nil
}

// mysqlRoot is the configuration of a connection as root, with no password,
// to the server at addr ("host:port"), outside any database.
func mysqlRoot(addr string, timeout time.Duration) *mysqldriver.Config {
	cfg := mysqldriver.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.Timeout = "root", "tcp", addr, timeout
	return cfg
}

// mysqlExec runs one statement on the server, outside any test database.
func mysqlExec(cfg *mysqldriver.Config, query string) error {
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(query)
	return err
}

// mysqlQueryRow reads one row from the server, outside any test database.
func mysqlQueryRow(cfg *mysqldriver.Config, query string, dest ...any) error {
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRow(query).Scan(dest...)
}
