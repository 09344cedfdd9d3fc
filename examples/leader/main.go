// Command leader runs one leader among its copies: each copy stands by
// until it holds the role "scheduler", then runs the leader's loop until it
// is stopped or deposed.
//
// Stopping a copy well is what keeps the role led through a rolling deploy.
// On SIGTERM (or Ctrl-C) signal.NotifyContext cancels the context: the
// leader's loop returns, Lead releases the role, and a standby leads within
// milliseconds (on PostgreSQL, woken by a notification; on SQLite, at its
// next poll, within a heartbeat interval). Without it, SIGTERM ends the
// process with the role still held, and no copy leads until the lease
// times out (20 s with the defaults).
//
//	go run ./examples/leader -holder pod-a &
//	go run ./examples/leader -holder pod-b &
//	kill %1   # pod-b leads at once
//
// It runs on SQLite in the file leader.db by default, and on PostgreSQL
// with -dsn 'postgres://...'.
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

func main() {
	host, _ := os.Hostname()
	dsn := flag.String("dsn", "leader.db", "a postgres:// DSN, or an SQLite file")
	holder := flag.String("holder", host, "this copy's name, as Leader reports it")
	timeout := flag.Duration("lease-timeout", gormlease.DefaultLeaseTimeout,
		"how long the role stays held after its leader died without releasing it")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *holder, *timeout, os.Stdout); err != nil {
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

// run stands for the role on the database of dsn, as holder, and leads it
// whenever it can, until ctx is done; it writes what happens to out.
func run(ctx context.Context, dsn, holder string, timeout time.Duration, out io.Writer) error {
	db, err := open(dsn)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return err
	}
	// The lease timeout alone: the heartbeat interval follows it (timeout/4).
	elector, err := gormlease.NewElector(db, "scheduler", gormlease.WithHolder(holder),
		gormlease.WithLeaseTimeout(timeout))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "standing by")
	for {
		err := elector.Lead(ctx, func(ctx context.Context) error { return lead(ctx, out) })
		switch {
		case ctx.Err() != nil: // stopped: the role is released
			fmt.Fprintln(out, "stopped")
			return nil
		case errors.Is(err, gormlease.ErrLeaseLost): // deposed: stand by again
			fmt.Fprintln(out, "deposed, standing by")
		case err != nil:
			return err
		}
	}
}

// lead is the leader's loop: it runs the leader's work every second until
// ctx is done, which happens when the process is stopped or the term ends.
func lead(ctx context.Context, out io.Writer) error {
	term, _ := gormlease.LeaseFromContext(ctx)
	fmt.Fprintf(out, "leading, term %d\n", term.Generation)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			// The leader's work goes here; its writes are fenced by the
			// term (see Repository.CommitIfOwner).
		}
	}
}
