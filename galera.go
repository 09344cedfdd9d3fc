package gormlease

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// MariaDB Galera cluster. Every node takes writes; a transaction runs on
// its own node, taking row locks there only, and is certified against the
// writes of the other nodes when it commits, in one order that all nodes
// agree on. A transaction that wrote a row which a write certified before
// it also wrote, one that it had not seen, fails at COMMIT (or, when the
// other write reaches its node first, at its next statement) with error
// 1213, and is rolled back. Two things follow for the lease:
//
//   - The fence still holds: a fenced commit on one node whose lease was
//     taken over on another, even a moment before and not yet seen there,
//     fails certification, having saved nothing. But a takeover does not
//     wait for the fenced commit to end, as it does on one server.
//   - A heartbeat of the holder itself, sent through another node while the
//     fenced commit runs (a pool spread over the nodes, or WithHeartbeatDB on
//     another node), fails the commit in the same way, although the lease
//     is still the holder's. So on Galera, and only there, the fenced
//     commit is tried again when it fails with a serialization failure and
//     a causal read of the row shows that the lease is still the caller's
//     (see Repository.commit). The saver then runs again, in a new
//     transaction; every earlier run's transaction was rolled back.
//
// Reads: a node applies the other nodes' writes shortly after they commit,
// so a plain SELECT may not yet show a takeover made elsewhere. The reads
// that a step decides on (Get) wait for the node to catch up, with
// wsrep_sync_wait=1 for that statement (see causalRead).

// commitAttempts is how often the fenced commit is tried in all on a
// Galera cluster, while it fails certification with the lease still the
// caller's.
const commitAttempts = 4

// galeraState records whether a Repository's database is a MariaDB Galera
// node: galeraUnknown until it was asked.
const (
	galeraUnknown int32 = iota
	galeraYes
	galeraNo
)

// galeraProbeSQL reads whether the server replicates with Galera (wsrep_on)
// and whether it is MariaDB, whose SET STATEMENT the causal reads use. It
// runs on MySQL too, where it finds no wsrep_on.
const galeraProbeSQL = "SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'version')"

// onGalera reports whether r's database is a MariaDB Galera node, asking it
// once per Repository. When it cannot tell (the query fails), it reports
// false and asks again next time.
func (r *Repository) onGalera(ctx context.Context) bool {
	if _, ok := r.dialect.(mysqlDialect); !ok {
		return false
	}
	switch r.galera.Load() {
	case galeraYes:
		return true
	case galeraNo:
		return false
	}
	rows, err := querySQL(ctx, r.db, galeraProbeSQL)
	if err != nil {
		return false
	}
	defer rows.Close()
	wsrep, mariaDB := false, false
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return false
		}
		switch strings.ToLower(name) {
		case "wsrep_on":
			wsrep = strings.EqualFold(value, "ON") || value == "1"
		case "version":
			mariaDB = strings.Contains(value, "MariaDB")
		}
	}
	if rows.Err() != nil {
		return false
	}
	state := galeraNo
	if wsrep && mariaDB {
		state = galeraYes
	}
	r.galera.Store(state)
	return state == galeraYes
}

// causalRead returns query, a SELECT, made to wait on a Galera node until
// the node has applied every write that the cluster committed before the
// query started, so that it sees a takeover made on another node: MariaDB's
// SET STATEMENT with wsrep_sync_wait=1, for this statement only. Elsewhere
// it returns query as it is.
func (r *Repository) causalRead(ctx context.Context, query string) string {
	if r.onGalera(ctx) {
		return "SET STATEMENT wsrep_sync_wait=1 FOR " + query
	}
	return query
}

// commitAgain decides, after the fenced commit of l failed with err, whether
// to try it again, on a Galera node only:
//   - after a serialization failure (which rolled the whole transaction
//     back), when a causal read of the row shows that l is still the
//     caller's: the failure came from another write on the row that did not
//     take the lease, such as the holder's own heartbeat sent through
//     another node. It returns the error to return instead when the lease
//     is gone: one wrapping ErrLeaseLost.
//   - when the lock found no row holding l, and the node had only not yet
//     applied l (see ownRowLagged). The saver has not run then.
//
// It waits out b before it says yes.
func (r *Repository) commitAgain(ctx context.Context, l Lease, err error, attempt int, b *backoff) (bool, error) {
	if errors.Is(err, errLockedNothing) {
		again, lagErr := r.ownRowLagged(ctx, l, attempt, b)
		if lagErr != nil {
			return false, wrapf(lagErr, "commit %q", l.TargetID)
		}
		return again, err
	}
	if attempt >= commitAttempts || !isSerializationFailure(err) || !r.onGalera(ctx) {
		return false, err
	}
	holds, getErr := r.rowBehind(ctx, l.TargetID, l.heldIn)
	if getErr != nil {
		return false, err
	}
	if !holds {
		return false, wrapf(fmt.Errorf("%w: another write on the lease row came first (%w)", ErrLeaseLost,
			unwrapStep(err)), "commit %q", l.TargetID)
	}
	if !b.wait(ctx) {
		return false, err
	}
	return true, nil
}

// A node behind the others. A Galera node applies the other nodes' writes
// shortly after they commit, so a statement sent to it just after a write
// on another node may not find that write: a heartbeat, fenced commit or
// release sent to node 2 just after the acquire on node 1 finds the row's
// old token and changes nothing; an acquire sent to node 2 just after a
// release on node 1 finds the lease still held; ForceRelease finds nothing
// to release. (Sent at once, about one such statement in a hundred did so
// in a test on three nodes on a quiet machine, one in five on a loaded
// one.) A pool spread over the nodes does this, or WithHeartbeatDB on
// another node. So on a Galera node, before such an outcome is reported
// (ErrLeaseLost, ErrLeaseHeld, ErrNotHeld), a causal read of the row checks
// it; when the row says otherwise, the node was behind, and the statement
// is sent again, up to commitAttempts times in all.

// ownRowLagged decides, after a statement on l's own row (a heartbeat, a
// release, the fenced commit's lock) changed nothing, whether to send it
// again: on a Galera node, when a causal read shows the row still holding
// l, unreleased, the statement ran on a node that had not yet applied l's
// acquire. attempt counts the statement's runs so far; it waits out b before
// it says yes. It reports false with a nil error when l is gone, as the
// statement said; false with an error when the row could not be read, or
// when it still holds l after commitAttempts runs.
func (r *Repository) ownRowLagged(ctx context.Context, l Lease, attempt int, b *backoff) (bool, error) {
	behind, err := r.rowBehind(ctx, l.TargetID, l.heldIn)
	switch {
	case err != nil:
		return false, fmt.Errorf("no row held the lease on this Galera node, and reading it again failed: %w", err)
	case !behind:
		return false, nil
	case attempt >= commitAttempts:
		return false, fmt.Errorf("the row holds the lease, but this Galera node had not applied it after %d attempts", attempt)
	case !b.wait(ctx):
		return false, ctx.Err()
	}
	return true, nil
}

// rowLagged decides, after a statement on targetID's row found it not as
// it needed, whether to send it again: on a Galera node, when a causal read
// shows the row as needed (want), the statement ran on a node that had not
// yet applied the write that made it so. attempt counts the statement's runs
// so far; it waits out b before it says yes. An acquire refused wants the
// row released; ForceRelease, finding nothing to release, wants it held.
func (r *Repository) rowLagged(ctx context.Context, targetID string, want func(JobLease) bool, attempt int, b *backoff) bool {
	if attempt >= commitAttempts {
		return false
	}
	behind, err := r.rowBehind(ctx, targetID, want)
	return err == nil && behind && b.wait(ctx)
}

// rowBehind reports whether, on a Galera node, a causal read of targetID's
// row (see Get) finds it and shows it as want says. It reports false on
// other servers.
func (r *Repository) rowBehind(ctx context.Context, targetID string, want func(JobLease) bool) (bool, error) {
	if !r.onGalera(ctx) {
		return false, nil
	}
	row, found, err := r.Get(ctx, targetID)
	if err != nil {
		return false, err
	}
	return found && want(row), nil
}

// released reports whether row is released.
func released(row JobLease) bool { return row.ReleasedAt != nil }

// held reports whether row is not released.
func held(row JobLease) bool { return row.ReleasedAt == nil }

// unwrapStep returns the cause of err when err is a step's error, so that
// it is not prefixed twice.
func unwrapStep(err error) error {
	var s *stepError
	if errors.As(err, &s) {
		return s.cause
	}
	return err
}
