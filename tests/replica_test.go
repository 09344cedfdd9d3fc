package tests

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ncruces/go-sqlite3/gormlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/plugin/dbresolver"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// With dbresolver sending gorm's reads to a replica that lags (here, one
// that has none of the primary's rows): the lease's statements go to the
// primary, and so do admin.Operator.Get, which Run decides on, whereas
// LoadJSON reads where the *gorm.DB it is given sends it, and reads the
// primary when given db.Clauses(dbresolver.Write).
func TestReplica_ReadsThatDecideGoToThePrimary(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, direct *gorm.DB) {
		ctx := context.Background()
		db := s.Open(t, nil)
		useStaleReplica(t, s, db)
		r := testkit.NewRunner(t, db)
		target := testkit.NewTarget(t)

		// Acquire, fenced commit and release: all on the primary.
		_, err := r.Run(ctx, target, func(context.Context) (string, error) {
			return "fresh", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
		primary := testkit.LeaseRow(t, direct, target)
		require.NotNil(t, primary.ReleasedAt)

		// The replica is in use, and stale: gorm's reads through db miss the row.
		assert.Zero(t, testkit.CountRows(t, db, &gormlease.JobLease{}, target), "rows of %s read through dbresolver", target)

		// Get reads the primary.
		row, found, err := admin.New(r.Repository()).Get(ctx, target)
		require.NoError(t, err)
		require.True(t, found, "Get found no row: it read the replica")
		assert.Equal(t, primary.LeaseToken, row.LeaseToken)
		assert.Equal(t, primary.Generation, row.Generation)
		assert.NotNil(t, row.ReleasedAt)

		// A held lease refuses a second Run, though the replica has no row.
		l, err := r.Repository().Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		_, err = r.Run(ctx, target, func(context.Context) (string, error) {
			t.Errorf("work ran on a held lease")
			return "", nil
		}, testkit.NoSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
		require.NoError(t, r.Repository().Release(ctx, l))

		// LoadJSON reads through the *gorm.DB it is given: the replica,
		// unless the caller asks dbresolver for the primary.
		_, _, err = gormlease.LoadJSON[string](ctx, db, target)
		require.ErrorIs(t, err, gormlease.ErrNoResult, "LoadJSON through dbresolver")
		v, res, err := gormlease.LoadJSON[string](ctx, db.Clauses(dbresolver.Write), target)
		require.NoError(t, err, "LoadJSON on db.Clauses(dbresolver.Write)")
		assert.Equal(t, "fresh", v)
		assert.Equal(t, primary.Generation, res.Generation)
	})
}

// When the connection fails during COMMIT, Run settles the outcome by
// releasing the lease and reading its row: that read goes to the primary,
// so a commit that took effect is reported as saved even though the
// replica has not seen it (reading the replica, Run would answer
// ErrCommitUnknown).
func TestReplica_SettleCommitReadsThePrimary(t *testing.T) {
	testkit.EachServerDB(t, func(t *testing.T, s *testdb.Server, direct *gorm.DB) {
		proxy := testdb.NewProxy(t, s.Addr)
		db := s.OpenVia(t, proxy.Addr())
		useStaleReplica(t, s, db)
		r, err := gormlease.NewRunner[string](db, gormlease.WithOperationTimeout(time.Second))
		require.NoError(t, err)
		// The proxy trips on "commit": the target must not contain it.
		target := "replica-" + uuid.NewString()
		var tripped <-chan struct{}
		got, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			return "result", nil
		}, func(tx *gorm.DB, v string) error {
			tripped = proxy.BlackholeOn("commit", true)
			go func() {
				// Cut once the COMMIT took effect: the client never hears.
				<-tripped
				testkit.WaitCommitted(direct, target)
				proxy.Cut()
				proxy.Restore()
			}()
			return gormlease.SaveJSON(tx, v)
		})
		testkit.Recv(t, tripped, time.Second, "the COMMIT to trip the proxy")
		require.NoError(t, err, "Run after the connection failed during a COMMIT that took effect")
		assert.Equal(t, "result", got)
		assert.EqualValues(t, 1, testkit.CountRows(t, direct, &gormlease.JobResult{}, target), "results saved")
		assert.Zero(t, testkit.CountRows(t, db, &gormlease.JobLease{}, target), "rows of %s read through dbresolver", target)
	})
}

// useStaleReplica registers gorm.io/plugin/dbresolver on db, a pool on s,
// with one replica: a schema (PostgreSQL), database (MySQL) or file
// (SQLite) of its own on the same server, with the gormlease tables and no
// rows, as a replica that has not yet received any of the primary's writes.
// A read that dbresolver sends to it visibly misses what the primary holds.
// db's own connections stay the primary, the source of dbresolver. The
// replica is dropped when tb ends.
func useStaleReplica(tb testing.TB, s *testdb.Server, db *gorm.DB) {
	tb.Helper()
	replica := s.OpenEmpty(tb, nil)
	if err := gormlease.AutoMigrate(context.Background(), replica); err != nil {
		tb.Fatalf("replica tables on %s: %v", s.Name, err)
	}
	pool, err := replica.DB()
	if err != nil {
		tb.Fatal(err)
	}
	// dbresolver opens each replica with gorm.Open: a dialector on the
	// replica's pool, rather than its DSN, leaves it nothing to close.
	var dialector gorm.Dialector
	switch s.Name {
	case "postgres":
		dialector = postgres.New(postgres.Config{Conn: pool})
	case "mysql":
		dialector = mysql.New(mysql.Config{Conn: pool})
	default:
		dialector = gormlite.OpenDB(pool)
	}
	// dbresolver also makes a prepared-statement store per pool, whose LRU
	// starts a goroutine that never exits (gorm's internal/lru says so),
	// unless the TTL is gorm's "no eviction" one of ten years. These pools
	// prepare no statements, and the goroutine would fail goleak.
	db.Config.PrepareStmtTTL = 10 * 365 * 24 * time.Hour
	if err := db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{dialector}})); err != nil {
		tb.Fatalf("dbresolver on %s: %v", s.Name, err)
	}
}
