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

// A table migrated with WithHistory keeps the history of each target:
// the Runner, made with no option about it, records every acquisition
// and every end, with how, through the triggers that AutoMigrate made.
func ExampleWithHistory() {
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
	if err := gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()); err != nil {
		log.Fatal(err)
	}
	r, err := gormlease.NewRunner[string](db, gormlease.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	_, _ = r.Run(ctx, "report-7", func(context.Context) (string, error) { return "ok", nil }, gormlease.SaveJSON[string])
	_, _ = r.Run(ctx, "report-7", func(context.Context) (string, error) { return "", errors.New("upstream down") },
		gormlease.SaveJSON[string])

	rows, err := db.Raw(`SELECT seq, kind, generation, holder, COALESCE(how, ''), COALESCE(detail, '')
		FROM job_lease_event WHERE target_id = ? ORDER BY seq`, "report-7").Rows()
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			seq, generation           int64
			kind, holder, how, detail string
		)
		if err := rows.Scan(&seq, &kind, &generation, &holder, &how, &detail); err != nil {
			log.Fatal(err)
		}
		if detail != "" {
			how += ": " + detail
		}
		fmt.Println(seq, kind, generation, holder, how)
	}
	// Output:
	// 1 acquired 1 worker-1 new
	// 2 ended 1 worker-1 saved
	// 3 acquired 2 worker-1 released
	// 4 ended 2 worker-1 failed: work "report-7": upstream down
}
