package gormleasegocron_test

import (
	"os"
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (testdb.Main: goroutine leaks fail the run), or,
// in a child process of the scheduler tests, a scheduler.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(schedulerChild(mode))
	}
	testdb.Main(m)
}
