package admin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// Count counts the rows under a prefix in each state, slot rows as rows,
// and each count is what List's pages of that state hold: live, expired
// and released add up to the total, paused and stop requests count across
// states.
func TestCount_MatchesListPages(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		p := testkit.NewTarget(t) + "/"
		acquire := func(name string) gormlease.Lease {
			l, err := repo.Acquire(ctx, p+name, time.Hour)
			require.NoError(t, err)
			return l
		}
		acquire("live-1")
		acquire("live-2")
		acquire("live-paused")
		acquire("expired")
		testkit.Age(t, s, db, p+"expired", 2*time.Hour)
		acquire("expired-stopped")
		testkit.Age(t, s, db, p+"expired-stopped", 2*time.Hour)
		for _, name := range []string{"rel-1", "rel-2", "rel-stopped"} {
			l := acquire(name)
			if name == "rel-stopped" {
				require.NoError(t, op.RequestStop(ctx, p+name, "stop"))
			}
			require.NoError(t, repo.Release(ctx, l))
		}
		require.NoError(t, op.Pause(ctx, p+"live-paused", ""))
		require.NoError(t, op.Pause(ctx, p+"never-acquired", "")) // a released row
		require.NoError(t, op.RequestStop(ctx, p+"live-1", "stop"))
		require.NoError(t, op.RequestStop(ctx, p+"expired-stopped", "stop"))
		testkit.HoldSlots(t, repo, p+"sem", 3, 2, time.Hour) // 2 live slot rows, 1 released

		got, err := op.Count(ctx, p)
		require.NoError(t, err)
		assert.Equal(t, admin.Counts{Total: 12, Live: 5, Expired: 2, Released: 5, Paused: 2, StopRequested: 2}, got)

		pages := func(state admin.LeaseState) (n, stopped int64) {
			opts := admin.ListOptions{Prefix: p, State: state, Limit: 2}
			for {
				page, err := op.List(ctx, opts)
				require.NoError(t, err)
				for _, li := range page {
					n++
					if li.StopRequested {
						stopped++
					}
				}
				if len(page) < opts.Limit {
					return n, stopped
				}
				opts.After = page[len(page)-1].Cursor
			}
		}
		total, stopped := pages("")
		assert.Equal(t, got.Total, total, "all")
		assert.Equal(t, got.StopRequested, stopped, "stop requested")
		for state, want := range map[admin.LeaseState]int64{
			admin.StateLive: got.Live, admin.StateExpired: got.Expired, admin.StateReleased: got.Released, admin.StatePaused: got.Paused,
		} {
			n, _ := pages(state)
			assert.Equal(t, want, n, "state %s", state)
		}

		none, err := op.Count(ctx, p+"nothing-here")
		require.NoError(t, err)
		assert.Zero(t, none)
		_, err = op.Count(ctx, "a\x00")
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	})
}

// Holder keeps the rows whose holder is exactly the one given, in every
// state and order.
func TestList_Holder(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		p := testkit.NewTarget(t) + "/"
		holders := map[string]*gormlease.Repository{}
		for _, h := range []string{"host-a", "host-b", "host-a2"} {
			repo, err := gormlease.NewRepository(db, gormlease.WithHolder(h))
			require.NoError(t, err)
			holders[h] = repo
		}
		op := admin.New(holders["host-a"])
		for i, h := range []string{"host-a", "host-b", "host-a", "host-a2", "host-a"} {
			l, err := holders[h].Acquire(ctx, fmt.Sprintf("%s%d", p, i), time.Hour)
			require.NoError(t, err)
			if i == 2 {
				require.NoError(t, holders[h].Release(ctx, l))
			}
		}
		for _, order := range []admin.Order{admin.OrderKey, admin.OrderAge, admin.OrderHeldSince, admin.OrderExpiry} {
			got := listAll(t, op, admin.ListOptions{Prefix: p, Holder: "host-a", Order: order}, 1, nil)
			assert.ElementsMatch(t, []string{p + "0", p + "2", p + "4"}, got, "order %q", order)
		}
		live, err := op.List(ctx, admin.ListOptions{Prefix: p, Holder: "host-a", State: admin.StateLive})
		require.NoError(t, err)
		assert.Len(t, live, 2)
		none, err := op.List(ctx, admin.ListOptions{Prefix: p, Holder: "host"})
		require.NoError(t, err)
		assert.Empty(t, none, "a holder is matched exactly")
	})
}

// The headline defect of issue 41: a filter of the paused targets must
// find every one of them however many rows there are and wherever their
// keys fall, not only those among the first rows read. 35,000 rows, five
// of them paused across the key range: List of StatePaused returns the
// five, in one page or one at a time, and Count counts them. Not
// parallel: its 35,000-row inserts would slow the database under the
// package's other tests, whose timeouts are short.
func TestList_PausedAmongManyRows(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := emptyDB(t, s)
		_, op := newOperator(t, db)
		const n = 35000
		fillReleased(t, s, db, "many/", n)
		var paused []string
		for _, i := range []int{0, 8765, 17500, 26001, n - 1} {
			key := fmt.Sprintf("many/%05d", i)
			require.NoError(t, op.Pause(ctx, key, "deploy"))
			paused = append(paused, key)
		}
		for _, order := range []admin.Order{admin.OrderKey, admin.OrderAge, admin.OrderExpiry, admin.OrderHeldSince} {
			page, err := op.List(ctx, admin.ListOptions{State: admin.StatePaused, Order: order})
			require.NoError(t, err)
			var got []string
			for _, li := range page {
				assert.True(t, li.Paused)
				got = append(got, li.Key)
			}
			assert.ElementsMatch(t, paused, got, "order %q", order)
			assert.ElementsMatch(t, paused, listAll(t, op, admin.ListOptions{State: admin.StatePaused, Order: order}, 1, nil),
				"order %q, a row a page", order)
		}
		counts, err := op.Count(ctx, "")
		require.NoError(t, err)
		assert.Equal(t, admin.Counts{Total: n, Released: n, Paused: 5}, counts)
	})
}

// fillReleased inserts n released rows, keyed prefix and a number of five
// digits from 00000, in one statement.
func fillReleased(t *testing.T, s *testdb.Server, db *gorm.DB, prefix string, n int) {
	t.Helper()
	// The numbers 0..99999 from five digits, portable to every database.
	digits := "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
		" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	number := "d1.d * 10000 + d2.d * 1000 + d3.d * 100 + d4.d * 10 + d5.d"
	key := "? || d1.d || d2.d || d3.d || d4.d || d5.d"
	now := map[string]string{"postgres": "clock_timestamp()", "mysql": "UTC_TIMESTAMP(6)",
		"sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}[s.Name]
	if s.Name == "mysql" {
		key = "CONCAT(?, d1.d, d2.d, d3.d, d4.d, d5.d)"
	}
	res := db.Exec("INSERT INTO job_lease (target_id, lease_token, generation, holder, updated_at, released_at, timeout_ms)"+
		" SELECT "+key+", '00000000-0000-0000-0000-000000000001', 1, 'filler', "+now+", "+now+", 60000"+
		" FROM "+digits+" d1, "+digits+" d2, "+digits+" d3, "+digits+" d4, "+digits+" d5"+
		" WHERE "+number+" < ?", prefix, n)
	require.NoError(t, res.Error)
	require.EqualValues(t, n, res.RowsAffected)
}
