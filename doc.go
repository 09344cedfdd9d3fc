// Package gormlease runs slow work once per target at a time, across
// requests, processes and machines, with a heartbeat lease kept in one
// database row, for GORM applications. While one Run holds the lease on a
// target, the others on that target are refused at once with ErrLeaseHeld
// (Runner.Do and Runner.RunWait wait instead); a Run that starts after it
// finished runs the work again.
//
// The work is typically an external call that takes seconds to minutes,
// followed by a database save. A PostgreSQL advisory lock would pin a
// database connection for the whole call; a lease pins nothing. A Runner
// holds no connection while the work runs, only for the few statements of
// each step.
//
// # Lifecycle
//
// A lease on a target lives in the target's job_lease row:
//
//   - Acquire: the lease is taken when there is no row, the row was
//     released, or its last heartbeat is older than the lease timeout on
//     the database's clock. The timeout is the holder's own, recorded in the
//     row when it acquired, whatever the caller's: a Runner with a shorter
//     timeout (the next version, in a rolling deploy) never takes over a
//     lease that its holder still trusts. It records its own timeout, mints
//     a fresh token and bumps the generation. Otherwise the caller gets a
//     *HeldError at once, which matches ErrLeaseHeld and says who holds the
//     lease, at which generation and for how long, as the refusing
//     statement read it; nothing is written. On PostgreSQL every outcome
//     (a free row taken, a target's first acquire, a refusal) is one
//     statement, but for the refusal of a target that the same Repository
//     took last time, which is two; on MariaDB too, but for the takeover
//     of a target that the Repository saw refused last time, which is two;
//     on MySQL a target's first acquire, and a refusal, take two, and on
//     SQLite a refusal's second is a read in the process: see
//     Repository.Acquire.
//   - Heartbeat: every interval, one statement stamps the row where both the
//     target and the token match. Zero rows means the lease was taken over
//     (or released by force):
//     the work is cancelled, with ErrLeaseLost as its context.Cause. The
//     leases that one Runner holds share a statement per 1,000 (two on
//     MySQL).
//   - Fenced commit: one transaction locks the row and compares the token,
//     then runs the caller's saver. CommitIfOwner locks it with a locking
//     read through a model of the row (clause.Locking{Strength: "UPDATE"}:
//     SELECT ... FOR UPDATE; on SQLite, the transaction's write lock) and
//     records the save after the saver; Run's CommitAndRelease locks it with
//     the release statement itself, which locks and checks in one, and
//     commits the save and the release together. A stale holder's result is
//     discarded: nothing is saved. The saver must not commit or roll back
//     the transaction itself: its session refuses to.
//   - Release: marks the row released where the target and token match, so
//     the target can be acquired at once. The row is kept, so that the
//     generation keeps growing.
//
// # Fencing
//
// Every step matches the token, so a holder whose lease was taken over can
// change nothing: not the heartbeat, not the result, not the new holder's
// lease. The saver runs in the transaction that holds the row lock, so no
// takeover can slip in between the check and the save. The generation is a
// fencing number that grows with every acquisition of a target; the work
// reads it with LeaseFromContext, to pass on as an idempotency key.
//
// # Failure handling and self-fencing
//
// A heartbeat that fails (the database is unreachable, slow or failing) is
// retried. But the Runner trusts its lease only for the lease timeout minus
// a safety margin after the last successful heartbeat was sent. The
// database stamped that heartbeat after it was sent, so no one can take the
// lease over before the timeout counted from then. A timer, independent of
// the heartbeat calls, cancels the work with ErrLeaseLost when that trust
// runs out: a database outage never leaves the work running where another
// holder may start. Every database call carries a deadline.
//
// The timings follow what is given, so that one option is enough:
// WithLeaseTimeout alone sets the heartbeat interval to a quarter of it,
// WithHeartbeatInterval alone the lease timeout to four times it, and the
// safety margin (a tenth of the lease timeout), the operation timeout and
// with it the reconnect window (no longer than the lease timeout) follow
// the lease timeout unless they are given too.
//
// Acquire (on PostgreSQL and SQLite), heartbeat and release are single
// statements: after a serialization failure or deadlock (under a
// REPEATABLE READ or SERIALIZABLE session default, or InnoDB's deadlock
// detection) they are tried again, five times in all unless
// WithStatementAttempts says otherwise, as is the fenced commit's locking
// read, which comes before the saver. The fenced commit runs again, the
// saver too, only when its transaction provably saved nothing while the
// lease was still the caller's: Run commits again after the
// server ended the transaction before its COMMIT (a shutdown, a failover)
// or a COMMIT without an answer was settled as rolled back, and on a
// MariaDB Galera node the commit runs again after a certification failure
// while the lease is provably still the caller's. There, too, a
// step that found no row holding its lease, and a refused acquire, read the
// row with a causal read before they report it, and are sent again when the
// node had only not yet applied a write made on another node. The fenced
// commit's beginning and lock, before the saver, are tried again while the
// database cannot be reached (a failover), on every pool type. When the
// connection is lost while COMMIT is in flight, Run finds out whether the commit took effect (the release waits
// on the row lock until the transaction ends, and the row records the
// generation saved), asking again until the operation timeout while the
// database cannot be reached, and returns ErrCommitUnknown only when it
// cannot tell. An acquire whose answer was
// lost releases, by its new token, the lease it may have taken.
//
// Only an error that says that the database cannot be reached right now is
// tried again: a refused, reset or dropped connection, an attempt that timed
// out, a server's SQLSTATE of class 08 or 57P (shutting down, starting up)
// or its too many connections, a statement that the server ended at its
// lock_timeout, statement_timeout, innodb_lock_wait_timeout or
// max_statement_time, no server that accepts writes, SQLite's write lock
// still taken. An error that waiting cannot cure (a closed pool, a
// missing table, bad SQL, a permission, SQLite's errors but "database is
// locked" and "interrupted") every step returns at once, and so do Run,
// RunWait, Do and Elector.Lead. The Repository's acquires stop trying
// again as a Run's do, whatever their context, and under a context
// without a deadline bound each statement too (see Repository.Acquire).
//
// Release runs on a context that survives the caller's cancellation. When
// a Run failed, its release is tried again while the database cannot be
// reached, for the reconnect window (at least the operation timeout); if
// it still fails, the lease expires after the timeout.
//
// # Clocks
//
// Whether a lease has expired is decided by the database, in SQL, on its own
// clock. The application's clock only measures durations (monotonic time) to
// decide when to stop trusting a lease that it could not confirm. On a
// database of several servers that each stamp and judge leases with their own
// clock (a MariaDB Galera cluster), declare the largest difference between
// their clocks with WithClockSkew: the Runner stops trusting its lease that
// much earlier.
//
// # Waiting and sharing results
//
// Runner.RunWait waits while the target is held, then runs its own work;
// Runner.Do waits for the job in progress and returns its saved result,
// read back by a load function, so that callers who come while one job
// runs share it. Waiters hold no connection: the callers of one process on
// one pool and table share a watch of the row, woken by this process's own releases
// and commits, on PostgreSQL by LISTEN/NOTIFY (only rows marked as waited
// on notify), and otherwise by polling at most a heartbeat interval apart.
// The row records how each generation ended (saved_generation, saved_at,
// failure) in the statement that ends it. Waiters do not rerun a job that
// failed: they get ErrSharedJobFailed. When the holder dies, exactly one
// waiter takes the expired lease over. A caller that comes just after a
// job ended runs it again, unless WithReuseFor lets it reuse the result.
//
// # N at a time
//
// WithSlots(n) makes each target a semaphore of n slots, for work such as
// calls to an API that allows n concurrent requests: Run is refused only
// when all n are held, and RunWait waits for a free one. Each slot is a
// lease of its own, in a row of its own (Lease.Slot says which), with its
// own token, generation, heartbeat and fenced save. The slot rows record
// n, and a Runner with another n is refused (ErrSlotCountConflict) while
// slots are held under the first.
//
// # Operating: pause and stop
//
// Repository.Pause stops new acquisitions of a target, and its slots',
// until Resume: the acquire's own statements refuse a paused row, writing
// nothing, and Run and Acquire return a *PausedError (ErrPaused, which
// also matches ErrLeaseHeld); RunWait, Do and Elector.Lead wait, holding no
// connection. Repository.RequestStop asks the current holder to stop: the
// request, recorded for the live generation only, comes back on the
// holder's next heartbeat, and the work's context is cancelled with a cause
// wrapping ErrStopRequested; nothing is saved, the lease is released, and a
// waiter takes over. Holders and acquirers that nobody paused or stopped
// send no statement more for it. Repository.ForceRelease ends a lease by
// force, fenced as a takeover is: its holder's heartbeat and save get
// ErrLeaseLost. On a semaphore, RequestStop and ForceRelease act on every
// slot, and RequestStopSlot and ForceReleaseSlot on one, leaving the
// other slots' holders their leases.
//
// # What is not guaranteed
//
// The external call itself is not fenced: a holder that lost its lease may
// still be in the middle of its call while the new holder makes its own.
// Only the save is fenced. Make the call idempotent, keyed by the lease's
// generation, if a duplicate call matters. Run does not kill work that
// ignores its context; it only refuses to save its result. The guarantees
// assume the database's clock does not jump, and that the clocks of the
// database and the application run at about the same rate. With a
// PostgreSQL standby that replicates asynchronously, a failover can lose a
// save that Run reported, and the work then runs again; with a synchronous
// standby it cannot (docs/scaling.md says what holds on each cluster).
//
// The steps' SQL lives behind an internal seam, one backend per database
// (PostgreSQL, MySQL/MariaDB with Galera as a wrapper, SQLite): docs/design.md
// draws the layers, and gives the state diagram and the failure model.
package gormlease
