package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests; goroutine leaks fail the run (see testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }

// short are demo settings that play the whole story in about five
// seconds, with room for a loaded machine: a heartbeat may come up to
// 2.7 s late before the holder stops trusting its lease (the new holder's
// heartbeats wait while the frozen tab's fenced commit holds the row, which
// under -race on a busy machine has taken over half a second).
var short = config{tabs: 3, interval: 300 * time.Millisecond, timeout: 3 * time.Second, latency: time.Second}

// The demo acts out the story on every supported database, and its verdict,
// read from the database, holds.
func TestDemo_VerdictHolds(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			cfg := short
			cfg.dsn = s.DSN
			if s.Name == "sqlite" {
				// A file of its own, as the demo makes by default: setting
				// WAL mode on opening fails while other tests hold the
				// shared file's lock.
				cfg.dsn = ""
			}
			var out bytes.Buffer
			err := run(context.Background(), &out, cfg)
			t.Log("\n" + out.String())
			require.NoError(t, err)
			text := out.String()
			header := map[string]string{"postgres": "PostgreSQL", "mysql": "MySQL", "sqlite": "SQLite"}[s.Name]
			assert.Contains(t, text, "database  "+header, "the story ran on another database")
			assert.NotContains(t, text, "ErrLeaseHeld", "a tab was refused rather than wait")
			assert.Equal(t, cfg.tabs-1, strings.Count(text, "waits for the report in progress"), "tabs that waited in the rush")
			assert.Equal(t, 1, strings.Count(text, "waits too: the frozen tab's lease has not timed out yet"), "the reload waited")
			assert.Equal(t, 1, strings.Count(text, "wins the lease: generation 1"))
			assert.Contains(t, text, "db      heartbeat from tab")
			assert.Equal(t, 1, strings.Count(text, "TAKES OVER the expired lease: generation 2"))
			assert.Contains(t, text, "FENCED OFF by the database")
			assert.Contains(t, text, "lease lost")
			// Every tab but the frozen one and the one that took over (the
			// reload included) gets the report of generation 2.
			assert.Equal(t, cfg.tabs-1, strings.Count(text, "gets the shared report"), "tabs that got the shared report")
			assert.Equal(t, cfg.tabs-1, strings.Count(text, "under generation 2\"\n"), "shared reports of generation 2")
			assert.Contains(t, text, "VERDICT OK (read from the database): 1 saved result")
			assert.Contains(t, text, fmt.Sprintf("all %d other tabs got that same report", cfg.tabs))
			assert.Contains(t, text, "the API was called once per generation (2 calls)")
			t.Run("TimelineInDatabaseTime", func(t *testing.T) { checkTimeline(t, text, cfg) })
		})
	}
}

// The verdict reads the database: a save by a stale holder, slipped in
// behind the story's back, makes it fail.
func TestDemo_VerdictCatchesStaleSave(t *testing.T) {
	t.Parallel()
	st, out := playedStory(t)

	stale := savedReport{ID: uuid.NewString(), TargetID: st.target, Generation: 1, Tab: "tab 9", Body: "stale"}
	require.NoError(t, st.db.Create(&stale).Error)
	err := st.verdict(context.Background())
	require.ErrorIs(t, err, errVerdict)
	assert.ErrorContains(t, err, "2 saved results, want 1")
	assert.ErrorContains(t, err, "a stale holder saved: tab 9 under generation 1")
	assert.Contains(t, out.String(), "VERDICT FAILED")
}

// The verdict checks what the tabs got against the database, and the fake
// API's calls per generation: a tab shown another report, or a second call
// under one generation, makes it fail.
func TestDemo_VerdictCatchesOtherReportAndSecondCall(t *testing.T) {
	t.Parallel()
	st, out := playedStory(t)

	st.reports["tab 9"] = tabReport{body: "a report the database never saw", shared: true}
	st.apiCalls[2]++
	err := st.verdict(context.Background())
	require.ErrorIs(t, err, errVerdict)
	assert.ErrorContains(t, err, fmt.Sprintf("%d tabs got a report, want %d", short.tabs+1, short.tabs))
	assert.ErrorContains(t, err, `tab 9 got "a report the database never saw", but the database holds "report for user 42`)
	assert.ErrorContains(t, err, "generation 2 called the API 2 times, want once")
	assert.Contains(t, out.String(), "VERDICT FAILED")
}

// playedStory plays the story with short settings on SQLite, and returns
// it, for a test to tamper with what it saw before its verdict.
func playedStory(t *testing.T) (*story, *bytes.Buffer) {
	t.Helper()
	d, err := openDatabase("") // an SQLite file of its own, whose WAL setting no other test's lock can refuse
	require.NoError(t, err)
	t.Cleanup(d.close)
	out := new(bytes.Buffer)
	st, err := newStory(context.Background(), out, short, d)
	require.NoError(t, err)
	require.NoError(t, st.play(context.Background()))
	return st, out
}

// Bad settings are refused before anything runs.
func TestDemo_BadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(*config)
		want string
	}{
		{"OneTab", func(c *config) { c.tabs = 1 }, "-tabs must be at least 2"},
		{"TimeoutBelowTwiceInterval", func(c *config) { c.timeout = c.interval }, "at least twice -interval"},
		{"ZeroLatency", func(c *config) { c.latency = 0 }, "-latency must be > 0"},
		{"UnknownDSN", func(c *config) { c.dsn = "oracle://scott:tiger@db/orcl" }, `-dsn: unrecognized DSN "oracle://scott:***@db/orcl"`},
		{"PathOfNoFile", func(c *config) { c.dsn = filepath.Join(t.TempDir(), "none.db") }, `-dsn: unrecognized DSN`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := short
			tc.cfg(&cfg)
			var out bytes.Buffer
			err := run(context.Background(), &out, cfg)
			require.ErrorContains(t, err, tc.want)
			assert.Empty(t, out.String(), "the story began")
		})
	}
}

// line is a line of the demo's timeline.
type line struct {
	at   float64 // seconds since the start, as printed
	who  string
	what string
}

var lineRE = regexp.MustCompile(`^ *(\d+\.\d\d)s  (.{6})  (.*)$`)

// timelineOf returns the timeline lines of the demo's output.
func timelineOf(t *testing.T, text string) []line {
	var lines []line
	for _, l := range strings.Split(text, "\n") {
		m := lineRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		lines = append(lines, line{at: at, who: strings.TrimSpace(m[2]), what: m[3]})
	}
	return lines
}

// checkTimeline checks that the timeline in text tells the story in true
// time order, with the database's times for heartbeats: none of the frozen
// tab's after its freeze, and the takeover no sooner than the lease timeout
// after its last one, as the database judged it.
func checkTimeline(t *testing.T, text string, cfg config) {
	const rounding = 0.005 // the times are printed to 10 ms
	lines := timelineOf(t, text)
	require.NotEmpty(t, lines)
	freeze, takeover := -1, -1
	for i, l := range lines {
		if i > 0 {
			assert.GreaterOrEqual(t, l.at, lines[i-1].at, "line %d is out of time order: %+v after %+v", i, l, lines[i-1])
		}
		switch {
		case strings.Contains(l.what, "FREEZES"):
			require.Equal(t, -1, freeze, "two tabs froze")
			freeze = i
		case strings.Contains(l.what, "TAKES OVER"):
			takeover = i
		}
	}
	require.NotEqual(t, -1, freeze, "no tab froze")
	require.NotEqual(t, -1, takeover, "no tab took over")
	frozen := lines[freeze]
	beats := 0
	last := -1.0
	for i, l := range lines {
		if l.who != "db" || !strings.HasPrefix(l.what, "heartbeat from "+frozen.who+" renews") {
			continue
		}
		beats++
		last = l.at
		assert.Less(t, i, freeze, "a heartbeat of the frozen %s is printed after its freeze: %+v", frozen.who, l)
		assert.LessOrEqual(t, l.at, frozen.at, "a heartbeat of the frozen %s is timed after its freeze at %.2fs: %+v",
			frozen.who, frozen.at, l)
	}
	require.Positive(t, beats, "no heartbeat of the frozen %s printed", frozen.who)
	assert.GreaterOrEqual(t, lines[takeover].at, last+cfg.timeout.Seconds()-rounding,
		"the takeover is printed sooner than the lease timeout after the frozen tab's last heartbeat")
}
