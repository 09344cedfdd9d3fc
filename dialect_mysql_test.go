package gormlease_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	_ "time/tzdata" // for loc=Asia/Tokyo on machines without a zoneinfo database

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// A MySQL DSN without parseTime=true, or with a loc other than UTC, would
// make the lease rows unreadable or their times wrong: AutoMigrate refuses
// it, naming the setting, before it creates anything.
func TestAutoMigrate_RejectsMySQLDSNWithoutUTCTimes(t *testing.T) {
	t.Parallel()
	s := testdb.MySQL(t)
	cases := []struct {
		name   string
		params map[string]string
		want   string
	}{
		{"ParseTimeOff", map[string]string{"parseTime": "false"}, "parseTime=true"},
		{"LocNotUTC", map[string]string{"loc": "Asia/Tokyo"}, "loc=UTC"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := s.OpenEmpty(t, tc.params)
			err := gormlease.AutoMigrate(context.Background(), db)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
			assert.False(t, db.Migrator().HasTable("job_lease"), "AutoMigrate created a table")
		})
	}
}

// AutoMigrate can run from many processes at once on an empty database,
// and again on tables that exist; the tables it makes work.
func TestAutoMigrate_ConcurrentCallsSucceed(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.OpenEmpty(t, nil)
		const n = 8
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() { errs <- gormlease.AutoMigrate(context.Background(), db) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db), "on tables that exist")

		r, err := gormlease.NewRunner[string](db)
		require.NoError(t, err)
		target := newTarget(t)
		_, err = r.Run(context.Background(), target, func(context.Context) (string, error) { return "ok", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err)
		got, _, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "ok", got)
	})
}

// docs/schema-mysql.sql makes the same tables as AutoMigrate.
func TestAutoMigrate_MySQLMatchesDocsSchema(t *testing.T) {
	t.Parallel()
	s := testdb.MySQL(t)
	ddl, err := os.ReadFile("docs/schema-mysql.sql")
	require.NoError(t, err)
	fromDocs := s.OpenEmpty(t, nil)
	var code []string // the file without its comment lines
	for _, line := range strings.Split(string(ddl), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			code = append(code, line)
		}
	}
	var statements int
	for _, stmt := range strings.Split(strings.Join(code, "\n"), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			require.NoError(t, fromDocs.Exec(stmt).Error, stmt)
			statements++
		}
	}
	require.Equal(t, 4, statements, "statements in docs/schema-mysql.sql")
	fromCode := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), fromCode))
	for _, table := range []string{"job_lease", "job_result", "job_lease_floor"} {
		assert.Equal(t, showCreateTable(t, fromCode, table), showCreateTable(t, fromDocs, table), table)
	}
}

// showCreateTable returns MySQL's own DDL for table.
func showCreateTable(t *testing.T, db *gorm.DB, table string) string {
	t.Helper()
	var name, ddl string
	require.NoError(t, db.Raw("SHOW CREATE TABLE "+table).Row().Scan(&name, &ddl))
	return ddl
}
