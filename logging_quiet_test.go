package gormlease_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// printed is the writer of a gorm logger made by logger.New: it keeps what
// the logger writes, an entry a statement.
type printed struct {
	mu      sync.Mutex
	entries []string
}

func (p *printed) Printf(format string, args ...any) {
	p.mu.Lock()
	p.entries = append(p.entries, fmt.Sprintf(format, args...))
	p.mu.Unlock()
}

// mentioning returns the entries that contain s.
func (p *printed) mentioning(s string) []string {
	return filter(&p.mu, &p.entries, func(e string) bool { return strings.Contains(e, s) })
}

// plain reports whether entry is a statement written as gorm writes one at
// logger.Info: its first line is the caller's file and line alone, where a
// slow statement's adds "SLOW SQL >= ..." and a failed one's the error.
func plain(entry string) bool {
	first, _, _ := strings.Cut(entry, "\n")
	return !strings.Contains(first, " ")
}

const (
	missingLease = "gormlease_missing_lease" // a lease table that does not exist
	missingSaved = "gormlease_missing_saved" // a table that the saver writes to, which does not exist
)

// quietScenario runs, on db, a pool on s, with gorm's own logger at level
// (slow threshold 200ms, its default) writing into the returned printed and
// WithLogger into the returned handler: a Run whose acquire waits 500ms for
// the row lock of a transaction of the test's, and whose saver fails on a
// missing table; a refused Run; and an acquire on a missing lease table.
func quietScenario(t *testing.T, s *testdb.Server, db *gorm.DB, level logger.LogLevel) (*printed, *recordingHandler) {
	t.Helper()
	p := &printed{}
	logged := db.Session(&gorm.Session{NewDB: true, Context: context.Background(),
		Logger: logger.New(p, logger.Config{LogLevel: level, SlowThreshold: 200 * time.Millisecond})})
	h := &recordingHandler{}
	r := newRunner(t, logged, append(fast(200*time.Millisecond, 2*time.Second),
		gormlease.WithLogger(slog.New(h)))...)
	ctx := context.Background()
	target := newTarget(t)
	_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
		_, err := r.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
		assert.ErrorIs(t, err, gormlease.ErrLeaseHeld)
		return "first", nil
	}, gormlease.SaveJSON[string])
	require.NoError(t, err)

	// The row is locked before the Run starts: its acquire waits for the
	// lock for as long as the test holds it, from the moment it is sent
	// (the Run's goroutine may run late).
	unlock := lockRow(t, db, target)
	acquires := testdb.Started(db, "INSERT INTO job_lease") // on SQLite
	done := goRun(t, ctx, r, target, func(context.Context) (string, error) { return "second", nil },
		func(tx *gorm.DB, v string) error {
			return tx.Exec("INSERT INTO "+missingSaved+" (v) VALUES (?)", v).Error
		})
	if s.Name == "sqlite" {
		// No view of who waits for the write lock: an acquire that has
		// begun can only be waiting for it.
		waitFor(t, 10*time.Second, "the acquire to begin, and wait for the write lock", func() bool {
			return testdb.Started(db, "INSERT INTO job_lease") > acquires
		})
	} else {
		waitLockWait(t, s, "the acquire", "%job_lease%lease_token%")
	}
	time.Sleep(500 * time.Millisecond) // the lock's hold, not a wait for an event
	unlock()
	res := recv(t, done, 10*time.Second, "the Run that waited for the lock")
	require.Error(t, res.Err)
	assert.Contains(t, res.Err.Error(), missingSaved)

	bad, err := gormlease.NewRepository(logged, gormlease.WithTableNames(missingLease, "gormlease_missing_result"))
	require.NoError(t, err)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = bad.Acquire(actx, target, time.Minute)
	require.Error(t, err, "an acquire on a lease table that does not exist")
	return p, h
}

// The library's own statements never reach gorm's logger at its default
// level: not a statement that waited for a row lock past the slow
// threshold, nor a refused acquire, nor one that failed. The saver's
// statements do, as before: its failed statement is written as an error.
// The slow statement is logged by WithLogger instead, at Warn.
func TestLogging_LibraryStatementsQuietAtWarn(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		p, h := quietScenario(t, s, db, logger.Warn)
		assert.Empty(t, p.mentioning("job_lease"), "the library's statements, in gorm's logger at Warn")
		assert.Empty(t, p.mentioning(missingLease), "the library's failed statement, in gorm's logger at Warn")
		saver := p.mentioning(missingSaved)
		require.NotEmpty(t, saver, "the saver's failed statement, in gorm's logger at Warn")
		assert.False(t, plain(saver[0]), "the saver's failed statement is written as an error: %s", saver[0])

		slow := h.find("slow lease statement")
		require.NotEmpty(t, slow, "the statement that waited for the lock, in WithLogger")
		assert.Equal(t, slog.LevelWarn, slow[0].level)
		assert.Greater(t, slow[0].attrs["duration"], 100*time.Millisecond)
		assert.Equal(t, 100*time.Millisecond, slow[0].attrs["threshold"])
		assert.Contains(t, slow[0].attrs["sql"], "job_lease")
	})
}

// At logger.Info, gorm's logger writes the library's statements, each with
// its SQL, as it writes any statement there: the one that waited for a row
// lock and the one that failed too, never as slow nor as an error.
func TestLogging_LibraryStatementsAtInfo(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		p, _ := quietScenario(t, s, db, logger.Info)
		lib := append(p.mentioning("job_lease"), p.mentioning(missingLease)...)
		require.NotEmpty(t, p.mentioning("job_lease"), "the library's statements, in gorm's logger at Info")
		require.NotEmpty(t, p.mentioning(missingLease), "the library's failed statement, in gorm's logger at Info")
		for _, e := range lib {
			assert.True(t, plain(e), "a library statement written as slow or failed: %s", e)
		}
		saver := p.mentioning(missingSaved)
		require.NotEmpty(t, saver, "the saver's failed statement, in gorm's logger at Info")
		assert.False(t, plain(saver[0]), "the saver's failed statement is written as an error: %s", saver[0])
	})
}
