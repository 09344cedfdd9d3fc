package testkit

import (
	"context"
	"log"
	"os"
	"path/filepath"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
)

// ExampleDB opens the database of a runnable example as ExampleRunner_Run
// does: SQLite in a new file of a temporary directory, with the DSN of
// docs/sqlite.md, and gormlease's tables. Its gorm logger is silent, so
// that an example prints only its own lines; an application keeps gorm's.
// closeDB closes the database and removes its file. An example has no
// testing.TB to fail: ExampleDB exits the process on an error.
func ExampleDB() (db *gorm.DB, closeDB func()) {
	db, _, closeDB = ExampleDBWithDSN()
	return db, closeDB
}

// ExampleDBWithDSN is ExampleDB, and also returns the database's DSN, with
// which an example opens a second pool on the same database.
func ExampleDBWithDSN() (db *gorm.DB, dsn string, closeDB func()) {
	dir, err := os.MkdirTemp("", "gormlease-example")
	if err != nil {
		log.Fatal(err)
	}
	dsn = "file:" + filepath.Join(dir, "app.db") +
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"
	db, err = gorm.Open(gormlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	return db, dsn, func() {
		sqlDB.Close()
		os.RemoveAll(dir)
	}
}
