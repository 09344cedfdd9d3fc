// Package leasetest helps test code that uses gormlease, in the spirit of
// net/http/httptest: it occupies targets, takes leases over and expires
// them the way other processes would, and reads a target's state, so that a test can check what
// its own code does when a lease is held, taken over or lost, without
// writing SQL against the lease table's columns.
//
// Every helper takes a testing.TB, the *gorm.DB of the code under test, and
// gormlease.WithTableNames when that code uses other tables than the
// default ones (a gormlease.TableOption, as AutoMigrate takes). It works on
// PostgreSQL, MySQL/MariaDB and SQLite, and fails the test with t.Fatalf, saying what it was doing, on a
// database error. The leases it takes are released when the test ends.
//
// To test the self-fencing path (the work cancelled with ErrLeaseLost
// before its lease could expire) without cutting a network, give the Runner
// under test a heartbeat pool of its own with gormlease.WithHeartbeatDB and
// close that pool during the work: its heartbeats then fail, and the Runner
// stops trusting its lease after the lease timeout less the safety margin.
// The package example shows it.
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/choose"
)

// Holder is the holder name that the leases of this package carry.
const Holder = "leasetest"

// OccupyTimeout is the lease timeout that Occupy and TakeOver record: long
// enough that the lease stays live for any test, until it is released or
// expired with Expire.
const OccupyTimeout = time.Hour

// opTimeout bounds each database call of a helper.
const opTimeout = 30 * time.Second

// repository returns a Repository on db with tables, failing t.
func repository(t testing.TB, db *gorm.DB, what string, tables []gormlease.TableOption) *gormlease.Repository {
	t.Helper()
	opts := []gormlease.RepositoryOption{gormlease.WithHolder(Holder)}
	for _, o := range tables {
		opts = append(opts, o)
	}
	r, err := gormlease.NewRepository(db, opts...)
	if err != nil {
		t.Fatalf("leasetest.%s: %v", what, err)
	}
	return r
}

// releaseAtCleanup releases l at t's cleanup, unless the returned func
// released it first. A lease that is gone by then (taken over by the code
// under test, or expired and acquired again) is not an error.
func releaseAtCleanup(t testing.TB, repo *gormlease.Repository, l gormlease.Lease, what string) func() {
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := repo.Release(ctx, l); err != nil && !errors.Is(err, gormlease.ErrLeaseLost) {
			t.Errorf("leasetest.%s: release %q: %v", what, l.TargetID, err)
		}
	}
	t.Cleanup(release)
	return release
}

// Occupy takes targetID's lease as another process would, a stranger to
// the code under test, so that the code sees ErrLeaseHeld (Run) or waits
// (RunWait, Do). It is released at the test's cleanup, unless
// released earlier with the returned func. The lease is never renewed: it
// stays live for OccupyTimeout. Occupy fails the test when the target is
// held already.
func Occupy(t testing.TB, db *gorm.DB, targetID string, opts ...gormlease.TableOption) (gormlease.Lease, func()) {
	t.Helper()
	repo := repository(t, db, "Occupy", opts)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	l, err := repo.Acquire(ctx, targetID, OccupyTimeout)
	switch {
	case errors.Is(err, gormlease.ErrLeaseHeld):
		t.Fatalf("leasetest.Occupy(%q): the target is held already: %s", targetID, describe(ctx, repo, targetID))
	case err != nil:
		t.Fatalf("leasetest.Occupy(%q): %v", targetID, err)
	}
	return l, releaseAtCleanup(t, repo, l, "Occupy")
}

// TakeOver takes targetID's lease over as a new holder would after a
// takeover, whatever its age: new token, generation + 1, live for
// OccupyTimeout. The current holder's next heartbeat finds its lease lost
// (its work is cancelled with ErrLeaseLost) and its save is refused. The
// new lease is released at the test's cleanup. A target that has no lease
// row, or a released or expired one, is simply acquired.
func TakeOver(t testing.TB, db *gorm.DB, targetID string, opts ...gormlease.TableOption) gormlease.Lease {
	t.Helper()
	repo := repository(t, db, "TakeOver", opts)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	for {
		l, err := repo.Acquire(ctx, targetID, OccupyTimeout)
		if err == nil {
			releaseAtCleanup(t, repo, l, "TakeOver")
			return l
		}
		if !errors.Is(err, gormlease.ErrLeaseHeld) {
			t.Fatalf("leasetest.TakeOver(%q): %v", targetID, err)
		}
		row, found, err := admin.New(repo).Get(ctx, targetID)
		if err != nil {
			t.Fatalf("leasetest.TakeOver(%q): %v", targetID, err)
		}
		if !found {
			continue // pruned meanwhile: acquire it
		}
		// The live lease's row, as read, gets a new token and the next
		// generation; a change since the read (a release, a takeover)
		// makes it try again.
		token := uuid.New()
		seized, err := kit(t, db, repo, "TakeOver").SeizeLease(ctx, db,
			backend.Lease{TargetID: targetID, Token: row.LeaseToken, Generation: row.Generation},
			backend.AcquireArgs{Token: token, Holder: Holder, Timeout: OccupyTimeout})
		if err != nil {
			t.Fatalf("leasetest.TakeOver(%q): %v", targetID, err)
		}
		if seized {
			l := gormlease.Lease{TargetID: targetID, Token: token, Generation: row.Generation + 1}
			releaseAtCleanup(t, repo, l, "TakeOver")
			return l
		}
	}
}

// Expire makes targetID's current lease expired on the database's clock, as
// if its holder had stopped heartbeating a lease timeout ago, so that the
// next Run takes it over. A holder that is still running renews the lease at
// its next heartbeat, as it would after a pause; Expire is for a holder that
// is gone, or frozen (Occupy's, for one). It fails the test when the target
// has no lease, or a released one.
func Expire(t testing.TB, db *gorm.DB, targetID string, opts ...gormlease.TableOption) {
	t.Helper()
	repo := repository(t, db, "Expire", opts)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	info, ok := stateOf(ctx, t, repo, targetID, "Expire")
	switch {
	case !ok:
		t.Fatalf("leasetest.Expire(%q): the target has no lease row", targetID)
	case info.State == admin.StateReleased:
		t.Fatalf("leasetest.Expire(%q): the lease is released already", targetID)
	}
	timeout := info.Timeout
	if timeout <= 0 {
		timeout = OccupyTimeout
	}
	// The last heartbeat, moved back past the recorded timeout, on the
	// database's own time as the row holds it.
	moved, err := kit(t, db, repo, "Expire").Backdate(ctx, db,
		backend.Lease{TargetID: targetID, Token: info.Row.LeaseToken}, timeout+time.Second)
	if err != nil {
		t.Fatalf("leasetest.Expire(%q): %v", targetID, err)
	}
	if !moved {
		t.Fatalf("leasetest.Expire(%q): the lease changed meanwhile: %s", targetID, describe(ctx, repo, targetID))
	}
}

// State returns targetID's row as admin.Operator.List reports it: the row
// (Row), its state and ages on the database's clock, and whether it is
// paused (Paused, PauseReason) or its holder asked to stop (StopRequested,
// StopReason); ok is false when there is none.
func State(t testing.TB, db *gorm.DB, targetID string, opts ...gormlease.TableOption) (info admin.LeaseInfo, ok bool) {
	t.Helper()
	repo := repository(t, db, "State", opts)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return stateOf(ctx, t, repo, targetID, "State")
}

// WaitFor returns once targetID's state is state (live, expired or
// released), and fails the test when it is not within timeout. It polls
// every 10ms.
func WaitFor(t testing.TB, db *gorm.DB, targetID string, state admin.LeaseState,
	timeout time.Duration, opts ...gormlease.TableOption,
) admin.LeaseInfo {
	t.Helper()
	switch state {
	case admin.StateLive, admin.StateExpired, admin.StateReleased:
	default:
		t.Fatalf("leasetest.WaitFor(%q): state %q is not live, expired or released", targetID, state)
	}
	repo := repository(t, db, "WaitFor", opts)
	deadline := time.Now().Add(timeout)
	last := "no lease row"
	for {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		info, ok := stateOf(ctx, t, repo, targetID, "WaitFor")
		cancel()
		if ok && info.State == state {
			return info
		}
		if ok {
			last = fmt.Sprintf("%s (generation %d, holder %q)", info.State, info.Row.Generation, info.Row.Holder)
		}
		if time.Now().After(deadline) {
			t.Fatalf("leasetest.WaitFor(%q): not %s within %v; last seen: %s", targetID, state, timeout, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stateOf reads targetID's row with admin.Operator.List: the first row whose ID starts
// with targetID is targetID's own, when it has one.
func stateOf(ctx context.Context, t testing.TB, repo *gormlease.Repository, targetID, what string) (admin.LeaseInfo, bool) {
	t.Helper()
	rows, err := admin.New(repo).List(ctx, admin.ListOptions{Prefix: targetID, Limit: 1})
	if err != nil {
		t.Fatalf("leasetest.%s(%q): %v", what, targetID, err)
	}
	if len(rows) == 0 || rows[0].Key != targetID {
		return admin.LeaseInfo{}, false
	}
	return rows[0], true
}

// describe says who holds targetID, for a failure message.
func describe(ctx context.Context, repo *gormlease.Repository, targetID string) string {
	rows, err := admin.New(repo).List(ctx, admin.ListOptions{Prefix: targetID, Limit: 1})
	if err != nil || len(rows) == 0 || rows[0].Key != targetID {
		return "its row could not be read"
	}
	r := rows[0]
	return fmt.Sprintf("%s by %q, generation %d, expires in %v", r.State, r.Row.Holder, r.Row.Generation, r.ExpiresIn.Round(time.Millisecond))
}

// kit returns the test kit's statements on db, for repo's tables: what
// other processes, or the passing of time, do to a lease row, which the
// Repository's steps never do (see backend.TestKit).
func kit(t testing.TB, db *gorm.DB, repo *gormlease.Repository, what string) backend.TestKit {
	t.Helper()
	lease, result := repo.Tables()
	k, ok := choose.TestKitFor(db.Dialector.Name(), backend.Tables{Lease: lease, Result: result})
	if !ok {
		t.Fatalf("leasetest.%s: unsupported database %q", what, db.Dialector.Name())
	}
	return k
}
