package backend

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// TestKit is what the test kit (package leasetest) does to a lease row and
// no step of gormlease does: what another process, or the passing of time,
// does to a lease, on any lease, live or not, that the kit reads with
// List. Every backend implements it beside Backend, by embedding Kit;
// choose.TestKitFor picks it, for the test kit alone, and nothing in
// gormlease's steps calls it.
type TestKit interface {
	// SeizeLease gives l's lease, live or not, to a new holder as a
	// takeover would: a.Token, the next generation, a.Holder, the
	// database's time (as the last heartbeat and the acquisition), a.Timeout recorded, the release, the failure
	// and the end cause cleared. It changes nothing, and reports false, when the row no
	// longer carries l's token and generation.
	SeizeLease(ctx context.Context, db *gorm.DB, l Lease, a AcquireArgs) (seized bool, err error)
	// Backdate moves the last heartbeat of l's own row (its token,
	// unreleased) back by d, on the row's own time. It changes nothing,
	// and reports false, when the row does not hold l.
	Backdate(ctx context.Context, db *gorm.DB, l Lease, d time.Duration) (moved bool, err error)
}

// Kit is the TestKit's statements, the same SQL on every database but for
// the expression of an earlier time. A backend embeds it beside Common.
type Kit struct {
	d       Dialect
	tables  Tables
	earlier func(col string) string
}

// NewKit returns the Kit of d for tables t. earlier is an SQL expression
// for col, a timestamp column, moved back by its one argument, a number of
// microseconds.
func NewKit(d Dialect, t Tables, earlier func(col string) string) Kit {
	return Kit{d: d, tables: t, earlier: earlier}
}

// SeizeLease gives l's lease to a.Holder under a.Token, whether or not it
// is live, in one statement on the row that still carries l's token and
// generation.
func (k *Kit) SeizeLease(ctx context.Context, db *gorm.DB, l Lease, a AcquireArgs) (bool, error) {
	_, n, err := Exec(ctx, db, k.d.Rebind("UPDATE "+k.tables.Lease+" SET lease_token = ?, generation = generation + 1,"+
		" holder = ?, updated_at = "+k.d.Now+", acquired_at = "+k.d.Now+", released_at = NULL, failure = NULL,"+
		" end_cause = NULL, ended_by = NULL, timeout_ms = ?"+
		" WHERE target_id = ? AND lease_token = ? AND generation = ?"),
		a.Token.String(), a.Holder, TimeoutMillis(a.Timeout), l.TargetID, l.Token.String(), l.Generation)
	return n == 1, err
}

// Backdate moves the last heartbeat of l's own row back by d.
func (k *Kit) Backdate(ctx context.Context, db *gorm.DB, l Lease, d time.Duration) (bool, error) {
	_, n, err := Exec(ctx, db, k.d.Rebind("UPDATE "+k.tables.Lease+" SET updated_at = "+k.earlier("updated_at")+ownWhere),
		d.Microseconds(), l.TargetID, l.Token.String())
	return n == 1, err
}
