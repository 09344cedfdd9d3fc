// Command opsbench measures the operations of gormlease on PostgreSQL
// against heartbeats: it lists 1,000,000 rows page by page, then prunes
// them, while 10,000 live leases heartbeat every second, and reports the
// listing and pruning rates and every heartbeat round's duration. A
// heartbeat is missed when a round takes longer than the interval or
// reports a lease lost.
//
//	cd bench && go run ./opsbench [-dsn postgres://...] [-rows 1000000] [-leases 10000]
//
// It works in a schema of its own, opsbench, dropped at the start.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
)

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	rows := flag.Int("rows", 1_000_000, "expired rows to list and prune")
	leases := flag.Int("leases", 10_000, "live leases heartbeating")
	interval := flag.Duration("interval", time.Second, "heartbeat interval")
	flag.Parse()
	if err := run(*dsn, *rows, *leases, *interval); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(dsn string, rows, nLeases int, interval time.Duration) error {
	ctx := context.Background()
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := admin.Exec("DROP SCHEMA IF EXISTS opsbench CASCADE; CREATE SCHEMA opsbench").Error; err != nil {
		return err
	}
	sep := "?"
	if slices.Contains([]byte(dsn), '?') {
		sep = "&"
	}
	db, err := gorm.Open(postgres.Open(dsn+sep+"search_path=opsbench"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := gormlease.AutoMigrate(db); err != nil {
		return err
	}
	// A separate pool for the heartbeats, as WithHeartbeatDB gives them.
	beatDB, err := gorm.Open(postgres.Open(dsn+sep+"search_path=opsbench"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		return err
	}
	beatRepo, err := gormlease.NewRepository(beatDB)
	if err != nil {
		return err
	}

	start := time.Now()
	if err := db.Exec(`INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, timeout_ms)
SELECT 'dead/' || lpad(i::text, 8, '0'), gen_random_uuid(), 1, 'bench', clock_timestamp() - interval '2 hours', 60000
FROM generate_series(1, ?) AS i`, rows).Error; err != nil {
		return err
	}
	fmt.Printf("seeded %d expired rows in %v\n", rows, time.Since(start).Round(time.Millisecond))
	leases := make([]gormlease.Lease, 0, nLeases)
	for i := range nLeases {
		l, err := repo.Acquire(ctx, fmt.Sprintf("live/%06d", i), time.Minute)
		if err != nil {
			return err
		}
		leases = append(leases, l)
	}
	if err := db.Exec("VACUUM ANALYZE job_lease").Error; err != nil {
		return err
	}

	b := &beater{repo: beatRepo, leases: leases, interval: interval}
	b.start()
	time.Sleep(5 * interval)
	quiet := b.take()
	report("heartbeats, nothing else running", quiet)

	start = time.Now()
	listed, pages := 0, 0
	o := gormlease.ListOptions{Limit: 1000}
	for {
		page, err := repo.List(ctx, o)
		if err != nil {
			return err
		}
		listed, pages = listed+len(page), pages+1
		if len(page) < o.Limit {
			break
		}
		o.After = page[len(page)-1].TargetID
	}
	el := time.Since(start)
	fmt.Printf("listed %d rows in %d pages in %v: %.0f rows/s, %.1f ms a page\n",
		listed, pages, el.Round(time.Millisecond), float64(listed)/el.Seconds(), el.Seconds()*1000/float64(pages))
	report("heartbeats while listing", b.take())

	start = time.Now()
	pruned, err := repo.Prune(ctx, time.Hour)
	if err != nil {
		return err
	}
	el = time.Since(start)
	fmt.Printf("pruned %d rows in %v: %.0f rows/s\n", pruned, el.Round(time.Millisecond), float64(pruned)/el.Seconds())
	report("heartbeats while pruning", b.take())
	b.stop()
	left, err := repo.List(ctx, gormlease.ListOptions{Prefix: "live/", State: gormlease.StateLive, Limit: gormlease.MaxListLimit})
	if err != nil {
		return err
	}
	fmt.Printf("live leases left: %d of %d\n", len(left), nLeases)
	return admin.Exec("DROP SCHEMA opsbench CASCADE").Error
}

// beater renews leases every interval, as a Runner's heartbeat group does,
// and records each round.
type beater struct {
	repo     *gormlease.Repository
	leases   []gormlease.Lease
	interval time.Duration

	mu     sync.Mutex
	rounds []time.Duration
	lost   int
	errs   int
	done   chan struct{}
	wg     sync.WaitGroup
}

func (b *beater) start() {
	b.done = make(chan struct{})
	b.wg.Go(func() {
		t := time.NewTicker(b.interval)
		defer t.Stop()
		for {
			select {
			case <-b.done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), b.interval)
			begin := time.Now()
			lost, err := b.repo.HeartbeatMany(ctx, b.leases)
			d := time.Since(begin)
			cancel()
			b.mu.Lock()
			b.rounds = append(b.rounds, d)
			b.lost += len(lost)
			if err != nil {
				b.errs++
			}
			b.mu.Unlock()
		}
	})
}

func (b *beater) stop() { close(b.done); b.wg.Wait() }

// stats are the rounds since the last take.
type stats struct {
	rounds     []time.Duration
	lost, errs int
	leases     int
	interval   time.Duration
}

func (b *beater) take() stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := stats{rounds: b.rounds, lost: b.lost, errs: b.errs, leases: len(b.leases), interval: b.interval}
	b.rounds, b.lost, b.errs = nil, 0, 0
	return s
}

func report(what string, s stats) {
	if len(s.rounds) == 0 {
		fmt.Printf("%s: no round\n", what)
		return
	}
	slices.Sort(s.rounds)
	late := 0
	for _, d := range s.rounds {
		if d > s.interval {
			late++
		}
	}
	fmt.Printf("%s: %d rounds of %d leases, p50 %v, p99 %v, max %v; rounds over the interval %d, leases lost %d, errors %d\n",
		what, len(s.rounds), s.leases, s.rounds[len(s.rounds)/2].Round(time.Millisecond),
		s.rounds[len(s.rounds)*99/100].Round(time.Millisecond), s.rounds[len(s.rounds)-1].Round(time.Millisecond),
		late, s.lost, s.errs)
}
