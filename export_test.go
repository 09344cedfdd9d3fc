package gormlease

// PostgresSchema exposes the PostgreSQL DDL to the black-box tests.
var PostgresSchema = postgresSchema

// LiveBeatGroups returns the number of heartbeat groups whose goroutine
// runs: zero whenever no Run holds a lease.
func LiveBeatGroups() int {
	beatGroups.Lock()
	defer beatGroups.Unlock()
	return len(beatGroups.m)
}

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

// SetStatementAttempts makes r try each retried statement n times in all.
func SetStatementAttempts(r *Repository, n int) { r.attempts = n }

// IsSerializationFailure and AnsweredByServer are the classifiers of
// database errors.
var (
	IsSerializationFailure = isSerializationFailure
	AnsweredByServer       = answeredByServer
)
