-- gormlease tables for MySQL 8 and MariaDB 10.6 or later (InnoDB).
-- gormlease.AutoMigrate runs these same statements; use this file when
-- migrations are run by a tool of your own.
--
-- The DSN must set parseTime=true and keep loc=UTC (the driver's default):
--   user:password@tcp(host:3306)/dbname?parseTime=true
--
-- target_id is varbinary(255): target IDs are compared byte for byte, as on
-- PostgreSQL. A utf8mb4 varchar would compare under a collation that ignores
-- case and trailing spaces, so "a", "A" and "a " would share one lease. Up to
-- 255 bytes of UTF-8 (see gormlease.JobLease.TargetID); longer IDs are refused
-- before anything is written. The key fits every InnoDB row format.
--
-- The times are datetime(6) in UTC, written only by the database's
-- UTC_TIMESTAMP(6), never by the application. job_result.data is json
-- (on MariaDB, longtext with a json_valid check).
--
-- saved_generation and saved_at record the last generation that saved a
-- result, in the fenced commit's own transaction; failure keeps the start of
-- the error of a generation that ended without saving; timeout_ms is the
-- lease timeout that the last acquisition asked for (NULL in rows written
-- before it existed, which count as expired since updated_at). A job_lease
-- table made by an earlier version lacks them; AutoMigrate adds them, or run
-- (leaving out those it has):
--   ALTER TABLE job_lease ADD COLUMN saved_generation bigint NULL,
--     ADD COLUMN saved_at datetime(6) NULL, ADD COLUMN failure varchar(255) NULL,
--     ADD COLUMN timeout_ms bigint NULL, ADD COLUMN slots int NULL,
--     ADD COLUMN hold_generation bigint NULL, ADD COLUMN paused_at datetime(6) NULL,
--     ADD COLUMN pause_reason varchar(255) NULL, ADD COLUMN stop_generation bigint NULL,
--     ADD COLUMN stop_reason varchar(255) NULL, ADD COLUMN acquired_at datetime(6) NULL,
--     ADD COLUMN paused_by varchar(255) NULL, ADD COLUMN stop_by varchar(255) NULL,
--     ADD COLUMN end_cause varchar(16) NULL, ADD COLUMN ended_by varchar(255) NULL;
--
-- slots is, in the row of a slot of a semaphore (WithSlots), the
-- semaphore's count, and NULL in every other row. Only slotted targets use
-- it: a table without it still serves the others.
--
-- hold_generation is the generation whose holder ended its work and left
-- the row held, unrenewed, for the rest of its minimum hold (WithMinHold,
-- Repository.Hold); while it equals generation, the row reads as released,
-- not expired, once that hold has passed. A later acquisition raises the
-- generation, so it needs no clearing.
--
-- paused_at and pause_reason record an operator's Repository.Pause: while
-- paused_at is set, no acquisition takes the row (Resume clears both, and
-- writes who resumed into paused_by).
-- stop_generation and stop_reason record Repository.RequestStop: the holder
-- of that generation stops at its next heartbeat; a later acquisition raises
-- the generation, so a request never applies to a later lease.
--
-- acquired_at is the database time at which the current generation was
-- acquired ("held since"), written by the acquire's own statement;
-- paused_by and stop_by name the operator who paused the target and who
-- asked the holder to stop (admin.Operator.As).
--
-- end_cause says how the last generation ended (saved, failed, forced, ...),
-- written by the statement that ended it and cleared by the next
-- acquisition; ended_by names the operator who forced the release. The
-- history's triggers (below) copy them into the ended event.
--
-- job_lease_paused (the lease table's name with _paused) indexes paused_at,
-- so that an operator's list of the paused targets (admin's StatePaused)
-- reads the paused rows only, not the whole table. InnoDB writes it when
-- paused_at changes (Pause, Resume) and when a row is inserted or deleted (a
-- target's first acquire, Prune), never on a heartbeat, a release or an
-- acquire of an existing row. A table made by an earlier version lacks it;
-- AutoMigrate adds it, or run:
--   CREATE INDEX job_lease_paused ON job_lease (paused_at);
--
-- job_lease_floor holds one row: the highest generation that Prune ever
-- deleted. A target without a row starts above it, so that its generation
-- still increases after its row was pruned. Its name is the lease table's
-- with _floor appended. Delete lease rows with Prune, not by hand.

CREATE TABLE IF NOT EXISTS job_lease (
	target_id   varbinary(255) NOT NULL,
	lease_token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	generation  bigint NOT NULL,
	holder      varchar(255) NOT NULL DEFAULT '',
	updated_at  datetime(6) NOT NULL,
	released_at datetime(6) NULL,
	saved_generation bigint NULL,
	saved_at    datetime(6) NULL,
	failure     varchar(255) NULL,
	timeout_ms  bigint NULL,
	slots       int NULL,
	hold_generation bigint NULL,
	paused_at   datetime(6) NULL,
	pause_reason varchar(255) NULL,
	stop_generation bigint NULL,
	stop_reason varchar(255) NULL,
	acquired_at datetime(6) NULL,
	paused_by   varchar(255) NULL,
	stop_by     varchar(255) NULL,
	end_cause   varchar(16) NULL,
	ended_by    varchar(255) NULL,
	PRIMARY KEY (target_id),
	KEY job_lease_paused (paused_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS job_lease_floor (
	id         smallint NOT NULL,
	generation bigint NOT NULL,
	PRIMARY KEY (id)
) ENGINE=InnoDB;

INSERT IGNORE INTO job_lease_floor (id, generation) VALUES (1, 0);

CREATE TABLE IF NOT EXISTS job_result (
	target_id  varbinary(255) NOT NULL,
	data       json NOT NULL,
	generation bigint NOT NULL,
	updated_at datetime(6) NOT NULL,
	PRIMARY KEY (target_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Optional: the history of each target (AutoMigrate with
-- gormlease.WithHistory(), or `gormlease migrate -history`). Leave this part
-- out for a table that keeps no history. job_lease_event holds one row per
-- event of a lease row: its acquisitions, the end of each generation, the
-- fenced saves and the operators' actions, numbered by seq from 1 per
-- target (docs/design.md, section History). Its name is the lease table's
-- with _event appended; it has no index by time: Prune walks its key.
-- ended_at and end_cause stay NULL here: only PostgreSQL's trigger writes a
-- generation's acquisition and end as one row. (AutoMigrate adds the two to
-- an event table made before them.)
CREATE TABLE IF NOT EXISTS job_lease_event (
	target_id       varbinary(255) NOT NULL,
	seq             bigint NOT NULL,
	at              datetime(6) NOT NULL,
	kind            varchar(16) NOT NULL,
	generation      bigint NOT NULL,
	holder          varchar(255) NOT NULL DEFAULT '',
	how             varchar(16) NULL,
	from_generation bigint NULL,
	acquired_at     datetime(6) NULL,
	operator        varchar(255) NULL,
	detail          varchar(255) NULL,
	ended_at        datetime(6) NULL,
	end_cause       varchar(16) NULL,
	PRIMARY KEY (target_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The triggers that write the events, each in the statement that makes the
-- change it records (docs/design.md, section History). MySQL has no WHEN
-- clause: the first IF of the trigger on UPDATE lets a heartbeat, which
-- changes only updated_at, through. Creating them needs the TRIGGER
-- privilege and, with binary logging on, SUPER or
-- log_bin_trust_function_creators=1 (docs/operating.md, section History).
-- Their bodies hold semicolons: the mysql client needs the DELIMITER lines.
-- To stop keeping history:
--   DROP TRIGGER job_lease_history_update; DROP TRIGGER job_lease_history_insert;
DELIMITER //
CREATE TRIGGER job_lease_history_insert AFTER INSERT ON job_lease FOR EACH ROW
BEGIN
	IF NEW.released_at IS NULL THEN
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how)
		SELECT NEW.target_id, COALESCE(MAX(seq), 0) + 1, UTC_TIMESTAMP(6), 'acquired', NEW.generation, NEW.holder, 'new'
		FROM job_lease_event WHERE target_id = NEW.target_id;
	END IF;
END
//
CREATE TRIGGER job_lease_history_update AFTER UPDATE ON job_lease FOR EACH ROW
BEGIN
	DECLARE v_seq BIGINT;
	DECLARE v_how VARCHAR(16);
	DECLARE v_live BOOLEAN;
	IF NEW.generation <> OLD.generation
		OR NOT (NEW.released_at <=> OLD.released_at)
		OR NOT (NEW.saved_at <=> OLD.saved_at)
		OR NOT (NEW.hold_generation <=> OLD.hold_generation)
		OR NOT (NEW.paused_at <=> OLD.paused_at)
		OR NOT (NEW.pause_reason <=> OLD.pause_reason)
		OR NOT (NEW.paused_by <=> OLD.paused_by)
		OR NOT (NEW.stop_generation <=> OLD.stop_generation)
		OR NOT (NEW.stop_reason <=> OLD.stop_reason)
		OR NOT (NEW.stop_by <=> OLD.stop_by) THEN
		SELECT COALESCE(MAX(seq), 0) INTO v_seq FROM job_lease_event WHERE target_id = NEW.target_id;
		IF NEW.generation <> OLD.generation AND NEW.released_at IS NULL THEN
			SET v_live = OLD.timeout_ms IS NOT NULL
				AND OLD.updated_at >= UTC_TIMESTAMP(6) - INTERVAL OLD.timeout_ms * 1000 MICROSECOND;
			SET v_how = CASE WHEN OLD.lease_token = '00000000-0000-0000-0000-000000000000' THEN 'new'
				WHEN OLD.released_at IS NOT NULL THEN 'released'
				WHEN v_live THEN 'seized'
				WHEN OLD.hold_generation = OLD.generation THEN 'released'
				ELSE 'expired' END;
			IF OLD.released_at IS NULL AND NOT (OLD.hold_generation <=> OLD.generation) THEN
				SET v_seq = v_seq + 1;
				INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at)
				VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'ended', OLD.generation, OLD.holder, v_how, OLD.acquired_at);
			END IF;
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'acquired', NEW.generation, NEW.holder, v_how,
				CASE WHEN v_how <> 'new' THEN OLD.generation END);
		END IF;
		IF NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.saved_generation = NEW.generation
			AND NOT (NEW.saved_at <=> OLD.saved_at) THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'saved', NEW.generation, NEW.holder);
		END IF;
		IF NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.hold_generation = NEW.generation
			AND NOT (OLD.hold_generation <=> OLD.generation) THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, detail)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'ended', NEW.generation, NEW.holder, COALESCE(NEW.end_cause, 'released'),
				NEW.acquired_at, NEW.failure);
		END IF;
		IF OLD.released_at IS NULL AND NEW.released_at IS NOT NULL AND NOT (OLD.hold_generation <=> OLD.generation) THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, operator, detail)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'ended', OLD.generation, OLD.holder,
				COALESCE(NEW.end_cause, CASE WHEN NEW.failure IS NOT NULL THEN 'failed'
					WHEN NEW.saved_generation = OLD.generation THEN 'saved' ELSE 'released' END),
				OLD.acquired_at, NEW.ended_by, NEW.failure);
		END IF;
		IF NEW.paused_at IS NOT NULL AND (OLD.paused_at IS NULL OR NOT (NEW.pause_reason <=> OLD.pause_reason)
			OR NOT (NEW.paused_by <=> OLD.paused_by)) THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'paused', NEW.generation, NEW.holder, NEW.paused_by, NEW.pause_reason);
		ELSEIF OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'resumed', NEW.generation, NEW.holder, NEW.paused_by);
		END IF;
		IF NEW.stop_generation = NEW.generation AND (NOT (OLD.stop_generation <=> NEW.stop_generation)
			OR NOT (NEW.stop_reason <=> OLD.stop_reason) OR NOT (NEW.stop_by <=> OLD.stop_by)) THEN
			SET v_seq = v_seq + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
			VALUES (NEW.target_id, v_seq, UTC_TIMESTAMP(6), 'stop_requested', NEW.stop_generation, NEW.holder, NEW.stop_by,
				NEW.stop_reason);
		END IF;
	END IF;
END
//
DELIMITER ;
