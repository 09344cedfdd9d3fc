package admin_test

import (
	"context"
	"encoding/base64"
	"strings"
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

// setAcquired sets target's acquired_at d back on the database's clock,
// or to NULL when d is negative.
func setAcquired(t *testing.T, s *testdb.Server, db *gorm.DB, target string, d time.Duration) {
	t.Helper()
	var value any = s.Ago(d)
	if d < 0 {
		value = nil
	}
	res := db.Model(&gormlease.JobLease{}).Where("target_id = ?", target).Update("acquired_at", value)
	require.NoError(t, res.Error)
	if d >= 0 { // MySQL counts the rows changed: none when it was NULL
		require.EqualValues(t, 1, res.RowsAffected)
	}
}

// copyTimes gives target the updated_at and acquired_at of from, to the
// microsecond: rows that tie in every order but by key. (MySQL reads the
// table it updates only through a derived table.)
func copyTimes(t *testing.T, db *gorm.DB, from, target string) {
	t.Helper()
	res := db.Exec("UPDATE job_lease SET"+
		" updated_at = (SELECT u FROM (SELECT updated_at AS u FROM job_lease WHERE target_id = ?) AS f),"+
		" acquired_at = (SELECT a FROM (SELECT acquired_at AS a FROM job_lease WHERE target_id = ?) AS g)"+
		" WHERE target_id = ?", from, from, target)
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
}

// listAll pages through the rows that opts chooses, limit rows a page,
// by the Cursor of each page's last row, and returns their keys in the
// order read; between pages it calls between, when set, with the number
// of pages read.
func listAll(t *testing.T, op *admin.Operator, opts admin.ListOptions, limit int, between func(page int)) []string {
	t.Helper()
	opts.Limit = limit
	var keys []string
	for page := 1; ; page++ {
		rows, err := op.List(context.Background(), opts)
		require.NoError(t, err)
		for _, li := range rows {
			keys = append(keys, li.Key)
		}
		if len(rows) < limit {
			return keys
		}
		require.Less(t, page, 1000, "paging does not end")
		opts.After = rows[len(rows)-1].Cursor
		if between != nil {
			between(page)
		}
	}
}

// Each order sorts the rows as its doc says, on every database: by the
// last heartbeat, by the acquisition (released rows and rows without one
// last), by the expiry (the expired first, a row without a timeout expired
// since its last heartbeat, released rows last); ties, to the microsecond,
// by key. A page at a time through the cursors, down to one row a page,
// reads the same rows in the same order as one page of them all.
func TestList_Orders(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		p := testkit.NewTarget(t) + "/"
		acquire := func(name string, timeout, updated, acquired time.Duration) {
			_, err := repo.Acquire(ctx, p+name, timeout)
			require.NoError(t, err)
			testkit.Age(t, s, db, p+name, updated)
			setAcquired(t, s, db, p+name, acquired)
		}
		acquire("a", time.Hour, 10*time.Second, time.Hour)        // live, expires in 59m50s
		acquire("b", 10*time.Minute, 30*time.Second, 2*time.Hour) // live, expires in 9m30s
		acquire("c", time.Minute, 2*time.Hour, 3*time.Hour)       // expired 1h59m ago
		acquire("e", time.Hour, 20*time.Second, -1)               // live, no acquired_at, expires in 59m40s
		acquire("f", 10*time.Minute, 30*time.Second, 2*time.Hour) // b's twin, times copied below
		acquire("g", time.Hour, 5*time.Minute, 4*time.Hour)       // no timeout recorded, set below
		copyTimes(t, db, p+"b", p+"f")
		require.NoError(t, db.Model(&gormlease.JobLease{}).Where("target_id = ?", p+"g").Update("timeout_ms", nil).Error)
		for _, name := range []string{"d", "h"} { // released, acquired long ago
			l, err := repo.Acquire(ctx, p+name, time.Hour)
			require.NoError(t, err)
			require.NoError(t, repo.Release(ctx, l))
			setAcquired(t, s, db, p+name, 5*time.Hour)
		}

		keys := func(names ...string) []string {
			out := make([]string, len(names))
			for i, n := range names {
				out[i] = p + n
			}
			return out
		}
		type listing struct {
			order admin.Order
			state admin.LeaseState
		}
		for l, want := range map[listing][]string{
			{admin.OrderKey, ""}:                        keys("a", "b", "c", "d", "e", "f", "g", "h"),
			{admin.OrderAge, ""}:                        keys("c", "g", "b", "f", "e", "a", "d", "h"),
			{admin.OrderHeldSince, ""}:                  keys("g", "c", "b", "f", "a", "d", "e", "h"),
			{admin.OrderExpiry, ""}:                     keys("c", "g", "b", "f", "e", "a", "d", "h"),
			{admin.OrderHeldSince, admin.StateLive}:     keys("b", "f", "a", "e"),
			{admin.OrderExpiry, admin.StateLive}:        keys("b", "f", "e", "a"),
			{admin.OrderHeldSince, admin.StateReleased}: keys("d", "h"),
			{admin.OrderExpiry, admin.StateReleased}:    keys("d", "h"),
			{admin.OrderAge, admin.StateExpired}:        keys("c", "g"),
		} {
			order := l.order
			opts := admin.ListOptions{Prefix: p, Order: order, State: l.state}
			all, err := op.List(ctx, opts)
			require.NoError(t, err)
			var got []string
			for _, li := range all {
				got = append(got, li.Key)
				if order == admin.OrderKey {
					assert.Equal(t, li.Key, li.Cursor, "in key order the cursor is the key")
				}
			}
			assert.Equal(t, want, got, "order %q, state %q", order, l.state)
			for _, limit := range []int{1, 2, 3} {
				assert.Equal(t, want, listAll(t, op, opts, limit, nil), "order %q, state %q, %d a page", order, l.state, limit)
			}
		}

		all, err := op.List(ctx, admin.ListOptions{Prefix: p})
		require.NoError(t, err)
		held := map[string]time.Duration{}
		for _, li := range all {
			held[li.Key] = li.HeldFor
		}
		assert.InDelta(t, time.Hour, held[p+"a"], float64(time.Minute), "a's HeldFor")
		assert.InDelta(t, 3*time.Hour, held[p+"c"], float64(time.Minute), "an expired row's HeldFor")
		assert.Zero(t, held[p+"d"], "a released row's HeldFor")
		assert.Zero(t, held[p+"e"], "HeldFor without acquired_at")
	})
}

// Paging by cursor while the rows change: in key order every row is read
// exactly once whatever happens to it between pages; in the order of
// acquisition a heartbeat moves nothing; in the orders of age and expiry a
// heartbeat moves the row to the end, where it is read again, as List's
// doc says, and every other row is read exactly once.
func TestList_PagingWhileRowsChange(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		repo, op := newOperator(t, db)
		p := testkit.NewTarget(t) + "/"
		const n = 12
		leases := map[string]gormlease.Lease{}
		var keys []string
		for i := range n {
			key := p + string(rune('a'+i))
			l, err := repo.Acquire(ctx, key, time.Hour)
			require.NoError(t, err)
			// The later the key, the older: every order but the key's
			// reads them backwards.
			testkit.Age(t, s, db, key, time.Duration(i+1)*time.Minute)
			setAcquired(t, s, db, key, time.Duration(i+1)*time.Hour)
			leases[key] = l
			keys = append(keys, key)
		}
		for _, order := range []admin.Order{admin.OrderKey, admin.OrderAge, admin.OrderHeldSince, admin.OrderExpiry} {
			// After each of the first two pages, renew rows that the pages
			// read already, and rows that they have not read yet.
			var renewed []string
			read := listAll(t, op, admin.ListOptions{Prefix: p, Order: order}, 3, func(page int) {
				if page > 2 {
					return
				}
				for _, key := range []string{keys[0], keys[n-1], keys[page], keys[n-1-page]} {
					require.NoError(t, repo.Heartbeat(ctx, leases[key]))
					renewed = append(renewed, key)
				}
			})
			seen := map[string]int{}
			for _, key := range read {
				seen[key]++
			}
			for _, key := range keys {
				switch {
				case seen[key] == 1:
				case seen[key] == 2 && (order == admin.OrderAge || order == admin.OrderExpiry) && contains(renewed, key):
				default:
					t.Errorf("order %q: %s read %d times (renewed between pages: %v)", order, key, seen[key], contains(renewed, key))
				}
			}
			assert.Len(t, seen, n, "order %q: rows read", order)
			for i, key := range keys { // age them again for the next order
				testkit.Age(t, s, db, key, time.Duration(i+1)*time.Minute)
			}
		}
	})
}

func contains(keys []string, key string) bool { return indexOf(keys, key) >= 0 }

func indexOf(keys []string, key string) int {
	for i, k := range keys {
		if k == key {
			return i
		}
	}
	return -1
}

// A cursor is only good in the order that made it: another order's, one
// that is not base64, or one without its parts, is refused as bad input;
// in key order any key is a cursor.
func TestList_RejectsBadCursors(t *testing.T) {
	t.Parallel()
	_, op := newOperator(t, testdb.SQLite(t).DB(t))
	ctx := context.Background()
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, o := range []admin.ListOptions{
		{Order: "random"},
		{Order: admin.OrderAge, After: "plain-key"},
		{Order: admin.OrderAge, After: enc("held:1:k")},
		{Order: admin.OrderAge, After: enc("age:1")},
		{Order: admin.OrderAge, After: enc("age:x:k")},
		{Order: admin.OrderAge, After: enc("age:1:")},
		{Order: admin.OrderExpiry, After: enc("expiry:1:a\x00")},
		{After: "a\x00"},
		{Holder: "a\x00"},
		{State: "held"},
		{Order: admin.OrderAge, After: strings.Repeat("A", 1000)},
	} {
		_, err := op.List(ctx, o)
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "%+v", o)
	}
	for _, o := range []admin.ListOptions{
		{Order: admin.OrderAge, After: enc("age:1733491200000000:k")},
		{Order: admin.OrderHeldSince, After: enc("held::k:with:colons")},
		{Order: admin.OrderExpiry, After: enc("expiry:-9223372036854775808:" + strings.Repeat("k", 255))},
		{After: "any key"},
	} {
		_, err := op.List(ctx, o)
		require.NoError(t, err, "%+v", o)
	}
}
