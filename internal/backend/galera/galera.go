// Package galera wraps the MySQL backend for a MariaDB Galera cluster. It is
// the MySQL backend wherever the server is not a Galera node, which it asks
// once; on a Galera node it adds the checks that the cluster needs, and
// nothing else in gormlease knows of Galera.
//
// Every node of a Galera cluster takes writes; a transaction runs on its own
// node, taking row locks there only, and is certified against the writes of
// the other nodes when it commits, in one order that all nodes agree on. A
// transaction that wrote a row which a write certified before it also
// wrote, one that it had not seen, fails at COMMIT (or, when the other write
// reaches its node first, at its next statement) with error 1213, and is
// rolled back. Three things follow for the lease:
//
//   - The fence still holds: a fenced commit on one node whose lease was
//     taken over on another, even a moment before and not yet seen there,
//     fails certification, having saved nothing. But a takeover does not
//     wait for the fenced commit to end, as it does on one server.
//   - A heartbeat of the holder itself, sent through another node while the
//     fenced commit runs (a pool spread over the nodes, or WithHeartbeatDB
//     on another node), fails the commit in the same way, although the
//     lease is still the holder's. So the fenced commit may run again when
//     it fails with a serialization failure and a causal read of the row
//     shows that the lease is still the caller's (RetryCommit). The saver
//     then runs again, in a new transaction; every earlier run's
//     transaction was rolled back.
//   - A node applies the other nodes' writes shortly after they commit, so
//     a statement sent to it just after a write on another node may not find
//     that write: a heartbeat, fenced commit or release sent to node 2 just
//     after the acquire on node 1 finds the row's old token and changes
//     nothing; an acquire sent just after a release elsewhere finds the
//     lease still held, or the target still paused after a Resume elsewhere;
//     ForceRelease finds nothing to release. So before such an outcome is
//     reported, a causal read of the row checks it; when the row says
//     otherwise, the node was behind, and the statement is sent again, up
//     to Attempts times in all. An operator's Pause, Resume, RequestStop
//     and ForceRelease make the causal read first, and their statement
//     after it: a Resume on a node behind the Pause would find nothing to
//     resume, a RequestStop or ForceRelease behind the acquire no live
//     lease (of a slot, say, while it finds the others').
//
// The reads that a step decides on (Get) wait for the node to catch up,
// with wsrep_sync_wait=1 for that statement alone.
package galera

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/mysql"
)

// Attempts is how often a statement or the fenced commit is tried in all
// on a Galera node, while a causal read says the outcome came from the
// node being behind, or from a write that did not take the lease.
const Attempts = 4

// Backend is the MySQL backend, checked as a Galera node needs where the
// server is one.
type Backend struct {
	*mysql.Backend
}

// Wrap returns inner, wrapped.
func Wrap(inner *mysql.Backend) *Backend { return &Backend{Backend: inner} }

// On reports whether db's server is a MariaDB Galera node (the SET
// STATEMENT of the causal reads is MariaDB's), asking it once, with the
// MySQL backend's one probe of its server (mysql.Backend.Server). When it
// cannot tell (the query fails), it reports false and asks again next
// time.
func (b *Backend) On(ctx context.Context, db *gorm.DB) bool {
	s, ok := b.Server(ctx, db)
	return ok && s.Galera && s.MariaDB
}

// Get reads the row with a causal read: on a Galera node it waits until the
// node has applied every write that the cluster committed before it began,
// so that it sees a takeover made on another node.
func (b *Backend) Get(ctx context.Context, db *gorm.DB, targetID string) (backend.Row, bool, error) {
	if !b.On(ctx, db) {
		return b.Backend.Get(ctx, db, targetID)
	}
	var row backend.Row
	found, err := backend.QueryRow(ctx, db, "SET STATEMENT wsrep_sync_wait=1 FOR "+b.GetSQL(), []any{targetID}, row.Columns()...)
	return row, found, err
}

// List reads the rows once the node has caught up (see catchUp), as Get
// reads one: an operator's list made just after a job ended on another
// node shows its end. It costs a causal read before the statement.
func (b *Backend) List(ctx context.Context, db *gorm.DB, q backend.ListQuery) ([]backend.Listed, error) {
	if err := b.catchUp(ctx, db, q.Prefix); err != nil {
		return nil, err
	}
	return b.Backend.List(ctx, db, q)
}

// Count counts the rows once the node has caught up (see catchUp), as
// List reads them.
func (b *Backend) Count(ctx context.Context, db *gorm.DB, prefix string) (backend.Counts, error) {
	if err := b.catchUp(ctx, db, prefix); err != nil {
		return backend.Counts{}, err
	}
	return b.Backend.Count(ctx, db, prefix)
}

// History reads the events once the node has caught up (see catchUp), as
// List reads the rows: the history read just after a job ended on another
// node shows its end.
func (b *Backend) History(ctx context.Context, db *gorm.DB, q backend.HistoryQuery) ([]backend.Event, error) {
	if err := b.catchUp(ctx, db, q.Key); err != nil {
		return nil, err
	}
	return b.Backend.History(ctx, db, q)
}

// ReadSaved reads what targetID's row saved, as Get reads it: once the
// node has applied what the cluster committed before.
func (b *Backend) ReadSaved(ctx context.Context, db *gorm.DB, targetID string) (backend.Saved, bool, error) {
	return backend.ReadSavedWith(ctx, db, targetID, b.Get)
}

// Acquire sends the acquire again when it was refused only because the
// node had not yet applied a release, or a Resume, made elsewhere.
func (b *Backend) Acquire(ctx context.Context, db *gorm.DB, a backend.AcquireArgs) (backend.Acquired, error) {
	wait := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		got, err := b.Backend.Acquire(ctx, db, a)
		if err != nil || got.Taken || attempt >= Attempts {
			return got, err
		}
		cleared := released
		if got.Paused {
			cleared = notPaused
		}
		if !b.behind(ctx, db, a.TargetID, cleared) || !wait.Wait(ctx) {
			return got, nil
		}
	}
}

// AcquireSlot sends the acquire again when it was refused only because the
// node had not yet applied the release of a slot made elsewhere, as
// Acquire does.
func (b *Backend) AcquireSlot(ctx context.Context, db *gorm.DB, a backend.SlotArgs) (int, int64, bool, error) {
	wait := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		slot, gen, ok, err := b.Backend.AcquireSlot(ctx, db, a)
		if err != nil || ok || attempt >= Attempts || !b.On(ctx, db) || !b.slotFree(ctx, db, a) || !wait.Wait(ctx) {
			return slot, gen, ok, err
		}
	}
}

// slotFree reports whether a causal read of a's slot rows finds one of
// them free under a's count.
func (b *Backend) slotFree(ctx context.Context, db *gorm.DB, a backend.SlotArgs) bool {
	rows, err := b.SlotRows(ctx, db, a.TargetID, a.Slots)
	if err != nil {
		return false
	}
	for _, r := range rows {
		if r.Slots == a.Slots && !r.Live {
			return true
		}
	}
	return false
}

// SlotRows reads the rows with a causal read on a Galera node, as Get does.
func (b *Backend) SlotRows(ctx context.Context, db *gorm.DB, targetID string, n int) ([]backend.SlotRow, error) {
	if !b.On(ctx, db) {
		return b.Backend.SlotRows(ctx, db, targetID, n)
	}
	query, args := b.SlotRowsQuery(targetID, n)
	rows, err := backend.Query(ctx, db, "SET STATEMENT wsrep_sync_wait=1 FOR "+query, args...)
	if err != nil {
		return nil, err
	}
	return backend.ScanSlots(rows)
}

// FlushWarning is the message of the warning that SettingsWarnings returns
// on a Galera node whose innodb_flush_log_at_trx_commit is not 1.
const FlushWarning = "gormlease: innodb_flush_log_at_trx_commit is not 1 on this Galera node: " +
	"when the nodes crash together, saved results and lease changes that were committed can be lost, " +
	"and the work run again (docs/scaling.md)"

// SettingsWarnings warns, on a Galera node, when innodb_flush_log_at_trx_commit
// is not 1: InnoDB then writes or flushes its redo log about once a second
// rather than at each commit, and the cluster keeps a commit only in the
// nodes' memory (0) or their operating systems' caches (2) until then. A
// node that crashes alone gets it back from the others when it rejoins;
// when every node crashes within that second (a power cut, a host running
// them all, a coordinated restart gone wrong), the commit is gone: a saved
// result that Run reported, or a release, and the lease row goes back to an
// older generation, whose work then runs again.
func (b *Backend) SettingsWarnings(ctx context.Context, db *gorm.DB) []backend.SettingsWarning {
	if !b.On(ctx, db) {
		return nil
	}
	var flush string
	found, err := backend.QueryRow(ctx, db, "SELECT @@global.innodb_flush_log_at_trx_commit", nil, &flush)
	if err != nil || !found || flush == "1" {
		return nil
	}
	return []backend.SettingsWarning{{Setting: "innodb_flush_log_at_trx_commit", Value: flush, Message: FlushWarning}}
}

// CommitFenced runs the fenced commit with the statements on the caller's
// row sent through UpdateOwn, which, on a known Galera node, takes a
// serialization failure inside the transaction as RetryCommit's to decide.
func (b *Backend) CommitFenced(ctx context.Context, db *gorm.DB, f backend.Fence) error {
	return b.FenceWith(ctx, db, f, b.UpdateOwn, nil)
}

// UpdateOwn sends the statement again when it changed nothing only because
// the node had not yet applied l. Inside a transaction (the fenced commit's
// lock) that is RetryCommit's to decide, and on a known Galera node a
// serialization failure there is retried or turned into the step's outcome,
// not a fault for the logger.
func (b *Backend) UpdateOwn(ctx context.Context, db *gorm.DB, op backend.Own, l backend.Lease, args ...any) (int64, error) {
	if backend.InTx(db) {
		if s, ok := b.KnownServer(); ok && s.Galera && s.MariaDB {
			ctx = backend.MarkRetried(ctx)
		}
		return b.Backend.UpdateOwn(ctx, db, op, l, args...)
	}
	wait := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		n, err := b.Backend.UpdateOwn(ctx, db, op, l, args...)
		if err != nil || n > 0 || !b.On(ctx, db) {
			return n, err
		}
		row, found, err := b.Get(ctx, db, l.TargetID)
		switch {
		case err != nil:
			return 0, errors.Join(errors.New("no row held the lease on this Galera node, and reading it again failed"), err)
		case !found || !row.Holds(l):
			return 0, nil // gone, as the statement said
		case attempt >= Attempts:
			return 0, errors.New("the row holds the lease, but this Galera node had not applied it after several attempts")
		case !wait.Wait(ctx):
			return 0, ctx.Err()
		}
	}
}

// HeartbeatBatch checks again, lease by lease, those that the batch
// reported lost: the node may only have been behind.
func (b *Backend) HeartbeatBatch(ctx context.Context, db *gorm.DB, leases []backend.Lease) (map[backend.Lease]backend.Ended, error) {
	lost, err := b.Backend.HeartbeatBatch(ctx, db, leases)
	if err != nil || len(lost) == 0 || !b.On(ctx, db) {
		return lost, err
	}
	for l, e := range lost {
		if e.Stop {
			continue
		}
		n, err := b.UpdateOwn(ctx, db, backend.Renew, l)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			delete(lost, l)
		}
	}
	return lost, nil
}

// ForceRelease ends the leases once the node has caught up (see
// catchUp), and sends the statement again when it found nothing to end
// only because the node had not yet applied the acquire of keys[0]'s row
// (a pool spread over the nodes may send it to another node than the
// causal read): on a node behind an acquire made elsewhere, the statement
// would leave that lease live, the slots' among them.
func (b *Backend) ForceRelease(ctx context.Context, db *gorm.DB, keys []string, token uuid.UUID, failure, by string) ([]backend.Row, error) {
	if err := b.catchUp(ctx, db, keys[0]); err != nil {
		return nil, err
	}
	wait := backend.StatementBackoff()
	for attempt := 1; ; attempt++ {
		rows, err := b.Backend.ForceRelease(ctx, db, keys, token, failure, by)
		if err != nil || len(rows) > 0 || attempt >= Attempts || !b.behind(ctx, db, keys[0], held) || !wait.Wait(ctx) {
			return rows, err
		}
	}
}

// Pause marks the rows paused once the node has caught up (see catchUp):
// a slot row made on another node a moment before is paused too.
func (b *Backend) Pause(ctx context.Context, db *gorm.DB, keys []string, reason, by string) error {
	if err := b.catchUp(ctx, db, keys[0]); err != nil {
		return err
	}
	return b.Backend.Pause(ctx, db, keys, reason, by)
}

// Resume clears the pause once the node has caught up (see catchUp): on a
// node that had not applied a Pause made elsewhere, the statement would
// find nothing paused, change nothing, and leave the pause in place.
func (b *Backend) Resume(ctx context.Context, db *gorm.DB, keys []string, by string) (int64, error) {
	if err := b.catchUp(ctx, db, keys[0]); err != nil {
		return 0, err
	}
	return b.Backend.Resume(ctx, db, keys, by)
}

// RequestStop records the request once the node has caught up (see
// catchUp): on a node that had not applied an acquire made elsewhere, the
// statement would find no live lease, and RequestStop report
// ErrNoLiveLease while the holder goes on.
func (b *Backend) RequestStop(ctx context.Context, db *gorm.DB, keys []string, reason, by string) (int64, error) {
	if err := b.catchUp(ctx, db, keys[0]); err != nil {
		return 0, err
	}
	return b.Backend.RequestStop(ctx, db, keys, reason, by)
}

// catchUp makes a causal read of key's row, on a Galera node: it returns
// once the node has applied every write that the cluster committed before
// the read began, so that the statement sent after it (on any connection
// to that node) sees them. The operator's steps, which are rare, pay this
// round trip before their statement, rather than a read after an outcome
// that only a lagging node would report: Resume's outcome is not even
// reported.
func (b *Backend) catchUp(ctx context.Context, db *gorm.DB, key string) error {
	if !b.On(ctx, db) {
		return nil
	}
	if _, _, err := b.Get(ctx, db, key); err != nil {
		return fmt.Errorf("causal read before the statement: %w", err)
	}
	return nil
}

// RetryCommit decides, after the fenced commit of l failed with err, whether
// to run it again, on a Galera node only:
//   - when its lock found no row holding l (backend.ErrNotOwned), and a
//     causal read shows the row holding l: the node had not yet applied it.
//     The saver had not run.
//   - after a serialization failure, which rolled the whole transaction
//     back, when a causal read shows l still the caller's: the failure came
//     from another write on the row that did not take the lease. When the
//     read shows l gone, it reports lost. When the read itself fails after
//     a serialization failure (a causal read that timed out on a node busy
//     applying the very write that aborted the commit), it runs the commit
//     again, as the lock under it checks the token: it then saves, or finds
//     l gone.
func (b *Backend) RetryCommit(ctx context.Context, db *gorm.DB, l backend.Lease, err error, attempt int) (again, lost bool) {
	if attempt >= Attempts || !b.On(ctx, db) {
		return false, false
	}
	notOwned := errors.Is(err, backend.ErrNotOwned)
	if !notOwned && !backend.IsSerializationFailure(err) {
		return false, false
	}
	pause := backend.Backoff{Pause: 2 * time.Millisecond << (attempt - 1), Max: 100 * time.Millisecond}
	row, found, getErr := b.Get(ctx, db, l.TargetID)
	switch {
	case getErr != nil && (notOwned || ctx.Err() != nil):
		return false, false
	case getErr != nil:
		return pause.Wait(ctx), false
	case !found || !row.Holds(l):
		return false, !notOwned
	}
	return pause.Wait(ctx), false
}

// behind reports whether a causal read of targetID's row finds it as want
// says: a statement that found it otherwise ran on a node that had not yet
// applied the write that made it so.
func (b *Backend) behind(ctx context.Context, db *gorm.DB, targetID string, want func(backend.Row) bool) bool {
	if !b.On(ctx, db) {
		return false
	}
	row, found, err := b.Get(ctx, db, targetID)
	return err == nil && found && want(row)
}

func released(row backend.Row) bool  { return row.ReleasedAt != nil }
func held(row backend.Row) bool      { return row.ReleasedAt == nil }
func notPaused(row backend.Row) bool { return row.PausedAt == nil }
