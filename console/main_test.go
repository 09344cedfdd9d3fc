package console_test

import (
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests; goroutine leaks fail the run (see testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }
