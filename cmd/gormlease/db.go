package main

import (
	"fmt"
	"strings"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	dsnpkg "github.com/gormlease/gormlease/internal/dsn"
)

// dsnEnv is the environment variable that gives the DSN when -dsn does not.
const dsnEnv = "GORMLEASE_DSN"

// sqlitePragmas are the settings that a plain SQLite path gets: the busy
// timeout gormlease needs.
const sqlitePragmas = "_pragma=busy_timeout(10000)"

// dsnForms says which DSNs the command takes.
const dsnForms = "postgres://USER@HOST:5432/DB, mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or file:PATH (or a path) for SQLite"

// usageError is an error in how the command was called: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// dialector returns the gorm dialector for dsn, or a usage error that
// names the forms it takes.
func dialector(dsn string) (gorm.Dialector, error) {
	switch {
	case dsn == "":
		return nil, usagef("no database: give -dsn or set %s to %s", dsnEnv, dsnForms)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return postgres.Open(dsn), nil
	case strings.HasPrefix(dsn, "mysql://"):
		cfg, err := dsnpkg.MySQL(dsn)
		if err != nil {
			return nil, usagef("bad MySQL DSN %q: %v; write it as mysql://USER:PASSWORD@tcp(HOST:3306)/DB", redact(dsn), err)
		}
		return mysql.Open(cfg.FormatDSN()), nil
	case strings.HasPrefix(dsn, "file:"):
		return gormlite.Open(dsn), nil
	case strings.Contains(dsn, "://"):
		return nil, usagef("unsupported DSN %q: give %s", redact(dsn), dsnForms)
	default: // a path to an SQLite file
		return gormlite.Open("file:" + dsn + "?" + sqlitePragmas), nil
	}
}

// open opens the database that dsn names.
func open(dsn string) (*gorm.DB, error) {
	d, err := dialector(dsn)
	if err != nil {
		return nil, err
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redact(dsn), err)
	}
	return db, nil
}

// closeDB closes db's pool.
func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

// redact hides the password in dsn.
func redact(dsn string) string { return dsnpkg.Redact(dsn) }
