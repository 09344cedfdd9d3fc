package gormlease_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
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
	// The file without its comment lines, split as the mysql client
	// splits it: at the delimiter, which a DELIMITER line changes.
	var statements int
	delimiter, stmt := ";", ""
	for _, line := range strings.Split(string(ddl), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "DELIMITER "); ok {
			delimiter = strings.TrimSpace(d)
			continue
		}
		stmt += line + "\n"
		for {
			i := strings.Index(stmt, delimiter)
			if i < 0 {
				break
			}
			if run := strings.TrimSpace(stmt[:i]); run != "" {
				require.NoError(t, fromDocs.Exec(run).Error, run)
				statements++
			}
			stmt = stmt[i+len(delimiter):]
		}
	}
	require.Empty(t, strings.TrimSpace(stmt), "text after the last statement")
	require.Equal(t, 7, statements, "statements in docs/schema-mysql.sql")
	fromCode := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), fromCode, gormlease.WithHistory()))
	for _, table := range []string{"job_lease", "job_result", "job_lease_floor", "job_lease_event"} {
		assert.Equal(t, showCreateTable(t, fromCode, table), showCreateTable(t, fromDocs, table), table)
	}
	assert.Equal(t, triggers(t, fromCode), triggers(t, fromDocs), "the triggers")
	assert.Len(t, triggers(t, fromCode), 2)
}

// triggers returns the triggers of db's database, by name, with their
// timing, event, table and body.
func triggers(t *testing.T, db *gorm.DB) map[string]string {
	t.Helper()
	rows, err := db.Raw("SELECT trigger_name, action_timing, event_manipulation, event_object_table, action_statement" +
		" FROM information_schema.triggers WHERE trigger_schema = DATABASE()").Rows()
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, timing, event, table, body string
		require.NoError(t, rows.Scan(&name, &timing, &event, &table, &body))
		out[name] = timing + " " + event + " ON " + table + ": " + body
	}
	require.NoError(t, rows.Err())
	return out
}

// showCreateTable returns MySQL's own DDL for table.
func showCreateTable(t *testing.T, db *gorm.DB, table string) string {
	t.Helper()
	var name, ddl string
	require.NoError(t, db.Raw("SHOW CREATE TABLE "+table).Row().Scan(&name, &ddl))
	return ddl
}

// A trigger on the lease table that runs a statement makes MySQL and
// MariaDB report no insert ID, where the acquire reads its generation
// from: the acquire then reads it back by its token, for leases and for
// slots alike, and every acquire still takes the next generation.
func TestMySQL_TriggersOnTheLeaseTable(t *testing.T) {
	t.Parallel()
	db := testdb.MySQL(t).DB(t)
	names := gormlease.WithTableNames("trigger_lease", "trigger_result")
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db, names))
	require.NoError(t, db.Exec("CREATE TABLE trigger_audit (target_id VARCHAR(255), generation BIGINT)").Error)
	for _, when := range []string{"INSERT", "UPDATE"} {
		require.NoError(t, db.Exec("CREATE TRIGGER trigger_lease_after_"+strings.ToLower(when)+
			" AFTER "+when+" ON trigger_lease FOR EACH ROW"+
			" INSERT INTO trigger_audit VALUES (NEW.target_id, NEW.generation)").Error)
	}
	ctx := context.Background()
	for _, slots := range []int{1, 3} {
		r, err := gormlease.NewRunner[string](db, append(fast(50*time.Millisecond, time.Second), names, gormlease.WithSlots(slots))...)
		require.NoError(t, err)
		target := newTarget(t)
		for i := 1; i <= 3; i++ {
			var gen int64
			_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				gen = l.Generation
				return "ok", nil
			}, gormlease.SaveJSON[string])
			require.NoError(t, err, "Run %d with %d slots", i, slots)
			if slots == 1 {
				assert.EqualValues(t, i, gen, "Run %d took another generation", i)
			} else {
				assert.Positive(t, gen)
			}
		}
	}
	var audited int64
	require.NoError(t, db.Table("trigger_audit").Count(&audited).Error)
	assert.Positive(t, audited, "the triggers did not run")
}
