package gormlease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/heartbeat"
	"github.com/gormlease/gormlease/internal/wait"
)

// Repository runs the steps of the lease protocol, one method a step, for a
// caller that drives them itself; a Runner runs the same steps, and a few
// more (docs/design.md, section Layers), through one of its own. It is safe
// for concurrent use and holds no connection between calls; one that
// NewRepository returns runs no goroutine and needs no closing.
type Repository struct {
	db      *gorm.DB
	backend backend.Backend
	holder  string
	tables  tableNames
	// attempts is how often a statement is tried in all while it fails
	// with serialization failures (see retry).
	attempts int
	// beats renews the leases that Runs hold through this Repository.
	beats heartbeat.Set
	// waitKey says whose watches its waiters share (see newWaitKey).
	waitKey wait.Key
}

// NewRepository returns a Repository on db, a *gorm.DB from gorm.Open on a
// supported database, not inside a transaction. It writes nothing; create
// the tables with AutoMigrate. On SQLite it refuses a busy timeout under a
// second (docs/sqlite.md). It takes the RepositoryOptions.
func NewRepository(db *gorm.DB, opts ...RepositoryOption) (*Repository, error) {
	cfg, err := newConfig(options(opts))
	if err != nil {
		return nil, err
	}
	return newRepository(db, cfg)
}

// settingsCheckTimeout bounds the settings check of NewRepository, which
// takes no context.
const settingsCheckTimeout = 10 * time.Second

func newRepository(db *gorm.DB, cfg config) (*Repository, error) {
	holder, tables := cfg.holder, cfg.tables
	if db == nil {
		return nil, invalidf("db is nil")
	}
	if db.Statement != nil {
		if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
			return nil, invalidf("db is inside a transaction: pass the *gorm.DB that gorm.Open returned")
		}
	}
	b, err := backendFor(db, tables)
	if err != nil {
		return nil, err
	}
	// Each step is one statement or an explicit transaction: gorm's default
	// transaction around single writes would only add round trips.
	db = db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true})
	ctx, cancel := context.WithTimeout(context.Background(), settingsCheckTimeout)
	defer cancel()
	if err := checkSettings(ctx, b, db); err != nil {
		return nil, err
	}
	warnSettings(ctx, b, db, cfg.logger)
	r := &Repository{db: db, backend: b, holder: holder, tables: tables, attempts: cfg.attempts}
	r.waitKey = r.newWaitKey()
	r.beats.Renew = func(ctx context.Context, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
		return r.heartbeatMany(ctx, leases)
	}
	return r, nil
}

// Acquire takes the lease on targetID when no one holds it: there is no row
// for the target, the row was released, or its last heartbeat is older than
// the lease timeout that its holder recorded, on the database's clock. It
// records timeout in the row and returns the new Lease. When another
// holder's lease is live, or the target is paused, it returns a *HeldError
// or a *PausedError at once, without writing. While the database cannot be
// reached it tries again, sending no attempt later than
// DefaultOperationTimeout after its call, whatever ctx; an attempt whose
// answer was lost releases what it may have taken. docs/design.md, sections
// Lifecycle and Databases, gives its statements on each database.
func (r *Repository) Acquire(ctx context.Context, targetID string, timeout time.Duration) (Lease, error) {
	return r.acquire(ctx, targetID, timeout, backend.AnyGeneration)
}

// acquireCleanupTimeout bounds the release of a lease that an acquire may
// have taken without hearing so.
const acquireCleanupTimeout = 10 * time.Second

// acquireBound bounds the attempts of the Repository's own acquires
// (Acquire, AcquireSlot), whatever their context, as a Run's
// are bounded by its reconnect window, which is DefaultOperationTimeout
// unless set: a caller does not wait for ever on a database that is gone
// (see withAcquireBound).
const acquireBound = DefaultOperationTimeout

// acquire is Acquire, taking over only from generation from unless it is
// backend.AnyGeneration. When the statement fails without an answer from
// the database (a lost connection, a timeout), it may still have taken the
// lease, under a token that no one would know: the target would stay held
// until the lease timed out. So acquire then releases the lease by that
// token, on a context that survives ctx's cancellation. The token is this
// attempt's alone, so the release cannot touch another holder's lease. It
// is best effort: a statement still in flight after the release leaves the
// lease to time out. While the database cannot be reached (a failover, a
// switchover, a restart), the acquire is tried again, each time under a
// token of its own, until ctx ends or acquireBound has passed.
func (r *Repository) acquire(ctx context.Context, targetID string, timeout time.Duration, from int64) (Lease, error) {
	ctx, cancel, until := withAcquireBound(ctx)
	defer cancel()
	l, _, err := r.acquireEach(ctx, targetID, timeout, takeover{generation: from}, 0, until)
	return l, err
}

// withAcquireBound returns ctx for one of the Repository's own acquires,
// the function that releases it, and the time after which the acquire
// sends no attempt (acquireBound from now). When ctx has a deadline, it is
// returned as it is: the deadline bounds each statement as the caller
// chose. Otherwise it is bounded by acquireBound, so that a statement on a
// database that does not answer ends. A bound of the acquire's own on
// every call would cost each of its statements a watch of that context,
// in database/sql and in the driver.
func withAcquireBound(ctx context.Context) (context.Context, context.CancelFunc, time.Time) {
	until := time.Now().Add(acquireBound)
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}, until
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	return ctx, cancel, until
}

// acquireEach is acquire with each attempt bounded by attempt as well as
// ctx (0: by ctx alone), and no attempt sent after until (zero: while ctx
// lasts), and no bound of its own (see tryAcquire). With the
// lease it returns when the statement that took it was sent, from which
// its holder counts its trust.
func (r *Repository) acquireEach(ctx context.Context, targetID string, timeout time.Duration, from takeover,
	attempt time.Duration, until time.Time,
) (Lease, time.Time, error) {
	if err := checkTargetID(targetID); err != nil {
		return Lease{}, time.Time{}, err
	}
	if timeout <= 0 {
		return Lease{}, time.Time{}, invalidf("lease timeout must be > 0, got %v", timeout)
	}
	return tryAcquire(ctx, attempt, until, func(ctx context.Context, _ []sentAcquire) (Lease, sentAcquire, error) {
		return r.acquireOnce(ctx, targetID, timeout, from)
	}, func(ctx context.Context, unanswered []sentAcquire) (Lease, time.Time, bool) {
		return r.adopt(ctx, targetID, unanswered)
	})
}

// tryAcquire runs once, an attempt of an acquire under a token of its own
// (given the attempts so far that failed without an answer), each bounded
// by attempt as well as ctx (0: by ctx alone), and runs it again, after a
// pause, while an attempt fails because the database cannot be reached
// (backend.Unreachable), until ctx ends or until has passed (zero: while
// ctx lasts); any other outcome it returns at once. When an attempt is
// refused after an earlier one failed without an answer, the earlier one
// may be what holds the target: its statement took
// the lease, and the answer was lost. The lease is then the caller's, under
// that attempt's token, which no one else knows, and adopt finds it;
// tryAcquire returns it rather than the refusal. With the lease it returns
// when the attempt that took it sent its statement.
func tryAcquire(ctx context.Context, attempt time.Duration, until time.Time,
	once func(ctx context.Context, unanswered []sentAcquire) (Lease, sentAcquire, error),
	adopt func(ctx context.Context, unanswered []sentAcquire) (Lease, time.Time, bool),
) (Lease, time.Time, error) {
	wait := backend.ReconnectBackoff()
	var unanswered []sentAcquire
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if attempt > 0 {
			actx, cancel = context.WithTimeout(ctx, attempt)
		}
		l, a, err := once(actx, unanswered)
		cancel()
		if errors.Is(err, ErrLeaseHeld) && len(unanswered) > 0 {
			if l, sent, ok := adopt(ctx, unanswered); ok {
				return l, sent, nil
			}
		}
		if a.unreachable {
			unanswered = append(unanswered, a)
		}
		if !a.unreachable || !pause(ctx, &wait, until) {
			return l, a.sent, err
		}
	}
}

// pause waits for wait's next pause, and reports whether it ended before
// ctx did and before until (zero: no such bound).
func pause(ctx context.Context, wait *backend.Backoff, until time.Time) bool {
	if until.IsZero() {
		return wait.Wait(ctx)
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return wait.Wait(ctx)
}

// sentAcquire is one attempt of an acquire, as tryAcquire remembers it.
type sentAcquire struct {
	token uuid.UUID
	// sent is a time before the attempt's statements that could take the
	// lease were sent (just before the backend's acquire, which may send
	// a few): the database stamps the lease after it, so the caller's trust
	// and a minimum hold counted from it end early, never late.
	sent time.Time
	// unreachable reports that its statement failed because the database
	// could not be reached: it may have taken the lease.
	unreachable bool
}

// adopt returns the lease on targetID that one of the attempts in
// unanswered took without hearing so, with when that attempt was sent, and
// reports whether one had: the row holds that attempt's token, unreleased.
func (r *Repository) adopt(ctx context.Context, targetID string, unanswered []sentAcquire) (Lease, time.Time, bool) {
	row, found, err := r.backend.Get(ctx, r.db, targetID)
	if err != nil || !found {
		return Lease{}, time.Time{}, false
	}
	a, ok := adopted(row, unanswered)
	if !ok {
		return Lease{}, time.Time{}, false
	}
	return Lease{TargetID: targetID, Token: row.LeaseToken, Generation: row.Generation}, a.sent, true
}

// adoptSlot is adopt for an acquire of one of targetID's n slots: the
// lease is the slot's whose row holds one of the attempts' tokens. It
// returns the error of its read of the slots when that failed.
func (r *Repository) adoptSlot(ctx context.Context, targetID string, n int, unanswered []sentAcquire) (Lease, sentAcquire, bool, error) {
	if len(unanswered) == 0 {
		return Lease{}, sentAcquire{}, false, nil
	}
	rows, err := r.backend.List(ctx, r.db, backend.ListQuery{Prefix: targetID + backend.SlotSeparator, Limit: MaxSlots})
	if err != nil {
		return Lease{}, sentAcquire{}, false, wrapf(err, "acquire %q: read the slots", targetID)
	}
	for _, row := range rows {
		target, slot, ok := backend.ParseSlotKey(row.Row.TargetID)
		if !ok || target != targetID || slot > n {
			continue
		}
		if a, ok := adopted(row.Row, unanswered); ok {
			return Lease{TargetID: targetID, Token: row.Row.LeaseToken, Generation: row.Row.Generation, Slot: slot}, a, true, nil
		}
	}
	return Lease{}, sentAcquire{}, false, nil
}

// adopted returns the attempt of unanswered whose lease row holds,
// unreleased, and reports whether there is one.
func adopted(row backend.Row, unanswered []sentAcquire) (sentAcquire, bool) {
	if row.ReleasedAt != nil {
		return sentAcquire{}, false
	}
	for _, a := range unanswered {
		if row.LeaseToken == a.token {
			return a, true
		}
	}
	return sentAcquire{}, false
}

// acquireOnce is one attempt of acquire, under a token of its own, which it
// reports with whether its statement failed because the database could not
// be reached.
func (r *Repository) acquireOnce(ctx context.Context, targetID string, timeout time.Duration, from takeover) (Lease, sentAcquire, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return Lease{}, sentAcquire{}, wrapf(err, "acquire %q: mint token", targetID)
	}
	a := sentAcquire{token: token}
	var got backend.Acquired
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		a.sent = time.Now()
		got, err = r.backend.Acquire(ctx, r.db, backend.AcquireArgs{
			TargetID: targetID, Token: token, Holder: r.holder, Timeout: timeout,
			From: from.generation, FromExpired: from.expired,
		})
		return err
	})
	switch {
	case err != nil:
		a.unreachable = backend.Unreachable(err) && !backend.IsSerializationFailure(err)
		return Lease{}, a, r.acquireFailed(ctx, targetID, err, token, targetID)
	case got.Paused:
		return Lease{}, a, &PausedError{Target: targetID, Reason: got.PauseReason}
	case got.Held != nil:
		return Lease{}, a, newHeldError(targetID, got.Held)
	case !got.Taken:
		return Lease{}, a, wrapf(ErrLeaseHeld, "acquire %q", targetID)
	}
	return Lease{TargetID: targetID, Token: token, Generation: got.Generation}, a, nil
}

// acquireFailed returns the error of an acquire of targetID whose statement
// failed with err, having first released, by token, the rows of keys that
// it may have taken without hearing so.
func (r *Repository) acquireFailed(ctx context.Context, targetID string, err error, token uuid.UUID, keys ...string) error {
	if backend.IsSerializationFailure(err) {
		// Every attempt was rolled back, having changed nothing, because
		// another session changed the target's row (or, on MySQL, locked
		// it) at the same time: another acquire taking it, or the holder's
		// heartbeat, release or fenced commit. For the caller this is a
		// lease held: the work must not run now, and a later Run may.
		return wrapf(fmt.Errorf("%w: concurrent steps on the target kept conflicting with the acquire (%d attempts, the last: %w)",
			ErrLeaseHeld, r.attempts, err), "acquire %q", targetID)
	}
	if !backend.AnsweredByServer(err) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), acquireCleanupTimeout)
		for _, key := range keys {
			_, _ = r.updateOwn(cctx, backend.Release, backend.Lease{TargetID: key, Token: token})
		}
		cancel()
	}
	return wrapf(err, "acquire %q", targetID)
}

// slotAttempts bounds how often AcquireSlot sends its statement while the
// slots it saw free were taken (or locked, by a SetSlots) by others first,
// or while it made the target's slot rows; it pauses between attempts as
// after a serialization failure.
const slotAttempts = 10

// AcquireSlot takes one of the n slots of targetID, a semaphore (see
// WithSlots): a lease of its own, on a row of its own, whose Lease.Slot says
// which. It takes a free slot at random; when all n are held it writes
// nothing and returns an error wrapping the *HeldError of the slot that
// frees first, and when a slot is held under another count, one wrapping
// ErrSlotCountConflict. n is from 1 to MaxSlots, and targetID at most 255
// bytes with the slot's key (len(targetID) + 1 + the digits of n). While
// the database cannot be reached it tries again as Acquire does, taking as
// its own a slot that an attempt whose answer was lost took.
func (r *Repository) AcquireSlot(ctx context.Context, targetID string, n int, timeout time.Duration) (Lease, error) {
	ctx, cancel, until := withAcquireBound(ctx)
	defer cancel()
	l, _, err := r.acquireSlotEach(ctx, targetID, n, timeout, 0, until)
	return l, err
}

// acquireSlotEach is AcquireSlot with each attempt bounded by attempt as
// well as ctx (0: by ctx alone), no attempt sent after until (zero: while
// ctx lasts), and no bound of its own (see tryAcquire).
func (r *Repository) acquireSlotEach(ctx context.Context, targetID string, n int, timeout, attempt time.Duration,
	until time.Time,
) (Lease, time.Time, error) {
	if err := checkTargetID(targetID); err != nil {
		return Lease{}, time.Time{}, err
	}
	switch key := backend.SlotKey(targetID, n); {
	case n < 1 || n > MaxSlots:
		return Lease{}, time.Time{}, invalidf("acquire %q: slot count must be between 1 and %d, got %d", targetID, MaxSlots, n)
	case len(key) > maxTargetIDLength:
		return Lease{}, time.Time{}, invalidf("acquire %q: the key of its slot %d is %d bytes long, more than the %d the column holds",
			truncateUTF8(targetID, 40), n, len(key), maxTargetIDLength)
	case timeout <= 0:
		return Lease{}, time.Time{}, invalidf("lease timeout must be > 0, got %v", timeout)
	}
	return tryAcquire(ctx, attempt, until, func(ctx context.Context, unanswered []sentAcquire) (Lease, sentAcquire, error) {
		// A slot that an earlier attempt took without hearing so is the
		// caller's: with other slots free, a new attempt would take a
		// second one and leave that one held until it timed out.
		// When the slots cannot be read, no new attempt is sent either:
		// one sent the moment the database is back would take a second
		// slot before the first could be found.
		if l, a, ok, err := r.adoptSlot(ctx, targetID, n, unanswered); ok || err != nil {
			a.unreachable = err != nil && backend.Unreachable(err)
			return l, a, err
		}
		var a sentAcquire
		l, err := r.acquireSlotOnce(ctx, targetID, n, timeout, &a)
		return l, a, err
	}, func(ctx context.Context, unanswered []sentAcquire) (Lease, time.Time, bool) {
		l, a, ok, _ := r.adoptSlot(ctx, targetID, n, unanswered)
		return l, a.sent, ok
	})
}

// acquireSlotOnce is one attempt of AcquireSlot, under a token of its own,
// which it records in sent with whether it failed because the database
// could not be reached.
func (r *Repository) acquireSlotOnce(ctx context.Context, targetID string, n int, timeout time.Duration, sent *sentAcquire) (Lease, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return Lease{}, wrapf(err, "acquire %q: mint token", targetID)
	}
	sent.token = token
	a := backend.SlotArgs{TargetID: targetID, Slots: n, Token: token, Holder: r.holder, Timeout: timeout}
	pause := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		var slot int
		var gen int64
		var ok bool
		sent.sent = time.Now()
		err := r.retry(ctx, func(ctx context.Context) (err error) {
			slot, gen, ok, err = r.backend.AcquireSlot(ctx, r.db, a)
			return err
		})
		switch {
		case err != nil:
			sent.unreachable = backend.Unreachable(err) && !backend.IsSerializationFailure(err)
			return Lease{}, r.acquireFailed(ctx, targetID, err, token, backend.SlotKeys(targetID, n)...)
		case ok:
			return Lease{TargetID: targetID, Token: token, Generation: gen, Slot: slot}, nil
		}
		again, first, err := r.slotsRefused(ctx, targetID, n)
		if err != nil {
			sent.unreachable = backend.Unreachable(err)
			return Lease{}, wrapf(err, "acquire %q", targetID)
		}
		switch {
		case !again && first != nil:
			return Lease{}, wrapf(newHeldError(targetID, first), "acquire %q: all %d slots are held, the first to free", targetID, n)
		case !again:
			return Lease{}, wrapf(fmt.Errorf("%w: all %d slots are held", ErrLeaseHeld, n), "acquire %q", targetID)
		case attempt >= slotAttempts || !pause.Wait(ctx):
			return Lease{}, wrapf(fmt.Errorf("%w: concurrent acquires took the slots seen free first (%d attempts)", ErrLeaseHeld, attempt),
				"acquire %q", targetID)
		}
	}
}

// slotsRefused finds out why an acquire of one of targetID's n slots took
// none, and reports whether to try again: when a slot shows free (another
// acquire took the one this one wanted, or a holder released since), or
// when the rows did not all exist under count n and SetSlots has made them
// so, or kept failing against other acquires making them at once. All n held under n is ErrLeaseHeld's case: again is false, and first
// is the slot whose lease the read finds ending first. A slot held under
// another count is ErrSlotCountConflict. It only reads, but for SetSlots,
// which runs only when the rows of 1..n are not all there under count n,
// and no slot is seen held under another count.
func (r *Repository) slotsRefused(ctx context.Context, targetID string, n int) (again bool, first *backend.Held, err error) {
	rows, err := r.backend.SlotRows(ctx, r.db, targetID, n)
	if err != nil {
		return false, nil, fmt.Errorf("read the slots: %w", err)
	}
	ready := len(rows) == n
	for _, row := range rows {
		switch {
		case row.Paused:
			return false, nil, &PausedError{Target: targetID, Reason: row.PauseReason}
		case row.Live && row.Slots != n:
			return false, nil, slotConflict(n, row.Slots)
		case row.Slots != n:
			ready = false
		case !row.Live:
			again = true
		default:
			if h := backend.NewHeld(row.Holder, row.Generation, row.Timeout, row.Age).Since(row.HeldFor, row.MinHold); first == nil || h.ExpiresIn < first.ExpiresIn {
				first = h
			}
		}
	}
	if ready {
		return again, first, nil
	}
	// A slot held under another count may be one beyond n: look at all
	// of them, without locking, before SetSlots locks them.
	if rows, err = r.backend.SlotRows(ctx, r.db, targetID, MaxSlots); err != nil {
		return false, nil, fmt.Errorf("read the slots: %w", err)
	}
	ready = true
	have := 0
	for _, row := range rows {
		switch {
		case row.Paused:
			return false, nil, &PausedError{Target: targetID, Reason: row.PauseReason}
		case row.Live && row.Slots != n:
			return false, nil, slotConflict(n, row.Slots)
		case row.Slots != n:
			ready = false
		case row.Slot <= n:
			have++
		}
	}
	if ready && have == n {
		return true, nil, nil // another acquire made them meanwhile
	}
	var conflict int
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		conflict, err = r.backend.SetSlots(ctx, r.db, targetID, n)
		return err
	})
	switch {
	case err != nil && backend.IsSerializationFailure(err):
		// Other acquires were making the same rows (on Galera, through
		// other nodes, whose writes fail certification against each
		// other's): the next attempt reads what they made.
		return true, nil, nil
	case err != nil:
		return false, nil, fmt.Errorf("make the slot rows: %w", err)
	case conflict != 0:
		return false, nil, slotConflict(n, conflict)
	}
	return true, nil, nil
}

// slotConflict is the error of an acquire under count n of slots that are
// held under count held.
func slotConflict(n, held int) error {
	return fmt.Errorf("%w: the target's slots are held under a count of %d, this acquire's count is %d; give every Runner of the target the same WithSlots",
		ErrSlotCountConflict, held, n)
}

// Heartbeat renews l, stamping its row with the database's time. When the
// row no longer carries l's token (taken over, or released), it returns an
// error wrapping ErrLeaseLost: stop the work. When concurrent changes of the
// row kept failing it (WithStatementAttempts) while the row still holds l,
// the error says so: l was not renewed, nor lost.
func (r *Repository) Heartbeat(ctx context.Context, l Lease) error {
	if err := l.check(); err != nil {
		return err
	}
	n, err := r.updateOwn(ctx, backend.Renew, l.row())
	if err != nil {
		return wrapf(err, "heartbeat %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "heartbeat %q", l.TargetID)
	}
	return nil
}

// heartbeatMany renews every lease in leases, as Heartbeat does each one,
// in batches of up to backend.MaxBatch leases: one statement per batch on
// PostgreSQL and SQLite, two on MySQL. It returns the leases that were not
// renewed because they are no longer the caller's (taken over or
// released), and those renewed whose holder an operator asked to stop
// (Ended.Stop). An error means the outcome of some leases is unknown:
// nothing is reported ended then, but some leases may have been renewed.
func (r *Repository) heartbeatMany(ctx context.Context, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
	var lost map[backend.Lease]backend.Ended // nil while none ended: a heartbeat round allocates none
	for len(leases) > 0 {
		chunk := leases[:min(len(leases), backend.MaxBatch)]
		leases = leases[len(chunk):]
		var gone map[backend.Lease]backend.Ended
		err := r.retry(ctx, func(ctx context.Context) (err error) {
			gone, err = r.backend.HeartbeatBatch(ctx, r.db, chunk)
			return err
		})
		if err != nil {
			return nil, wrapf(err, "heartbeat %d leases", len(chunk))
		}
		if lost == nil {
			lost = gone // the backend's own, or nil
			continue
		}
		for l, e := range gone {
			lost[l] = e
		}
	}
	return lost, nil
}

// CommitIfOwner runs fn in a transaction that first locks l's row and
// checks that it still carries l's token, unreleased: when it does not, fn
// is not called, nothing is written, and the error wraps ErrLeaseLost. On
// one server, a takeover waits for the transaction to end. After fn, the
// row records l's generation as saved, in the same transaction (READ
// COMMITTED; serializable on SQLite). fn must use tx, not keep it, and not
// commit or roll it back (it may nest transactions on it); an error of fn
// rolls the transaction back and comes back in a *WorkError. tx's context
// carries l, so SaveJSON works as fn. While the database cannot be
// reached, the lock is tried again until ctx ends. When ctx ends before
// COMMIT, nothing is saved and the error wraps its cause; when COMMIT gets
// no answer, the error wraps ErrCommitUnknown. On Galera, fn may run again
// after a certification failure; only the last run's writes are saved
// (docs/scaling.md).
func (r *Repository) CommitIfOwner(ctx context.Context, l Lease, fn func(tx *gorm.DB) error) error {
	return r.commit(ctx, l, fn, false)
}

// commitAndRelease is CommitIfOwner that also releases l, in the same
// transaction: the save and the release are one durable write, and the
// lock is the release statement itself, which locks the row and checks
// the token in one. It is Run's fenced commit. After it, the target can be
// acquired at once, and waiters see the generation saved. On an error
// other than ErrCommitUnknown, nothing was saved or released.
func (r *Repository) commitAndRelease(ctx context.Context, l Lease, fn func(tx *gorm.DB) error) error {
	return r.commit(ctx, l, fn, true)
}

// Release gives up l, so the target can be acquired at once. When l is no
// longer the caller's (taken over, or already released) nothing changes and
// Release returns an error wrapping ErrLeaseLost. Call it on a context that
// survives the caller's cancellation, such as context.WithoutCancel with a
// timeout.
func (r *Repository) Release(ctx context.Context, l Lease) error {
	return r.release(ctx, l, backend.Release)
}

// releaseFailed is Release for a job that failed with cause: the row also
// keeps the start of cause's message, up to 255 bytes, until the next
// acquisition, for the callers of Runner.Do that waited for the job, which
// get it as their SharedJobError's Message, in this process or another;
// and end, how the generation ended (backend.EndFailed, ...), as its
// end_cause.
func (r *Repository) releaseFailed(ctx context.Context, l Lease, end string, cause error) error {
	if cause == nil {
		return invalidf("release %q: the failure is nil", l.TargetID)
	}
	return r.release(ctx, l, backend.ReleaseFailed, failureText(cause), end)
}

// release releases l with op, Release or ReleaseFailed, whose own
// arguments are args.
func (r *Repository) release(ctx context.Context, l Lease, op backend.Own, args ...any) error {
	if err := l.check(); err != nil {
		return err
	}
	n, err := r.updateOwn(ctx, op, l.row(), args...)
	if err != nil {
		return wrapf(err, "release %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "release %q", l.TargetID)
	}
	return nil
}

// Hold keeps l held, without renewing it, until d from now on the
// database's clock: acquires are refused until then, as ShedLock's
// lockAtLeastFor does for a job that ended early (see WithMinHold). Once
// passed, the hold reads as released, not expired. d must be greater than
// zero. When l is no longer the caller's, Hold changes nothing and returns
// an error wrapping ErrLeaseLost.
//
// The hold ends l's generation in its history (WithHistory): the row
// records "saved" as its end cause when the generation saved a result,
// "released" otherwise.
func (r *Repository) Hold(ctx context.Context, l Lease, d time.Duration) error {
	return r.hold(ctx, l, d, nil, nil)
}

// hold is Hold, recording end as the end cause (nil: as Hold does) and
// failure as the row's failure (nil for none).
func (r *Repository) hold(ctx context.Context, l Lease, d time.Duration, end, failure *string) error {
	if err := l.check(); err != nil {
		return err
	}
	if d <= 0 {
		return invalidf("hold %q: duration must be > 0, got %v", l.TargetID, d)
	}
	n, err := r.updateOwn(ctx, backend.HoldFor, l.row(), backend.TimeoutMillis(d), nullText(end), nullText(failure))
	if err != nil {
		return wrapf(err, "hold %q", l.TargetID)
	}
	if n == 0 {
		return wrapf(ErrLeaseLost, "hold %q", l.TargetID)
	}
	return nil
}

// nullText is s as a statement's argument: NULL when nil.
func nullText(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// updateOwn runs op on l's own row and returns the number of rows it
// changed. The statement is retried after a serialization failure (see
// retry). When every attempt failed so, another session kept changing (or,
// on MySQL, locking) the row meanwhile: a takeover, most likely. updateOwn
// then reads the row: when it no longer holds l (another token, or
// released), the lease is gone and it reports zero rows changed, which the
// step returns as ErrLeaseLost. When the row still holds l, the lease was
// not lost but not stamped either, and the error is returned: a heartbeat
// is tried again soon, and the lease timeout covers a release.
func (r *Repository) updateOwn(ctx context.Context, op backend.Own, l backend.Lease, args ...any) (n int64, err error) {
	err = r.retry(ctx, func(ctx context.Context) error {
		n, err = r.backend.UpdateOwn(ctx, r.db, op, l, args...)
		return err
	})
	if backend.IsSerializationFailure(err) {
		row, found, getErr := r.backend.Get(ctx, r.db, l.TargetID)
		if getErr == nil && !(found && row.Holds(l)) {
			return 0, nil
		}
		err = fmt.Errorf("the row still holds the lease, but concurrent steps on it kept conflicting with this one (%d attempts, the last: %w)",
			r.attempts, err)
	}
	return n, err
}

// retry runs stmt, one statement in a transaction of its own, again after a
// serialization failure, up to r.attempts times in all (see backend.Retry).
func (r *Repository) retry(ctx context.Context, stmt func(ctx context.Context) error) error {
	return backend.Retry(ctx, r.attempts, stmt)
}

// readSaved reads what a fenced commit of l whose COMMIT got no answer left
// in l's row, in a read that the database confirms as it confirms commits
// (see backend.Backend.ReadSaved): the step by which Run settles such a
// commit. found is false when the row is gone.
func (r *Repository) readSaved(ctx context.Context, l Lease) (saved backend.Saved, found bool, err error) {
	return r.backend.ReadSaved(ctx, r.db, l.row().TargetID)
}

// CheckTables is a startup check that the tables exist: it reads, in one
// statement that reads no row, every column that gormlease uses of the
// lease table, its generation floor and the result table (WithTableNames).
// It returns nil when they all exist, and otherwise, after one more such
// statement per table and per column to find them, an error that wraps
// ErrMissingTables and names every table and column missing: create them
// with AutoMigrate, or run `gormlease migrate`. It writes nothing. Other
// errors (a database out of reach) are returned as they are, without
// retrying.
func (r *Repository) CheckTables(ctx context.Context) error {
	if err := r.backend.CheckTables(ctx, r.db); err != nil {
		return wrapf(err, "check tables")
	}
	return nil
}

// Tables returns the names of the tables the Repository works on: the
// lease table and the result table (see WithTableNames).
func (r *Repository) Tables() (lease, result string) { return r.tables.lease, r.tables.result }
