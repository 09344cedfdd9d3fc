package gormlease_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// asMySQL returns db, on MariaDB, on a pool that answers the question the
// MySQL backend asks a server once (what it is: SHOW VARIABLES of version
// and wsrep_on) as MySQL 8.0 would. Its Repositories then run MySQL's
// statements, which have no RETURNING, on MariaDB, where the tests have a
// server.
func asMySQL(t testing.TB, db *gorm.DB) *gorm.DB {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	// A session with a context of its own has a Statement of its own:
	// setting its pool leaves db's alone.
	out := db.Session(&gorm.Session{NewDB: true, Context: context.Background()})
	out.Statement.ConnPool = mysqlLooking{sqlDB}
	return out
}

// mysqlLooking is a MariaDB pool that reads as MySQL 8.0 to the backend's
// question of what the server is.
type mysqlLooking struct{ *sql.DB }

// QueryContext implements gorm.ConnPool.
func (p mysqlLooking) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if strings.HasPrefix(query, "SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'version')") {
		query = "SELECT 'version', '8.0.36'"
	}
	return p.DB.QueryContext(ctx, query, args...)
}
