package gormlease

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/heartbeat"
	"github.com/gormlease/gormlease/observe"
)

// DefaultStatementAttempts is the default of WithStatementAttempts, which
// its doc says (5), for the tests.
const DefaultStatementAttempts = defaultStatementAttempts

// NewHeldError is a HeldError of target that expires in expires, held for
// heldFor, under a minimum hold or not.
func NewHeldError(target string, expires, heldFor time.Duration, minHold bool) *HeldError {
	return &HeldError{Target: target, ExpiresIn: expires, HeldFor: heldFor, minHold: minHold}
}

// PostgresSchema exposes the PostgreSQL DDL to the black-box tests.
var PostgresSchema = postgres.Schema

// PostgresHistorySchema exposes the PostgreSQL DDL of the history.
var PostgresHistorySchema = postgres.HistorySchema

// callersPool is a pool of the caller's own around a *sql.DB: it is not
// a *sql.DB, so the backends take it as they take gorm's prepared
// statements or a resolver's pool.
type callersPool struct{ *sql.DB }

// CommitThroughGorm makes r run its fenced commits in gorm's transaction,
// as on a pool of the caller's own (and as the PostgreSQL backend does
// once the driver has refused to send BEGIN and the locking statement as
// one query): r's pool, gorm's *sql.DB, is wrapped.
func CommitThroughGorm(r *Repository) {
	db := r.db.Session(&gorm.Session{NewDB: true, Context: context.Background()})
	db.Statement.ConnPool = callersPool{r.db.Statement.ConnPool.(*sql.DB)}
	r.db = db
}

// PostgresAcquire and PostgresAcquireRow are the PostgreSQL acquire's
// statements.
const (
	PostgresAcquire    = postgres.AcquireSQL
	PostgresAcquireRow = postgres.AcquireRowSQL
)

// ownSQL returns r's statement of op on the caller's own row.
func ownSQL(r *Repository, op backend.Own) string {
	return r.backend.(interface{ OwnSQL(backend.Own) string }).OwnSQL(op)
}

// ReleaseSQL returns r's release statement.
func ReleaseSQL(r *Repository) string { return ownSQL(r, backend.Release) }

// SaveReleaseSQL returns the statement that locks the row in Run's fenced
// commit: the release that records the save.
func SaveReleaseSQL(r *Repository) string { return ownSQL(r, backend.SaveRelease) }

// IsSerializationFailure and AnsweredByServer are the classifiers of
// database errors.
var (
	IsSerializationFailure = backend.IsSerializationFailure
	AnsweredByServer       = backend.AnsweredByServer
)

// DoCallers returns the number of callers of r.Do in this process that
// share the job on target now.
func DoCallers[T any](r *Runner[T], target string) int {
	r.local.mu.Lock()
	defer r.local.mu.Unlock()
	if f := r.local.flights[target]; f != nil {
		return f.callers
	}
	return 0
}

// CommitAttempts is how many fenced commits a Run sends in all when they
// end without saving.
const CommitAttempts = commitAttempts

// Timings are the timings a Runner runs with, after its defaults were
// derived from the options given.
type Timings struct {
	Interval, Timeout, Margin, Operation, Reconnect time.Duration
}

// RunnerTimings returns r's timings.
func RunnerTimings[T any](r *Runner[T]) Timings {
	c := r.cfg
	return Timings{c.heartbeatInterval, c.leaseTimeout, c.safetyMargin, c.operationTimeout, c.reconnect()}
}

// ElectorTimings returns e's timings.
func ElectorTimings(e *Elector) Timings { return RunnerTimings(e.runner) }

// BeatRound is one heartbeat round as JoinBeats's round reports it: how
// many leases its statement renewed, how many it found lost, and its
// error.
type BeatRound struct {
	Renewed, Lost int
	Err           error
}

// JoinBeats has r's heartbeat goroutine renew leases, at most
// backend.MaxBatch of them, as it renews a Run's, and returns round, which
// runs the next round of them: the statement that renews them all. Each
// statement, once it has returned, waits for the next call of round before
// the goroutine goes on, so a call of round spans one round of the
// goroutine's work and nothing of the next; with an interval of a
// millisecond, the rounds go as fast as round is called and the database
// answers. stop ends their renewal and waits for the goroutine.
func JoinBeats(r *Repository, leases []Lease) (round func() BeatRound, stop func()) {
	statements := make(chan BeatRound)
	resume := make(chan struct{})
	done := make(chan struct{})
	s := heartbeat.Settings{
		Interval:         time.Millisecond,
		OperationTimeout: time.Minute,
		Report:           done, // a group of their own
		Round: func(_ context.Context, rd heartbeat.Round) {
			select {
			case statements <- BeatRound{len(rd.Members) - len(rd.Ended), len(rd.Ended), rd.Err}:
			case <-done:
				return
			}
			select {
			case <-resume:
			case <-done:
			}
		},
	}
	if len(leases) > backend.MaxBatch {
		// More would take several statements a round, which round does
		// not wait for.
		panic(fmt.Sprintf("JoinBeats: %d leases, more than one statement's %d", len(leases), backend.MaxBatch))
	}
	members := make([]*heartbeat.Member, len(leases))
	for i, l := range leases {
		members[i] = r.beats.Join(s, context.Background(), l.row(), time.Now(), time.Hour, func(heartbeat.Loss) {})
	}
	waiting := false // a statement returned and waits for the next round
	round = func() BeatRound {
		for {
			if waiting {
				resume <- struct{}{}
			}
			b := <-statements
			waiting = true
			// The first statements may have been sent while the leases
			// were still joining, and renew only some of them.
			if b.Renewed+b.Lost == len(leases) || b.Err != nil {
				return b
			}
		}
	}
	stop = func() {
		close(done)
		for _, m := range members {
			m.Stop()
		}
	}
	return round, stop
}

// AcquireFrom is Acquire for a caller that waited for generation to end,
// as Runner.Do's acquire is: it takes the lease over only from that
// generation (when the row still has it, and it is released or expired),
// or, for generation 0, only when the target has no row. Refused by a live
// lease, it returns a *HeldError; refused by a row that is not live but at
// another generation, an error that wraps ErrLeaseHeld alone.
func AcquireFrom(r *Repository, ctx context.Context, targetID string, timeout time.Duration, generation int64) (Lease, error) {
	if generation < 0 {
		return Lease{}, invalidf("generation must be >= 0, got %d", generation)
	}
	return r.acquire(ctx, targetID, timeout, generation)
}

// HeartbeatMany renews every lease in leases as a Runner's heartbeat
// group does, in batches of up to backend.MaxBatch, and returns the leases
// that are no longer the caller's (taken over or released), as a set. A
// lease whose holder was asked to stop is renewed, and not reported. A
// bad lease is refused before anything is written.
func HeartbeatMany(r *Repository, ctx context.Context, leases []Lease) (lost map[Lease]bool, err error) {
	rows := make([]backend.Lease, len(leases))
	byRow := make(map[backend.Lease]Lease, len(leases))
	for i, l := range leases {
		if err := l.check(); err != nil {
			return nil, err
		}
		rows[i] = l.row()
		byRow[rows[i]] = l
	}
	ended, err := r.heartbeatMany(ctx, rows)
	if err != nil {
		return nil, err
	}
	lost = make(map[Lease]bool, len(ended))
	for l, e := range ended {
		if !e.Stop {
			lost[byRow[l]] = true
		}
	}
	return lost, nil
}

// CommitAndRelease is Run's fenced commit: CommitIfOwner that also
// releases l, in the same transaction.
func CommitAndRelease(r *Repository, ctx context.Context, l Lease, fn func(tx *gorm.DB) error) error {
	return r.commitAndRelease(ctx, l, fn)
}

// ReleaseFailed is Release for a job that failed with cause, which the row
// keeps for the callers of Runner.Do that waited for the job.
func ReleaseFailed(r *Repository, ctx context.Context, l Lease, cause error) error {
	return r.releaseFailed(ctx, l, backend.EndFailed, cause)
}

// Vacancy and TermEndOf are what an Elector reports of its terms: the time
// that the role had been without a leader, and why a term ended.
var (
	Vacancy   = vacancy
	TermEndOf = termEnd
)

// NewLossCause is the cause with which a Run's work is cancelled when its
// lease is lost, of kind (observe.EventLeaseLost, EventSelfFenced or
// EventMaxHoldExceeded).
func NewLossCause(kind observe.EventKind) error {
	return &lossCause{kind: kind, err: fmt.Errorf("gormlease: lost: %w", ErrLeaseLost)}
}

// NewStopRequested is the cause with which a Run's work is cancelled when
// an operator asked its holder to stop.
func NewStopRequested(target, reason string) error {
	return &stopRequestedError{target: target, reason: reason}
}
