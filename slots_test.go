package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// inWork counts the calls of a work that are running, and the most that
// ever ran at once.
type inWork struct {
	now, most atomic.Int64
	full      chan struct{} // closed when want calls ran at once
	want      int64
	once      sync.Once
}

func newInWork(want int) *inWork { return &inWork{full: make(chan struct{}), want: int64(want)} }

// work is a work that holds its slot until want calls have run at once
// (or 20 s have passed, which fails the test through its error), then
// returns.
func (w *inWork) work(ctx context.Context) (string, error) {
	n := w.now.Add(1)
	defer w.now.Add(-1)
	for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
	}
	if n >= w.want {
		w.once.Do(func() { close(w.full) })
	}
	select {
	case <-w.full:
	case <-time.After(20 * time.Second):
		return "", errors.New("never reached the wanted number of concurrent holders")
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
	l, _ := gormlease.LeaseFromContext(ctx)
	return fmt.Sprintf("slot %d gen %d", l.Slot, l.Generation), nil
}

func TestSlots_RunWaitsAtMostNAtOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const n, calls, runners = 3, 20, 4
		target := newTarget(t)
		w := newInWork(n)
		var rs []*gormlease.Runner[string]
		for range runners {
			// Runners of their own: each queues its calls apart, as
			// separate processes would.
			// An operation timeout, and with it the acquire's bound, that 20
			// callers making the slot rows at once, each on a connection
			// of its own that the pool opens then, meet on a loaded 2-core
			// machine under -race (attempts took up to 1.7 s there).
			rs = append(rs, newRunner(t, db, append(fast(250*time.Millisecond, 5*time.Second),
				gormlease.WithOperationTimeout(5*time.Second), gormlease.WithSlots(n))...))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := rs[i%runners].RunWait(ctx, target, w.work, func(*gorm.DB, string) error { return nil })
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, n, w.most.Load(), "the most calls in their work at once")
		repo := rs[0].Repository()
		page, err := admin.New(repo).List(ctx, admin.ListOptions{Prefix: target})
		require.NoError(t, err)
		require.Len(t, page, n)
		var gens int64
		for i, li := range page {
			require.Equal(t, target, li.TargetID)
			require.Equal(t, i+1, li.Slot)
			require.Equal(t, fmt.Sprintf("%s\x1f%d", target, i+1), li.Key, "the slot row's key")
			require.Equal(t, li.Key, li.Row.TargetID)
			require.Equal(t, admin.StateReleased, li.State)
			gens += li.Row.Generation
		}
		require.EqualValues(t, calls, gens, "one generation per call, over the slots")
	})
}

func TestSlots_FrozenHolderFreesItsSlot(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const n = 3
		target := newTarget(t)
		opts := append(fast(100*time.Millisecond, time.Second), gormlease.WithSlots(n))
		r := newRunner(t, db, opts...)
		repo := r.Repository()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		frozen := holdSlots(t, repo, target, n, 1, time.Second)[0]
		// Two Runs hold the other slots, renewed by their heartbeats for
		// longer than the timeout.
		release := make(chan struct{})
		started := make(chan gormlease.Lease, 2)
		var holders []<-chan runResult[string]
		for range 2 {
			holders = append(holders, goRun(t, ctx, r, target, func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				started <- l
				select {
				case <-release:
					return "held", nil
				case <-ctx.Done():
					return "", context.Cause(ctx)
				}
			}, func(*gorm.DB, string) error { return nil }))
		}
		live := map[int]bool{frozen.Slot: true}
		for range 2 {
			l := recv(t, started, 10*time.Second, "a holder's work")
			require.False(t, live[l.Slot], "slot %d taken twice", l.Slot)
			live[l.Slot] = true
		}
		_, err := r.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "all three slots held")

		// The waiter gets the frozen holder's slot once it expires, and
		// only that one: the others are renewed.
		begin := time.Now()
		got, err := r.RunWait(ctx, target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			return fmt.Sprint(l.Slot, " ", l.Generation), nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(frozen.Slot, " ", frozen.Generation+1), got)
		require.GreaterOrEqual(t, time.Since(begin), 500*time.Millisecond, "the slot was taken before it expired")

		// The frozen holder thaws: its save and its heartbeat are refused.
		err = repo.CommitIfOwner(ctx, frozen, func(*gorm.DB) error {
			t.Error("the frozen holder's saver ran")
			return nil
		})
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)
		require.ErrorIs(t, repo.Heartbeat(ctx, frozen), gormlease.ErrLeaseLost)

		close(release)
		for _, h := range holders {
			res := recv(t, h, 10*time.Second, "a holder's Run")
			require.NoError(t, res.Err, "a holder renewed by heartbeats keeps its slot past the timeout")
		}
	})
}

func TestSlots_RefusalWritesNothing(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		const n = 3
		target := newTarget(t)
		r := newRunner(t, db, gormlease.WithSlots(n))
		holdSlots(t, r.Repository(), target, n, n, time.Minute)
		before := slotSnapshot(t, s, db, target, n)
		ran := false
		for range 3 {
			_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
				ran = true
				return "", nil
			}, noSave(t))
			require.ErrorIs(t, err, gormlease.ErrLeaseHeld)
			require.NotErrorIs(t, err, gormlease.ErrSlotCountConflict)
		}
		require.False(t, ran, "work ran with every slot held")
		require.Equal(t, before, slotSnapshot(t, s, db, target, n), "a refusal changed the slot rows")
	})
}

func TestSlots_DisagreeingCountsAreRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newTarget(t)
		ctx := context.Background()
		three := newRunner(t, db, gormlease.WithSlots(3))
		// Only slot 3 stays held: beyond a count of 2, which must see it.
		var held gormlease.Lease
		for _, l := range holdSlots(t, three.Repository(), target, 3, 3, time.Minute) {
			if l.Slot == 3 {
				held = l
				continue
			}
			require.NoError(t, three.Repository().Release(ctx, l))
		}
		before := slotSnapshot(t, s, db, target, 3)
		for _, n := range []int{2, 5} {
			other := newRunner(t, db, gormlease.WithSlots(n))
			_, err := other.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
			require.ErrorIs(t, err, gormlease.ErrSlotCountConflict, "n = %d", n)
			require.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
			require.ErrorContains(t, err, "count of 3")
			_, err = other.RunWait(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
			require.ErrorIs(t, err, gormlease.ErrSlotCountConflict, "RunWait, n = %d", n)
		}
		plain := newRunner(t, db)
		_, err := plain.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err, "the target's own lease is not one of its slots")
		require.Equal(t, before, slotSnapshot(t, s, db, target, 3), "a refused count changed the slot rows")

		// Once no slot is held, the next count is recorded.
		require.NoError(t, three.Repository().Release(ctx, held))
		two := newRunner(t, db, gormlease.WithSlots(2))
		l := holdSlots(t, two.Repository(), target, 2, 1, time.Minute)[0]
		require.Contains(t, []int{1, 2}, l.Slot)
		_, err = three.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrSlotCountConflict)
		var counts []int
		require.NoError(t, db.Table("job_lease").Where("target_id IN ?", []string{slotKey(target, 1), slotKey(target, 2), slotKey(target, 3)}).
			Order("target_id").Pluck("slots", &counts).Error)
		require.Equal(t, []int{2, 2, 2}, counts, "every slot row records the count")
	})
}

// TestSlots_DisagreeingCountsRace has Runners with counts 2 and 4 take a
// fresh target's slots at once, holding what they get: they all hold under
// one count, which every slot row records, and never more of them than it.
// (While the two counts keep re-counting the free rows, all may be
// refused: that is safe, and only a misconfiguration meets it.)
func TestSlots_DisagreeingCountsRace(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repos := map[int]*gormlease.Repository{
			2: newRunner(t, db, gormlease.WithSlots(2)).Repository(),
			4: newRunner(t, db, gormlease.WithSlots(4)).Repository(),
		}
		for range 5 {
			slotsRace(t, db, repos, newTarget(t))
		}
	})
}

// slotsRace runs one round of TestSlots_DisagreeingCountsRace on target.
func slotsRace(t *testing.T, db *gorm.DB, repos map[int]*gormlease.Repository, target string) {
	t.Helper()
	type got struct {
		n     int
		lease gormlease.Lease
		err   error
	}
	const contenders = 12
	results := make(chan got, contenders)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range contenders {
		n := 2 + 2*(i%2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := repos[n].AcquireSlot(context.Background(), target, n, time.Minute)
			results <- got{n, l, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	byCount := map[int]int{}
	slots := map[int]bool{}
	for g := range results {
		switch {
		case g.err == nil:
			byCount[g.n]++
			require.False(t, slots[g.lease.Slot], "slot %d held twice", g.lease.Slot)
			slots[g.lease.Slot] = true
		case errors.Is(g.err, gormlease.ErrLeaseHeld), errors.Is(g.err, gormlease.ErrSlotCountConflict):
		default:
			require.NoError(t, g.err)
		}
	}
	require.LessOrEqual(t, len(byCount), 1, "holders under two counts at once: %v", byCount)
	for n, k := range byCount {
		require.LessOrEqual(t, k, n, "holders under count %d", n)
		var counts []int
		require.NoError(t, db.Table("job_lease").Where("target_id LIKE ?", target+"\x1f%").Pluck("slots", &counts).Error)
		for _, c := range counts {
			require.Equal(t, n, c, "a slot row records another count than its holders'")
		}
	}
}

func TestSlots_InvalidArguments(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	for _, n := range []int{0, -1, gormlease.MaxSlots + 1} {
		_, err := gormlease.NewRunner[string](db, gormlease.WithSlots(n))
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "n = %d", n)
		require.ErrorContains(t, err, "WithSlots")
	}
	_, err := gormlease.NewElector(db, "role", gormlease.WithSlots(2))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	require.ErrorContains(t, err, "WithSlots")

	r := newRunner(t, db, gormlease.WithSlots(2))
	_, _, err = r.Do(context.Background(), newTarget(t), func(context.Context) (string, error) {
		t.Error("Do ran the work of a Runner with slots")
		return "", nil
	}, noSave(t), func(*gorm.DB) (string, error) { return "", nil })
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	require.ErrorContains(t, err, "WithSlots")

	ctx := context.Background()
	repo := r.Repository()
	_, err = repo.AcquireSlot(ctx, strings.Repeat("x", 254), 2, time.Minute)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "the slot's key is longer than the column")
	_, err = repo.AcquireSlot(ctx, "a\x1fb", 2, time.Minute)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	_, err = r.Run(ctx, "a\x1f1", func(context.Context) (string, error) { return "", nil }, noSave(t))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "a target that is a slot row's key")
	_, err = repo.AcquireSlot(ctx, "a", 0, time.Minute)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	var n int64
	require.NoError(t, db.Table("job_lease").Where("target_id LIKE ?", "a%").Count(&n).Error)
	require.Zero(t, n, "bad input wrote rows")

	// n == 1 is an ordinary lease: the target's own row.
	one := newRunner(t, db, gormlease.WithSlots(1))
	target := newTarget(t)
	_, err = one.Run(ctx, target, func(ctx context.Context) (string, error) {
		l, _ := gormlease.LeaseFromContext(ctx)
		require.Zero(t, l.Slot)
		return "", nil
	}, func(*gorm.DB, string) error { return nil })
	require.NoError(t, err)
	require.EqualValues(t, 1, countRows(t, db, &gormlease.JobLease{}, target))
}

// A lease table without the slots column, as the version before WithSlots
// made it, still serves every target without slots: Run with heartbeats,
// List, Prune. AutoMigrate then adds the column, and slots work.
func TestSlots_TableWithoutSlotsColumn(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := s.OpenEmpty(t, nil)
		ctx := context.Background()
		require.NoError(t, gormlease.AutoMigrate(ctx, db))
		require.NoError(t, db.Exec("ALTER TABLE job_lease DROP COLUMN slots").Error)
		require.NotContains(t, leaseColumns(t, db), "slots")

		r := newRunner(t, db, fast(50*time.Millisecond, time.Second)...)
		target := newTarget(t)
		got, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
			time.Sleep(150 * time.Millisecond) // a few heartbeats: the work's own duration
			return "done", nil
		}, gormlease.SaveJSON[string])
		require.NoError(t, err)
		require.Equal(t, "done", got)
		page, err := admin.New(r.Repository()).List(ctx, admin.ListOptions{})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, target, page[0].TargetID)
		_, err = admin.New(r.Repository()).Prune(ctx, admin.PruneOptions{OlderThan: time.Hour})
		require.NoError(t, err)

		require.NoError(t, gormlease.AutoMigrate(ctx, db))
		slotted := newRunner(t, db, gormlease.WithSlots(2))
		_, err = slotted.Run(ctx, target, func(context.Context) (string, error) { return "", nil }, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
	})
}

// The slots that one Runner's Runs hold are renewed as its leases are: by
// one heartbeat statement per interval for all of them, here six slots of
// two targets, for longer than their timeout.
func TestSlots_HeartbeatsAreBatched(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		const n, interval, timeout = 3, 100 * time.Millisecond, 2 * time.Second
		rec, st := recording(s.Open(t, nil)) // a pool of its own: no other test's leases
		r := newRunner(t, rec, append(fast(interval, timeout), gormlease.WithSlots(n), gormlease.WithOperationTimeout(5*time.Second))...)
		targets := []string{newTarget(t), newTarget(t)}
		inside := make(chan struct{}, 2*n)
		release := make(chan struct{})
		var results []<-chan runResult[string]
		for _, target := range targets {
			for range n {
				results = append(results, goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
					inside <- struct{}{}
					select {
					case <-release:
						return "ok", nil
					case <-ctx.Done():
						return "", context.Cause(ctx)
					}
				}, func(*gorm.DB, string) error { return nil }))
			}
		}
		for range 2 * n {
			recv(t, inside, 20*time.Second, "a Run's work")
		}
		st.take()
		begun := time.Now()
		time.Sleep(timeout + 2*interval) // the works hold their slots past the timeout
		beats := heartbeatStatements(st.take())
		rounds := int(time.Since(begun)/interval) + 2
		close(release)
		for _, res := range results {
			require.NoError(t, recv(t, res, 10*time.Second, "a Run").Err, "a slot renewed by heartbeats is kept")
		}
		assert.Positive(t, beats)
		assert.LessOrEqual(t, beats, rounds, "%d heartbeat statements for %d slots in %d intervals", beats, 2*n, rounds)
	})
}
