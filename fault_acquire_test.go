package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: the connection is cut after the acquire statement reached the
// database, so the lease was taken but the answer is lost. The acquire must
// not leave the target held by a token that no one knows until the lease
// times out: it releases that token's lease, and, the database being
// reachable again, tries once more under a new token, which takes the
// target. The work runs once, under the generation after the orphan's.
func TestFault_AcquireAnswerLost(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	r := newRunner(t, s.OpenVia(t, proxy.Addr()), gormlease.WithOperationTimeout(5*time.Second))
	target := "aa-" + uuid.NewString()
	// The target's row exists, released, so that the acquire is the one
	// statement that takes it over.
	repo := newRepository(t, direct)
	l, err := repo.Acquire(context.Background(), target, time.Minute)
	require.NoError(t, err)
	require.NoError(t, repo.Release(context.Background(), l))

	// The first message that carries the target is the acquire's Bind and
	// Execute: let it through, lose the answer, and cut the connection once
	// the lease is in the table.
	tripped := proxy.BlackholeOn(target, true)
	go func() {
		<-tripped
		pollRow(direct, target, "released_at IS NULL")
		proxy.Cut()
		proxy.Restore()
	}()
	runs := 0
	var gen int64
	got, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		runs++
		lease, _ := gormlease.LeaseFromContext(ctx)
		gen = lease.Generation
		return "taken", nil
	}, gormlease.SaveJSON[string])
	recv(t, tripped, time.Second, "the acquire to trip the proxy")
	require.NoError(t, err, "the acquire did not try again once the database was back")
	assert.Equal(t, "taken", got)
	assert.Equal(t, 1, runs)
	// The lost acquire took generation l+1 under its own token and released
	// it; the second took the next one.
	assert.Equal(t, l.Generation+2, gen, "the orphaned lease was not released before the acquire tried again")
}

// Fault: the acquire's answer is lost, and the database stays out of reach
// long enough that the acquire's release of the lease it may have taken
// fails too. Once the database is back, the acquire, tried again under a
// new token, is refused: the lost attempt holds the target. That lease is
// the Run's own (its token is the Run's alone), and Run takes it: the work
// runs once, under the lost attempt's generation, and saves.
func TestFault_AcquireAnswerLostAndReleaseToo(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	r := newRunner(t, s.OpenVia(t, proxy.Addr()), gormlease.WithOperationTimeout(time.Second),
		gormlease.WithHeartbeatInterval(time.Second), gormlease.WithLeaseTimeout(20*time.Second),
		gormlease.WithReconnectWindow(15*time.Second))
	target := "ab-" + uuid.NewString()
	repo := newRepository(t, direct)
	l, err := repo.Acquire(context.Background(), target, time.Minute)
	require.NoError(t, err)
	require.NoError(t, repo.Release(context.Background(), l))

	// The acquire reaches the database, and nothing comes back: every
	// connection through the proxy is cut every 100 ms for 3 s, well past
	// the attempt's timeout (1 s) and its release.
	tripped := proxy.BlackholeOn(target, true)
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		<-tripped
		pollRow(direct, target, "released_at IS NULL")
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
			proxy.Cut()
			time.Sleep(100 * time.Millisecond) // the outage's pace, not a synchronisation
		}
		proxy.Restore()
	}()
	runs := 0
	var gen int64
	_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		runs++
		lease, _ := gormlease.LeaseFromContext(ctx)
		gen = lease.Generation
		return "taken", nil
	}, gormlease.SaveJSON[string])
	recv(t, healed, 10*time.Second, "the outage to end")
	require.NoError(t, err, "the lease that the lost acquire took was not taken as the Run's")
	assert.Equal(t, 1, runs)
	assert.Equal(t, l.Generation+1, gen, "the work did not run under the lost acquire's generation")
	row := leaseRow(t, direct, target)
	require.NotNil(t, row.SavedGeneration)
	assert.Equal(t, l.Generation+1, *row.SavedGeneration)
	assert.NotNil(t, row.ReleasedAt, "lease not released")
}

// Fault: another session holds the lease row's lock past the server's own
// lock timeout (PostgreSQL's lock_timeout, InnoDB's lock wait timeout), so
// the acquire's statement is ended by the server. That is no error that
// waiting cannot cure: the acquire tries again, and takes the lease once the
// lock is gone.
func TestFault_AcquireOutlastsServerLockTimeout(t *testing.T) {
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		params, hold := map[string]string{"lock_timeout": "50ms"}, 400*time.Millisecond
		if s.Name == "mysql" {
			params, hold = map[string]string{"innodb_lock_wait_timeout": "1"}, 1500*time.Millisecond
		}
		repo := newRepository(t, s.Open(t, params))
		target := newTarget(t)
		l, err := repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err)
		require.NoError(t, repo.Release(context.Background(), l))

		// Another session locks the released row, and keeps it past the
		// lock timeout of the acquire's session.
		locked := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- db.Transaction(func(tx *gorm.DB) error {
				var generation int64
				if err := tx.Raw("SELECT generation FROM job_lease WHERE target_id = ? FOR UPDATE", target).Scan(&generation).Error; err != nil {
					return err
				}
				close(locked)
				time.Sleep(hold) // the lock held: the scenario, not a wait for an event
				return nil
			})
		}()
		select {
		case <-locked:
		case err := <-done:
			t.Fatalf("lock the row: %v", err)
		}
		began := time.Now()
		l, err = repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err, "the acquire gave up on the server's lock timeout")
		require.NoError(t, <-done)
		assert.Greater(t, time.Since(began), hold/2, "the acquire did not wait for the lock")
		require.NoError(t, repo.Release(context.Background(), l))
	})
}
