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
