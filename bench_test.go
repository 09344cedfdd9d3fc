package gormlease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The benchmarks run each hot path of gormlease beside a baseline in the
// same run: a heartbeat lease written the simplest way in plain SQL, on the
// same database/sql pool, with no GORM in between. Compare the two lines of each benchmark, not absolute
// times. docs/performance.md has the full comparison (cd bench && go run .).

// The plain-SQL lease's statements, on tables of their own.
const (
	plainTable   = `CREATE TABLE IF NOT EXISTS plain_lease (target_id text PRIMARY KEY, lease_token uuid NOT NULL, updated_at timestamptz NOT NULL)`
	plainResult  = `CREATE TABLE IF NOT EXISTS plain_result (target_id text PRIMARY KEY, data text NOT NULL)`
	plainAcquire = `INSERT INTO plain_lease (target_id, lease_token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (target_id) DO UPDATE SET lease_token = excluded.lease_token, updated_at = now()
WHERE plain_lease.updated_at < now() - interval '1 minute'`
	plainHeartbeat = `UPDATE plain_lease SET updated_at = now() WHERE target_id = $1 AND lease_token = $2`
	plainLock      = `SELECT lease_token FROM plain_lease WHERE target_id = $1 FOR UPDATE`
	plainSave      = `INSERT INTO plain_result (target_id, data) VALUES ($1, $2) ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`
	plainRelease   = `DELETE FROM plain_lease WHERE target_id = $1 AND lease_token = $2`
)

// benchDB returns the shared pool with the plain-SQL lease's tables made.
func benchDB(b *testing.B) (*gorm.DB, *sql.DB) {
	b.Helper()
	db := testdb.Postgres(b).DB(b)
	sqlDB, err := db.DB()
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{plainTable, plainResult} {
		if _, err := sqlDB.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	return db, sqlDB
}

// plainTake runs the plain-SQL lease's acquire and returns the new token.
func plainTake(ctx context.Context, db *sql.DB, target string) (uuid.UUID, error) {
	token := uuid.New()
	res, err := db.ExecContext(ctx, plainAcquire, target, token)
	if err != nil {
		return token, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return token, errors.New("not acquired")
	}
	return token, nil
}

func plainAcquireRelease(ctx context.Context, db *sql.DB, target string) error {
	token, err := plainTake(ctx, db, target)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, plainRelease, target, token)
	return err
}

func BenchmarkAcquireRelease(b *testing.B) {
	db, sqlDB := benchDB(b)
	ctx := context.Background()
	target := fmt.Sprintf("bench-ar-%s", uuid.NewString())
	b.Run("gormlease", func(b *testing.B) {
		repo, err := gormlease.NewRepository(db)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			l, err := repo.Acquire(ctx, target, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := repo.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline_plain_sql", func(b *testing.B) {
		for b.Loop() {
			if err := plainAcquireRelease(ctx, sqlDB, target); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkHeartbeat(b *testing.B) {
	db, sqlDB := benchDB(b)
	ctx := context.Background()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		b.Fatal(err)
	}
	prefix := "bench-hb-" + uuid.NewString()
	leases := make([]gormlease.Lease, 1000)
	for i := range leases {
		if leases[i], err = repo.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i), time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, l := range leases {
			_ = repo.Release(ctx, l)
		}
	})
	b.Run("gormlease", func(b *testing.B) {
		for b.Loop() {
			if err := repo.Heartbeat(ctx, leases[0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gormlease_many_1000", func(b *testing.B) {
		for b.Loop() {
			lost, err := gormlease.HeartbeatMany(repo, ctx, leases)
			if err != nil || len(lost) != 0 {
				b.Fatal(err, len(lost))
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(leases)), "ns/lease")
	})
	b.Run("baseline_plain_sql", func(b *testing.B) {
		target, token := prefix+"-plain", uuid.New()
		if _, err := sqlDB.ExecContext(ctx, plainAcquire, target, token); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := sqlDB.ExecContext(ctx, plainHeartbeat, target, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkRun(b *testing.B) {
	db, sqlDB := benchDB(b)
	ctx := context.Background()
	target := "bench-run-" + uuid.NewString()
	b.Run("gormlease", func(b *testing.B) {
		r, err := gormlease.NewRunner[string](db)
		if err != nil {
			b.Fatal(err)
		}
		work := func(context.Context) (string, error) { return "result", nil }
		save := func(tx *gorm.DB, v string) error {
			return tx.Exec(`INSERT INTO plain_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`, target, v).Error
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Run(ctx, target, work, save); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline_plain_sql", func(b *testing.B) {
		for b.Loop() {
			if err := plainJob(ctx, sqlDB, target+"-plain"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// plainJob is the plain-SQL lease's full job: acquire, lock and save in a
// transaction, then delete the lease.
func plainJob(ctx context.Context, db *sql.DB, target string) error {
	token, err := plainTake(ctx, db, target)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // ignored if committed
	var got uuid.UUID
	if err := tx.QueryRowContext(ctx, plainLock, target).Scan(&got); err != nil {
		return err
	}
	if got != token {
		return errors.New("lease lost")
	}
	if _, err := tx.ExecContext(ctx, plainSave, target, "result"); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, plainRelease, target, token)
	return err
}

// allocJob returns one full job through a Runner on db, as the allocation
// budget counts it: acquire, work that returns at once, the fenced commit
// with a saver of one statement, release.
func allocJob(tb testing.TB, db *gorm.DB) func() {
	tb.Helper()
	r, err := gormlease.NewRunner[string](db)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	target := "alloc-job-" + uuid.NewString()
	work := func(context.Context) (string, error) { return "result", nil }
	save := func(tx *gorm.DB, v string) error {
		return tx.Exec("DELETE FROM job_result WHERE target_id = ?", v).Error
	}
	return func() {
		if _, err := r.Run(ctx, target, work, save); err != nil {
			tb.Fatal(err)
		}
	}
}

// allocRound returns one heartbeat round of n leases held on db, as a
// Run's heartbeat goroutine renews them (see JoinBeats): it waits for the
// next and fails tb unless it renewed all n. It stops their renewal and
// releases them when tb ends.
func allocRound(tb testing.TB, db *gorm.DB, n int) func() {
	tb.Helper()
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	prefix := "alloc-round-" + uuid.NewString()
	leases := make([]gormlease.Lease, n)
	for i := range leases {
		if leases[i], err = repo.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i), time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
	round, stop := gormlease.JoinBeats(repo, leases)
	tb.Cleanup(func() {
		stop()
		for _, l := range leases {
			_ = repo.Release(ctx, l)
		}
	})
	return func() {
		if r := round(); r.Err != nil || r.Renewed != n {
			tb.Fatalf("heartbeat round of %d leases: %d renewed, %d lost, error %v", n, r.Renewed, r.Lost, r.Err)
		}
	}
}

// reportCPU reports the client's CPU time per operation since cpu, the
// process's (see processCPU) when b's loop began: the time spent in the
// client, whatever the database took, which the wall time mixes in.
func reportCPU(b *testing.B, cpu time.Duration) {
	if used := processCPU() - cpu; used > 0 {
		b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkAllocs counts the allocations of a full job (see allocJob) and
// of a heartbeat round of 1 and of 1,000 leases (see allocRound), on
// PostgreSQL, with the client's CPU time of each. TestAllocs_WithinBudget
// holds the allocations to a budget.
func BenchmarkAllocs(b *testing.B) {
	db := testdb.Postgres(b).DB(b)
	b.Run("job", func(b *testing.B) {
		job := allocJob(b, db)
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			job()
		}
		reportCPU(b, cpu)
	})
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("heartbeat_round_%d", n), func(b *testing.B) {
			round := allocRound(b, db, n)
			b.ReportAllocs()
			cpu := processCPU()
			for b.Loop() {
				round()
			}
			reportCPU(b, cpu)
		})
	}
}
