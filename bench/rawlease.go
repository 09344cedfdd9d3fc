package main

import (
	"context"
	"errors"

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
	rawTakeOver = `
UPDATE raw_lease AS l SET
	lease_token = CAST($2 AS uuid),
	generation  = l.generation + 1,
	holder      = CAST($3 AS varchar),
	updated_at  = clock_timestamp(),
	released_at = NULL,
	failure     = NULL,
	waiting     = false,
	timeout_ms  = CAST($6 AS bigint)
WHERE l.target_id = CAST($1 AS varchar)
  AND (l.released_at IS NOT NULL
    OR l.updated_at < clock_timestamp() - COALESCE(l.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
  AND (CAST($5 AS bigint) < 0 OR l.generation = $5)
RETURNING l.generation`
	rawInsert = `
INSERT INTO raw_lease (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT CAST($1 AS varchar), CAST($2 AS uuid),
	COALESCE(cur.generation, (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
	CAST($3 AS varchar), clock_timestamp(), NULL, CAST($5 AS bigint)
FROM (VALUES (1)) AS one (x) LEFT JOIN raw_lease AS cur ON cur.target_id = CAST($1 AS varchar)
WHERE cur.target_id IS NULL OR cur.released_at IS NOT NULL
   OR cur.updated_at < clock_timestamp() - COALESCE(cur.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond'
ON CONFLICT (target_id) DO NOTHING
RETURNING generation`
	rawRelease     = `UPDATE raw_lease SET released_at = clock_timestamp() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'raw_lease ' || target_id) END`
	rawSaveRelease = `UPDATE raw_lease SET released_at = clock_timestamp(), saved_generation = generation, saved_at = clock_timestamp() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'raw_lease ' || target_id) END`
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
	steps := leaseSteps{
		acquire: func(ctx context.Context, target string) (uuid.UUID, bool, error) {
			token := uuid.New()
			ok, err := rawAcquire(ctx, pool, rawTakeOver, rawInsert, target, token)
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

// rawAcquire runs gormlease's acquire, takeOver then, only when that took
// nothing, insert, on pool.
func rawAcquire(ctx context.Context, pool *pgxpool.Pool, takeOver, insert, target string, token uuid.UUID) (bool, error) {
	var gen int64
	micros, millis := leaseTimeout.Microseconds(), leaseTimeout.Milliseconds()
	err := pool.QueryRow(ctx, takeOver, target, token, "bench", micros, -1, millis).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		err = pool.QueryRow(ctx, insert, target, token, "bench", micros, millis).Scan(&gen)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// rawName names the reference implementation.
const rawName = "gormlease SQL, raw pgx"
