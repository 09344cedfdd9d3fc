package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// A refused Run says who holds the target, since when and until when, with
// no round trip of its own: enough for an HTTP handler to answer 409
// Conflict with a Retry-After from RetryAfter. Here pod-a holds the lease through a Repository, as
// another process's Run would, and pod-b's Run is refused.
func ExampleHeldError() {
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
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	podA, err := gormlease.NewRepository(db, gormlease.WithHolder("pod-a"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := podA.Acquire(ctx, "report:user-42", time.Hour); err != nil {
		log.Fatal(err)
	}

	podB, err := gormlease.NewRunner[string](db, gormlease.WithHolder("pod-b"))
	if err != nil {
		log.Fatal(err)
	}
	_, err = podB.Run(ctx, "report:user-42",
		func(context.Context) (string, error) { return "report", nil },
		func(*gorm.DB, string) error { return nil })
	var held *gormlease.HeldError
	if errors.As(err, &held) {
		// Retry-After: as long again as pod-a has held it, here just
		// now, so 1 s; not the hour that its lease could still live.
		fmt.Printf("409 Conflict: %q in progress on %s (generation %d), Retry-After: %d\n",
			held.Target, held.Holder, held.Generation, int(held.RetryAfter().Seconds()))
	}
	// Output:
	// 409 Conflict: "report:user-42" in progress on pod-a (generation 1), Retry-After: 1
}
