package gormlease_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// offLimitsSQL are constructs that the PostgreSQL statements must not use,
// with the reason: PostgreSQL-compatible distributed databases lack them.
var offLimitsSQL = map[string]string{
	"make_interval": "CockroachDB has no make_interval: write CAST(? AS bigint) * interval '1 microsecond'",
}

// The library's SQL, in its Go files and in docs/schema.sql, uses none of
// the constructs in offLimitsSQL.
func TestPostgresSQL_AvoidsUnportableConstructs(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	files = append(files, filepath.Join("docs", "schema.sql"))
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		checked++
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue // a comment may name what it avoids
			}
			for construct, why := range offLimitsSQL {
				if strings.Contains(line, construct) {
					t.Errorf("%s:%d uses %s: %s", f, i+1, construct, why)
				}
			}
		}
	}
	require.Greater(t, checked, 10, "the library's files were not found")
}

// noAdvisoryLock makes, in a schema of its own, a pg_advisory_xact_lock
// that fails with state, as the function fails on a server that lacks it,
// and returns a pool whose search_path finds it before pg_catalog's. The
// pool's schema has no gormlease tables.
func noAdvisoryLock(t *testing.T, s *testdb.Server, state string) *gorm.DB {
	t.Helper()
	empty := s.OpenEmpty(t, nil)
	var schema string
	require.NoError(t, empty.Raw("SELECT current_schema()").Scan(&schema).Error)
	require.NotEmpty(t, schema)
	require.NoError(t, empty.Exec(fmt.Sprintf(`CREATE FUNCTION %s.pg_advisory_xact_lock(bigint) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'unknown function: pg_advisory_xact_lock()' USING ERRCODE = '%s'; END $$`,
		schema, state)).Error)
	db := s.Open(t, map[string]string{"search_path": schema + ", pg_catalog"})
	// The stand-in is the one the pool's statements call.
	err := db.Exec("SELECT pg_advisory_xact_lock(1)").Error
	require.Error(t, err, "the stand-in pg_advisory_xact_lock was not called")
	return db
}

// On a server without pg_advisory_xact_lock (CockroachDB before its
// transaction-level advisory locks: undefined function; YugabyteDB without
// its advisory-lock flags: not supported), concurrent AutoMigrates all
// succeed and make the tables once, although nothing serialises them.
func TestAutoMigrate_WithoutAdvisoryLock(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	for _, tc := range []struct{ name, state string }{
		{"UndefinedFunction", "42883"},
		{"FeatureNotSupported", "0A000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Several rounds, each on fresh tables, so that the migrations
			// collide on creating them.
			for round := range 3 {
				db := noAdvisoryLock(t, s, tc.state)
				require.NoError(t, migrateAtOnce(db, 8), "round %d", round)

				// The tables work: a lease is taken and saved once.
				runner, err := gormlease.NewRunner[int](db)
				require.NoError(t, err)
				_, err = runner.Run(t.Context(), "portable", func(context.Context) (int, error) { return 7, nil },
					gormlease.SaveJSON[int])
				require.NoError(t, err)
				saved, row, err := gormlease.LoadJSON[int](t.Context(), db, "portable")
				require.NoError(t, err)
				require.Equal(t, 7, saved)
				require.EqualValues(t, 1, row.Generation)
			}
		})
	}
}
