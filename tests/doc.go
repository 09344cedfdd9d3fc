// Package tests holds the tests of gormlease that need libraries that the
// library itself does not link, so that these stay out of the module graph
// of every application that imports gormlease: gorm.io/plugin/dbresolver
// (replica_test.go) and pgregory.net/rapid (model_test.go). It is a module
// of its own, which uses the root module's packages through a replace
// directive; besides its tests it holds only the command dockerpass (below),
// whose Docker client, github.com/ory/dockertest/v3, is the module's third
// such library.
//
// Its tests reach the same databases as the root module's, through
// internal/testdb, use the same helpers, those of internal/testkit, and
// run as they do:
//
//	cd tests && go vet ./... && go test -race -count=1 ./...
//
// Its command dockerpass (tests/dockerpass) runs these tests and the root
// module's against PostgreSQL and MariaDB in Docker containers.
package tests
