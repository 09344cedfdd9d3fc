package gormlease_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Point 1: many Runs on one target at once: exactly one runs the work, and
// every other returns ErrLeaseHeld at once, while the winner still holds.
func TestRun_ConcurrentRunsRunWorkOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const n = 16
		r := newRunner(t, db)
		target := newTarget(t)
		var works, saves atomic.Int32
		refused := make(chan struct{}, n)
		allRefused := make(chan struct{})
		start := make(chan struct{})
		results := make(chan error, n)
		for range n {
			go func() {
				<-start
				_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
					works.Add(1)
					// Hold the lease until every other Run has given up: a
					// Run that waited for the holder would never return.
					select {
					case <-allRefused:
						return "done", nil
					case <-time.After(20 * time.Second):
						return "", errors.New("the other Runs did not return while the lease was held")
					}
				}, func(*gorm.DB, string) error { saves.Add(1); return nil })
				if errors.Is(err, gormlease.ErrLeaseHeld) {
					refused <- struct{}{}
				}
				results <- err
			}()
		}
		close(start)
		for range n - 1 {
			recv(t, refused, 20*time.Second, "refused Runs")
		}
		close(allRefused)
		var ok int
		for range n {
			if err := recv(t, results, 20*time.Second, "Run results"); err == nil {
				ok++
			} else {
				assert.ErrorIs(t, err, gormlease.ErrLeaseHeld)
			}
		}
		assert.Equal(t, 1, ok, "successful Runs")
		assert.EqualValues(t, 1, works.Load(), "work calls")
		assert.EqualValues(t, 1, saves.Load(), "save calls")
	})
}

// Point 3: while the work runs, heartbeats keep the lease fresh past the
// timeout, so no other Run can take it over. The trust window is 18
// intervals: a heartbeat held up for a second and a half under -race on a
// busy machine does not lose the lease.
func TestRun_HeartbeatKeepsLeaseLive(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const interval, timeout = 100 * time.Millisecond, 2 * time.Second
		r := newRunner(t, db, fast(interval, timeout)...)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			first := leaseRow(t, db, target).UpdatedAt
			beats := 0
			last := first
			// Outlive the timeout twice over, counting heartbeats.
			for begun := time.Now(); time.Since(begun) < 2*timeout; {
				select {
				case <-ctx.Done():
					return "", context.Cause(ctx)
				case <-time.After(interval / 2):
				}
				if at := leaseRow(t, db, target).UpdatedAt; at.After(last) {
					beats++
					last = at
				}
				_, err := r.Run(ctx, target, func(context.Context) (string, error) {
					t.Error("a second Run ran its work while the lease was held")
					return "", nil
				}, noSave(t))
				if !errors.Is(err, gormlease.ErrLeaseHeld) {
					return "", errors.New("a second Run was not refused: " + errString(err))
				}
			}
			if beats < 3 {
				return "", errors.New("too few heartbeats")
			}
			return "ok", nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
	})
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Point 3: Run holds no connection while the work runs: 20 Runs with slow
// work on a pool of 2 connections are all inside their work at once.
func TestRun_HoldsNoConnectionDuringWork(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		const n = 20
		db := s.Open(t, nil)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(2)
		// A timeout that the 20 acquires queued on the 2 connections
		// cannot outlast on a loaded machine: with 2 s, a Run's heartbeats
		// waited behind them for the pool and its lease was lost.
		r := newRunner(t, db, fast(250*time.Millisecond, 10*time.Second)...)

		var inside sync.WaitGroup
		inside.Add(n)
		allInside := make(chan struct{})
		go func() { inside.Wait(); close(allInside) }()
		results := make(chan error, n)
		for i := range n {
			target := newTarget(t)
			go func() {
				_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
					inside.Done()
					select {
					case <-allInside:
						return "ok", nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}, func(*gorm.DB, string) error { return nil })
				results <- err
			}()
			_ = i
		}
		recv(t, allInside, 20*time.Second, "all 20 Runs inside their work at once")
		for range n {
			require.NoError(t, recv(t, results, 20*time.Second, "Run results"))
		}
	})
}

// Point 4: a heartbeat that finds the lease taken cancels the work with
// ErrLeaseLost as the cause, and Run saves nothing, even when the work
// ignores its context and returns a result.
func TestRun_LostLeaseCancelsWork(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		for _, ignoresContext := range []bool{false, true} {
			name := map[bool]string{false: "WorkObeysContext", true: "WorkIgnoresContext"}[ignoresContext]
			t.Run(name, func(t *testing.T) {
				r := newRunner(t, db, fast(30*time.Millisecond, time.Second)...)
				target := newTarget(t)
				var cause error
				_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
					steal(t, s, db, target)
					<-ctx.Done() // the next heartbeat finds the lease taken
					cause = context.Cause(ctx)
					if ignoresContext {
						return "stale result", nil
					}
					return "", ctx.Err()
				}, noSave(t))
				require.ErrorIs(t, err, gormlease.ErrLeaseLost)
				require.ErrorIs(t, cause, gormlease.ErrLeaseLost)
				assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
				assert.Nil(t, leaseRow(t, db, target).ReleasedAt, "the new holder's lease was released")
			})
		}
	})
}

// Point 4, at the commit: a lease taken over after the work returned, but
// before the commit, is caught by the fenced commit.
func TestRun_TakeoverBeforeCommitSavesNothing(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, stolenBeforeCommit(t, s, db, target), noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		assert.Nil(t, leaseRow(t, db, target).ReleasedAt, "the new holder's lease was released")
	})
}

// Point 5: when the database stops answering, the work is cancelled with
// ErrLeaseLost while the lease is still live on the database, so before
// anyone else could take it over; Run returns in bounded time, saves
// nothing, and works again once the database is back.
func TestRun_SelfFencesWhenDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, direct *gorm.DB) {
		proxy := testdb.NewProxy(t, s.Addr)
		viaProxy := s.OpenVia(t, proxy.Addr())
		const interval, timeout = 100 * time.Millisecond, 3 * time.Second
		// The margin leaves the work 2 s to run its check below on a loaded
		// machine (-race, 2 cores, a new connection to dial) before the
		// lease can be taken over: 700 ms was not always enough.
		r := newRunner(t, viaProxy,
			gormlease.WithHeartbeatInterval(interval),
			gormlease.WithLeaseTimeout(timeout),
			gormlease.WithSafetyMargin(2*time.Second),
			gormlease.WithOperationTimeout(300*time.Millisecond))
		other, err := gormlease.NewRepository(direct)
		require.NoError(t, err)
		target := newTarget(t)

		var heldAtCancel error
		var cause error
		begun := time.Now()
		_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			proxy.Blackhole()
			<-ctx.Done()
			cause = context.Cause(ctx)
			// At this moment no one else may take the lease over yet.
			_, heldAtCancel = other.Acquire(context.Background(), target, timeout)
			return "", ctx.Err()
		}, noSave(t))
		elapsed := time.Since(begun)
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		require.ErrorIs(t, cause, gormlease.ErrLeaseLost)
		require.ErrorIs(t, heldAtCancel, gormlease.ErrLeaseHeld, "the work still ran when another could take the lease")
		assert.Less(t, elapsed, timeout+2*time.Second, "Run hung on the unreachable database")

		// Once the lease expires on the database's clock, another holder takes it.
		waitFor(t, 10*time.Second, "the lease to expire", func() bool {
			_, err := other.Acquire(context.Background(), target, timeout)
			return err == nil
		})
		proxy.Restore()
		// With the 300 ms operation timeout, the first connections through
		// the proxy may take too long on a loaded machine: poll for recovery.
		waitFor(t, 10*time.Second, "a Run to succeed after the database came back", func() bool {
			_, err := r.Run(context.Background(), newTarget(t), func(context.Context) (string, error) {
				return "back", nil
			}, func(*gorm.DB, string) error { return nil })
			return err == nil
		})
	})
}

// Point 6: the commit locks the lease row (on SQLite, the database's write
// lock); a takeover attempted during the saver waits for the commit, and
// then finds the lease released.
func TestRun_TakeoverWaitsForFencedCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		// A short lease timeout, so that the lease soon looks expired while
		// the saver runs: only the lock can then hold the takeover back.
		const timeout = 300 * time.Millisecond
		r := newRunner(t, db, fast(100*time.Millisecond, timeout)...)
		takeoverDB := s.Open(t, nil)
		other, err := gormlease.NewRepository(takeoverDB)
		require.NoError(t, err)
		target := newTarget(t)
		inSaver := make(chan struct{})
		takeoverDone := make(chan error, 1)
		var generation int64
		_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			generation = l.Generation
			return "result", nil
		}, func(tx *gorm.DB, result string) error {
			close(inSaver)
			// The heartbeats have stopped: wait until the last one, as
			// committed, is older than the lease timeout.
			waitLooksExpired(t, s, takeoverDB, target, timeout)
			go func() {
				_, err := other.Acquire(context.Background(), target, time.Microsecond)
				takeoverDone <- err
			}()
			waitTakeoverBlocked(t, s, takeoverDB)
			// Blocked, it stays blocked for as long as the commit goes on.
			select {
			case err := <-takeoverDone:
				t.Errorf("takeover finished during the fenced commit: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			return gormlease.SaveJSON(tx, result)
		})
		require.NoError(t, err)
		require.NoError(t, recv(t, takeoverDone, 10*time.Second, "takeover after the commit"))
		got, row, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, "result", got)
		assert.Equal(t, generation, row.Generation)
		assert.Equal(t, generation+1, leaseRow(t, db, target).Generation)
	})
}

// acquireSQL is a LIKE pattern for each database's acquire statement that
// can wait for a row lock: the one that takes over an existing row.
var acquireSQL = map[string]string{
	"postgres": "%UPDATE job_lease AS l SET%lease_token%",
	"mariadb":  "%ON DUPLICATE KEY UPDATE%lease_token%",
	"mysql":    "%UPDATE job_lease SET%lease_token%",
}

// waitTakeoverBlocked waits until the acquire on takeoverDB waits for the
// lock that the fenced commit holds.
func waitTakeoverBlocked(t *testing.T, s *testdb.Server, takeoverDB *gorm.DB) {
	t.Helper()
	waitTakeoverBlockedLike(t, s, takeoverDB, acquireSQL[flavour(s)])
}

// waitTakeoverBlockedLike is waitTakeoverBlocked for a takeover whose
// statement matches the LIKE pattern like (on SQLite, any acquire).
func waitTakeoverBlockedLike(t *testing.T, s *testdb.Server, takeoverDB *gorm.DB, like string) {
	t.Helper()
	if s.Name != "sqlite" {
		waitLockWait(t, s, "the takeover", like)
		return
	}
	// SQLite has one write lock per file, and no view of who waits for it:
	// a statement that needs it retries until the busy timeout. Once the
	// acquire has begun to run on its own pool, it can only be waiting,
	// since the fenced commit holds the write lock.
	waitFor(t, 10*time.Second, "the takeover to begin, and wait for the write lock", func() bool {
		return testdb.Started(takeoverDB, "INSERT INTO job_lease") > 0
	})
}

// Point 7: caller cancellation releases the lease, on a context that
// survives the cancellation, and the target is at once acquirable.
func TestRun_CancelledCallerReleasesLease(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		target := newTarget(t)
		ctx, cancel := context.WithCancel(context.Background())
		_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
			cancel()
			<-ctx.Done()
			return "", ctx.Err()
		}, noSave(t))
		require.ErrorIs(t, err, context.Canceled)
		assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
		got, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			return "again", nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err, "the target was not acquirable at once")
		assert.Equal(t, "again", got)
	})
}

// Point 8: the generation grows with every acquisition, across releases and
// takeovers, and the work sees it.
func TestRun_GenerationIncreasesAcrossReleases(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		target := newTarget(t)
		var seen []int64
		work := func(ctx context.Context) (string, error) {
			l, ok := gormlease.LeaseFromContext(ctx)
			require.True(t, ok, "no lease in the work's context")
			seen = append(seen, l.Generation)
			return "", nil
		}
		save := func(*gorm.DB, string) error { return nil }
		for range 3 {
			_, err := r.Run(context.Background(), target, work, save)
			require.NoError(t, err)
		}
		// A failed Run releases too; a takeover bumps the generation as well.
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			work(ctx)
			return "", errors.New("boom")
		}, save)
		require.Error(t, err)
		_, err = r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			work(ctx)
			steal(t, s, db, target)
			return "", nil
		}, save)
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		age(t, s, db, target, time.Hour)
		_, err = r.Run(context.Background(), target, work, save)
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 2, 3, 4, 5, 7}, seen)
	})
}

// Point 9: work errors, saver errors, panics and cancellation come back as
// errors that errors.Is and errors.As see through, and release the lease.
func TestRun_FailuresReleaseLease(t *testing.T) {
	t.Parallel()
	errWork := errors.New("external API failed")
	errSave := errors.New("save failed")
	cases := []struct {
		name  string
		work  func(context.Context) (string, error)
		save  func(*gorm.DB, string) error
		check func(t *testing.T, err error)
	}{
		{"WorkError",
			func(context.Context) (string, error) { return "", errWork },
			func(*gorm.DB, string) error { return nil },
			func(t *testing.T, err error) { assert.ErrorIs(t, err, errWork) }},
		{"SaveError",
			func(context.Context) (string, error) { return "r", nil },
			func(tx *gorm.DB, r string) error {
				if err := gormlease.SaveJSON(tx, r); err != nil {
					return err
				}
				return errSave // after a write, which must be rolled back
			},
			func(t *testing.T, err error) { assert.ErrorIs(t, err, errSave) }},
		{"WorkPanics",
			func(context.Context) (string, error) { panic("work exploded") },
			func(*gorm.DB, string) error { return nil },
			func(t *testing.T, err error) {
				var pe *gormlease.PanicError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "work", pe.Step)
				assert.Equal(t, "work exploded", pe.Value)
				assert.Contains(t, string(pe.Stack), "runner_test.go")
			}},
		{"SavePanicsWithError",
			func(context.Context) (string, error) { return "r", nil },
			func(*gorm.DB, string) error { panic(errSave) },
			func(t *testing.T, err error) {
				var pe *gormlease.PanicError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "save", pe.Step)
				assert.ErrorIs(t, err, errSave)
			}},
	}
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				target := newTarget(t)
				got, err := r.Run(context.Background(), target, tc.work, tc.save)
				require.Error(t, err)
				assert.Empty(t, got)
				tc.check(t, err)
				assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease not released")
				assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
			})
		}
	})
}

// A work or saver that calls runtime.Goexit, as t.FailNow does, ends the
// goroutine inside Run: the heartbeat still stops and the lease is
// released, so that the next Run on the target is not refused.
func TestRun_GoexitReleasesLease(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		for _, tc := range []struct {
			name string
			work func(context.Context) (string, error)
			save func(*gorm.DB, string) error
		}{
			{"InWork", func(context.Context) (string, error) { runtime.Goexit(); return "", nil },
				func(*gorm.DB, string) error { return nil }},
			{"InSave", func(context.Context) (string, error) { return "r", nil },
				func(tx *gorm.DB, r string) error {
					if err := gormlease.SaveJSON(tx, r); err != nil {
						return err
					}
					runtime.Goexit() // after a write, which must be rolled back
					return nil
				}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				target := newTarget(t)
				returned := make(chan bool, 1)
				go func() {
					ok := false
					defer func() { returned <- ok }()
					_, _ = r.Run(context.Background(), target, tc.work, tc.save)
					ok = true
				}()
				assert.False(t, recv(t, returned, 10*time.Second, "the Run's goroutine to end"), "Run returned")
				row := leaseRow(t, db, target)
				assert.NotNil(t, row.ReleasedAt, "lease not released")
				assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "results saved")
				_, err := r.Run(context.Background(), target,
					func(context.Context) (string, error) { return "again", nil },
					func(*gorm.DB, string) error { return nil })
				assert.NoError(t, err, "the next Run on the target")
			})
		}
	})
}

// Point 9: a successful Run saves in the fenced commit and releases the
// lease in that same transaction.
func TestRun_SavesAndReleases(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, err := gormlease.NewRunner[map[string]int](db)
		require.NoError(t, err)
		target := newTarget(t)
		got, err := r.Run(context.Background(), target, func(context.Context) (map[string]int, error) {
			return map[string]int{"answer": 42}, nil
		}, gormlease.SaveJSON[map[string]int])
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"answer": 42}, got)
		loaded, row, err := gormlease.LoadJSON[map[string]int](context.Background(), db, target)
		require.NoError(t, err)
		assert.Equal(t, got, loaded)
		lease := leaseRow(t, db, target)
		assert.Equal(t, lease.Generation, row.Generation)
		assert.NotNil(t, lease.ReleasedAt)
		_, _, err = gormlease.LoadJSON[string](context.Background(), db, newTarget(t))
		assert.ErrorIs(t, err, gormlease.ErrNoResult)
	})
}

// Point 10: bad input to Run is refused with a clear error, and nothing is
// written.
func TestRun_BadInputWritesNothing(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r := newRunner(t, db)
		work := func(context.Context) (string, error) { t.Error("work ran"); return "", nil }
		save := func(*gorm.DB, string) error { t.Error("save ran"); return nil }
		ok := newTarget(t)
		cases := []struct {
			name, target string
			work         func(context.Context) (string, error)
			save         func(*gorm.DB, string) error
			want         string
		}{
			{"EmptyTarget", "", work, save, "target ID \"\" is empty"},
			{"NULByte", ok + "\x00x", work, save, "NUL byte"},
			{"TooLong", strings.Repeat("é", 128), work, save, "256 bytes long, more than the 255"},
			{"InvalidUTF8", ok + "\xff", work, save, "not valid UTF-8"},
			{"NilWork", ok, nil, save, "work function is nil"},
			{"NilSave", ok, work, nil, "save function is nil"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := r.Run(context.Background(), tc.target, tc.work, tc.save)
				require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
				assert.Contains(t, err.Error(), tc.want)
				var n int64
				require.NoError(t, db.Model(&gormlease.JobLease{}).
					Where("target_id LIKE ?", strings.ToValidUTF8(strings.ReplaceAll(ok, "\x00", ""), "")+"%").
					Count(&n).Error)
				assert.Zero(t, n, "rows written")
			})
		}
		// The longest target ID that fits, 255 bytes, works end to end,
		// multi-byte too.
		const maxTargetID = 255
		longest := strings.Repeat("界", MaxRunes(maxTargetID, "界"))
		longest += strings.Repeat("x", maxTargetID-len(longest))
		longest = longest[:maxTargetID-3] + targetSuffix(t)
		_, err := r.Run(context.Background(), longest, func(context.Context) (string, error) { return "ok", nil },
			gormlease.SaveJSON[string])
		require.NoError(t, err, "a %d-byte target ID", len(longest))
	})
}

// MaxRunes is how many copies of r fit in n bytes.
func MaxRunes(n int, r string) int { return n / len(r) }

// targetSuffix returns 3 bytes that make a target unique to this run.
func targetSuffix(t *testing.T) string {
	s := newTarget(t)
	return s[len(s)-3:]
}
