package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// list filters by every state the console filters on, paused included
// (whatever the lease's state), and by holder, and orders by key, age,
// time held or expiry; -after takes the last row's cursor, so that -all
// pages through any order, each row once.
func TestCommand_ListStatesHoldersOrders(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_lso_lease", "cli_lso_result")
			p := fmt.Sprintf("lso%d/", time.Now().UnixNano())
			holders := map[string]*gormlease.Repository{}
			acquire := func(holder, target string) gormlease.Lease {
				if holders[holder] == nil {
					repo, err := gormlease.NewRepository(db, names, gormlease.WithHolder(holder))
					require.NoError(t, err)
					holders[holder] = repo
				}
				l, err := holders[holder].Acquire(ctx, p+target, time.Hour)
				require.NoError(t, err)
				return l
			}
			set := func(target string, cols map[string]any) {
				require.NoError(t, db.Table("cli_lso_lease").Where("target_id = ?", p+target).Updates(cols).Error)
			}
			// a, b, d live (held 3h, 1h, 2h); c released; e paused and
			// released; f expired.
			acquire("w-a", "a")
			acquire("w-b", "b")
			require.NoError(t, holders["w-b"].Release(ctx, acquire("w-b", "c")))
			acquire("w-a", "d")
			require.NoError(t, holders["w-a"].Release(ctx, acquire("w-a", "e")))
			acquire("w-c", "f")
			op := admin.New(holders["w-a"])
			require.NoError(t, op.Pause(ctx, p+"d", "x"))
			require.NoError(t, op.Pause(ctx, p+"e", "x"))
			set("a", map[string]any{"acquired_at": s.Ago(3 * time.Hour)})
			set("b", map[string]any{"acquired_at": s.Ago(time.Hour)})
			set("d", map[string]any{"acquired_at": s.Ago(2 * time.Hour)})
			set("f", map[string]any{"updated_at": s.Ago(2 * time.Hour), "acquired_at": s.Ago(5 * time.Hour)})

			// targets lists the targets of list's output, in its order,
			// without the prefix.
			targets := func(args ...string) []string {
				t.Helper()
				r := cmd("list", append([]string{"-prefix", p}, args...)...)
				require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
				return regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(p)+`(\S+)`).FindAllString(r.stdout, -1)
			}
			strip := func(ts ...string) []string {
				for i := range ts {
					ts[i] = p + ts[i]
				}
				return ts
			}

			assert.Equal(t, strip("d", "e"), targets("-state", "paused"), "the paused, live and released")
			assert.Equal(t, strip("a", "b", "d"), targets("-state", "live"))
			assert.Equal(t, strip("f"), targets("-state", "expired"))
			assert.Equal(t, strip("c", "e"), targets("-state", "released"))
			assert.Equal(t, strip("a", "d", "e"), targets("-holder", "w-a"))
			assert.Equal(t, strip("a"), targets("-holder", "w-a", "-state", "live", "-order", "held", "-limit", "1"))
			assert.Empty(t, targets("-holder", "w-"), "a holder is matched exactly")
			held := targets("-order", "held")
			require.Len(t, held, 6)
			assert.Equal(t, strip("f", "a", "d", "b"), held[:4], "the longest held first")
			assert.Equal(t, p+"f", targets("-order", "expiry")[0], "the expired first")

			// Every page, one row a page, in each order: each row once.
			for _, order := range []string{"key", "age", "held", "expiry"} {
				r := cmd("list", "-prefix", p, "-order", order, "-limit", "1", "-all", "-json")
				require.Equal(t, exitOK, r.code, r.stderr)
				dec := json.NewDecoder(strings.NewReader(r.stdout))
				var got []string
				for dec.More() {
					var j leaseJSON
					require.NoError(t, dec.Decode(&j))
					assert.NotEmpty(t, j.Cursor)
					got = append(got, j.Target)
				}
				want := targets("-order", order)
				assert.Equal(t, want, got, "-order %s page by page", order)
			}
			r := cmd("list", "-prefix", p, "-order", "age", "-limit", "2")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Regexp(t, `\(the first 2 rows: -all lists every page, -order age -after "\S+" the next one\)`, r.stderr)
			r = cmd("list", "-order", "oldest")
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, `"oldest" is not an order: give key, age, held or expiry`)
		})
	}
}

// prune -dry-run counts the rows that prune would delete, and deletes
// nothing; prune then deletes as many.
func TestCommand_PruneDryRun(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_dry_lease", "cli_dry_result")
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			op := admin.New(repo)
			p := fmt.Sprintf("dry%d/", time.Now().UnixNano())
			for i := range 3 {
				l, err := repo.Acquire(ctx, fmt.Sprintf("%sold-%d", p, i), time.Hour)
				require.NoError(t, err)
				require.NoError(t, repo.Release(ctx, l))
			}
			require.NoError(t, db.Table("cli_dry_lease").Where("target_id LIKE ?", p+"old-%").Update("released_at", s.Ago(2*time.Hour)).Error)
			_, err = repo.Acquire(ctx, p+"live", time.Hour)
			require.NoError(t, err)
			rows := func() int {
				page, err := op.List(ctx, admin.ListOptions{Prefix: p})
				require.NoError(t, err)
				return len(page)
			}

			r := cmd("prune", "-dry-run", "-older-than", "1h")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "would prune 3 lease rows and their results released or expired more than 1h0m0s ago (-dry-run: nothing deleted)")
			r = cmd("prune", "-dry-run", "-json", "-older-than", "1h")
			require.Equal(t, exitOK, r.code, r.stderr)
			var j pruneJSON
			decodeOne(t, r.stdout, &j)
			assert.True(t, j.DryRun)
			assert.Equal(t, int64(0), j.Deleted)
			if assert.NotNil(t, j.WouldDelete) {
				assert.Equal(t, int64(3), *j.WouldDelete)
			}
			assert.Equal(t, 4, rows(), "a dry run deleted rows")
			r = cmd("prune", "-dry-run", "-older-than", "3h")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "would prune 0 lease rows")

			r = cmd("prune", "-json", "-older-than", "1h")
			require.Equal(t, exitOK, r.code, r.stderr)
			j = pruneJSON{}
			decodeOne(t, r.stdout, &j)
			assert.False(t, j.DryRun)
			assert.Equal(t, int64(3), j.Deleted)
			assert.Nil(t, j.WouldDelete)
			assert.Equal(t, 1, rows())
		})
	}
}

// The operator's name is recorded with each action: pause in paused_by,
// stop in stop_by, release in the failure it writes; from -as, else
// $GORMLEASE_OPERATOR, else USER@HOST.
func TestCommand_OperatorRecorded(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, _ := onTables(t, s, "cli_who_lease", "cli_who_result")
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			op := admin.New(repo)
			target := fmt.Sprintf("who%d/t", time.Now().UnixNano())
			l, err := repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			cmd := func(vars map[string]string, name string, args ...string) result {
				return glEnv(t, vars, "", append([]string{name, "-yes", "-dsn", s.DSN, "-lease-table", "cli_who_lease",
					"-result-table", "cli_who_result"}, append(args, target)...)...)
			}
			row := func() gormlease.JobLease {
				row, found, err := op.Get(ctx, target)
				require.NoError(t, err)
				require.True(t, found)
				return row
			}
			env := map[string]string{operatorEnv: "dave"}

			r := cmd(env, "pause", "-as", "alice", "-reason", "deploy")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Equal(t, "alice", deref(row().PausedBy), "-as before $GORMLEASE_OPERATOR")
			r = cmd(env, "stop", "-reason", "drain")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Equal(t, "dave", deref(row().StopBy), "$GORMLEASE_OPERATOR")
			r = cmd(nil, "pause", "-reason", "again")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Equal(t, defaultOperator(), deref(row().PausedBy), "USER@HOST")
			r = cmd(nil, "release", "-as", "carol")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Equal(t, "released by force by operator carol", deref(row().Failure))
			require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost)
		})
	}
}
