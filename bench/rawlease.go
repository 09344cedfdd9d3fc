package main

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// gormlease's PostgreSQL statements, on a table of their own (raw_lease,
// made like job_lease), as of this version of the library: the reference
// implementation "gormlease SQL, raw pgx" runs them on a pgx pool, without
// GORM or database/sql, to tell what the design costs from what the stack
// it runs on costs. TestBench_ReferenceSQLMatchesLibrary, in the library,
// keeps them in step with its own.
const (
	rawAcquireSQL = `
WITH cur AS (
	SELECT generation, holder, released_at IS NULL AS unreleased, clock_timestamp() - updated_at AS age,
		COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) AS micros, paused_at IS NOT NULL AS paused, pause_reason,
		clock_timestamp() - acquired_at AS held, COALESCE(hold_generation = generation, false) AS minhold
	FROM raw_lease WHERE target_id = CAST($1 AS varchar)
), took AS (
UPDATE raw_lease AS l SET
	lease_token = CAST($2 AS uuid),
	generation  = l.generation + 1,
	holder      = CAST($3 AS varchar),
	updated_at  = clock_timestamp(),
	acquired_at = clock_timestamp(),
	released_at = NULL,
	failure     = NULL,
	end_cause   = NULL,
	ended_by    = NULL,
	waiting     = false,
	timeout_ms  = CAST($6 AS bigint)
WHERE l.target_id = CAST($1 AS varchar)
  AND (paused_at IS NULL AND (released_at IS NOT NULL
    OR updated_at < clock_timestamp() - COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond'))
  AND (CAST($5 AS bigint) < 0 OR (l.generation = $5 AND (NOT CAST($7 AS boolean) OR l.released_at IS NULL)))
RETURNING l.generation
), ins AS (
	INSERT INTO raw_lease (target_id, lease_token, generation, holder, updated_at, acquired_at, released_at, timeout_ms)
	SELECT CAST($1 AS varchar), CAST($2 AS uuid),
		COALESCE((SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
		CAST($3 AS varchar), clock_timestamp(), clock_timestamp(), NULL, CAST($6 AS bigint)
	WHERE NOT EXISTS (SELECT 1 FROM cur) AND CAST($5 AS bigint) <= 0
	ON CONFLICT (target_id) DO NOTHING
	RETURNING generation
)
SELECT COALESCE((SELECT generation FROM took), (SELECT generation FROM ins)), cur.holder, cur.generation, COALESCE(cur.unreleased AND cur.age <= cur.micros * interval '1 microsecond', false),
	CAST(EXTRACT(EPOCH FROM cur.age) AS double precision), cur.micros, COALESCE(cur.paused, false), cur.pause_reason,
	CAST(EXTRACT(EPOCH FROM cur.held) AS double precision), COALESCE(cur.minhold, false)
FROM (VALUES (1)) AS one (x) LEFT JOIN cur ON true`
	rawRelease     = `UPDATE raw_lease SET released_at = clock_timestamp(), end_cause = CASE WHEN saved_generation = generation THEN 'saved' ELSE 'released' END WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'raw_lease ' || target_id) END`
	rawSaveRelease = `UPDATE raw_lease SET released_at = clock_timestamp(), saved_generation = generation, saved_at = clock_timestamp(), end_cause = 'saved' WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'raw_lease ' || target_id) END`
	rawTable       = `CREATE TABLE raw_lease (LIKE job_lease INCLUDING ALL) WITH (fillfactor = 80)`
	rawFloorTable  = `CREATE TABLE raw_lease_floor (LIKE job_lease_floor INCLUDING ALL)`
)

// newRawLease is gormlease's SQL on raw pgx: acquire; BEGIN, the release
// that records the save as the locking statement, the saver, COMMIT; each a
// prepared statement.
func newRawLease(ctx context.Context, dsn string, conns int) (*impl, error) {
	c := &counter{isBeat: isUpdateOf("raw_lease")}
	pool, err := openPool(ctx, dsn, conns, c)
	if err != nil {
		return nil, err
	}
	seen := &rawSeen{}
	steps := leaseSteps{
		acquire: func(ctx context.Context, target string) (uuid.UUID, bool, error) {
			token := uuid.New()
			ok, err := seen.acquire(ctx, pool, target, token)
			return token, ok, err
		},
		release: func(ctx context.Context, target string, token uuid.UUID) error {
			_, err := pool.Exec(ctx, rawRelease, target, token)
			return err
		},
	}
	return &impl{
		name:  rawName,
		stmts: c,
		rowOf: "FROM raw_lease WHERE target_id = $1",
		pool:  pool,
		try:   steps.try,
		job: steps.job(pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, false,
			func(ctx context.Context, tx pgx.Tx, target, data string, token uuid.UUID) error {
				tag, err := tx.Exec(ctx, rawSaveRelease, target, token)
				if err != nil {
					return err
				}
				if tag.RowsAffected() != 1 {
					return errors.New("lease lost")
				}
				_, err = tx.Exec(ctx, saverSQL, target, data)
				return err
			}),
		warm:  warmPool(pool),
		close: pool.Close,
	}, nil
}

// rawAcquire runs gormlease's acquire, one statement, on pool: its answer
// is the generation it took first, NULL when it took nothing.
func rawAcquire(ctx context.Context, pool *pgxpool.Pool, acquire, target string, token uuid.UUID) (bool, error) {
	micros, millis := leaseTimeout.Microseconds(), leaseTimeout.Milliseconds()
	return answered(pool.Query(ctx, acquire, target, token, "bench", micros, -1, millis, false))
}

// answered reports whether the acquire whose answer rows holds took the
// lease: its first value is the generation taken, or NULL.
func answered(rows pgx.Rows, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	defer rows.Close()
	taken := false
	if rows.Next() {
		values, err := rows.Values()
		if err != nil {
			return false, err
		}
		taken = values[0] != nil
	}
	return taken, rows.Err()
}

// rawAcquireRowSQL is rawAcquireSQL for a target whose row is known to
// exist: the library's AcquireRowSQL, the same statement without its
// INSERT.
var rawAcquireRowSQL = withoutInsert(rawAcquireSQL)

// withoutInsert returns acquire, the one-statement acquire, without the
// part that makes a missing row. TestBench_ReferenceSQLMatchesLibrary, in
// the library, checks that it makes the library's AcquireRowSQL of its
// AcquireSQL.
func withoutInsert(acquire string) string {
	head, rest, ok := strings.Cut(acquire, "\n), ins AS (")
	_, answer, ok2 := strings.Cut(rest, "\n)\nSELECT COALESCE((SELECT generation FROM took), (SELECT generation FROM ins)),")
	if !ok || !ok2 {
		panic("withoutInsert: not the one-statement acquire")
	}
	return head + "\n)\nSELECT (SELECT generation FROM took)," + answer
}

// rawSeen is the library's choice of statement (see the postgres
// backend's Acquire): a target not seen gets rawAcquireSQL; one whose last
// acquire took it, the takeover's UPDATE alone first; one whose last acquire
// was refused, rawAcquireRowSQL. It is unbounded here; the library bounds
// its set.
type rawSeen struct{ held sync.Map }

func (s *rawSeen) acquire(ctx context.Context, pool *pgxpool.Pool, target string, token uuid.UUID) (bool, error) {
	micros, millis := leaseTimeout.Microseconds(), leaseTimeout.Milliseconds()
	held, seen := s.held.Load(target)
	if seen && !held.(bool) {
		var gen int64
		err := pool.QueryRow(ctx, rawTakeOver, target, token, "bench", micros, -1, millis, false).Scan(&gen)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err == nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		query := rawAcquireSQL
		if _, ok := s.held.Load(target); ok {
			query = rawAcquireRowSQL
		}
		var taken, gen, us *int64
		var holder, reason *string
		var live, paused bool
		var age *float64
		if err := pool.QueryRow(ctx, query, target, token, "bench", micros, -1, millis, false).Scan(&taken, &holder, &gen, &live, &age, &us, &paused, &reason); err != nil {
			return false, err
		}
		if taken != nil || gen != nil {
			s.held.Store(target, taken == nil)
		} else {
			s.held.Delete(target)
		}
		if taken != nil || live || paused || attempt >= 3 {
			return taken != nil, nil
		}
	}
}

// rawName names the reference implementation.
const rawName = "gormlease SQL, raw pgx"
