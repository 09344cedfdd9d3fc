package gormlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Through a real PgBouncer whose pool is smaller than the number of
// concurrent Runs, in transaction and in session pooling, with the pgx
// query modes that docs/design.md says work: one winner per target, the
// others refused with ErrLeaseHeld, leases kept live by heartbeats past the
// timeout, a stolen lease's save refused, and no other error.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	throughPgBouncer(t, s, []pgBouncerCase{
		{"Transaction/exec", "transaction", "exec", 16},
		{"Transaction/simple_protocol", "transaction", "simple_protocol", 16},
		{"Transaction/cache_describe", "transaction", "cache_describe", 16},
		// In session pooling a client keeps its server connection, so the
		// application's pool must not outgrow PgBouncer's.
		{"Session/cache_statement", "session", "", 2},
	}, func(t *testing.T, b *testdb.PgBouncer, tc pgBouncerCase) {
		concurrentRunsThrough(t, s, b.Open(t, tc.mode, tc.appConns))
	})

	// pgx's default mode, cache_statement, names its prepared statements
	// after the query's text: stmtcache_<hash>. Before PgBouncer 1.21, in
	// transaction pooling, a second client that prepares the same query on
	// the same server connection fails with 42P05; from 1.21, with
	// max_prepared_statements set, PgBouncer tracks the statements itself.
	t.Run("Transaction/cache_statement", func(t *testing.T) {
		t.Parallel()
		_, version, major, minor, err := testdb.FindPgBouncer()
		if err != nil || major > 1 || major == 1 && minor >= 21 {
			b := testdb.NewPgBouncer(t, s, testdb.PgBouncerConfig{
				PoolMode: "transaction", PoolSize: 2, MaxPreparedStatements: 200,
			})
			t.Logf("PgBouncer %s: cache_statement with max_prepared_statements = 200", b.Version)
			concurrentRunsThrough(t, s, b.Open(t, "", 16))
			return
		}
		t.Logf("PgBouncer %s is older than 1.21: cache_statement must fail", version)
		// One server connection, two clients: the second prepares the
		// statement that the first left on it.
		b := testdb.NewPgBouncer(t, s, testdb.PgBouncerConfig{PoolMode: "transaction", PoolSize: 1})
		first, err := gormlease.NewRepository(b.Open(t, "", 1))
		require.NoError(t, err)
		second, err := gormlease.NewRepository(b.Open(t, "", 1))
		require.NoError(t, err)
		acquireNew(t, first, time.Minute)
		_, err = second.Acquire(context.Background(), newTarget(t), time.Minute)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the second client's acquire")
		assert.Equal(t, "42P05", pgErr.Code, "%v", err)
		assert.Contains(t, pgErr.Message, `prepared statement "stmtcache_`)
		t.Logf("as expected: %v", err)
	})
}

// pgBouncerCase is a way to reach PostgreSQL through PgBouncer.
type pgBouncerCase struct {
	name     string
	pool     string // PgBouncer's pool_mode
	mode     string // pgx's default_query_exec_mode; "" for its default, cache_statement
	appConns int    // the size of each application pool; PgBouncer's has 2 connections
}

// throughPgBouncer runs fn in a parallel subtest for each case, with a
// PgBouncer of its own in front of s, with a pool of 2 server connections.
func throughPgBouncer(t *testing.T, s *testdb.Server, cases []pgBouncerCase,
	fn func(t *testing.T, b *testdb.PgBouncer, tc pgBouncerCase),
) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := testdb.NewPgBouncer(t, s, testdb.PgBouncerConfig{PoolMode: tc.pool, PoolSize: 2})
			t.Logf("PgBouncer %s, %s pooling, default_query_exec_mode=%q", b.Version, tc.pool, tc.mode)
			fn(t, b, tc)
		})
	}
}

// concurrentRunsThrough runs, on db, 4 Runs at once on each of 3 targets,
// and one more Run whose lease is stolen while its work runs, and checks
// the guarantees (see TestPgBouncer). s is the database behind db, reached
// directly to check the rows.
func concurrentRunsThrough(t *testing.T, s *testdb.Server, db *gorm.DB) {
	const (
		targets    = 3
		contenders = 4
		interval   = 250 * time.Millisecond
		timeout    = 2 * time.Second
	)
	direct := s.DB(t)
	r := newRunner(t, db, fast(interval, timeout)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type outcome struct {
		target string
		err    error
	}
	var ids []string
	won := make(chan string, targets*contenders)
	proceed := make(chan struct{})
	results := make(chan outcome, targets*contenders)
	start := make(chan struct{})
	for range targets {
		target := newTarget(t)
		ids = append(ids, target)
		for range contenders {
			go func() {
				<-start
				_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
					won <- target
					select {
					case <-proceed:
						return "saved by " + target, nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}, gormlease.SaveJSON[string])
				results <- outcome{target, err}
			}()
		}
	}
	close(start)

	// Exactly one winner per target; every other contender is refused at
	// once, while the winners still hold their leases.
	winners, refused := map[string]int{}, map[string]int{}
	deadline := time.After(30 * time.Second)
	for n := 0; n < targets*contenders; n++ {
		select {
		case id := <-won:
			winners[id]++
		case o := <-results:
			require.ErrorIs(t, o.err, gormlease.ErrLeaseHeld, "target %s", o.target)
			refused[o.target]++
		case <-deadline:
			t.Fatalf("after 30 s, only %d of %d Runs had won or been refused", n, targets*contenders)
		}
	}
	for _, id := range ids {
		assert.Equal(t, 1, winners[id], "winners of %s", id)
		assert.Equal(t, contenders-1, refused[id], "refused Runs on %s", id)
	}

	// Heartbeats through the pooler keep the leases live past the timeout:
	// once every row was renewed more than a timeout after its
	// acquisition, a new contender is still refused.
	acquired := map[string]time.Time{}
	for _, id := range ids {
		acquired[id] = leaseRow(t, direct, id).UpdatedAt
	}
	waitFor(t, 30*time.Second, "heartbeats to renew the leases past the timeout", func() bool {
		for _, id := range ids {
			if leaseRow(t, direct, id).UpdatedAt.Sub(acquired[id]) <= timeout {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		_, err := r.Run(ctx, id, func(context.Context) (string, error) {
			t.Errorf("late contender on %s ran its work", id)
			return "", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "late contender on %s", id)
	}

	// A Run whose lease is taken over saves nothing.
	stolen := newTarget(t)
	_, err := r.Run(ctx, stolen, func(context.Context) (string, error) {
		steal(t, s, direct, stolen)
		return "stale", nil
	}, noSave(t))
	require.ErrorIs(t, err, gormlease.ErrLeaseLost)
	assert.Zero(t, countRows(t, direct, &gormlease.JobResult{}, stolen), "results saved for the stolen lease")

	// The winners save, each under its own lease, and release.
	close(proceed)
	for range targets {
		o := recv(t, results, 30*time.Second, "a winner's Run")
		require.NoError(t, o.err, "winner on %s", o.target)
	}
	for _, id := range ids {
		row := leaseRow(t, direct, id)
		assert.NotNil(t, row.ReleasedAt, "lease on %s released", id)
		var res gormlease.JobResult
		require.NoError(t, direct.Where("target_id = ?", id).Take(&res).Error)
		assert.Equal(t, row.Generation, res.Generation, "result of %s saved under the lease", id)
		assert.JSONEq(t, fmt.Sprintf("%q", "saved by "+id), string(res.Data))
	}
}
