package testdb

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main runs a test package's tests, closes the test databases, and then
// fails the run if any goroutine is left over: no Run may leave a heartbeat
// behind. Call it from TestMain; it does not return.
//
// The runnable examples open SQLite files of their own and need no server.
// Under GORMLEASE_TEST_DOCKER (the docker pass: see the package doc), a
// PostgreSQL server that cannot be reached fails the run at once.
func Main(m *testing.M) {
	flag.Parse()
	if dockerRequired() {
		if s := lookup("postgres", findPostgres); s.findErr != nil {
			fmt.Fprintln(os.Stderr, "FAIL: testdb:", s.findErr)
			Close()
			os.Exit(1)
		}
	}
	code := m.Run()
	Close()
	if code == 0 {
		if err := goleak.Find(gormStatementCache); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// gormStatementCache ignores the goroutine that expires the statements of
// gorm's prepared-statement cache (gorm.Config{PrepareStmt: true}): gorm
// starts one per cache and never stops it (see gorm's internal/lru).
var gormStatementCache = goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1")
