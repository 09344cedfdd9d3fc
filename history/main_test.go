package history

import (
	"os"
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (see testdb.Main: goroutine leaks fail the run),
// or, in a process that the tests start, a worker.
func TestMain(m *testing.M) {
	if os.Getenv(WorkerEnv) != "" {
		os.Exit(WorkerMain())
	}
	testdb.Main(m)
}
