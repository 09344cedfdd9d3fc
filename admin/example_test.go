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
