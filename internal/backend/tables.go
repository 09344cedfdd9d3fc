package backend

import "strings"

// The default table names, which the statements are written with.
const (
	DefaultLeaseTable  = "job_lease"
	DefaultResultTable = "job_result"
)

// Tables names the tables of one set of leases: Lease holds the lease rows
// and Result the rows of SaveJSON. The generation floor is Lease's name with
// "_floor" appended.
type Tables struct {
	Lease, Result string
}

// DefaultTables are the tables by their default names.
var DefaultTables = Tables{Lease: DefaultLeaseTable, Result: DefaultResultTable}

// Floor is the table of the generation floor (see PruneBatch).
func (t Tables) Floor() string { return t.Lease + "_floor" }

// Event is the event table of the lease table's history (see
// Backend.Migrate): the lease table's name, in its schema, with "_event"
// appended. It exists only where the history is kept.
func (t Tables) Event() string { return t.Lease + "_event" }

// Expand writes t's names into query, which names the tables job_lease,
// job_lease_floor, job_lease_event and job_result (and objects named after
// job_lease: its indexes and triggers).
func (t Tables) Expand(query string) string {
	if t == DefaultTables {
		return query
	}
	return strings.NewReplacer(DefaultLeaseTable, t.Lease, DefaultResultTable, t.Result).Replace(query)
}

// PausedIndex names the index of the paused rows of the lease table (the
// operator's List of StatePaused reads it): the lease table's name, without
// its schema, with "_paused" appended, as a CREATE INDEX names it; and, in
// schema, the schema that qualifies the lease table's name, with its dot,
// or "".
func (t Tables) PausedIndex() (name, schema string) {
	schema, table := "", t.Lease
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema, table = table[:i+1], table[i+1:]
	}
	return table + "_paused", schema
}

// Unqualified is name without the schema that qualifies it, and that
// schema with its dot ("" when none): the name that a CREATE INDEX or
// CREATE TRIGGER gives an object of a schema-qualified table.
func Unqualified(name string) (table, schema string) {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i+1:], name[:i+1]
	}
	return name, ""
}
