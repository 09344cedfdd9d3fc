package admin

import (
	"github.com/gormlease/gormlease/internal/heartbeat"
	"github.com/gormlease/gormlease/internal/wait"
)

// Stats is a snapshot of what gormlease runs in this process: the
// goroutines that renew held leases and the watches of waiting callers.
// A gauge of them shows the library's own load; every count is zero once
// every Run, RunWait, Do and Elector of the process has returned. Read it
// with ReadStats.
type Stats struct {
	// HeartbeatGroups is the number of goroutines that renew held leases:
	// one for each Runner (an Elector has one) that holds leases, however
	// many; its leases are renewed together.
	HeartbeatGroups int
	// WatchedRows is the number of lease rows that waiting callers watch:
	// one watch for each row and pool, however many callers share it.
	WatchedRows int
}

// ReadStats returns the Stats of this process now, over every Runner,
// Elector and pool. It reads no database.
func ReadStats() Stats {
	return Stats{HeartbeatGroups: heartbeat.Live(), WatchedRows: int(wait.Watching())}
}

// WaitStats describes the waits of this process on one target's lease
// row: what Operator.Waiters returns.
type WaitStats struct {
	// Waits is the number of waits on the row, over every pool of the
	// process: each Do job (which the callers of one Runner for the target
	// share), each RunWait call whose turn it is (the calls of one Runner
	// for a target take turns), each Elector that waits to lead.
	Waits int
	// Held reports that a watch of the row has read it and found a lease
	// on it that was not released: the waits wait for its end.
	Held bool
}

// Waiters returns the waits of this process on targetID's row of the
// Operator's lease table, through any pool: Runner.Do, RunWait and
// Electors that wait for a live lease, or for a paused target, to end.
// Callers in other processes are not counted. It reads no database; an
// Operator without a Repository returns the zero WaitStats.
func (o *Operator) Waiters(targetID string) WaitStats {
	var out WaitStats
	r, err := o.parts()
	if err != nil {
		return out
	}
	for _, w := range wait.Watches(r.LeaseTable, targetID) {
		out.Waits += w.Subscribers
		out.Held = out.Held || (w.Read && w.State.Found && !w.State.Released)
	}
	return out
}

// Listening reports whether this process has a notification listener for
// the pool of the Operator's Repository that listens now (PostgreSQL
// only): the callers that wait through that pool are then woken by
// notifications, and poll only to cover a lost one. The listener runs
// while any caller waits through the pool, on a connection of its own. It
// is false on the other databases, through a connection pooler such as
// PgBouncer, where waiters only poll, and for an Operator without a
// Repository. It reads no database.
func (o *Operator) Listening() bool {
	r, err := o.parts()
	return err == nil && wait.Listening(r.DB)
}
