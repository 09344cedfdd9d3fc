package gormlease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/observe"
)

// The settings that govern a shared thing are read from where every party
// reads them: a lease's timeout from its row, not from the Runner that looks
// at it; a heartbeat batch's table from its own Repository.

// holdOnRunner starts a Run of r on target whose work signals started and
// then waits for release (or its context). It returns release, which is
// closed at the test's cleanup too, and Run's result; the cleanup waits for
// the Run to end, so that a test that fails early leaves nothing running.
func holdOnRunner(t *testing.T, r *gormlease.Runner[string], target, value string) (release func(), done <-chan runResult[string]) {
	t.Helper()
	started, stop := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(stop) }) }
	ch := goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
		close(started)
		select {
		case <-stop:
			return value, nil
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}, gormlease.SaveJSON[string])
	result := make(chan runResult[string], 1)
	ended := make(chan struct{})
	go func() {
		res := <-ch
		result <- res
		close(ended)
	}()
	t.Cleanup(func() {
		release()
		<-ended
	})
	select {
	case <-started:
	case <-ended:
		t.Fatalf("the holder's Run returned before its work started: %v", (<-result).Err)
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for the holder's work to start")
	}
	return release, result
}

// A rolling deploy: the holder runs with a 10s lease timeout and has not
// heartbeated for 1.5s; a Runner of the new version, with a 1s timeout,
// must not take the lease over, since the holder still trusts it. The
// newcomer gets ErrLeaseHeld without running its work, List reports the
// lease live, and the holder saves.
func TestRun_ShorterTimeoutDoesNotTakeOverALiveLease(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		// The holder's first heartbeat comes 3s after its acquire: the row
		// stays as aged below until then.
		holder := newRunner(t, db, fast(3*time.Second, 10*time.Second)...)
		release, done := holdOnRunner(t, holder, target, "from the holder")
		age(t, s, db, target, 1500*time.Millisecond)

		newcomer := newRunner(t, db, fast(200*time.Millisecond, time.Second)...)
		_, err := newcomer.Run(context.Background(), target, func(context.Context) (string, error) {
			t.Error("the newcomer ran its work while the holder's lease was live")
			return "", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		info, err := admin.New(holder.Repository()).List(context.Background(), admin.ListOptions{Prefix: target})
		require.NoError(t, err)
		require.Len(t, info, 1)
		assert.Equal(t, admin.StateLive, info[0].State, "List's state of the held lease")

		release()
		require.NoError(t, recv(t, done, 20*time.Second, "the holder's Run").Err)
		got, _, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "from the holder", got)
	})
}

// A holder that died with a 1s lease timeout is taken over by a Runner with
// a 30s timeout once the holder's own 1s has passed, not the newcomer's
// 30s; before then it is refused.
func TestRun_LongerTimeoutTakesOverAfterTheHoldersOwnTimeout(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target, dead := acquireNew(t, newRepository(t, db), time.Second)
		newcomer := newRunner(t, db, fast(time.Second, 30*time.Second)...)
		work := func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			assert.Equal(t, dead.Generation+1, l.Generation)
			return "from the newcomer", nil
		}

		// 0.5s old: live by the holder's 1s.
		age(t, s, db, target, 500*time.Millisecond)
		_, err := newcomer.Run(context.Background(), target, func(context.Context) (string, error) {
			t.Error("the newcomer ran while the holder's lease was live")
			return "", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		// 1.5s old: expired by the holder's 1s, though not by the newcomer's 30s.
		age(t, s, db, target, 1500*time.Millisecond)
		got, err := newcomer.Run(context.Background(), target, work, gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.Equal(t, "from the newcomer", got)

		err = newRepository(t, db).CommitIfOwner(context.Background(), dead, func(*gorm.DB) error {
			t.Error("the dead holder's saver ran")
			return nil
		})
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
	})
}

// Waiters judge a holder by the timeout it recorded: RunWait and Do on a
// Runner with a 30s timeout take over a dead holder's 1s lease soon after
// its 1s, long before their own 30s would have passed.
func TestWaiters_JudgeTheHolderByItsOwnTimeout(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		waiter := newRunner(t, db, fast(200*time.Millisecond, 30*time.Second)...)
		work := func(context.Context) (string, error) { return "after the dead holder", nil }

		t.Run("RunWait", func(t *testing.T) {
			target, _ := acquireNew(t, newRepository(t, db), time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			got, err := waiter.RunWait(ctx, target, work, gormlease.SaveJSON[string])
			require.NoError(t, err, "RunWait did not take over the dead holder's lease within 15s")
			assert.Equal(t, "after the dead holder", got)
		})
		t.Run("Do", func(t *testing.T) {
			target, _ := acquireNew(t, newRepository(t, db), time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			got, shared, err := waiter.Do(ctx, target, work, gormlease.SaveJSON[string], loadJSON(target))
			require.NoError(t, err, "Do did not take over the dead holder's lease within 15s")
			assert.Equal(t, "after the dead holder", got)
			assert.False(t, shared)
		})
	})
}

// Two processes of different settings: the holder's helper runs with a 10s
// timeout and a 3s heartbeat, the other's with 1s and 100ms. With the
// holder's row 1.5s old, the other process is refused, and the holder saves.
func TestProcesses_DifferentTimeoutsKeepOneHolder(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		holder := startProc(t, s.DSN, "long", helperLeaseTimeoutEnv+"=10s", helperIntervalEnv+"=3s")
		other := startProc(t, s.DSN, "short", helperLeaseTimeoutEnv+"=1s")
		holder.expect("ready")
		other.expect("ready")

		holder.send("run " + target + " from-long")
		require.Equal(t, "working 1", holder.next())
		age(t, s, db, target, 1500*time.Millisecond)
		other.send("run " + target + " from-short")
		require.Equal(t, "held", other.next(), "the process with the shorter timeout took the lease over")

		holder.send("finish")
		holder.expect("saving")
		holder.send("save")
		holder.expect("ok")
		got, row, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "from-long", got)
		assert.EqualValues(t, 1, row.Generation)
	})
}

// Two Runners on one pool, one on the default tables and one on tables of
// its own, each with a Run in its work at once and the same heartbeat
// interval: each Run's heartbeats renew its own row, and both save.
func TestRunners_OnePoolDifferentTablesBothFinish(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		other := gormlease.WithTableNames("shared_pool_lease", "shared_pool_result")
		require.NoError(t, gormlease.AutoMigrate(context.Background(), db, other))
		opts := fast(100*time.Millisecond, 2*time.Second)
		runners := []*gormlease.Runner[string]{
			newRunner(t, db, opts...),
			newRunner(t, db, append(opts, other)...),
		}
		runsRenewTheirOwnRows(t, runners, 10*time.Second)
	})
}

// runsRenewTheirOwnRows holds a Run of each of runners on one target at
// once, waits until each Runner's own row has been renewed by a heartbeat
// (its last heartbeat newer than its acquire), then lets every Run save,
// and checks that each did.
func runsRenewTheirOwnRows(t *testing.T, runners []*gormlease.Runner[string], timeout time.Duration) {
	t.Helper()
	target := newTarget(t)
	var releases []func()
	var dones []<-chan runResult[string]
	for _, r := range runners {
		release, done := holdOnRunner(t, r, target, "saved")
		releases, dones = append(releases, release), append(dones, done)
	}
	for i, r := range runners {
		first, found, err := admin.New(r.Repository()).Get(context.Background(), target)
		require.NoError(t, err)
		require.True(t, found, "runner %d's row", i)
		waitFor(t, timeout, "a heartbeat of each Runner's own row", func() bool {
			row, _, err := admin.New(r.Repository()).Get(context.Background(), target)
			require.NoError(t, err)
			return row.UpdatedAt.After(first.UpdatedAt)
		})
	}
	for _, release := range releases {
		release()
	}
	for i, done := range dones {
		require.NoError(t, recv(t, done, 3*timeout/2, "a Run").Err, "runner %d", i)
	}
}

// Runners on one pool with different heartbeat intervals and observers
// each renew their leases at their own pace and report only their own
// heartbeats.
func TestRunners_OnePoolEachKeepsItsOwnSettings(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		fastObs, slowObs := &recordingObserver{}, &recordingObserver{}
		fastRunner := newRunner(t, db, append(fast(100*time.Millisecond, 5*time.Second),
			gormlease.WithHolder("fast-holder"), gormlease.WithObserver(fastObs))...)
		slowRunner := newRunner(t, db, append(fast(2*time.Second, 10*time.Second),
			gormlease.WithHolder("slow-holder"), gormlease.WithObserver(slowObs),
			gormlease.WithOperationTimeout(5*time.Second))...)
		fastTarget, slowTarget := newTarget(t), newTarget(t)
		slowRelease, slowDone := holdOnRunner(t, slowRunner, slowTarget, "slow")
		fastRelease, fastDone := holdOnRunner(t, fastRunner, fastTarget, "fast")

		// The fast Runner's lease is renewed several times before the slow
		// one's first heartbeat is due.
		waitFor(t, 10*time.Second, "five heartbeats of the fast Runner", func() bool {
			return heartbeatsOf(fastObs, fastTarget) >= 5
		})
		slowRow := leaseRow(t, db, slowTarget)
		assert.Equal(t, "slow-holder", slowRow.Holder)
		assert.Equal(t, "fast-holder", leaseRow(t, db, fastTarget).Holder)
		assert.Zero(t, heartbeatsOf(fastObs, slowTarget), "the fast Runner's observer saw the slow Runner's heartbeats")
		assert.Zero(t, heartbeatsOf(slowObs, fastTarget), "the slow Runner's observer saw the fast Runner's heartbeats")

		fastRelease()
		slowRelease()
		require.NoError(t, recv(t, fastDone, 20*time.Second, "the fast Run").Err)
		require.NoError(t, recv(t, slowDone, 20*time.Second, "the slow Run").Err)
	})
}

// heartbeatsOf counts the heartbeat spans of target that o saw end without
// an error.
func heartbeatsOf(o *recordingObserver, target string) int {
	n := 0
	for _, s := range o.spansOf(observe.SpanHeartbeat) {
		if s.span.TargetID == target && s.ended && s.err == nil {
			n++
		}
	}
	return n
}

// failedReads is a gorm logger that sends, for the first statement
// containing needle that failed, how long it ran. The library reports its
// own statements to gorm's logger without their error: a failed one is
// reported with rows -1.
type failedReads struct {
	logger.Interface
	needle string
	failed chan time.Duration
}

func (l *failedReads) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	if sql, rows := fc(); rows == -1 && strings.Contains(sql, l.needle) {
		select {
		case l.failed <- time.Since(begin):
		default:
		}
	}
}

// A waiter's watch bounds each statement on the row by the waiter's own
// operation timeout: with the database out of reach (the proxy withholds
// the statement), it fails after the waiter's 300ms, not after the 10s
// default.
func TestWaiters_ReadsHonourTheOperationTimeout(t *testing.T) {
	eachServerDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target, _ := acquireNew(t, newRepository(t, db), time.Hour)
		proxy := testdb.NewProxy(t, s.Addr)
		// While it waits, the waiter's only statements are its watch's
		// (reads of the row, and on PostgreSQL the mark that asks for a
		// notification): the first to carry the target after the watch has
		// read the row is the one withheld. (On PostgreSQL a prepared
		// statement's text is sent once; its arguments, every time.)
		needle := target
		reads := &failedReads{Interface: logger.Discard, needle: needle, failed: make(chan time.Duration, 1)}
		via := s.OpenVia(t, proxy.Addr()).Session(&gorm.Session{Logger: reads})
		waiter := newRunner(t, via, gormlease.WithHeartbeatInterval(200*time.Millisecond),
			gormlease.WithLeaseTimeout(2*time.Second), gormlease.WithOperationTimeout(300*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := goRunWait(t, ctx, waiter, target, func(context.Context) (string, error) {
			t.Error("the waiter ran its work while the lease was live")
			return "", nil
		})
		waitFor(t, 10*time.Second, "the waiter to watch the row", func() bool { return waiters(t, target).Held })
		tripped := proxy.BlackholeOn(needle, false)
		recv(t, tripped, 10*time.Second, "the watch's next read")
		took := recv(t, reads.failed, 5*time.Second, "the withheld read to fail")
		t.Logf("the withheld read failed after %v", took)
		assert.Less(t, took, 3*time.Second, "the read was not bounded by the waiter's operation timeout")
		proxy.Restore()
		cancel()
		assert.ErrorIs(t, recv(t, done, 20*time.Second, "RunWait").Err, context.Canceled)
	})
}

// A waiter reads the row again when the lease it waits on would expire,
// by the timeout its holder recorded, rather than at its next poll: a
// caller of Do whose polls are a minute apart (and, on PostgreSQL, four
// minutes once the row is marked for a notification, which no expiry
// sends) takes over a dead holder's 1s lease within a few seconds.
func TestWaiters_ReadAgainWhenTheLeaseExpires(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target, _ := acquireNew(t, newRepository(t, db), time.Second)
		waiter := newRunner(t, db, gormlease.WithHeartbeatInterval(time.Minute), gormlease.WithLeaseTimeout(5*time.Minute))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		begin := time.Now()
		got, _, err := waiter.Do(ctx, target, func(context.Context) (string, error) { return "taken over", nil },
			gormlease.SaveJSON[string], loadJSON(target))
		took := time.Since(begin)
		require.NoError(t, err)
		assert.Equal(t, "taken over", got)
		t.Logf("took the dead holder's lease over %v after it started to wait", took)
		assert.Less(t, took, 5*time.Second, "the waiter did not read the row when the lease expired")
	})
}

// WithMinHold: a job that ends early leaves its target held for the rest of
// the minimum hold, after a save and after a failure alike, so that a Run
// started a moment later (another pod's timer) is refused; once the hold
// ends the target is acquired again. Run returns at once, without sleeping.
func TestRun_MinHoldKeepsTheTargetHeld(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const hold = 1500 * time.Millisecond
		r := newRunner(t, db, append(fast(100*time.Millisecond, 2*time.Second), gormlease.WithMinHold(hold))...)
		other := newRunner(t, db, fast(100*time.Millisecond, 2*time.Second)...)
		never := func(context.Context) (string, error) {
			t.Error("a second Run ran within the minimum hold")
			return "", nil
		}
		for _, fail := range []bool{false, true} {
			target := newTarget(t)
			beginDB := clockOf(t, s, db)
			begin := time.Now()
			_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
				if fail {
					return "", errors.New("work failed")
				}
				return "fast", nil
			}, gormlease.SaveJSON[string])
			took := time.Since(begin)
			if fail {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			assert.Less(t, took, hold/2, "Run slept out the hold")
			_, err = other.Run(context.Background(), target, never, noSave(t))
			require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "refused within the hold (failed work: %v)", fail)
			info, err := admin.New(other.Repository()).List(context.Background(), admin.ListOptions{Prefix: target, Limit: 1})
			require.NoError(t, err)
			require.Len(t, info, 1)
			assert.Equal(t, admin.StateLive, info[0].State)
			assert.Nil(t, info[0].Row.ReleasedAt)
			if !fail {
				require.NotNil(t, info[0].Row.SavedGeneration, "the save was not recorded")
			}
			// The row, judged on the database's clock, stays held until the
			// hold has passed since before the acquire (SQLite keeps its
			// times to the millisecond: a millisecond of slack).
			var row gormlease.JobLease
			require.NoError(t, db.Where("target_id = ?", target).Take(&row).Error)
			require.NotNil(t, row.TimeoutMS)
			assert.False(t, expiry(row).Before(beginDB.Add(hold-time.Millisecond)),
				"the row expires %v after the Run began, before its hold of %v", expiry(row).Sub(beginDB), hold)
			// After the hold, the target is free again.
			waitFor(t, 10*time.Second, "the hold to end", func() bool {
				_, err := other.Run(context.Background(), target, func(context.Context) (string, error) { return "next", nil },
					gormlease.SaveJSON[string])
				if err != nil && !errors.Is(err, gormlease.ErrLeaseHeld) {
					t.Fatalf("a Run after the hold: %v", err)
				}
				return err == nil
			})
			assert.False(t, clockOf(t, s, db).Before(beginDB.Add(hold-time.Millisecond)),
				"the target was free before the hold ended, by the database's clock")
		}
		_, _, err := r.Do(context.Background(), newTarget(t), never, gormlease.SaveJSON[string], loadJSON("x"))
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	})
}
