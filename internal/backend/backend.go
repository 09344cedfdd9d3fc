// Package backend is the seam between gormlease's lease steps and one
// database's SQL. Each supported database implements Backend, in a package
// of its own below this one (postgres, mysql, sqlite; galera wraps mysql),
// and nothing else in gormlease writes SQL about the lease rows. Each also
// implements TestKit, the statements of the test kit (package leasetest)
// alone, which Backend does not carry.
//
// The layers, from the top:
//
//	gormlease: Runner (Run, RunWait, Do)     runs, on top of the steps
//	gormlease: Repository                    the steps: acquire, heartbeat, fenced commit, release
//	internal/heartbeat, internal/wait        the goroutines: batched heartbeats, watches of waited-on rows
//	internal/backend                         this seam: types, statements, errors, retries
//	internal/backend/{postgres,mysql,...}    one database's SQL
//
// A layer imports only those below it. The types here (Lease, Row, State,
// Tables) are the seam's own, so that a backend needs nothing from the
// public API.
package backend

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// Backend is one database's SQL for the lease steps: exactly what the steps
// above it run. Every method takes the *gorm.DB to run on, which is the
// Repository's pool or, inside the fenced commit, its transaction. A
// refusal (a lease held, a row that no longer carries the caller's token) is
// an outcome, not an error. What a backend can do beyond the common steps
// is declared by Capabilities; the steps never find it out by a type
// assertion, and call a method that a capability governs only when the
// backend declares it. What the test kit alone does to a row is TestKit's.
type Backend interface {
	// Capabilities declares what the backend can do beyond the common steps.
	Capabilities() Capabilities

	// CheckSettings returns a *SettingsError that says what to change when
	// db's settings would make the steps fail later, before any step runs.
	// It writes nothing.
	CheckSettings(ctx context.Context, db *gorm.DB) error
	// SettingsWarnings returns the server's settings that weaken a
	// guarantee without making any step fail, for the Runner's logger at
	// Warn; none when the server could not be asked. It writes nothing.
	SettingsWarnings(ctx context.Context, db *gorm.DB) []SettingsWarning
	// Migrate creates the tables when they do not exist, and adds the
	// columns that a table made by an earlier version lacks. With history,
	// it also creates the event table (Tables.Event) and the triggers on
	// the lease table that write it; without, it leaves them as they are.
	Migrate(ctx context.Context, db *gorm.DB, history bool) error
	// CheckTables reads no row, but every column that the steps use, of
	// every table: nil when they all exist, a *MissingTablesError that
	// names each one missing otherwise. It writes nothing.
	CheckTables(ctx context.Context, db *gorm.DB) error

	// Acquire takes the lease on a.TargetID, in as few statements as the
	// database allows, when there is no row, the row is released, or its
	// last heartbeat is older than the timeout that its holder recorded (or
	// a.Timeout, in a row that records none) on the database's clock. It
	// records a.Timeout in the row and reports the new generation, and
	// whether the lease was taken. When it refuses, it reports the live
	// lease that refused it, read by the refusing statements themselves,
	// without a statement of its own where the database can return it.
	Acquire(ctx context.Context, db *gorm.DB, a AcquireArgs) (Acquired, error)
	// UpdateOwn runs op on l's own row: where the target and the token
	// match and the lease is not released. It returns the number of rows
	// changed, 1 exactly when the lease was still the caller's. args are
	// op's own: the failure's text for ReleaseFailed, the timeout in
	// milliseconds for HoldFor; none for the others. The ops that end a
	// generation or save its result notify the waiters in other processes
	// where the backend can (Capabilities.Notify).
	UpdateOwn(ctx context.Context, db *gorm.DB, op Own, l Lease, args ...any) (int64, error)
	// HeartbeatBatch renews leases (at most MaxBatch) as UpdateOwn(Renew)
	// does each, and returns those it did not renew (taken over or
	// released), and those it renewed whose holder an operator asked to
	// stop (RequestStop), with the request's reason, read by the same
	// statements. It returns an empty map, or nil, when it renewed them
	// all and none was asked to stop. A renewal that the server committed without the confirmation of its
	// synchronous standbys is an error wrapping ErrReplicationCancelled.
	HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []Lease) (ended map[Lease]Ended, err error)
	// Get reads targetID's row; found is false when there is none. It
	// sees every write that the database committed before it began, also
	// on a node of a cluster that applies other nodes' writes late.
	Get(ctx context.Context, db *gorm.DB, targetID string) (row Row, found bool, err error)
	// ReadSaved reads what a fenced commit whose COMMIT got no answer left
	// in targetID's row: the generation that it last saved, and whether
	// the lease is still held, and by whom; found is false when there is
	// no row. It reports only what the database keeps across a failover:
	// on PostgreSQL it reads under a row lock whose COMMIT waits for the
	// synchronous standbys, so that a save committed on an isolated
	// primary alone makes it fail (see ErrReplicationCancelled), and it
	// waits for the row lock while the fenced transaction still holds it.
	ReadSaved(ctx context.Context, db *gorm.DB, targetID string) (saved Saved, found bool, err error)
	// ForceRelease ends the leases of the rows of keys (a target's, or
	// its slots') that are not released, whoever holds them: in one
	// transaction each such row gets token, the next generation, its
	// release time and failure, EndForced as its end_cause and by (NULL
	// when "") as ended_by, and the rows that carry token are read
	// back. It returns those rows, in no order, none when there was no
	// lease to end. token is fresh: run again with the same token after
	// an error, it also returns the rows that an earlier run ended.
	ForceRelease(ctx context.Context, db *gorm.DB, keys []string, token uuid.UUID, failure, by string) ([]Row, error)

	// CommitFenced runs one attempt of the fenced commit f on db, in one
	// transaction (see Fence): it begins it and locks f.Lease's row,
	// checking that the row still carries the lease's token, runs f.Save on
	// the transaction, records the save (or, with f.Release, has recorded
	// it and released the lease with the lock), and commits. While the
	// database cannot be reached, the beginning and the lock are tried
	// again until ctx ends. It returns, having saved nothing: ErrNotOwned
	// when no row held the lease; an *EndedError when the transaction
	// could not begin before ctx ended, ended before its COMMIT, or ctx
	// ended before it; a *SaverError when f.Save failed or aborted the
	// transaction. A *CommitUnknownError says that the COMMIT got no
	// answer, or that the server committed without the confirmation of
	// its synchronous standbys (ErrReplicationCancelled). db must not be
	// in a transaction.
	CommitFenced(ctx context.Context, db *gorm.DB, f Fence) error
	// RetryCommit decides, after the fenced commit of l failed with err on
	// its attempt-th try, whether the failure came from the database and
	// not from a lost lease, so that the commit may run again (its saver
	// included): lost reports that the lease is gone instead. A backend on
	// a single server always answers false, false.
	RetryCommit(ctx context.Context, db *gorm.DB, l Lease, err error, attempt int) (again, lost bool)

	// State reads what a waiter needs of targetID's row.
	State(ctx context.Context, db *gorm.DB, targetID string) (State, error)
	// MarkWaiting marks the row of generation, when it is live and not
	// marked yet, as waited on, so that the statement that ends it notifies
	// (Capabilities.Notify). It reports marked when it did, and ended when
	// the generation had ended.
	MarkWaiting(ctx context.Context, db *gorm.DB, targetID string, generation int64) (marked, ended bool, err error)
	// Listen opens a connection of its own with the settings of db's pool,
	// listens on it for the notifications of every table's lease rows and
	// calls notified with each one's table and target, until ctx is done or
	// the connection fails; it calls ready once it listens. It returns
	// ErrCannotListen when db's pool cannot receive notifications (another
	// driver, a connection pooler). Only with Capabilities.Notify.
	Listen(ctx context.Context, db *gorm.DB, ready func(), notified func(table, targetID string)) error

	// AcquireSlot takes one free slot of the semaphore a.TargetID of
	// a.Slots slots, in one statement: one of the rows SlotKey(a.TargetID,
	// 1..a.Slots) that records a.Slots as its count and is released or
	// expired (judged as Acquire judges a row), chosen at random among
	// those. When none is, it writes nothing. It reports the slot taken and
	// its new generation. Rows that do not exist yet are SetSlots' to
	// create.
	AcquireSlot(ctx context.Context, db *gorm.DB, a SlotArgs) (slot int, generation int64, acquired bool, err error)
	// SlotRows reads the rows of slots 1..n of targetID that exist, in one
	// statement, with the count that each records and whether it is live.
	SlotRows(ctx context.Context, db *gorm.DB, targetID string, n int) ([]SlotRow, error)
	// SetSlots makes targetID a semaphore of n slots, in one transaction
	// that locks every slot row of the target (1..MaxSlots): unless a live
	// row records another count, which it returns as conflict, it records
	// n in every row and creates the missing rows of 1..n, released. It
	// changes no row that already records n.
	SetSlots(ctx context.Context, db *gorm.DB, targetID string, n int) (conflict int, err error)

	// List reads the rows that q chooses, with their state and ages on the
	// database's clock, in one statement, in q.Order's order: every filter
	// and the order are the statement's, never the caller's.
	List(ctx context.Context, db *gorm.DB, q ListQuery) ([]Listed, error)
	// Count counts the rows whose key starts with prefix ("" for all) in
	// each state, in one statement on the database's clock.
	Count(ctx context.Context, db *gorm.DB, prefix string) (Counts, error)
	// PruneBatch deletes, in one transaction, up to q.BatchSize prunable
	// rows whose target IDs come after q.After, with their result rows
	// unless q.KeepResults, and raises the generation floor above them. It
	// returns the targets deleted and whether more rows may follow.
	PruneBatch(ctx context.Context, db *gorm.DB, q PruneQuery) (deleted []string, more bool, err error)
	// PruneCount counts, in one statement, the rows that PruneBatch would
	// delete now (rows that others hold locked included), deleting
	// nothing.
	PruneCount(ctx context.Context, db *gorm.DB, olderThan time.Duration) (int64, error)

	// History reads, in one statement, the newest q.Limit events of the
	// row q.Key whose seq is below q.Before (all when 0), newest first. It
	// returns an error wrapping ErrNoEvents when the lease table keeps no
	// history: the event table does not exist.
	History(ctx context.Context, db *gorm.DB, q HistoryQuery) ([]Event, error)
	// PruneEvents deletes up to q.BatchSize prunable events (see
	// EventPruneQuery) from the key q.After on, and returns how many it
	// deleted, the key of the last one, for the next batch's After, and
	// whether more may follow; an error wrapping ErrNoEvents when the
	// event table does not exist.
	PruneEvents(ctx context.Context, db *gorm.DB, q EventPruneQuery) (deleted int64, last string, more bool, err error)
	// PruneEventsCount counts, in one statement, the events that
	// PruneEvents would delete now, deleting nothing; an error wrapping
	// ErrNoEvents when the event table does not exist.
	PruneEventsCount(ctx context.Context, db *gorm.DB, q EventPruneQuery) (int64, error)

	// Pause marks the rows of keys (a target's, and its slots') paused,
	// with reason and the operator by (NULL when ""), in one transaction,
	// creating the first key's row, released at the generation floor, when
	// it has none. A row already paused keeps the time of its pause and
	// gets the new reason and operator.
	Pause(ctx context.Context, db *gorm.DB, keys []string, reason, by string) error
	// Resume clears the pause of the rows of keys, with its reason, in one
	// statement that notifies their waiters where the backend can
	// (Capabilities.Notify), and records by (NULL when "") as paused_by in
	// the rows that were paused: who resumed them, which the history's
	// resumed event reads. It reports how many rows it wrote.
	Resume(ctx context.Context, db *gorm.DB, keys []string, by string) (int64, error)
	// RequestStop records, in one statement, a request to stop in those
	// rows of keys whose lease is not released: stop_generation becomes
	// their generation, stop_reason reason and stop_by the operator by
	// (NULL when ""). It reports how many rows it changed.
	RequestStop(ctx context.Context, db *gorm.DB, keys []string, reason, by string) (int64, error)

	// Now is an SQL expression for the database's current time, in the
	// form the tables hold it, read when the statement runs.
	Now() string
}

// Capabilities are what a Backend can do beyond the common steps.
type Capabilities struct {
	// Notify: the statements that end a waited-on generation notify
	// waiters in other processes, which MarkWaiting and Listen serve.
	Notify bool
}

// Ended is what a heartbeat found of a lease that it did not simply renew.
type Ended struct {
	// Stop reports that an operator asked the lease's holder to stop
	// (RequestStop), with Reason: the lease is still the holder's, and was
	// renewed. Otherwise the lease is lost: taken over or released.
	Stop   bool
	Reason string
}

// MaxBatch is the most leases that one HeartbeatBatch renews.
const MaxBatch = 1000

// Lease is a lease that the caller holds, as the steps know it.
type Lease struct {
	TargetID   string
	Token      uuid.UUID
	Generation int64
}

// Own names a statement on the caller's own row.
type Own uint8

const (
	// Renew stamps the row with the database's time: a heartbeat.
	Renew Own = iota
	// Release marks the row released, with EndSaved as its end_cause when
	// the generation saved, EndReleased otherwise.
	Release
	// ReleaseFailed marks it released, with its arguments: the failure of
	// the job, and the end_cause (EndFailed, EndLost, ...).
	ReleaseFailed
	// Save records the lease's generation as the saved one (the fenced
	// commit of CommitIfOwner).
	Save
	// SaveRelease records the save and releases the lease, with EndSaved
	// as its end_cause, in one statement that also locks and checks the
	// row (Run's fenced commit).
	SaveRelease
	// HoldFor stamps the row and records its first argument, in
	// milliseconds, as the lease's timeout: the lease stays held,
	// unrenewed, until then. Its work has ended: the second argument is
	// the end_cause (nil: as Release records it) and the third the
	// failure (nil for none).
	HoldFor
)

// AcquireArgs are the values of one acquire.
type AcquireArgs struct {
	TargetID string
	Token    uuid.UUID
	Holder   string
	// Timeout is the new lease's timeout, recorded in the row. The row's
	// current lease is judged by the timeout that its own holder recorded.
	Timeout time.Duration
	// From, when not AnyGeneration, is the generation that the row must
	// have for the acquire to take it over (0: there must be no row). A
	// caller that waited for a generation to end takes over from that one
	// only, never from one that began and ended since it looked.
	From int64
	// FromExpired, with From above 0, takes the row over only while From
	// is still unreleased: the caller saw that lease expire, and must not
	// take over once its holder has ended it since (with a save, which the
	// caller would rather load than make again).
	FromExpired bool
}

// Acquired is the outcome of an Acquire.
type Acquired struct {
	// Taken reports whether the lease was taken, at Generation.
	Taken      bool
	Generation int64
	// Held, for a refusal, is the live lease that refused it; nil when the
	// refusing statements saw none: the row changed while they ran (an
	// acquire that another one beat to the row), or, for an acquire From a
	// generation, the row is not live but at another generation.
	Held *Held
	// Paused, for a refusal, reports that the target is paused (an
	// operator's Pause), with the reason recorded: no acquire takes it
	// until Resume, whether or not a lease is live (Held) on it.
	Paused      bool
	PauseReason string
}

// Held is a live lease, as a statement read it, with its remaining life
// and the time since its acquisition on the database's clock.
type Held struct {
	Holder     string
	Generation int64
	// ExpiresIn is how long the lease lives without another heartbeat:
	// within (0, its timeout].
	ExpiresIn time.Duration
	// HeldFor is how long the generation has been held, since its
	// acquisition (acquired_at); 0 when the row does not record it.
	HeldFor time.Duration
	// MinHold reports that the holder has ended its work and the lease
	// is only a minimum hold (hold_generation is the row's generation):
	// it lasts ExpiresIn, with no heartbeat to renew it.
	MinHold bool
}

// NewHeld is the Held of a live lease of holder at generation, whose
// timeout is timeout and whose last heartbeat is age old. A lease that the
// statement judged live has some life left, however the clock readings
// round: ExpiresIn is at least a microsecond, the finest that the
// databases record, and at most timeout.
func NewHeld(holder string, generation int64, timeout, age time.Duration) *Held {
	return &Held{Holder: holder, Generation: generation, ExpiresIn: min(max(timeout-age, time.Microsecond), timeout)}
}

// Since records in h that its generation was acquired heldFor ago, on
// the database's clock (0, or less, when the row does not record it), and
// whether the lease is a minimum hold; it returns h.
func (h *Held) Since(heldFor time.Duration, minHold bool) *Held {
	h.HeldFor, h.MinHold = max(heldFor, 0), minHold
	return h
}

// SlotArgs are the values of one AcquireSlot.
type SlotArgs struct {
	TargetID string
	Slots    int
	Token    uuid.UUID
	Holder   string
	Timeout  time.Duration
}

// SlotRow is a slot row as SlotRows reads it.
type SlotRow struct {
	Slot int
	// Slots is the count that the row records; 0 when it records none.
	Slots int
	Live  bool
	// Holder and Generation are the row's lease, and Timeout and Age its
	// recorded timeout (0 when it records none) and the time since its last
	// heartbeat, on the database's clock.
	Holder     string
	Generation int64
	Timeout    time.Duration
	Age        time.Duration
	// Paused reports that the slot's row is paused (the target is), with
	// the pause's reason.
	Paused      bool
	PauseReason string
	// HeldFor is the time since the generation's acquisition (0 when the
	// row does not record it), and MinHold whether the lease is a minimum
	// hold (see Held).
	HeldFor time.Duration
	MinHold bool
}

// A semaphore's slots are lease rows of their own, one per slot, keyed by
// the target ID, SlotSeparator and the slot's number from 1: the target
// IDs that the steps accept never contain SlotSeparator, so that no target
// shares a key with a slot, and a slot's row sorts right after its
// target's own key. Each row records the semaphore's count in its slots
// column.
const (
	SlotSeparator = "\x1f"
	// MaxSlots is the largest count of a semaphore.
	MaxSlots = 100
)

// SlotKey is the key of slot's row of targetID.
func SlotKey(targetID string, slot int) string {
	return targetID + SlotSeparator + strconv.Itoa(slot)
}

// SlotKeys are the keys of the rows of slots 1..n of targetID.
func SlotKeys(targetID string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = SlotKey(targetID, i+1)
	}
	return keys
}

// ParseSlotKey splits the key of a slot's row; ok is false for any other
// key.
func ParseSlotKey(key string) (targetID string, slot int, ok bool) {
	i := strings.LastIndex(key, SlotSeparator)
	if i < 0 {
		return "", 0, false
	}
	slot, err := strconv.Atoi(key[i+len(SlotSeparator):])
	if err != nil || slot < 1 || slot > MaxSlots {
		return "", 0, false
	}
	return key[:i], slot, true
}

// AnyGeneration is AcquireArgs.From when any generation may be taken over.
const AnyGeneration = -1

// Row is a lease row, as the steps read it. The public JobLease has the
// same fields.
type Row struct {
	TargetID        string
	LeaseToken      uuid.UUID
	Generation      int64
	Holder          string
	UpdatedAt       time.Time
	ReleasedAt      *time.Time
	SavedGeneration *int64
	SavedAt         *time.Time
	Failure         *string
	TimeoutMS       *int64
	HoldGeneration  *int64
	PausedAt        *time.Time
	PauseReason     *string
	StopGeneration  *int64
	StopReason      *string
	AcquiredAt      *time.Time
	PausedBy        *string
	StopBy          *string
	EndCause        *string
	EndedBy         *string
}

// RowColumns are the columns of a lease row that Get, List and
// ForceRelease read, in the order of Row.Columns.
const RowColumns = "target_id, lease_token, generation, holder, updated_at, released_at," +
	" saved_generation, saved_at, failure, timeout_ms, hold_generation, paused_at, pause_reason, stop_generation, stop_reason," +
	" acquired_at, paused_by, stop_by, end_cause, ended_by"

// Columns returns where to scan RowColumns into row.
func (row *Row) Columns() []any {
	return []any{&row.TargetID, &row.LeaseToken, &row.Generation, &row.Holder, &row.UpdatedAt, &row.ReleasedAt,
		&row.SavedGeneration, &row.SavedAt, &row.Failure, &row.TimeoutMS, &row.HoldGeneration,
		&row.PausedAt, &row.PauseReason, &row.StopGeneration, &row.StopReason,
		&row.AcquiredAt, &row.PausedBy, &row.StopBy, &row.EndCause, &row.EndedBy}
}

// Holds reports whether row holds l: it carries l's token, unreleased.
func (row Row) Holds(l Lease) bool { return row.LeaseToken == l.Token && row.ReleasedAt == nil }

// Saved is what ReadSaved reads of a lease row.
type Saved struct {
	// Generation is the generation that the row last saved, 0 when none
	// did.
	Generation int64
	// Token is the row's lease token, and Released whether its lease
	// ended.
	Token    uuid.UUID
	Released bool
}

// Holds reports whether s shows l still held: l's token, unreleased.
func (s Saved) Holds(l Lease) bool { return s.Token == l.Token && !s.Released }

// State is a lease row as a waiter reads it, with ages on the database's
// clock.
type State struct {
	Found      bool
	Generation int64
	Released   bool
	// SavedGeneration is the last generation that saved a result, 0 when
	// none did; SavedAge is the time since then, or -1.
	SavedGeneration int64
	SavedAge        time.Duration
	// Failure is the failure that the generation was released with, if any.
	Failure string
	// Age is the time since the last acquire or heartbeat.
	Age time.Duration
	// ReleasedAge is the time since the generation was released, or -1
	// while it is not.
	ReleasedAge time.Duration
	// Waiting reports whether the row is marked as waited on.
	Waiting bool
	// Holder is the holder that the generation's acquire recorded.
	Holder string
	// Timeout is the lease timeout that the generation's holder recorded, 0
	// when the row records none.
	Timeout time.Duration
	// Paused reports that the target is paused (admin.Operator.Pause), with
	// the pause's reason: no acquire takes the row until it is resumed.
	Paused      bool
	PauseReason string
	// Stopped reports that an operator asked the generation's holder to
	// stop (RequestStop): a generation released so was given up, not
	// failed, and its waiters take over rather than share its failure.
	Stopped bool
	// HeldFor is the time since the generation's acquisition
	// (acquired_at), 0 when the row does not record it; MinHold reports
	// that its holder ended its work and holds the row for a minimum hold
	// (see Held).
	HeldFor time.Duration
	MinHold bool
	// Read is when the read's answer came, on this process's clock: the
	// database took its ages (Age, SavedAge) before then. It is set by the
	// waiters' reads (internal/wait, Runner.Do), and zero elsewhere.
	Read time.Time
}

// Live reports whether the generation that st shows is held and not
// expired, judged, as the acquire judges it, by the timeout its holder
// recorded, or by fallback when the row records none.
func (st State) Live(fallback time.Duration) bool {
	timeout := st.Timeout
	if timeout <= 0 {
		timeout = fallback
	}
	return st.Found && !st.Released && st.Age <= timeout
}

// ListQuery chooses the rows of a List: those starting with Prefix, whose
// key is Key (any when ""), in State ("live", "expired", "released", or
// "paused" for the rows paused whatever their state; all when ""), whose
// holder is Holder (any when ""), up to Limit, in Order, after the row
// whose sort value is AfterSort and whose key is After ("" starts at the
// first).
type ListQuery struct {
	After, Prefix, Key, State, Holder string
	Order                             ListOrder
	// AfterSort is, with an Order other than ByKey and After, the sort
	// value (Listed.Sort) of the row After: nil for a row that sorts
	// last, without one.
	AfterSort *int64
	Limit     int
}

// ListOrder is the order of a List's rows; each breaks ties by key.
type ListOrder uint8

const (
	// ByKey orders the rows by key.
	ByKey ListOrder = iota
	// ByAge orders them by their last heartbeat (updated_at), oldest
	// first.
	ByAge
	// ByHeldSince orders the rows whose lease is not released by their
	// acquisition (acquired_at), oldest first, then the others.
	ByHeldSince
	// ByExpiry orders the rows whose lease is not released by when it
	// expires (updated_at plus timeout_ms), soonest first, then the others.
	ByExpiry
)

// Listed is a row that List read, with its state ("live", "expired" or
// "released") and ages.
type Listed struct {
	Row   Row
	State string
	Age   time.Duration
	// HeldFor is the time since Row.AcquiredAt; 0 when it is NULL.
	HeldFor time.Duration
	// Sort is the row's value in the List's order, in microseconds since
	// the Unix epoch (ByAge, ByHeldSince, ByExpiry), for ListQuery's
	// AfterSort; nil in the order by key, and for a row without one,
	// which sorts last.
	Sort *int64
}

// Counts are the rows that Count counted: Total in all, Live, Expired and
// Released by state (they add up to Total), Paused and StopRequested
// across states.
type Counts struct {
	Total, Live, Expired, Released, Paused, StopRequested int64
}

// Live reports whether l's lease was live when it was read.
func (l Listed) Live() bool { return l.State == "live" }

// PruneQuery chooses the rows of a PruneBatch: released, or expired by the
// timeout their holder recorded, more than OlderThan ago.
type PruneQuery struct {
	OlderThan   time.Duration
	BatchSize   int
	After       string
	KeepResults bool
}

// Seconds converts s seconds, as the database computed them, to a
// Duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ErrNotOwned is the fenced commit's error when its lock found no row that
// holds the caller's lease (see Backend.RetryCommit).
var ErrNotOwned = errors.New("no row holds the lease")
