package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
)

// WorkerEnv names the environment variable that holds a worker's
// WorkerConfig, as JSON, in a worker process.
const WorkerEnv = "GORMLEASE_HISTORY_WORKER"

// WorkerConfig is one worker process's settings.
type WorkerConfig struct {
	// Name names the worker and its incarnation; Log is its log file.
	Name string
	Log  string
	// DSN opens the database ("postgres://..." or "host=...",
	// "mysql://..." or, for SQLite, "file:...").
	DSN string
	// Targets are the targets its Runs pick from, at random.
	Targets []string
	// Goroutines is how many Run loops it runs at once.
	Goroutines int
	// Interval, Timeout and OpTimeout are the Runner's heartbeat interval,
	// lease timeout and operation timeout.
	Interval, Timeout, OpTimeout time.Duration
	// WorkMin and WorkMax bound how long each work takes (at random).
	WorkMin, WorkMax time.Duration
	Seed             uint64
	// BreakFence opens the database through a driver that takes the token
	// check out of the fenced commit's statements (see breakFence): the
	// mutation that the checker must catch. PostgreSQL and MySQL only.
	BreakFence bool
}

// RunWorker runs cfg's Run loops until stop is closed, then waits for the
// Runs in flight and returns. Every Run and its steps are logged to
// cfg.Log.
func RunWorker(cfg WorkerConfig, stop <-chan struct{}) error {
	log, err := CreateLog(cfg.Log)
	if err != nil {
		return err
	}
	defer log.Close()
	open := Open
	if cfg.BreakFence {
		open = func(dsn string) (*gorm.DB, error) { return openBroken(dsn, gormConfig()) }
	}
	db, err := open(cfg.DSN)
	if err != nil {
		return err
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	runner, err := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(cfg.Interval), gormlease.WithLeaseTimeout(cfg.Timeout),
		gormlease.WithOperationTimeout(cfg.OpTimeout), gormlease.WithHolder(cfg.Name))
	if err != nil {
		return err
	}
	w := &worker{cfg: cfg, log: log, runner: runner}
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Goroutines)
	for g := range cfg.Goroutines {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
		wg.Go(func() {
			if err := w.loop(rng, stop); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type worker struct {
	cfg    WorkerConfig
	log    *Log
	runner *gormlease.Runner[string]
	runs   atomic.Int64
}

// loop runs Runs on random targets until stop is closed.
func (w *worker) loop(rng *rand.Rand, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := w.run(rng); err != nil {
			return err
		}
		// A pause between Runs, so that the loops interleave.
		select {
		case <-stop:
			return nil
		case <-time.After(10*time.Millisecond + time.Duration(rng.Int64N(int64(40*time.Millisecond)))):
		}
	}
}

// run makes one Run and logs it.
func (w *worker) run(rng *rand.Rand) error {
	id := w.runs.Add(1)
	target := w.cfg.Targets[rng.IntN(len(w.cfg.Targets))]
	ev := func(kind string) Event { return Event{Worker: w.cfg.Name, Run: id, Kind: kind, Target: target} }
	if err := w.log.Write(stamp(ev(KindRun))); err != nil {
		return err
	}
	d := w.cfg.WorkMin + time.Duration(rng.Int64N(int64(w.cfg.WorkMax-w.cfg.WorkMin)+1))
	var logErr error
	note := func(e Event) {
		if err := w.log.Write(stamp(e)); err != nil && logErr == nil {
			logErr = err
		}
	}
	_, err := w.runner.Run(context.Background(), target,
		func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			e := ev(KindWork)
			e.Gen, e.Token = l.Generation, l.Token.String()
			note(e)
			defer note(ev(KindWorkEnd))
			select {
			case <-time.After(d):
				return fmt.Sprintf("%s/%d", w.cfg.Name, id), nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		},
		func(tx *gorm.DB, value string) error {
			l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
			e := ev(KindSave)
			e.Gen, e.Token = l.Generation, l.Token.String()
			note(e)
			return SaveResult(tx, Result{Target: target, Gen: l.Generation, Token: l.Token.String(), Value: value})
		})
	end := ev(KindEnd)
	end.Outcome = Outcome(err)
	if err != nil {
		end.Err = err.Error()
	}
	note(end)
	return logErr
}

func stamp(e Event) Event {
	e.At = Micros(time.Now())
	return e
}

// Outcome classifies Run's error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, gormlease.ErrPaused):
		return OutcomePaused
	case errors.Is(err, gormlease.ErrStopRequested):
		return OutcomeStopped
	case errors.Is(err, gormlease.ErrLeaseHeld):
		return OutcomeHeld
	case errors.Is(err, gormlease.ErrCommitUnknown):
		return OutcomeUnknown
	case errors.Is(err, gormlease.ErrLeaseLost):
		return OutcomeLost
	}
	return OutcomeError
}

// gormConfig is the gorm configuration of every database the history
// opens. No ping: a worker started while a cluster fails over finds no
// server that accepts writes, and its Runs, not its start, are to fail.
func gormConfig() *gorm.Config {
	return &gorm.Config{Logger: logger.Discard, DisableAutomaticPing: true}
}

// Open opens a worker's or the checker's database.
func Open(dsn string) (*gorm.DB, error) {
	cfg := gormConfig()
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "host="):
		// A URL, or keywords and values (a Patroni cluster's multi-host DSN).
		return gorm.Open(postgres.Open(dsn), cfg)
	case strings.HasPrefix(dsn, "mysql://"):
		return gorm.Open(mysql.Open(strings.TrimPrefix(dsn, "mysql://")), cfg)
	case strings.HasPrefix(dsn, "file:"):
		return gorm.Open(gormlite.Open(dsn), cfg)
	}
	return nil, fmt.Errorf("history: DSN %q is not postgres:// (or host=...), mysql:// nor file: (SQLite)", dsn)
}

// WorkerMain runs a worker process from the WorkerConfig in WorkerEnv, until
// its standard input ends, and returns its exit code.
func WorkerMain() int {
	var cfg WorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "history worker:", err)
		return 2
	}
	// The driver's own log of the connections the faults break.
	_ = mysqldriver.SetLogger(stdlog.New(io.Discard, "", 0))
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	if err := RunWorker(cfg, stop); err != nil {
		fmt.Fprintf(os.Stderr, "history worker %s: %v\n", cfg.Name, err)
		return 1
	}
	return 0
}
