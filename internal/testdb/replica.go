package testdb

import (
	"context"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/plugin/dbresolver"

	"github.com/gormlease/gormlease"
)

// UseStaleReplica registers gorm.io/plugin/dbresolver on db, a pool on s,
// with one replica: a schema (PostgreSQL), database (MySQL) or file
// (SQLite) of its own on the same server, with the gormlease tables and no
// rows, as a replica that has not yet received any of the primary's writes.
// A read that dbresolver sends to it visibly misses what the primary holds.
// db's own connections stay the primary, the source of dbresolver. The
// replica is dropped when tb ends.
func UseStaleReplica(tb testing.TB, s *Server, db *gorm.DB) {
	tb.Helper()
	replica := s.OpenEmpty(tb, nil)
	if err := gormlease.AutoMigrate(context.Background(), replica); err != nil {
		tb.Fatalf("replica tables on %s: %v", s.Name, err)
	}
	pool, err := replica.DB()
	if err != nil {
		tb.Fatal(err)
	}
	// dbresolver opens each replica with gorm.Open: a dialector on the
	// replica's pool, rather than its DSN, leaves it nothing to close.
	var dialector gorm.Dialector
	switch s.Name {
	case "postgres":
		dialector = postgres.New(postgres.Config{Conn: pool})
	case "mysql":
		dialector = mysql.New(mysql.Config{Conn: pool})
	default:
		dialector = gormlite.OpenDB(pool)
	}
	// dbresolver also makes a prepared-statement store per pool, whose LRU
	// starts a goroutine that never exits (gorm's internal/lru says so),
	// unless the TTL is gorm's "no eviction" one of ten years. These pools
	// prepare no statements, and the goroutine would fail goleak.
	db.Config.PrepareStmtTTL = 10 * 365 * 24 * time.Hour
	if err := db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{dialector}})); err != nil {
		tb.Fatalf("dbresolver on %s: %v", s.Name, err)
	}
}
