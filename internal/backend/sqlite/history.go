package sqlite

import (
	"strings"

	"github.com/gormlease/gormlease/internal/backend"
)

// eventSchema is the DDL of the history (the optional part of
// docs/sqlite.md): the event table, keyed by target and seq (nothing reads
// it by time: Prune walks the key), and the triggers on the lease table that write
// it, each in the statement that makes the change it records, as
// PostgreSQL's job_lease_history() does (see docs/design.md, section
// History). The WHEN clause of the trigger on UPDATE lets the changes that
// no event is about, a heartbeat's among them, through without running its
// statements. Each statement numbers its event from the target's last one
// (seq); the statement holds the database's write lock. 'now' reads the
// same time throughout one statement, its triggers included, so that a
// lease taken over is judged expired, or seized while still live, at the
// time the acquire judged it.
const eventSchema = `
CREATE TABLE IF NOT EXISTS job_lease_event (
	target_id       varchar(255) NOT NULL,
	seq             integer      NOT NULL,
	at              datetime     NOT NULL,
	kind            varchar(16)  NOT NULL,
	generation      integer      NOT NULL,
	holder          varchar(255) NOT NULL DEFAULT '',
	how             varchar(16),
	from_generation integer,
	acquired_at     datetime,
	operator        text,
	detail          text,
	ended_at        datetime,
	end_cause       varchar(16),
	PRIMARY KEY (target_id, seq)
);
CREATE TRIGGER IF NOT EXISTS job_lease_history_insert AFTER INSERT ON job_lease
FOR EACH ROW WHEN NEW.released_at IS NULL
BEGIN
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how)
	VALUES (NEW.target_id, ` + nextSeq + `, ` + now + `, 'acquired', NEW.generation, NEW.holder, 'new');
END;
CREATE TRIGGER IF NOT EXISTS job_lease_history_update AFTER UPDATE ON job_lease
FOR EACH ROW WHEN NEW.generation <> OLD.generation
	OR NEW.released_at IS NOT OLD.released_at
	OR NEW.saved_at IS NOT OLD.saved_at
	OR NEW.hold_generation IS NOT OLD.hold_generation
	OR NEW.paused_at IS NOT OLD.paused_at
	OR NEW.pause_reason IS NOT OLD.pause_reason
	OR NEW.paused_by IS NOT OLD.paused_by
	OR NEW.stop_generation IS NOT OLD.stop_generation
	OR NEW.stop_reason IS NOT OLD.stop_reason
	OR NEW.stop_by IS NOT OLD.stop_by
BEGIN
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'ended', OLD.generation, OLD.holder, ` + takeoverHow + `, OLD.acquired_at
	WHERE NEW.generation <> OLD.generation AND NEW.released_at IS NULL AND OLD.released_at IS NULL
	  AND OLD.hold_generation IS NOT OLD.generation;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'acquired', NEW.generation, NEW.holder, ` + takeoverHow + `,
		CASE WHEN OLD.lease_token <> '00000000-0000-0000-0000-000000000000' THEN OLD.generation END
	WHERE NEW.generation <> OLD.generation AND NEW.released_at IS NULL;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'saved', NEW.generation, NEW.holder
	WHERE NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.saved_generation = NEW.generation
	  AND NEW.saved_at IS NOT OLD.saved_at;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, detail)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'ended', NEW.generation, NEW.holder, COALESCE(NEW.end_cause, 'released'),
		NEW.acquired_at, NEW.failure
	WHERE NEW.released_at IS NULL AND NEW.generation = OLD.generation AND NEW.hold_generation = NEW.generation
	  AND OLD.hold_generation IS NOT OLD.generation;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, acquired_at, operator, detail)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'ended', OLD.generation, OLD.holder,
		COALESCE(NEW.end_cause, CASE WHEN NEW.failure IS NOT NULL THEN 'failed'
			WHEN NEW.saved_generation = OLD.generation THEN 'saved' ELSE 'released' END),
		OLD.acquired_at, NEW.ended_by, NEW.failure
	WHERE OLD.released_at IS NULL AND NEW.released_at IS NOT NULL AND OLD.hold_generation IS NOT OLD.generation;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'paused', NEW.generation, NEW.holder, NEW.paused_by, NEW.pause_reason
	WHERE NEW.paused_at IS NOT NULL AND (OLD.paused_at IS NULL OR NEW.pause_reason IS NOT OLD.pause_reason
		OR NEW.paused_by IS NOT OLD.paused_by);
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'resumed', NEW.generation, NEW.holder, NEW.paused_by
	WHERE OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL;
	INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, operator, detail)
	SELECT NEW.target_id, ` + nextSeq + `, ` + now + `, 'stop_requested', NEW.stop_generation, NEW.holder, NEW.stop_by, NEW.stop_reason
	WHERE NEW.stop_generation = NEW.generation AND (OLD.stop_generation IS NOT NEW.stop_generation
		OR NEW.stop_reason IS NOT OLD.stop_reason OR NEW.stop_by IS NOT OLD.stop_by);
END;`

// addedEventColumns are the columns of the event table that Migrate adds
// to one made before them. SQLite writes them NULL: only PostgreSQL's
// trigger writes a generation's two events as one row (backend.Event).
var addedEventColumns = []backend.Column{
	{Name: "ended_at", DDL: "datetime"},
	{Name: "end_cause", DDL: "varchar(16)"},
}

// nextSeq is the seq of a target's next event, in a trigger's statement:
// one probe of the primary key, from the target's end.
const nextSeq = `(COALESCE((SELECT seq FROM job_lease_event WHERE target_id = NEW.target_id ORDER BY seq DESC LIMIT 1), 0) + 1)`

// takeoverHow is how an acquisition took the row over, in the trigger's
// statements: new (a row that no acquire had taken: Pause's or SetSlots'),
// released, seized while still live, released when only a minimum hold
// was left of it, or expired.
const takeoverHow = `CASE WHEN OLD.lease_token = '00000000-0000-0000-0000-000000000000' THEN 'new'
		WHEN OLD.released_at IS NOT NULL THEN 'released'
		WHEN OLD.timeout_ms IS NOT NULL AND (julianday('now') - julianday(OLD.updated_at)) * 86400000.0 <= OLD.timeout_ms THEN 'seized'
		WHEN OLD.hold_generation = OLD.generation THEN 'released'
		ELSE 'expired' END`

// eventSQL is eventSchema for tables t. SQLite qualifies the names of the
// triggers, not their table's, with the schema, and a
// trigger's statements name tables unqualified.
func eventSQL(t backend.Tables) string {
	lease, _ := backend.Unqualified(t.Lease)
	event, _ := backend.Unqualified(t.Event())
	return strings.NewReplacer(
		" ON "+t.Lease+"\n", " ON "+lease+"\n",
		"INTO "+t.Event()+" ", "INTO "+event+" ",
		"FROM "+t.Event()+" ", "FROM "+event+" ",
	).Replace(t.Expand(eventSchema))
}
