package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// heldMargin bounds how much of a lease's life may pass, on a loaded
// machine, between the moment a test knows its age and the refusal's read.
const heldMargin = 20 * time.Second

// requireHeld requires err to be a refusal by the lease of holder at
// generation on target, with at most most and at least most - heldMargin
// of its life left, and returns the HeldError.
func requireHeld(t *testing.T, err error, target, holder string, generation int64, most time.Duration) *gormlease.HeldError {
	t.Helper()
	require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
	var held *gormlease.HeldError
	require.ErrorAs(t, err, &held, "%v", err)
	assert.Equal(t, target, held.Target, "target")
	assert.Equal(t, holder, held.Holder, "holder")
	assert.Equal(t, generation, held.Generation, "generation")
	// The databases' timestamps round to a microsecond (SQLite's to a
	// millisecond): allow for one.
	assert.LessOrEqual(t, held.ExpiresIn, most+time.Millisecond, "expires in")
	assert.Greater(t, held.ExpiresIn, most-heldMargin, "expires in")
	assert.Greater(t, held.ExpiresIn, time.Duration(0), "expires in")
	return held
}

// holderRepository is a Repository on db whose leases record holder.
func holderRepository(t testing.TB, db *gorm.DB, holder string) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder(holder))
	require.NoError(t, err)
	return repo
}

// A refused Acquire, AcquireFrom and Run say who holds the lease, at which
// generation, and how long it lives without another heartbeat, measured on
// the database's clock: a row aged by d has d less to live. The refusals
// write nothing, and read the lease with the statements that refuse.
func TestHeldError_RefusalSaysWhoHolds(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		const timeout = time.Minute
		holder := holderRepository(t, db, "pod-a")
		rec, st := recording(db)
		other, err := gormlease.NewRepository(rec, gormlease.WithHolder("pod-b"))
		require.NoError(t, err)
		target, l := acquireNew(t, holder, timeout)
		before := leaseRow(t, db, target)
		st.take()

		_, err = other.Acquire(ctx, target, timeout)
		held := requireHeld(t, err, target, "pod-a", l.Generation, timeout)
		assert.Len(t, steps(st), refusalStatements[flavour(s)], "statements of a refused Acquire")
		assert.Contains(t, held.Error(), `"pod-a"`)

		// Refused again (a caller that retries, a contended target).
		_, err = other.Acquire(ctx, target, timeout)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)
		assert.Len(t, steps(st), refusedAgainStatements[flavour(s)], "statements of an Acquire refused again")

		_, err = gormlease.AcquireFrom(other, ctx, target, timeout, l.Generation)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)
		assert.Len(t, steps(st), refusalFromStatements[flavour(s)], "statements of a refused AcquireFrom")

		_, err = newRunner(t, rec, gormlease.WithHolder("pod-c")).Run(ctx, target,
			func(context.Context) (string, error) { t.Error("work ran"); return "", nil }, noSave(t))
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)
		assert.Len(t, steps(st), refusalStatements[flavour(s)], "statements of a refused Run")

		// A lease 20s into its minute has 40s left, whoever asks, whatever
		// the asker's own timeout.
		age(t, s, db, target, 20*time.Second)
		aged := leaseRow(t, db, target)
		_, err = other.Acquire(ctx, target, 2*timeout)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout-20*time.Second)
		_, err = gormlease.AcquireFrom(other, ctx, target, time.Second, l.Generation)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout-20*time.Second)

		after := leaseRow(t, db, target)
		assert.Equal(t, aged, after, "the refusals wrote to the row")
		assert.Equal(t, before.LeaseToken, after.LeaseToken)
		assert.Equal(t, before.Generation, after.Generation)
	})
}

// An AcquireFrom a generation above 0 on a target without a row refuses
// and makes no row, on every database: the generation it waited for is
// gone, and the caller must look again rather than start a new one. For
// generation 0 it makes the row.
func TestAcquireFrom_MakesNoRowForAGenerationAboveZero(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo := holderRepository(t, db, "pod-a")
		target := newTarget(t)

		_, err := gormlease.AcquireFrom(repo, ctx, target, time.Minute, 3)
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
		assert.Zero(t, countRows(t, db, &gormlease.JobLease{}, target), "rows made")

		l, err := gormlease.AcquireFrom(repo, ctx, target, time.Minute, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(1), countRows(t, db, &gormlease.JobLease{}, target), "rows made")
		require.NoError(t, repo.Release(ctx, l))
	})
}

// steps returns the statements that st recorded since the last take, but
// for the one probe by which a Repository on MySQL finds out, on its first
// acquire, what its server is: MariaDB, with RETURNING, or a Galera node.
func steps(st *statements) []string {
	var out []string
	for _, sql := range st.take() {
		if !strings.HasPrefix(sql, "SHOW VARIABLES") {
			out = append(out, sql)
		}
	}
	return out
}

// refusalStatements is how many statements an acquire refused by a live
// lease runs on each database (see flavour), the read of that lease
// included: on PostgreSQL and MariaDB one, which answers the lease; on
// MySQL the UPDATE and the read of the lease; on SQLite the acquire and, in
// the process, the read.
var refusalStatements = map[string]int{"postgres": 1, "mariadb": 1, "mysql": 2, "sqlite": 2}

// refusedAgainStatements is refusalStatements for an acquire by the same
// Repository of a target whose last acquire it saw refused: on MySQL the
// read of the lease alone, which finds it still live.
var refusedAgainStatements = map[string]int{"postgres": 1, "mariadb": 1, "mysql": 1, "sqlite": 2}

// refusalFromStatements is refusalStatements for AcquireFrom: on
// PostgreSQL one statement, which takes over or answers the lease; on
// MariaDB, as on MySQL, the UPDATE and the read of the lease (an acquire
// from a generation must make no row, which MariaDB's upsert cannot
// promise).
var refusalFromStatements = map[string]int{"postgres": 1, "mariadb": 2, "mysql": 2, "sqlite": 2}

// flavour is the name of s's database as the statements differ: s.Name,
// but "mariadb" for a MariaDB server, whose acquire has RETURNING.
func flavour(s *testdb.Server) string {
	if s.Name == "mysql" && strings.Contains(s.Version, "MariaDB") {
		return "mariadb"
	}
	return s.Name
}

// RunWait, Do and Elector.Lead whose context ends while they wait for a
// live lease return an error that matches the context's, and a HeldError
// that says which lease they waited for.
func TestHeldError_WaitEndsWithContext(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const timeout = time.Minute
		holder := holderRepository(t, db, "pod-a")
		target, l := acquireNew(t, holder, timeout)
		r := newRunner(t, db, gormlease.WithHolder("pod-b"), gormlease.WithHeartbeatInterval(100*time.Millisecond),
			gormlease.WithLeaseTimeout(timeout))
		work := func(context.Context) (string, error) { t.Error("work ran"); return "", nil }
		waitCtx := func() context.Context {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}

		_, err := r.RunWait(waitCtx(), target, work, noSave(t))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)

		_, _, err = r.Do(waitCtx(), target, work, noSave(t), func(*gorm.DB) (string, error) {
			t.Error("load ran")
			return "", nil
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)

		e, err := gormlease.NewElector(db, target, gormlease.WithHolder("pod-c"), gormlease.WithLeaseTimeout(timeout))
		require.NoError(t, err)
		err = e.Lead(waitCtx(), func(context.Context) error { t.Error("led"); return nil })
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireHeld(t, err, target, "pod-a", l.Generation, timeout)
	})
}

// With slots, a refusal describes the slot that frees first: the one whose
// lease has the least life left.
func TestHeldError_SlotsTellTheFirstToFree(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		const n, timeout = 2, time.Minute
		target := newTarget(t)
		a, err := holderRepository(t, db, "pod-a").AcquireSlot(ctx, target, n, timeout)
		require.NoError(t, err)
		b, err := holderRepository(t, db, "pod-b").AcquireSlot(ctx, target, n, timeout)
		require.NoError(t, err)
		// b's slot is older: it frees first.
		age(t, s, db, fmt.Sprintf("%s\x1f%d", target, b.Slot), 30*time.Second)

		_, err = holderRepository(t, db, "pod-c").AcquireSlot(ctx, target, n, timeout)
		requireHeld(t, err, target, "pod-b", b.Generation, timeout-30*time.Second)

		r := newRunner(t, db, gormlease.WithHolder("pod-c"), gormlease.WithSlots(n), gormlease.WithLeaseTimeout(timeout))
		work := func(context.Context) (string, error) { t.Error("work ran"); return "", nil }
		_, err = r.Run(ctx, target, work, noSave(t))
		requireHeld(t, err, target, "pod-b", b.Generation, timeout-30*time.Second)

		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err = r.RunWait(wctx, target, work, noSave(t))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireHeld(t, err, target, "pod-b", b.Generation, timeout-30*time.Second)
		assert.NotEqual(t, a.Slot, b.Slot)
	})
}

// A HeldError reads as an answer to a person: the target, the holder, the
// generation and the time left, and it matches ErrLeaseHeld.
func TestHeldError_Message(t *testing.T) {
	t.Parallel()
	err := &gormlease.HeldError{Target: "report-42", Holder: "pod-a", Generation: 7, ExpiresIn: 40*time.Second + 123456*time.Microsecond}
	assert.Equal(t, `gormlease: lease on "report-42" held by "pod-a" (generation 7), expires in 40.123s`, err.Error())
	assert.True(t, errors.Is(err, gormlease.ErrLeaseHeld))
	err.Holder = ""
	assert.Equal(t, `gormlease: lease on "report-42" held (generation 7), expires in 40.123s`, err.Error())
}
