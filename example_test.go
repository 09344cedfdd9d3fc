package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Report is what the slow external call returns in these examples.
type Report struct {
	User  string `json:"user"`
	Score int    `json:"score"`
}

// exampleDB returns the examples' database. In an application it is your
// own: gorm.Open(postgres.Open(dsn), &gorm.Config{}).
func exampleDB() *gorm.DB {
	db, err := testdb.Example()
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// A Runner runs the slow work for a target once, and saves its result only
// if its lease is still its own.
func ExampleRunner_Run() {
	db := exampleDB()
	if err := gormlease.AutoMigrate(db); err != nil {
		log.Fatal(err)
	}
	runner, err := gormlease.NewRunner[Report](db,
		gormlease.WithHeartbeatInterval(30*time.Second),
		gormlease.WithLeaseTimeout(2*time.Minute))
	if err != nil {
		log.Fatal(err)
	}

	report, err := runner.Run(context.Background(), "report:user-42",
		func(ctx context.Context) (Report, error) {
			// The slow external call goes here. Pass ctx on: it is
			// cancelled if the lease is lost.
			return Report{User: "user-42", Score: 97}, nil
		},
		gormlease.SaveJSON[Report], // or your own func(tx *gorm.DB, r Report) error
	)
	switch {
	case errors.Is(err, gormlease.ErrLeaseHeld):
		fmt.Println("another request is already making this report")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("made %+v\n", report)
	}

	saved, _, err := gormlease.LoadJSON[Report](context.Background(), db, "report:user-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("saved %+v\n", saved)
	// Output:
	// made {User:user-42 Score:97}
	// saved {User:user-42 Score:97}
}

// Invoice is a row of the application's own table: the database assigns
// its ID when the saver inserts it.
type Invoice struct {
	ID     uint
	Client string
	Total  int
}

// Run returns the value that the work returned. With a pointer type, the
// saver's tx.Create fills in that very value, so what the database assigned
// (here the ID) comes back from Run.
func ExampleRunner_Run_databaseAssignedID() {
	db := exampleDB()
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}
	runner, err := gormlease.NewRunner[*Invoice](db)
	if err != nil {
		log.Fatal(err)
	}
	invoice, err := runner.Run(context.Background(), "invoice:client-7",
		func(ctx context.Context) (*Invoice, error) {
			return &Invoice{Client: "client-7", Total: 1200}, nil // the slow part
		},
		func(tx *gorm.DB, inv *Invoice) error { return tx.Create(inv).Error }, // sets inv.ID
	)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the database assigned an ID:", invoice.ID != 0)

	var stored Invoice
	if err := db.First(&stored, invoice.ID).Error; err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored under it:", stored.Client, stored.Total)
	// Output:
	// the database assigned an ID: true
	// stored under it: client-7 1200
}

// A second Run on a target whose lease is held returns ErrLeaseHeld at
// once, without running its work.
func ExampleRunner_Run_leaseHeld() {
	db := exampleDB()
	runner, err := gormlease.NewRunner[string](db)
	if err != nil {
		log.Fatal(err)
	}
	work := func(ctx context.Context) (string, error) {
		_, err := runner.Run(ctx, "invoice:7", func(context.Context) (string, error) {
			return "never runs", nil
		}, func(*gorm.DB, string) error { return nil })
		fmt.Println("second request:", errors.Is(err, gormlease.ErrLeaseHeld))
		return "first", nil
	}
	result, err := runner.Run(context.Background(), "invoice:7", work, func(*gorm.DB, string) error { return nil })
	fmt.Println("first request:", result, err)
	// Output:
	// second request: true
	// first request: first <nil>
}

// The work reads its lease from its context: the generation grows with
// every acquisition of the target, so it can serve as the idempotency key of
// the external call.
func ExampleLeaseFromContext() {
	db := exampleDB()
	runner, err := gormlease.NewRunner[string](db)
	if err != nil {
		log.Fatal(err)
	}
	var keys []int64
	for range 2 {
		_, err := runner.Run(context.Background(), "payment:991", func(ctx context.Context) (string, error) {
			lease, _ := gormlease.LeaseFromContext(ctx)
			keys = append(keys, lease.Generation)
			return "", nil
		}, func(*gorm.DB, string) error { return nil })
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("the second key is greater:", keys[1] > keys[0])
	// Output:
	// the second key is greater: true
}

// The Repository runs the lease steps one by one, for callers that drive
// them themselves.
func ExampleRepository() {
	db := exampleDB()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, err := repo.Acquire(ctx, "export:2026-11", 2*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	if err := repo.Heartbeat(ctx, lease); err != nil {
		log.Fatal(err) // ErrLeaseLost: stop the work
	}
	err = repo.CommitIfOwner(ctx, lease, func(tx *gorm.DB) error {
		return gormlease.SaveJSON(tx, map[string]int{"rows": 1200})
	})
	if err != nil {
		log.Fatal(err) // ErrLeaseLost: the result was discarded
	}
	if err := repo.Release(ctx, lease); err != nil {
		log.Fatal(err)
	}
	fmt.Println("saved and released")
	// Output:
	// saved and released
}
