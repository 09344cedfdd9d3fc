package postgres

import (
	"strings"

	"github.com/gormlease/gormlease/internal/backend"
)

// HistorySchema is the DDL of the history, the optional part of
// docs/schema.sql that Migrate runs with history: the event table, keyed by
// target and seq (nothing reads it by time: Prune walks the key), the lease
// table's event_seq, and the triggers on the lease table that write the events,
// each in the statement that makes the change it records (docs/design.md,
// section History).
//
// The trigger on UPDATE runs job_lease_history() before the row is
// written, once the statement holds the row's lock, when its WHEN clause,
// which PostgreSQL checks on the row without calling the function, lets it
// through: a statement that changes the generation or the hold, or leaves
// updated_at as it was. A heartbeat, which changes updated_at alone, never
// calls it. The function numbers its events from the row's event_seq,
// which it advances in the row it writes (no read of the event table; the
// row's lock serialises every writer of the target's events); a row
// without one (made before the history, or by an INSERT) gets it from the
// target's last event, by an index probe of the primary key, as
// job_lease_history_new(), after the INSERT of a live row, numbers its
// one event. A lease taken over while unreleased is judged by the timeout
// its holder recorded, on the database's clock, as the acquire judges it:
// expired, or seized while still live. The common events, an acquisition
// and a release, return as soon as they are written.
//
// The triggers are made only when missing, so that a migration run again
// takes no lock on the lease table; CREATE OR REPLACE FUNCTION updates the
// functions in place.
const HistorySchema = `
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
ALTER TABLE job_lease ADD COLUMN IF NOT EXISTS event_seq bigint;
CREATE OR REPLACE FUNCTION job_lease_history_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how)
	SELECT NEW.target_id, COALESCE(max(e.seq), 0) + 1, clock_timestamp(), 'acquired', NEW.generation, NEW.holder, 'new'
	FROM job_lease_event e WHERE e.target_id = NEW.target_id;
	RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION job_lease_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	n     bigint := OLD.event_seq;
	v_how varchar(16);
BEGIN
	IF n IS NULL THEN
		SELECT COALESCE(max(e.seq), 0) INTO n FROM job_lease_event e WHERE e.target_id = NEW.target_id;
	END IF;
	IF NEW.generation <> OLD.generation AND NEW.released_at IS NULL THEN
		v_how := CASE WHEN OLD.lease_token = '00000000-0000-0000-0000-000000000000' THEN 'new'
			WHEN OLD.released_at IS NOT NULL THEN 'released'
			WHEN OLD.timeout_ms IS NOT NULL
				AND OLD.updated_at >= clock_timestamp() - OLD.timeout_ms * interval '1 millisecond' THEN 'seized'
			WHEN OLD.hold_generation = OLD.generation THEN 'released'
			ELSE 'expired' END;
		IF OLD.released_at IS NULL AND OLD.hold_generation IS DISTINCT FROM OLD.generation THEN
			n := n + 1;
			INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at)
			VALUES (NEW.target_id, n, clock_timestamp(), 'ended', OLD.generation, OLD.holder, v_how, OLD.acquired_at);
		END IF;
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
		VALUES (NEW.target_id, n, clock_timestamp(), 'acquired', NEW.generation, NEW.holder, v_how,
			CASE WHEN v_how <> 'new' THEN OLD.generation END);
		NEW.event_seq := n;
		RETURN NEW;
	END IF;
	IF OLD.released_at IS NULL AND NEW.released_at IS NOT NULL AND OLD.hold_generation IS DISTINCT FROM OLD.generation THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, operator, detail)
		VALUES (NEW.target_id, n, clock_timestamp(), 'ended', OLD.generation, OLD.holder,
			COALESCE(NEW.end_cause, CASE WHEN NEW.failure IS NOT NULL THEN 'failed'
				WHEN NEW.saved_generation = OLD.generation THEN 'saved' ELSE 'released' END),
			OLD.acquired_at, NEW.ended_by, NEW.failure);
		NEW.event_seq := n;
		RETURN NEW;
	END IF;
	IF NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.saved_generation = NEW.generation
		AND NEW.saved_at IS DISTINCT FROM OLD.saved_at THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder)
		VALUES (NEW.target_id, n, clock_timestamp(), 'saved', NEW.generation, NEW.holder);
	END IF;
	IF NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.hold_generation = NEW.generation
		AND OLD.hold_generation IS DISTINCT FROM OLD.generation THEN
		n := n + 1;
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, detail)
		VALUES (NEW.target_id, n, clock_timestamp(), 'ended', NEW.generation, NEW.holder, COALESCE(NEW.end_cause, 'released'),
			NEW.acquired_at, NEW.failure);
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
	NEW.event_seq := n;
	RETURN NEW;
END
$$;
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_insert') THEN
		CREATE TRIGGER job_lease_history_insert AFTER INSERT ON job_lease
		FOR EACH ROW WHEN (NEW.released_at IS NULL) EXECUTE FUNCTION job_lease_history_new();
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = CAST('job_lease' AS regclass) AND tgname = 'job_lease_history_update') THEN
		CREATE TRIGGER job_lease_history_update BEFORE UPDATE ON job_lease
		FOR EACH ROW WHEN (NEW.updated_at = OLD.updated_at OR NEW.generation <> OLD.generation
			OR NEW.hold_generation IS DISTINCT FROM OLD.hold_generation)
		EXECUTE FUNCTION job_lease_history();
	END IF;
END
$$;`

// historySQL is HistorySchema for tables t. The triggers take their schema from their table, so their names are never
// qualified; the function's and the tables' are.
func historySQL(t backend.Tables) string {
	insert, _ := backend.Unqualified(t.Lease + "_history_insert")
	update, _ := backend.Unqualified(t.Lease + "_history_update")
	return strings.NewReplacer(
		t.Lease+"_history_insert", insert,
		t.Lease+"_history_update", update,
	).Replace(t.Expand(HistorySchema))
}
