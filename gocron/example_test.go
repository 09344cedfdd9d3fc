package gormleasegocron_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	gormleasegocron "github.com/gormlease/gormlease/gocron"
	"github.com/gormlease/gormlease/internal/testkit"
)

// openDB opens the database as an application does, and creates the
// gormlease tables (gormlease.AutoMigrate, once at startup): here SQLite in
// a file of its own (see testkit.ExampleDB); on PostgreSQL,
// gorm.Open(postgres.Open(dsn), ...). closeDB closes it and removes the
// file.
var openDB = testkit.ExampleDB

// Every pod runs the same scheduler; the Locker lets one of them run each
// tick of the job, and WithMinHold keeps a fast job's target held long
// enough that a pod whose timer fires a moment later skips the tick.
func ExampleNewLocker() {
	db, closeDB := openDB()
	defer closeDB()
	locker, err := gormleasegocron.NewLocker(db, gormlease.WithMinHold(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), // in a pod: gocron.CronJob("*/5 * * * *", false)
		gocron.NewTask(func() { fmt.Println("sending the digest"); close(ran) }),
		gocron.WithName("example-digest"), // the job's name is the lease's target
	)
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		log.Fatal(err)
	}

	// Another pod's timer fires for the same tick: the target is still
	// held, for the rest of the minimum hold.
	_, err = locker.Lock(context.Background(), "example-digest")
	fmt.Println("another pod skips the tick:", errors.Is(err, gormlease.ErrLeaseHeld))
	// Output:
	// sending the digest
	// another pod skips the tick: true
}

// Lock and Unlock are what gocron calls around each run; a second Lock of
// the job while the first holds it is refused.
func ExampleLocker_Lock() {
	db, closeDB := openDB()
	defer closeDB()
	locker, err := gormleasegocron.NewLocker(db)
	if err != nil {
		log.Fatal(err)
	}
	lock, err := locker.Lock(context.Background(), "example-lock")
	if err != nil {
		log.Fatal(err)
	}
	_, err = locker.Lock(context.Background(), "example-lock")
	fmt.Println("held:", errors.Is(err, gormlease.ErrLeaseHeld))
	// Unlock reports whether the lease held through the run.
	fmt.Println("unlock:", lock.Unlock(context.Background()))
	// Output:
	// held: true
	// unlock: <nil>
}

// With a DistributedElector, only the leader's scheduler runs the jobs; a
// standby takes over when the leader dies. A job that must stop when its
// leader is deposed runs on the term's context.
func ExampleNewDistributedElector() {
	db, closeDB := openDB()
	defer closeDB()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elector, err := gormleasegocron.NewDistributedElector(ctx, db, "example-scheduler")
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close() // resigns, and waits for the campaign to end
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() {
		term, err := elector.Term()
		if err != nil {
			return // deposed since gocron asked IsLeader
		}
		lease, _ := gormlease.LeaseFromContext(term)
		// Writes fenced by the term: refused once another pod leads.
		err = elector.Repository().CommitIfOwner(term, lease, func(tx *gorm.DB) error { return nil })
		if err == nil {
			select {
			case ran <- struct{}{}:
			default:
			}
		}
	}), gocron.WithName("example-rollup"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ran
	fmt.Println("the leader ran the job")
	if err := s.Shutdown(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// the leader ran the job
}
