// Package gormleasegocron runs the jobs of github.com/go-co-op/gocron/v2
// schedulers once across processes, on gormlease's heartbeat leases: a
// Locker for each run of a job, and a DistributedElector for a leader that
// runs them all.
//
// # Locker: each run under its job's lease
//
// A Scheduler made WithDistributedLocker(locker) calls Lock(ctx, name)
// before each run of a job: the Locker takes the lease of target name (the
// job's name) and holds it with heartbeats until the run ends and gocron
// calls Unlock, which releases it. Lock returns an error wrapping
// gormlease.ErrLeaseHeld when the lease is held elsewhere, and gocron then
// skips the run. Give every job a name of its own (gocron.WithName): the
// name is the target. A job's own error never reaches the Locker, nor the
// DistributedElector: one that wraps gormlease.ErrLeaseHeld (the job called
// Run on another target, held or paused, and returned that refusal) is the
// job's failure, which gocron reports to AfterJobRunsWithError; its lease
// is released as after any run (under WithMinHold, held to the hold's end),
// and the next tick runs it again.
//
// The timers of the pods' schedulers fire a little apart, and a fast job
// may have ended, and its lease been released, before another pod's timer
// fires for the same tick, which would then run the job again. Pass
// gormlease.WithMinHold(d) to NewLocker, with d shorter than the job's
// period and longer than the spread of the pods' timers: the target then
// stays held until d after its acquisition, however soon the run ended,
// and the late pods are refused. For jobs that all pods run on the same
// wall-clock ticks, use CronJob schedules (or DurationJob with
// WithStartAt), so that the timers fire at the same moments.
//
// # What a Locker cannot do
//
// A Locker is not a fence. gocron gives the job no context that is
// cancelled when the lease is lost: a run whose process froze past the
// lease timeout, or lost the database for that long, goes on while another
// pod, having taken the lease over, runs the job too. The Locker notices
// (its heartbeats stop trusting the lease before it can expire, and Unlock
// returns an error wrapping gormlease.ErrLeaseLost), but the job does not.
// Nor can its writes be fenced, since the job does not see the lease. Two
// ways are fenced:
//   - The DistributedElector: its Term gives the leader a context that
//     carries the lease (gormlease.LeaseFromContext) and is cancelled with
//     gormlease.ErrLeaseLost when leadership is lost; a job passes it to
//     its calls, and saves with Repository().CommitIfOwner, which refuses a
//     deposed leader's writes.
//   - A job that calls gormlease.Runner.Run (or RunWait) itself, without a
//     Locker: Run cancels its work on loss and saves only while the lease
//     is the caller's.
//
// # DistributedElector: one leader runs the jobs
//
// A Scheduler made WithDistributedElector(elector) asks IsLeader before
// each run, and runs it only when IsLeader returns nil. The
// DistributedElector that NewDistributedElector returns campaigns for the
// role's lease in the background, with gormlease.Elector.Lead in a loop,
// until its context ends or Close is called: when the leader's process dies or
// freezes, a standby leads within the lease timeout plus a heartbeat
// interval. IsLeader returns nil only while the DistributedElector leads
// and still trusts its lease. A run that started just before leadership was
// lost goes on, unless it watches Term's context. A campaign retries while
// the database cannot be reached; an error that waiting cannot cure (a
// closed pool, a missing table) ends it, and IsLeader then returns that
// error, wrapped with ErrNotLeader.
//
// # Pause and stop
//
// An operator pauses a job, or a role, with gormlease's admin.Operator.Pause
// (or the gormlease CLI's pause) on its target, and lets it run again with
// Resume:
//   - A paused job's ticks are skipped: Lock is refused at once with a
//     *gormlease.PausedError, which gocron counts as a skipped run (its
//     AfterLockError listener gets it), and which nothing logs above Debug.
//   - No DistributedElector leads a paused role: the campaigns wait,
//     holding no connection, until Resume, and a leader in office when the
//     role is paused steps down within half the lease timeout, its Term's
//     context cancelled with a cause wrapping gormlease.ErrPaused.
//
// admin.Operator.RequestStop asks the holder to stop: a Lock's lease is given up
// at its next heartbeat (Unlock then returns an error wrapping
// gormlease.ErrStopRequested; the job itself goes on, as after a loss), and
// a leader's term ends, its Term's context cancelled with a cause wrapping
// ErrStopRequested. Pause first to keep anyone from taking over.
package gormleasegocron
