// Package history checks what gormlease did, from the outside: worker
// processes log every call of Run, RunWait and Do they make (events.go,
// worker.go), the database records every change of every lease row and
// every saved result (schema.go), and Check (check.go) verifies the
// guarantees over all of it: no double save per generation, no save by a
// generation after a later one started its work, no lost result and no
// phantom one, no takeover before the holder's own recorded expiry,
// progress on every target in every quiet window, and, with porcupine
// (model.go), that each target's acquisitions and saves are linearizable
// against a lease in which only the current generation may save; and that
// a target paused by the operator starts no work (no call made after a
// Pause returned nil took the lease before the first Resume was sent: see
// Pause).
//
// Beside their Run loops, the workers call Do and RunWait, each loop with
// a Runner of its own (calls of Do on one Runner in a process share one
// job), and Check holds these to their promises too (checkDo). Do: a call
// that began while a generation was unsaved does not run the work under a
// later generation when that one saved after the call began (a second
// result for the same wave); a result it shares was saved after it began;
// a SharedJobError names a generation that saved nothing, for a call that
// did not run the work itself. Run, RunWait and Do each run the work at
// most once per call, also when the work fails with a refusal it met
// inside (some of RunWait's works call Run on their own target, which
// their lease holds, and return its error). Their works run under leases
// that the checks above judge as any other.
//
// The lease table keeps its history (gormlease.WithHistory), and Check
// cross-checks its events (job_lease_event, read with plain SQL: see
// ReadEvents, and checkEvents for the rules) against the records above and
// the workers' logs, and so proves that the history says what happened,
// all of it and nothing else: each acquisition in the audit log has
// exactly one acquired event of its generation, with its holder, how (new,
// released, expired) and the generation before; each end of a generation
// (a release, a save, a takeover, a forced release) exactly one ended
// event, with its holder and acquisition time, and a cause that fits the
// change (expired for a takeover past the holder's timeout, a release's
// cause for a release); no event without its change; seq 1, 2, ... per
// target, in the order of the changes. Each call that ran its work under
// a generation has that generation's acquired event, with the call's
// Runner's holder; a call that returned nil has its generation ended as
// saved; one that failed after its work ran, and whose release ended its
// generation, has the cause its error says (failed, with the failure's
// text, lost, stopped, cancelled, save_failed), unless its outcome could
// not be known (a commit without an answer, a crash). The operator's
// Pause, Resume and RequestStop, made as "history-driver" (OperatorCall),
// each have their event with that name and reason when the call returned
// nil, and no operator's event was written outside such a call.
//
// The randomized test that drives it (history_test.go) runs the workers
// as processes of their own, with different settings, while it injects
// faults: pauses past the lease timeout, connection kills, commits stalled
// past the lease timeout, crashes with restarts, and refused connections
// (the worker's dialer is refused for a while, as by a server or a pooler
// that is down, and its open connections are closed: see
// WorkerConfig.RefuseFile); on SQLite, which has no server to proxy,
// pauses and crashes. As an operator would, it pauses targets
// (admin.Operator.Pause), asks their holders to stop (RequestStop) and resumes
// them; on a Patroni cluster, it fails the cluster over too, after which
// the database's records are read on the primary that survived. There the
// operator acts during each failover, and sends each call again until it
// lands, as a careful operator's script does: a Pause whose answer was lost
// may have landed, so the pause counts as certain only from an answer of
// nil, and as over from the first Resume sent. On a Galera cluster of three
// nodes (galera_test.go), it crashes a node in every other fault phase,
// and reads the records on every node.
//
// The checker must catch three mutations (mutation_test.go): a fenced
// commit without its token check (mutate.go); with the root package's build
// tag gormlease_mutation_do_first_read, a Do that runs a second job after
// its first reads were refused; and, after a clean run, its event table
// corrupted (an event deleted, a how changed, an operator's event
// deleted, a seq duplicated). It is its own module so that porcupine stays
// out of the core module's dependencies.
package history
