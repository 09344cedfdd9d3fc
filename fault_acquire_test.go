package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Fault: the connection is cut after the acquire statement reached the
// database, so the lease was taken but the answer is lost. Run fails, but it
// must not leave the target held by a token that no one knows until the
// lease times out: a Run right after takes the target.
func TestFault_AcquireAnswerLost(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	r := newRunner(t, s.OpenVia(t, proxy.Addr()), gormlease.WithOperationTimeout(2*time.Second))
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
	_, err = r.Run(context.Background(), target, func(context.Context) (string, error) {
		t.Error("work ran although the acquire failed")
		return "", nil
	}, noSave(t))
	require.Error(t, err)
	assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
	recv(t, tripped, time.Second, "the acquire to trip the proxy")
	row := leaseRow(t, direct, target) // the acquire did reach the database
	assert.NotNil(t, row.ReleasedAt, "the orphaned lease was left held")

	got, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
		return "taken", nil
	}, gormlease.SaveJSON[string])
	require.NoError(t, err, "the target stayed held after a failed acquire")
	assert.Equal(t, "taken", got)
}
