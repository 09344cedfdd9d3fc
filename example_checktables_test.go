package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// A service checks at startup that the tables exist, and says how to make
// them when they do not; every step would report them so too, at once.
func ExampleRepository_CheckTables() {
	dir, err := os.MkdirTemp("", "gormlease-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)"
	db, err := gorm.Open(gormlite.Open(dsn), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	ctx := context.Background()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		log.Fatal(err)
	}

	err = repo.CheckTables(ctx)
	fmt.Println(errors.Is(err, gormlease.ErrMissingTables))
	fmt.Println(err)

	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	fmt.Println(repo.CheckTables(ctx))
	// Output:
	// true
	// gormlease: check tables: table "job_lease", table "job_lease_floor", table "job_result" do not exist: create the tables with gormlease.AutoMigrate, or run `gormlease migrate`
	// <nil>
}
