package mysql

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// eventTable is the history's event table (the optional part of
// docs/schema-mysql.sql), keyed by target and seq: nothing reads it by
// time (Prune walks the key).
const eventTable = `CREATE TABLE IF NOT EXISTS job_lease_event (
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
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`

// insertTrigger and updateTrigger write the history's events, each in the
// statement that makes the change it records, as PostgreSQL's
// job_lease_history() does (see docs/design.md, section History). MySQL
// has no WHEN clause: the body's first IF lets the changes that no event
// is about, a heartbeat's among them, through at the cost of the
// comparisons alone. seq is 1 + the target's last seq, read by a
// consistent read: the statement holds the lease row's lock, and every
// earlier writer of the target's events has committed.
const (
	insertTrigger = `CREATE TRIGGER job_lease_history_insert AFTER INSERT ON job_lease FOR EACH ROW
BEGIN
	IF NEW.released_at IS NULL THEN
		INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how)
		SELECT NEW.target_id, COALESCE(MAX(seq), 0) + 1, UTC_TIMESTAMP(6), 'acquired', NEW.generation, NEW.holder, 'new'
		FROM job_lease_event WHERE target_id = NEW.target_id;
	END IF;
END`

	updateTrigger = `CREATE TRIGGER job_lease_history_update AFTER UPDATE ON job_lease FOR EACH ROW
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
END`
)

// addedEventColumns are the columns of the event table that Migrate adds
// to one made before them. MySQL writes them NULL: only PostgreSQL's
// trigger writes a generation's two events as one row (backend.Event).
var addedEventColumns = []backend.Column{
	{Name: "ended_at", DDL: "datetime(6) NULL"},
	{Name: "end_cause", DDL: "varchar(16) NULL"},
}

// eventDDL is eventTable for tables t.
func eventDDL(t backend.Tables) string { return t.Expand(eventTable) }

// The errors that CREATE TRIGGER meets.
const (
	errTriggerExists      = 1359 // ER_TRG_ALREADY_EXISTS
	errNeedSuper          = 1419 // ER_BINLOG_CREATE_ROUTINE_NEED_SUPER
	errCommandDenied      = 1142 // ER_TABLEACCESS_DENIED_ERROR: no TRIGGER privilege
	errSpecificAccessDeny = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR
)

// ErrTriggerPrivilege is the error of a migration with history that the
// server refused to create the triggers for: without the TRIGGER
// privilege, or, with binary logging on, without SUPER (or
// log_bin_trust_function_creators=1). docs/operating.md says what to grant.
var ErrTriggerPrivilege = errors.New("the server refused to create the history's triggers")

// migrateHistory creates the event table and the triggers of tables t,
// each trigger only when the catalog lacks it: MySQL 8.0 before 8.0.29 has
// no CREATE TRIGGER IF NOT EXISTS, and a trigger that a concurrent
// migration made meanwhile (error 1359) is no error.
func (b *Backend) migrateHistory(ctx context.Context, db *gorm.DB, t backend.Tables) error {
	if err := db.Exec(b.eventDDL).Error; err != nil {
		return err
	}
	if err := backend.AddMissingColumns(db, t.Event(), addedEventColumns); err != nil {
		return err
	}
	table, schema := backend.Unqualified(t.Lease)
	for _, trig := range []struct{ name, ddl string }{
		{table + "_history_insert", t.Expand(insertTrigger)},
		{table + "_history_update", t.Expand(updateTrigger)},
	} {
		var n int64
		if _, err := backend.QueryRow(ctx, db, "SELECT COUNT(*) FROM information_schema.triggers"+
			" WHERE trigger_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND trigger_name = ?",
			[]any{strings.TrimSuffix(schema, "."), trig.name}, &n); err != nil {
			return fmt.Errorf("look for trigger %s: %w", trig.name, err)
		}
		if n > 0 {
			continue
		}
		err := db.WithContext(ctx).Exec(trig.ddl).Error
		switch number, _ := backend.MySQLErrorNumber(err); {
		case err == nil, number == errTriggerExists:
		case number == errNeedSuper:
			return fmt.Errorf("%w: with binary logging on, CREATE TRIGGER needs the SUPER privilege, or the server's "+
				"log_bin_trust_function_creators=1 (docs/operating.md, section History): %w", ErrTriggerPrivilege, err)
		case number == errCommandDenied, number == errSpecificAccessDeny:
			return fmt.Errorf("%w: grant the TRIGGER privilege on the lease table's database to the migrating user "+
				"(docs/operating.md, section History): %w", ErrTriggerPrivilege, err)
		default:
			return fmt.Errorf("create trigger %s: %w", trig.name, err)
		}
	}
	return nil
}
