package history

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Result is one row of history_result: a result saved by a Run's saver,
// inside the fenced commit. Nothing in the table stops a second save of a
// generation: that is for Check to find.
type Result struct {
	Target string
	Gen    int64
	Token  string
	Value  string
	// At is the database's clock, in Unix microseconds, when the saver's
	// INSERT ran (after the fenced commit locked the lease row).
	At int64
}

// Change is one row of history_lease_log: one change of a lease row, with
// the row before (Old*) and after (New*), written by a trigger in the
// statement's own transaction, so it exists only if the change does.
// Times are the database's clock in Unix microseconds; Old* are zero for
// an insert, Released* zero when not released.
type Change struct {
	Insert                     bool
	Target                     string
	OldGen, NewGen             int64
	OldToken, NewToken         string
	OldHolder, NewHolder       string
	OldUpdated, NewUpdated     int64
	OldReleased, NewReleased   int64
	OldTimeoutMS, NewTimeoutMS int64
	// NewAcquired is the row's acquired_at after the change (0: NULL):
	// the acquisition's time, which its generation's ended event repeats.
	NewAcquired int64
	// At is when the change was made, read as it ran (not when its
	// statement or transaction started); 0 when the database cannot tell.
	At int64
}

// Takeover reports whether c started a new generation.
func (c Change) Takeover() bool { return c.Insert || c.NewGen != c.OldGen }

// schema is a database's statements for the history tables.
type schema struct {
	ddl []string
	// nowMicros is an SQL expression for the current time in Unix
	// microseconds, read when it is evaluated.
	nowMicros string
	// changes reads every Change, in order; or versions reads every
	// version of every lease row, by target and in order (target,
	// generation, token, holder, updated, released, timeout_ms,
	// acquired).
	changes, versions string
	// events reads every LeaseEvent, by target and seq.
	events string
}

func schemaOf(db *gorm.DB) (schema, error) {
	switch name := db.Dialector.Name(); name {
	case "postgres":
		return postgresSchema, nil
	case "mysql":
		return mysqlSchema, nil
	case "sqlite":
		return sqliteSchema, nil
	default:
		return schema{}, fmt.Errorf("history: no history schema for %s", name)
	}
}

// PostgreSQL: times as microseconds of the epoch.
const pgMicros = "CAST(extract(epoch FROM %s) * 1000000 AS bigint)"

var postgresSchema = schema{
	ddl: []string{
		`CREATE TABLE history_result (id bigserial PRIMARY KEY, target varchar(255) NOT NULL,
			generation bigint NOT NULL, token varchar(36) NOT NULL, value text NOT NULL, at_us bigint NOT NULL)`,
		`CREATE TABLE history_lease_log (seq bigserial PRIMARY KEY, op char(1) NOT NULL, target_id varchar(255) NOT NULL,
			old_generation bigint, new_generation bigint, old_token varchar(36), new_token varchar(36),
			old_holder varchar(255), new_holder varchar(255),
			old_updated_us bigint, new_updated_us bigint, old_released_us bigint, new_released_us bigint,
			old_timeout_ms bigint, new_timeout_ms bigint, new_acquired_us bigint, at_us bigint NOT NULL)`,
		`CREATE FUNCTION history_lease_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'INSERT' THEN
				INSERT INTO history_lease_log (op, target_id, new_generation, new_token, new_holder, new_updated_us, new_released_us,
					new_timeout_ms, new_acquired_us, at_us)
				VALUES ('I', NEW.target_id, NEW.generation, NEW.lease_token::text, NEW.holder, ` + fmt.Sprintf(pgMicros, "NEW.updated_at") + `,
					` + fmt.Sprintf(pgMicros, "NEW.released_at") + `, NEW.timeout_ms, ` + fmt.Sprintf(pgMicros, "NEW.acquired_at") + `,
					` + fmt.Sprintf(pgMicros, "clock_timestamp()") + `);
			ELSE
				INSERT INTO history_lease_log (op, target_id, old_generation, new_generation, old_token, new_token, old_holder, new_holder,
					old_updated_us, new_updated_us, old_released_us, new_released_us, old_timeout_ms, new_timeout_ms, new_acquired_us, at_us)
				VALUES ('U', NEW.target_id, OLD.generation, NEW.generation, OLD.lease_token::text, NEW.lease_token::text,
					OLD.holder, NEW.holder,
					` + fmt.Sprintf(pgMicros, "OLD.updated_at") + `, ` + fmt.Sprintf(pgMicros, "NEW.updated_at") + `,
					` + fmt.Sprintf(pgMicros, "OLD.released_at") + `, ` + fmt.Sprintf(pgMicros, "NEW.released_at") + `,
					OLD.timeout_ms, NEW.timeout_ms, ` + fmt.Sprintf(pgMicros, "NEW.acquired_at") + `, ` + fmt.Sprintf(pgMicros, "clock_timestamp()") + `);
			END IF;
			RETURN NULL;
		END $$`,
		`CREATE TRIGGER history_lease_log AFTER INSERT OR UPDATE ON job_lease
			FOR EACH ROW EXECUTE FUNCTION history_lease_log()`,
	},
	nowMicros: fmt.Sprintf(pgMicros, "clock_timestamp()"),
	changes: `SELECT op = 'I', target_id, COALESCE(old_generation, 0), COALESCE(new_generation, 0),
		COALESCE(old_token, ''), COALESCE(new_token, ''), COALESCE(old_holder, ''), COALESCE(new_holder, ''),
		COALESCE(old_updated_us, 0), COALESCE(new_updated_us, 0),
		COALESCE(old_released_us, 0), COALESCE(new_released_us, 0), COALESCE(old_timeout_ms, 0), COALESCE(new_timeout_ms, 0),
		COALESCE(new_acquired_us, 0), at_us FROM history_lease_log ORDER BY seq`,
	events: `SELECT target_id, seq, ` + fmt.Sprintf(pgMicros, "at") + `, kind, generation, holder, COALESCE(how, ''),
		COALESCE(from_generation, 0), COALESCE(` + fmt.Sprintf(pgMicros, "acquired_at") + `, 0), COALESCE(operator, ''),
		COALESCE(detail, ''), COALESCE(` + fmt.Sprintf(pgMicros, "ended_at") + `, 0), COALESCE(end_cause, '')
		FROM job_lease_event` + pendingEvents + ` ORDER BY target_id, seq`,
}

// pendingEvents reads, on PostgreSQL, the acquisitions that the history's
// trigger left pending in the lease rows (event_how set while event_gen is
// the generation of an unreleased row), as the events that it will write
// (docs/design.md, History).
var pendingEvents = `
		UNION ALL SELECT target_id, event_seq + 1, ` + fmt.Sprintf(pgMicros, "COALESCE(acquired_at, updated_at)") + `, 'acquired',
		generation, holder, event_how, CASE WHEN event_how = 'new' THEN 0 ELSE generation - 1 END, 0, '', '', 0, ''
		FROM job_lease WHERE event_how IS NOT NULL AND event_gen = generation AND released_at IS NULL`

// MariaDB: no trigger, since any trigger on job_lease makes the server
// report 0 as the insert ID of the acquire's statements, by which
// gormlease reads the new generation (see docs/reliability.md). The lease
// table is system-versioned instead: MariaDB keeps every version of every
// row, and the Changes are consecutive versions. The versioning is
// transaction-precise (its bounds are transaction IDs): with timestamps,
// MariaDB drops the version a fenced commit wrote when the takeover that
// waited for its lock had begun earlier, and a release goes missing. A
// version's bounds do not say when its change was made, so these Changes
// have no At, and the versions are put in order by what the protocol
// orders: the generation, then the renewals, then the release. The
// datetime(6) columns hold UTC, so their microseconds from the epoch are a
// plain difference; SYSDATE(6), unlike UTC_TIMESTAMP(6), is read when it
// is evaluated, in the session's zone, which UNIX_TIMESTAMP undoes.
const myMicros = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', %s)"

var mysqlSchema = schema{
	ddl: []string{
		`CREATE TABLE history_result (id bigint NOT NULL AUTO_INCREMENT PRIMARY KEY, target varbinary(255) NOT NULL,
			generation bigint NOT NULL, token char(36) NOT NULL, value text NOT NULL, at_us bigint NOT NULL) ENGINE=InnoDB`,
		`ALTER TABLE job_lease ADD COLUMN history_start BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE,
			ADD COLUMN history_end BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE,
			ADD PERIOD FOR SYSTEM_TIME(history_start, history_end), ADD SYSTEM VERSIONING`,
	},
	nowMicros: "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)",
	versions: `SELECT target_id, generation, lease_token, holder, ` + fmt.Sprintf(myMicros, "updated_at") + `,
		COALESCE(` + fmt.Sprintf(myMicros, "released_at") + `, 0), COALESCE(timeout_ms, 0),
		COALESCE(` + fmt.Sprintf(myMicros, "acquired_at") + `, 0)
		FROM job_lease FOR SYSTEM_TIME ALL
		ORDER BY target_id, generation, updated_at, released_at IS NOT NULL, released_at`,
	events: `SELECT target_id, seq, ` + fmt.Sprintf(myMicros, "at") + `, kind, generation, holder, COALESCE(how, ''),
		COALESCE(from_generation, 0), COALESCE(` + fmt.Sprintf(myMicros, "acquired_at") + `, 0), COALESCE(operator, ''),
		COALESCE(detail, ''), COALESCE(` + fmt.Sprintf(myMicros, "ended_at") + `, 0), COALESCE(end_cause, '')
		FROM job_lease_event ORDER BY target_id, seq`,
}

// SQLite: a trigger, as on PostgreSQL. The lease's times are text with
// milliseconds (see Input.Resolution); 'now' is read once per statement,
// possibly before the statement waited for the database's write lock, so
// these Changes have no At.
const liteMicros = "CAST(round((julianday(%s) - 2440587.5) * 86400000) AS INTEGER) * 1000"

var sqliteSchema = schema{
	ddl: []string{
		`CREATE TABLE history_result (id integer PRIMARY KEY AUTOINCREMENT, target varchar(255) NOT NULL,
			generation integer NOT NULL, token varchar(36) NOT NULL, value text NOT NULL, at_us integer NOT NULL)`,
		`CREATE TABLE history_lease_log (seq integer PRIMARY KEY AUTOINCREMENT, op char(1) NOT NULL, target_id varchar(255) NOT NULL,
			old_generation integer, new_generation integer, old_token varchar(36), new_token varchar(36),
			old_holder varchar(255), new_holder varchar(255),
			old_updated_us integer, new_updated_us integer, old_released_us integer, new_released_us integer,
			old_timeout_ms integer, new_timeout_ms integer, new_acquired_us integer, at_us integer NOT NULL)`,
		`CREATE TRIGGER history_lease_insert AFTER INSERT ON job_lease BEGIN
			INSERT INTO history_lease_log (op, target_id, new_generation, new_token, new_holder, new_updated_us, new_released_us,
				new_timeout_ms, new_acquired_us, at_us)
			VALUES ('I', NEW.target_id, NEW.generation, NEW.lease_token, NEW.holder, ` + fmt.Sprintf(liteMicros, "NEW.updated_at") + `,
				` + fmt.Sprintf(liteMicros, "NEW.released_at") + `, NEW.timeout_ms, ` + fmt.Sprintf(liteMicros, "NEW.acquired_at") + `, 0);
		END`,
		`CREATE TRIGGER history_lease_update AFTER UPDATE ON job_lease BEGIN
			INSERT INTO history_lease_log (op, target_id, old_generation, new_generation, old_token, new_token, old_holder, new_holder,
				old_updated_us, new_updated_us, old_released_us, new_released_us, old_timeout_ms, new_timeout_ms, new_acquired_us, at_us)
			VALUES ('U', NEW.target_id, OLD.generation, NEW.generation, OLD.lease_token, NEW.lease_token, OLD.holder, NEW.holder,
				` + fmt.Sprintf(liteMicros, "OLD.updated_at") + `, ` + fmt.Sprintf(liteMicros, "NEW.updated_at") + `,
				` + fmt.Sprintf(liteMicros, "OLD.released_at") + `, ` + fmt.Sprintf(liteMicros, "NEW.released_at") + `,
				OLD.timeout_ms, NEW.timeout_ms, ` + fmt.Sprintf(liteMicros, "NEW.acquired_at") + `, 0);
		END`,
	},
	nowMicros: "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)",
	changes:   postgresSchema.changes,
	events: `SELECT target_id, seq, ` + fmt.Sprintf(liteMicros, "at") + `, kind, generation, holder, COALESCE(how, ''),
		COALESCE(from_generation, 0), COALESCE(` + fmt.Sprintf(liteMicros, "acquired_at") + `, 0), COALESCE(operator, ''),
		COALESCE(detail, ''), COALESCE(` + fmt.Sprintf(liteMicros, "ended_at") + `, 0), COALESCE(end_cause, '')
		FROM job_lease_event ORDER BY target_id, seq`,
}

// Migrate creates the history tables and the lease row trigger in db,
// whose gormlease tables (the default names) must exist.
func Migrate(ctx context.Context, db *gorm.DB) error {
	s, err := schemaOf(db)
	if err != nil {
		return err
	}
	for _, stmt := range s.ddl {
		if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("history: migrate: %w", err)
		}
	}
	return nil
}

// SaveResult is the workers' saver: it inserts the result row in tx, the
// fenced commit's transaction.
func SaveResult(tx *gorm.DB, r Result) error {
	s, err := schemaOf(tx)
	if err != nil {
		return err
	}
	return tx.Exec("INSERT INTO history_result (target, generation, token, value, at_us) VALUES (?, ?, ?, ?, "+
		s.nowMicros+")", r.Target, r.Gen, r.Token, r.Value).Error
}

// LoadResult is the workers' load, for Do: it reads, in tx, the result
// of target's highest generation that saved, as a result table that each
// save overwrites would hold it, and returns it with that generation.
func LoadResult(tx *gorm.DB, target string) (value string, gen int64, err error) {
	row := tx.Raw("SELECT generation, value FROM history_result WHERE target = ? ORDER BY generation DESC LIMIT 1", target).Row()
	if err := row.Scan(&gen, &value); err != nil {
		return "", 0, fmt.Errorf("history: load %q: %w", target, err)
	}
	return value, gen, nil
}

// ReadDB reads every saved result and every lease row change.
func ReadDB(ctx context.Context, db *gorm.DB) ([]Result, []Change, error) {
	s, err := schemaOf(db)
	if err != nil {
		return nil, nil, err
	}
	return readDB(ctx, db, s)
}

// readDB is ReadDB on the tables of schema s.
func readDB(ctx context.Context, db *gorm.DB, s schema) ([]Result, []Change, error) {
	db = db.WithContext(ctx)
	var results []Result
	rows, err := db.Raw("SELECT target, generation, token, value, at_us FROM history_result ORDER BY id").Rows()
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var r Result
		if err := rows.Scan(&r.Target, &r.Gen, &r.Token, &r.Value, &r.At); err != nil {
			rows.Close()
			return nil, nil, err
		}
		results = append(results, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if s.versions != "" {
		changes, err := readVersions(db, s.versions)
		return results, changes, err
	}
	var changes []Change
	rows, err = db.Raw(s.changes).Rows()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c Change
		if err := rows.Scan(&c.Insert, &c.Target, &c.OldGen, &c.NewGen, &c.OldToken, &c.NewToken, &c.OldHolder, &c.NewHolder,
			&c.OldUpdated, &c.NewUpdated, &c.OldReleased, &c.NewReleased, &c.OldTimeoutMS, &c.NewTimeoutMS,
			&c.NewAcquired, &c.At); err != nil {
			return nil, nil, err
		}
		changes = append(changes, c)
	}
	return results, changes, rows.Err()
}

// readVersions reads the Changes of consecutive row versions.
func readVersions(db *gorm.DB, query string) ([]Change, error) {
	rows, err := db.Raw(query).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var changes []Change
	var prev Change
	for rows.Next() {
		c := Change{}
		if err := rows.Scan(&c.Target, &c.NewGen, &c.NewToken, &c.NewHolder, &c.NewUpdated, &c.NewReleased, &c.NewTimeoutMS,
			&c.NewAcquired); err != nil {
			return nil, err
		}
		if len(changes) == 0 || prev.Target != c.Target {
			c.Insert = true
		} else {
			c.OldGen, c.OldToken, c.OldHolder, c.OldUpdated = prev.NewGen, prev.NewToken, prev.NewHolder, prev.NewUpdated
			c.OldReleased, c.OldTimeoutMS = prev.NewReleased, prev.NewTimeoutMS
		}
		changes = append(changes, c)
		prev = c
	}
	return changes, rows.Err()
}

// LeaseEvent is one event of a lease row's history, as the lease table's
// event table (job_lease_event, kept when the lease table is migrated with
// gormlease.WithHistory) holds it, written by gormlease's triggers in the
// transaction of the change it records (see admin.Event, whose fields these
// are): a row of the table, or one of the two events of a row that holds a
// generation's acquisition and end, or an acquisition still pending in the
// lease row (PostgreSQL: see ReadEvents). At and AcquiredAt are the database's clock in Unix microseconds
// (AcquiredAt 0: NULL); FromGen, How, Operator and Detail are 0 or "" for
// NULL.
type LeaseEvent struct {
	Target     string
	Seq        int64
	At         int64
	Kind       string
	Gen        int64
	Holder     string
	How        string
	FromGen    int64
	AcquiredAt int64
	Operator   string
	Detail     string
}

// ReadEvents reads every event of the lease table's event table, by target
// and seq, with plain SQL: not through admin.History, whose reading the
// checker is not to depend on. A row that holds a generation's two events
// (PostgreSQL's) is read as both, and the acquisitions that PostgreSQL's
// trigger left pending in the lease rows as the events they will be. An
// error when the table does not exist.
func ReadEvents(ctx context.Context, db *gorm.DB) ([]LeaseEvent, error) {
	s, err := schemaOf(db)
	if err != nil {
		return nil, err
	}
	rows, err := db.WithContext(ctx).Raw(s.events).Rows()
	if err != nil {
		return nil, fmt.Errorf("history: read the events: %w", err)
	}
	defer rows.Close()
	var events []LeaseEvent
	for rows.Next() {
		var e LeaseEvent
		var endedAt int64
		var endCause string
		if err := rows.Scan(&e.Target, &e.Seq, &e.At, &e.Kind, &e.Gen, &e.Holder, &e.How, &e.FromGen, &e.AcquiredAt,
			&e.Operator, &e.Detail, &endedAt, &endCause); err != nil {
			return nil, fmt.Errorf("history: read the events: %w", err)
		}
		if endCause == "" {
			events = append(events, e)
			continue
		}
		// A row of a generation's two events: its acquisition, then, at
		// the next seq, its end, with the row's operator and detail.
		acquired := e
		acquired.Operator, acquired.Detail, acquired.AcquiredAt = "", "", 0
		events = append(events, acquired, LeaseEvent{Target: e.Target, Seq: e.Seq + 1, At: endedAt, Kind: "ended",
			Gen: e.Gen, Holder: e.Holder, How: endCause, AcquiredAt: e.At, Operator: e.Operator, Detail: e.Detail})
	}
	return events, rows.Err()
}
