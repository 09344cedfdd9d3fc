package recipes_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/hibiken/asynq"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/robfig/cron/v3"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testkit"
	"github.com/gormlease/gormlease/recipes"
)

// openDB opens the database as an application does, and creates the
// gormlease tables (gormlease.AutoMigrate, once at startup): here SQLite in
// a file of its own (see testkit.ExampleDB); on PostgreSQL,
// gorm.Open(postgres.Open(dsn), ...). closeDB closes it and removes the
// file.
var openDB = testkit.ExampleDB

// Every pod calls MigrateOnce at startup; one runs the migration, the
// others wait for it and run nothing.
func ExampleMigrateOnce() {
	db, closeDB := openDB()
	defer closeDB()
	if err := db.AutoMigrate(&recipes.SchemaVersion{}); err != nil {
		log.Fatal(err)
	}
	runner, err := gormlease.NewRunner[bool](db)
	if err != nil {
		log.Fatal(err)
	}
	migrate := func(ctx context.Context, db *gorm.DB) error {
		fmt.Println("migrating")
		return db.Exec("CREATE TABLE IF NOT EXISTS example_widget (id bigint PRIMARY KEY)").Error
	}
	for range 2 { // two pods, one after the other
		if err := recipes.MigrateOnce(context.Background(), db, runner, "example-0001-widgets", migrate); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("ready")
	// Output:
	// migrating
	// ready
}

// The report page's handler: tabs that ask for one user's report at once
// share the one that was made.
func ExampleReportHandler() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[recipes.Report](db, gormlease.WithReuseFor(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	makeReport := func(ctx context.Context, user string) (recipes.Report, error) {
		return recipes.Report{User: user, Score: 97}, nil // the slow external call
	}
	srv := httptest.NewServer(recipes.ReportHandler(runner, makeReport))
	defer srv.Close()
	for range 2 { // a tab, then a reload
		res, err := http.Get(srv.URL + "?user=example-user-42")
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("shared=%q %s", res.Header.Get("X-Report-Shared"), body)
	}
	// Output:
	// shared="" {"user":"example-user-42","score":97,"generation":1}
	// shared="true" {"user":"example-user-42","score":97,"generation":1}
}

// A cron job that runs on every pod's cron, skipped on a pod while another
// pod's run goes on.
func ExampleCronSkipIfHeld() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[struct{}](db)
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New()
	wrap := recipes.CronSkipIfHeld(runner, "cron:nightly-export", cron.DefaultLogger)
	_, err = c.AddJob("@daily", cron.NewChain(wrap).Then(cron.FuncJob(func() { fmt.Println("exporting") })))
	if err != nil {
		log.Fatal(err)
	}
	// In a pod: c.Start(), and c.Stop() on the way out. Here the job runs
	// once, as the cron would run it:
	c.Entries()[0].WrappedJob.Run()
	// Output:
	// exporting
}

// A River client whose workers run each account's syncs one at a time,
// across pods, snoozing a sync whose account is being synced.
func ExampleRiverSnoozeOnHeld() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[struct{}](db)
	if err != nil {
		log.Fatal(err)
	}
	target := func(job *rivertype.JobRow) string { return syncTarget(job) } // "sync:<account>"
	snoozeOnHeld, err := recipes.RiverSnoozeOnHeld(runner, target, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	config := &river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Middleware: []rivertype.Middleware{snoozeOnHeld},
	}
	_ = config // river.NewClient(riverpgxv5.New(pool), config), with the workers
}

// An asynq server whose handlers run each account's syncs one at a time,
// across servers; a refused task is retried soon, and does not count as
// a failure.
func ExampleAsynqLeaseMiddleware() {
	db, closeDB := openDB()
	defer closeDB()
	runner, err := gormlease.NewRunner[struct{}](db)
	if err != nil {
		log.Fatal(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(recipes.AsynqLeaseMiddleware(runner, func(task *asynq.Task) string {
		return "sync:" + string(task.Payload())
	}))
	config := asynq.Config{
		IsFailure:      recipes.AsynqIsFailure,
		RetryDelayFunc: recipes.AsynqRetryDelay(5*time.Second, nil),
	}
	_ = config // asynq.NewServer(redisOpt, config).Run(mux)
}
