package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testkit"
)

// Report is what the slow external call returns in these examples.
type Report struct {
	User  string `json:"user"`
	Score int    `json:"score"`
}

// A Runner runs the slow work for a target once, and saves its result only
// if its lease is still its own. The database here is SQLite in a file of
// its own, opened as docs/sqlite.md says; on PostgreSQL it is
// gorm.Open(postgres.Open(dsn), &gorm.Config{}).
func ExampleRunner_Run() {
	dir, err := os.MkdirTemp("", "gormlease-example") // your application's own file instead
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(gormlite.Open("file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil { // job_lease and job_result
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

// openDB opens the examples' database (see testkit.ExampleDB).
var openDB = testkit.ExampleDB

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
	db, closeDB := openDB()
	defer closeDB()
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
	db, closeDB := openDB()
	defer closeDB()
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
	db, closeDB := openDB()
	defer closeDB()
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
	db, closeDB := openDB()
	defer closeDB()
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

// Do runs the work once for all the callers that ask for a target at the
// same time, in this process or others: the first caller runs it, the
// others wait and get its saved result, read back by load.
func ExampleRunner_Do() {
	db, closeDB := openDB()
	defer closeDB()
	// WithReuseFor also gives the saved report to a caller that comes just
	// after the job ended, rather than run it again.
	runner, err := gormlease.NewRunner[Report](db, gormlease.WithReuseFor(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	id := "report:user-7"
	load := func(tx *gorm.DB) (Report, error) {
		r, _, err := gormlease.LoadJSON[Report](tx.Statement.Context, tx, id)
		return r, err
	}

	const callers = 5
	var asked sync.WaitGroup // every caller has asked
	asked.Add(callers)
	var apiCalls, sharedReports atomic.Int32
	var mu sync.Mutex
	reports := map[Report]int{} // how many callers got each report
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			asked.Done()
			report, shared, err := runner.Do(context.Background(), id,
				func(ctx context.Context) (Report, error) {
					apiCalls.Add(1)
					asked.Wait() // the slow external call: the others ask meanwhile
					return Report{User: "user-7", Score: 88}, nil
				},
				gormlease.SaveJSON[Report], load)
			switch {
			case errors.Is(err, gormlease.ErrSharedJobFailed):
				log.Fatal("the job this caller waited for failed: ", err)
			case err != nil:
				log.Fatal(err)
			case shared:
				sharedReports.Add(1)
			}
			mu.Lock()
			reports[report]++
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Println("API calls:", apiCalls.Load())
	fmt.Printf("reports: %+v\n", reports)
	fmt.Println("callers that got the report of another's call:", sharedReports.Load())
	// Output:
	// API calls: 1
	// reports: map[{User:user-7 Score:88}:5]
	// callers that got the report of another's call: 4
}

// RunWait runs every caller's own work, one at a time: a caller that finds
// the lease held waits until it is released (or expires), then runs its
// work under a generation of its own.
func ExampleRunner_RunWait() {
	db, closeDB := openDB()
	defer closeDB()
	// Two Runners, as two processes would have.
	var runners []*gormlease.Runner[string]
	for range 2 {
		r, err := gormlease.NewRunner[string](db)
		if err != nil {
			log.Fatal(err)
		}
		runners = append(runners, r)
	}
	var (
		mu          sync.Mutex
		generations []int64
		inside      atomic.Int32
		overlapped  atomic.Bool
	)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			_, err := runners[i%2].RunWait(context.Background(), "export:nightly",
				func(ctx context.Context) (string, error) {
					if inside.Add(1) > 1 {
						overlapped.Store(true)
					}
					defer inside.Add(-1)
					lease, _ := gormlease.LeaseFromContext(ctx)
					mu.Lock()
					generations = append(generations, lease.Generation)
					mu.Unlock()
					return "exported", nil
				},
				gormlease.SaveJSON[string])
			if err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	slices.Sort(generations)
	fmt.Println("runs:", len(generations))
	fmt.Println("two at once:", overlapped.Load())
	fmt.Println("each under its own generation:", len(slices.Compact(generations)) == 4)
	// Output:
	// runs: 4
	// two at once: false
	// each under its own generation: true
}

// An Elector leads a role for one term at a time: Lead waits for the role,
// holding no connection, then runs the leader's loop until it returns or
// the lease can no longer be trusted. The term's generation fences its
// writes.
func ExampleElector_Lead() {
	db, closeDB := openDB()
	defer closeDB()
	elector, err := gormlease.NewElector(db, "scheduler", gormlease.WithHolder("pod-a"))
	if err != nil {
		log.Fatal(err)
	}
	err = elector.Lead(context.Background(), func(ctx context.Context) error {
		term, _ := gormlease.LeaseFromContext(ctx)
		// The leader's loop goes here; it must return when ctx is done.
		// A write of the term, refused once a newer term has begun:
		return elector.Repository().CommitIfOwner(ctx, term, func(tx *gorm.DB) error {
			return gormlease.SaveJSON(tx, "scheduled by pod-a")
		})
	})
	fmt.Println("term ended:", err)
	// Output: term ended: <nil>
}

// WithSlots makes a target a semaphore: here an external API that allows
// two concurrent calls. Up to two works run at once, each under a slot of
// its own, with its own generation; the others wait in RunWait for a free
// slot.
func ExampleWithSlots() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[string](db, gormlease.WithSlots(2))
	if err != nil {
		log.Fatal(err)
	}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			_, err := runner.RunWait(context.Background(), "api:geocoder",
				func(ctx context.Context) (string, error) {
					n := inside.Add(1)
					defer inside.Add(-1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					lease, _ := gormlease.LeaseFromContext(ctx)
					if lease.Slot < 1 || lease.Slot > 2 {
						return "", fmt.Errorf("slot %d", lease.Slot)
					}
					time.Sleep(20 * time.Millisecond) // the API call
					return "geocoded", nil
				},
				func(tx *gorm.DB, result string) error { return nil })
			if err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("at most two at once:", most.Load() <= 2)
	// Output:
	// at most two at once: true
}
