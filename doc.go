// Package gormlease runs slow work once per target at a time, across
// requests, processes and machines, with a heartbeat lease kept in one
// database row, for GORM applications. While one Run holds the lease on a
// target, the other Runs on that target are refused at once with
// ErrLeaseHeld; Runner.RunWait and Runner.Do wait instead, and an Elector
// elects one leader per role; a Run that starts after another finished runs
// the work again. The work is typically an external call that takes seconds
// to minutes, then a database save: unlike a PostgreSQL advisory lock, a
// lease pins no connection while the work runs.
//
// # Guarantees
//
//   - A lease is taken only when the target's row is free: there is none, it
//     was released, or its last heartbeat is older than the lease timeout
//     that its holder recorded, judged on the database's clock.
//   - Every step matches the lease's token, and the save runs in a
//     transaction that has locked the row and checked the token: a holder
//     whose lease was taken over saves nothing. The generation grows with
//     every acquisition: an idempotency key (LeaseFromContext).
//   - A holder that cannot confirm its lease stops trusting it, and cancels
//     its work with ErrLeaseLost, before anyone can take it over.
//   - Run returns only after the work has returned, the result was committed
//     or discarded, and the lease was released (or held, for WithMinHold),
//     even when ctx was cancelled; a release that fails leaves the lease to
//     expire, and Run's error says so.
//   - Only errors that say that the database cannot be reached right now, and
//     serialization failures, are tried again; every call returns any other
//     error at once: a missing table or column as ErrMissingTables, which
//     Repository.CheckTables finds at startup.
//
// # What is not guaranteed
//
// The external call itself is not fenced: a holder that lost its lease may
// still be in its call while the new holder makes its own; key the call by
// the generation if a duplicate matters. Run does not kill work that ignores
// its context. The database's clock must not jump. With an asynchronous
// PostgreSQL standby, a failover can lose a save that Run reported
// (docs/scaling.md).
//
// docs/design.md tells how it works: each step's statements on each
// database, the failure model, waiting and sharing results (RunWait, Do),
// slots (WithSlots), pausing and stopping a target. docs/reliability.md
// tells what was tested under faults.
package gormlease
