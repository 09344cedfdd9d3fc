-- gormlease schema for PostgreSQL: the same DDL that gormlease.AutoMigrate runs.
-- For migration tools (goose, golang-migrate, atlas, ...).
--
-- job_lease keeps one row per target. The row stays after a release
-- (released_at is set), so that generation keeps increasing across
-- acquisitions. Delete rows with gormlease's Prune (or `gormlease prune`),
-- not by hand: Prune records the highest generation it deleted in
-- job_lease_floor, where a new row's generation starts.
--
-- Leave updated_at and released_at unindexed: heartbeats and releases then
-- stay HOT updates that touch no index. The fill factor leaves room on each
-- page for them.
CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varchar(255) PRIMARY KEY,
	lease_token uuid         NOT NULL,
	generation  bigint       NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  timestamptz  NOT NULL,
	released_at timestamptz
) WITH (fillfactor = 80);

-- Columns added later; the ALTER also upgrades a table made before them.
-- saved_generation and saved_at record the last generation that saved a
-- result, in the fenced commit's own transaction; failure keeps the start of
-- the error of a generation that ended without saving; waiting marks a live
-- generation that a caller of Runner.Do or RunWait waits for, so that the
-- statement ending it sends a notification; timeout_ms is the lease timeout
-- that the last acquisition asked for (NULL in rows written before it
-- existed, which count as expired since updated_at); slots is, in the row of
-- a slot of a semaphore (WithSlots), the semaphore's count, and NULL in every
-- other row. Only slotted targets use it: a table without it still serves
-- the others. hold_generation is the generation whose holder ended its work
-- and left the row held, unrenewed, for the rest of its minimum hold
-- (WithMinHold, Repository.Hold); while it equals generation, the row reads
-- as released, not expired, once that hold has passed. A later acquisition
-- raises the generation, so it needs no clearing. paused_at and
-- pause_reason record an operator's Repository.Pause: while paused_at is set,
-- no acquisition takes the row (Resume clears both). stop_generation and
-- stop_reason record Repository.RequestStop: the holder of that generation
-- stops at its next heartbeat; a later acquisition raises the generation, so
-- a request never applies to a later lease. acquired_at is the database time
-- at which the current generation was acquired ("held since"), written by
-- the acquire's own statement; paused_by and stop_by name the operator who
-- paused the target and who asked the holder to stop (admin.Operator.As).
-- end_cause says how the last generation ended (saved, failed, forced, ...),
-- written by the statement that ended it and cleared by the next
-- acquisition; ended_by names the operator who forced the release. The
-- history's triggers (below) copy them into the ended event.
ALTER TABLE job_lease
	ADD COLUMN IF NOT EXISTS saved_generation bigint,
	ADD COLUMN IF NOT EXISTS saved_at         timestamptz,
	ADD COLUMN IF NOT EXISTS failure          varchar(255),
	ADD COLUMN IF NOT EXISTS waiting          boolean NOT NULL DEFAULT false,
	ADD COLUMN IF NOT EXISTS timeout_ms       bigint,
	ADD COLUMN IF NOT EXISTS slots            integer,
	ADD COLUMN IF NOT EXISTS hold_generation  bigint,
	ADD COLUMN IF NOT EXISTS paused_at        timestamptz,
	ADD COLUMN IF NOT EXISTS pause_reason     varchar(255),
	ADD COLUMN IF NOT EXISTS stop_generation  bigint,
	ADD COLUMN IF NOT EXISTS stop_reason      varchar(255),
	ADD COLUMN IF NOT EXISTS acquired_at      timestamptz,
	ADD COLUMN IF NOT EXISTS paused_by        varchar(255),
	ADD COLUMN IF NOT EXISTS stop_by          varchar(255),
	ADD COLUMN IF NOT EXISTS end_cause        varchar(16),
	ADD COLUMN IF NOT EXISTS ended_by         varchar(255);

-- job_lease_paused holds the paused rows only, by key: an operator's list of
-- the paused targets (admin's StatePaused) reads it, not the whole table.
-- Heartbeats, acquires and releases change neither target_id nor paused_at,
-- so they stay HOT updates; only Pause and Resume write the index. Its name
-- is the lease table's with _paused appended.
--
-- parallel_workers = 0: the scans of the whole table (an operator's list in an
-- order other than by key, and its counts) run in the backend alone. At
-- 100,000 rows a scan is 10-35 ms of one core; starting parallel workers for
-- it cost more than it saved on a busy server (docs/operating.md, "At
-- 100,000 rows"). RESET (parallel_workers) lets the planner choose again.
CREATE INDEX IF NOT EXISTS job_lease_paused ON job_lease (target_id) WHERE paused_at IS NOT NULL;
ALTER TABLE job_lease SET (parallel_workers = 0);

-- job_lease_floor holds one row: the highest generation that Prune ever
-- deleted. A target without a row starts above it, so that its generation
-- still increases after its row was pruned. Its name is the lease table's
-- with _floor appended.
CREATE TABLE IF NOT EXISTS job_lease_floor (
	id         smallint PRIMARY KEY CHECK (id = 1),
	generation bigint   NOT NULL
);
INSERT INTO job_lease_floor (id, generation) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;

-- job_result is where gormlease.SaveJSON stores a target's result. Your own
-- saver may write anywhere else instead, in the same transaction.
CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) PRIMARY KEY,
	data       jsonb        NOT NULL,
	generation bigint       NOT NULL,
	updated_at timestamptz  NOT NULL
);

-- Optional: the history of each target (AutoMigrate with
-- gormlease.WithHistory(), or `gormlease migrate -history`). Leave this part
-- out for a table that keeps no history. job_lease_event holds one row per
-- event of a lease row: its acquisitions, the end of each generation, the
-- fenced saves and the operators' actions, numbered by seq from 1 per
-- target (docs/design.md, section History). Its name is the lease table's
-- with _event appended; job_lease_event_at serves Prune's deletes by age.
CREATE TABLE IF NOT EXISTS job_lease_event (
	target_id       varchar(255) NOT NULL,
	seq             bigint       NOT NULL,
	at              timestamptz  NOT NULL,
	kind            varchar(16)  NOT NULL,
	generation      bigint       NOT NULL,
	holder          varchar(255) NOT NULL DEFAULT '',
	how             varchar(16),
	from_generation bigint,
	acquired_at     timestamptz,
	operator        varchar(255),
	detail          varchar(255),
	PRIMARY KEY (target_id, seq)
);
CREATE INDEX IF NOT EXISTS job_lease_event_at ON job_lease_event (at);
