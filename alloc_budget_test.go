//go:build !race

// The race detector allocates for its own bookkeeping, so the budget is
// counted only without it: `go test -run TestAllocs_ .` (CI's runs with
// -race leave this file out; they do not skip a test).

package gormlease_test

import (
	"testing"

	"github.com/gormlease/gormlease/internal/testdb"
)

// allocBudget is the most allocations that each measure may make on each
// database: the figure measured when it was set (docs/performance.md, "The
// client's own cost"), plus a margin of about a tenth for what the drivers
// and the runtime vary by. A change that allocates more on the hot path
// fails TestAllocs_WithinBudget; one that allocates less should lower it.
var allocBudget = map[string]struct{ job, round1, round1000 float64 }{
	"postgres": {job: 160, round1: 22, round1000: 25},    // measured 140, 20, 22
	"mysql":    {job: 197, round1: 70, round1000: 10600}, // measured 179 (MariaDB's upsert, its RETURNING scanned), 64, 10079
	"sqlite":   {job: 162, round1: 58, round1000: 10550}, // measured 147, 53, 10049
}

// The allocations of a full job and of a heartbeat round, averaged over
// many, stay within allocBudget on every database. It is not parallel:
// testing.AllocsPerRun counts the allocations of the whole process.
func TestAllocs_WithinBudget(t *testing.T) {
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			db := s.DB(t)
			budget, ok := allocBudget[s.Name]
			if !ok {
				t.Fatalf("no allocation budget for %s", s.Name)
			}
			for _, m := range []struct {
				name   string
				setup  func(t *testing.T) func() // returns one of what is counted
				budget float64
			}{
				{"Job", func(t *testing.T) func() { return allocJob(t, db) }, budget.job},
				{"HeartbeatRound1", func(t *testing.T) func() { return allocRound(t, db, 1) }, budget.round1},
				{"HeartbeatRound1000", func(t *testing.T) func() { return allocRound(t, db, 1000) }, budget.round1000},
			} {
				// Each in a test of its own, whose cleanup stops what it
				// started before the next is counted.
				t.Run(m.name, func(t *testing.T) {
					run := m.setup(t)
					run() // pools and caches warm
					got := testing.AllocsPerRun(100, run)
					t.Logf("%.1f allocations, budget %.0f", got, m.budget)
					if got > m.budget {
						t.Errorf("%.1f allocations, more than the budget of %.0f", got, m.budget)
					}
				})
			}
		})
	}
}
