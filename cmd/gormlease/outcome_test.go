package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// A script tells the outcomes apart by the exit code alone: a target
// without a row is 3 for each command that acts on one or shows it, a
// target with nothing to act on is 4, an answer other than y is 5; none of
// them changes anything, and with -json none writes on stdout.
func TestCommand_ExitCodes(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, _ := onTables(t, s, "cli_exit_lease", "cli_exit_result")
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			op := admin.New(repo)
			run := fmt.Sprintf("x%d/", time.Now().UnixNano())
			none, released, held := run+"none", run+"released", run+"held"
			l, err := repo.Acquire(ctx, released, time.Hour)
			require.NoError(t, err)
			require.NoError(t, repo.Release(ctx, l))
			heldLease, err := repo.Acquire(ctx, held, time.Hour)
			require.NoError(t, err)
			flags := []string{"-dsn", s.DSN, "-lease-table", "cli_exit_lease", "-result-table", "cli_exit_result"}
			cmd := func(stdin, name string, args ...string) result {
				return gl(t, "", stdin, append(append([]string{name}, flags...), args...)...)
			}

			for _, tc := range []struct {
				name  string
				stdin string
				args  []string
				code  int
				want  string
			}{
				{"ShowNone", "", []string{"show", none}, exitNoTarget, "no lease row"},
				{"ShowNoneJSON", "", []string{"show", "-json", none}, exitNoTarget, "no lease row"},
				{"ReleaseNone", "", []string{"release", "-yes", none}, exitNoTarget, "no lease row"},
				{"ReleaseNoneJSON", "", []string{"release", "-yes", "-json", none}, exitNoTarget, "no lease row"},
				{"ReleaseNoSlot", "", []string{"release", "-yes", "-slot", "2", held}, exitNoTarget, "no lease row for slot 2"},
				{"PauseNone", "", []string{"pause", "-yes", "-reason", "r", none}, exitNoTarget, "-new"},
				{"PauseNoneJSON", "", []string{"pause", "-yes", "-json", "-reason", "r", none}, exitNoTarget, "-new"},
				{"ResumeNone", "", []string{"resume", "-yes", none}, exitNoTarget, "no lease row"},
				{"StopNone", "", []string{"stop", "-yes", "-reason", "r", none}, exitNoTarget, "no lease row"},
				{"StopNoneWait", "", []string{"stop", "-yes", "-reason", "r", "-wait", none}, exitNoTarget, "no lease row"},
				{"StopNoSlot", "", []string{"stop", "-yes", "-reason", "r", "-slot", "1", held}, exitNoTarget, "no lease row for slot 1"},
				{"ReleaseReleased", "", []string{"release", "-yes", released}, exitNothingToDo, "released already"},
				{"ReleaseReleasedJSON", "", []string{"release", "-yes", "-json", released}, exitNothingToDo, "released already"},
				{"StopReleased", "", []string{"stop", "-yes", "-reason", "r", released}, exitNothingToDo, "nothing to stop"},
				{"StopReleasedJSON", "", []string{"stop", "-yes", "-json", "-reason", "r", released}, exitNothingToDo, "nothing to stop"},
				{"ResumeNotPaused", "", []string{"resume", "-yes", held}, exitNothingToDo, "not paused"},
				{"ResumeNotPausedJSON", "", []string{"resume", "-yes", "-json", held}, exitNothingToDo, "not paused"},
				{"ReleaseDeclined", "n\n", []string{"release", held}, exitNotConfirmed, "not confirmed"},
				{"PauseDeclined", "no\n", []string{"pause", "-reason", "r", held}, exitNotConfirmed, "not confirmed"},
				{"StopDeclined", "\n", []string{"stop", "-reason", "r", "-wait", held}, exitNotConfirmed, "not confirmed"},
				{"StopNoAnswer", "", []string{"stop", "-reason", "r", held}, exitNotConfirmed, "not confirmed"},
			} {
				r := cmd(tc.stdin, tc.args[0], tc.args[1:]...)
				assert.Equal(t, tc.code, r.code, "%s: %s", tc.name, r.stderr)
				assert.Contains(t, r.stderr, tc.want, tc.name)
				if strings.Contains(tc.name, "JSON") {
					assert.Empty(t, r.stdout, tc.name)
				}
			}

			// Nothing changed: no row was made, the held lease is held
			// and asked nothing, nothing is paused.
			_, found, err := op.Get(ctx, none)
			require.NoError(t, err)
			assert.False(t, found, "a command made a row for a target without one")
			require.NoError(t, repo.Heartbeat(ctx, heldLease), "a declined release changed the lease")
			row, _, err := op.Get(ctx, held)
			require.NoError(t, err)
			assert.Nil(t, row.PausedAt, "a declined pause paused")
			assert.Nil(t, row.StopGeneration, "a declined stop asked")

			// A declined resume is 5 too.
			require.NoError(t, op.Pause(ctx, held, "r"))
			r := cmd("n\n", "resume", held)
			assert.Equal(t, exitNotConfirmed, r.code, r.stderr)
			row, _, err = op.Get(ctx, held)
			require.NoError(t, err)
			assert.NotNil(t, row.PausedAt, "a declined resume resumed")

			// pause -new makes the row of a target without one, paused.
			r = cmd("", "pause", "-yes", "-new", "-reason", "before its first run", none)
			require.Equal(t, exitOK, r.code, r.stderr)
			row, found, err = op.Get(ctx, none)
			require.NoError(t, err)
			require.True(t, found)
			assert.NotNil(t, row.PausedAt)
		})
	}
}

// decodeOne decodes stdout as exactly one JSON object into v.
func decodeOne(t *testing.T, stdout string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), stdout)
	assert.False(t, dec.More(), "more than one JSON value: %s", stdout)
	assert.True(t, strings.HasSuffix(stdout, "}\n"), "not one line: %q", stdout)
}

// -json makes every command write its outcome as one JSON object on
// stdout, and nothing else there: prune, release, pause, resume, stop
// and migrate; a command that would ask needs -yes (bad usage, 2,
// otherwise, changing nothing and reading nothing from stdin).
func TestCommand_JSONOutcomes(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_json_lease", "cli_json_result")
			repo, err := gormlease.NewRepository(db, names, gormlease.WithHolder("worker-3"))
			require.NoError(t, err)
			op := admin.New(repo)
			run := fmt.Sprintf("j%d/", time.Now().UnixNano())
			target, old := run+"t", run+"old"
			l, err := repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			o, err := repo.Acquire(ctx, old, time.Hour)
			require.NoError(t, err)
			require.NoError(t, repo.Release(ctx, o))
			require.NoError(t, db.Table("cli_json_lease").Where("target_id = ?", old).Update("released_at", s.Ago(2*time.Hour)).Error)
			withEnv := func(stdin, name string, args ...string) result {
				return glEnv(t, map[string]string{operatorEnv: "alice"}, stdin, append([]string{name, "-dsn", s.DSN,
					"-lease-table", "cli_json_lease", "-result-table", "cli_json_result"}, args...)...)
			}

			// Without -yes: bad usage; stdin is not read, nothing changes.
			for _, args := range [][]string{
				{"release", "-json", target}, {"pause", "-json", "-reason", "r", target},
				{"resume", "-json", target}, {"stop", "-json", "-reason", "r", target},
			} {
				r := withEnv("y\n", args[0], args[1:]...)
				assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
				assert.Contains(t, r.stderr, "-json needs -yes", args)
				assert.Empty(t, r.stdout, args)
			}
			require.NoError(t, repo.Heartbeat(ctx, l), "a refused -json changed the lease")

			r := withEnv("", "pause", "-yes", "-json", "-reason", "deploy", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			var a actionJSON
			decodeOne(t, r.stdout, &a)
			assert.Equal(t, "pause", a.Command)
			assert.Equal(t, target, a.Target)
			assert.Equal(t, "alice", a.Operator, "the operator from $GORMLEASE_OPERATOR")
			assert.Equal(t, "deploy", a.Reason)
			assert.False(t, a.NewRow)
			require.Len(t, a.Rows, 1)
			assert.True(t, a.Rows[0].Paused)
			assert.Equal(t, "deploy", a.Rows[0].PauseReason)

			r = withEnv("", "resume", "-yes", "-json", "-as", "bob", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			a = actionJSON{}
			decodeOne(t, r.stdout, &a)
			assert.Equal(t, "resume", a.Command)
			assert.Equal(t, "bob", a.Operator, "-as before $GORMLEASE_OPERATOR")
			require.Len(t, a.Rows, 1)
			assert.False(t, a.Rows[0].Paused)

			r = withEnv("", "stop", "-yes", "-json", "-reason", "drain", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			a = actionJSON{}
			decodeOne(t, r.stdout, &a)
			assert.Equal(t, "stop", a.Command)
			assert.Nil(t, a.Wait, "no -wait")
			require.Len(t, a.Rows, 1)
			assert.True(t, a.Rows[0].StopRequested)
			assert.Equal(t, l.Generation, a.Rows[0].Generation)
			assert.Equal(t, "worker-3", a.Rows[0].Holder)

			r = withEnv("", "release", "-yes", "-json", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			a = actionJSON{}
			decodeOne(t, r.stdout, &a)
			assert.Equal(t, "release", a.Command)
			require.Len(t, a.Rows, 1)
			assert.Equal(t, "released", a.Rows[0].State)
			assert.Equal(t, l.Generation+1, a.Rows[0].Generation)
			require.ErrorIs(t, repo.Heartbeat(ctx, l), gormlease.ErrLeaseLost)

			r = cmd("prune", "-json", "-older-than", "1h")
			require.Equal(t, exitOK, r.code, r.stderr)
			var p pruneJSON
			decodeOne(t, r.stdout, &p)
			assert.Equal(t, "prune", p.Command)
			assert.Equal(t, int64(1), p.Deleted)
			assert.InDelta(t, 3600, p.OlderThanSeconds, 0.001)
			_, found, err := op.Get(ctx, old)
			require.NoError(t, err)
			assert.False(t, found)

			r = cmd("migrate", "-json")
			require.Equal(t, exitOK, r.code, r.stderr)
			var m migrateJSON
			decodeOne(t, r.stdout, &m)
			assert.Equal(t, migrateJSON{Command: "migrate", LeaseTable: "cli_json_lease", ResultTable: "cli_json_result",
				FloorTable: "cli_json_lease_floor"}, m)
		})
	}
}

// The operator's name comes from -as, else $GORMLEASE_OPERATOR, else the
// user and host that run the command; one that cannot be recorded is bad
// usage, before anything is asked or done.
func TestCommand_OperatorName(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLite(t).DSN
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"EmptyAs", "", []string{"pause", "-as", "", "-reason", "r", "t"}, `-as "": the operator's name is empty`},
		{"NULInAs", "", []string{"stop", "-as", "a\x00b", "-reason", "r", "t"}, "has a NUL byte"},
		{"LongAs", "", []string{"release", "-as", strings.Repeat("x", 256), "t"}, "is 256 bytes long"},
		{"BadUTF8Env", "\xff", []string{"resume", "t"}, `$GORMLEASE_OPERATOR "\xff": the operator's name is not valid UTF-8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := glEnv(t, map[string]string{dsnEnv: dsn, operatorEnv: tc.env}, "y\n", tc.args...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.want)
			assert.Empty(t, r.stdout)
		})
	}
	t.Run("Default", func(t *testing.T) {
		t.Parallel()
		name := defaultOperator()
		assert.Empty(t, checkOperator(name))
		assert.Contains(t, name, "@")
		c := newCommand("pause", env{getenv: func(string) string { return "" }, stderr: &strings.Builder{}})
		require.NoError(t, c.parse([]string{"-dsn", dsn, "-reason", "r", "t"}))
		assert.Equal(t, name, c.operator)
	})
}

// The usage text and each command's -h list the exit codes.
func TestCommand_HelpListsExitCodes(t *testing.T) {
	t.Parallel()
	r := gl(t, "", "", "help")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stderr, "exit codes:")
	for name := range commands {
		r := gl(t, "", "", name, "-h")
		assert.Equal(t, exitOK, r.code, name)
		assert.Contains(t, r.stderr, "usage: gormlease "+name+" "+specs[name].synopsis, name)
		for _, line := range []string{"  0  done", "  1  failed", "  2  bad usage", "  3  no such target", "  4  nothing to do",
			"  5  not confirmed", "  6  timed out"} {
			assert.Contains(t, r.stderr, line, name)
		}
	}
}

// list and show say how long a lease has been held, from the time its
// acquisition recorded (list's HELD FOR, show's "held since", -json's
// acquired_at and held_for_seconds), and who paused the target and who
// asked the holder to stop.
func TestCommand_HeldSinceAndWho(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_held_lease", "cli_held_result")
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			target := fmt.Sprintf("held%d/t", time.Now().UnixNano())
			_, err = repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			op := admin.New(repo)
			require.NoError(t, op.Pause(ctx, target, "deploy"))
			require.NoError(t, op.RequestStop(ctx, target, "drain"))
			// As a long-running job's row and two operators' actions
			// record them.
			require.NoError(t, db.Table("cli_held_lease").Where("target_id = ?", target).Updates(map[string]any{
				"acquired_at": s.Ago(90 * time.Minute), "paused_by": "alice", "stop_by": "bob",
			}).Error)

			r := cmd("list", "-prefix", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "HELD FOR")
			assert.Regexp(t, `live, stop requested by bob, paused by alice\s+1\s+\S+\s+1h3\dm0s\s`, r.stdout)

			r = cmd("show", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Regexp(t, `held since:\s+\S+ \(held for 1h3\dm0s\)`, r.stdout)
			assert.Regexp(t, `paused:\s+since \S+ by alice: deploy`, r.stdout)
			assert.Regexp(t, `stop requested:\s+drain by bob`, r.stdout)

			r = cmd("show", "-json", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			var j leaseJSON
			decodeOne(t, r.stdout, &j)
			require.NotNil(t, j.AcquiredAt)
			require.NotNil(t, j.HeldForSeconds)
			assert.InDelta(t, 90*60, *j.HeldForSeconds, 60)
			assert.Equal(t, "alice", j.PausedBy)
			assert.Equal(t, "bob", j.StopBy)

			_, err = op.ForceRelease(ctx, target)
			require.NoError(t, err)
			r = cmd("show", "-json", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			j = leaseJSON{}
			decodeOne(t, r.stdout, &j)
			assert.Nil(t, j.HeldForSeconds, "a released lease is not held")
			assert.Empty(t, j.StopBy, "the stop request ended with the lease")
		})
	}
}
