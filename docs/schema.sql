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
-- no acquisition takes the row (Resume clears both, and writes who resumed
-- into paused_by). stop_generation and
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
-- out for a table that keeps no history. job_lease_event holds the events of
-- a lease row: its acquisitions, the end of each generation, the fenced saves
-- and the operators' actions, numbered by seq from 1 per target
-- (docs/design.md, section History). A row is one event, or the two events of
-- a generation that nothing interrupted: its acquisition at seq, and its end
-- at seq + 1 (ended_at, end_cause, with operator and detail), which no other
-- row holds; History returns the two apart. Its name is the lease table's
-- with _event appended; it has no index by time: Prune walks its key.
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
	ended_at        timestamptz,
	end_cause       varchar(16),
	PRIMARY KEY (target_id, seq)
);

-- The columns added since the table first had them, and the lease row's own:
-- event_seq is the seq of the row's last event, which the trigger on UPDATE
-- advances in the row it writes, so that it numbers an event without reading
-- the event table. event_gen is the generation that the row's statements may
-- give it without calling the trigger's function: the one held, and once its
-- release is written, the next. event_how is how the acquisition of
-- event_gen began (new or released) while that acquisition is pending, not
-- yet written: the next event of the row writes it first. NULL until the
-- trigger writes them. Do not change them by hand.
ALTER TABLE job_lease_event ADD COLUMN IF NOT EXISTS ended_at timestamptz, ADD COLUMN IF NOT EXISTS end_cause varchar(16);
ALTER TABLE job_lease ADD COLUMN IF NOT EXISTS event_seq bigint, ADD COLUMN IF NOT EXISTS event_gen bigint,
	ADD COLUMN IF NOT EXISTS event_how varchar(16);

-- job_lease_history_top() is the seq of a target's last event, by one probe
-- of the primary key, for a row that has no event_seq.
CREATE OR REPLACE FUNCTION job_lease_history_top(key varchar) RETURNS bigint LANGUAGE sql STABLE AS $$
	SELECT COALESCE((SELECT e.seq + CASE WHEN e.end_cause IS NULL THEN 0 ELSE 1 END FROM job_lease_event e
		WHERE e.target_id = key ORDER BY e.seq DESC LIMIT 1), 0)
$$;

-- job_lease_history_new() numbers the events of a row that an acquire
-- inserts, whose acquisition is pending (how new).
CREATE OR REPLACE FUNCTION job_lease_history_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.event_seq := job_lease_history_top(NEW.target_id);
	NEW.event_gen := NEW.generation;
	NEW.event_how := 'new';
	RETURN NEW;
END
$$;

-- job_lease_history_gone() writes the pending acquisition of a row deleted.
CREATE OR REPLACE FUNCTION job_lease_history_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
	VALUES (OLD.target_id, COALESCE(OLD.event_seq, job_lease_history_top(OLD.target_id)) + 1,
		COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder, OLD.event_how,
		CASE WHEN OLD.event_how <> 'new' THEN OLD.generation - 1 END);
	RETURN NULL;
END
$$;

-- job_lease_history() writes, in a statement that changes a row, before the
-- row is written and under its lock, the events of the change: an
-- acquisition that the WHEN clause lets through (seized, expired, after a
-- minimum hold, of a row made before the history, or by Pause or SetSlots), with the
-- ended event of an unreleased lease taken over first; the end of a
-- generation (its cause from end_cause, written by the statement that ends
-- it), in one row with its pending acquisition; a fenced save, a minimum
-- hold, a pause, a resume and a stop request, after the pending acquisition.
CREATE OR REPLACE FUNCTION job_lease_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	n      bigint := OLD.event_seq;
	pend   boolean;
	p_from bigint;
	v_how  varchar(16);
	e_save boolean;
	e_hold boolean;
	e_op   boolean;
BEGIN
	IF n IS NULL THEN
		n := job_lease_history_top(NEW.target_id);
	END IF;
	IF OLD.released_at IS NULL AND NEW.released_at IS NOT NULL AND OLD.hold_generation IS DISTINCT FROM OLD.generation THEN
		IF OLD.event_how IS NOT NULL AND OLD.event_gen = OLD.generation THEN
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation, operator, detail,
				ended_at, end_cause)
			VALUES (NEW.target_id, n + 1, COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder,
				OLD.event_how, CASE WHEN OLD.event_how <> 'new' THEN OLD.generation - 1 END, NEW.ended_by, NEW.failure,
				clock_timestamp(), COALESCE(NEW.end_cause, CASE WHEN NEW.failure IS NOT NULL THEN 'failed'
					WHEN NEW.saved_generation = OLD.generation THEN 'saved' ELSE 'released' END));
			NEW.event_seq := n + 2;
		ELSE
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, operator, detail)
			VALUES (NEW.target_id, n + 1, clock_timestamp(), 'ended', OLD.generation, OLD.holder,
				COALESCE(NEW.end_cause, CASE WHEN NEW.failure IS NOT NULL THEN 'failed'
					WHEN NEW.saved_generation = OLD.generation THEN 'saved' ELSE 'released' END),
				OLD.acquired_at, NEW.ended_by, NEW.failure);
			NEW.event_seq := n + 1;
		END IF;
		NEW.event_gen := NEW.generation + 1;
		NEW.event_how := 'released';
		RETURN NEW;
	END IF;
	pend := OLD.event_how IS NOT NULL AND OLD.event_gen = OLD.generation AND OLD.released_at IS NULL;
	p_from := CASE WHEN OLD.event_how <> 'new' THEN OLD.generation - 1 END;
	IF NEW.generation <> OLD.generation AND NEW.released_at IS NULL THEN
		v_how := CASE WHEN OLD.lease_token = '00000000-0000-0000-0000-000000000000' THEN 'new'
			WHEN OLD.released_at IS NOT NULL THEN 'released'
			WHEN OLD.timeout_ms IS NOT NULL
				AND OLD.updated_at >= clock_timestamp() - OLD.timeout_ms * interval '1 millisecond' THEN 'seized'
			WHEN OLD.hold_generation = OLD.generation THEN 'released'
			ELSE 'expired' END;
		IF OLD.released_at IS NULL AND OLD.hold_generation IS DISTINCT FROM OLD.generation AND pend THEN
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation, ended_at, end_cause)
			VALUES (NEW.target_id, n + 1, COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder,
				OLD.event_how, p_from, clock_timestamp(), v_how);
			n := n + 2;
		ELSIF OLD.released_at IS NULL AND OLD.hold_generation IS DISTINCT FROM OLD.generation THEN
			n := n + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at)
			VALUES (NEW.target_id, n, clock_timestamp(), 'ended', OLD.generation, OLD.holder, v_how, OLD.acquired_at);
		ELSIF pend THEN
			n := n + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
			VALUES (NEW.target_id, n, COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder,
				OLD.event_how, p_from);
		END IF;
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
		VALUES (NEW.target_id, n, clock_timestamp(), 'acquired', NEW.generation, NEW.holder, v_how,
			CASE WHEN v_how <> 'new' THEN OLD.generation END);
		NEW.event_seq := n;
		NEW.event_gen := NEW.generation;
		NEW.event_how := NULL;
		RETURN NEW;
	END IF;
	e_save := NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.saved_generation = NEW.generation
		AND NEW.saved_at IS DISTINCT FROM OLD.saved_at;
	e_hold := NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.hold_generation = NEW.generation
		AND OLD.hold_generation IS DISTINCT FROM OLD.generation;
	e_op := (NEW.paused_at IS NOT NULL AND (OLD.paused_at IS NULL OR NEW.pause_reason IS DISTINCT FROM OLD.pause_reason
			OR NEW.paused_by IS DISTINCT FROM OLD.paused_by))
		OR (OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL)
		OR (NEW.stop_generation = NEW.generation AND (OLD.stop_generation IS DISTINCT FROM NEW.stop_generation
			OR NEW.stop_reason IS DISTINCT FROM OLD.stop_reason OR NEW.stop_by IS DISTINCT FROM OLD.stop_by));
	IF pend AND (e_save OR e_op) THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
		VALUES (NEW.target_id, n, COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder,
			OLD.event_how, p_from);
		pend := false;
		NEW.event_how := NULL;
	END IF;
	IF e_save THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder)
		VALUES (NEW.target_id, n, clock_timestamp(), 'saved', NEW.generation, NEW.holder);
	END IF;
	IF e_hold AND pend THEN
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation, detail, ended_at, end_cause)
		VALUES (NEW.target_id, n + 1, COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder,
			OLD.event_how, p_from, NEW.failure, clock_timestamp(), COALESCE(NEW.end_cause, 'released'));
		n := n + 2;
	ELSIF e_hold THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, detail)
		VALUES (NEW.target_id, n, clock_timestamp(), 'ended', NEW.generation, NEW.holder, COALESCE(NEW.end_cause, 'released'),
			NEW.acquired_at, NEW.failure);
	END IF;
	IF e_hold THEN
		NEW.event_gen := NEW.generation;
		NEW.event_how := NULL;
	END IF;
	IF NEW.paused_at IS NOT NULL AND (OLD.paused_at IS NULL OR NEW.pause_reason IS DISTINCT FROM OLD.pause_reason
		OR NEW.paused_by IS DISTINCT FROM OLD.paused_by) THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
		VALUES (NEW.target_id, n, clock_timestamp(), 'paused', NEW.generation, NEW.holder, NEW.paused_by, NEW.pause_reason);
	ELSIF OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator)
		VALUES (NEW.target_id, n, clock_timestamp(), 'resumed', NEW.generation, NEW.holder, NEW.paused_by);
	END IF;
	IF NEW.stop_generation = NEW.generation AND (OLD.stop_generation IS DISTINCT FROM NEW.stop_generation
		OR NEW.stop_reason IS DISTINCT FROM OLD.stop_reason OR NEW.stop_by IS DISTINCT FROM OLD.stop_by) THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
		VALUES (NEW.target_id, n, clock_timestamp(), 'stop_requested', NEW.stop_generation, NEW.holder, NEW.stop_by,
			NEW.stop_reason);
	END IF;
	IF NOT pend AND NEW.lease_token <> '00000000-0000-0000-0000-000000000000'
		AND NEW.event_gen IS DISTINCT FROM (NEW.generation + (CASE WHEN NEW.released_at IS NULL THEN 0 ELSE 1 END)) THEN
		NEW.event_gen := NEW.generation + CASE WHEN NEW.released_at IS NULL THEN 0 ELSE 1 END;
		NEW.event_how := CASE WHEN NEW.released_at IS NOT NULL THEN 'released' END;
	END IF;
	NEW.event_seq := n;
	RETURN NEW;
END
$$;

-- The triggers, made only when missing (an earlier version's are replaced).
-- The WHEN clause of the trigger on UPDATE is checked on the row without
-- calling the function: a heartbeat, which changes only updated_at, never
-- calls it once the row's record is set (the function's first call sets
-- it), nor does the acquisition of a row that its holder released, which
-- stays pending. To stop keeping history:
--   DROP TRIGGER job_lease_history_update ON job_lease;
--   DROP TRIGGER job_lease_history_ins ON job_lease;
--   DROP TRIGGER job_lease_history_del ON job_lease;
--   DROP FUNCTION job_lease_history(), job_lease_history_new(), job_lease_history_gone(), job_lease_history_top(varchar);
-- (and DROP TABLE job_lease_event to delete the events too; an acquisition
-- pending then is written only if the triggers are back before its
-- generation ends).
DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_insert') THEN
		DROP TRIGGER job_lease_history_insert ON job_lease;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_ins') THEN
		CREATE TRIGGER job_lease_history_ins BEFORE INSERT ON job_lease
		FOR EACH ROW WHEN (NEW.released_at IS NULL) EXECUTE FUNCTION job_lease_history_new();
	END IF;
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_del'
		AND position('released_at' in pg_get_triggerdef(oid)) = 0) THEN
		DROP TRIGGER job_lease_history_del ON job_lease;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_del') THEN
		CREATE TRIGGER job_lease_history_del AFTER DELETE ON job_lease
		FOR EACH ROW WHEN (OLD.event_how IS NOT NULL AND OLD.event_gen = OLD.generation AND OLD.released_at IS NULL)
		EXECUTE FUNCTION job_lease_history_gone();
	END IF;
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_update'
		AND position('event_gen' in pg_get_triggerdef(oid)) = 0) THEN
		DROP TRIGGER job_lease_history_update ON job_lease;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_update') THEN
		CREATE TRIGGER job_lease_history_update BEFORE UPDATE ON job_lease
		FOR EACH ROW WHEN (NEW.updated_at = OLD.updated_at OR OLD.event_gen IS DISTINCT FROM NEW.generation
			OR NEW.hold_generation IS DISTINCT FROM OLD.hold_generation)
		EXECUTE FUNCTION job_lease_history();
	END IF;
END
$$;
