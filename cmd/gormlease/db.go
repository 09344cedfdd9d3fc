package main

import (
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	dsnpkg "github.com/gormlease/gormlease/internal/dsn"
)

// dsnEnv is the environment variable that gives the DSN when -dsn does not.
const dsnEnv = "GORMLEASE_DSN"

// dialector returns the gorm dialector for dsn, or a usage error that
// names the forms it takes. It opens nothing and creates no file.
func dialector(dsn string) (gorm.Dialector, error) {
	if dsn == "" {
		return nil, usagef("no database: give -dsn or set %s to one of: %s", dsnEnv, dsnpkg.Forms)
	}
	d, _, err := dsnpkg.Open(dsn)
	if err != nil {
		return nil, usagef("-dsn: %v", err)
	}
	return d, nil
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
