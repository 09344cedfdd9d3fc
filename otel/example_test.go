package gormleaseotel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ncruces/go-sqlite3/gormlite"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	gormleaseotel "github.com/gormlease/gormlease/otel"
)

// A Runner that reports to OpenTelemetry: here to in-memory providers, in
// an application to those its exporters are set up on.
func Example() {
	dir, _ := os.MkdirTemp("", "gormleaseotel")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(gormlite.Open("file:"+filepath.Join(dir, "lease.db")+"?_pragma=busy_timeout(10000)"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		panic(err)
	}

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := gormleaseotel.New(gormleaseotel.WithTracerProvider(tp), gormleaseotel.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	runner, err := gormlease.NewRunner[string](db, gormlease.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	_, err = runner.Run(context.Background(), "report:42",
		func(context.Context) (string, error) { return "report", nil },
		func(*gorm.DB, string) error { return nil })
	fmt.Println("run:", err)
	for _, s := range spans.Ended() {
		fmt.Println(s.Name())
	}
	// Output:
	// run: <nil>
	// INSERT job_lease
	// gormlease.acquire
	// UPDATE job_lease
	// gormlease.commit
	// gormlease.run
}
