package gormlease_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests, closes the test databases, and then fails the run
// if any goroutine is left over: no Run may leave a heartbeat behind.
func TestMain(m *testing.M) {
	flag.Parse()
	if _, err := testdb.Example(); err != nil && os.Getenv("CI") == "" && flag.Lookup("test.run").Value.String() == "" {
		// Examples cannot skip themselves: leave them out when there is no
		// database. The tests skip loudly (and fail under CI).
		fmt.Fprintln(os.Stderr, "DATABASE TESTS NOT RUN: examples left out:", err)
		flag.Set("test.run", "^(Test|Fuzz)")
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
