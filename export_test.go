package gormlease

import "gorm.io/gorm"

// PostgresSchema exposes the PostgreSQL DDL to the black-box tests.
var PostgresSchema = postgresSchema

// LiveBeatGroups returns the number of heartbeat groups whose goroutine
// runs: zero whenever no Run holds a lease.
func LiveBeatGroups() int { return int(beating.Load()) }

// CommitThroughGorm makes r run its fenced commits in gorm's transaction,
// as it does once the driver has refused to send BEGIN and the locking
// statement as one query.
func CommitThroughGorm(r *Repository) { r.oneTripRefused.Store(true) }

// RefusesQueries is the PostgreSQL dialect's test for that refusal.
var RefusesQueries = postgresDialect{}.refusesQueries

// PostgresAcquire is the PostgreSQL acquire statement.
const PostgresAcquire = postgresAcquire

// ReleaseSQL returns r's release statement.
func ReleaseSQL(r *Repository) string { return r.releaseSQL }

// SaveReleaseSQL returns the statement that locks the row in Run's fenced
// commit: the release that records the save.
func SaveReleaseSQL(r *Repository) string { return r.saveReleaseSQL }

// LiveWatches returns the number of lease rows that waiters of this
// process watch.
func LiveWatches() int64 { return watching.Load() }

// Watched reports whether waiters of this process watch target's row in
// the default table and have read it held.
func Watched(target string) bool {
	hubs.Lock()
	defer hubs.Unlock()
	for _, h := range hubs.m {
		if w := h.watches[target]; w != nil && h.key.table == defaultLeaseTable {
			st, read, _ := w.current()
			return read && st.found && !st.released
		}
	}
	return false
}

// Listening reports whether this process has a notification listener on
// db's pool that listens now.
func Listening(db *gorm.DB) bool {
	hubs.Lock()
	defer hubs.Unlock()
	for _, h := range hubs.m {
		if h.repo.db.ConnPool == db.ConnPool && h.listener.listening() {
			return true
		}
	}
	return false
}

// SetStatementAttempts makes r try each retried statement n times in all.
func SetStatementAttempts(r *Repository, n int) { r.attempts = n }

// IsSerializationFailure and AnsweredByServer are the classifiers of
// database errors.
var (
	IsSerializationFailure = isSerializationFailure
	AnsweredByServer       = answeredByServer
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
	hubs.Lock()
	defer hubs.Unlock()
	n := 0
	for _, h := range hubs.m {
		if w := h.watches[target]; w != nil && h.key.table == defaultLeaseTable {
			n += w.subs
		}
	}
	return n
}
