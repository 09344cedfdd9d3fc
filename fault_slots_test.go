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

// liveSlots counts target's slot rows that are held, unreleased.
func liveSlots(db *gorm.DB, target string) int64 {
	var n int64
	db.Model(&gormlease.JobLease{}).Where("target_id LIKE ? AND released_at IS NULL", target+"\x1f%").Count(&n)
	return n
}

// slotsFault runs a Run with WithSlots(3) through a proxy whose connections
// are cut, from the moment its acquire of a slot reached the database, for
// outage: the answer of that acquire is lost. It returns how often the work
// ran, the target, and Run's error.
func slotsFault(t *testing.T, outage time.Duration) (runs int, target string, err error) {
	t.Helper()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	r := newRunner(t, s.OpenVia(t, proxy.Addr()), gormlease.WithSlots(3), gormlease.WithOperationTimeout(time.Second),
		gormlease.WithHeartbeatInterval(time.Second), gormlease.WithLeaseTimeout(20*time.Second),
		gormlease.WithReconnectWindow(15*time.Second))
	target = "as-" + uuid.NewString()
	// The slot rows exist, released, so that the Run's first statement is
	// the one that takes a slot.
	repo := newRepository(t, direct)
	l, err := repo.AcquireSlot(context.Background(), target, 3, time.Minute)
	require.NoError(t, err)
	require.NoError(t, repo.Release(context.Background(), l))

	tripped := proxy.BlackholeOn(target, true)
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		<-tripped
		waitFor(t, 5*time.Second, "the lost acquire's slot", func() bool { return liveSlots(direct, target) == 1 })
		for end := time.Now().Add(outage); ; {
			proxy.Cut()
			if time.Now().After(end) {
				break
			}
			time.Sleep(100 * time.Millisecond) // the outage's pace, not a synchronisation
		}
		proxy.Restore()
	}()
	_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		runs++
		return "taken", nil
	}, gormlease.SaveJSON[string])
	recv(t, tripped, 5*time.Second, "the acquire to trip the proxy")
	recv(t, healed, 20*time.Second, "the outage to end")
	return runs, target, err
}

// Fault: a Run with WithSlots loses its acquire's answer, and the database
// is out of reach for a moment. As a Run without slots, it tries the
// acquire again within the reconnect window, and runs the work once.
func TestFault_SlotAcquireAnswerLost(t *testing.T) {
	t.Parallel()
	runs, target, err := slotsFault(t, 0)
	require.NoError(t, err, "the slot acquire was not tried again once the database was back")
	assert.Equal(t, 1, runs)
	assert.Zero(t, liveSlots(testdb.Postgres(t).DB(t), target), "a slot left held")
}

// Fault: as above, and the outage outlasts the release of the slot that
// the lost acquire took. That slot is the Run's (its token is the Run's
// alone): Run takes it rather than a second slot, which would leave the
// first held until it timed out, and runs the work once.
func TestFault_SlotAcquireAnswerLostAndReleaseToo(t *testing.T) {
	t.Parallel()
	runs, target, err := slotsFault(t, 3*time.Second)
	require.NoError(t, err, "the slot acquire was not tried again once the database was back")
	assert.Equal(t, 1, runs)
	assert.Zero(t, liveSlots(testdb.Postgres(t).DB(t), target), "a slot left held: the lost acquire's was not taken as the Run's")
}
