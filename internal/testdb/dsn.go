package testdb

import (
	"strings"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// OpenDSN opens the database of a Server's DSN (postgres://, mysql://, or
// a SQLite file's), as a child process of a test does, with gorm's logger
// silenced.
func OpenDSN(dsn string) (*gorm.DB, error) {
	cfg := &gorm.Config{Logger: logger.Discard}
	switch {
	case strings.HasPrefix(dsn, "postgres://"):
		return gorm.Open(postgres.Open(dsn), cfg)
	case strings.HasPrefix(dsn, "mysql://"):
		return gorm.Open(mysql.Open(strings.TrimPrefix(dsn, "mysql://")), cfg)
	default:
		return gorm.Open(gormlite.Open(dsn), cfg)
	}
}
