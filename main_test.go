package gormlease_test

import (
	"os"
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (see testdb.Main: goroutine leaks fail the run),
// or, in a child process of TestSQLite_Processes*, the helper.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(helperDSNEnv); dsn != "" {
		os.Exit(helperProcess(dsn))
	}
	testdb.Main(m)
}
