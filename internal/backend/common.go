package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Dialect is what differs between the databases in the statements that
// Common (and the test kit's Kit) writes once for all of them.
type Dialect struct {
	// Now is an SQL expression for the database's current time, read when
	// the statement runs (not when its transaction began).
	Now string
	// Rebind rewrites the ? placeholders of a query as the driver wants them.
	Rebind func(query string) string
	// SecondsSince is an SQL expression for the time, in seconds, from col, a
	// timestamp column, to the database's time when the statement started.
	SecondsSince func(col string) string
	// Notify is appended to the statements that end a generation or save
	// its result, to tell waiters in other processes; "" where the database
	// cannot.
	Notify string
	// RowLock and FloorLock are appended to Prune's reads of the rows it
	// deletes and of the floor ("" where a transaction locks the database).
	RowLock, FloorLock string
	// RaiseFloor is the statement that raises the generation floor to its
	// one argument when that is higher, creating its row if missing.
	RaiseFloor string
	// TxOptions are the options of the fenced commit's, ForceRelease's and
	// Prune's transactions.
	TxOptions *sql.TxOptions
	// PrefixRange reports whether target IDs order byte for byte, so that
	// a prefix is a range of the primary key; nil means they always do.
	PrefixRange func(ctx context.Context, db *gorm.DB) (bool, error)
	// Lock is appended to SetSlots' read of the rows it may change: a
	// locking read ("" where a transaction locks the database).
	Lock string
	// LockTarget, when not "", is a statement that takes a lock, held until
	// its transaction ends, on its two arguments, the lease table's name
	// and a target ID: Pause and SetSlots of a target take it first, so
	// that they run one after the other even while the target has no row
	// to lock. SlotsTx are the options of SetSlots' transaction.
	LockTarget string
	SlotsTx    *sql.TxOptions
	// InsertIgnore begins, and IgnoreSuffix ends, an INSERT that skips the
	// rows whose key exists.
	InsertIgnore, IgnoreSuffix string
	// LeaseColumns are the lease table's columns that this database's
	// statements alone use, each after ", ", for CheckTables.
	LeaseColumns string

	// The operator's reads (List, Count) judge and order the rows with
	// these:
	//   - Fresh is an SQL condition that col, a timestamp column, is at
	//     most ms (SQL for a number of milliseconds) old at the time the
	//     statement started, as SecondsSince measures it.
	//   - AddMillis is an SQL timestamp: ts, a timestamp, plus ms (SQL for
	//     a number of milliseconds).
	//   - SortKey is an SQL value, ordered as ts is, of ts, a timestamp or
	//     AddMillis' result, never NULL: LastKey, which sorts after every
	//     other, stands for NULL. KeyMicros is a sort key as an integer of
	//     microseconds since the Unix epoch, exactly (NULL for LastKey), and
	//     MicrosKey the sort key whose KeyMicros is its argument (a
	//     statement's ?), so that a page's last row is found again by the
	//     value read.
	Fresh     func(col, ms string) string
	AddMillis func(ts, ms string) string
	SortKey   func(ts string) string
	KeyMicros func(key string) string
	MicrosKey string
	LastKey   string
}

// Common is the part of a Backend that is the same SQL on every database,
// written with a Dialect: the statements on the caller's own row, Get,
// ForceRelease, List and PruneBatch, and no capabilities. A backend embeds
// it and adds its own acquire, migration, waiter state and capabilities.
type Common struct {
	d       Dialect
	tables  Tables
	own     [HoldFor + 1]string
	get     string
	pending string // see SetPendingEvent
}

// The causes that end_cause records, by which a generation ended: the
// history's ended events (docs/design.md, section History) carry them as
// their how.
const (
	EndSaved      = "saved"       // a fenced commit saved, and released or held
	EndReleased   = "released"    // released, nothing saved, no failure
	EndFailed     = "failed"      // the work returned an error
	EndSaveFailed = "save_failed" // the saver, or the fenced commit, failed
	EndLost       = "lost"        // the Run lost its lease, and the release still found the row
	EndStopped    = "stopped"     // an operator's stop request
	EndMaxHold    = "max_hold"    // WithMaxHold passed
	EndPanic      = "panic"       // the work or the saver panicked
	EndCancelled  = "cancelled"   // the caller's context ended
	EndForced     = "forced"      // an operator's ForceRelease
)

// releasedCause is the end_cause of a release that names none: saved
// when the generation saved a result (CommitIfOwner, then Release),
// released otherwise.
const releasedCause = "CASE WHEN saved_generation = generation THEN '" + EndSaved + "' ELSE '" + EndReleased + "' END"

// ownWhere is the condition by which the statements on the caller's own
// row find it: the target, the caller's token, not released. The fenced
// commit's statements find it so too.
const ownWhere = " WHERE target_id = ? AND lease_token = ? AND released_at IS NULL"

// NewCommon returns the Common of d for tables t.
func NewCommon(d Dialect, t Tables) Common {
	c := Common{d: d, tables: t}
	// Each statement that ends a generation records how in end_cause
	// (see EndSaved...), which the history's triggers copy.
	set := [...]string{
		Renew:         "updated_at = " + d.Now,
		Release:       "released_at = " + d.Now + ", end_cause = " + releasedCause,
		ReleaseFailed: "released_at = " + d.Now + ", failure = ?, end_cause = ?",
		Save:          "saved_generation = generation, saved_at = " + d.Now,
		SaveRelease:   "released_at = " + d.Now + ", saved_generation = generation, saved_at = " + d.Now + ", end_cause = '" + EndSaved + "'",
		HoldFor: "updated_at = " + d.Now + ", timeout_ms = ?, hold_generation = generation, end_cause = COALESCE(?, " + releasedCause +
			"), failure = ?",
	}
	for op, s := range set {
		suffix := d.Notify
		if Own(op) == Renew || Own(op) == HoldFor {
			suffix = "" // the generation goes on
		}
		c.own[op] = d.Rebind("UPDATE " + t.Lease + " SET " + s + ownWhere + suffix)
	}
	c.get = d.Rebind("SELECT " + RowColumns + " FROM " + t.Lease + " WHERE target_id = ?")
	return c
}

// Now is the dialect's expression for the current time.
func (c *Common) Now() string { return c.d.Now }

// TxOptions are the dialect's transaction options.
func (c *Common) TxOptions() *sql.TxOptions { return c.d.TxOptions }

// Capabilities are none.
func (c *Common) Capabilities() Capabilities { return Capabilities{} }

// CheckSettings checks nothing.
func (c *Common) CheckSettings(context.Context, *gorm.DB) error { return nil }

// SettingsWarnings finds nothing.
func (c *Common) SettingsWarnings(context.Context, *gorm.DB) []SettingsWarning { return nil }

// OwnSQL returns the statement of op on the caller's own row. Its arguments
// are op's own (see Backend.UpdateOwn), then the target and the token.
func (c *Common) OwnSQL(op Own) string { return c.own[op] }

// GetSQL returns Get's statement; its one argument is the target.
func (c *Common) GetSQL() string { return c.get }

// UpdateOwn runs op on l's own row.
func (c *Common) UpdateOwn(ctx context.Context, db *gorm.DB, op Own, l Lease, args ...any) (int64, error) {
	_, n, err := Exec(ctx, db, c.own[op], append(args[:len(args):len(args)], l.TargetID, l.Token.String())...)
	return n, err
}

// HeartbeatBatch is not a capability of Common.
func (c *Common) HeartbeatBatch(context.Context, *gorm.DB, []Lease) (ended map[Lease]Ended, err error) {
	return nil, errors.New("batched heartbeats are not supported")
}

// Get reads targetID's row.
func (c *Common) Get(ctx context.Context, db *gorm.DB, targetID string) (Row, bool, error) {
	var row Row
	found, err := QueryRow(ctx, db, c.get, []any{targetID}, row.Columns()...)
	return row, found, err
}

// ReadSaved reads what targetID's row saved, as Get reads the row, but
// with a locking read in a transaction of its own where the database has
// one (Dialect.Lock), so that it waits for a fenced transaction still
// holding the row: a backend without synchronous standbys to wait for.
func (c *Common) ReadSaved(ctx context.Context, db *gorm.DB, targetID string) (Saved, bool, error) {
	if c.d.Lock == "" {
		return ReadSavedWith(ctx, db, targetID, c.Get)
	}
	var s Saved
	found := false
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		s, found, err = ReadSavedWith(ctx, tx, targetID, func(ctx context.Context, db *gorm.DB, targetID string) (Row, bool, error) {
			var row Row
			found, err := QueryRow(ctx, db, c.get+c.d.Lock, []any{targetID}, row.Columns()...)
			return row, found, err
		})
		return err
	}, c.d.TxOptions)
	return s, found, err
}

// ReadSavedWith is ReadSaved on the row that get reads.
func ReadSavedWith(ctx context.Context, db *gorm.DB, targetID string,
	get func(context.Context, *gorm.DB, string) (Row, bool, error),
) (Saved, bool, error) {
	row, found, err := get(ctx, db, targetID)
	if err != nil || !found {
		return Saved{}, found, err
	}
	s := Saved{Token: row.LeaseToken, Released: row.ReleasedAt != nil}
	if row.SavedGeneration != nil {
		s.Generation = *row.SavedGeneration
	}
	return s, true, nil
}

// ForceRelease ends the leases of the rows of keys that are not
// released, in one transaction that also reads back the rows carrying
// token: those it ended, and those that an earlier run with token ended.
// It records EndForced as their end_cause, and by ("" for none) as
// ended_by.
func (c *Common) ForceRelease(ctx context.Context, db *gorm.DB, keys []string, token uuid.UUID, failure, by string) ([]Row, error) {
	end := c.d.Rebind("UPDATE " + c.tables.Lease + " SET lease_token = ?, generation = generation + 1," +
		" released_at = " + c.d.Now + ", failure = ?, end_cause = '" + EndForced + "', ended_by = ?" +
		" WHERE " + in(len(keys)) + " AND released_at IS NULL" + c.d.Notify)
	read := c.d.Rebind("SELECT " + RowColumns + " FROM " + c.tables.Lease + " WHERE " + in(len(keys)) + " AND lease_token = ?")
	var ended []Row
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if _, _, err := Exec(ctx, tx, end, append([]any{token.String(), failure, nullable(by)}, keyArgs(keys)...)...); err != nil {
			return err
		}
		rows, err := Query(ctx, tx, read, append(keyArgs(keys), token.String())...)
		if err != nil {
			return err
		}
		defer rows.Close()
		ended = ended[:0]
		for rows.Next() {
			var row Row
			if err := rows.Scan(row.Columns()...); err != nil {
				return err
			}
			ended = append(ended, row)
		}
		return rows.Err()
	}, c.d.TxOptions)
	return ended, err
}

// RetryCommit never retries: on one server, a fenced commit that failed
// failed for good.
func (c *Common) RetryCommit(context.Context, *gorm.DB, Lease, error, int) (again, lost bool) {
	return false, false
}

// MarkWaiting marks nothing: Common has no notifications.
func (c *Common) MarkWaiting(context.Context, *gorm.DB, string, int64) (marked, ended bool, err error) {
	return false, false, nil
}

// Listen cannot listen.
func (c *Common) Listen(context.Context, *gorm.DB, func(), func(string, string)) error {
	return ErrCannotListen
}

// StateExpr is an SQL expression for a row's state, with age the SQL for
// its age in seconds: live within the timeout its holder recorded; past
// it, released when the holder had ended its work and only a minimum hold
// kept the row (hold_generation is the row's generation: see HoldFor),
// expired otherwise (or when it recorded no timeout); released.
func StateExpr(age string) string {
	return "CASE WHEN released_at IS NOT NULL THEN 'released'" +
		" WHEN timeout_ms IS NOT NULL AND " + age + " * 1000 <= timeout_ms THEN 'live'" +
		" WHEN hold_generation = generation THEN 'released'" +
		" ELSE 'expired' END"
}

// listState is the SQL for a row's state, as StateExpr, with the
// dialect's Fresh test of a live lease: one comparison of timestamps per
// row, where the database has it, rather than an age computed for each.
func (c *Common) listState() string {
	return "CASE WHEN released_at IS NOT NULL THEN 'released'" +
		" WHEN timeout_ms IS NOT NULL AND " + c.d.Fresh("updated_at", "timeout_ms") + " THEN 'live'" +
		" WHEN hold_generation = generation THEN 'released'" +
		" ELSE 'expired' END"
}

// stateIs returns the SQL condition that a row is in state ("live",
// "expired" or "released"), as listState judges it, as plain conditions
// that the database checks in order, and stops at the first false: the
// released rows, most of a table, fail a live or expired one at once.
func (c *Common) stateIs(state string) string {
	live := "(timeout_ms IS NOT NULL AND " + c.d.Fresh("updated_at", "timeout_ms") + ")"
	switch state {
	case "live":
		return "(released_at IS NULL AND " + live + ")"
	case "expired":
		return "(released_at IS NULL AND NOT " + live + " AND (hold_generation IS NULL OR hold_generation <> generation))"
	}
	return "(released_at IS NOT NULL OR (NOT " + live + " AND hold_generation = generation))"
}

// sortKey is the SQL of a row's value in order o (see ListOrder), never
// NULL (the dialect's LastKey sorts last); "" for ByKey. The orders of
// leases not released judge the state as listState does, in one CASE.
func (c *Common) sortKey(o ListOrder) string {
	d := c.d
	unreleased := func(ts string) string {
		return "COALESCE(CASE WHEN released_at IS NOT NULL THEN NULL" +
			" WHEN timeout_ms IS NOT NULL AND " + d.Fresh("updated_at", "timeout_ms") + " THEN " + ts +
			" WHEN hold_generation = generation THEN NULL ELSE " + ts + " END, " + d.LastKey + ")"
	}
	switch o {
	case ByAge:
		return d.SortKey("updated_at")
	case ByHeldSince:
		return unreleased(d.SortKey("acquired_at"))
	case ByExpiry:
		return unreleased(d.SortKey(d.AddMillis("updated_at", "COALESCE(timeout_ms, 0)")))
	}
	return ""
}

// List reads the rows that q chooses, in one statement of two parts: the
// inner query chooses the page's keys (and sort values), reading only the
// columns that its conditions and order need, and the outer one reads the
// page's rows by key, with their states and ages.
func (c *Common) List(ctx context.Context, db *gorm.DB, q ListQuery) ([]Listed, error) {
	state := c.listState()
	key := c.sortKey(q.Order)
	if q.State == "released" && (q.Order == ByHeldSince || q.Order == ByExpiry) {
		// Every released row sorts last: their order is the key's, which
		// the primary key's index reads in order, rather than the whole
		// table sorted.
		key = c.d.LastKey
	}
	var where []string
	var args []any
	switch {
	case q.After == "":
	case key == "":
		where, args = append(where, "target_id > ?"), append(args, q.After)
	case key == c.d.LastKey && q.AfterSort == nil:
		where, args = append(where, "target_id > ?"), append(args, q.After)
	case q.AfterSort == nil:
		where, args = append(where, "("+key+", target_id) > ("+c.d.LastKey+", ?)"), append(args, q.After)
	default:
		where, args = append(where, "("+key+", target_id) > ("+c.d.MicrosKey+", ?)"), append(args, *q.AfterSort, q.After)
	}
	if q.Prefix != "" {
		cond, cargs, err := c.prefixCondition(ctx, db, q.Prefix)
		if err != nil {
			return nil, err
		}
		where, args = append(where, cond), append(args, cargs...)
	}
	if q.Key != "" {
		where, args = append(where, "target_id = ?"), append(args, q.Key)
	}
	switch q.State {
	case "":
	case "paused":
		// As the partial index on the paused rows is written.
		where = append(where, "paused_at IS NOT NULL")
	default:
		where = append(where, c.stateIs(q.State))
	}
	if q.Holder != "" {
		where, args = append(where, "holder = ?"), append(args, q.Holder)
	}
	inner := "SELECT target_id AS list_key"
	outerSort, order, outerOrder := "NULL", "target_id", "p.list_key"
	if key != "" {
		inner += ", " + key + " AS list_sort"
		outerSort = c.d.KeyMicros("p.list_sort")
		order, outerOrder = key+", target_id", "p.list_sort, p.list_key"
	}
	inner += " FROM " + c.tables.Lease
	if len(where) > 0 {
		inner += " WHERE " + strings.Join(where, " AND ")
	}
	inner += " ORDER BY " + order + " LIMIT " + strconv.Itoa(q.Limit)
	query := "SELECT " + RowColumns + ", " + c.d.SecondsSince("updated_at") + ", " + state + ", " +
		c.d.SecondsSince("acquired_at") + ", " + outerSort +
		" FROM (" + inner + ") p JOIN " + c.tables.Lease + " ON target_id = p.list_key ORDER BY " + outerOrder
	rows, err := Query(ctx, db, c.d.Rebind(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Listed
	for rows.Next() {
		var (
			l          Listed
			secs, held sql.NullFloat64
			sort       sql.NullInt64
		)
		if err := rows.Scan(append(l.Row.Columns(), &secs, &l.State, &held, &sort)...); err != nil {
			return nil, err
		}
		l.Age = Seconds(secs.Float64)
		l.HeldFor = Seconds(held.Float64)
		if sort.Valid {
			l.Sort = &sort.Int64
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// Count counts the rows under prefix in each state, in one statement.
// Released is the rest of Total: the states partition the rows.
func (c *Common) Count(ctx context.Context, db *gorm.DB, prefix string) (Counts, error) {
	sum := func(cond string) string { return "COALESCE(SUM(CASE WHEN " + cond + " THEN 1 ELSE 0 END), 0)" }
	query := "SELECT COUNT(*), " + sum(c.stateIs("live")) + ", " + sum(c.stateIs("expired")) + ", COUNT(paused_at), " +
		sum("released_at IS NULL AND stop_generation = generation") + " FROM " + c.tables.Lease
	var args []any
	if prefix != "" {
		cond, cargs, err := c.prefixCondition(ctx, db, prefix)
		if err != nil {
			return Counts{}, err
		}
		query, args = query+" WHERE "+cond, cargs
	}
	var n Counts
	_, err := QueryRow(ctx, db, c.d.Rebind(query), args, &n.Total, &n.Live, &n.Expired, &n.Paused, &n.StopRequested)
	n.Released = n.Total - n.Live - n.Expired
	return n, err
}

// prefixCondition returns the SQL condition, and its arguments, that keeps
// the target IDs starting with prefix. It is a range on the primary key,
// [prefix, its successor), wherever target IDs are ordered byte for byte;
// otherwise a range could miss IDs that the collation orders elsewhere, so
// it is LIKE with the wildcards escaped.
func (c *Common) prefixCondition(ctx context.Context, db *gorm.DB, prefix string) (string, []any, error) {
	if c.d.PrefixRange != nil {
		bytewise, err := c.d.PrefixRange(ctx, db)
		if err != nil {
			return "", nil, err
		}
		if !bytewise {
			return `target_id LIKE ? ESCAPE '\'`, []any{likePrefix(prefix)}, nil
		}
	}
	if next, ok := successor(prefix); ok {
		return "target_id >= ? AND target_id < ?", []any{prefix, next}, nil
	}
	return "target_id >= ?", []any{prefix}, nil
}

// likePrefix is the LIKE pattern of the strings that start with prefix,
// with LIKE's wildcards and its escape character escaped.
func likePrefix(prefix string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix) + "%"
}

// successor returns the smallest valid UTF-8 string, in byte order, that
// is greater than every string starting with prefix: prefix with its last
// character replaced by the next one (dropping trailing characters that
// have no next one). It reports false when there is none.
func successor(prefix string) (string, bool) {
	for prefix != "" {
		c, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
		next := c + 1
		if next == 0xD800 { // skip the surrogates, which UTF-8 cannot encode
			next = 0xE000
		}
		if next <= utf8.MaxRune {
			return prefix + string(next), true
		}
	}
	return "", false
}

// prunable is the condition on a lease row that PruneBatch deletes it by:
// not paused (a paused target's row keeps its pause), and released, or expired by the timeout its holder recorded (a row without
// one counts as expired since its last heartbeat), more than its two
// arguments, seconds, ago.
func (c *Common) prunable() string {
	age := c.d.SecondsSince
	return "(paused_at IS NULL AND ((released_at IS NOT NULL AND " + age("released_at") + " > ?)" +
		" OR (released_at IS NULL AND " + age("updated_at") + " > COALESCE(timeout_ms, 0) / 1000.0 + ?)))"
}

// PruneBatch deletes one batch of prunable rows. The floor is locked first,
// so that concurrent Prunes, and MySQL's inserts that read it, take their
// locks in one order; the rows are locked (skipping those that others hold)
// and checked again under the lock, so a row acquired meanwhile stays.
func (c *Common) PruneBatch(ctx context.Context, db *gorm.DB, q PruneQuery) (deleted []string, more bool, err error) {
	d, t := c.d, c.tables
	prunable := c.prunable()
	secs := q.OlderThan.Seconds()
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		deleted, more = nil, false
		if _, err := QueryRow(ctx, tx, "SELECT generation FROM "+t.Floor()+" WHERE id = 1"+d.FloorLock, nil, new(int64)); err != nil {
			return fmt.Errorf("lock the generation floor: %w", err)
		}
		rows, err := Query(ctx, tx, d.Rebind("SELECT target_id, generation FROM "+t.Lease+
			" WHERE target_id > ? AND "+prunable+" ORDER BY target_id LIMIT "+strconv.Itoa(q.BatchSize)+d.RowLock),
			q.After, secs, secs)
		if err != nil {
			return fmt.Errorf("select rows: %w", err)
		}
		var targets []any
		var top int64
		for rows.Next() {
			var id string
			var gen int64
			if err := rows.Scan(&id, &gen); err != nil {
				rows.Close()
				return fmt.Errorf("select rows: %w", err)
			}
			targets, top = append(targets, id), max(top, gen)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("select rows: %w", err)
		}
		if len(targets) == 0 {
			return nil
		}
		if _, _, err := Exec(ctx, tx, d.Rebind(d.RaiseFloor), top); err != nil {
			return fmt.Errorf("raise the generation floor: %w", err)
		}
		in := "target_id IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(targets)), ", ") + ")"
		// Waiters in other processes may wait on an expired row: the
		// delete tells them, as a release does.
		_, n, err := Exec(ctx, tx, d.Rebind("DELETE FROM "+t.Lease+" WHERE "+in+" AND "+prunable+d.Notify),
			append(append([]any{}, targets...), secs, secs)...)
		if err != nil {
			return fmt.Errorf("delete rows: %w", err)
		}
		if n != int64(len(targets)) {
			// The rows were locked, so this should not happen. Roll back:
			// the result rows below are those of all the rows.
			return fmt.Errorf("deleted %d of the %d rows it locked", n, len(targets))
		}
		if !q.KeepResults {
			if _, _, err := Exec(ctx, tx, d.Rebind("DELETE FROM "+t.Result+" WHERE "+in), targets...); err != nil {
				return fmt.Errorf("delete results: %w", err)
			}
		}
		for _, id := range targets {
			deleted = append(deleted, id.(string))
		}
		more = len(targets) == q.BatchSize
		return nil
	}, d.TxOptions)
	if err != nil {
		return nil, false, err
	}
	return deleted, more, nil
}

// PruneCount counts the rows that PruneBatch would delete now.
func (c *Common) PruneCount(ctx context.Context, db *gorm.DB, olderThan time.Duration) (int64, error) {
	secs := olderThan.Seconds()
	var n int64
	_, err := QueryRow(ctx, db, c.d.Rebind("SELECT COUNT(*) FROM "+c.tables.Lease+" WHERE "+c.prunable()), []any{secs, secs}, &n)
	return n, err
}

// Column is a column that a later version added to the lease table.
type Column struct{ Name, DDL string }

// AddMissingColumns adds to table those of columns that it lacks: the
// upgrade, by Migrate, of a table made by an earlier version. A column that
// another migration adds at the same time makes the ALTER fail; it is then
// found there, and that is not an error.
func AddMissingColumns(db *gorm.DB, table string, columns []Column) error {
	quiet := db.Session(&gorm.Session{Logger: logger.Discard})
	has := func(c Column) bool {
		return quiet.Exec("SELECT "+c.Name+" FROM "+table+" WHERE 1 = 0").Error == nil
	}
	for _, c := range columns {
		if has(c) {
			continue
		}
		if err := db.Exec("ALTER TABLE " + table + " ADD COLUMN " + c.Name + " " + c.DDL).Error; err != nil && !has(c) {
			return fmt.Errorf("add column %s.%s: %w", table, c.Name, err)
		}
	}
	return nil
}

// ScanLost reads rows, the target, token and stop request of each lease
// that a heartbeat statement renewed (the request's reason, or NULL when
// none applies to the lease), closes them, and returns those of leases that
// it did not renew, and those whose holder was asked to stop.
func ScanLost(rows *sql.Rows, leases []Lease) (map[Lease]Ended, error) {
	defer rows.Close()
	type key struct{ target, token string }
	lost := make(map[key]Lease, len(leases))
	for _, l := range leases {
		lost[key{l.TargetID, l.Token.String()}] = l
	}
	out := map[Lease]Ended{}
	for rows.Next() {
		var k key
		var stop sql.NullString
		if err := rows.Scan(&k.target, &k.token, &stop); err != nil {
			return nil, err
		}
		if l, ok := lost[k]; ok && stop.Valid {
			out[l] = Ended{Stop: true, Reason: stop.String}
		}
		delete(lost, k)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, l := range lost {
		out[l] = Ended{}
	}
	return out, nil
}

// StopRequest is an SQL expression, on the lease row aliased as alias, for
// the reason of the request to stop that applies to its lease
// (RequestStop): the request made for the row's generation; NULL when
// there is none.
func StopRequest(alias string) string {
	return "CASE WHEN " + alias + ".stop_generation = " + alias + ".generation THEN COALESCE(" + alias + ".stop_reason, '') END"
}

// TimeoutMillis is d in whole milliseconds, rounded up, as the timeout_ms
// column records a lease's timeout.
func TimeoutMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ScanState scans a waiter's state from a row of generation, released,
// saved generation, failure, age, saved age, waiting, timeout_ms, holder,
// whether it is paused and the pause's reason, whether its generation
// was asked to stop, the seconds since its acquisition (NULL when the row
// records none), whether it is a minimum hold (HoldFor) and the seconds
// since its release (NULL while it is not released), in that order, as
// each backend's State selects them.
func ScanState(ctx context.Context, db *gorm.DB, query, targetID string) (State, error) {
	var (
		st            State
		failure       sql.NullString
		age, savedAge sql.NullFloat64
		timeoutMS     sql.NullInt64
		reason        sql.NullString
		heldFor       sql.NullFloat64
		releasedAge   sql.NullFloat64
	)
	found, err := QueryRow(ctx, db, query, []any{targetID},
		&st.Generation, &st.Released, &st.SavedGeneration, &failure, &age, &savedAge, &st.Waiting, &timeoutMS, &st.Holder,
		&st.Paused, &reason, &st.Stopped, &heldFor, &st.MinHold, &releasedAge)
	if err != nil || !found {
		return State{}, err
	}
	st.Found = true
	st.Failure = failure.String
	st.PauseReason = reason.String
	st.Age = Seconds(age.Float64)
	st.SavedAge = -1
	if savedAge.Valid {
		st.SavedAge = Seconds(savedAge.Float64)
	}
	st.Timeout = time.Duration(timeoutMS.Int64) * time.Millisecond
	st.HeldFor = max(Seconds(heldFor.Float64), 0)
	st.ReleasedAge = -1
	if releasedAge.Valid {
		st.ReleasedAge = max(Seconds(releasedAge.Float64), 0)
	}
	return st, nil
}

// in is the condition that target_id is one of n arguments.
func in(n int) string {
	return "target_id IN (" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
}

// slotColumns are what SlotRows and SetSlots read of a slot row: with its
// state, its lease and age, the time since its acquisition and whether it
// is a minimum hold, so that a refused AcquireSlot tells which slot frees
// first without another read.
func (c *Common) slotColumns() string {
	age := c.d.SecondsSince("updated_at")
	return "target_id, COALESCE(slots, 0), " + StateExpr(age) + " = 'live', holder, generation, COALESCE(timeout_ms, 0), " + age +
		", paused_at IS NOT NULL, COALESCE(pause_reason, ''), " + c.d.SecondsSince("acquired_at") + ", " + MinHoldExpr
}

// MinHoldExpr is an SQL expression for whether a lease row is a minimum
// hold (HoldFor): its holder ended its work and recorded the hold for the
// row's generation. It is never NULL.
const MinHoldExpr = "COALESCE(hold_generation = generation, false)"

// ScanSlots reads, and closes, the rows of SlotRowsQuery's statement.
func ScanSlots(rows *sql.Rows) ([]SlotRow, error) {
	defer rows.Close()
	var out []SlotRow
	for rows.Next() {
		var (
			key       string
			r         SlotRow
			timeoutMS int64
			age       sql.NullFloat64
			heldFor   sql.NullFloat64
		)
		if err := rows.Scan(&key, &r.Slots, &r.Live, &r.Holder, &r.Generation, &timeoutMS, &age, &r.Paused, &r.PauseReason,
			&heldFor, &r.MinHold); err != nil {
			return nil, err
		}
		if _, slot, ok := ParseSlotKey(key); ok {
			r.Slot = slot
			r.Timeout = time.Duration(timeoutMS) * time.Millisecond
			r.Age = Seconds(age.Float64)
			r.HeldFor = max(Seconds(heldFor.Float64), 0)
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// keyArgs are keys as statement arguments.
func keyArgs(keys []string) []any {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	return args
}

// SlotRowsQuery returns SlotRows' statement and its arguments.
func (c *Common) SlotRowsQuery(targetID string, n int) (string, []any) {
	return c.d.Rebind("SELECT " + c.slotColumns() + " FROM " + c.tables.Lease + " WHERE " + in(n)), keyArgs(SlotKeys(targetID, n))
}

// SlotRows reads the rows of slots 1..n of targetID.
func (c *Common) SlotRows(ctx context.Context, db *gorm.DB, targetID string, n int) ([]SlotRow, error) {
	query, args := c.SlotRowsQuery(targetID, n)
	rows, err := Query(ctx, db, query, args...)
	if err != nil {
		return nil, err
	}
	return ScanSlots(rows)
}

// setSlotsRounds bounds the rounds of SetSlots' transaction.
const setSlotsRounds = 5

// SetSlots records n as targetID's count of slots, in rounds of one
// transaction. Each round reads the target's slot rows with a locking
// read, so that no acquire takes one of them while the count changes, and
// two SetSlots on the rows that exist run one after the other; records n
// in those that record another count, and creates the missing rows of
// 1..n. Rows that another SetSlots creates meanwhile are not locked, and
// its inserts may win over this one's; so the transaction ends only after
// a round whose read, a statement of its own that sees what others
// committed since, finds every row recording n and none missing.
func (c *Common) SetSlots(ctx context.Context, db *gorm.DB, targetID string, n int) (conflict int, err error) {
	errConflict := errors.New("conflict")
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		conflict = 0
		if err := c.lockTarget(ctx, tx, targetID); err != nil {
			return err
		}
		for round := 1; ; round++ {
			existing, err := c.lockSlots(ctx, tx, targetID)
			if err != nil {
				return err
			}
			have := make(map[int]bool, len(existing))
			var change, missing []string
			for _, r := range existing {
				if r.Live && r.Slots != n {
					conflict = r.Slots
					return errConflict
				}
				have[r.Slot] = true
				if r.Slots != n {
					change = append(change, SlotKey(targetID, r.Slot))
				}
			}
			for slot := 1; slot <= n; slot++ {
				if !have[slot] {
					missing = append(missing, SlotKey(targetID, slot))
				}
			}
			switch {
			case len(change) == 0 && len(missing) == 0:
				return nil
			case round > setSlotsRounds:
				return fmt.Errorf("the slot rows kept changing under concurrent changes of their count (%d rounds)", setSlotsRounds)
			}
			if err := c.writeSlots(ctx, tx, targetID, n, change, missing); err != nil {
				return err
			}
		}
	}, c.d.SlotsTx)
	if errors.Is(err, errConflict) {
		return conflict, nil
	}
	return 0, err
}

// lockSlots reads every slot row of targetID with a locking read.
func (c *Common) lockSlots(ctx context.Context, tx *gorm.DB, targetID string) ([]SlotRow, error) {
	rows, err := Query(ctx, tx, c.d.Rebind("SELECT "+c.slotColumns()+" FROM "+c.tables.Lease+" WHERE "+in(MaxSlots)+c.d.Lock),
		keyArgs(SlotKeys(targetID, MaxSlots))...)
	if err != nil {
		return nil, fmt.Errorf("lock the slot rows: %w", err)
	}
	existing, err := ScanSlots(rows)
	if err != nil {
		return nil, fmt.Errorf("lock the slot rows: %w", err)
	}
	return existing, nil
}

// writeSlots records n in the rows of keys change, and creates the rows
// of keys missing, skipping those that exist by now. A new slot row is
// released, by no one, at the generation floor: its first acquire is the
// floor's next generation, as a new target's is. It is paused, with the
// reason and operator, when targetID's own row is (see Pause): a semaphore made after
// its target was paused is paused too.
func (c *Common) writeSlots(ctx context.Context, tx *gorm.DB, targetID string, n int, change, missing []string) error {
	t := c.tables
	if len(change) > 0 {
		if _, _, err := Exec(ctx, tx, c.d.Rebind("UPDATE "+t.Lease+" SET slots = ? WHERE "+in(len(change))),
			append([]any{n}, keyArgs(change)...)...); err != nil {
			return fmt.Errorf("record the count: %w", err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var floor int64
	if _, err := QueryRow(ctx, tx, "SELECT generation FROM "+t.Floor()+" WHERE id = 1", nil, &floor); err != nil {
		return fmt.Errorf("read the generation floor: %w", err)
	}
	var paused bool
	var reason, by sql.NullString
	// A locking read, which waits for a Pause of the target that has
	// written its row but not committed yet, and which a Pause that comes
	// later waits for in turn (see Pause).
	if _, err := QueryRow(ctx, tx, c.d.Rebind("SELECT paused_at IS NOT NULL, pause_reason, paused_by FROM "+t.Lease+" WHERE target_id = ?"+c.d.Lock),
		[]any{targetID}, &paused, &reason, &by); err != nil {
		return fmt.Errorf("read the target's pause: %w", err)
	}
	pausedAt := "NULL"
	if paused {
		pausedAt = c.d.Now
	}
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?, '', "+c.d.Now+", "+c.d.Now+", ?, "+pausedAt+", ?, ?), ", len(missing)), ", ")
	args := make([]any, 0, 6*len(missing))
	for _, key := range missing {
		args = append(args, key, uuid.Nil.String(), floor, n, reason, by)
	}
	if _, _, err := Exec(ctx, tx, c.d.Rebind(c.d.InsertIgnore+" "+t.Lease+
		" (target_id, lease_token, generation, holder, updated_at, released_at, slots, paused_at, pause_reason, paused_by) VALUES "+
		values+c.d.IgnoreSuffix), args...); err != nil {
		return fmt.Errorf("create the slot rows: %w", err)
	}
	return nil
}

// Pause marks the rows of keys paused, in one transaction: it first
// creates the row of keys[0] when there is none, released, by no one, at
// the generation floor (as writeSlots makes a slot's row), so that a
// target never acquired can be paused too; then it stamps the pause on
// every row of keys that exists. A row paused already keeps the time of its
// pause and gets the new reason.
func (c *Common) Pause(ctx context.Context, db *gorm.DB, keys []string, reason, by string) error {
	t, now := c.tables, c.d.Now
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := c.lockTarget(ctx, tx, keys[0]); err != nil {
			return err
		}
		if _, _, err := Exec(ctx, tx, c.d.Rebind(c.d.InsertIgnore+" "+t.Lease+
			" (target_id, lease_token, generation, holder, updated_at, released_at)"+
			" SELECT ?, ?, generation, '', "+now+", "+now+" FROM "+t.Floor()+" WHERE id = 1"+c.d.IgnoreSuffix),
			keys[0], uuid.Nil.String()); err != nil {
			return fmt.Errorf("create the row: %w", err)
		}
		// Lock the target's row, then mark the rows in a statement of its
		// own: it waits for a SetSlots of the target that read the row
		// first, and then sees the slot rows that SetSlots made.
		if _, err := QueryRow(ctx, tx, c.d.Rebind("SELECT 1 FROM "+t.Lease+" WHERE target_id = ?"+c.d.Lock), []any{keys[0]}, new(int)); err != nil {
			return fmt.Errorf("lock the row: %w", err)
		}
		if _, _, err := Exec(ctx, tx, c.d.Rebind("UPDATE "+t.Lease+" SET paused_at = COALESCE(paused_at, "+now+"), pause_reason = ?,"+
			" paused_by = ? WHERE "+in(len(keys))), append([]any{reason, nullable(by)}, keyArgs(keys)...)...); err != nil {
			return fmt.Errorf("mark the rows paused: %w", err)
		}
		return nil
	}, c.d.TxOptions)
}

// lockTarget takes the dialect's LockTarget on targetID, in tx, if it has
// one.
func (c *Common) lockTarget(ctx context.Context, tx *gorm.DB, targetID string) error {
	if c.d.LockTarget == "" {
		return nil
	}
	if _, _, err := Exec(ctx, tx, c.d.Rebind(c.d.LockTarget), c.tables.Lease, targetID); err != nil {
		return fmt.Errorf("lock the target: %w", err)
	}
	return nil
}

// Resume clears the pause of the rows of keys, and notifies their waiters
// where the dialect can; in the rows that were paused, it records by ("" for
// none) as paused_by: who resumed them, for the history (see Backend). It
// writes every row of keys, paused or not: a Resume sent again after one
// whose answer was lost then still waits, as any write does, for the
// synchronous standbys, and does not return nil on an isolated old primary
// that kept the lost one (PostgreSQL writes a row whose values do not
// change). paused_by is assigned first: MySQL's later assignments see the
// earlier ones' values.
func (c *Common) Resume(ctx context.Context, db *gorm.DB, keys []string, by string) (int64, error) {
	_, n, err := Exec(ctx, db, c.d.Rebind("UPDATE "+c.tables.Lease+
		" SET paused_by = CASE WHEN paused_at IS NOT NULL THEN ? ELSE paused_by END, paused_at = NULL, pause_reason = NULL WHERE "+
		in(len(keys))+c.d.Notify), append([]any{nullable(by)}, keyArgs(keys)...)...)
	return n, err
}

// RequestStop records a request to stop the leases of the rows of keys
// that are not released, and returns how many such rows carry it. (MySQL
// counts the rows a statement changed, not those it found: a request made
// again with the same reason changes none, so a count of 0 is checked by a
// read, which counts the live rows whose lease carries this very request:
// not a row that was released when the UPDATE ran and that another holder
// acquired before the read, whose lease no request reached.)
func (c *Common) RequestStop(ctx context.Context, db *gorm.DB, keys []string, reason, by string) (int64, error) {
	t := c.tables
	_, n, err := Exec(ctx, db, c.d.Rebind("UPDATE "+t.Lease+" SET stop_generation = generation, stop_reason = ?, stop_by = ? WHERE "+
		in(len(keys))+" AND released_at IS NULL"), append([]any{reason, nullable(by)}, keyArgs(keys)...)...)
	if err != nil || n > 0 {
		return n, err
	}
	_, err = QueryRow(ctx, db, c.d.Rebind("SELECT COUNT(*) FROM "+t.Lease+" WHERE "+in(len(keys))+
		" AND released_at IS NULL AND stop_generation = generation AND stop_reason = ? AND COALESCE(stop_by, '') = ?"),
		append(keyArgs(keys), reason, by), &n)
	return n, err
}

// nullable is s as a statement's argument: NULL when "".
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
