package gormlease

import (
	"fmt"
	"strings"
)

const (
	// defaultLeaseTable is the name of the table of lease rows, as
	// JobLease.TableName says. WithTableNames overrides it.
	defaultLeaseTable = "job_lease"

	// defaultResultTable is the name of the table that SaveJSON and
	// LoadJSON keep results in, as JobResult.TableName says.
	// WithTableNames overrides it.
	defaultResultTable = "job_result"

	// maxTableName is the longest table or schema name accepted: PostgreSQL
	// cuts identifiers at 63 bytes.
	maxTableName = 63
)

// tableNames are the tables that a Repository, AutoMigrate and the result
// helpers work on.
type tableNames struct {
	lease, result string
}

var defaultTables = tableNames{lease: defaultLeaseTable, result: defaultResultTable}

// WithTableNames names the two tables: lease holds the lease rows
// ("job_lease" by default) and result the rows of SaveJSON ("job_result").
// Each is a lower-case SQL identifier, optionally qualified by a schema or
// database: "app_lease", "jobs.lease". Give the same names to every part
// that takes it. gorm's NamingStrategy (its TablePrefix too) does not apply
// to these tables: docs/design.md, section Table names, says why.
func WithTableNames(lease, result string) TableOption {
	return tableOption(func(c *config) { c.tables = tableNames{lease: lease, result: result} })
}

// check returns an error wrapping ErrInvalidArgument when t cannot name
// the tables.
func (t tableNames) check() error {
	for _, n := range []struct{ what, name string }{{"lease", t.lease}, {"result", t.result}} {
		if problem := checkTableName(n.name); problem != "" {
			return invalidf("WithTableNames: %s table name %q %s", n.what, n.name, problem)
		}
	}
	if t.lease == t.result {
		return invalidf("WithTableNames: the lease and result tables must differ, both are %q", t.lease)
	}
	return nil
}

// checkTableName says what is wrong with name as a table name, or returns
// "" when it is fine.
func checkTableName(name string) string {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "has more than one dot: write table or schema.table"
	}
	for _, p := range parts {
		switch {
		case p == "":
			return "has an empty part"
		case len(p) > maxTableName:
			return fmt.Sprintf("has a part longer than %d bytes", maxTableName)
		case p[0] >= '0' && p[0] <= '9':
			return "has a part that starts with a digit"
		}
		for i := 0; i < len(p); i++ {
			if c := p[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return fmt.Sprintf("has %q at offset %d: use lower-case letters, digits and underscores", c, i)
			}
		}
	}
	return ""
}
