package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
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
	return glEnv(t, map[string]string{dsnEnv: envDSN}, stdin, args...)
}

// glEnv runs the command with args, the environment vars (and no other
// variable) and stdin as input.
func glEnv(t *testing.T, vars map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, env{
		getenv: func(k string) string { return vars[k] },
		stdin:  strings.NewReader(stdin), stdout: &out, stderr: &errOut,
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
			assert.Equal(t, exitNoTarget, r.code)
			assert.Contains(t, r.stderr, "no lease row")

			r = cmd("", "prune", "-older-than", "1h")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "pruned 1 lease rows")
			_, found, err := admin.New(repo).Get(ctx, "a/old")
			require.NoError(t, err)
			assert.False(t, found, "a/old was not pruned")

			r = cmd("n\n", "release", "a/live")
			assert.Equal(t, exitNotConfirmed, r.code)
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
			assert.Equal(t, exitNothingToDo, r.code)
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
		{"UnknownDSN", "", []string{"list", "-dsn", "oracle://scott:tiger@db/orcl"}, `unrecognized DSN "oracle://scott:***@db/orcl"`},
		{"ZeroOlderThan", dsn, []string{"prune", "-older-than", "0s"}, "-older-than 0s: the age must be positive"},
		{"NegativeOlderThan", dsn, []string{"prune", "-older-than", "-1d"}, "-older-than -24h0m0s: the age must be positive"},
		{"BadOlderThan", dsn, []string{"prune", "-older-than", "30days"}, `"30days" is not an age`},
		{"BadMySQLDSN", "", []string{"list", "-dsn", "mysql://root@127.0.0.1/test"}, "mysql://USER:PASSWORD@tcp(HOST:3306)/DB"},
		{"ZeroLimit", dsn, []string{"list", "-limit", "0", "-all"}, "-limit 0: give 1 to 10000 rows per page"},
		{"NoTarget", dsn, []string{"release"}, "give one target"},
		{"ZeroSlot", dsn, []string{"release", "-slot", "0", "t"}, "-slot 0: give a slot's number, from 1 to 100"},
		{"SlotTooHigh", dsn, []string{"stop", "-reason", "x", "-slot", "101", "t"}, "-slot 101: give a slot's number"},
		{"NegativeSlot", dsn, []string{"stop", "-reason", "x", "-slot", "-1", "t"}, "-slot -1: give a slot's number"},
		{"SlotOfPause", dsn, []string{"pause", "-reason", "x", "-slot", "1", "t"}, "flag provided but not defined: -slot"},
		{"NoOlderThan", dsn, []string{"prune"}, "give -older-than"},
		{"TooYoung", dsn, []string{"prune", "-older-than", "1s"}, "less than the minimum, 1m0s"},
		{"BadBatch", dsn, []string{"prune", "-older-than", "1h", "-batch", "-5"}, "PruneOptions.BatchSize -5"},
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
			_, cmd, first, second := twoOfThreeSlots(t, s, "cli_slot_lease", "cli_slot_result", "worker-7", "api/x")

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

// twoOfThreeSlots makes the tables lease and results in s's database, and
// takes two of the three slots of target there as holder; it returns the
// Repository that took them, a way to run a command on the tables, and
// the two leases.
func twoOfThreeSlots(t *testing.T, s *testdb.Server, lease, results, holder, target string,
) (*gormlease.Repository, func(name string, args ...string) result, gormlease.Lease, gormlease.Lease) {
	t.Helper()
	db, names, cmd := onTables(t, s, lease, results)
	repo, err := gormlease.NewRepository(db, names, gormlease.WithHolder(holder))
	require.NoError(t, err)
	var leases [2]gormlease.Lease
	for i := range leases {
		leases[i], err = repo.AcquireSlot(context.Background(), target, 3, time.Hour)
		require.NoError(t, err)
	}
	return repo, cmd, leases[0], leases[1]
}

// A DSN that the command does not recognise (a typo, a path to no file)
// exits 2 with the forms it takes, and creates no file; migrate creates
// the tables where the DSN names a database, in each form that names it.
func TestCommand_DSNForms(t *testing.T) {
	t.Parallel()
	t.Run("UnrecognizedCreatesNothing", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		for _, dsn := range []string{
			filepath.Join(dir, "app.db"),
			filepath.Join(dir, "host=127.0.0.1 user=postgres"),
			"postgress://app@" + dir,
		} {
			for _, cmd := range []string{"list", "migrate"} {
				r := gl(t, "", "", cmd, "-dsn", dsn)
				assert.Equal(t, 2, r.code, r.stderr)
				assert.Contains(t, r.stderr, "unrecognized DSN", dsn)
				assert.Contains(t, r.stderr, "postgres://USER@HOST:5432/DB", dsn)
				assert.Contains(t, r.stderr, "host=HOST user=USER dbname=DB", dsn)
				assert.Contains(t, r.stderr, "USER:PASSWORD@tcp(HOST:3306)/DB", dsn)
				assert.Contains(t, r.stderr, "sqlite:PATH", dsn)
			}
		}
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, entries, "a file was created")
	})

	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			own := s.EmptyDSN(t)
			migrateDSN, listDSN := otherForms(t, s.Name, own)
			r := gl(t, "", "", "list", "-dsn", listDSN)
			if s.Name != "sqlite" { // the SQLite file does not exist yet
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, "run gormlease migrate with the same -dsn")
			}

			r = gl(t, "", "", "migrate", "-dsn", migrateDSN, "-lease-table", "mig_lease", "-result-table", "mig_result")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "mig_lease, mig_result and mig_lease_floor are ready")
			r = gl(t, "", "", "migrate", "-dsn", migrateDSN, "-lease-table", "mig_lease", "-result-table", "mig_result")
			require.Equal(t, 0, r.code, "a second migrate: %s", r.stderr)

			db, err := open(own) // the tables are where the Server's own DSN finds them
			require.NoError(t, err)
			t.Cleanup(func() { closeDB(db) })
			repo, err := gormlease.NewRepository(db, gormlease.WithTableNames("mig_lease", "mig_result"))
			require.NoError(t, err)
			_, err = repo.Acquire(context.Background(), "m/1", time.Hour)
			require.NoError(t, err)

			r = gl(t, "", "", "list", "-dsn", listDSN, "-lease-table", "mig_lease", "-result-table", "mig_result")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Regexp(t, `m/1\s+live\s+1\s`, r.stdout)
		})
	}
}

// otherForms returns two DSNs of the database that dsn, a Server's DSN,
// names, in the forms other than the Server's own: for PostgreSQL the
// keyword form twice; for MySQL the driver's own form and the mysql://
// one; for SQLite sqlite:PATH and the plain path.
func otherForms(t *testing.T, kind, dsn string) (string, string) {
	t.Helper()
	switch kind {
	case "postgres":
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		kw := fmt.Sprintf("host=%s port=%s user=%s dbname=%s", u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"))
		if pw, ok := u.User.Password(); ok {
			kw += " password=" + pw
		}
		for k, v := range u.Query() {
			kw += " " + k + "=" + v[0]
		}
		return kw, kw
	case "mysql":
		return strings.TrimPrefix(dsn, "mysql://"), dsn
	}
	path, _, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	return "sqlite:" + path, path
}

// A row under a minimum hold (gormlease.WithMinHold) shows as a minimum
// hold while it lasts, with its timeout to the hundredth of a second, and
// as released, not expired, once it has passed.
func TestCommand_MinHold(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_hold_lease", "cli_hold_result")
			run := func(target string, hold time.Duration) *gormlease.Runner[string] {
				r, err := gormlease.NewRunner[string](db, names, gormlease.WithMinHold(hold))
				require.NoError(t, err)
				_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "", nil },
					func(*gorm.DB, string) error { return nil })
				require.NoError(t, err)
				return r
			}
			// h/1's hold outlasts the commands below on a loaded machine;
			// h/2's ends soon after its Run.
			// Targets of this run's own, so that -count runs again.
			h1, h2 := fmt.Sprintf("h%d/1", time.Now().UnixNano()), fmt.Sprintf("h%d/2", time.Now().UnixNano())
			run(h1, 9*time.Second)
			r := run(h2, 1500*time.Millisecond)

			list := cmd("list")
			show := cmd("show", h1)
			js := cmd("show", "-json", h1)
			require.Equal(t, 0, list.code, list.stderr)
			// What is left of the hold, at most 9 s, to the hundredth of a
			// second; the timeout, the hold's length or what was left of
			// it when it began, under 10 s too.
			assert.Regexp(t, h1+`\s+live \(min hold\)\s+1\s+\S+\s+\S+\s+\S+\s+\d(\.\d+)?s\s+\d(\.\d+)?s\s`, list.stdout)
			assert.Contains(t, show.stdout, "a minimum hold: the work has ended")
			assert.Contains(t, show.stdout, "hold ends in:")
			var j leaseJSON
			require.NoError(t, json.Unmarshal([]byte(js.stdout), &j), js.stdout)
			assert.True(t, j.MinHold)
			assert.Equal(t, "live", j.State)

			deadline := time.Now().Add(15 * time.Second)
			for {
				page, err := admin.New(r.Repository()).List(ctx, admin.ListOptions{Prefix: h2})
				require.NoError(t, err)
				require.Len(t, page, 1)
				if page[0].State == admin.StateReleased {
					break
				}
				require.True(t, time.Now().Before(deadline), "the hold did not end as released: %s", page[0].State)
				time.Sleep(20 * time.Millisecond)
			}
			list = cmd("list")
			require.Equal(t, 0, list.code, list.stderr)
			assert.Regexp(t, h2+`\s+released\s+1\s+\S+\s+-\s+\S+\s+-\s`, list.stdout)
			assert.NotContains(t, list.stdout, "expired")
			show = cmd("show", h2)
			assert.Contains(t, show.stdout, "its minimum hold has passed")
			assert.Contains(t, show.stdout, "(the end of its minimum hold)")
			rel := cmd("release", "-yes", h2)
			assert.Equal(t, exitNothingToDo, rel.code)
			assert.Contains(t, rel.stderr, "released already")
		})
	}
}

// onTables makes the tables lease and results in s's database, and returns
// the database, the option that names them, and a way to run a command
// on them.
func onTables(t *testing.T, s *testdb.Server, lease, results string) (*gorm.DB, gormlease.TableOption, func(name string, args ...string) result) {
	t.Helper()
	db := s.DB(t)
	names := gormlease.WithTableNames(lease, results)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db, names))
	flags := []string{"-dsn", s.DSN, "-lease-table", lease, "-result-table", results}
	return db, names, func(name string, args ...string) result {
		return gl(t, "", "", append(append([]string{name}, flags...), args...)...)
	}
}

// On tables that an earlier version made, without a column that a later
// one added (hold_generation; stop_reason, of the operate release), a
// command says to migrate, and the migrate command adds the column,
// keeping the rows.
func TestCommand_MigrateUpgradesTables(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		for _, column := range []string{"hold_generation", "stop_reason"} {
			t.Run(s.Name+"/"+column, func(t *testing.T) {
				t.Parallel()
				lease := "cli_old_" + column
				db, names, cmd := onTables(t, s, lease, lease+"_result")
				repo, err := gormlease.NewRepository(db, names)
				require.NoError(t, err)
				_, err = repo.Acquire(context.Background(), "o/1", time.Hour)
				require.NoError(t, err)
				require.NoError(t, db.Exec("ALTER TABLE "+lease+" DROP COLUMN "+column).Error)

				r := cmd("list")
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, "run gormlease migrate")
				r = cmd("migrate")
				require.Equal(t, 0, r.code, r.stderr)
				assert.True(t, db.Migrator().HasColumn(lease, column))
				r = cmd("list")
				require.Equal(t, 0, r.code, r.stderr)
				assert.Regexp(t, `o/1\s+live\s+1\s`, r.stdout)
			})
		}
	}
}

// pause, resume and stop say what they will do and ask first, change
// nothing unless told yes, and then do it; list and show show the pause
// and a pending stop; pause and stop require a reason.
func TestCommand_PauseResumeStop(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := s.DB(t)
			names := gormlease.WithTableNames("cli_op_lease", "cli_op_result")
			require.NoError(t, gormlease.AutoMigrate(ctx, db, names))
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			target := fmt.Sprintf("op/%d", time.Now().UnixNano())
			flags := []string{"-dsn", s.DSN, "-lease-table", "cli_op_lease", "-result-table", "cli_op_result"}
			cmd := func(stdin, name string, args ...string) result {
				return gl(t, "", stdin, append(append([]string{name}, flags...), args...)...)
			}

			r := cmd("", "pause", target)
			assert.Equal(t, 2, r.code, "pause without -reason")
			assert.Contains(t, r.stderr, "-reason")
			r = cmd("y\n", "pause", "-reason", "deploy", target)
			assert.Equal(t, exitNoTarget, r.code, "pause of a target without a row, without -new")
			assert.Contains(t, r.stderr, "-new")
			assert.NotContains(t, r.stdout, "[y/N]")
			_, err = repo.Acquire(ctx, target, time.Minute)
			require.NoError(t, err, "pause without -new made a row")
			r = cmd("n\n", "pause", "-reason", "deploy", target)
			assert.Equal(t, exitNotConfirmed, r.code)
			assert.Contains(t, r.stdout, "Not paused.")
			li, _, err := admin.New(repo).Get(ctx, target)
			require.NoError(t, err)
			require.Nil(t, li.PausedAt, "declining changed something")

			r = cmd("y\n", "pause", "-reason", "deploy", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "Paused")
			r = cmd("", "list", "-prefix", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "paused")
			r = cmd("", "show", "-json", target)
			require.Equal(t, 0, r.code, r.stderr)
			var j map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &j))
			assert.Equal(t, true, j["paused"])
			assert.Equal(t, "deploy", j["pause_reason"])

			r = cmd("y\n", "stop", "-reason", "drain", target)
			require.Equal(t, 0, r.code, r.stderr)
			r = cmd("", "show", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "stop requested:")
			assert.Contains(t, r.stdout, "drain")
			assert.Contains(t, r.stdout, "deploy")

			r = cmd("", "resume", "-yes", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "Resumed")
			r = cmd("", "resume", "-yes", target)
			assert.Equal(t, exitNothingToDo, r.code, "resume of a target not paused")
			_, err = admin.New(repo).ForceRelease(ctx, target)
			require.NoError(t, err)
			r = cmd("", "stop", "-yes", "-reason", "x", target)
			assert.Equal(t, exitNothingToDo, r.code, "stop without a live lease")
			assert.Contains(t, r.stderr, "nothing to stop")
		})
	}
}

// On a semaphore (gormlease.WithSlots), release -slot N and stop -slot N
// say which slot they act on, ask first, and act on that slot only: the
// other slot's holder keeps its lease; release without -slot lists every
// slot it would end, and ends them all. A slot with no lease to end or
// stop says so.
func TestCommand_ReleaseAndStopOneSlot(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			target := fmt.Sprintf("sem/%d", time.Now().UnixNano())
			repo, cmd, gone, kept := twoOfThreeSlots(t, s, "cli_slotop_lease", "cli_slotop_result", "worker-9", target)
			slot := func(l gormlease.Lease) string { return strconv.Itoa(l.Slot) }
			withStdin := func(stdin string, args ...string) result {
				return gl(t, "", stdin, append([]string{args[0], "-dsn", s.DSN, "-lease-table", "cli_slotop_lease",
					"-result-table", "cli_slotop_result"}, args[1:]...)...)
			}

			r := withStdin("n\n", "release", "-slot", slot(gone), target)
			assert.Equal(t, exitNotConfirmed, r.code)
			assert.Contains(t, r.stdout, fmt.Sprintf(`This ends the live lease on slot %d of %q held by "worker-9"`, gone.Slot, target))
			assert.Contains(t, r.stdout, "Release it? [y/N]")
			assert.Contains(t, r.stdout, "Not released.")
			require.NoError(t, repo.Heartbeat(ctx, gone), "a release not confirmed changed the lease")

			r = withStdin("y\n", "release", "-slot", slot(gone), target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, fmt.Sprintf("Released slot %d of %q: generation %d", gone.Slot, target, gone.Generation+1))
			require.ErrorIs(t, repo.Heartbeat(ctx, gone), gormlease.ErrLeaseLost)
			require.NoError(t, repo.Heartbeat(ctx, kept), "the other slot's holder")

			r = cmd("release", "-yes", "-slot", slot(gone), target)
			assert.Equal(t, exitNothingToDo, r.code)
			assert.Contains(t, r.stderr, fmt.Sprintf("slot %d of %q (generation %d) is released already", gone.Slot, target, gone.Generation+1))
			r = cmd("release", "-yes", "-slot", "4", target)
			assert.Equal(t, exitNoTarget, r.code)
			assert.Contains(t, r.stderr, "no lease row for slot 4")
			r = cmd("stop", "-yes", "-reason", "x", "-slot", slot(gone), target)
			assert.Equal(t, exitNothingToDo, r.code)
			assert.Contains(t, r.stderr, "nothing to stop")

			r = cmd("stop", "-yes", "-reason", "drain one", "-slot", slot(kept), target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, fmt.Sprintf("Asked the holder of slot %d of %q to stop: drain one.", kept.Slot, target))
			r = cmd("show", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Regexp(t, fmt.Sprintf(`(?m)^%d\s+live, stop requested\s`, kept.Slot), r.stdout)

			// Without -slot: every slot not released, listed first.
			again, err := repo.AcquireSlot(ctx, target, 3, time.Hour)
			require.NoError(t, err)
			r = withStdin("y\n", "release", target)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "Release these 2 leases? [y/N]")
			for _, l := range []gormlease.Lease{kept, again} {
				assert.Contains(t, r.stdout, fmt.Sprintf("This ends the live lease on slot %d of %q", l.Slot, target))
				assert.Contains(t, r.stdout, fmt.Sprintf("Released slot %d of %q: generation %d", l.Slot, target, l.Generation+1))
				require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost, "slot %d", l.Slot)
			}
			r = cmd("release", "-yes", target)
			assert.Equal(t, exitNothingToDo, r.code)
			assert.Contains(t, r.stderr, "released already")
		})
	}
}

// The package doc's synopsis, the usage text and docs/operating.md name
// every command, and the synopses and operating.md's table of flags
// every flag of each; the package doc and operating.md list every exit
// code: the docs are checked against the code.
func TestDocs_NameEveryCommandAndFlag(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	doc := f.Doc.Text()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	require.NoError(t, err)
	operating := string(raw)
	common := map[string]bool{"dsn": true, "lease-table": true, "result-table": true}
	for name := range commands {
		assert.Regexp(t, `(?m)^  `+name+` `, usage, "the usage text lists %s", name)
		m := regexp.MustCompile(`(?m)^\tgormlease ` + name + `\b(.*)$`).FindStringSubmatch(doc)
		if !assert.NotNil(t, m, "the package doc's synopsis lists %s", name) {
			continue
		}
		assert.Equal(t, specs[name].synopsis, strings.TrimSpace(m[1]), "the package doc's synopsis of %s is the usage text's", name)
		assert.Contains(t, operating, "\ngormlease "+name+" "+specs[name].synopsis+"\n", "operating.md's synopsis of %s", name)
		newCommand(name, env{stderr: io.Discard}).flags.VisitAll(func(fl *flag.Flag) {
			if !common[fl.Name] {
				assert.Regexp(t, `-`+regexp.QuoteMeta(fl.Name)+`\b`, m[1], "the synopsis of %s names -%s", name, fl.Name)
			}
			row := regexp.MustCompile("(?m)^\\| `-" + regexp.QuoteMeta(fl.Name) + "\\b[^|]*\\| ([^|]*) \\|").FindStringSubmatch(operating)
			if assert.NotNil(t, row, "operating.md's table of flags has -%s", fl.Name) {
				assert.True(t, row[1] == "all" || slices.Contains(strings.Split(row[1], ", "), name),
					"operating.md's table gives -%s to %s: %q", fl.Name, name, row[1])
			}
		})
	}
	for code := exitOK; code <= exitTimedOut; code++ {
		line := regexp.MustCompile(fmt.Sprintf(`(?m)^  %d  (.*)$`, code)).FindStringSubmatch(exitCodes)
		require.NotNil(t, line, "the usage text's exit code %d", code)
		assert.Contains(t, doc, fmt.Sprintf("%d  %s", code, line[1]), "the package doc's exit code %d", code)
		assert.Regexp(t, fmt.Sprintf(`(?m)^\| %d \| `, code), operating, "operating.md's exit code %d", code)
	}
}
