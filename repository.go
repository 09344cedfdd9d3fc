package gormlease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Lease is a lease that the caller holds: what Repository.Acquire returns and
// every later step takes. Its Token is what proves ownership; keep the Lease
// to the goroutine that acquired it.
type Lease struct {
	// TargetID names the leased target.
	TargetID string
	// Token was minted for this acquisition; no other acquisition has it.
	Token uuid.UUID
	// Generation is the fencing number of this acquisition: greater than that
	// of every earlier acquisition of the same target. Use it, for instance,
	// as the idempotency key of the external call the work makes.
	Generation int64
}

// check returns an error wrapping ErrInvalidArgument when l cannot be a
// lease that Acquire returned.
func (l Lease) check() error {
	if err := checkTargetID(l.TargetID); err != nil {
		return err
	}
	if l.Token == uuid.Nil {
		return invalidf("lease on %q has the nil token: use the Lease that Acquire returned", l.TargetID)
	}
	return nil
}

// Repository runs the steps of the lease protocol, one method a step, each
// one or two statements on the database. Runner composes them; use the
// Repository directly to drive the steps yourself. A Repository is safe for
// concurrent use and holds no connection between calls.
type Repository struct {
	db      *gorm.DB
	dialect dialect
	holder  string
	// renewSQL and releaseSQL are the statements that stamp the caller's
	// own row, in the dialect's placeholders.
	renewSQL, releaseSQL string
	// oneTripRefused is set once the driver refused to begin the fenced
	// transaction and lock the row in one query (see lockingBeginner).
	oneTripRefused atomic.Bool
	// attempts is how often a statement is tried after serialization
	// failures: statementAttempts, but in tests.
	attempts int
}

// NewRepository returns a Repository on db, which must be a *gorm.DB from
// gorm.Open on a supported database, not inside a transaction. It writes
// nothing to the database; create the tables with AutoMigrate. On SQLite it
// reads the connection's busy timeout, and refuses one that would make
// concurrent steps fail with "database is locked" (see MinSQLiteBusyTimeout).
func NewRepository(db *gorm.DB) (*Repository, error) {
	return newRepository(db, defaultHolder())
}

func newRepository(db *gorm.DB, holder string) (*Repository, error) {
	if db == nil {
		return nil, invalidf("db is nil")
	}
	if db.Statement != nil {
		if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
			return nil, invalidf("db is inside a transaction: pass the *gorm.DB that gorm.Open returned")
		}
	}
	d, err := dialectFor(db)
	if err != nil {
		return nil, err
	}
	// Each step is one statement or an explicit transaction: gorm's default
	// transaction around single writes would only add round trips.
	db = db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true})
	ctx, cancel := context.WithTimeout(context.Background(), settingsCheckTimeout)
	defer cancel()
	if err := checkSettings(ctx, d, db); err != nil {
		return nil, err
	}
	own := func(column string) string {
		return d.rebind("UPDATE job_lease SET " + column + " = " + d.now() +
			" WHERE target_id = ? AND lease_token = ? AND released_at IS NULL")
	}
	return &Repository{
		db: db, dialect: d, holder: holder, attempts: statementAttempts,
		renewSQL: own("updated_at"), releaseSQL: own("released_at"),
	}, nil
}

// Acquire takes the lease on targetID in one statement (on MySQL, two for a
// target never acquired before), when no one holds it: there is no row for
// the target, the row was released, or its last heartbeat is older than
// timeout on the database's clock. It mints a fresh token and returns the
// new Lease. When another holder's lease is live it returns an error
// wrapping ErrLeaseHeld, at once and without writing. (On MySQL, InnoDB
// locks the row before it checks it, so while the holder's fenced commit
// runs, a refused acquire waits for that commit to end.) When the
// connection fails before the answer comes back, Acquire returns the error
// after releasing, by its new token, the lease that the statement may have
// taken, so that the target is not left held until the timeout.
func (r *Repository) Acquire(ctx context.Context, targetID string, timeout time.Duration) (Lease, error) {
	return r.acquire(ctx, targetID, timeout, DefaultOperationTimeout)
}

// acquire is Acquire. When the statement fails without an answer from the
// database (a lost connection, a timeout), it may still have taken the
// lease, under a token that no one would know: the target would stay held
// until the lease timed out. So acquire then releases the lease by that
// token, on a context that survives ctx's cancellation, bounded by cleanup.
// The token is this attempt's alone, so the release cannot touch another
// holder's lease. It is best effort: a statement still in flight after the
// release leaves the lease to time out.
func (r *Repository) acquire(ctx context.Context, targetID string, timeout, cleanup time.Duration) (Lease, error) {
	if err := checkTargetID(targetID); err != nil {
		return Lease{}, err
	}
	if timeout <= 0 {
		return Lease{}, invalidf("lease timeout must be > 0, got %v", timeout)
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return Lease{}, wrapf(err, "acquire %q: mint token", targetID)
	}
	var gen int64
	var ok bool
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		gen, ok, err = r.dialect.acquire(ctx, r.db, acquireArgs{
			targetID: targetID, token: token, holder: r.holder, timeout: timeout,
		})
		return err
	})
	switch {
	case isSerializationFailure(err):
		// Every attempt was rolled back, having changed nothing, because
		// another session changed the target's row (or, on MySQL, locked
		// it) at the same time: another acquire taking it, or the holder's
		// heartbeat, release or fenced commit. For the caller this is a
		// lease held: the work must not run now, and a later Run may.
		return Lease{}, wrapf(fmt.Errorf("%w: concurrent steps on the target kept conflicting with the acquire (%d attempts, the last: %w)",
			ErrLeaseHeld, r.attempts, err), "acquire %q", targetID)
	case err != nil:
		if !answeredByServer(err) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanup)
			_ = r.release(cctx, r.db, Lease{TargetID: targetID, Token: token})
			cancel()
		}
		return Lease{}, wrapf(err, "acquire %q", targetID)
	case !ok:
		return Lease{}, wrapf(ErrLeaseHeld, "acquire %q", targetID)
	}
	return Lease{TargetID: targetID, Token: token, Generation: gen}, nil
}

// Heartbeat renews l: one statement stamps the row with the database's time
// where both the target and the token match. When no row matches, the lease
// was taken over or released, and Heartbeat returns an error wrapping
// ErrLeaseLost: stop the work. A serialization failure or deadlock is
// retried a few times; when it persists and the row still holds l,
// Heartbeat returns an error that wraps it: l was not renewed, nor lost.
func (r *Repository) Heartbeat(ctx context.Context, l Lease) error {
	if err := l.check(); err != nil {
		return err
	}
	n, err := r.updateOwnRow(ctx, r.db, l, r.renewSQL)
	if err != nil {
		return wrapf(err, "heartbeat %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "heartbeat %q", l.TargetID)
	}
	return nil
}

// heartbeatBatchSize is the most leases that HeartbeatMany renews in one
// statement.
const heartbeatBatchSize = 1000

// HeartbeatMany renews every lease in leases, as Heartbeat does each one, in
// one statement per 1,000 leases on databases that allow it (PostgreSQL) and
// one statement per lease on the others. It returns the leases that were
// not renewed because they are no longer the caller's (taken over or
// released), as a set; stop their work. An error means the outcome of some
// leases is unknown: nothing is reported lost then, but some leases may have
// been renewed.
func (r *Repository) HeartbeatMany(ctx context.Context, leases []Lease) (lost map[Lease]bool, err error) {
	for _, l := range leases {
		if err := l.check(); err != nil {
			return nil, err
		}
	}
	return r.heartbeatMany(ctx, leases)
}

// heartbeatMany is HeartbeatMany on leases already checked.
func (r *Repository) heartbeatMany(ctx context.Context, leases []Lease) (map[Lease]bool, error) {
	lost := map[Lease]bool{}
	batcher, ok := r.dialect.(batchHeartbeater)
	if !ok {
		for _, l := range leases {
			err := r.Heartbeat(ctx, l)
			switch {
			case errors.Is(err, ErrLeaseLost):
				lost[l] = true
			case err != nil:
				return nil, err
			}
		}
		return lost, nil
	}
	for len(leases) > 0 {
		chunk := leases[:min(len(leases), heartbeatBatchSize)]
		leases = leases[len(chunk):]
		var renewed map[Lease]bool
		err := r.retry(ctx, func(ctx context.Context) (err error) {
			renewed, err = batcher.heartbeatBatch(ctx, r.db, chunk)
			return err
		})
		if err != nil {
			return nil, wrapf(err, "heartbeat %d leases", len(chunk))
		}
		for _, l := range chunk {
			if !renewed[l] {
				lost[l] = true
			}
		}
	}
	return lost, nil
}

// CommitIfOwner runs fn in a transaction that first locks the lease row
// (SELECT ... FOR UPDATE) and checks that it still carries l's token. When it
// does not, fn is not called, nothing is written, and CommitIfOwner returns an
// error wrapping ErrLeaseLost. While the transaction runs, an acquire that
// would take the lease over waits for it to end. The transaction runs at
// READ COMMITTED. fn must use tx, and not keep it after it returns; when fn
// returns an error the transaction is rolled back and the error returned.
// fn may nest transactions on tx, which run as savepoints, but tx refuses
// to be committed or rolled back by fn: the fenced commit ends it.
// The context of tx carries l (see LeaseFromContext), so SaveJSON works as fn.
// When the connection fails while COMMIT is in flight, CommitIfOwner returns
// an error wrapping ErrCommitUnknown: fn's writes may or may not be saved.
func (r *Repository) CommitIfOwner(ctx context.Context, l Lease, fn func(tx *gorm.DB) error) error {
	return r.commit(ctx, l, fn, false)
}

// commit is CommitIfOwner; with release set it also releases the lease in
// the same transaction, so that the save and the release are one durable write.
func (r *Repository) commit(ctx context.Context, l Lease, fn func(tx *gorm.DB) error, release bool) error {
	if err := l.check(); err != nil {
		return err
	}
	if fn == nil {
		return invalidf("commit function is nil")
	}
	ctx = withLease(ctx, l)
	if b, ok := r.dialect.(lockingBeginner); ok && !r.oneTripRefused.Load() {
		if handled, err := r.commitOnConn(ctx, b, l, fn, release); handled {
			return err
		}
	}
	committing := false
	var saveErr error
	err := r.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Releasing first locks the row and checks the token just as the
		// locking read does, in one statement instead of two; until the
		// commit, others still see the lease as held.
		lock := r.lockOwn
		if release {
			lock = func(tx *gorm.DB, l Lease) error {
				err := r.release(ctx, tx, l)
				if errors.Is(err, ErrLeaseLost) {
					return ErrLeaseLost // as lockOwn says it
				}
				return err
			}
		}
		if err := lock(tx, l); err != nil {
			return err
		}
		if err := fn(saverSession(ctx, tx, tx.Statement.ConnPool)); err != nil {
			saveErr = saveFailed(l, err)
			return saveErr
		}
		committing = true // gorm sends COMMIT next
		return nil
	}, r.dialect.fenceTxOptions())
	switch {
	case err == nil:
		return nil
	case err == saveErr:
		return err // it says which step failed
	case committing && !answeredByServer(err):
		// COMMIT was sent, or about to be, and no answer came back.
		return &commitUnknownError{targetID: l.TargetID, cause: err}
	}
	return wrapf(err, "commit %q", l.TargetID)
}

// lockOwn locks l's row for the rest of tx and checks that it is still l's.
func (r *Repository) lockOwn(tx *gorm.DB, l Lease) error {
	var rows []JobLease
	res := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
		Select("lease_token", "released_at").
		Where("target_id = ?", l.TargetID).
		Limit(1).Find(&rows)
	if res.Error != nil {
		return fmt.Errorf("lock lease row: %w", res.Error)
	}
	if len(rows) == 0 || rows[0].LeaseToken != l.Token || rows[0].ReleasedAt != nil {
		return ErrLeaseLost
	}
	return nil
}

// Release gives up l: the row is marked released, where both the target and
// the token match, so the target can be acquired at once. It never touches a
// lease that another holder acquired later: when l is no longer the caller's
// (taken over, or already released) nothing changes and Release returns an
// error wrapping ErrLeaseLost. Call it on a context that survives the
// caller's cancellation, such as context.WithoutCancel with a timeout.
// Serialization failures are handled as by Heartbeat.
func (r *Repository) Release(ctx context.Context, l Lease) error {
	if err := l.check(); err != nil {
		return err
	}
	return r.release(ctx, r.db, l)
}

func (r *Repository) release(ctx context.Context, db *gorm.DB, l Lease) error {
	n, err := r.updateOwnRow(ctx, db, l, r.releaseSQL)
	if err != nil {
		return wrapf(err, "release %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "release %q", l.TargetID)
	}
	return nil
}

// updateOwnRow runs stmt, r.renewSQL or r.releaseSQL, on l's row: it stamps the
// row with the database's time while l holds it under l's token, and
// returns the number of rows it changed. Outside a transaction the
// statement is retried after a serialization failure (see Repository.retry);
// inside one, the failure is the transaction's to handle.
//
// When every attempt failed so, another session kept changing (or, on
// MySQL, locking) the row meanwhile: a takeover, most likely. updateOwnRow
// then reads the row as last committed: when it no longer holds l (another
// token, or released), the lease is gone and it reports zero rows changed,
// which the step returns as ErrLeaseLost. When the row still holds l, the
// lease was not lost but not stamped either, and the error is returned: a
// heartbeat is tried again soon, and the lease timeout covers a release.
func (r *Repository) updateOwnRow(ctx context.Context, db *gorm.DB, l Lease, stmt string) (n int64, err error) {
	run := func(ctx context.Context) error {
		_, n, err = execSQL(ctx, db, stmt, l.TargetID, l.Token.String())
		return err
	}
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		return n, run(ctx)
	}
	err = r.retry(ctx, run)
	if isSerializationFailure(err) {
		row, found, getErr := r.Get(ctx, l.TargetID)
		if getErr == nil && (!found || row.LeaseToken != l.Token || row.ReleasedAt != nil) {
			return 0, nil
		}
		err = fmt.Errorf("the row still holds the lease, but concurrent steps on it kept conflicting with this one (%d attempts, the last: %w)",
			r.attempts, err)
	}
	return n, err
}

// Get returns the lease row of targetID, and false when the target has never
// been acquired. It is for inspection: the row may change right after.
func (r *Repository) Get(ctx context.Context, targetID string) (JobLease, bool, error) {
	if err := checkTargetID(targetID); err != nil {
		return JobLease{}, false, err
	}
	var rows []JobLease
	if err := r.db.WithContext(ctx).Where("target_id = ?", targetID).Limit(1).Find(&rows).Error; err != nil {
		return JobLease{}, false, wrapf(err, "get %q", targetID)
	}
	if len(rows) == 0 {
		return JobLease{}, false, nil
	}
	return rows[0], true, nil
}
