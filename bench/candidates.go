package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The candidates section measures, apart, what each part of gormlease's
// PostgreSQL acquire and release costs: the statements of the version
// before this one (committedAcquire, on main at 5364ab8), each with one part
// taken out, the plain-SQL lease on its narrow row and on a row as wide as
// job_lease, and this version's statements (rawAcquire, rawRelease), all
// acquire+release on raw pgx, each on a table of its own named by the
// candidate's key. Where the server loads pg_stat_statements it also reports
// each statement's server time, buffers and WAL, and for each acquire
// EXPLAIN (ANALYZE, BUFFERS) on a released row. A few of them
// (newTargetCandidates) are measured on targets never acquired before too.

// committedAcquire is the acquire of the version before this one, on table
// T: two subqueries for the new row's generation (the row's own and the
// floor) besides the NOT EXISTS guard, each evaluated on every acquire.
const committedAcquire = `
INSERT INTO T AS l (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT CAST($1 AS varchar), CAST($2 AS uuid),
	GREATEST((SELECT generation FROM T WHERE target_id = $1),
	         (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
	CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
WHERE NOT EXISTS (
	SELECT 1 FROM T
	WHERE target_id = $1 AND released_at IS NULL
	  AND updated_at >= clock_timestamp() - COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL,
	failure     = NULL,
	waiting     = false,
	timeout_ms  = excluded.timeout_ms
WHERE (l.released_at IS NOT NULL
    OR l.updated_at < clock_timestamp() - COALESCE(l.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
  AND (CAST($5 AS bigint) < 0 OR l.generation = $5)
RETURNING l.generation`

// rawTakeOver is this version's takeover alone: the UPDATE of
// rawAcquireSQL's CTE.
var rawTakeOver = between(rawAcquireSQL, "took AS (\n", "\n), ins AS (")

// pairTakeOver and pairInsert are the acquire of the version before this
// one (cf335ea): the UPDATE, then, only when it took nothing, the INSERT,
// which answers the lease that refused it. The UPDATE is rawTakeOver
// without the later FromExpired predicate.
var pairTakeOver = cut(rawTakeOver,
	"(l.generation = $5 AND (NOT CAST($7 AS boolean) OR l.released_at IS NULL))", "l.generation = $5")

const (
	pairInsert = `
WITH cur AS (
	SELECT generation, holder, released_at IS NULL AS unreleased, clock_timestamp() - updated_at AS age,
		COALESCE(timeout_ms * 1000, CAST($4 AS bigint)) AS micros
	FROM raw_lease WHERE target_id = CAST($1 AS varchar)
), ins AS (
	INSERT INTO raw_lease (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
	SELECT CAST($1 AS varchar), CAST($2 AS uuid),
		COALESCE(cur.generation, (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
		CAST($3 AS varchar), clock_timestamp(), NULL, CAST($5 AS bigint)
	FROM (VALUES (1)) AS one (x) LEFT JOIN cur ON true
	WHERE NOT COALESCE(cur.unreleased AND cur.age <= cur.micros * interval '1 microsecond', false)
	ON CONFLICT (target_id) DO NOTHING
	RETURNING generation
)
SELECT (SELECT generation FROM ins), cur.holder, cur.generation, COALESCE(cur.unreleased AND cur.age <= cur.micros * interval '1 microsecond', false),
	CAST(EXTRACT(EPOCH FROM cur.age) AS double precision), cur.micros
FROM (VALUES (1)) AS one (x) LEFT JOIN cur ON true`
)

// cut returns s with its first old replaced by new.
func cut(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic("candidate: no " + old)
	}
	return strings.Replace(s, old, new, 1)
}

// between returns the part of s between the first from and the next to.
func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	part, _, ok2 := strings.Cut(rest, to)
	if !ok || !ok2 {
		panic("between: " + from + " … " + to + " not found")
	}
	return part
}

// pairAcquire runs takeOver then, only when that took nothing, insert.
func pairAcquire(ctx context.Context, pool *pgxpool.Pool, takeOver, insert, target string, token uuid.UUID) (bool, error) {
	var gen int64
	micros, millis := leaseTimeout.Microseconds(), leaseTimeout.Milliseconds()
	err := pool.QueryRow(ctx, takeOver, target, token, "bench", micros, -1, millis).Scan(&gen)
	if !errors.Is(err, pgx.ErrNoRows) {
		return err == nil, err
	}
	return answered(pool.Query(ctx, insert, target, token, "bench", micros, millis))
}

// committedRelease is the release of the version before this one, on T.
const committedRelease = `UPDATE T SET released_at = clock_timestamp() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'T ' || target_id) END`

// joinAcquire reads the row once, by a LEFT JOIN, and the floor only when
// there is no row (COALESCE evaluates its subquery only when needed).
const joinAcquire = `
INSERT INTO T AS l (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT CAST($1 AS varchar), CAST($2 AS uuid),
	COALESCE(cur.generation, (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
	CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
FROM (VALUES (1)) AS one (x) LEFT JOIN T AS cur ON cur.target_id = CAST($1 AS varchar)
WHERE cur.target_id IS NULL OR cur.released_at IS NOT NULL
   OR cur.updated_at < clock_timestamp() - COALESCE(cur.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond'
ON CONFLICT (target_id) DO UPDATE SET
	lease_token = excluded.lease_token,
	generation  = l.generation + 1,
	holder      = excluded.holder,
	updated_at  = excluded.updated_at,
	released_at = NULL,
	failure     = NULL,
	waiting     = false,
	timeout_ms  = excluded.timeout_ms
WHERE (l.released_at IS NOT NULL
    OR l.updated_at < clock_timestamp() - COALESCE(l.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
  AND (CAST($5 AS bigint) < 0 OR l.generation = $5)
RETURNING l.generation`

// cteAcquire takes a free row with a plain UPDATE (no speculative insert,
// no separate row lock), and inserts only when the UPDATE took nothing and
// the snapshot shows no live row.
const cteAcquire = `
WITH taken AS (
	UPDATE T AS l SET lease_token = CAST($2 AS uuid), generation = l.generation + 1, holder = CAST($3 AS varchar),
		updated_at = clock_timestamp(), released_at = NULL, failure = NULL, waiting = false, timeout_ms = CAST($6 AS bigint)
	WHERE l.target_id = CAST($1 AS varchar)
	  AND (l.released_at IS NOT NULL
	    OR l.updated_at < clock_timestamp() - COALESCE(l.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
	  AND (CAST($5 AS bigint) < 0 OR l.generation = $5)
	RETURNING l.generation
), made AS (
	INSERT INTO T (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
	SELECT CAST($1 AS varchar), CAST($2 AS uuid),
		COALESCE(cur.generation, (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
		CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
	FROM (VALUES (1)) AS one (x) LEFT JOIN T AS cur ON cur.target_id = CAST($1 AS varchar)
	WHERE NOT EXISTS (SELECT 1 FROM taken)
	  AND (cur.target_id IS NULL OR cur.released_at IS NOT NULL
	    OR cur.updated_at < clock_timestamp() - COALESCE(cur.timeout_ms * 1000, CAST($4 AS bigint)) * interval '1 microsecond')
	ON CONFLICT (target_id) DO NOTHING
	RETURNING generation
)
SELECT generation FROM taken UNION ALL SELECT generation FROM made`

// candidate is one pair of acquire and release statements, on table T.
type candidate struct {
	key, name        string
	acquire, release string
	// plain marks the plain-SQL lease's arguments and results: target,
	// token, timeout in seconds; rows affected.
	plain bool
	// narrow makes T with the plain-SQL lease's three columns.
	narrow bool
	// seeded makes, before the points, the released rows of every
	// worker's targets: the candidate's acquire makes no row.
	seeded bool
	// insert, when set, runs after acquire took nothing, as this version's
	// acquire does: its arguments are acquire's but the generation.
	insert string
	// fresh measures c on targets never acquired before too (see
	// newTargetCandidates); onlyFresh measures it there alone: an acquire
	// that never takes a row over.
	fresh, onlyFresh bool
}

// candidates are the statements measured apart.
func candidates() []candidate {
	noNotify := cut(committedRelease, ` RETURNING CASE WHEN waiting THEN pg_notify('gormlease', 'T ' || target_id) END`, "")
	plainT := strings.NewReplacer("plain_lease", "T")
	wideAcquire := `INSERT INTO T (target_id, lease_token, generation, updated_at) VALUES ($1, $2, 1, now())
ON CONFLICT (target_id) DO UPDATE SET lease_token = excluded.lease_token, updated_at = now()
WHERE T.updated_at < now() - make_interval(secs => $3)`
	return []candidate{
		{key: "c_plain", name: "plain-SQL lease (upsert; DELETE)", acquire: plainT.Replace(plainAcquire), release: plainT.Replace(plainRelease), plain: true, narrow: true},
		{key: "c_plainwide", name: "plain-SQL lease on a row as wide as job_lease", acquire: wideAcquire, release: plainT.Replace(plainRelease), plain: true},
		{key: "c_committed", name: "gormlease before (5364ab8)", acquire: committedAcquire, release: committedRelease},
		{key: "c_nofloor", name: "before, without the floor subquery", acquire: cut(committedAcquire, "\n\t         (SELECT generation FROM raw_lease_floor WHERE id = 1), 0)", " 0)"), release: committedRelease},
		{key: "c_noown", name: "before, without the row's own generation subquery", acquire: cut(committedAcquire, "GREATEST((SELECT generation FROM T WHERE target_id = $1),\n\t        ", "GREATEST("), release: committedRelease},
		{key: "c_nosub", name: "before, without either subquery", acquire: cut(committedAcquire, "GREATEST((SELECT generation FROM T WHERE target_id = $1),\n\t         (SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1", "1"), release: committedRelease},
		{key: "c_nofrom", name: "before, without the from-generation predicate", acquire: cut(committedAcquire, "(CAST($5 AS bigint) < 0 OR l.generation = $5)", "CAST($5 AS bigint) IS NOT NULL"), release: committedRelease},
		{key: "c_nonotify", name: "before, release without RETURNING … pg_notify", acquire: committedAcquire, release: noNotify},
		{key: "c_join", name: "one read of the row (LEFT JOIN), floor only without one", acquire: joinAcquire, release: committedRelease},
		{key: "c_cte", name: "one statement: UPDATE first, INSERT only without a free row (a CTE)", acquire: cteAcquire, release: committedRelease},
		{key: "c_pair", name: "gormlease before (cf335ea): UPDATE, then INSERT only when it took nothing", acquire: pairTakeOver, insert: pairInsert, release: rawRelease},
		{key: "c_now", name: "gormlease now: one statement (a CTE) for every outcome", acquire: rawAcquireSQL, release: rawRelease},
		{key: "c_row", name: "gormlease now, a row seen before: the CTE without its INSERT", acquire: rawAcquireRowSQL, release: rawRelease, seeded: true},
		{key: "c_keep", name: "plain-SQL lease whose release keeps the row", acquire: plainT.Replace(plainAcquire), release: keepRelease, plain: true, narrow: true, fresh: true},
		{key: "c_insert", name: "an INSERT that only inserts, above the floor (ON CONFLICT DO NOTHING)", acquire: insertOnly, release: rawRelease, onlyFresh: true},
	}
}

// keepRelease releases a plain-SQL lease by marking its row expired rather
// than deleting it: the row stays, as gormlease's does.
const keepRelease = `UPDATE T SET updated_at = '-infinity' WHERE target_id = $1 AND lease_token = $2`

// insertOnly is the least a first acquire of gormlease's row can be: one
// INSERT above the generation floor, which takes nothing where a row is.
// It reads its fourth and fifth arguments only so that its arguments are
// the other candidates'.
const insertOnly = `
INSERT INTO T (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)
SELECT CAST($1 AS varchar), CAST($2 AS uuid),
	COALESCE((SELECT generation FROM raw_lease_floor WHERE id = 1), 0) + 1,
	CAST($3 AS varchar), clock_timestamp(), NULL, CAST($6 AS bigint)
WHERE CAST($4 AS bigint) IS NOT NULL AND CAST($5 AS bigint) <= 0
ON CONFLICT (target_id) DO NOTHING
RETURNING generation`

// newTargetCandidates are the candidates measured on targets never
// acquired before: the plain-SQL lease, with its row deleted and kept,
// gormlease's one statement, and the least INSERT.
func newTargetCandidates(cs []candidate) []candidate {
	var fresh []candidate
	for _, c := range cs {
		if c.key == "c_plain" || c.key == "c_now" || c.fresh || c.onlyFresh {
			fresh = append(fresh, c)
		}
	}
	return fresh
}

// newTargetCandidatesScenario is the candidates' scenario on targets never
// acquired before.
const newTargetCandidatesScenario = "candidates, new targets"

// contendedCandidates are the candidates measured with 32 workers on one
// target: the plain-SQL lease, with its row deleted and kept, and each
// shape of gormlease's acquire: the upsert of before, the UPDATE then the
// INSERT, the one statement, and the one statement without its INSERT.
func contendedCandidates(cs []candidate) []candidate {
	var out []candidate
	for _, c := range cs {
		switch c.key {
		case "c_plain", "c_keep", "c_committed", "c_pair", "c_now", "c_row":
			out = append(out, c)
		}
	}
	return out
}

// contendedCandidatesScenario is the candidates' scenario with 32 workers
// contending on one target.
const contendedCandidatesScenario = "candidates, contended"

// on writes c's statements for its own table.
func (c candidate) on(s string) string {
	return tableName.ReplaceAllString(s, c.key)
}

// tableName matches the lease table's name in a candidate's statements: T,
// or raw_lease (not raw_lease_floor) in this version's.
var tableName = regexp.MustCompile(`\bT\b|\braw_lease\b`)

// newCandidate runs c on a pgx pool.
func newCandidate(ctx context.Context, dsn string, conns int, c candidate) (*impl, error) {
	cnt := &counter{}
	pool, err := openPool(ctx, dsn, conns, cnt)
	if err != nil {
		return nil, err
	}
	acquire, release := c.on(c.acquire), c.on(c.release)
	steps := leaseSteps{
		acquire: func(ctx context.Context, target string) (uuid.UUID, bool, error) {
			token := uuid.New()
			if c.plain {
				tag, err := pool.Exec(ctx, acquire, target, token, leaseTimeout.Seconds())
				return token, err == nil && tag.RowsAffected() == 1, err
			}
			if c.insert != "" {
				ok, err := pairAcquire(ctx, pool, acquire, c.on(c.insert), target, token)
				return token, ok, err
			}
			if strings.Contains(acquire, "WITH cur") {
				ok, err := rawAcquire(ctx, pool, acquire, target, token)
				return token, ok, err
			}
			var gen int64
			err := pool.QueryRow(ctx, acquire, target, token, "bench", leaseTimeout.Microseconds(), -1, leaseTimeout.Milliseconds()).Scan(&gen)
			if errors.Is(err, pgx.ErrNoRows) {
				return token, false, nil
			}
			return token, err == nil, err
		},
		release: func(ctx context.Context, target string, token uuid.UUID) error {
			_, err := pool.Exec(ctx, release, target, token)
			return err
		},
	}
	return &impl{name: c.name, stmts: cnt, pool: pool, try: steps.try, warm: warmPool(pool), close: pool.Close}, nil
}

// candidateStat is one statement's pg_stat_statements figures, per call.
type candidateStat struct {
	calls                           int64
	execUS, planUS, hit, walRec, wB float64
	plans                           int64
}

// candidateResult is what the candidates section found of one candidate.
type candidateResult struct {
	c                 candidate
	acquire, release  candidateStat
	stats             bool
	hot, upd          int64
	explain, explainR string
}

// candidateScenarios runs the candidates section.
func (b *bench) candidateScenarios(ctx context.Context) error {
	cs := candidates()
	for _, c := range cs {
		q := func(table string) string { return b.o.schema + "." + table }
		ddl := "CREATE TABLE " + q(c.key) + " (LIKE " + q("job_lease") + " INCLUDING ALL) WITH (fillfactor = 80)"
		if c.narrow {
			ddl = "CREATE TABLE " + q(c.key) + " (LIKE " + q("plain_lease") + " INCLUDING ALL)"
		}
		if _, err := b.admin.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("%s: %w", ddl, err)
		}
		if c.seeded {
			// The targets of acquireRelease, ar-<worker>-<i>, and the
			// one of contendedOp.
			seed := "INSERT INTO " + q(c.key) + " (target_id, lease_token, generation, updated_at, released_at)" +
				" SELECT 'ar-' || w || '-' || i, gen_random_uuid(), 1, now(), now()" +
				" FROM generate_series(0, 31) AS w, generate_series(0, $1 - 1) AS i" +
				" UNION ALL SELECT $2, gen_random_uuid(), 1, now(), now()"
			if _, err := b.admin.Exec(ctx, seed, targetsPerWorker, "hot-"+c.name); err != nil {
				return fmt.Errorf("%s: %w", seed, err)
			}
		}
	}
	_, err := b.admin.Exec(ctx, "SELECT public.pg_stat_statements_reset()")
	stats := err == nil
	const conns = 34
	var makers []maker
	for _, c := range cs {
		if !c.onlyFresh {
			makers = append(makers, func() (*impl, error) { return newCandidate(ctx, b.dsn, conns, c) })
		}
	}
	slice := b.o.duration / time.Duration(b.o.rounds)
	for _, w := range []int{1, 8, 32} {
		sp := spec{"candidates", "candidates", w, acquireRelease, targetsPerWorker}
		b.rotate(ctx, sp, makers, slice)
	}
	b.settle(ctx)
	// The figures of the statements, before the points on new targets run
	// some of them again.
	for _, c := range cs {
		if c.onlyFresh {
			continue
		}
		r := candidateResult{c: c, stats: stats}
		_ = b.admin.QueryRow(ctx, `SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
			b.o.schema, c.key).Scan(&r.hot, &r.upd)
		if stats {
			r.acquire = b.statementStat(ctx, c, false)
			r.release = b.statementStat(ctx, c, true)
			r.explain = b.explain(ctx, c, "explain-free", true)
			r.explainR = b.explain(ctx, c, "explain-live", false)
		}
		b.cands = append(b.cands, r)
	}
	makers = nil
	for _, c := range newTargetCandidates(cs) {
		makers = append(makers, func() (*impl, error) { return newCandidate(ctx, b.dsn, conns, c) })
		b.freshCands = append(b.freshCands, c)
	}
	b.rotate(ctx, spec{"candidates", newTargetCandidatesScenario, 32, acquireReleaseNew, 0}, makers, slice)
	b.settle(ctx)
	makers = nil
	for _, c := range contendedCandidates(cs) {
		makers = append(makers, func() (*impl, error) { return newCandidate(ctx, b.dsn, conns, c) })
		b.hotCands = append(b.hotCands, c)
	}
	b.rotate(ctx, spec{"candidates", contendedCandidatesScenario, 32, b.contendedOp, 0}, makers, slice)
	b.settle(ctx)
	return nil
}

// rotate runs the point sp of every maker for slice, o.rounds times, the
// makers taking turns, each round starting one further along.
func (b *bench) rotate(ctx context.Context, sp spec, makers []maker, slice time.Duration) {
	for round := range b.o.rounds {
		for i := range makers {
			b.addRound(round, b.point(ctx, sp, makers[(i+round)%len(makers)], slice, false))
		}
	}
}

// statementStat reads from pg_stat_statements the figures of c's acquire
// (or, with release, its release), found as the most called statement that
// begins with the same four words: the server normalises the constants of a
// statement's text, so the text itself does not match.
func (b *bench) statementStat(ctx context.Context, c candidate, release bool) candidateStat {
	stmt := c.acquire
	if release {
		stmt = c.release
	}
	// The first four words, which hold no constant, with c's table.
	words := strings.Fields(c.on(stmt))
	prefix := strings.Join(words[:min(4, len(words))], " ")
	var s candidateStat
	_ = b.admin.QueryRow(ctx, `SELECT calls, total_exec_time * 1000 / calls, COALESCE(total_plan_time * 1000 / NULLIF(plans, 0), 0), plans,
	shared_blks_hit::float8 / calls, wal_records::float8 / calls, wal_bytes::float8 / calls
FROM public.pg_stat_statements
WHERE regexp_replace(ltrim(query), '\s+', ' ', 'g') LIKE $1 || ' %' AND calls > 0 ORDER BY calls DESC LIMIT 1`, prefix).
		Scan(&s.calls, &s.execUS, &s.planUS, &s.plans, &s.hit, &s.walRec, &s.wB)
	return s
}

// explain returns EXPLAIN (ANALYZE, BUFFERS) of c's acquire on target, in a
// transaction rolled back: on a released row when free, else on a live one
// (a refusal).
func (b *bench) explain(ctx context.Context, c candidate, target string, free bool) string {
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(ctx)
	args := func(token uuid.UUID) []any {
		if c.plain {
			return []any{target, token, leaseTimeout.Seconds()}
		}
		all := []any{target, token, "bench", leaseTimeout.Microseconds(), -1, leaseTimeout.Milliseconds(), false}
		return all[:params(c.acquire)]
	}
	// The row, live; released too when free (the plain lease deletes it).
	create, createArgs := c.on(c.acquire), args(uuid.New())
	if c.insert != "" {
		create, createArgs = c.on(c.insert), []any{target, uuid.New(), "bench", leaseTimeout.Microseconds(), leaseTimeout.Milliseconds()}
	}
	if _, err := conn.Exec(ctx, create, createArgs...); err != nil {
		return err.Error()
	}
	if free && !c.plain {
		if _, err := conn.Exec(ctx, "UPDATE "+c.key+" SET released_at = clock_timestamp() WHERE target_id = $1", target); err != nil {
			return err.Error()
		}
	}
	if free && c.plain {
		if _, err := conn.Exec(ctx, "DELETE FROM "+c.key+" WHERE target_id = $1", target); err != nil {
			return err.Error()
		}
	}
	var out []string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Warm the plan and the pages, then explain.
		for range 6 {
			if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, c.on(c.acquire), args(uuid.New())...); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "+c.on(c.acquire), args(uuid.New())...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return err
			}
			out = append(out, line)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return errSkipCommit
	})
	if err != nil && !errors.Is(err, errSkipCommit) {
		return err.Error()
	}
	return strings.Join(out, "\n")
}

// params returns how many parameters query has: the highest $n in it.
func params(query string) int {
	n := 0
	for _, m := range paramRef.FindAllStringSubmatch(query, -1) {
		k, _ := strconv.Atoi(m[1])
		n = max(n, k)
	}
	return n
}

var paramRef = regexp.MustCompile(`\$([0-9]+)`)

// errSkipCommit rolls an explained transaction back.
var errSkipCommit = errors.New("roll back")

// candidatesReport writes the candidates section.
func (b *bench) candidatesReport(p func(string, ...any)) {
	if len(b.cands) == 0 {
		return
	}
	plain := b.cands[0].c.name
	p("\n## What each part of the acquire and release costs (acquire+release on raw pgx, each candidate on a table of its own)\n\n")
	p("| candidate | ops/s, 1 worker | 8 workers | 32 workers | vs plain, 1 | 8 | 32 | acquire: server µs (plan µs) | buffers hit | WAL records | WAL bytes | release: server µs | WAL records | HOT updates |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.cands {
		var ops [3]float64
		var ratios [3]float64
		for i, w := range []int{1, 8, 32} {
			if m, ok := b.find("candidates", r.c.name, w); ok {
				ops[i] = m.OpsPerSec
			}
			ratios[i] = b.ratio("candidates", r.c.name, plain, w)
		}
		stat := func(s candidateStat) string {
			if !r.stats || s.calls == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.1f (%.1f)", s.execUS, s.planUS)
		}
		num := func(ok bool, v float64, f string) string {
			if !ok {
				return "n/a"
			}
			return fmt.Sprintf(f, v)
		}
		hot := "n/a"
		if r.upd > 0 {
			hot = fmt.Sprintf("%.1f%% (%d of %d)", 100*float64(r.hot)/float64(r.upd), r.hot, r.upd)
		}
		a, rel := r.acquire, r.release
		p("| %s | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.2f× | %s | %s | %s | %s | %s | %s | %s |\n",
			r.c.name, ops[0], ops[1], ops[2], ratios[0], ratios[1], ratios[2],
			stat(a), num(a.calls > 0, a.hit, "%.1f"), num(a.calls > 0, a.walRec, "%.2f"), num(a.calls > 0, a.wB, "%.0f"),
			stat(rel), num(rel.calls > 0, rel.walRec, "%.2f"), hot)
	}
	b.freshCandidatesReport(p, plain)
	b.contendedCandidatesReport(p, plain)
	p("\nWhat was found, and what gormlease runs (the figures are this run's, above):\n\n")
	p("- **The subqueries, the from-generation predicate, the notification, the wider row: each costs little.** Taking out the floor subquery, the row's own generation, both, the from predicate, or the release's `RETURNING CASE … pg_notify` moves ops/s within the noise of the slices, and the server time of the acquire by a few µs (an index probe of a cached page each); the plain-SQL lease on a row as wide as job_lease runs as fast as on its narrow one.\n")
	p("- **The shape of the takeover is what costs.** `INSERT … ON CONFLICT DO UPDATE` on a row that exists runs the insert's SELECT (its subqueries included), probes the index for the conflict, locks the row, which writes a WAL record of its own (Heap LOCK), then updates it: %s WAL records and %s buffers per acquire for *gormlease before (5364ab8)*, against %s and %s for the `UPDATE` of *gormlease before (cf335ea)*, which, after a target's first acquire, is all that candidate runs.\n",
		b.candStat("c_committed", func(s candidateStat) float64 { return s.walRec }, "%.2f"), b.candStat("c_committed", func(s candidateStat) float64 { return s.hit }, "%.1f"),
		b.candStat("c_pair", func(s candidateStat) float64 { return s.walRec }, "%.2f"), b.candStat("c_pair", func(s candidateStat) float64 { return s.hit }, "%.1f"))
	p("- **What gormlease runs now** (the library's PostgreSQL backend, and *gormlease SQL, raw pgx* above) chooses the statement by what its Repository has seen of the target. A target it saw taken last time is taken over by that bare `UPDATE` (TakeOverSQL) alone, a HOT update; only when that takes nothing does the CTE without its INSERT (*a row seen before*) run, to answer who holds it. A target it has not seen gets the one statement for every outcome (*gormlease now*, a CTE): a first acquire, a takeover and a refusal are each one round trip, and a refusal answers the live lease (holder, generation, age and timeout: the `*HeldError`) and writes nothing. A target it saw refused gets the CTE without its INSERT. The CTE costs the server more per call than the bare `UPDATE` (its plan opens the UPDATE, the INSERT with its conflict arbiter and the read of the row on every call), which is why it runs only where the Repository has not seen the target taken.\n")
	if len(b.hotCands) > 0 {
		p("- **On one contended target** (the table above) a refusal writes nothing in every shape of gormlease's acquire, so each runs at several times the plain-SQL lease's upsert, whose refusals lock the row and wait for a WAL flush: the one statement (a CTE) at %s, and without its INSERT, which is what gormlease runs on a target it saw refused, at %s. The UPDATE followed by an INSERT (*gormlease before (cf335ea)*) spends two statements on every refusal, %s an attempt, and runs at %s: the second round trip is what the one statement saves where attempts are refused.\n",
			b.hotRatio("c_now"), b.hotRatio("c_row"), b.hotStmts("c_pair"), b.hotRatio("c_pair"))
	}
	p("- **The row that stays**: gormlease's lease row stays, so that its generation goes on: a cycle is two new versions of it (the takeover and the release, each a HOT update with page pruning), where the plain-SQL lease inserts a row and deletes it. *plain-SQL lease whose release keeps the row* is the plain lease with only that change (its release marks the row expired): its ratio beside the plain lease's is what keeping the row costs by itself.\n")
	p("- **Guarantees kept**: a refused acquire writes nothing (the UPDATE's WHERE fails on the live row its snapshot shows, and takes no lock; the INSERT does not run where the snapshot shows a row; see *Safety checks*); generations rise across prunes (a new row starts above the floor, which Prune raises in the transaction that deletes); notifications stay on the release, only for rows marked as waited on; takeovers and releases are HOT updates (*Safety checks* and the last column above; TestAcquire_TakeoverIsOneHOTUpdate checks it with pg_walinspect on a cluster of its own).\n")
	if !b.cands[0].stats {
		p("\npg_stat_statements is not loaded on this server (shared_preload_libraries), so the server columns are n/a; run this section on a cluster that loads it.\n")
		return
	}
	p("\nServer µs and plan µs are pg_stat_statements' mean execution and planning time per call over the section's points on targets acquired before (the first table; the plan column is the mean over the calls that planned: %s), buffers hit and WAL are per call; the server times leave out parsing, the protocol and the commit's WAL flush. HOT updates are n_tup_hot_upd of n_tup_upd on the candidate's table after the section.\n",
		"a prepared statement plans on its first calls, then reuses a generic plan")
	for _, key := range []string{"c_committed", "c_now"} {
		for _, r := range b.cands {
			if r.c.key != key {
				continue
			}
			p("\nEXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) of *%s*'s acquire on a released row (a takeover), then on a live one (a refusal):\n\n```\n%s\n```\n\n```\n%s\n```\n", r.c.name, r.explain, r.explainR)
		}
	}
}

// freshCandidatesReport writes the candidates' table on targets never
// acquired before.
func (b *bench) freshCandidatesReport(p func(string, ...any), plain string) {
	if len(b.freshCands) == 0 {
		return
	}
	p("\nThe same on targets never acquired before (32 workers, each acquire on a new target):\n\n")
	p("| candidate | ops/s | vs plain | client CPU µs/op | server CPU µs/op |\n|---|---|---|---|---|\n")
	b.eachPoint(newTargetCandidatesScenario, b.freshCands, func(c candidate, m result) {
		p("| %s | %.0f | %.2f× | %.0f | %.0f |\n", c.name, m.OpsPerSec,
			b.ratio(newTargetCandidatesScenario, c.name, plain, 32), m.CPUPerOp, m.ServerOp)
	})
}

// eachPoint calls f with each of cs that has a point of scenario at 32
// workers, and the point.
func (b *bench) eachPoint(scenario string, cs []candidate, f func(candidate, result)) {
	for _, c := range cs {
		if m, ok := b.find(scenario, c.name, 32); ok {
			f(c, m)
		}
	}
}

// contendedCandidatesReport writes the candidates' table with 32 workers
// contending on one target.
func (b *bench) contendedCandidatesReport(p func(string, ...any), plain string) {
	if len(b.hotCands) == 0 {
		return
	}
	overlaps := b.overlaps()
	p("\nThe same with 32 workers contending on one target (attempts; each holder sleeps 200 µs):\n\n")
	p("| candidate | attempts/s | vs plain | acquired | statements/attempt | client CPU µs/attempt | server CPU µs/attempt | overlapping holders |\n|---|---|---|---|---|---|---|---|\n")
	b.eachPoint(contendedCandidatesScenario, b.hotCands, func(c candidate, m result) {
		var ops, acquired int64
		for _, r := range b.rounds(contendedCandidatesScenario, c.name, 32) {
			ops, acquired = ops+r.Ops, acquired+r.Acquired
		}
		p("| %s | %.0f | %.2f× | %d of %d | %.2f | %.0f | %.0f | %d |\n", c.name, m.OpsPerSec,
			b.ratio(contendedCandidatesScenario, c.name, plain, 32), acquired, ops, m.StmtPerOp, m.CPUPerOp, m.ServerOp, overlaps[c.name])
	})
}

// hotRatio formats the contended ratio of the candidate keyed key to the
// plain-SQL lease, or n/a.
func (b *bench) hotRatio(key string) string {
	for _, c := range b.hotCands {
		if c.key == key {
			if r := b.ratio(contendedCandidatesScenario, c.name, b.hotCands[0].name, 32); r > 0 {
				return fmt.Sprintf("%.2f×", r)
			}
		}
	}
	return "n/a"
}

// hotStmts formats the statements per contended attempt of the candidate
// keyed key, or n/a.
func (b *bench) hotStmts(key string) string {
	s := "n/a"
	b.eachPoint(contendedCandidatesScenario, b.hotCands, func(c candidate, m result) {
		if c.key == key && m.StmtPerOp >= 0 {
			s = fmt.Sprintf("%.2f", m.StmtPerOp)
		}
	})
	return s
}

// candStat formats one pg_stat_statements figure of the acquire of the
// candidate keyed key, or n/a.
func (b *bench) candStat(key string, f func(candidateStat) float64, format string) string {
	for _, r := range b.cands {
		if r.c.key == key && r.stats && r.acquire.calls > 0 {
			return fmt.Sprintf(format, f(r.acquire))
		}
	}
	return "n/a"
}
