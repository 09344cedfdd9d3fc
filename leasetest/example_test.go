package leasetest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testkit"
	"github.com/gormlease/gormlease/leasetest"
)

// In these examples, t is your own test's *testing.T and db your test
// database; exampleT stands in for t here, and runs the cleanups when the
// example ends.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Errorf(format string, args ...any) { log.Printf(format, args...) }
func (t *exampleT) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }
func (t *exampleT) done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// openDB opens your test database: here SQLite in a file of its own, with
// gormlease's tables (see testkit.ExampleDB). closeDB closes it and removes
// the file; dsn opens the same database again.
var openDB = testkit.ExampleDBWithDSN

// refreshReport is the code under test: it makes the report of a user once
// at a time.
func refreshReport(ctx context.Context, r *gormlease.Runner[string], user string) (string, error) {
	return r.Run(ctx, "report:"+user, func(ctx context.Context) (string, error) {
		return "report for " + user, nil
	}, gormlease.SaveJSON[string])
}

// Another process holds the target: the code under test is refused, and
// does not run the work.
func ExampleOccupy() {
	db, _, closeDB := openDB()
	defer closeDB()
	t := &exampleT{}
	defer t.done()
	runner, _ := gormlease.NewRunner[string](db)

	leasetest.Occupy(t, db, "report:user-1")
	_, err := refreshReport(context.Background(), runner, "user-1")
	fmt.Println("held:", errors.Is(err, gormlease.ErrLeaseHeld))
	// Output: held: true
}

// A takeover in the middle of the work: the work's context is cancelled
// with ErrLeaseLost at the next heartbeat, and nothing is saved.
func ExampleTakeOver() {
	db, _, closeDB := openDB()
	defer closeDB()
	t := &exampleT{}
	defer t.done()
	runner, _ := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(100*time.Millisecond), gormlease.WithLeaseTimeout(2*time.Second))

	target := "report:user-2"
	_, err := runner.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		leasetest.TakeOver(t, db, target) // as another process would, mid-work
		<-ctx.Done()
		return "", context.Cause(ctx)
	}, gormlease.SaveJSON[string])
	_, _, loadErr := gormlease.LoadJSON[string](context.Background(), db, target)
	fmt.Println("lost:", errors.Is(err, gormlease.ErrLeaseLost))
	fmt.Println("nothing saved:", errors.Is(loadErr, gormlease.ErrNoResult))
	// Output:
	// lost: true
	// nothing saved: true
}

// Do waits for the holder of a lease; when the holder is gone and its lease
// expires, the waiting call takes it over and runs the work itself.
func ExampleExpire() {
	db, _, closeDB := openDB()
	defer closeDB()
	t := &exampleT{}
	defer t.done()
	runner, _ := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(100*time.Millisecond), gormlease.WithLeaseTimeout(2*time.Second))

	target := "report:user-3"
	leasetest.Occupy(t, db, target) // a holder that will never finish
	done := make(chan string)
	go func() {
		v, shared, err := runner.Do(context.Background(), target,
			func(context.Context) (string, error) { return "made after the holder died", nil },
			gormlease.SaveJSON[string],
			func(tx *gorm.DB) (string, error) {
				v, _, err := gormlease.LoadJSON[string](tx.Statement.Context, tx, target)
				return v, err
			})
		done <- fmt.Sprint(v, " shared=", shared, " err=", err)
	}()
	leasetest.Expire(t, db, target) // the holder died a lease timeout ago
	fmt.Println(<-done)
	fmt.Println(leasetest.WaitFor(t, db, target, admin.StateReleased, 5*time.Second).State)
	// Output:
	// made after the holder died shared=false err=<nil>
	// released
}

// State reads a target's row as admin.Operator.List reports it.
func ExampleState() {
	db, _, closeDB := openDB()
	defer closeDB()
	t := &exampleT{}
	defer t.done()
	l, release := leasetest.Occupy(t, db, "report:user-4")
	info, _ := leasetest.State(t, db, "report:user-4")
	fmt.Println(info.State, info.Row.Holder, info.Row.Generation == l.Generation)
	release()
	info, _ = leasetest.State(t, db, "report:user-4")
	fmt.Println(info.State)
	// Output:
	// live leasetest true
	// released
}

// Self-fencing without cutting a network: the Runner under test sends its
// heartbeats through a pool of their own, which the test closes during the
// work. No heartbeat is confirmed any more, and the Runner cancels the work
// with ErrLeaseLost before its lease could expire (the lease timeout less
// the safety margin after the last heartbeat), saving nothing.
func Example_selfFencing() {
	db, dsn, closeDB := openDB()
	defer closeDB()
	own, err := gorm.Open(gormlite.Open(dsn), &gorm.Config{Logger: logger.Discard}) // a second pool on the same database
	if err != nil {
		log.Fatal(err)
	}
	runner, _ := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatDB(own),
		gormlease.WithHeartbeatInterval(100*time.Millisecond), gormlease.WithLeaseTimeout(time.Second))

	_, err = runner.Run(context.Background(), "report:user-5", func(ctx context.Context) (string, error) {
		ownDB, _ := own.DB()
		ownDB.Close() // the heartbeats can no longer reach the database
		<-ctx.Done()
		return "", context.Cause(ctx)
	}, gormlease.SaveJSON[string])
	fmt.Println("self-fenced:", errors.Is(err, gormlease.ErrLeaseLost))
	// Output: self-fenced: true
}
