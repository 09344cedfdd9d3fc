package gormlease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
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

// heldIn reports whether row holds l: it carries l's token, unreleased.
func (l Lease) heldIn(row JobLease) bool { return row.LeaseToken == l.Token && row.ReleasedAt == nil }

// Repository runs the steps of the lease protocol, one method a step, each
// one or two statements on the database. Runner composes them; use the
// Repository directly to drive the steps yourself. A Repository is safe for
// concurrent use and holds no connection between calls.
type Repository struct {
	db      *gorm.DB
	dialect dialect
	holder  string
	tables  tableNames
	// The statements on the caller's own row, in the dialect's
	// placeholders: renew, release, release with a failure, save (the
	// fenced commit's lock in CommitIfOwner) and save with the release (in
	// Run). See ownRowSQL.
	renewSQL, releaseSQL, failSQL, saveSQL, saveReleaseSQL string
	getSQL                                                 string // Get's
	// oneTripRefused is set once the driver refused to begin the fenced
	// transaction and lock the row in one query (see lockingBeginner).
	oneTripRefused atomic.Bool
	// bytewise is, on PostgreSQL, 1 once List found that target_id orders
	// byte for byte, -1 once it found not, 0 before it looked.
	bytewise atomic.Int32
	// attempts is how often a statement is tried after serialization
	// failures: statementAttempts, but in tests.
	attempts int
	// galera says whether the database is a MariaDB Galera node: one of
	// the galera* constants (see onGalera).
	galera atomic.Int32
	// beats are the heartbeat groups of the leases that Runs hold through
	// this Repository.
	beats beats
}

// NewRepository returns a Repository on db, which must be a *gorm.DB from
// gorm.Open on a supported database, not inside a transaction. It writes
// nothing to the database; create the tables with AutoMigrate. On SQLite it
// reads the connection's busy timeout, and refuses one under a second, which
// would make concurrent steps fail with "database is locked": set it in the
// DSN, before any other PRAGMA, as _pragma=busy_timeout(10000).
// It takes WithTableNames and WithHolder, the RepositoryOptions; the other
// options only a Runner uses.
func NewRepository(db *gorm.DB, opts ...RepositoryOption) (*Repository, error) {
	cfg, err := newConfig(options(opts))
	if err != nil {
		return nil, err
	}
	return newRepository(db, cfg.holder, cfg.tables)
}

func newRepository(db *gorm.DB, holder string, tables tableNames) (*Repository, error) {
	if db == nil {
		return nil, invalidf("db is nil")
	}
	if db.Statement != nil {
		if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
			return nil, invalidf("db is inside a transaction: pass the *gorm.DB that gorm.Open returned")
		}
	}
	d, err := dialectFor(db, tables)
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
	r := &Repository{db: db, dialect: d, holder: holder, tables: tables, attempts: statementAttempts}
	now, notify := d.now(), d.notifyWaiters()
	r.renewSQL = r.ownRowSQL("updated_at = "+now, "")
	r.releaseSQL = r.ownRowSQL("released_at = "+now, notify)
	r.failSQL = r.ownRowSQL("released_at = "+now+", failure = ?", notify)
	r.saveSQL = r.ownRowSQL("saved_generation = generation, saved_at = "+now, notify)
	r.getSQL = d.rebind(tables.expand(getSQL))
	r.saveReleaseSQL = r.ownRowSQL("released_at = "+now+", saved_generation = generation, saved_at = "+now, notify)
	return r, nil
}

// ownRowSQL returns the statement that sets set on the caller's own row:
// where the target and the token match and the lease is not released. Its
// arguments are those of set, then the target and the token. Every such
// statement locks the row and checks the token in one: its rows affected
// is 1 exactly when the lease is still the caller's.
func (r *Repository) ownRowSQL(set, suffix string) string {
	return r.dialect.rebind("UPDATE " + r.tables.lease + " SET " + set +
		" WHERE target_id = ? AND lease_token = ? AND released_at IS NULL" + suffix)
}

// Acquire takes the lease on targetID in one statement (on MySQL, two for a
// target never acquired before), when no one holds it: there is no row for
// the target, the row was released, or its last heartbeat is older than
// the lease timeout that its holder recorded in it, on the database's clock
// (for a row that records none, written before the column existed, timeout
// is used). It records timeout in the row, for whoever looks at the new
// lease next, mints a fresh token and returns the new Lease. When another holder's lease is live it returns an error
// wrapping ErrLeaseHeld, at once and without writing. (On MySQL, InnoDB
// locks the row before it checks it, so while the holder's fenced commit
// runs, a refused acquire waits for that commit to end.) When the
// connection fails before the answer comes back, Acquire returns the error
// after releasing, by its new token, the lease that the statement may have
// taken, so that the target is not left held until the timeout.
func (r *Repository) Acquire(ctx context.Context, targetID string, timeout time.Duration) (Lease, error) {
	return r.acquire(ctx, targetID, timeout, DefaultOperationTimeout, anyGeneration)
}

// acquire is Acquire. When the statement fails without an answer from the
// database (a lost connection, a timeout), it may still have taken the
// lease, under a token that no one would know: the target would stay held
// until the lease timed out. So acquire then releases the lease by that
// token, on a context that survives ctx's cancellation, bounded by cleanup.
// The token is this attempt's alone, so the release cannot touch another
// holder's lease. It is best effort: a statement still in flight after the
// release leaves the lease to time out.
func (r *Repository) acquire(ctx context.Context, targetID string, timeout, cleanup time.Duration, from int64) (Lease, error) {
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
	send := func(ctx context.Context) (err error) {
		gen, ok, err = r.dialect.acquire(ctx, r.db, acquireArgs{
			targetID: targetID, token: token, holder: r.holder, timeout: timeout, from: from,
		})
		return err
	}
	err = r.retry(ctx, send)
	b := statementBackoff()
	for attempt := 1; err == nil && !ok && r.rowLagged(ctx, targetID, released, attempt, &b); attempt++ {
		err = r.retry(ctx, send)
	}
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
// batches of up to 1,000 leases: one statement per batch on PostgreSQL and
// SQLite, two on MySQL. It returns the leases that were
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
	if len(lost) > 0 && r.onGalera(ctx) {
		// The node may only have been behind (see ownRowLagged), which
		// Heartbeat checks, lease by lease.
		for l := range lost {
			switch err := r.Heartbeat(ctx, l); {
			case err == nil:
				delete(lost, l)
			case !errors.Is(err, ErrLeaseLost):
				return nil, err
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
func (r *Repository) commit(ctx context.Context, l Lease, fn func(tx *gorm.DB) error, release bool) (err error) {
	if err := l.check(); err != nil {
		return err
	}
	if fn == nil {
		return invalidf("commit function is nil")
	}
	ctx = withLease(ctx, l, r.tables)
	lockSQL := r.saveSQL
	if release {
		lockSQL = r.saveReleaseSQL
	}
	defer func() {
		if err == nil {
			wakeWaiters(r, l.TargetID)
		}
	}()
	b := statementBackoff()
	for attempt := 1; ; attempt++ {
		attemptCtx := ctx
		if r.galera.Load() == galeraYes {
			// A certification failure is retried or turned into
			// ErrLeaseLost here: not a fault for the logger.
			attemptCtx = context.WithValue(ctx, retriedKey{}, true)
		}
		err = r.commitOnce(attemptCtx, l, fn, lockSQL)
		if err == nil {
			return nil
		}
		again, failed := r.commitAgain(ctx, l, err, attempt, &b)
		if !again {
			return failed
		}
	}
}

// commitOnce is one attempt of the fenced commit, in one transaction.
func (r *Repository) commitOnce(ctx context.Context, l Lease, fn func(tx *gorm.DB) error, lockSQL string) error {
	if b, ok := r.dialect.(lockingBeginner); ok && !r.oneTripRefused.Load() {
		if handled, err := r.commitOnConn(ctx, b, l, fn, lockSQL); handled {
			return err
		}
	}
	committing := false
	var saveErr error
	err := r.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Recording the save first locks the row and checks the token, in
		// one statement; until the commit, others still see the lease as
		// held, and the save as not made.
		switch n, err := r.updateOwnRow(ctx, tx, l, lockSQL); {
		case err != nil:
			return fmt.Errorf("lock lease row: %w", err)
		case n == 0:
			return errLockedNothing
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
	return r.releaseAs(ctx, db, l, r.releaseSQL)
}

// releaseFailed releases l after its job failed with cause, and records the
// failure in the row, for those who wait for the job (see Runner.Do).
func (r *Repository) releaseFailed(ctx context.Context, l Lease, cause error) error {
	return r.releaseAs(ctx, r.db, l, r.failSQL, failureText(cause))
}

// releaseAs releases l with stmt, r.releaseSQL or r.failSQL, whose own
// arguments are args, and then wakes the waiters of this process.
func (r *Repository) releaseAs(ctx context.Context, db *gorm.DB, l Lease, stmt string, args ...any) error {
	n, err := r.updateOwnRow(ctx, db, l, stmt, args...)
	if err != nil {
		return wrapf(err, "release %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "release %q", l.TargetID)
	}
	wakeWaiters(r, l.TargetID)
	return nil
}

// updateOwnRow runs stmt, one of r's statements on the caller's own row
// (see ownRowSQL), with args and then l's target and token, and returns the
// number of rows it changed. Outside a transaction the statement is retried
// after a serialization failure (see Repository.retry), and, on a Galera
// node, sent again when it changed nothing only because the node had not
// yet applied l (see ownRowLagged); inside one, both are the transaction's
// to handle.
//
// When every attempt failed so, another session kept changing (or, on
// MySQL, locking) the row meanwhile: a takeover, most likely. updateOwnRow
// then reads the row as last committed: when it no longer holds l (another
// token, or released), the lease is gone and it reports zero rows changed,
// which the step returns as ErrLeaseLost. When the row still holds l, the
// lease was not lost but not stamped either, and the error is returned: a
// heartbeat is tried again soon, and the lease timeout covers a release.
func (r *Repository) updateOwnRow(ctx context.Context, db *gorm.DB, l Lease, stmt string, args ...any) (n int64, err error) {
	args = append(args, l.TargetID, l.Token.String())
	run := func(ctx context.Context) error {
		_, n, err = execSQL(ctx, db, stmt, args...)
		return err
	}
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		return n, run(ctx)
	}
	err = r.retry(ctx, run)
	b := statementBackoff()
	for attempt := 1; err == nil && n == 0; attempt++ {
		again, lagErr := r.ownRowLagged(ctx, l, attempt, &b)
		if !again {
			return 0, lagErr
		}
		err = r.retry(ctx, run)
	}
	if isSerializationFailure(err) {
		row, found, getErr := r.Get(ctx, l.TargetID)
		if getErr == nil && !(found && l.heldIn(row)) {
			return 0, nil
		}
		err = fmt.Errorf("the row still holds the lease, but concurrent steps on it kept conflicting with this one (%d attempts, the last: %w)",
			r.attempts, err)
	}
	return n, err
}

// leaseColumns are the columns of a lease row that Get, List and
// ForceRelease read, in the order of JobLease.columns.
const leaseColumns = "target_id, lease_token, generation, holder, updated_at, released_at," +
	" saved_generation, saved_at, failure, timeout_ms"

// columns returns where to scan leaseColumns into row.
func (row *JobLease) columns() []any {
	return []any{&row.TargetID, &row.LeaseToken, &row.Generation, &row.Holder, &row.UpdatedAt, &row.ReleasedAt,
		&row.SavedGeneration, &row.SavedAt, &row.Failure, &row.TimeoutMS}
}

// getSQL reads a lease row, in Get.
const getSQL = "SELECT " + leaseColumns + " FROM job_lease WHERE target_id = ?"

// Get returns the lease row of targetID, and false when the target has never
// been acquired. It is for inspection: the row may change right after. It
// reads the database that the Repository's *gorm.DB was opened on, as the
// lease's own statements do, never a replica that a read/write splitting
// plugin would send gorm's reads to: Run decides on what Get returns.
func (r *Repository) Get(ctx context.Context, targetID string) (JobLease, bool, error) {
	if err := checkTargetID(targetID); err != nil {
		return JobLease{}, false, err
	}
	var row JobLease
	found, err := queryRowSQL(ctx, r.db, r.causalRead(ctx, r.getSQL), []any{targetID}, row.columns()...)
	if err != nil {
		return JobLease{}, false, wrapf(err, "get %q", targetID)
	}
	return row, found, nil
}
