package gormlease_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (or, in a child process, the helper), closes the test databases, and then fails the run
// if any goroutine is left over: no Run may leave a heartbeat behind.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(helperDSNEnv); dsn != "" {
		os.Exit(helperProcess(dsn)) // a child of TestSQLite_Processes*
	}
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
