// Command rolebench measures gormlease's roles and semaphores on
// PostgreSQL, in one run of about a minute:
//
//   - failover: three processes campaign for one role with an Elector; the
//     leader's process is killed (SIGKILL) at a random moment of its term,
//     -kills times, and each time the time from the kill to the next
//     leader's lead being called is measured, against the lease timeout
//     plus one heartbeat interval;
//
//   - resign: two Electors on pools of their own (so that nothing in the
//     process wakes the standby: a notification must), one leading and one
//     waiting; the leader's lead returns, -resigns times, and the time from
//     that return to the standby's lead being called is measured;
//
//   - slots: 8 workers acquire and release, as fast as they can, single
//     leases on targets of their own, slots of one semaphore of 8 slots,
//     and slots of semaphores of their own, in turns of short slices.
//
//     cd bench && go run ./rolebench [-dsn postgres://...] [-kills 20] [-resigns 200] [-out ../docs/performance.md]
//
// With -out it writes its results as the roles section of that file,
// between the markers <!-- roles:begin --> and <!-- roles:end -->; the
// bench command, which rewrites the rest of docs/performance.md, carries
// that section over. It works in a schema of its own, rolebench, dropped
// at the start.
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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/bench/internal/opsection"
)

// settings are the command's flags.
type settings struct {
	dsn               string
	kills, resigns    int
	timeout, interval time.Duration
	slotRounds        int
	slice             time.Duration
	out               string
	child             string // the role, in a child process of the failover
}

const role = "scheduler"

func main() {
	var s settings
	flag.StringVar(&s.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	flag.IntVar(&s.kills, "kills", 20, "leaders killed in the failover measure")
	flag.IntVar(&s.resigns, "resigns", 200, "resignations in the resign measure")
	flag.DurationVar(&s.timeout, "timeout", time.Second, "lease timeout of the Electors")
	flag.DurationVar(&s.interval, "interval", 200*time.Millisecond, "heartbeat interval of the Electors")
	flag.IntVar(&s.slotRounds, "slot-rounds", 5, "rounds of the slots measure, each a slice of every variant")
	flag.DurationVar(&s.slice, "slice", time.Second, "duration of each slice of the slots measure")
	flag.StringVar(&s.out, "out", "", "write the results as the roles section of this Markdown `file` (docs/performance.md)")
	flag.StringVar(&s.child, "child", "", "run as a campaigning child process of the failover measure (internal)")
	flag.Parse()
	var err error
	if s.child != "" {
		err = child(s)
	} else {
		err = measureAndWrite(s)
	}
	if err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// roles marks the section of docs/performance.md that rolebench writes.
var roles = opsection.Roles

func measureAndWrite(s settings) error {
	if s.out != "" {
		if _, err := roles.PutIn(s.out, ""); err != nil { // the markers, before the run
			return err
		}
	}
	r, err := run(s)
	if err != nil {
		return err
	}
	fmt.Print(r.section())
	if s.out == "" {
		return nil
	}
	doc, err := roles.PutIn(s.out, r.section())
	if err != nil {
		return err
	}
	return opsection.Write(s.out, doc)
}

// results are what a run measured.
type results struct {
	s       settings
	version string
	started time.Time
	took    time.Duration

	failovers []time.Duration
	resigns   []time.Duration
	// slots are the cycles per second of each variant, per round.
	slots map[string][]float64
}

// open opens a pool on the benchmark's schema.
func open(dsn string) (*gorm.DB, error) {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return gorm.Open(postgres.Open(dsn+sep+"search_path=rolebench"), &gorm.Config{Logger: logger.Discard})
}

func run(s settings) (results, error) {
	ctx := context.Background()
	r := results{s: s, started: time.Now(), slots: map[string][]float64{}}
	admin, err := gorm.Open(postgres.Open(s.dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return r, err
	}
	if err := admin.Exec("DROP SCHEMA IF EXISTS rolebench CASCADE; CREATE SCHEMA rolebench").Error; err != nil {
		return r, err
	}
	defer admin.Exec("DROP SCHEMA IF EXISTS rolebench CASCADE")
	if err := admin.Raw("SELECT current_setting('server_version')").Scan(&r.version).Error; err != nil {
		return r, err
	}
	db, err := open(s.dsn)
	if err != nil {
		return r, err
	}
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return r, err
	}
	for _, m := range []struct {
		name string
		run  func() error
	}{
		{"failover", func() (err error) { r.failovers, err = failover(s); return err }},
		{"resign", func() (err error) { r.resigns, err = resign(s); return err }},
		{"slots", func() (err error) { r.slots, err = slots(s, db); return err }},
	} {
		begun := time.Now()
		if err := m.run(); err != nil {
			return r, fmt.Errorf("%s: %w", m.name, err)
		}
		fmt.Printf("%s took %v\n", m.name, time.Since(begun).Round(time.Second))
	}
	r.took = time.Since(r.started)
	return r, nil
}

// electorOptions are the options of every Elector of the run.
func electorOptions(s settings, holder string) []gormlease.Option {
	return []gormlease.Option{gormlease.WithHeartbeatInterval(s.interval), gormlease.WithLeaseTimeout(s.timeout),
		gormlease.WithHolder(holder)}
}

// child campaigns for the role until its input ends, printing
// "leading UNIXNANO" each time its lead is called.
func child(s settings) error {
	db, err := open(s.dsn)
	if err != nil {
		return err
	}
	e, err := gormlease.NewElector(db, s.child, electorOptions(s, fmt.Sprintf("child-%d", os.Getpid()))...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF: the parent is done
		cancel()
	}()
	fmt.Println("ready")
	for ctx.Err() == nil {
		err := e.Lead(ctx, func(ctx context.Context) error {
			fmt.Printf("leading %d\n", time.Now().UnixNano())
			<-ctx.Done()
			return nil
		})
		if err != nil && ctx.Err() == nil {
			time.Sleep(s.interval) // a failed campaign: try again
		}
	}
	return nil
}

// led is a child's "leading" line.
type led struct {
	c  *childProc
	at time.Time
}

// childProc is a campaigning child process.
type childProc struct {
	cmd  *exec.Cmd
	stop func() // closes its input
}

// startChild starts a campaigning child, which reports its terms to leds,
// and waits until it is ready.
func startChild(s settings, leds chan<- led) (*childProc, error) {
	cmd := exec.Command(os.Args[0], "-child", role, "-dsn", s.dsn,
		"-timeout", s.timeout.String(), "-interval", s.interval.String())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &childProc{cmd: cmd, stop: func() { in.Close() }}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				close(ready)
				continue
			}
			if ns, ok := strings.CutPrefix(line, "leading "); ok {
				if n, err := strconv.ParseInt(ns, 10, 64); err == nil {
					leds <- led{c, time.Unix(0, n)}
				}
			}
		}
	}()
	select {
	case <-ready:
		return c, nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, errors.New("a child did not start")
	}
}

// failover kills the leading child s.kills times, each at a random moment
// of its term, and returns the time from each kill to the next leader's
// lead being called. Three children campaign at every moment.
func failover(s settings) (took []time.Duration, err error) {
	leds := make(chan led, 16)
	var children []*childProc
	defer func() {
		for _, c := range children {
			c.stop()
			c.cmd.Wait()
		}
	}()
	for range 3 {
		c, err := startChild(s, leds)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
	next := func() (led, error) {
		select {
		case l := <-leds:
			return l, nil
		case <-time.After(10 * s.timeout):
			return led{}, errors.New("no child led within ten lease timeouts")
		}
	}
	leader, err := next()
	if err != nil {
		return nil, err
	}
	for range s.kills {
		// The leader dies at a random moment of its term: up to two
		// intervals after it began, a heartbeat or two later.
		time.Sleep(rand.N(2 * s.interval))
		leader.c.cmd.Process.Kill() // SIGKILL
		killed := time.Now()
		leader.c.cmd.Wait()
		children = slices.DeleteFunc(children, func(c *childProc) bool { return c == leader.c })
		l, err := next()
		if err != nil {
			return nil, err
		}
		took = append(took, l.at.Sub(killed))
		leader = l
		c, err := startChild(s, leds)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
	return took, nil
}

// resign measures resignations between two Electors on pools of their
// own: the time from the leader's lead returning to the standby's lead
// being called, the standby having waited (its row marked as waited on, so
// that the release notifies). An Elector that resigned campaigns again
// only once the other leads, so that it never takes its own role back.
func resign(s settings) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu       sync.Mutex
		returned time.Time
		took     []time.Duration
	)
	begun := make(chan int, 2)
	resignNow := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	again := [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := range 2 {
		db, err := open(s.dsn)
		if err != nil {
			return nil, err
		}
		e, err := gormlease.NewElector(db, "resign", electorOptions(s, fmt.Sprintf("elector-%d", i))...)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				err := e.Lead(ctx, func(ctx context.Context) error {
					now := time.Now()
					mu.Lock()
					if !returned.IsZero() {
						took = append(took, now.Sub(returned))
					}
					mu.Unlock()
					begun <- i
					select {
					case <-resignNow[i]:
						mu.Lock()
						returned = time.Now()
						mu.Unlock()
					case <-ctx.Done():
					}
					return nil
				})
				if err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
				select {
				case <-again[i]:
				case <-ctx.Done():
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	watch, err := open(s.dsn)
	if err != nil {
		return nil, err
	}
	leader := -1
	for i := 0; i <= s.resigns; i++ {
		select {
		case l := <-begun:
			if l == leader {
				return nil, errors.New("the Elector that resigned led again")
			}
			if leader >= 0 {
				again[leader] <- struct{}{}
			}
			leader = l
		case err := <-errs:
			return nil, err
		case <-time.After(10 * s.timeout):
			return nil, errors.New("no Elector led within ten lease timeouts")
		}
		// Wait until the other waits, on the row marked.
		deadline := time.Now().Add(10 * s.timeout)
		for {
			var row struct{ Waiting bool }
			if err := watch.Raw("SELECT waiting FROM job_lease WHERE target_id = 'resign'").Scan(&row).Error; err != nil {
				return nil, err
			}
			if row.Waiting {
				break
			}
			if time.Now().After(deadline) {
				return nil, errors.New("the standby never marked the row as waited on")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i == s.resigns {
			break
		}
		resignNow[leader] <- struct{}{}
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(took), nil
}

// slots measures acquire+release cycles on 8 workers: single leases on
// targets of their own, slots of one semaphore of 8, and slots of
// semaphores of 3 of their own; in rounds, each a slice of every variant,
// in turns.
func slots(s settings, db *gorm.DB) (map[string][]float64, error) {
	const workers = 8
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(workers)
	sqlDB.SetMaxIdleConns(workers)
	ctx := context.Background()
	variants := []struct {
		name    string
		acquire func(w int) (gormlease.Lease, error)
	}{
		{"single lease, a target per worker", func(w int) (gormlease.Lease, error) {
			return repo.Acquire(ctx, fmt.Sprintf("lease-%d", w), time.Minute)
		}},
		{"slot of one semaphore of 8 slots", func(int) (gormlease.Lease, error) {
			return repo.AcquireSlot(ctx, "semaphore-8", workers, time.Minute)
		}},
		{"slot of a semaphore of 3 slots per worker", func(w int) (gormlease.Lease, error) {
			return repo.AcquireSlot(ctx, fmt.Sprintf("semaphore-%d", w), 3, time.Minute)
		}},
	}
	out := map[string][]float64{}
	for round := -1; round < s.slotRounds; round++ { // round -1 warms up
		for _, v := range variants {
			var cycles atomic.Int64
			var failed atomic.Value
			stop := time.Now().Add(s.slice)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for time.Now().Before(stop) {
						l, err := v.acquire(w)
						if err == nil {
							err = repo.Release(ctx, l)
						}
						if err != nil {
							failed.Store(err)
							return
						}
						cycles.Add(1)
					}
				})
			}
			wg.Wait()
			if err, _ := failed.Load().(error); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			if round >= 0 {
				out[v.name] = append(out[v.name], float64(cycles.Load())/s.slice.Seconds())
			}
		}
	}
	return out, nil
}

// quantile returns the q-quantile of ds, by rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// section returns the results as the roles section of docs/performance.md.
func (r results) section() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	s := r.s
	bound := s.timeout + s.interval
	p("## Roles and semaphores: failover, resignation, slots\n\n")
	p("Generated by `cd bench && go run ./rolebench -out ../docs/performance.md` (%s, %d CPUs, PostgreSQL %s, fsync on; run took %s).\n\n",
		r.started.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), r.version, r.took.Round(time.Second))
	p("| measure | bound | p50 | p99 / max | within the bound |\n|---|---|---|---|---|\n")
	worst := slices.Max(r.failovers)
	p("| failover: leader's process killed → next leader's lead called (%d kills; timeout %v, interval %v) | %v | %s | max %s | %d of %d |\n",
		len(r.failovers), s.timeout, s.interval, bound, ms(quantile(r.failovers, 0.5)), ms(worst), countWithin(r.failovers, bound), len(r.failovers))
	p("| resign: leader's lead returns → standby's lead called, by notification (%d resignations) | 50 ms | %s | p99 %s | %d of %d |\n\n",
		len(r.resigns), ms(quantile(r.resigns, 0.5)), ms(quantile(r.resigns, 0.99)), countWithin(r.resigns, 50*time.Millisecond), len(r.resigns))
	base := median(r.slots["single lease, a target per worker"])
	p("| acquire + release, 8 workers | cycles/s (median of %d slices of %v) | vs single leases |\n|---|---|---|\n", s.slotRounds, s.slice)
	for _, name := range []string{"single lease, a target per worker", "slot of a semaphore of 3 slots per worker", "slot of one semaphore of 8 slots"} {
		m := median(r.slots[name])
		p("| %s | %.0f | %.2f× |\n", name, m, m/base)
	}
	p("\n**How it is measured.** Failover: three child processes of the command campaign for one role with `NewElector` (timeout %v, interval %v, one pool each); "+
		"each time one prints that its lead was called, the parent waits a random 0 to %v (the leader dies somewhere in its term, after a heartbeat or two) and kills it with SIGKILL, "+
		"then reads the time at which the next child's lead was called (the child's clock; all run on one machine) and starts a new child, so that three always campaign. "+
		"The bound is the issue's: the lease timeout plus one interval. "+
		"Resign: two Electors in the command's process, each on a pool of its own, so that only a notification (or a poll) wakes the standby; once the standby has marked the row as waited on, the leader's lead returns, "+
		"and the time from that return to the standby's lead being called is one sample; the Electors alternate. "+
		"Slots: `Repository.Acquire` + `Release` against `Repository.AcquireSlot` + `Release`, 8 goroutines on a pool of 8 connections, each variant in turn for a slice of %v, %d rounds after one round of warm-up; the ratio is of medians. "+
		"A slot's acquire reads up to n keys and picks one at random, locking it with `FOR UPDATE SKIP LOCKED`; the 8 workers on one semaphore of 8 always find a slot free, but contend for the rows.\n",
		s.timeout, s.interval, 2*s.interval, s.slice, s.slotRounds)
	return b.String()
}

// countWithin counts the durations of ds within bound.
func countWithin(ds []time.Duration, bound time.Duration) int {
	n := 0
	for _, d := range ds {
		if d <= bound {
			n++
		}
	}
	return n
}
