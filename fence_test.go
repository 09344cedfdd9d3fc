package gormlease_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// commitPaths runs fn on each way a Repository can run its fenced commit:
// on PostgreSQL, BEGIN and the locking statement in one round trip, with
// the statement prepared on pgx's connection ("default") or as one simple
// query on another driver's ("other driver"), and gorm's transaction, which PostgreSQL
// falls back to and the other databases use.
func commitPaths(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB, setup func(*gormlease.Repository))) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		t.Run("default", func(t *testing.T) { fn(t, s, db, func(*gormlease.Repository) {}) })
		if s.Name == "postgres" {
			t.Run("other driver", func(t *testing.T) { fn(t, s, otherDriverDB(t, s), func(*gormlease.Repository) {}) })
			t.Run("gorm", func(t *testing.T) { fn(t, s, db, gormlease.CommitThroughGorm) })
		}
	})
}

// otherDriverDB opens s's database, PostgreSQL, through connections of
// pgx's database/sql driver that hide pgx's own connection, as a driver
// other than pgx (lib/pq) would: the backend then sends what it sends on
// such a driver.
func otherDriverDB(t *testing.T, s *testdb.Server) *gorm.DB {
	t.Helper()
	c, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(s.DSN)
	require.NoError(t, err)
	sqlDB := sql.OpenDB(hiddenPgxConnector{c})
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return db
}

// hiddenPgxConnector makes pgx's driver connections hiddenPgxConns.
type hiddenPgxConnector struct{ driver.Connector }

func (c hiddenPgxConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := dc.(pgxDriverConn)
	if !ok {
		_ = dc.Close()
		return nil, errors.New("not pgx's driver connection")
	}
	return hiddenPgxConn{pc}, nil
}

// pgxDriverConn is what pgx's driver connection implements of
// database/sql's interfaces.
type pgxDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.NamedValueChecker
}

// hiddenPgxConn passes database/sql's interfaces on to pgx's driver
// connection, and nothing else: not its Conn method, which gives pgx's
// connection.
type hiddenPgxConn struct{ pgxDriverConn }

// trickyTargets are target IDs that an SQL literal must escape, or that
// differ from another only in what escaping could confuse.
var trickyTargets = []string{
	`it's`, `back\slash`, `trailing\`, `\'`, `''`, `E'x'`, `"quoted"`,
	`x'; UPDATE job_lease SET released_at = NULL; --`, "line\nbreak", "tab\tand ünïcödé ✓",
	`$$dollar$$`, `?`, `$1`, "  spaces  ",
}

// The fenced commit locks exactly its own target's row, whatever characters
// the target holds: a lease lost on such a target saves nothing, and one
// still held saves and releases.
func TestCommit_TargetsThatNeedEscaping(t *testing.T) {
	t.Parallel()
	commitPaths(t, func(t *testing.T, s *testdb.Server, db *gorm.DB, setup func(*gormlease.Repository)) {
		r := newRunner(t, db)
		setup(r.Repository())
		repo := r.Repository()
		ctx := context.Background()
		suffix := "#" + newTarget(t)
		for _, base := range trickyTargets {
			target := base + suffix
			_, err := r.Run(ctx, target, func(context.Context) (string, error) { return target, nil },
				gormlease.SaveJSON[string])
			require.NoError(t, err, "%q", target)
			saved, _, err := gormlease.LoadJSON[string](ctx, db, target)
			require.NoError(t, err, "%q", target)
			assert.Equal(t, target, saved)
			assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "%q: not released", target)

			l, err := repo.Acquire(ctx, target, time.Minute)
			require.NoError(t, err)
			steal(t, s, db, target)
			err = repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
				t.Errorf("%q: saver called after the lease was lost", target)
				return nil
			})
			require.ErrorIs(t, err, gormlease.ErrLeaseLost, "%q", target)
		}
	})
}

// The saver's session cannot end the fenced transaction: Commit and
// Rollback return an error, and nothing it wrote is saved.
func TestCommit_SaverCannotEndTransaction(t *testing.T) {
	t.Parallel()
	commitPaths(t, func(t *testing.T, s *testdb.Server, db *gorm.DB, setup func(*gormlease.Repository)) {
		repo := newRepository(t, db)
		setup(repo)
		ctx := context.Background()
		for _, end := range []func(*gorm.DB) *gorm.DB{(*gorm.DB).Commit, (*gorm.DB).Rollback} {
			target, l := acquireNew(t, repo, time.Minute)
			err := repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
				if err := gormlease.SaveJSON(tx, "x"); err != nil {
					return err
				}
				return end(tx).Error
			})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the saver must not commit or roll back")
			assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "saved")
			// The lease is still held, and the row not left locked.
			require.NoError(t, repo.Release(ctx, l))
		}
	})
}

// A saver may nest transactions: they run as savepoints inside the fenced
// transaction, and one rolled back undoes only its own writes.
func TestCommit_SaverNestsTransactions(t *testing.T) {
	t.Parallel()
	commitPaths(t, func(t *testing.T, s *testdb.Server, db *gorm.DB, setup func(*gormlease.Repository)) {
		repo := newRepository(t, db)
		setup(repo)
		ctx := context.Background()
		kept, undone := newTarget(t), newTarget(t)
		l, err := repo.Acquire(ctx, kept, time.Minute)
		require.NoError(t, err)
		errUndo := errors.New("undo")
		require.NoError(t, repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
			if err := tx.Transaction(func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, "kept") }); err != nil {
				return err
			}
			err := tx.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&gormlease.JobResult{TargetID: undone, Data: []byte(`"undone"`),
					Generation: 1, UpdatedAt: time.Now()}).Error; err != nil {
					return err
				}
				return errUndo
			})
			if !errors.Is(err, errUndo) {
				return err
			}
			return nil
		}))
		assert.EqualValues(t, 1, countRows(t, db, &gormlease.JobResult{}, kept), "the kept savepoint")
		assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, undone), "the rolled back savepoint")
	})
}

// postgresPaths runs fn on PostgreSQL, once on each commit path (see
// commitPaths).
func postgresPaths(t *testing.T, fn func(t *testing.T, db *gorm.DB, setup func(*gormlease.Repository))) {
	s := testdb.Postgres(t)
	db := s.DB(t)
	t.Run("default", func(t *testing.T) { t.Parallel(); fn(t, db, func(*gormlease.Repository) {}) })
	t.Run("other driver", func(t *testing.T) { t.Parallel(); fn(t, otherDriverDB(t, s), func(*gormlease.Repository) {}) })
	t.Run("gorm", func(t *testing.T) { t.Parallel(); fn(t, db, gormlease.CommitThroughGorm) })
}

// On PostgreSQL a failed statement aborts the transaction: a saver that
// ignores the error and returns nil saves nothing, and is told so.
func TestCommit_AbortedTransactionSavesNothing(t *testing.T) {
	t.Parallel()
	postgresPaths(t, func(t *testing.T, db *gorm.DB, setup func(*gormlease.Repository)) {
		repo := newRepository(t, db)
		setup(repo)
		ctx := context.Background()
		target, l := acquireNew(t, repo, time.Minute)
		err := repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error {
			require.NoError(t, gormlease.SaveJSON(tx, "x"))
			_ = tx.Exec("SELECT 1/0").Error // ignored
			return nil
		})
		require.Error(t, err)
		assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "saved")
		require.NoError(t, repo.Release(ctx, l), "the lease is still held")
	})
}

// On PostgreSQL Run's fenced commit sends BEGIN and its locking statement
// in one round trip, with the statement prepared on pgx's connection or
// as one query on another driver's (CommitIfOwner sends BEGIN, then the model's locking
// read), and falls back to gorm's transaction, BEGIN alone, when the
// driver refused that once.
func TestCommit_PostgresBeginsAndLocksInOneQuery(t *testing.T) {
	t.Parallel()
	postgresPaths(t, func(t *testing.T, db *gorm.DB, setup func(*gormlease.Repository)) {
		rec, st := recording(db)
		r := newRunner(t, rec)
		setup(r.Repository())
		ctx := context.Background()
		ownConn := strings.HasSuffix(t.Name(), "/default")
		oneTrip := !strings.HasSuffix(t.Name(), "/gorm")

		// CommitIfOwner: a locking read through the model, and the save
		// recorded after the saver, on every pool; on the default pool the
		// transaction begins on a connection of its own, by a BEGIN of its
		// own, so that its COMMIT is read with its notices.
		target := newTarget(t)
		l, err := r.Repository().Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		st.take()
		require.NoError(t, r.Repository().CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return nil }))
		sql := st.take()
		if ownConn {
			require.NotEmpty(t, sql)
			assert.Equal(t, "BEGIN ISOLATION LEVEL READ COMMITTED", sql[0])
			sql = sql[1:]
		}
		require.Len(t, sql, 2, "lock, record the save")
		assert.True(t, strings.HasPrefix(sql[0], `SELECT * FROM "job_lease" WHERE target_id = `), "%s", sql[0])
		assert.True(t, strings.HasSuffix(sql[0], "FOR UPDATE"), "%s", sql[0])
		assert.Contains(t, sql[1], "SET saved_generation = generation")
		require.NoError(t, r.Repository().Release(ctx, l))

		// Run: the release locks the row. On the target released above,
		// whose row exists, the acquire is one statement.
		st.take()
		_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "x", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err)
		sql = st.take()
		require.Len(t, sql, 3, "acquire, lock, save")
		assert.Contains(t, sql[1], "UPDATE job_lease SET released_at")
		assert.Equal(t, oneTrip, strings.HasPrefix(sql[1], "BEGIN ISOLATION LEVEL READ COMMITTED; UPDATE "), "%s", sql[1])
	})
}

// Every way out of the fenced commit gives its connection back, outside a
// transaction: no connection stays checked out, and none idles in a
// transaction on the server.
func TestCommit_ReturnsConnectionOutsideTransaction(t *testing.T) {
	t.Parallel()
	commitPaths(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB, setup func(*gormlease.Repository)) {
		app := "commit-conns-" + uuid.NewString()[:8]
		var params map[string]string
		if s.Name == "postgres" {
			params = map[string]string{"application_name": app}
		}
		db := s.Open(t, params)
		repo := newRepository(t, db)
		setup(repo)
		ctx := context.Background()
		saveErr := errors.New("saver failed")
		outcomes := []struct {
			name  string
			steal bool
			fn    func(tx *gorm.DB) error
			ok    bool
		}{
			{"saved", false, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, 1) }, true},
			{"lost", true, func(tx *gorm.DB) error { return nil }, false},
			{"saver error", false, func(tx *gorm.DB) error { return saveErr }, false},
			{"cancelled", false, func(tx *gorm.DB) error {
				cctx, cancel := context.WithCancel(tx.Statement.Context)
				cancel()
				return tx.WithContext(cctx).Exec("SELECT 1").Error
			}, false},
		}
		for _, o := range outcomes {
			target, l := acquireNew(t, repo, time.Minute)
			if o.steal {
				steal(t, s, db, target)
			}
			err := repo.CommitIfOwner(ctx, l, o.fn)
			assert.Equal(t, o.ok, err == nil, "%s: %v", o.name, err)
		}
		sqlDB, err := db.DB()
		require.NoError(t, err)
		assert.Zero(t, sqlDB.Stats().InUse, "connections still checked out")
		if s.Name != "postgres" {
			return // the server's view of other sessions' transactions is PostgreSQL's
		}
		waitFor(t, 5*time.Second, "no session of the pool idle in a transaction", func() bool {
			var inTx int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM pg_stat_activity
WHERE application_name = ? AND state LIKE 'idle in transaction%'`, app).Scan(&inTx).Error)
			return inTx == 0
		})
	})
}

// countingPool is a caller's own gorm.ConnPool around a pool: it counts the
// transactions begun through it.
type countingPool struct {
	gorm.ConnPool
	pool  *sql.DB
	begun atomic.Int32
}

func (p *countingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	p.begun.Add(1)
	return p.pool.BeginTx(ctx, opts)
}

func (p *countingPool) GetDBConn() (*sql.DB, error) { return p.pool, nil }

// A ConnPool of the caller's, such as a wrapper that traces statements, is
// not bypassed: the fenced commit's transaction begins through it.
func TestCommit_GoesThroughCallersConnPool(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		sqlDB, err := db.DB()
		require.NoError(t, err)
		pool := &countingPool{ConnPool: sqlDB, pool: sqlDB}
		wrapped := db.Session(&gorm.Session{NewDB: true, Context: context.Background()})
		wrapped.Statement.ConnPool = pool
		r := newRunner(t, wrapped)
		_, err = r.Run(context.Background(), newTarget(t), func(context.Context) (string, error) { return "x", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.EqualValues(t, 1, pool.begun.Load(), "transactions begun through the caller's pool")
	})
}
