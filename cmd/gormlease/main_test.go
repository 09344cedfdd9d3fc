package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests; goroutine leaks fail the run (see testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }

// result is what one run of the command did.
type result struct {
	code           int
	stdout, stderr string
}

// gl runs the command with args, dsnEnv set to envDSN and stdin as input.
func gl(t *testing.T, envDSN, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, env{
		getenv: func(k string) string {
			if k == dsnEnv {
				return envDSN
			}
			return ""
		},
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut,
	})
	return result{code, out.String(), errOut.String()}
}

// The command lists, shows, prunes and releases by force on every
// database, through tables of other names: list filters by prefix and
// state, as a table or JSON; prune deletes only what ended long ago;
// release says what it will do and asks first, changes nothing unless
// told yes, and then fences the holder off: its heartbeat and its save get
// ErrLeaseLost.
func TestCommand_OnEveryDatabase(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := s.DB(t)
			names := gormlease.WithTableNames("cli_lease", "cli_result")
			require.NoError(t, gormlease.AutoMigrate(context.Background(), db, names))
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			live, err := repo.Acquire(ctx, "a/live", time.Hour)
			require.NoError(t, err)
			rel, err := repo.Acquire(ctx, "a/old", time.Hour)
			require.NoError(t, err)
			require.NoError(t, repo.Release(ctx, rel))
			require.NoError(t, db.Table("cli_lease").Where("target_id = ?", "a/old").Update("released_at", s.Ago(2*time.Hour)).Error)
			other, err := repo.Acquire(ctx, "b/x", time.Hour)
			require.NoError(t, err)
			flags := []string{"-dsn", s.DSN, "-lease-table", "cli_lease", "-result-table", "cli_result"}
			cmd := func(stdin, name string, args ...string) result {
				return gl(t, "", stdin, append(append([]string{name}, flags...), args...)...)
			}

			r := cmd("", "list", "-prefix", "a/")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "TARGET")
			assert.Regexp(t, `a/live\s+live\s+1\s`, r.stdout)
			assert.Regexp(t, `a/old\s+released\s+1\s`, r.stdout)
			assert.NotContains(t, r.stdout, "b/x")

			r = cmd("", "list", "-json", "-state", "live", "-prefix", "a/")
			require.Equal(t, 0, r.code, r.stderr)
			var j leaseJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &j), r.stdout)
			assert.Equal(t, "a/live", j.Target)
			assert.Equal(t, "live", j.State)
			if assert.NotNil(t, j.TimeoutSeconds) {
				assert.InDelta(t, 3600, *j.TimeoutSeconds, 0.001)
			}

			r = cmd("", "show", "a/live")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Regexp(t, `state:\s+live`, r.stdout)
			assert.Contains(t, r.stdout, live.Token.String())
			r = cmd("", "show", "a/none")
			assert.Equal(t, 1, r.code)
			assert.Contains(t, r.stderr, "no lease row")

			r = cmd("", "prune", "-older-than", "1h")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "pruned 1 lease rows")
			_, found, err := repo.Get(ctx, "a/old")
			require.NoError(t, err)
			assert.False(t, found, "a/old was not pruned")

			r = cmd("n\n", "release", "a/live")
			assert.Equal(t, 1, r.code)
			assert.Contains(t, r.stdout, `This ends the live lease on "a/live"`)
			assert.Contains(t, r.stdout, "generation 2")
			assert.Contains(t, r.stdout, "Release it? [y/N]")
			assert.Contains(t, r.stderr, "not confirmed")
			require.NoError(t, repo.Heartbeat(ctx, live), "a release not confirmed changed the lease")

			r = cmd("y\n", "release", "a/live")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, `Released "a/live": generation 2`)
			require.ErrorIs(t, repo.Heartbeat(ctx, live), gormlease.ErrLeaseLost)
			require.ErrorIs(t, repo.CommitIfOwner(ctx, live, func(*gorm.DB) error { return nil }), gormlease.ErrLeaseLost)

			r = cmd("", "release", "-yes", "b/x")
			require.Equal(t, 0, r.code, r.stderr)
			assert.NotContains(t, r.stdout, "[y/N]")
			require.ErrorIs(t, repo.Heartbeat(ctx, other), gormlease.ErrLeaseLost)
			r = cmd("", "release", "-yes", "b/x")
			assert.Equal(t, 1, r.code)
			assert.Contains(t, r.stderr, "released already")

			// The DSN from the environment.
			r = gl(t, s.DSN, "", "show", "-lease-table", "cli_lease", "-result-table", "cli_result", "b/x")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Regexp(t, `state:\s+released`, r.stdout)
		})
	}
}

// On a database without the gormlease tables every command fails, exit
// 1, with an error that names the lease table it looked for and says how
// to make the tables, instead of the database's own wording; where only
// the tables of a later version are missing, it names those.
func TestCommand_MissingTable(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("EveryCommand", func(t *testing.T) {
				t.Parallel()
				dsn := s.EmptyDSN(t)
				for _, args := range [][]string{
					{"list"}, {"list", "-prefix", "a/"}, {"show", "a/x"},
					{"prune", "-older-than", "720h"}, {"release", "-yes", "a/x"},
				} {
					r := gl(t, dsn, "", args...)
					assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
					assert.Contains(t, r.stderr, "gormlease "+args[0]+`: the lease table "job_lease" does not exist`, args)
					assert.Contains(t, r.stderr, "call gormlease.AutoMigrate(ctx, db) from Go", args)
					assert.Contains(t, r.stderr, "-lease-table", args)
					assert.Empty(t, r.stdout, args)
				}
			})

			t.Run("OtherNames", func(t *testing.T) {
				t.Parallel()
				r := gl(t, s.EmptyDSN(t), "", "list", "-lease-table", "cli_lease", "-result-table", "cli_result")
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, `the lease table "cli_lease" does not exist`)
				assert.Contains(t, r.stderr, `gormlease.AutoMigrate(ctx, db, gormlease.WithTableNames("cli_lease", "cli_result"))`)
			})

			t.Run("FloorTableMissing", func(t *testing.T) {
				t.Parallel()
				dsn := s.EmptyDSN(t)
				db, err := open(dsn)
				require.NoError(t, err)
				t.Cleanup(func() { closeDB(db) })
				require.NoError(t, gormlease.AutoMigrate(context.Background(), db))
				require.NoError(t, db.Migrator().DropTable("job_lease_floor"))

				r := gl(t, dsn, "", "prune", "-older-than", "720h")
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, `the lease table "job_lease" exists but "job_lease_floor" does not`)
				assert.Contains(t, r.stderr, "call gormlease.AutoMigrate(ctx, db) from Go")
				r = gl(t, dsn, "", "list")
				assert.Equal(t, 0, r.code, r.stderr)
			})
		})
	}
}

// Bad usage exits 2 with an error that says what to do.
func TestCommand_BadUsage(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLite(t).DSN
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"NoCommand", dsn, nil, "usage: gormlease COMMAND"},
		{"UnknownCommand", dsn, []string{"drop"}, `unknown command "drop"`},
		{"UnknownFlag", dsn, []string{"list", "-colour"}, "flag provided but not defined: -colour"},
		{"NoDSN", "", []string{"list"}, "give -dsn or set GORMLEASE_DSN"},
		{"UnknownDSN", "", []string{"list", "-dsn", "oracle://scott:tiger@db/orcl"}, `unsupported DSN "oracle://scott:***@db/orcl"`},
		{"BadMySQLDSN", "", []string{"list", "-dsn", "mysql://root@127.0.0.1/test"}, "mysql://USER:PASSWORD@tcp(HOST:3306)/DB"},
		{"ZeroLimit", dsn, []string{"list", "-limit", "0", "-all"}, "-limit 0: give 1 to 10000 rows per page"},
		{"NoTarget", dsn, []string{"release"}, "give one target"},
		{"NoOlderThan", dsn, []string{"prune"}, "give -older-than"},
		{"TooYoung", dsn, []string{"prune", "-older-than", "1s"}, "less than the minimum, 1m0s"},
		{"BadBatch", dsn, []string{"prune", "-older-than", "1h", "-batch", "-5"}, "WithBatchSize: batch size -5"},
		{"BadState", dsn, []string{"list", "-state", "held"}, `state "held"`},
		{"BadTableName", dsn, []string{"list", "-lease-table", "Job-Lease"}, "lease table name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := gl(t, tc.env, "", tc.args...)
			assert.Equal(t, 2, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.want)
		})
	}
}

// For a semaphore (gormlease.WithSlots), list shows each slot row under
// its target with its slot, and show lists the target's holders, one line
// per slot, as a table or JSON.
func TestCommand_ShowsSlotHolders(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := s.DB(t)
			names := gormlease.WithTableNames("cli_slot_lease", "cli_slot_result")
			require.NoError(t, gormlease.AutoMigrate(ctx, db, names))
			repo, err := gormlease.NewRepository(db, names, gormlease.WithHolder("worker-7"))
			require.NoError(t, err)
			first, err := repo.AcquireSlot(ctx, "api/x", 3, time.Hour)
			require.NoError(t, err)
			second, err := repo.AcquireSlot(ctx, "api/x", 3, time.Hour)
			require.NoError(t, err)
			flags := []string{"-dsn", s.DSN, "-lease-table", "cli_slot_lease", "-result-table", "cli_slot_result"}
			cmd := func(name string, args ...string) result {
				return gl(t, "", "", append(append([]string{name}, flags...), args...)...)
			}

			r := cmd("list", "-prefix", "api/")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "SLOT")
			for _, l := range []gormlease.Lease{first, second} {
				assert.Regexp(t, fmt.Sprintf(`(?m)^api/x\s+live\s+%d\s+worker-7\s.*\s%d$`, l.Generation, l.Slot), r.stdout)
			}
			assert.NotContains(t, r.stdout, "\x1f")

			r = cmd("show", "api/x")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Regexp(t, `slot rows:\s+3, 2 held`, r.stdout)
			assert.Contains(t, r.stdout, first.Token.String())
			assert.Contains(t, r.stdout, second.Token.String())

			r = cmd("show", "-json", "api/x")
			require.Equal(t, 0, r.code, r.stderr)
			dec := json.NewDecoder(strings.NewReader(r.stdout))
			var slots []int
			for dec.More() {
				var j leaseJSON
				require.NoError(t, dec.Decode(&j))
				assert.Equal(t, "api/x", j.Target)
				slots = append(slots, j.Slot)
			}
			assert.Equal(t, []int{1, 2, 3}, slots)
		})
	}
}
