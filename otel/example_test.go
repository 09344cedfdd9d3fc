package gormleaseotel_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/ncruces/go-sqlite3/gormlite"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
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

// An Elector's leader metrics, as a Prometheus server scrapes them from the
// OpenTelemetry Prometheus exporter: the process leads its role during the
// term, and no longer once lead has returned, its one term ended by its
// resignation.
func Example_leaderMetrics() {
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

	reg := prometheus.NewRegistry() // in an application, served with promhttp.HandlerFor(reg, ...)
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	obs, err := gormleaseotel.New(gormleaseotel.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	elector, err := gormlease.NewElector(db, "billing-scheduler", gormlease.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	scrape := func() {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for line := range strings.Lines(rec.Body.String()) {
			if strings.HasPrefix(line, "gormlease_leader_") {
				fmt.Print(line)
			}
		}
	}
	err = elector.Lead(context.Background(), func(context.Context) error {
		fmt.Println("during the term:")
		scrape()
		return nil
	})
	fmt.Println("Lead:", err)
	scrape()
	// Output:
	// during the term:
	// gormlease_leader_status{gormlease_role="billing-scheduler"} 1
	// gormlease_leader_terms_begun_total{gormlease_role="billing-scheduler"} 1
	// Lead: <nil>
	// gormlease_leader_status{gormlease_role="billing-scheduler"} 0
	// gormlease_leader_terms_begun_total{gormlease_role="billing-scheduler"} 1
	// gormlease_leader_terms_ended_total{gormlease_role="billing-scheduler",gormlease_term_cause="resigned"} 1
}
