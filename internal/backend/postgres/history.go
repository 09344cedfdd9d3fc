package postgres

import (
	"strings"

	"github.com/gormlease/gormlease/internal/backend"
)

// HistorySchema is the DDL of the history, the optional part of
// docs/schema.sql that Migrate runs with history: the event table, keyed by
// target and seq (nothing reads it by time: Prune walks the key), the lease
// table's event_seq, event_gen and event_how, and the triggers on the lease
// table that write the events, in the transaction of the change each
// records: in the statement that makes it, or, for an acquisition left
// pending (below), in the lease row until the row's next event is written
// (docs/design.md, section History).
//
// The trigger on UPDATE runs job_lease_history() before the row is
// written, once the statement holds the row's lock, when its WHEN clause,
// which PostgreSQL checks on the row without calling the function, lets it
// through: a statement that leaves updated_at as it was (a release, a save,
// an operator's step, a Do waiter's mark, which writes nothing), changes
// the hold, or gives the row a generation other than event_gen. event_gen
// is the generation that the row's statements may give it without calling
// the function: the one held, and, once the row is released (the function
// has written its release, or ended a minimum hold's row), the next. So a heartbeat calls it only on a row that has no such record
// (made before the history, or changed while the triggers were gone), once,
// and the common acquisition, of a row that its holder released, never:
// that acquisition is pending (event_how, how it began, is set while it is
// not written), and the statement that next writes an event of the row
// writes it first. A generation that nothing interrupts, acquired and then
// ended, so costs one call and one row: its end writes both events as one
// row, which History reads as two (the acquisition at seq, the end at
// seq + 1). An acquire that inserts the row calls job_lease_history_new()
// (BEFORE INSERT), which makes the acquisition pending as new; a row
// deleted while pending calls job_lease_history_gone(), which writes it.
//
// After a minimum hold begins, event_gen stays the generation held: the
// acquisition after the hold takes an unreleased row, and the function
// writes it. Each call of the function that leaves no acquisition pending
// sets the record (event_gen, event_how) of a row that an acquire has
// taken as if the function had written its last acquisition (held) or
// release (released); a row that Pause or SetSlots made keeps none until
// an acquire takes it, which calls the function and is written as new.
//
// The function numbers its events from the row's event_seq, which it
// advances in the row it writes (no read of the event table; the row's
// lock serialises every writer of the target's events); a row without one
// (made before the history, or by Pause or SetSlots) gets it from the
// target's last event, by an index probe of the primary key
// (job_lease_history_top()), as job_lease_history_new() does for a row
// that an acquire inserts. A lease taken over while unreleased is judged
// by the timeout its holder recorded, on the database's clock, as the
// acquire judges it: expired, or seized while still live.
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
	ended_at        timestamptz,
	end_cause       varchar(16),
	PRIMARY KEY (target_id, seq)
);
ALTER TABLE job_lease_event ADD COLUMN IF NOT EXISTS ended_at timestamptz, ADD COLUMN IF NOT EXISTS end_cause varchar(16);
ALTER TABLE job_lease ADD COLUMN IF NOT EXISTS event_seq bigint, ADD COLUMN IF NOT EXISTS event_gen bigint,
	ADD COLUMN IF NOT EXISTS event_how varchar(16);
CREATE OR REPLACE FUNCTION job_lease_history_top(key varchar) RETURNS bigint LANGUAGE sql STABLE AS $$
	SELECT COALESCE((SELECT e.seq + CASE WHEN e.end_cause IS NULL THEN 0 ELSE 1 END FROM job_lease_event e
		WHERE e.target_id = key ORDER BY e.seq DESC LIMIT 1), 0)
$$;
CREATE OR REPLACE FUNCTION job_lease_history_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.event_seq := job_lease_history_top(NEW.target_id);
	NEW.event_gen := NEW.generation;
	NEW.event_how := 'new';
	RETURN NEW;
END
$$;
CREATE OR REPLACE FUNCTION job_lease_history_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
	VALUES (OLD.target_id, COALESCE(OLD.event_seq, job_lease_history_top(OLD.target_id)) + 1,
		COALESCE(OLD.acquired_at, OLD.updated_at), 'acquired', OLD.generation, OLD.holder, OLD.event_how,
		CASE WHEN OLD.event_how <> 'new' THEN OLD.generation - 1 END);
	RETURN NULL;
END
$$;
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
$$;`

// pendingEventSQL reads a row's pending acquisition (see HistorySchema) as
// the event that its trigger will write: backend.Common.History's query of
// the lease row.
const pendingEventSQL = `SELECT target_id, event_seq + 1, COALESCE(acquired_at, updated_at), 'acquired', generation, holder,
	event_how, CASE WHEN event_how <> 'new' THEN generation - 1 END,
	CAST(NULL AS timestamptz), NULL, NULL, CAST(NULL AS timestamptz), NULL
FROM job_lease WHERE event_how IS NOT NULL AND event_gen = generation AND released_at IS NULL AND target_id = ?`

// historySQL is HistorySchema for tables t. The triggers take their schema from their table, so their names are never
// qualified; the function's and the tables' are.
func historySQL(t backend.Tables) string {
	var pairs []string
	// The longer name first: a replacement takes the first name that
	// matches where it starts.
	for _, name := range []string{"_history_insert", "_history_update", "_history_ins", "_history_del"} {
		short, _ := backend.Unqualified(t.Lease + name)
		pairs = append(pairs, t.Lease+name, short)
	}
	return strings.NewReplacer(pairs...).Replace(t.Expand(HistorySchema))
}
