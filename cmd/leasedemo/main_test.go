package main

import (
	"bytes"
	"context"
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
			assert.Equal(t, cfg.tabs-1, strings.Count(text, "refused at once"), "refused tabs")
			assert.Equal(t, 1, strings.Count(text, "wins the lease: generation 1"))
			assert.Contains(t, text, "db      heartbeat from tab")
			assert.Contains(t, text, "TAKES OVER the expired lease: generation 2")
			assert.Contains(t, text, "FENCED OFF by the database")
			assert.Contains(t, text, "lease lost")
			assert.Contains(t, text, "VERDICT OK (read from the database): 1 saved result")
		})
	}
}

// The verdict reads the database: a save by a stale holder, slipped in
// behind the story's back, makes it fail.
func TestDemo_VerdictCatchesStaleSave(t *testing.T) {
	t.Parallel()
	d, err := openDatabase("") // an SQLite file of its own, as in TestDemo_VerdictHolds
	require.NoError(t, err)
	defer d.close()
	var out bytes.Buffer
	st, err := newStory(context.Background(), &out, short, d)
	require.NoError(t, err)
	require.NoError(t, st.play(context.Background()))

	stale := savedReport{ID: uuid.NewString(), TargetID: st.target, Generation: 1, Tab: "tab 9", Body: "stale"}
	require.NoError(t, st.db.Create(&stale).Error)
	err = st.verdict(context.Background())
	require.ErrorIs(t, err, errVerdict)
	assert.ErrorContains(t, err, "2 saved results, want 1")
	assert.ErrorContains(t, err, "a stale holder saved: tab 9 under generation 1")
	assert.Contains(t, out.String(), "VERDICT FAILED")
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
		{"UnknownDSN", func(c *config) { c.dsn = "oracle://scott:tiger@db/orcl" }, `unsupported -dsn "oracle://scott:***@db/orcl"`},
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
