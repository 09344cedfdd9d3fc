package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testkit"
)

// openDB opens the examples' database: SQLite in a file of its own, with
// gormlease's tables (see testkit.ExampleDB).
var openDB = testkit.ExampleDB

// An operator lists the leases under a prefix, with their state on the
// database's clock, and pauses a target during a deploy: its next Run is
// refused until Resume.
func Example() {
	db, closeDB := openDB()
	defer closeDB()
	ctx := context.Background()
	runner, err := gormlease.NewRunner[string](db)
	if err != nil {
		log.Fatal(err)
	}
	work := func(context.Context) (string, error) { return "sent", nil }
	if _, err := runner.Run(ctx, "report:user-42", work, gormlease.SaveJSON[string]); err != nil {
		log.Fatal(err)
	}

	op := admin.New(runner.Repository())
	page, err := op.List(ctx, admin.ListOptions{Prefix: "report:"})
	if err != nil {
		log.Fatal(err)
	}
	for _, li := range page {
		fmt.Println(li.TargetID, li.State, "generation", li.Row.Generation)
	}

	if err := op.Pause(ctx, "report:user-42", "deploy in progress"); err != nil {
		log.Fatal(err)
	}
	_, err = runner.Run(ctx, "report:user-42", work, gormlease.SaveJSON[string])
	fmt.Println("paused:", errors.Is(err, gormlease.ErrPaused))
	if err := op.Resume(ctx, "report:user-42"); err != nil {
		log.Fatal(err)
	}
	_, err = runner.Run(ctx, "report:user-42", work, gormlease.SaveJSON[string])
	fmt.Println("resumed:", err)
	// Output:
	// report:user-42 released generation 1
	// paused: true
	// resumed: <nil>
}

// An operator ends the lease of one slot of a semaphore whose holder is
// known to be gone; the other slots' holders keep theirs.
func ExampleOperator_ForceReleaseSlot() {
	db, closeDB := openDB()
	defer closeDB()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	gone, err := repo.AcquireSlot(ctx, "api:geocoder", 2, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	alive, err := repo.AcquireSlot(ctx, "api:geocoder", 2, time.Minute)
	if err != nil {
		log.Fatal(err)
	}

	row, err := admin.New(repo).ForceReleaseSlot(ctx, "api:geocoder", gone.Slot)
	if err != nil {
		log.Fatal(err) // ErrNoLiveLease: the slot had no lease to end
	}
	fmt.Println("next generation:", row.Generation == gone.Generation+1)
	fmt.Println("its holder:", errors.Is(repo.Heartbeat(ctx, gone), gormlease.ErrLeaseLost))
	fmt.Println("the other slot's holder:", repo.Heartbeat(ctx, alive))
	// Output:
	// next generation: true
	// its holder: true
	// the other slot's holder: <nil>
}

// ReadStats shows the library's own load in the process, for a gauge: the
// goroutines that renew held leases and the rows that waiting callers
// watch. Every count is zero once every call has returned.
func ExampleReadStats() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[string](db)
	if err != nil {
		log.Fatal(err)
	}
	_, err = runner.Run(context.Background(), "stats:nightly", func(ctx context.Context) (string, error) {
		fmt.Println("heartbeat goroutines while the work runs:", admin.ReadStats().HeartbeatGroups)
		return "done", nil
	}, gormlease.SaveJSON[string])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("after: %+v\n", admin.ReadStats())
	// Output:
	// heartbeat goroutines while the work runs: 1
	// after: {HeartbeatGroups:0 WatchedRows:0}
}

// An on-call engineer acts under their own name (the console passes the
// signed-in user), so that the row says who paused a target, and counts
// the rows of each state before listing the paused ones.
func ExampleOperator_As() {
	db, closeDB := openDB()
	defer closeDB()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, target := range []string{"sync:eu", "sync:us", "sync:ap"} {
		if _, err := repo.Acquire(ctx, target, time.Minute); err != nil {
			log.Fatal(err)
		}
	}

	op := admin.New(repo).As("alice@example.com")
	if err := op.Pause(ctx, "sync:us", "vendor outage"); err != nil {
		log.Fatal(err)
	}
	counts, err := op.Count(ctx, "sync:")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d rows: %d live, %d paused\n", counts.Total, counts.Live, counts.Paused)
	paused, err := op.List(ctx, admin.ListOptions{Prefix: "sync:", State: admin.StatePaused})
	if err != nil {
		log.Fatal(err)
	}
	for _, li := range paused {
		fmt.Println(li.TargetID, li.State, "paused by", li.PausedBy+":", li.PauseReason)
	}
	// Output:
	// 3 rows: 3 live, 1 paused
	// sync:us live paused by alice@example.com: vendor outage
}

// The rows that have gone longest without a heartbeat come first in
// OrderAge; each page goes on from the Cursor of the last row of the one
// before.
func ExampleOperator_List_order() {
	db, closeDB := openDB()
	defer closeDB()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, target := range []string{"etl:c", "etl:a", "etl:b"} {
		if _, err := repo.Acquire(ctx, target, time.Minute); err != nil {
			log.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // SQLite's clock counts milliseconds
	}

	op := admin.New(repo)
	opts := admin.ListOptions{Prefix: "etl:", Order: admin.OrderAge, Limit: 2}
	for {
		page, err := op.List(ctx, opts)
		if err != nil {
			log.Fatal(err)
		}
		for _, li := range page {
			fmt.Println(li.TargetID)
		}
		if len(page) < opts.Limit {
			break
		}
		opts.After = page[len(page)-1].Cursor
	}
	// Output:
	// etl:c
	// etl:a
	// etl:b
}

// An operator reads a target's history, newest first, a page at a time:
// the history is turned on once, where the schema is migrated, and every
// Runner, Repository and Operator on the table records its events from
// then on. A table without history says so with ErrNoHistory.
func ExampleOperator_History() {
	db, closeDB := openDB()
	defer closeDB()
	ctx := context.Background()
	if err := gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()); err != nil {
		log.Fatal(err)
	}
	runner, err := gormlease.NewRunner[string](db, gormlease.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	work := func(context.Context) (string, error) { return "sent", nil }
	if _, err := runner.Run(ctx, "report:user-42", work, gormlease.SaveJSON[string]); err != nil {
		log.Fatal(err)
	}
	op := admin.New(runner.Repository())
	if err := op.As("alice").Pause(ctx, "report:user-42", "deploy in progress"); err != nil {
		log.Fatal(err)
	}

	events, err := op.History(ctx, "report:user-42", admin.HistoryOptions{Limit: 20})
	switch {
	case errors.Is(err, admin.ErrNoHistory):
		log.Fatal("no history kept: migrate with gormlease.WithHistory() to keep one")
	case err != nil:
		log.Fatal(err)
	}
	for _, e := range events {
		line := fmt.Sprintf("%d %s generation %d", e.Seq, e.Kind, e.Generation)
		if e.How != "" {
			line += " " + e.How
		}
		if e.Operator != "" {
			line += " by " + e.Operator + ": " + e.Detail
		}
		fmt.Println(line)
	}
	// Output:
	// 3 paused generation 1 by alice: deploy in progress
	// 2 ended generation 1 saved
	// 1 acquired generation 1 new
}
