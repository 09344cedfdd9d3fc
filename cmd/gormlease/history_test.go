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
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// addEvent writes an event into table by hand, age ago on the database's
// clock, as the triggers would: the tests here check what the command
// shows of each column.
func addEvent(t *testing.T, s *testdb.Server, db *gorm.DB, table, key string, seq int64, kind string, generation int64,
	how string, from int64, age, held time.Duration, operator, detail string) {
	t.Helper()
	null := func(v string) any {
		if v == "" {
			return nil
		}
		return v
	}
	var fromGen, acquired any
	if from > 0 {
		fromGen = from
	}
	if held > 0 {
		acquired = s.Ago(age + held)
	}
	require.NoError(t, db.Exec("INSERT INTO "+table+" (target_id, seq, at, kind, generation, holder, how, from_generation,"+
		" acquired_at, operator, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		key, seq, s.Ago(age), kind, generation, "web-1/42", null(how), fromGen, acquired, null(operator), null(detail)).Error)
}

// decodeEvents decodes stdout as JSON lines of events, failing on an
// unknown field.
func decodeEvents(t *testing.T, stdout string) []eventJSON {
	t.Helper()
	var out []eventJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	for dec.More() {
		var e eventJSON
		require.NoError(t, dec.Decode(&e), stdout)
		out = append(out, e)
	}
	assert.Equal(t, len(out), strings.Count(stdout, "\n"), "an object a line: %q", stdout)
	return out
}

// history shows a target's events newest first, as a table a person reads
// or JSON lines a script reads, a page at a time (-limit, -before), a
// slot's with -slot, with flags before or after the target. A target
// without events exits 3 when it has no lease row either, 0 when it has
// one; a semaphore without a row of its own points to -slot. migrate
// -history makes the history; on a table without one, history fails
// saying how to turn it on.
func TestCommand_History(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_hist_lease", "cli_hist_result")
			r := cmd("history", "t")
			require.Equal(t, exitFailure, r.code, r.stderr)
			assert.Contains(t, r.stderr, `the lease table "cli_hist_lease" keeps no history (there is no table "cli_hist_lease_event")`)
			assert.Contains(t, r.stderr, "gormlease migrate -history -lease-table cli_hist_lease -result-table cli_hist_result")
			assert.Empty(t, r.stdout)

			r = cmd("migrate", "-history", "-json")
			require.Equal(t, exitOK, r.code, r.stderr)
			var m migrateJSON
			decodeOne(t, r.stdout, &m)
			assert.Equal(t, migrateJSON{Command: "migrate", LeaseTable: "cli_hist_lease", ResultTable: "cli_hist_result",
				FloorTable: "cli_hist_lease_floor", History: true, EventTable: "cli_hist_lease_event"}, m)
			r = cmd("migrate", "-history")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "cli_hist_lease keeps each target's history in cli_hist_lease_event")

			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			run := fmt.Sprintf("h%d/", time.Now().UnixNano())
			target, quiet, sem := run+"report", run+"quiet", run+"sem"
			for _, key := range []string{target, quiet} {
				l, err := repo.Acquire(ctx, key, time.Hour)
				require.NoError(t, err)
				require.NoError(t, repo.Release(ctx, l))
			}
			_, err = repo.AcquireSlot(ctx, sem, 2, time.Hour)
			require.NoError(t, err)
			require.NoError(t, db.Exec("DELETE FROM cli_hist_lease_event WHERE target_id LIKE ?", run+"%").Error)
			ev := "cli_hist_lease_event"
			m5 := 5 * time.Minute
			addEvent(t, s, db, ev, target, 1, "acquired", 1, "new", 0, 5*m5, 0, "", "")
			addEvent(t, s, db, ev, target, 2, "ended", 1, "failed", 0, 4*m5, 90*time.Second, "", "upstream\t503\nretry")
			addEvent(t, s, db, ev, target, 3, "paused", 1, "", 0, 3*m5, 0, "alice", "deploy")
			addEvent(t, s, db, ev, target, 4, "acquired", 3, "expired", 2, 2*m5, 0, "", "")
			addEvent(t, s, db, ev, target, 5, "ended", 3, "forced", 0, m5, 2*time.Minute, "bob", "released by force by operator bob")
			addEvent(t, s, db, ev, sem+"\x1f2", 1, "acquired", 1, "new", 0, time.Minute, 0, "", "")

			r = cmd("history", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			require.Len(t, lines, 7, r.stdout)
			assert.Equal(t, fmt.Sprintf("history of target %s, newest first:", target), lines[0])
			assert.Regexp(t, `^SEQ\s+AT \(UTC\)\s+EVENT\s+GEN\s+HOLDER\s+HOW\s+HELD FOR\s+BY\s+DETAIL$`, lines[1])
			assert.Regexp(t, `^5\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\s+ended\s+3\s+web-1/42\s+forced\s+2m0s\s+bob\s+released by force by operator bob$`, lines[2])
			assert.Regexp(t, `^4\s.*\sacquired\s+3\s+web-1/42\s+expired \(from 2\)\s+-\s+-\s*$`, lines[3])
			assert.Regexp(t, `^3\s.*\spaused\s+1\s+web-1/42\s+-\s+-\s+alice\s+deploy$`, lines[4])
			assert.Contains(t, lines[5], `"upstream\t503\nretry"`, "a detail with a tab and a newline, quoted")
			assert.Regexp(t, `\sfailed\s+1m30s\s`, lines[5])
			assert.Regexp(t, `^1\s.*\sacquired\s+1\s+web-1/42\s+new\s`, lines[6])
			assert.Empty(t, r.stderr, "a page not full says nothing more")

			// Flags after the target, and a page at a time.
			r = cmd("history", target, "-limit", "2", "-json")
			require.Equal(t, exitOK, r.code, r.stderr)
			page := decodeEvents(t, r.stdout)
			require.Len(t, page, 2)
			assert.Equal(t, []int64{5, 4}, []int64{page[0].Seq, page[1].Seq})
			assert.Empty(t, r.stderr, "-json says nothing more")
			if assert.NotNil(t, page[0].HeldForSeconds) && assert.NotNil(t, page[0].AcquiredAt) {
				assert.InDelta(t, 120, *page[0].HeldForSeconds, 1)
			}
			assert.Equal(t, eventJSON{Target: target, Seq: 4, At: page[1].At, Kind: "acquired", Generation: 3, Holder: "web-1/42",
				How: "expired", FromGeneration: 2}, page[1])
			assert.WithinDuration(t, time.Now().Add(-2*m5), page[1].At, time.Minute)
			r = cmd("history", "-json", "-limit", "2", "-before", "4", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			page = decodeEvents(t, r.stdout)
			require.Len(t, page, 2)
			assert.Equal(t, "upstream\t503\nretry", page[1].Detail)
			assert.Equal(t, "alice", page[0].Operator)
			r = cmd("history", "-limit", "3", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Equal(t, "(3 events: -before 3 for the next page)\n", r.stderr)
			r = cmd("history", "-before", "1", target)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "no events of \""+target+"\" before seq 1")

			// A slot's own events; the semaphore's own row has none.
			r = cmd("history", "-slot", "2", "-json", sem)
			require.Equal(t, exitOK, r.code, r.stderr)
			page = decodeEvents(t, r.stdout)
			require.Len(t, page, 1)
			assert.Equal(t, 2, page[0].Slot)
			r = cmd("history", sem)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "it is a semaphore of 2 slot rows")
			r = cmd("history", "-slot", "1", sem)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "no events of \""+sem+"\" slot 1: its lease row has had none")
			r = cmd("history", "-slot", "3", sem)
			assert.Equal(t, exitNoTarget, r.code, r.stderr)
			assert.Contains(t, r.stderr, "no events and no lease row for \""+sem+"\" slot 3")

			// No events: a row without any is 0, no row at all is 3.
			r = cmd("history", quiet)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "no events of \""+quiet+"\"")
			r = cmd("history", "-json", quiet)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Empty(t, r.stdout)
			r = cmd("history", run+"none")
			assert.Equal(t, exitNoTarget, r.code, r.stderr)
			assert.Contains(t, r.stderr, "no events and no lease row")
			r = cmd("history", "-json", run+"none")
			assert.Equal(t, exitNoTarget, r.code, r.stderr)
			assert.Empty(t, r.stdout)

			// Hostile input: bad usage, 2, naming the flag or the target.
			long := strings.Repeat("x", 256)
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"-limit", "0", target}, "-limit 0: give 1 to 1000"},
				{[]string{"-limit", "-5", target}, "-limit -5"},
				{[]string{"-limit", "1001", target}, "-limit 1001"},
				{[]string{"-limit", "99999999999999999999", target}, "invalid value"},
				{[]string{"-before", "-1", target}, "-before -1"},
				{[]string{"-slot", "0", target}, "-slot 0"},
				{[]string{"-slot", "101", target}, "-slot 101"},
				{[]string{"t\xff"}, "not valid UTF-8"},
				{[]string{long}, "256 bytes"},
				{[]string{}, "give one target"},
				{[]string{target, "other"}, "give one target"},
			} {
				r := cmd("history", tc.args...)
				assert.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
				assert.Contains(t, r.stderr, tc.want, "%q", tc.args)
				assert.Empty(t, r.stdout, "%q", tc.args)
			}
		})
	}
}

// prune -keep-events caps each target's history and says how many events
// it deleted, apart from the lease rows; -dry-run counts them first.
func TestCommand_PruneEvents(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			dsn := s.EmptyDSN(t)
			db, err := open(dsn)
			require.NoError(t, err)
			t.Cleanup(func() { closeDB(db) })
			require.NoError(t, gormlease.AutoMigrate(context.Background(), db, gormlease.WithHistory()))
			cmd := func(args ...string) result { return gl(t, dsn, "", args...) }
			for seq := int64(1); seq <= 6; seq++ {
				addEvent(t, s, db, "job_lease_event", "busy", seq, "acquired", seq, "released", seq-1, time.Duration(7-seq)*time.Minute, 0, "", "")
			}
			r := cmd("prune", "-older-than", "1h", "-keep-events", "2", "-dry-run")
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "would prune 0 lease rows and their results released or expired more than 1h0m0s ago, "+
				"and 4 events older than that or beyond the newest 2 of a target (-dry-run: nothing deleted)")
			r = cmd("prune", "-older-than", "1h", "-keep-events", "2", "-dry-run", "-json")
			require.Equal(t, exitOK, r.code, r.stderr)
			var j pruneJSON
			decodeOne(t, r.stdout, &j)
			if assert.NotNil(t, j.WouldDeleteEvents) {
				assert.EqualValues(t, 4, *j.WouldDeleteEvents)
			}
			assert.Equal(t, 2, j.KeepEvents)
			r = cmd("prune", "-older-than", "1h", "-keep-events", "2", "-json")
			require.Equal(t, exitOK, r.code, r.stderr)
			j = pruneJSON{}
			decodeOne(t, r.stdout, &j)
			assert.EqualValues(t, 4, j.EventsDeleted)
			assert.Nil(t, j.WouldDeleteEvents)
			r = cmd("history", "-json", "busy")
			require.Equal(t, exitOK, r.code, r.stderr)
			page := decodeEvents(t, r.stdout)
			require.Len(t, page, 2)
			assert.Equal(t, []int64{6, 5}, []int64{page[0].Seq, page[1].Seq})
			r = cmd("prune", "-older-than", "1h", "-keep-events", "-1")
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, "-keep-events -1")
		})
	}
}
