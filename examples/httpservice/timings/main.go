// Command timings measures what a Runner's heartbeat interval and lease
// timeout mean for a service, on PostgreSQL, for a few settings: how soon
// the target of a holder killed with SIGKILL is free again, how soon an
// operator's stop (admin.Operator.RequestStop) reaches the work, and how
// many statements a second one Runner sends, and how much of a core it
// uses, to keep N leases. docs/guide.md, section "Choosing the timings",
// has its figures and the defaults chosen from them.
//
//	cd examples/httpservice
//	go run ./timings -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It works in the tables timings_lease and timings_result, which it
// creates. The kills and stops of every setting run at once (each kill a
// child process of its own, this program run with -hold), then the
// statement counts one setting and one N at a time; with the default
// settings it takes about nine minutes (-phases kills: two and a half,
// -phases statements: six and a half).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// tables are the tables the measurements work in.
var tables = gormlease.WithTableNames("timings_lease", "timings_result")

// setting is one heartbeat interval and lease timeout.
type setting struct{ interval, timeout time.Duration }

func (s setting) String() string { return fmt.Sprintf("%v / %v", s.interval, s.timeout) }

func (s setting) options() []gormlease.Option {
	return []gormlease.Option{tables, gormlease.WithHeartbeatInterval(s.interval), gormlease.WithLeaseTimeout(s.timeout)}
}

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "a PostgreSQL DSN")
	list := flag.String("settings", "30s/2m,10s/40s,5s/30s,5s/20s,2s/10s", "interval/timeout pairs, comma-separated")
	counts := flag.String("leases", "1000,10000", "how many leases one Runner holds, comma-separated")
	samples := flag.Int("samples", 5, "kills and stops per setting")
	phases := flag.String("phases", "kills,statements", "what to measure: kills (and stops), statements, or both")
	hold := flag.String("hold", "", "(internal) hold this target until killed, under -interval and -timeout")
	interval := flag.Duration("interval", 0, "(internal) the heartbeat interval of -hold")
	timeout := flag.Duration("timeout", 0, "(internal) the lease timeout of -hold")
	flag.Parse()
	db, err := gorm.Open(postgres.Open(*dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if *hold != "" {
		log.Fatal(holdUntilKilled(db, *hold, setting{*interval, *timeout}))
	}
	if err := gormlease.AutoMigrate(context.Background(), db, tables); err != nil {
		log.Fatal(err)
	}
	settings, err := parseSettings(*list)
	if err != nil {
		log.Fatal(err)
	}
	var ns []int
	for _, f := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			log.Fatalf("-leases: %q is not a count", f)
		}
		ns = append(ns, n)
	}
	if err := measure(db, *dsn, settings, ns, *samples, *phases); err != nil {
		log.Fatal(err)
	}
}

// parseSettings reads "30s/2m,5s/30s".
func parseSettings(list string) ([]setting, error) {
	var settings []setting
	for _, pair := range strings.Split(list, ",") {
		i, t, ok := strings.Cut(pair, "/")
		if !ok {
			return nil, fmt.Errorf("-settings: %q is not interval/timeout", pair)
		}
		var s setting
		var err1, err2 error
		s.interval, err1 = time.ParseDuration(i)
		s.timeout, err2 = time.ParseDuration(t)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("-settings: %q: %w", pair, err)
		}
		settings = append(settings, s)
	}
	return settings, nil
}

// holdUntilKilled holds target under s, says "held" on stdout, and waits
// to be killed.
func holdUntilKilled(db *gorm.DB, target string, s setting) error {
	runner, err := gormlease.NewRunner[int](db, s.options()...)
	if err != nil {
		return err
	}
	_, err = runner.Run(context.Background(), target, func(ctx context.Context) (int, error) {
		fmt.Println("held")
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}, func(*gorm.DB, int) error { return nil })
	return err
}

// measure runs the kills and stops of every setting at once, then the
// statement counts, as phases says, and prints the figures as Markdown
// tables.
func measure(db *gorm.DB, dsn string, settings []setting, ns []int, samples int, phases string) error {
	if strings.Contains(phases, "kills") {
		if err := killsAndStops(db, dsn, settings, samples); err != nil {
			return err
		}
	}
	if !strings.Contains(phases, "statements") {
		return nil
	}
	fmt.Printf("\n| interval / timeout | leases | statements/s | client CPU, %% of a core |\n|---|---|---|---|\n")
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	for _, s := range settings {
		for _, n := range ns {
			c, err := statements(dsn, fmt.Sprintf("timings:%s:n:%v:%d:", run, s.interval, n), s, n)
			if err != nil {
				return fmt.Errorf("%d leases under %v: %w", n, s, err)
			}
			fmt.Printf("| %v | %d | %.2f | %.1f |\n", s, n, c.all, c.cpu)
		}
	}
	return nil
}

// killsAndStops runs the kills and stops of every setting at once, and
// prints their figures.
func killsAndStops(db *gorm.DB, dsn string, settings []setting, samples int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	freed := make([][]time.Duration, len(settings))
	stopped := make([][]time.Duration, len(settings))
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(settings)*samples)
	var mu sync.Mutex
	for i, s := range settings {
		for k := range samples {
			wg.Go(func() {
				d, err := crash(db, self, dsn, fmt.Sprintf("timings:%s:crash:%d:%d", run, i, k), s)
				if err != nil {
					errs <- fmt.Errorf("kill under %v: %w", s, err)
					return
				}
				mu.Lock()
				freed[i] = append(freed[i], d)
				mu.Unlock()
			})
			wg.Go(func() {
				d, err := stop(db, fmt.Sprintf("timings:%s:stop:%d:%d", run, i, k), s)
				if err != nil {
					errs <- fmt.Errorf("stop under %v: %w", s, err)
					return
				}
				mu.Lock()
				stopped[i] = append(stopped[i], d)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	close(errs)
	if err, ok := <-errs; ok {
		return err
	}
	fmt.Printf("| interval / timeout | target free after a SIGKILL (min, median, max of %d) | stop reached the work after (min, median, max of %d) |\n|---|---|---|\n", samples, samples)
	for i, s := range settings {
		fmt.Printf("| %v | %s | %s |\n", s, spread(freed[i]), spread(stopped[i]))
	}
	return nil
}

// spread formats the min, median and max of ds.
func spread(ds []time.Duration) string {
	slices.Sort(ds)
	r := func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
	return fmt.Sprintf("%s, %s, %s", r(ds[0]), r(ds[len(ds)/2]), r(ds[len(ds)-1]))
}

// crash starts a child process that holds target under s, kills it with
// SIGKILL at a random point of its heartbeat interval, and returns how
// long after the kill a Run took the target (tried every 50 ms).
func crash(db *gorm.DB, self, dsn, target string, s setting) (time.Duration, error) {
	cmd := exec.Command(self, "-dsn", dsn, "-hold", target, "-interval", s.interval.String(), "-timeout", s.timeout.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		cmd.Process.Kill()
		cmd.Wait()
		return 0, fmt.Errorf("the holder said %q: %v", line, err)
	}
	time.Sleep(rand.N(s.interval))
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	cmd.Wait()
	runner, err := gormlease.NewRunner[int](db, s.options()...)
	if err != nil {
		return 0, err
	}
	for {
		_, err := runner.Run(context.Background(), target,
			func(context.Context) (int, error) { return 0, nil }, func(*gorm.DB, int) error { return nil })
		switch {
		case err == nil:
			return time.Since(killed), nil
		case !errors.Is(err, gormlease.ErrLeaseHeld):
			return 0, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop holds target under s, asks its holder to stop at a random point of
// its heartbeat interval, and returns how long after the request the
// work's context ended.
func stop(db *gorm.DB, target string, s setting) (time.Duration, error) {
	runner, err := gormlease.NewRunner[int](db, s.options()...)
	if err != nil {
		return 0, err
	}
	started := make(chan struct{})
	var ended time.Time
	done := make(chan error, 1)
	go func() {
		_, err := runner.Run(context.Background(), target, func(ctx context.Context) (int, error) {
			close(started)
			<-ctx.Done()
			ended = time.Now()
			return 0, context.Cause(ctx)
		}, func(*gorm.DB, int) error { return nil })
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		return 0, err
	}
	time.Sleep(rand.N(s.interval))
	asked := time.Now()
	if err := admin.New(runner.Repository()).RequestStop(context.Background(), target, "timings"); err != nil {
		return 0, err
	}
	if err := <-done; !errors.Is(err, gormlease.ErrStopRequested) {
		return 0, fmt.Errorf("run returned %v, not ErrStopRequested", err)
	}
	return ended.Sub(asked), nil
}

// counted is what statements measured.
type counted struct{ all, cpu float64 }

// statements holds n leases with one Runner under s, and counts, over two
// heartbeat intervals (at least 20 s) after one interval of settling, the
// statements that the Runner's pool sent a second (all of them
// heartbeats: nothing else runs then), and the process's CPU time as a
// share of one core.
func statements(dsn, prefix string, s setting, n int) (counted, error) {
	count := &countingLogger{}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: count})
	if err != nil {
		return counted{}, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return counted{}, err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(8)
	runner, err := gormlease.NewRunner[int](db, s.options()...)
	if err != nil {
		return counted{}, err
	}
	release := make(chan struct{})
	held := make(chan struct{}, n)
	failed := make(chan error, n)
	acquiring := make(chan struct{}, 8) // acquires in flight at once
	var wg sync.WaitGroup
	for i := range n {
		acquiring <- struct{}{}
		wg.Go(func() {
			_, err := runner.Run(context.Background(), prefix+strconv.Itoa(i), func(ctx context.Context) (int, error) {
				<-acquiring
				held <- struct{}{}
				select {
				case <-release:
					return 0, nil
				case <-ctx.Done():
					return 0, context.Cause(ctx)
				}
			}, func(*gorm.DB, int) error { return nil })
			if err != nil {
				failed <- err
			}
		})
	}
	defer func() { close(release); wg.Wait() }()
	for range n {
		select {
		case <-held:
		case err := <-failed:
			return counted{}, err
		}
	}
	time.Sleep(s.interval)
	window := max(2*s.interval, 20*time.Second)
	all0, cpu0, start := count.statements.Load(), cpuTime(), time.Now()
	time.Sleep(window)
	all1, cpu1, took := count.statements.Load(), cpuTime(), time.Since(start)
	select {
	case err := <-failed:
		return counted{}, err
	default:
	}
	return counted{
		all: float64(all1-all0) / took.Seconds(),
		cpu: 100 * (cpu1 - cpu0).Seconds() / took.Seconds(),
	}, nil
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingLogger is a gorm logger that counts the statements it is told
// of, which are all of gormlease's own (a logger without a LogLevel field
// is told of each).
type countingLogger struct{ statements atomic.Int64 }

func (c *countingLogger) LogMode(logger.LogLevel) logger.Interface { return c }
func (c *countingLogger) Info(context.Context, string, ...any)     {}
func (c *countingLogger) Warn(context.Context, string, ...any)     {}
func (c *countingLogger) Error(context.Context, string, ...any)    {}

func (c *countingLogger) Trace(context.Context, time.Time, func() (string, int64), error) {
	c.statements.Add(1)
}
