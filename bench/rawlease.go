package main

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// gormlease's PostgreSQL statements, on a table of their own (raw_lease,
// made like job_lease), as of this version of the library: the reference
// implementation "gormlease SQL, raw pgx" runs them on a pgx pool, without
// GORM or database/sql, to tell what the design costs from what the stack
// it runs on costs. TestBench_ReferenceSQLMatchesLibrary, in the library,
// keeps them in step with its own.
const (
	rawAcquire = `
WITH taken AS (
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
	RETURNING l.generation
), made AS (
	INSERT INTO raw_lease (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
	SELECT CAST($1 AS varchar), CAST($2 AS uuid),
		COALESCE(cur.generation, (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
		CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
	FROM (VALUES (1)) AS one (x) LEFT JOIN raw_lease AS cur ON cur.target_id = CAST($1 AS varchar)
	WHERE NOT EXISTS (SELECT 1 FROM taken)
	  AND (cur.target_id IS NULL OR cur.released_at IS NOT NULL
	    OR cur.updated_at < clock_timestamp() - COALESCE(cur.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
	ON CONFLICT (target_id) DO NOTHING
	RETURNING generation
)
SELECT generation FROM taken UNION ALL SELECT generation FROM made`
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
			var gen int64
			err := pool.QueryRow(ctx, rawAcquire, target, token, "bench", leaseTimeout.Microseconds(), -1, leaseTimeout.Milliseconds()).Scan(&gen)
			if errors.Is(err, pgx.ErrNoRows) {
				return token, false, nil
			}
			return token, err == nil, err
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

// rawName names the reference implementation.
const rawName = "gormlease SQL, raw pgx"
