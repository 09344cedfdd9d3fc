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
// same run: the seed design's SQL on the same database/sql pool, with no
// GORM in between. Compare the two lines of each benchmark, not absolute
// times. docs/performance.md has the full comparison (cd bench && go run .).

// seedSQL are the seed design's statements, on a table of their own.
const (
	seedTable   = `CREATE TABLE IF NOT EXISTS seed_lease (target_id text PRIMARY KEY, lease_token uuid NOT NULL, updated_at timestamptz NOT NULL)`
	seedResult  = `CREATE TABLE IF NOT EXISTS seed_result (target_id text PRIMARY KEY, data text NOT NULL)`
	seedAcquire = `INSERT INTO seed_lease (target_id, lease_token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (target_id) DO UPDATE SET lease_token = excluded.lease_token, updated_at = now()
WHERE seed_lease.updated_at < now() - interval '1 minute'`
	seedHeartbeat = `UPDATE seed_lease SET updated_at = now() WHERE target_id = $1 AND lease_token = $2`
	seedLock      = `SELECT lease_token FROM seed_lease WHERE target_id = $1 FOR UPDATE`
	seedSave      = `INSERT INTO seed_result (target_id, data) VALUES ($1, $2) ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`
	seedRelease   = `DELETE FROM seed_lease WHERE target_id = $1 AND lease_token = $2`
)

// benchDB returns the shared pool with the seed's tables made.
func benchDB(b *testing.B) (*gorm.DB, *sql.DB) {
	b.Helper()
	db := testdb.Postgres(b).DB(b)
	sqlDB, err := db.DB()
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{seedTable, seedResult} {
		if _, err := sqlDB.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	return db, sqlDB
}

// seedTake runs the seed's acquire and returns the new token.
func seedTake(ctx context.Context, db *sql.DB, target string) (uuid.UUID, error) {
	token := uuid.New()
	res, err := db.ExecContext(ctx, seedAcquire, target, token)
	if err != nil {
		return token, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return token, errors.New("not acquired")
	}
	return token, nil
}

func seedAcquireRelease(ctx context.Context, db *sql.DB, target string) error {
	token, err := seedTake(ctx, db, target)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, seedRelease, target, token)
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
	b.Run("baseline_seed_sql", func(b *testing.B) {
		for b.Loop() {
			if err := seedAcquireRelease(ctx, sqlDB, target); err != nil {
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
			lost, err := repo.HeartbeatMany(ctx, leases)
			if err != nil || len(lost) != 0 {
				b.Fatal(err, len(lost))
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(leases)), "ns/lease")
	})
	b.Run("baseline_seed_sql", func(b *testing.B) {
		target, token := prefix+"-seed", uuid.New()
		if _, err := sqlDB.ExecContext(ctx, seedAcquire, target, token); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := sqlDB.ExecContext(ctx, seedHeartbeat, target, token); err != nil {
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
			return tx.Exec(`INSERT INTO seed_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`, target, v).Error
		}
		for b.Loop() {
			if _, err := r.Run(ctx, target, work, save); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline_seed_sql", func(b *testing.B) {
		for b.Loop() {
			if err := seedJob(ctx, sqlDB, target+"-seed"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// seedJob is the seed design's full job: acquire, lock and save in a
// transaction, then delete the lease.
func seedJob(ctx context.Context, db *sql.DB, target string) error {
	token, err := seedTake(ctx, db, target)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // ignored if committed
	var got uuid.UUID
	if err := tx.QueryRowContext(ctx, seedLock, target).Scan(&got); err != nil {
		return err
	}
	if got != token {
		return errors.New("lease lost")
	}
	if _, err := tx.ExecContext(ctx, seedSave, target, "result"); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, seedRelease, target, token)
	return err
}
