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

// Expand writes t's names into query, which names the tables job_lease,
// job_lease_floor and job_result.
func (t Tables) Expand(query string) string {
	if t == DefaultTables {
		return query
	}
	return strings.NewReplacer(DefaultLeaseTable, t.Lease, DefaultResultTable, t.Result).Replace(query)
}
