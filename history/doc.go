// Package history checks what gormlease did, from the outside: worker
// processes log every Run they make (events.go, worker.go), the database
// records every change of every lease row and every saved result
// (schema.go), and Check (check.go) verifies the guarantees over all of it:
// no double save per generation, no save by a generation after a later one
// started its work, no lost result and no phantom one, no takeover before
// the holder's own recorded expiry, progress on every target in every
// quiet window, and, with porcupine (model.go), that each target's
// acquisitions and saves are linearizable against a lease in which only
// the current generation may save; and that a target paused by the
// operator starts no work (no Run called after a Pause returned nil took
// the lease before the first Resume was sent: see Pause).
//
// The randomized test that drives it (history_test.go) runs the workers
// as processes of their own, with different settings, while it injects
// faults: pauses past the lease timeout, connection kills, commits stalled
// past the lease timeout, and crashes with restarts (on SQLite, which has
// no server to proxy, pauses and crashes), and, as an operator would, pauses
// targets (Repository.Pause), asks their holders to stop (RequestStop) and
// resumes them; on a Patroni cluster, failovers too, after which the
// database's records are read on the primary that survived. There the
// operator acts during each failover, and sends each call again until it
// lands, as a careful operator's script does: a Pause whose answer was lost
// may have landed, so the pause counts as certain only from an answer of
// nil, and as over from the first Resume sent. It is its own module so that
// porcupine stays out of the core module's dependencies.
package history
