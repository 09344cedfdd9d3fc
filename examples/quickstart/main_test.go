package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// TestMain runs the tests; goroutine leaks fail the run (testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }

// The program makes a report, saves it in its own table and says so; run
// again, it makes the next one under the next generation; while another
// process holds the report's lease, it says so and runs nothing. On SQLite
// by default, and on PostgreSQL by a DSN.
func TestQuickstart(t *testing.T) {
	dsns := map[string]string{
		"sqlite":   filepath.Join(t.TempDir(), "quickstart.db"),
		"postgres": testdb.Postgres(t).DSN,
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			user := "user-" + filepath.Base(t.Name())
			say := func() string {
				t.Helper()
				var out bytes.Buffer
				require.NoError(t, run(context.Background(), dsn, user, &out))
				return out.String()
			}
			first := say()
			assert.Regexp(t, `^saved report \d+ of `+user+`: score 97, generation 1\n$`, first)
			assert.Regexp(t, `^saved report \d+ of `+user+`: score 97, generation 2\n$`, say())

			db, err := open(dsn)
			require.NoError(t, err)
			sqlDB, err := db.DB()
			require.NoError(t, err)
			t.Cleanup(func() { sqlDB.Close() })
			_, release := leasetest.Occupy(t, db, "report:"+user)
			assert.Equal(t, "the report of "+user+" is being made elsewhere\n", say())
			release()
			var reports int64
			require.NoError(t, db.Model(&Report{}).Where(&Report{UserName: user}).Count(&reports).Error)
			assert.EqualValues(t, 2, reports, "reports saved")
		})
	}
}
