// Package dsn maps the DSNs that gormlease's commands and tests take to
// a database: the one parser that cmd/gormlease, cmd/leasedemo and
// internal/testdb share. It also holds the MySQL settings gormlease needs,
// and hides passwords when a DSN is printed.
package dsn

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ncruces/go-sqlite3/gormlite"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Kind is the kind of database a DSN names.
type Kind string

// The kinds of database.
const (
	KindPostgres Kind = "postgres"
	KindMySQL    Kind = "mysql"
	KindSQLite   Kind = "sqlite"
)

// MySQLPrefix starts a MySQL or MariaDB DSN given to the commands; the
// driver's own DSN follows it.
const MySQLPrefix = "mysql://"

// SQLitePragmas are the settings that an SQLite path given without a
// query string gets: the busy timeout that gormlease needs.
const SQLitePragmas = "_pragma=busy_timeout(10000)"

// Forms lists the DSN forms that Parse takes, for usage and error texts.
const Forms = `postgres://USER@HOST:5432/DB (or postgresql://); ` +
	`PostgreSQL's keyword form, host=HOST user=USER dbname=DB; ` +
	`mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or the driver's own USER:PASSWORD@tcp(HOST:3306)/DB; ` +
	`sqlite:PATH or file:PATH for SQLite; or the path of an existing SQLite file`

// ErrUnrecognized is wrapped by the error of Parse for a DSN of none of
// the Forms.
var ErrUnrecognized = errors.New("unrecognized DSN")

// Parsed is a DSN as Parse read it.
type Parsed struct {
	// Kind is the kind of database.
	Kind Kind
	// Driver is the DSN in the form that Kind's driver takes: pgx's (the
	// DSN as given), go-sql-driver/mysql's (without MySQLPrefix, with
	// parseTime=true and loc=UTC), or the ncruces SQLite driver's file:
	// URI.
	Driver string
	// MySQL is the MySQL driver's settings, for KindMySQL; nil otherwise.
	MySQL *mysql.Config
}

// keywordStart matches the start of PostgreSQL's keyword/value form: a
// key and "=".
var keywordStart = regexp.MustCompile(`^\s*[a-z_]+\s*=`)

// keywordKey matches a key of the keyword/value form that names where
// the database is, one of which that form must have.
var keywordKey = regexp.MustCompile(`(?:^|\s)(?:host|hostaddr|port|dbname|user|service)\s*=`)

// mysqlAddress matches the address of go-sql-driver/mysql's own DSN, as
// in "user:password@tcp(host:3306)/db".
var mysqlAddress = regexp.MustCompile(`@[a-z0-9]+\([^()]*\)/`)

// Parse reads s, a DSN in one of the Forms, and says which database it
// names. It never opens the database, nor creates a file: a plain path is
// taken as SQLite only when it names an existing file, and a DSN of no
// form is an error wrapping ErrUnrecognized that lists them (sqlite:PATH
// names a file that opening may create).
func Parse(s string) (Parsed, error) {
	switch {
	case s == "":
		return Parsed{}, fmt.Errorf("%w: no DSN given: give %s", ErrUnrecognized, Forms)
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"),
		keywordStart.MatchString(s) && keywordKey.MatchString(s):
		if _, err := pgconn.ParseConfig(s); err != nil {
			return Parsed{}, fmt.Errorf("bad PostgreSQL DSN %q: %w", Redact(s), err)
		}
		return Parsed{Kind: KindPostgres, Driver: s}, nil
	case strings.HasPrefix(s, MySQLPrefix), !strings.Contains(s, "://") && mysqlAddress.MatchString(s):
		cfg, err := MySQL(s)
		if err != nil {
			return Parsed{}, fmt.Errorf("bad MySQL DSN %q: %w; write it as mysql://USER:PASSWORD@tcp(HOST:3306)/DB", Redact(s), err)
		}
		return Parsed{Kind: KindMySQL, Driver: cfg.FormatDSN(), MySQL: cfg}, nil
	case strings.HasPrefix(s, "file:"):
		return Parsed{Kind: KindSQLite, Driver: s}, nil
	case strings.HasPrefix(s, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(s, "sqlite:"), "//")
		if path == "" || strings.HasPrefix(path, "?") {
			return Parsed{}, fmt.Errorf("%w %q: no path after sqlite:; give sqlite:PATH", ErrUnrecognized, s)
		}
		return Parsed{Kind: KindSQLite, Driver: sqliteURI(path)}, nil
	case strings.Contains(s, "://"):
		return Parsed{}, fmt.Errorf("%w %q: its scheme is none of postgres, postgresql, mysql; give %s", ErrUnrecognized, Redact(s), Forms)
	}
	if st, err := os.Stat(s); err != nil || !st.Mode().IsRegular() {
		return Parsed{}, fmt.Errorf("%w %q: not a DSN of a known form, nor the path of an existing file; "+
			"give %s (sqlite:PATH creates a new SQLite database)", ErrUnrecognized, Redact(s), Forms)
	}
	return Parsed{Kind: KindSQLite, Driver: sqliteURI(s)}, nil
}

// sqliteURI is the SQLite driver's DSN for path, which may carry a query
// string of the driver's settings; without one it gets SQLitePragmas.
func sqliteURI(path string) string {
	if strings.Contains(path, "?") {
		return "file:" + path
	}
	return "file:" + path + "?" + SQLitePragmas
}

// Dialector returns the gorm dialector that opens p.
func (p Parsed) Dialector() gorm.Dialector {
	switch p.Kind {
	case KindPostgres:
		return postgres.Open(p.Driver)
	case KindMySQL:
		return gormmysql.Open(p.Driver)
	}
	return gormlite.Open(p.Driver)
}

// Open parses s (see Parse) and returns the gorm dialector that opens it,
// and its kind.
func Open(s string) (gorm.Dialector, Kind, error) {
	p, err := Parse(s)
	if err != nil {
		return nil, "", err
	}
	return p.Dialector(), p.Kind, nil
}

// MySQL parses dsn, with or without MySQLPrefix, as a go-sql-driver/mysql
// DSN and adds the settings gormlease needs: datetimes read as time.Time,
// in UTC.
func MySQL(dsn string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(strings.TrimPrefix(dsn, MySQLPrefix))
	if err != nil {
		return nil, err
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	return cfg, nil
}

// keywordPassword matches a password in a keyword/value DSN
// ("host=h password=secret").
var keywordPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// Redact hides the password in dsn, so that it can be printed: in a
// URL-shaped DSN ("scheme://user:password@host/db"), in a keyword/value
// one ("password=secret"), and in go-sql-driver/mysql's own
// ("user:password@tcp(host)/db").
func Redact(dsn string) string {
	scheme, rest, ok := strings.Cut(dsn, "://")
	if !ok {
		if mysqlAddress.MatchString(dsn) {
			return redactUserInfo("", dsn)
		}
		return keywordPassword.ReplaceAllString(dsn, "${1}***")
	}
	return redactUserInfo(scheme+"://", rest)
}

// redactUserInfo hides the password in rest, "user:password@…", after
// prefix.
func redactUserInfo(prefix, rest string) string {
	at := strings.LastIndex(rest, "@")
	colon := strings.Index(rest, ":")
	if at < 0 || colon < 0 || colon > at {
		return prefix + rest
	}
	return prefix + rest[:colon] + ":***" + rest[at:]
}
