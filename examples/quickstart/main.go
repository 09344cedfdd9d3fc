// Command quickstart is the README's Quickstart as a program that builds
// and runs as it stands: it makes a user's report once at a time, with a
// slow call that stands for an external API, and saves it in a table of
// its own only while its lease is its own.
//
// It runs on SQLite in the file quickstart.db by default, and on
// PostgreSQL with a DSN:
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Report is a row of the application's own table.
type Report struct {
	ID         uint
	UserName   string
	Score      int
	Generation int64 // the lease's generation when the report was made
}

func main() {
	dsn := flag.String("dsn", "quickstart.db", "a postgres:// DSN, or an SQLite file")
	user := flag.String("user", "user-42", "whose report to make")
	flag.Parse()
	// Ctrl-C or SIGTERM cancels the work, and Run releases the lease.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *user, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// open opens dsn: PostgreSQL for a postgres:// DSN, SQLite otherwise (see
// docs/sqlite.md for its settings).
func open(dsn string) (*gorm.DB, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return gorm.Open(postgres.Open(dsn), &gorm.Config{})
	}
	if !strings.HasPrefix(dsn, "file:") {
		dsn = "file:" + dsn + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"
	}
	return gorm.Open(gormlite.Open(dsn), &gorm.Config{})
}

// run makes user's report on the database of dsn, and writes what happened
// to out.
func run(ctx context.Context, dsn, user string, out io.Writer) error {
	db, err := open(dsn)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	if err := gormlease.AutoMigrate(ctx, db); err != nil { // job_lease and job_result
		return err
	}
	if err := db.AutoMigrate(&Report{}); err != nil { // the application's own table
		return err
	}

	runner, err := gormlease.NewRunner[*Report](db) // heartbeat every 5 s, timeout 20 s
	if err != nil {
		return err
	}
	report, err := runner.Run(ctx, "report:"+user,
		func(ctx context.Context) (*Report, error) {
			lease, _ := gormlease.LeaseFromContext(ctx)
			return makeReport(ctx, user, lease.Generation) // slow; generation = idempotency key
		},
		func(tx *gorm.DB, r *Report) error { return tx.Create(r).Error },
	)
	switch {
	case errors.Is(err, gormlease.ErrLeaseHeld): // another request is already on it: nothing ran
		fmt.Fprintf(out, "the report of %s is being made elsewhere\n", user)
	case errors.Is(err, gormlease.ErrLeaseLost): // taken over meanwhile: nothing was saved
		fmt.Fprintf(out, "the report of %s was taken over; nothing saved\n", user)
	case errors.Is(err, gormlease.ErrCommitUnknown): // the connection died during COMMIT: check before redoing
		return fmt.Errorf("report of %s: check whether it was saved: %w", user, err)
	case err != nil: // the work or the save failed; the lease is released
		return err
	default: // saved: report.ID is the ID the database assigned
		fmt.Fprintf(out, "saved report %d of %s: score %d, generation %d\n",
			report.ID, report.UserName, report.Score, report.Generation)
	}
	return nil
}

// makeReport stands for the slow external call: it honours ctx, which is
// cancelled if the lease is lost.
func makeReport(ctx context.Context, user string, generation int64) (*Report, error) {
	select {
	case <-time.After(100 * time.Millisecond):
		return &Report{UserName: user, Score: 97, Generation: generation}, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
