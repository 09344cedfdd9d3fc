// Package dsn holds what gormlease's commands share about the DSNs they
// take: the MySQL settings gormlease needs, and hiding passwords when a DSN
// is printed.
package dsn

import (
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLPrefix starts a MySQL or MariaDB DSN given to the commands; the
// driver's own DSN follows it.
const MySQLPrefix = "mysql://"

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
// URL-shaped DSN ("scheme://user:password@host/db") and in a keyword/value
// one ("password=secret").
func Redact(dsn string) string {
	scheme, rest, ok := strings.Cut(dsn, "://")
	if !ok {
		return keywordPassword.ReplaceAllString(dsn, "${1}***")
	}
	at := strings.LastIndex(rest, "@")
	colon := strings.Index(rest, ":")
	if at < 0 || colon < 0 || colon > at {
		return dsn
	}
	return scheme + "://" + rest[:colon] + ":***" + rest[at:]
}
