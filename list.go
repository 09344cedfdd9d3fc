package gormlease

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// LeaseState is the state of a lease row, judged on the database's clock.
type LeaseState string

const (
	// StateLive is a lease held and renewed within its timeout: acquiring
	// the target is refused.
	StateLive LeaseState = "live"
	// StateExpired is a lease not released whose last heartbeat is older
	// than its timeout: the next acquire takes it over. A row written
	// before the timeout_ms column existed has no timeout, and counts as
	// expired since its last heartbeat.
	StateExpired LeaseState = "expired"
	// StateReleased is a lease released by its holder, or by force.
	StateReleased LeaseState = "released"
)

const (
	// defaultListLimit is the number of rows that List returns when
	// ListOptions.Limit is 0.
	defaultListLimit = 100
	// maxListLimit is the largest ListOptions.Limit that List accepts.
	maxListLimit = 10000
)

// ListOptions choose the rows that Repository.List returns. The zero value
// lists the first 100 rows of every state.
type ListOptions struct {
	// Prefix keeps the targets whose ID starts with it, byte for byte
	// (no wildcards); "" keeps all.
	Prefix string
	// State keeps the rows in this state; "" keeps all.
	State LeaseState
	// After is the last target ID of the previous page: List returns the
	// rows after it, in the order of the target IDs. "" starts at the
	// first.
	After string
	// Limit is the most rows returned, up to 10,000; 0 means 100.
	Limit int
}

// LeaseInfo is a lease row as List reads it, with its state and ages on
// the database's clock.
type LeaseInfo struct {
	JobLease
	// State is the row's state when it was read.
	State LeaseState
	// Age is the time since UpdatedAt: the acquisition or last heartbeat.
	Age time.Duration
	// Timeout is the lease timeout of the last acquisition, 0 when the row
	// does not record it (see JobLease.TimeoutMS).
	Timeout time.Duration
	// ExpiresIn is, for a row not released, Timeout - Age: how long the
	// lease lives without another heartbeat, negative once it has expired.
	// It is 0 for a released row.
	ExpiresIn time.Duration
}

// check returns an error wrapping ErrInvalidArgument when o cannot be
// used, and o with its defaults filled in.
func (o ListOptions) check() (ListOptions, error) {
	switch o.State {
	case "", StateLive, StateExpired, StateReleased:
	default:
		return o, invalidf("list: state %q is not one of live, expired, released", o.State)
	}
	switch {
	case o.Limit < 0 || o.Limit > maxListLimit:
		return o, invalidf("list: limit %d is not between 0 and %d", o.Limit, maxListLimit)
	case o.Limit == 0:
		o.Limit = defaultListLimit
	}
	if o.Prefix != "" {
		if problem := checkText(o.Prefix, maxTargetIDLength); problem != "" {
			return o, invalidf("list: prefix %q %s", truncateUTF8(o.Prefix, 40), problem)
		}
	}
	if o.After != "" {
		if problem := checkText(o.After, maxTargetIDLength); problem != "" {
			return o, invalidf("list: after %q %s", truncateUTF8(o.After, 40), problem)
		}
	}
	return o, nil
}

// stateSQLExpr is an SQL expression for a row's state, with age, the SQL
// for its age in seconds.
func stateSQLExpr(age string) string {
	return "CASE WHEN released_at IS NOT NULL THEN 'released'" +
		" WHEN timeout_ms IS NOT NULL AND " + age + " * 1000 <= timeout_ms THEN 'live'" +
		" ELSE 'expired' END"
}

// List returns the lease rows that o chooses, in the order of their target
// IDs, a page at a time: pass the last target ID of a page as o.After to
// get the next, until a page is shorter than the limit. Each row's state
// and ages are read on the database's clock, in one statement. A page
// walks the primary key from o.After (and o.Prefix), so paging through a
// table of any size costs each page about the same. Like Get, List reads
// the database that the Repository's *gorm.DB was opened on.
func (r *Repository) List(ctx context.Context, o ListOptions) ([]LeaseInfo, error) {
	o, err := o.check()
	if err != nil {
		return nil, err
	}
	age := r.dialect.secondsSince("updated_at")
	state := stateSQLExpr(age)
	var where []string
	var args []any
	if o.After != "" {
		where, args = append(where, "target_id > ?"), append(args, o.After)
	}
	if o.Prefix != "" {
		cond, cargs, err := r.prefixCondition(ctx, o.Prefix)
		if err != nil {
			return nil, wrapf(err, "list")
		}
		where, args = append(where, cond), append(args, cargs...)
	}
	if o.State != "" {
		where, args = append(where, state+" = ?"), append(args, string(o.State))
	}
	query := "SELECT " + leaseColumns + ", " + age + ", " + state + " FROM " + r.tables.lease
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY target_id LIMIT " + strconv.Itoa(o.Limit)
	rows, err := querySQL(ctx, r.db, r.dialect.rebind(query), args...)
	if err != nil {
		return nil, wrapf(err, "list")
	}
	defer rows.Close()
	var out []LeaseInfo
	for rows.Next() {
		var (
			li   LeaseInfo
			secs sql.NullFloat64
			st   string
		)
		if err := rows.Scan(append(li.columns(), &secs, &st)...); err != nil {
			return nil, wrapf(err, "list")
		}
		li.fill(LeaseState(st), seconds(secs.Float64))
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapf(err, "list")
	}
	return out, nil
}

// fill sets li's state and durations from state and age, as read.
func (li *LeaseInfo) fill(state LeaseState, age time.Duration) {
	li.State, li.Age = state, age
	if li.TimeoutMS != nil {
		li.Timeout = time.Duration(*li.TimeoutMS) * time.Millisecond
	}
	if li.ReleasedAt == nil {
		li.ExpiresIn = li.Timeout - age
	}
}

// prefixCondition returns the SQL condition, and its arguments, that keeps
// the target IDs starting with prefix. It is a range on the primary key,
// [prefix, its successor), wherever target IDs are ordered byte for byte:
// MySQL (varbinary), SQLite (BINARY), PostgreSQL under the C collation.
// Under another PostgreSQL collation a range could miss IDs that the
// collation orders elsewhere, so it is LIKE with the wildcards escaped.
func (r *Repository) prefixCondition(ctx context.Context, prefix string) (string, []any, error) {
	if _, ok := r.dialect.(postgresDialect); ok {
		bytewise, err := r.postgresBytewise(ctx)
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

// postgresBytewise reports whether the lease table's target_id orders
// byte for byte, read once per Repository: its collation sorts 'B' before
// 'a', as byte order does and the language collations do not.
func (r *Repository) postgresBytewise(ctx context.Context) (bool, error) {
	if v := r.bytewise.Load(); v != 0 {
		return v > 0, nil
	}
	var bytewise bool
	query := "SELECT CAST('B' AS varchar) COLLATE \"default\" < CAST('a' AS varchar) COLLATE \"default\"" +
		" AND (SELECT COALESCE(c.collname, 'default') IN ('default', 'C', 'POSIX', 'C.UTF-8', 'C.utf8', 'ucs_basic')" +
		" FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation AND a.attcollation <> 100" +
		" WHERE a.attrelid = CAST(? AS regclass) AND a.attname = 'target_id')"
	if _, err := queryRowSQL(ctx, r.db, r.dialect.rebind(query), []any{r.tables.lease}, &bytewise); err != nil {
		return false, fmt.Errorf("read the collation of target_id: %w", err)
	}
	if bytewise {
		r.bytewise.Store(1)
	} else {
		r.bytewise.Store(-1)
	}
	return bytewise, nil
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
