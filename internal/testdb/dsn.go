package testdb

import (
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease/internal/dsn"
)

// OpenDSN opens the database of a Server's DSN (postgres://, mysql://, or
// a SQLite file's; any form that dsn.Parse takes), as a child process of a
// test does, with gorm's logger silenced.
func OpenDSN(s string) (*gorm.DB, error) {
	d, _, err := dsn.Open(s)
	if err != nil {
		return nil, err
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Discard})
}
