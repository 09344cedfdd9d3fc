package testdb

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main runs a test package's tests, closes the test databases, and then
// fails the run if any goroutine is left over: no Run may leave a heartbeat
// behind. Call it from TestMain; it does not return.
func Main(m *testing.M) {
	code := m.Run()
	Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
