package gormlease

import (
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/heartbeat"
	"github.com/gormlease/gormlease/internal/wait"
)

// PostgresSchema exposes the PostgreSQL DDL to the black-box tests.
var PostgresSchema = postgres.Schema

// LiveBeatGroups returns the number of heartbeat groups whose goroutine
// runs: zero whenever no Run holds a lease.
func LiveBeatGroups() int { return heartbeat.Live() }

// CommitThroughGorm makes r run its fenced commits in gorm's transaction,
// as it does once the driver has refused to send BEGIN and the locking
// statement as one query.
func CommitThroughGorm(r *Repository) { r.oneTripRefused.Store(true) }

// RefusesQueries is the PostgreSQL backend's test for that refusal.
var RefusesQueries = postgres.New(backend.DefaultTables).RefusesQueries

// PostgresTakeOver and PostgresInsert are the PostgreSQL acquire's
// statements.
const (
	PostgresTakeOver = postgres.TakeOverSQL
	PostgresInsert   = postgres.InsertSQL
)

// ownSQL returns r's statement of op on the caller's own row.
func ownSQL(r *Repository, op backend.Own) string {
	return r.backend.(interface{ OwnSQL(backend.Own) string }).OwnSQL(op)
}

// ReleaseSQL returns r's release statement.
func ReleaseSQL(r *Repository) string { return ownSQL(r, backend.Release) }

// SaveReleaseSQL returns the statement that locks the row in Run's fenced
// commit: the release that records the save.
func SaveReleaseSQL(r *Repository) string { return ownSQL(r, backend.SaveRelease) }

// LiveWatches returns the number of lease rows that waiters of this
// process watch.
func LiveWatches() int64 { return wait.Watching() }

// Watched reports whether waiters of this process watch target's row in
// the default table and have read it held.
func Watched(target string) bool {
	watched := false
	wait.Find(defaultLeaseTable, target, func(w *wait.Watch, _ int) {
		st, read, _ := w.Current()
		watched = watched || read && st.Found && !st.Released
	})
	return watched
}

// Listening reports whether this process has a notification listener on
// db's pool that listens now.
func Listening(db *gorm.DB) bool { return wait.Listening(db) }

// SetStatementAttempts makes r try each retried statement n times in all.
func SetStatementAttempts(r *Repository, n int) { r.attempts = n }

// IsSerializationFailure and AnsweredByServer are the classifiers of
// database errors.
var (
	IsSerializationFailure = backend.IsSerializationFailure
	AnsweredByServer       = backend.AnsweredByServer
)

// DoCallers returns the number of callers of r.Do in this process that
// share the job on target now.
func DoCallers[T any](r *Runner[T], target string) int {
	r.local.mu.Lock()
	defer r.local.mu.Unlock()
	if f := r.local.flights[target]; f != nil {
		return f.callers
	}
	return 0
}

// WatchSubscribers returns the number of waiters that share the watch on
// target's row in the default table, on any pool of this process.
func WatchSubscribers(target string) int {
	n := 0
	wait.Find(defaultLeaseTable, target, func(_ *wait.Watch, subs int) { n += subs })
	return n
}

// CommitAttempts is how many fenced commits a Run sends in all when they
// end without saving.
const CommitAttempts = commitAttempts
