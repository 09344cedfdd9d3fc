package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"cirello.io/pglock"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // pglock as it ships
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
)

// saverSQL is the one-row saver that every full job runs in its commit.
const saverSQL = `INSERT INTO bench_result (target_id, data) VALUES ($1, $2)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`

// leaseTimeout is the lease timeout of every implementation in the lock
// scenarios: long enough that no lease expires during them.
const leaseTimeout = 30 * time.Second

// impl is one way of running work once per target.
type impl struct {
	name string
	// stmts counts the statements sent; nil when they cannot be counted.
	stmts *counter
	// rowOf is the SQL for the lease row of target ($1), when there is one.
	rowOf string
	// pool is the pgx pool, for the implementations on raw pgx.
	pool *pgxpool.Pool
	// try takes the lock on target; unlock gives it back.
	try func(ctx context.Context, target string) (unlock func(context.Context) error, ok bool, err error)
	// job acquires, commits the saver's row under the lock, and releases.
	job func(ctx context.Context, target, data string) (ok bool, err error)
	// warm opens n connections, so that a point does not time their setup.
	warm  func(ctx context.Context, n int) error
	close func()
}

// warmSQL opens n connections of db.
func warmSQL(db *sql.DB) func(context.Context, int) error {
	return func(ctx context.Context, n int) error {
		conns := make([]*sql.Conn, 0, n)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range n {
			c, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}
}

// warmPool opens n connections of pool.
func warmPool(pool *pgxpool.Pool) func(context.Context, int) error {
	return func(ctx context.Context, n int) error {
		conns := make([]*pgxpool.Conn, 0, n)
		defer func() {
			for _, c := range conns {
				c.Release()
			}
		}()
		for range n {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}
}

// pgxConfig parses dsn with c, a statement counter, as its tracer.
func pgxConfig(dsn string, c pgx.QueryTracer) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = c
	return cfg, nil
}

// openGorm opens gorm on pgx, through database/sql, as an application would.
func openGorm(dsn string, conns int, c pgx.QueryTracer) (*gorm.DB, *sql.DB, error) {
	cfg, err := pgxConfig(dsn, c)
	if err != nil {
		return nil, nil, err
	}
	return openGormWith(cfg, conns, gorm.Config{Logger: logger.Discard})
}

// openGormWith opens gorm on pgx's database/sql driver with cfg, conns
// connections and gcfg as gorm's configuration.
func openGormWith(cfg *pgx.ConnConfig, conns int, gcfg gorm.Config) (*gorm.DB, *sql.DB, error) {
	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(conns)
	sqlDB.SetMaxIdleConns(conns)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gcfg)
	if err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	return db, sqlDB, nil
}

func openPool(ctx context.Context, dsn string, conns int, c *counter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = c
	cfg.MaxConns = int32(conns)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// historyName names gormlease on tables that keep a history.
const historyName = "gormlease, with history"

// newGormlease is gormlease: Repository steps for try, Runner.Run for job.
func newGormlease(dsn string, conns int) (*impl, error) {
	return newGormleaseOn(dsn, conns, "gormlease", "job_lease")
}

// newGormleaseHistory is gormlease on historyTables, which keep a history
// (gormlease.WithHistory): the same Runner and Repository, given no
// history option, whose statements' triggers write the events.
func newGormleaseHistory(dsn string, conns int) (*impl, error) {
	return newGormleaseOn(dsn, conns, historyName, "hist_lease", historyTables)
}

// newGormleaseOn is gormlease, called name, on the lease table lease that
// tables name (the default tables without any).
func newGormleaseOn(dsn string, conns int, name, lease string, tables ...gormlease.TableOption) (*impl, error) {
	c := &counter{}
	db, sqlDB, err := openGorm(dsn, conns, c)
	if err != nil {
		return nil, err
	}
	var repoOpts []gormlease.RepositoryOption
	runOpts := []gormlease.Option{gormlease.WithLeaseTimeout(leaseTimeout), gormlease.WithHeartbeatInterval(5 * time.Second)}
	for _, t := range tables {
		repoOpts, runOpts = append(repoOpts, t), append(runOpts, t)
	}
	repo, err := gormlease.NewRepository(db, repoOpts...)
	if err != nil {
		return nil, err
	}
	runner, err := gormlease.NewRunner[string](db, runOpts...)
	if err != nil {
		return nil, err
	}
	return &impl{
		name:  name,
		stmts: c,
		rowOf: "FROM " + lease + " WHERE target_id = $1",
		try: func(ctx context.Context, target string) (func(context.Context) error, bool, error) {
			l, err := repo.Acquire(ctx, target, leaseTimeout)
			if errors.Is(err, gormlease.ErrLeaseHeld) {
				return nil, false, nil
			}
			if err != nil {
				return nil, false, err
			}
			return func(ctx context.Context) error { return repo.Release(ctx, l) }, true, nil
		},
		job: func(ctx context.Context, target, data string) (bool, error) {
			_, err := runner.Run(ctx, target,
				func(context.Context) (string, error) { return data, nil },
				func(tx *gorm.DB, v string) error {
					return tx.Exec(`INSERT INTO bench_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`, target, v).Error
				})
			if errors.Is(err, gormlease.ErrLeaseHeld) {
				return false, nil
			}
			return err == nil, err
		},
		warm:  warmSQL(sqlDB),
		close: func() { sqlDB.Close() },
	}, nil
}

// The plain-SQL lease, on raw pgx: a heartbeat lease written the simplest
// way, the baseline that gormlease is measured against.
const (
	plainAcquire = `INSERT INTO plain_lease (target_id, lease_token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (target_id) DO UPDATE SET lease_token = excluded.lease_token, updated_at = now()
WHERE plain_lease.updated_at < now() - make_interval(secs => $3)`
	plainHeartbeat = `UPDATE plain_lease SET updated_at = now() WHERE target_id = $1 AND lease_token = $2`
	plainLock      = `SELECT lease_token FROM plain_lease WHERE target_id = $1 FOR UPDATE`
	plainRelease   = `DELETE FROM plain_lease WHERE target_id = $1 AND lease_token = $2`
)

func newPlain(ctx context.Context, dsn string, conns int) (*impl, error) {
	c := &counter{isBeat: isUpdateOf("plain_lease")}
	pool, err := openPool(ctx, dsn, conns, c)
	if err != nil {
		return nil, err
	}
	steps := leaseSteps{
		acquire: func(ctx context.Context, target string) (uuid.UUID, bool, error) {
			token := uuid.New()
			tag, err := pool.Exec(ctx, plainAcquire, target, token, leaseTimeout.Seconds())
			return token, err == nil && tag.RowsAffected() == 1, err
		},
		release: func(ctx context.Context, target string, token uuid.UUID) error {
			_, err := pool.Exec(ctx, plainRelease, target, token)
			return err
		},
	}
	return &impl{
		name:  "plain-SQL lease, raw pgx",
		stmts: c,
		rowOf: "FROM plain_lease WHERE target_id = $1",
		pool:  pool,
		try:   steps.try,
		job: steps.job(pool, pgx.TxOptions{}, true, func(ctx context.Context, tx pgx.Tx, target, data string, token uuid.UUID) error {
			var got uuid.UUID
			if err := tx.QueryRow(ctx, plainLock, target).Scan(&got); err != nil {
				return err
			}
			if got != token {
				return errors.New("lease lost")
			}
			_, err := tx.Exec(ctx, saverSQL, target, data)
			return err
		}),
		warm:  warmPool(pool),
		close: pool.Close,
	}, nil
}

// plainGormName and plainGormDefaultsName name the plain-SQL lease written
// with GORM: with the settings GORM's documentation recommends for
// performance, and with GORM's defaults.
const (
	plainGormName         = "plain-SQL lease through GORM"
	plainGormDefaultsName = "plain-SQL lease through GORM, defaults"
)

// The plain-SQL lease's statements as a GORM team writes them, with GORM's
// ? placeholders: GORM renders them as plainAcquire, plainLock,
// plainRelease and saverSQL, which newPlainGorm checks.
const (
	plainGormAcquire = `INSERT INTO plain_lease (target_id, lease_token, updated_at) VALUES (?, ?, now())
ON CONFLICT (target_id) DO UPDATE SET lease_token = excluded.lease_token, updated_at = now()
WHERE plain_lease.updated_at < now() - make_interval(secs => ?)`
	plainGormLock    = `SELECT lease_token FROM plain_lease WHERE target_id = ? FOR UPDATE`
	plainGormRelease = `DELETE FROM plain_lease WHERE target_id = ? AND lease_token = ?`
	plainGormSaver   = `INSERT INTO bench_result (target_id, data) VALUES (?, ?)
ON CONFLICT (target_id) DO UPDATE SET data = excluded.data`
)

// newPlainGorm is the plain-SQL lease of newPlain, the same statements on
// the same tables, written by hand the way a GORM team would: a *gorm.DB
// on gorm.io/driver/postgres over pgx's database/sql driver, acquire and
// release with Exec, the fenced commit in db.Transaction.
// With tuned, it takes the settings GORM's documentation recommends for
// performance; without, GORM's defaults, under which pgx's database/sql
// driver still prepares each statement once per connection (its statement
// cache), so no round trip is added.
func newPlainGorm(dsn string, conns int, tuned bool) (*impl, error) {
	c := &counter{}
	cfg, err := pgxConfig(dsn, nil)
	if err != nil {
		return nil, err
	}
	// Its statements are counted as round trips, on the socket: pgx's
	// tracer sees the queries, but not the Parse and the Close (deallocate)
	// that database/sql sends for each statement GORM prepared within a
	// transaction (see the report, Statements per op).
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return roundTrips{conn, &c.statements}, nil
	}
	// PrepareStmt and SkipDefaultTransaction are the settings GORM's
	// documentation recommends for performance (its Performance page:
	// "Disable Default Transaction", "Caches Prepared Statement"). The
	// logger is discarded, as for gormlease.
	gcfg, name := gorm.Config{Logger: logger.Discard}, plainGormDefaultsName
	if tuned {
		gcfg.PrepareStmt, gcfg.SkipDefaultTransaction, name = true, true, plainGormName
	}
	db, sqlDB, err := openGormWith(cfg, conns, gcfg)
	if err != nil {
		return nil, err
	}
	dry := db.Session(&gorm.Session{DryRun: true})
	for _, q := range []struct{ sent, want string }{
		{dry.Exec(plainGormAcquire, "t", uuid.Nil, 1.0).Statement.SQL.String(), plainAcquire},
		{dry.Exec(plainGormLock, "t").Statement.SQL.String(), plainLock},
		{dry.Exec(plainGormRelease, "t", uuid.Nil).Statement.SQL.String(), plainRelease},
		{dry.Exec(plainGormSaver, "t", "d").Statement.SQL.String(), saverSQL},
	} {
		if q.sent != q.want {
			sqlDB.Close()
			return nil, fmt.Errorf("%s: GORM sends %q, not the plain-SQL lease's %q", name, q.sent, q.want)
		}
	}
	acquire := func(ctx context.Context, target string) (uuid.UUID, bool, error) {
		token := uuid.New()
		res := db.WithContext(ctx).Exec(plainGormAcquire, target, token, leaseTimeout.Seconds())
		return token, res.Error == nil && res.RowsAffected == 1, res.Error
	}
	release := func(ctx context.Context, target string, token uuid.UUID) error {
		return db.WithContext(ctx).Exec(plainGormRelease, target, token).Error
	}
	return &impl{
		name:  name,
		stmts: c,
		rowOf: "FROM plain_lease WHERE target_id = $1",
		try:   leaseSteps{acquire: acquire, release: release}.try,
		job: func(ctx context.Context, target, data string) (bool, error) {
			token, ok, err := acquire(ctx, target)
			if !ok || err != nil {
				return false, err
			}
			err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				var got string
				if err := tx.Raw(plainGormLock, target).Scan(&got).Error; err != nil {
					return err
				}
				if got != token.String() {
					return errors.New("lease lost")
				}
				return tx.Exec(plainGormSaver, target, data).Error
			})
			if err != nil {
				return false, errors.Join(err, release(ctx, target, token))
			}
			return true, release(ctx, target, token)
		},
		warm:  warmSQL(sqlDB),
		close: func() { sqlDB.Close() },
	}, nil
}

// roundTrips counts, into n, the writes to a connection's socket: past its
// startup, each is one round trip, as pgx writes the messages of each
// exchange with the server at once.
type roundTrips struct {
	net.Conn
	n *atomic.Int64
}

func (c roundTrips) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// leaseSteps are the acquire and release of a lease table on a pgx pool.
type leaseSteps struct {
	acquire func(ctx context.Context, target string) (token uuid.UUID, ok bool, err error)
	release func(ctx context.Context, target string, token uuid.UUID) error
}

// try acquires the lease on target; unlock releases it.
func (s leaseSteps) try(ctx context.Context, target string) (unlock func(context.Context) error, ok bool, err error) {
	token, ok, err := s.acquire(ctx, target)
	if !ok || err != nil {
		return nil, false, err
	}
	return func(ctx context.Context) error { return s.release(ctx, target, token) }, true, nil
}

// job returns a full job: acquire, then commit in one transaction on pool
// with opts, then release; after a failed commit always, after a successful
// one only with releaseAfter (when the commit does not release itself).
func (s leaseSteps) job(pool *pgxpool.Pool, opts pgx.TxOptions, releaseAfter bool,
	commit func(ctx context.Context, tx pgx.Tx, target, data string, token uuid.UUID) error,
) func(ctx context.Context, target, data string) (bool, error) {
	return func(ctx context.Context, target, data string) (bool, error) {
		token, ok, err := s.acquire(ctx, target)
		if !ok || err != nil {
			return false, err
		}
		err = pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error { return commit(ctx, tx, target, data, token) })
		switch {
		case err != nil:
			return false, errors.Join(err, s.release(ctx, target, token))
		case releaseAfter:
			return true, s.release(ctx, target, token)
		}
		return true, nil
	}
}

// newAdvisory is pg_try_advisory_lock on a connection pinned while held.
func newAdvisory(ctx context.Context, dsn string, conns int) (*impl, error) {
	c := &counter{}
	pool, err := openPool(ctx, dsn, conns, c)
	if err != nil {
		return nil, err
	}
	try := func(ctx context.Context, target string) (*pgxpool.Conn, func(context.Context) error, bool, error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, nil, false, err
		}
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1))`, target).Scan(&ok); err != nil || !ok {
			conn.Release()
			return nil, nil, false, err
		}
		return conn, func(ctx context.Context) error {
			defer conn.Release()
			_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($1))`, target)
			return err
		}, true, nil
	}
	return &impl{
		name:  "advisory lock",
		stmts: c,
		try: func(ctx context.Context, target string) (func(context.Context) error, bool, error) {
			_, unlock, ok, err := try(ctx, target)
			return unlock, ok, err
		},
		job: func(ctx context.Context, target, data string) (bool, error) {
			conn, unlock, ok, err := try(ctx, target)
			if !ok || err != nil {
				return false, err
			}
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, saverSQL, target, data)
				return err
			})
			return err == nil, errors.Join(err, unlock(ctx))
		},
		pool:  pool,
		warm:  warmPool(pool),
		close: pool.Close,
	}, nil
}

// Names of the pglock implementations.
const (
	pglockPq        = "pglock, lib/pq"
	pglockPgx       = "pglock, pgx"
	pglockPgxNoBeat = "pglock, pgx, WithHeartbeatFrequency(0)"
)

// pglockNames are the pglock implementations of the lock and job points.
var pglockNames = []string{pglockPq, pglockPgx, pglockPgxNoBeat}

// pglockTable is the lock table of a pglock configuration. Each has its
// own, so that the rows one leaves behind (see explainedErrors) refuse no
// other's attempts.
func pglockTable(onPgx bool, hb time.Duration) string {
	switch {
	case hb == callerBeats:
		return "pglock_caller_beats"
	case onPgx:
		return "pglock_pgx"
	}
	return "pglock"
}

// createPglockTables creates the lock tables of every pglock configuration.
func createPglockTables(dsn string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, table := range []string{pglockTable(false, 0), pglockTable(true, 0), pglockTable(true, callerBeats)} {
		client, err := pglock.New(db, pglock.WithCustomTable(table))
		if err != nil {
			return err
		}
		if err := client.TryCreateTable(); err != nil {
			return err
		}
	}
	return nil
}

// callerBeats, as newPglock's hb, configures pglock as its tests do for
// heartbeats the caller sends: WithHeartbeatFrequency(0) starts no
// heartbeat goroutine, and the full job sends SendHeartbeat every
// callerBeatEvery itself, the interval gormlease's runner has here; a job
// shorter than that sends none.
const (
	callerBeats     time.Duration = -1
	callerBeatEvery               = 5 * time.Second
)

// newPglock is cirello.io/pglock v1.16.0, with FailIfLocked, on lib/pq (as
// it ships, through New's driver check) or on pgx's database/sql driver
// (which New refuses: UnsafeNew). With hb 0 its heartbeats are its
// defaults: a goroutine per lock, beating every 5 s, the first beat at once
// (see explainedErrors); with hb > 0 that goroutine beats every hb; with
// callerBeats there is none.
func newPglock(dsn string, conns int, onPgx bool, hb time.Duration) (*impl, *pglock.Client, *sql.DB, error) {
	var (
		db    *sql.DB
		c     *counter
		name  = pglockPq
		open  = pglock.New
		table = pglockTable(onPgx, hb)
	)
	if onPgx {
		c = &counter{isBeat: isUpdateOf(table)}
		cfg, err := pgxConfig(dsn, c)
		if err != nil {
			return nil, nil, nil, err
		}
		db = stdlib.OpenDB(*cfg)
		name, open = pglockPgx, pglock.UnsafeNew
	} else {
		var err error
		if db, err = sql.Open("postgres", dsn); err != nil {
			return nil, nil, nil, err
		}
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	opts := []pglock.ClientOption{pglock.WithCustomTable(table), pglock.WithLeaseDuration(leaseTimeout)}
	switch {
	case hb == callerBeats:
		opts = append(opts, pglock.WithHeartbeatFrequency(0))
		name += ", WithHeartbeatFrequency(0)"
	case hb > 0:
		opts = append(opts, pglock.WithHeartbeatFrequency(hb))
	}
	client, err := open(db, opts...)
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	try := func(ctx context.Context, target string) (*pglock.Lock, bool, error) {
		l, err := client.AcquireContext(ctx, target, pglock.FailIfLocked())
		if errors.Is(err, pglock.ErrNotAcquired) {
			return nil, false, nil
		}
		return l, err == nil, err
	}
	return &impl{
		name:  name,
		stmts: c,
		rowOf: "FROM " + table + " WHERE name = $1",
		try: func(ctx context.Context, target string) (func(context.Context) error, bool, error) {
			l, ok, err := try(ctx, target)
			if !ok {
				return nil, false, err
			}
			return func(ctx context.Context) error { return client.ReleaseContext(ctx, l) }, true, nil
		},
		job: func(ctx context.Context, target, data string) (bool, error) {
			l, ok, err := try(ctx, target)
			if !ok {
				return false, err
			}
			if hb == callerBeats {
				stop := sendHeartbeats(ctx, client, l, callerBeatEvery)
				defer stop()
			}
			tx, err := db.BeginTx(ctx, nil)
			if err == nil {
				if _, err = tx.ExecContext(ctx, saverSQL, target, data); err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			return err == nil, errors.Join(err, client.ReleaseContext(ctx, l))
		},
		warm:  warmSQL(db),
		close: func() { db.Close() },
	}, client, db, nil
}

// sendHeartbeats sends l's heartbeats every interval until stop, which
// waits for a beat in flight instead of cancelling it: a beat cancelled
// after the server ran it leaves the lock's version number behind the row's
// (see explainedErrors). stop must be called before the lock is released.
func sendHeartbeats(ctx context.Context, client *pglock.Client, l *pglock.Lock, interval time.Duration) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTimer(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if client.SendHeartbeat(ctx, l) != nil {
				return
			}
			t.Reset(interval)
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// explainedErrors are the errors the report explains, by message: each
// points the reader to its explanation under "How it is measured".
var explainedErrors = map[string]string{
	pglock.ErrLockAlreadyReleased.Error(): "pglock's heartbeat goroutine lost the race with the release: see *pglock's release errors* below",
}

// setupSchema creates the benchmark's schema and tables, dropping any left
// by an earlier run.
func setupSchema(ctx context.Context, dsn, schema string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.plain_lease (target_id text PRIMARY KEY, lease_token uuid NOT NULL, updated_at timestamptz NOT NULL)`,
		`CREATE TABLE ` + schema + `.bench_result (target_id text PRIMARY KEY, data text NOT NULL)`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}
