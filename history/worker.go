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
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	// Targets are the targets its calls pick from, at random.
	Targets []string
	// Goroutines is how many Run loops it runs at once; Doers and
	// RunWaiters how many Do loops and RunWait loops, each with a Runner
	// of its own, so that no two of its calls share a job (calls of Do on
	// one Runner in one process do).
	Goroutines, Doers, RunWaiters int
	// Interval, Timeout and OpTimeout are the Runners' heartbeat interval,
	// lease timeout and operation timeout.
	Interval, Timeout, OpTimeout time.Duration
	// WorkMin and WorkMax bound how long each work of Run and RunWait
	// takes (at random); DoWorkMin and DoWorkMax each work of Do.
	WorkMin, WorkMax     time.Duration
	DoWorkMin, DoWorkMax time.Duration
	// DoTimeout, when not 0, is about how long each call of Do may take:
	// its context's timeout is from half of it to one and a half, at
	// random.
	DoTimeout time.Duration
	// CallPause is the longest pause of a loop between two calls (50 ms
	// when 0); the shortest is 10 ms.
	CallPause time.Duration
	Seed      uint64
	// BreakFence opens the database through a driver that takes the token
	// check out of the fenced commit's statements (see breakFence): the
	// mutation that the checker must catch. PostgreSQL and MySQL only.
	BreakFence bool
	// RefuseFile and RefuseAddr refuse the worker's new connections while
	// the file RefuseFile exists: its dialer then connects to RefuseAddr
	// instead of the server, a socket that is bound and does not listen,
	// and the kernel refuses the connection (ECONNREFUSED), as it does for
	// a server or a pooler that is down. PostgreSQL and MySQL only.
	RefuseFile, RefuseAddr string
}

// RunWorker runs cfg's loops until stop is closed, then waits for the
// calls in flight and returns. Every call and its steps are logged to
// cfg.Log.
func RunWorker(cfg WorkerConfig, stop <-chan struct{}) error {
	log, err := CreateLog(cfg.Log)
	if err != nil {
		return err
	}
	defer log.Close()
	// A worker starts as an application would, in the middle of the
	// faults: opening the pool (gorm.Open pings the server) and making its
	// Runners (NewRunner reads the server's settings) are tried again
	// while they fail (see starting).
	var db *gorm.DB
	err = starting(stop, func() (err error) {
		switch {
		case cfg.BreakFence:
			db, err = openBroken(cfg.DSN, gormConfig())
		case cfg.RefuseFile != "":
			db, err = openRefusing(cfg.DSN, refusingDialer(cfg.RefuseFile, cfg.RefuseAddr))
		default:
			db, err = Open(cfg.DSN)
		}
		return err
	})
	if err != nil {
		if errors.Is(err, errStopped) {
			return nil // no call made: the scenario is over
		}
		return err
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	newRunner := func(role string) (r *gormlease.Runner[string], err error) {
		err = starting(stop, func() (err error) {
			r, err = gormlease.NewRunner[string](db,
				gormlease.WithHeartbeatInterval(cfg.Interval), gormlease.WithLeaseTimeout(cfg.Timeout),
				gormlease.WithOperationTimeout(cfg.OpTimeout), gormlease.WithHolder(cfg.Name+role))
			return err
		})
		return r, err
	}
	// A worker whose Runners could not be made before stop was closed (its
	// connections refused all along) ends having made no call, without an
	// error: the scenario is over.
	runner, err := newRunner("")
	if err != nil {
		if errors.Is(err, errStopped) {
			return nil
		}
		return err
	}
	// The calls of Do and RunWait end when stop is closed, as their waits
	// might not.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	w := &worker{cfg: cfg, log: log}
	var wg sync.WaitGroup
	loops := cfg.Goroutines + cfg.Doers + cfg.RunWaiters
	errs := make(chan error, loops)
	for g := range loops {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
		call := func(rng *rand.Rand) error {
			logErr, _ := w.run(runner, cfg.Name, rng, w.pick(rng))
			return logErr
		}
		if g >= cfg.Goroutines {
			role := fmt.Sprintf("/do%d", g)
			if g >= cfg.Goroutines+cfg.Doers {
				role = fmt.Sprintf("/runwait%d", g)
			}
			r, err := newRunner(role)
			if err != nil {
				if errors.Is(err, errStopped) {
					break // the loops started end at stop: waited for below
				}
				return err
			}
			holder := cfg.Name + role
			call = func(rng *rand.Rand) error { return w.do(ctx, r, holder, rng) }
			if g >= cfg.Goroutines+cfg.Doers {
				call = func(rng *rand.Rand) error { return w.runWait(ctx, r, holder, rng) }
			}
		}
		wg.Go(func() {
			if err := w.loop(rng, stop, call); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// errStopped is starting's error when stop was closed before its start
// worked.
var errStopped = errors.New("history: stopped while starting")

// starting calls start until it returns nil, every 100 ms: for as long as
// its error is a refused connection (a refusal fault lasts as long as it
// lasts), for up to 30 s on any other error but an invalid argument (a
// connection killed as it was made, a node that is down), and until stop
// is closed, when it returns errStopped.
func starting(stop <-chan struct{}, start func() error) error {
	for end := time.Now().Add(30 * time.Second); ; {
		err := start()
		refused := errors.Is(err, syscall.ECONNREFUSED)
		if err == nil || errors.Is(err, gormlease.ErrInvalidArgument) || !refused && time.Now().After(end) {
			return err
		}
		select {
		case <-stop:
			return errStopped
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type worker struct {
	cfg  WorkerConfig
	log  *Log
	runs atomic.Int64
}

// loop makes calls until stop is closed.
func (w *worker) loop(rng *rand.Rand, stop <-chan struct{}, call func(rng *rand.Rand) error) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := call(rng); err != nil {
			return err
		}
		// A pause between calls, so that the loops interleave.
		select {
		case <-stop:
			return nil
		case <-time.After(workTime(rng, 10*time.Millisecond, max(w.cfg.CallPause, 50*time.Millisecond))):
		}
	}
}

func (w *worker) pick(rng *rand.Rand) string { return w.cfg.Targets[rng.IntN(len(w.cfg.Targets))] }

// call is one logged call of Run, RunWait or Do, by a Runner whose holder
// name is holder.
type call struct {
	w      *worker
	id     int64
	target string
	holder string
	tries  int
	logErr error
}

// begin logs the call of kind on target by holder's Runner, and returns it.
func (w *worker) begin(kind, target, holder string) (*call, error) {
	c := &call{w: w, id: w.runs.Add(1), target: target, holder: holder}
	return c, w.log.Write(stamp(c.ev(kind)))
}

func (c *call) ev(kind string) Event {
	return Event{Worker: c.w.cfg.Name, Run: c.id, Kind: kind, Target: c.target}
}

// note logs e, keeping the first error.
func (c *call) note(e Event) {
	if err := c.w.log.Write(stamp(e)); err != nil && c.logErr == nil {
		c.logErr = err
	}
}

// work is the call's work: it logs its start and end, and takes d, unless
// fail, when not nil, returns an error, which it then returns at once. Its
// end logs the error it returns, if any, and whether it failed of its own
// accord or its context ended.
func (c *call) work(d time.Duration, fail func() error) func(ctx context.Context) (string, error) {
	return func(ctx context.Context) (_ string, err error) {
		l, _ := gormlease.LeaseFromContext(ctx)
		c.tries++
		e := c.ev(KindWork)
		e.Gen, e.Token, e.Holder, e.Try = l.Generation, l.Token.String(), c.holder, c.tries
		c.note(e)
		outcome := WorkFailed
		defer func() {
			end := c.ev(KindWorkEnd)
			if err != nil {
				end.Outcome, end.Err = outcome, err.Error()
			}
			c.note(end)
		}()
		if fail != nil {
			if err := fail(); err != nil {
				return "", err
			}
		}
		select {
		case <-time.After(d):
			return fmt.Sprintf("%s/%d", c.w.cfg.Name, c.id), nil
		case <-ctx.Done():
			outcome = WorkInterrupted
			return "", context.Cause(ctx)
		}
	}
}

// save is the call's saver: it logs its start and saves the result row.
func (c *call) save(tx *gorm.DB, value string) error {
	l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
	e := c.ev(KindSave)
	e.Gen, e.Token = l.Generation, l.Token.String()
	c.note(e)
	return SaveResult(tx, Result{Target: c.target, Gen: l.Generation, Token: l.Token.String(), Value: value})
}

// end logs the call's end, with its outcome, and returns the first error
// of its log.
func (c *call) end(e Event, err error) error {
	e.Kind = KindEnd
	if e.Outcome == "" {
		e.Outcome = Outcome(err)
	}
	if err != nil {
		e.Err = err.Error()
	}
	c.note(e)
	return c.logErr
}

// workTime is how long a work takes, at random between lo and hi.
func workTime(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// run makes one Run on target and logs it. It returns the error of its
// log, and Run's.
func (w *worker) run(runner *gormlease.Runner[string], holder string, rng *rand.Rand, target string) (logErr, runErr error) {
	c, err := w.begin(KindRun, target, holder)
	if err != nil {
		return err, nil
	}
	_, runErr = runner.Run(context.Background(), target, c.work(workTime(rng, w.cfg.WorkMin, w.cfg.WorkMax), nil), c.save)
	return c.end(c.ev(KindEnd), runErr), runErr
}

// runWait makes one RunWait and logs it. The first work of one call in
// four calls Run on its own target, which its own lease holds, and
// returns that Run's refusal (ErrLeaseHeld) wrapped, as a work that calls
// Run on a held target does: an error of the work, which must end the
// call rather than make it wait and run the work again.
func (w *worker) runWait(ctx context.Context, runner *gormlease.Runner[string], holder string, rng *rand.Rand) error {
	target := w.pick(rng)
	c, err := w.begin(KindRunWait, target, holder)
	if err != nil {
		return err
	}
	var fail func() error
	if rng.IntN(4) == 0 {
		fail = func() error {
			if c.tries > 1 {
				return nil
			}
			// Logged as a Run of its own, which the checker judges as any.
			logErr, err := w.run(runner, holder, rng, target)
			if logErr != nil {
				return logErr
			}
			if err == nil {
				err = errors.New("the nested Run saved: the call's own lease was gone")
			}
			return fmt.Errorf("history: a nested Run: %w", err)
		}
	}
	_, err = runner.RunWait(ctx, target, c.work(workTime(rng, w.cfg.WorkMin, w.cfg.WorkMax), fail), c.save)
	return c.end(c.ev(KindEnd), err)
}

// do makes one Do and logs it. One work in eight fails, so that the
// callers that waited for it get a SharedJobError.
func (w *worker) do(ctx context.Context, runner *gormlease.Runner[string], holder string, rng *rand.Rand) error {
	target := w.pick(rng)
	c, err := w.begin(KindDo, target, holder)
	if err != nil {
		return err
	}
	var fail func() error
	if rng.IntN(8) == 0 {
		fail = func() error { return errors.New("history: the work failed, on purpose") }
	}
	var loaded int64
	load := func(tx *gorm.DB) (string, error) {
		v, gen, err := LoadResult(tx, target)
		loaded = gen
		return v, err
	}
	if w.cfg.DoTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, workTime(rng, w.cfg.DoTimeout/2, w.cfg.DoTimeout*3/2))
		defer cancel()
	}
	_, shared, err := runner.Do(ctx, target, c.work(workTime(rng, w.cfg.DoWorkMin, w.cfg.DoWorkMax), fail), c.save, load)
	end := c.ev(KindEnd)
	end.Shared, end.Loaded = shared, loaded
	var failed *gormlease.SharedJobError
	switch {
	case err == nil && shared:
		end.Outcome = OutcomeShared
	case errors.As(err, &failed):
		end.Outcome, end.Failed = OutcomeSharedFailed, failed.Generation
	}
	return c.end(end, err)
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
	// A worker that a pause fault stopped gets SIGHUP (then SIGCONT) from
	// the kernel when a process of its process group exits (another
	// worker's crash) and leaves the group orphaned, as it is under a
	// runner without job control: it is to go on, as a paused application
	// would, not die of it.
	signal.Ignore(syscall.SIGHUP)
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
