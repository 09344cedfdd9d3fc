package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The TestPacket_ tests run real network faults: a PostgreSQL and a MariaDB
// of the test process's own run in a network namespace (testdb.Netns),
// reached over veth pairs on which iptables rules drop packets, all of
// them (a partition) or a random share; latency is added by the project's
// proxy, which delays bytes without closing anything. Unlike a proxy that
// closes sockets, a dropped packet shows the client no error: a statement
// hangs until its timeout, and the holder has to notice on its own.

// eachNetServer runs fn as a parallel subtest on the namespace's PostgreSQL
// and MariaDB.
func eachNetServer(t *testing.T, fn func(t *testing.T, ns *testdb.Netns, s *testdb.NetServer)) {
	t.Helper()
	ns := testdb.SharedNetns(t)
	for _, start := range []func(testing.TB) *testdb.NetServer{ns.Postgres, ns.MariaDB} {
		s := start(t)
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, ns, s)
		})
	}
}

// rowAndClock reads target's lease row and then the clock of s, the one
// that judges expiry. It returns an error rather than failing t, for the
// goroutines that are not the test's.
func rowAndClock(s *testdb.NetServer, db *gorm.DB, target string) (gormlease.JobLease, time.Time, error) {
	var row gormlease.JobLease
	if err := db.Where("target_id = ?", target).Take(&row).Error; err != nil {
		return row, time.Time{}, err
	}
	q := "SELECT clock_timestamp()"
	if s.Name == "mysql" {
		q = "SELECT UTC_TIMESTAMP(6)"
	}
	var now time.Time
	err := db.Raw(q).Scan(&now).Error
	return row, now, err
}

// expiry is when row's lease expires on the database's clock: its last
// heartbeat plus the timeout its holder recorded.
func expiry(row gormlease.JobLease) time.Time {
	return row.UpdatedAt.Add(time.Duration(*row.TimeoutMS) * time.Millisecond)
}

// libraryError reports whether err is one of gormlease's own errors: a
// sentinel, or a step of the library wrapping its cause ("gormlease: ...").
func libraryError(err error) bool {
	for _, named := range []error{gormlease.ErrLeaseLost, gormlease.ErrCommitUnknown, gormlease.ErrLeaseHeld} {
		if errors.Is(err, named) {
			return true
		}
	}
	return strings.HasPrefix(err.Error(), "gormlease: ")
}

// packetSave is one fenced commit's save, recorded by the saver in the
// commit's own transaction, with the generation of the lease row that the
// commit locked.
type packetSave struct {
	ID            int64  `gorm:"primaryKey;autoIncrement"`
	TargetID      string `gorm:"size:255;index"`
	Generation    int64
	RowGeneration int64
}

// recordSave is a saver that records the save in packetSave.
func recordSave(tx *gorm.DB, _ string) error {
	l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
	var rowGen int64
	if err := tx.Raw("SELECT generation FROM job_lease WHERE target_id = ?", l.TargetID).Scan(&rowGen).Error; err != nil {
		return err
	}
	return tx.Create(&packetSave{TargetID: l.TargetID, Generation: l.Generation, RowGeneration: rowGen}).Error
}

// checkSaves asserts that every save of targets was made by the generation
// that held the row, and that no generation saved twice; it returns the
// number of saves.
func checkSaves(t *testing.T, db *gorm.DB, targets []string) int {
	t.Helper()
	var saves []packetSave
	require.NoError(t, db.Where("target_id IN ?", targets).Find(&saves).Error)
	seen := map[string]bool{}
	for _, s := range saves {
		key := fmt.Sprintf("%s/%d", s.TargetID, s.Generation)
		assert.False(t, seen[key], "generation %d of %s saved twice", s.Generation, s.TargetID)
		seen[key] = true
		assert.Equal(t, s.Generation, s.RowGeneration, "%s: generation %d saved while the row was at another", s.TargetID, s.Generation)
	}
	return len(saves)
}

// recoverRuns waits until a Run of r on a new target succeeds, once a fault has
// ended, and returns how long that took. Runs that fail meanwhile must fail
// with errors of the library's.
func recoverRuns(t *testing.T, r *gormlease.Runner[string]) time.Duration {
	t.Helper()
	healed := time.Now()
	waitFor(t, 20*time.Second, "a Run to succeed after the fault ended", func() bool {
		_, err := r.Run(context.Background(), newTarget(t), func(context.Context) (string, error) {
			return "back", nil
		}, recordSave)
		if err != nil && !libraryError(err) {
			t.Errorf("not an error of the library's: %v", err)
		}
		return err == nil
	})
	return time.Since(healed)
}

// TestPacket_Latency: 200 ms added each way (400 ms to every round trip)
// between the Runner and the database, by delaying bytes in the proxy.
// Runs whose work outlasts the lease timeout keep their leases by
// heartbeats (a contender that comes later is refused) and save once.
func TestPacket_Latency(t *testing.T) {
	t.Parallel()
	eachNetServer(t, func(t *testing.T, ns *testdb.Netns, s *testdb.NetServer) {
		link := ns.NewLink(t)
		observer := s.Open(t, s.Addr(link))
		require.NoError(t, observer.AutoMigrate(&packetSave{}))
		proxy := testdb.NewProxy(t, s.Addr(link))
		proxy.SetDelay(200*time.Millisecond, 200*time.Millisecond)
		// Each statement takes two round trips (prepare, then execute), and
		// a new connection more: 1.2 s or so before the first heartbeat
		// lands on a new connection, 4 s for the fenced commit with this
		// saver on MariaDB. The timeouts leave room for that.
		const timeout = 5 * time.Second
		opts := []gormlease.Option{gormlease.WithHeartbeatInterval(time.Second),
			gormlease.WithLeaseTimeout(timeout), gormlease.WithOperationTimeout(8 * time.Second)}
		r := newRunner(t, s.Open(t, proxy.Addr()), opts...)
		contender := newRunner(t, s.Open(t, proxy.Addr()), opts...)

		const runs = 4
		var targets []string
		results := make([]<-chan runResult[string], runs)
		refused := make(chan error, runs)
		start := time.Now()
		for i := range runs {
			target := newTarget(t)
			targets = append(targets, target)
			results[i] = goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
				// Past the lease timeout: only heartbeats keep the lease.
				select {
				case <-ctx.Done():
					return "", context.Cause(ctx)
				case <-time.After(timeout + 500*time.Millisecond):
				}
				_, err := contender.Run(context.Background(), target, func(context.Context) (string, error) {
					return "contender", nil
				}, noSave(t))
				refused <- err
				return "done", nil
			}, recordSave)
		}
		for i := range runs {
			res := recv(t, results[i], 30*time.Second, "a Run under latency")
			require.NoError(t, res.Err)
			assert.ErrorIs(t, recv(t, refused, time.Second, "the contender"), gormlease.ErrLeaseHeld)
		}
		assert.Equal(t, runs, checkSaves(t, observer, targets))
		t.Logf("%s, 400 ms added per round trip: %d Runs of %v work each, all saved, in %v",
			s.Name, runs, timeout+500*time.Millisecond, time.Since(start).Round(10*time.Millisecond))
	})
}

// TestPacket_Loss: 5% and 30% of the packets dropped at random, each way,
// on the Runners' link, while Runs on a few targets run in loops. Every
// error is the library's; no generation saves twice or saves when the row
// has moved on; a Run that fences itself does so while its lease is still
// live on the database's clock (read over a clean link); and once the loss
// stops, a Run succeeds. Under 5% most Runs that get the lease save.
func TestPacket_Loss(t *testing.T) {
	t.Parallel()
	for _, loss := range []float64{0.05, 0.30} {
		t.Run(fmt.Sprintf("%.0f%%", loss*100), func(t *testing.T) {
			t.Parallel()
			eachNetServer(t, func(t *testing.T, ns *testdb.Netns, s *testdb.NetServer) {
				lossy, clean := ns.NewLink(t), ns.NewLink(t)
				observer := s.Open(t, s.Addr(clean))
				require.NoError(t, observer.AutoMigrate(&packetSave{}))
				const timeout = 2 * time.Second
				r := newRunner(t, s.Open(t, s.Addr(lossy)), gormlease.WithHeartbeatInterval(250*time.Millisecond),
					gormlease.WithLeaseTimeout(timeout), gormlease.WithOperationTimeout(time.Second))
				targets := []string{newTarget(t), newTarget(t)}
				lossy.Lose(t, loss)

				var mu sync.Mutex
				counts := map[string]int{}
				examples := map[string]string{}
				fences, minLeft := 0, time.Duration(0)
				count := func(outcome string, err error) {
					mu.Lock()
					counts[outcome]++
					if err != nil && examples[outcome] == "" {
						examples[outcome] = err.Error()
					}
					mu.Unlock()
				}
				work := func(ctx context.Context) (string, error) {
					select {
					case <-time.After(time.Second): // four heartbeats
						return "done", nil
					case <-ctx.Done():
					}
					// Fenced: the lease must still be live, if it is still
					// this Run's, on the database's clock.
					l, _ := gormlease.LeaseFromContext(ctx)
					row, now, err := rowAndClock(s, observer, l.TargetID)
					if err != nil {
						t.Errorf("read the lease at a fence: %v", err)
					} else if row.LeaseToken == l.Token {
						left := expiry(row).Sub(now)
						assert.Positive(t, left, "fenced after the lease expired")
						mu.Lock()
						if fences == 0 || left < minLeft {
							minLeft = left
						}
						fences++
						mu.Unlock()
					}
					return "", context.Cause(ctx)
				}
				var wg sync.WaitGroup
				deadline := time.Now().Add(6 * time.Second)
				for w := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(deadline) {
							_, err := r.Run(context.Background(), targets[w%len(targets)], work, recordSave)
							switch {
							case err == nil:
								count("saved", nil)
							case errors.Is(err, gormlease.ErrLeaseHeld):
								count("held", nil)
								time.Sleep(100 * time.Millisecond) // not a spin on a held target
							case errors.Is(err, gormlease.ErrLeaseLost):
								count("lost", err)
							case errors.Is(err, gormlease.ErrCommitUnknown):
								count("commit unknown", err)
							case libraryError(err):
								count("other library error", err)
							default:
								count("raw", err)
								t.Errorf("not an error of the library's: %v", err)
							}
						}
					}()
				}
				wg.Wait()
				saves := checkSaves(t, observer, targets)
				assert.LessOrEqual(t, saves, counts["saved"]+counts["commit unknown"], "saves that no Run reported")
				assert.GreaterOrEqual(t, saves, counts["saved"], "Runs that returned nil without a save")
				got := counts["saved"] + counts["lost"] + counts["commit unknown"] + counts["other library error"]
				if loss < 0.1 {
					assert.Greater(t, counts["saved"], got/2, "under %.0f%% loss most Runs should save: %v", loss*100, counts)
				}

				lossy.Heal(t)
				recovery := recoverRuns(t, r)
				t.Logf("%s, %.0f%% loss each way, 6 s of 4 Run loops on 2 targets: %v; %d self-fenced, the least time left before expiry at a fence %v; first Run after healing %v; errors such as %q",
					s.Name, loss*100, counts, fences, minLeft.Round(time.Millisecond), recovery.Round(time.Millisecond), examples)
			})
		})
	}
}

// TestPacket_Partition: the link to the database drops every packet, past
// the lease timeout, while a Run works (Partition), or only the link of the
// heartbeat pool does while the work's pool has a clean one
// (HeartbeatPathOnly). The holder sees no error, only silence. It must
// fence itself within its trust window, while its lease is still live on
// the database's clock; a contender with a shorter timeout cannot take the
// lease over before the holder's own timeout has passed since its last
// heartbeat; the holder's work, which ignores the cancellation and returns
// a result after the takeover, saves nothing, and the old Run leaves the
// new holder's lease alone (with a clean work link, its release really
// reaches the database, and only the token keeps it off the new lease);
// and after the link heals, the same Runner's next Run succeeds.
func TestPacket_Partition(t *testing.T) {
	t.Parallel()
	for _, hbOnly := range []bool{false, true} {
		name := "Partition"
		if hbOnly {
			name = "HeartbeatPathOnly"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachNetServer(t, func(t *testing.T, ns *testdb.Netns, s *testdb.NetServer) {
				partitionScenario(t, ns, s, hbOnly)
			})
		})
	}
}

func partitionScenario(t *testing.T, ns *testdb.Netns, s *testdb.NetServer, hbOnly bool) {
	workLink, clean := ns.NewLink(t), ns.NewLink(t)
	cut := workLink
	observer := s.Open(t, s.Addr(clean))
	require.NoError(t, observer.AutoMigrate(&packetSave{}))
	const (
		timeout  = 2 * time.Second
		interval = 200 * time.Millisecond
		margin   = 600 * time.Millisecond
		trust    = timeout - margin
		shorter  = 500 * time.Millisecond // the contender's own timeout
	)
	opts := []gormlease.Option{gormlease.WithHeartbeatInterval(interval), gormlease.WithLeaseTimeout(timeout),
		gormlease.WithSafetyMargin(margin), gormlease.WithOperationTimeout(400 * time.Millisecond)}
	if hbOnly {
		cut = ns.NewLink(t)
		opts = append(opts, gormlease.WithHeartbeatDB(s.Open(t, s.Addr(cut))))
	}
	r := newRunner(t, s.Open(t, s.Addr(workLink)), opts...)
	contender := newRepository(t, observer)
	target := newTarget(t)

	var fencedAfter, leftAtFence, takenAfter time.Duration
	var taken gormlease.Lease
	_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
		lease, _ := gormlease.LeaseFromContext(ctx)
		cut.Partition(t)
		select {
		case <-ctx.Done():
		case <-time.After(3 * timeout):
			t.Errorf("the work was not cancelled within %v of the partition", 3*timeout)
			return "", nil
		}
		// At the fence, on the database's clock, through the clean link.
		row, now, err := rowAndClock(s, observer, target)
		require.NoError(t, err)
		assert.Equal(t, lease.Token, row.LeaseToken, "the lease changed hands before the holder fenced")
		assert.ErrorIs(t, context.Cause(ctx), gormlease.ErrLeaseLost)
		fencedAfter, leftAtFence = now.Sub(row.UpdatedAt), expiry(row).Sub(now)
		assert.Positive(t, leftAtFence, "fenced %v after the last heartbeat, after the lease expired", fencedAfter)
		l, err := contender.Acquire(context.Background(), target, shorter)
		assert.ErrorIs(t, err, gormlease.ErrLeaseHeld, "taken over by the contender's own timeout, before the holder's")
		for taken = l; err != nil; {
			waitFor(t, 10*time.Second, "the takeover", func() bool {
				taken, err = contender.Acquire(context.Background(), target, shorter)
				return err == nil
			})
		}
		takenAfter = leaseRow(t, observer, target).UpdatedAt.Sub(row.UpdatedAt)
		assert.GreaterOrEqual(t, takenAfter, timeout, "taken over before the holder's own timeout")
		return "stale result", nil // ignores the cancellation
	}, recordSave)
	require.ErrorIs(t, err, gormlease.ErrLeaseLost)
	assert.Zero(t, checkSaves(t, observer, []string{target}), "the fenced holder saved")
	row := leaseRow(t, observer, target)
	assert.Equal(t, taken.Token, row.LeaseToken, "the new holder's token changed")
	assert.Nil(t, row.ReleasedAt, "the old Run released the new holder's lease")

	cut.Heal(t)
	recovery := recoverRuns(t, r)
	t.Logf("%s: fenced %v after the last heartbeat (trust window %v), %v before expiry; taken over %v after it (holder's timeout %v); first Run after healing %v",
		s.Name, fencedAfter.Round(time.Millisecond), trust, leftAtFence.Round(time.Millisecond),
		takenAfter.Round(time.Millisecond), timeout, recovery.Round(time.Millisecond))
}
