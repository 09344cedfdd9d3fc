-- gormlease schema for PostgreSQL: the same DDL that gormlease.AutoMigrate runs.
-- For migration tools (goose, golang-migrate, atlas, ...).
--
-- job_lease keeps one row per target. The row stays after a release
-- (released_at is set), so that generation keeps increasing across
-- acquisitions: deleting a row restarts its target's generation at 1.
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

-- job_result is where gormlease.SaveJSON stores a target's result. Your own
-- saver may write anywhere else instead, in the same transaction.
CREATE TABLE IF NOT EXISTS job_result (
	target_id  varchar(255) PRIMARY KEY,
	data       jsonb        NOT NULL,
	generation bigint       NOT NULL,
	updated_at timestamptz  NOT NULL
);
