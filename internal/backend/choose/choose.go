// Package choose picks the backend of a gorm dialector: the one place that
// knows every backend, for gormlease (For) and its test kit (TestKitFor).
package choose

import (
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/galera"
	"github.com/gormlease/gormlease/internal/backend/mysql"
	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/backend/sqlite"
)

// For returns the backend for the gorm dialector named name, with its
// statements written for the tables t, and false for a database that
// gormlease does not support. MySQL runs wrapped for Galera, which it is
// only where the server is a Galera node.
func For(name string, t backend.Tables) (backend.Backend, bool) {
	b, ok := pick(name, t)
	return b, ok
}

// TestKitFor returns the test kit's statements of the backend that For
// returns, for the test kit (package leasetest) alone.
func TestKitFor(name string, t backend.Tables) (backend.TestKit, bool) {
	b, ok := pick(name, t)
	return b, ok
}

// withKit is what every backend implements: the steps' statements and the
// test kit's.
type withKit interface {
	backend.Backend
	backend.TestKit
}

// pick returns the backend for the dialector named name, nil and false
// for a database that gormlease does not support.
func pick(name string, t backend.Tables) (withKit, bool) {
	switch name {
	case "postgres":
		return postgres.New(t), true
	case "mysql":
		return galera.Wrap(mysql.New(t)), true
	case "sqlite":
		return sqlite.New(t), true
	}
	return nil, false
}
