// Package history checks what gormlease did, from the outside: worker
// processes log every Run they make (events.go, worker.go), the database
// records every change of every lease row and every saved result
// (schema.go), and Check (check.go) verifies the guarantees over all of it:
// no double save per generation, no save by a generation after a later one
// started its work, no lost result and no phantom one, no takeover before
// the holder's own recorded expiry, progress on every target in every
// quiet window, and, with porcupine (model.go), that each target's
// acquisitions and saves are linearizable against a lease in which only
// the current generation may save.
//
// The randomized test that drives it (history_test.go) runs the workers
// as processes of their own, with different settings, while it injects
// faults: pauses past the lease timeout, connection kills, commits stalled
// past the lease timeout, and crashes with restarts (on SQLite, which has
// no server to proxy, pauses and crashes); on a Patroni cluster, failovers
// too, after which the database's records are read on the primary that
// survived. It is its own module so that porcupine stays out of the core
// module's dependencies.
package history
