package admin_test

import (
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (see testdb.Main: goroutine leaks fail the run).
func TestMain(m *testing.M) { testdb.Main(m) }
