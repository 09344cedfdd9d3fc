// Command leasedemo acts out the problem gormlease solves, on a real
// database, and checks the outcome in that database.
//
// Several requests ("tabs"), each in a process of its own, ask at once for
// the same slow report, which takes a call to an external API. They call
// Runner.Do: one wins the lease and works, with heartbeats; the others wait
// for its report, holding no connection. The winner gets its answer and
// then freezes before it can save: its process stalls, so its heartbeats
// stop. A reload comes, and waits too. Once the lease times out, one of the
// waiting tabs takes it over and calls the API again; when it saves, every
// waiting tab gets that report (and so would a reload that came only after
// the save: the tabs' Runners reuse a report saved in the last minute,
// WithReuseFor). The frozen tab wakes up, tries to save its
// now stale result, and is fenced off by the database. The timeline is in
// true time order; a heartbeat shows at the time the database stamped it.
// The last line is a verdict read from the database: one saved result,
// written under the current generation, none by a stale holder; every tab
// that got a report got that one; one API call per generation. A failed
// verdict exits with status 1.
//
// Usage:
//
//	go run ./cmd/leasedemo                      # an SQLite file in a temporary directory
//	go run ./cmd/leasedemo -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./cmd/leasedemo -dsn 'mysql://root@tcp(127.0.0.1:3306)/test'
//	go run ./cmd/leasedemo -tabs 6 -interval 500ms -timeout 2s -latency 3s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	dsnpkg "github.com/gormlease/gormlease/internal/dsn"
)

// config is the demo's settings, from its flags.
type config struct {
	dsn      string
	tabs     int
	interval time.Duration
	timeout  time.Duration
	latency  time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dsn, "dsn", "", "database: empty for an SQLite file in a temporary directory, or "+dsnpkg.Forms)
	flag.IntVar(&cfg.tabs, "tabs", 4, "number of tabs that ask for the report at once")
	flag.DurationVar(&cfg.interval, "interval", time.Second, "heartbeat interval")
	flag.DurationVar(&cfg.timeout, "timeout", 3*time.Second, "lease timeout: a lease without a heartbeat for this long can be taken over")
	flag.DurationVar(&cfg.latency, "latency", 4*time.Second, "how long the simulated external API takes to answer")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "leasedemo:", err)
		os.Exit(1)
	}
}

// check says what is wrong with cfg, or returns nil.
func (c config) check() error {
	switch {
	case c.tabs < 2:
		return fmt.Errorf("-tabs must be at least 2, got %d", c.tabs)
	case c.interval <= 0:
		return fmt.Errorf("-interval must be > 0, got %v", c.interval)
	case c.timeout < 2*c.interval:
		return fmt.Errorf("-timeout %v must be at least twice -interval %v", c.timeout, c.interval)
	case c.latency <= 0:
		return fmt.Errorf("-latency must be > 0, got %v", c.latency)
	}
	return nil
}

// errVerdict is wrapped by the error of a run whose verdict failed.
var errVerdict = errors.New("verdict failed")

// run plays the story on the database that cfg names, writes the timeline
// and the verdict to out, and returns an error wrapping errVerdict when the
// database shows the invariant broken.
func run(ctx context.Context, out io.Writer, cfg config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	d, err := openDatabase(cfg.dsn)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer d.close()
	s, err := newStory(ctx, out, cfg, d)
	if err != nil {
		return err
	}
	return s.play(ctx)
}
