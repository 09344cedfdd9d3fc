package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// bulk is a table of n lease rows, t/00000 to t/NNNNN, in a database of
// its own: every row released an hour ago, except every 100th (live,
// beaten a second ago, held since 10 s ago; t/07700 since 5 h ago) and
// each one whose number ends in 050 (expired two hours ago; t/20050 three
// hours ago). Holders are worker-0 to worker-6, by number modulo 7.
// paused are paused; stopped are asked to stop.
func bulk(t testing.TB, s *testdb.Server, n int, paused, stopped []int) *gorm.DB {
	t.Helper()
	ctx := context.Background()
	db := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(ctx, db))
	timeout := int64(60000)
	rows := make([]gormlease.JobLease, n)
	now := time.Now()
	for i := range rows {
		rows[i] = gormlease.JobLease{TargetID: fmt.Sprintf("t/%05d", i), LeaseToken: uuid.New(), Generation: 1,
			Holder: fmt.Sprintf("worker-%d", i%7), UpdatedAt: now, TimeoutMS: &timeout}
	}
	require.NoError(t, db.CreateInBatches(rows, 500).Error)
	lease := func() *gorm.DB { return db.Table("job_lease") }
	require.NoError(t, lease().Where("1 = 1").Updates(map[string]any{"updated_at": s.Ago(time.Hour), "released_at": s.Ago(time.Hour)}).Error)
	require.NoError(t, lease().Where("target_id LIKE ?", "t/%00").Updates(map[string]any{
		"updated_at": s.Ago(time.Second), "released_at": nil, "acquired_at": s.Ago(10 * time.Second)}).Error)
	require.NoError(t, lease().Where("target_id = ?", "t/07700").Update("acquired_at", s.Ago(5*time.Hour)).Error)
	require.NoError(t, lease().Where("target_id LIKE ?", "t/%050").Updates(map[string]any{
		"updated_at": s.Ago(2 * time.Hour), "released_at": nil, "acquired_at": s.Ago(3 * time.Hour)}).Error)
	require.NoError(t, lease().Where("target_id = ?", "t/20050").Update("updated_at", s.Ago(3*time.Hour)).Error)
	for _, i := range paused {
		require.NoError(t, lease().Where("target_id = ?", fmt.Sprintf("t/%05d", i)).Updates(map[string]any{
			"paused_at": s.Ago(time.Minute), "pause_reason": "hold", "paused_by": "alice"}).Error)
	}
	for _, i := range stopped {
		require.NoError(t, lease().Where("target_id = ?", fmt.Sprintf("t/%05d", i)).Updates(map[string]any{
			"stop_generation": 1, "stop_reason": "stuck", "stop_by": "bob"}).Error)
	}
	if s.Name == "postgres" {
		// As autovacuum leaves a table: its statistics and visibility map
		// up to date, so that the planner knows its rows.
		require.NoError(t, db.Exec("VACUUM ANALYZE job_lease").Error)
	}
	return db
}

// between is the part of body from start to end (exclusive), or "".
func between(body, start, end string) string {
	i := strings.Index(body, start)
	if i < 0 {
		return ""
	}
	j := strings.Index(body[i:], end)
	if j < 0 {
		return body[i:]
	}
	return body[i : i+j]
}

var nextLink = regexp.MustCompile(`id="next" href="\./(\?[^"]*)"`)

// next is the list page's link to the next page, or "".
func next(body string) string {
	if m := nextLink.FindStringSubmatch(body); m != nil {
		return "/" + strings.ReplaceAll(m[1], "&amp;", "&")
	}
	return ""
}

// Among 35,000 rows, ?state=paused shows every one of the 5 paused
// targets on its first page, and no link to a next one (it filtered the
// first 20,000 rows in Go, showing 3); the counts say how many rows are in
// each state, and a banner how many are expired; the orders sort by age,
// time held and expiry, and pages follow each other in that order; the
// holder filter keeps that holder's rows.
func TestList_FiltersCountsAndOrdersAmong35000RowsOnEveryDatabase(t *testing.T) {
	paused := []int{1000, 9000, 17000, 26000, 34999}
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := bulk(t, s, 35000, paused, []int{300, 400})
		h, _ := newConsole(t, db)

		r := get(t, h, "/?state=paused")
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Equal(t, []string{"t/01000", "t/09000", "t/17000", "t/26000", "t/34999"}, keys(r.body))
		assert.Empty(t, next(r.body), "a next page after the last paused row")
		assert.Contains(t, rowOf(r.body, "t/01000"), `title="hold (by alice)">paused</span>`)

		r = get(t, h, "/?state=paused&format=json")
		require.Equal(t, http.StatusOK, r.status, r.body)
		var js struct {
			Counts struct{ Total, Live, Expired, Released, Paused int64 }
			Rows   []struct{ Key string }
			Next   string
		}
		require.NoError(t, json.Unmarshal([]byte(r.body), &js))
		assert.Len(t, js.Rows, 5, "the JSON view's paused rows")
		assert.Empty(t, js.Next)
		assert.Equal(t, int64(35000), js.Counts.Total)
		assert.Equal(t, int64(5), js.Counts.Paused)
		assert.Equal(t, int64(35), js.Counts.Expired)

		r = get(t, h, "/?limit=5")
		require.Equal(t, http.StatusOK, r.status, r.body)
		counts := between(r.body, `<p class="counts"`, `<form`)
		for id, n := range map[string]int{"live": 350, "expired": 35, "released": 34615, "paused": 5, "stop": 2} {
			assert.Contains(t, counts, fmt.Sprintf(`<b id="count-%s">%d</b>`, id, n), id)
		}
		assert.Contains(t, counts, "all <b>35000</b>")
		assert.Contains(t, counts, `<p class="warn" id="expired-banner"><strong>35 expired</strong>`)
		assert.Contains(t, counts, `href="./?limit=5&amp;order=expiry&amp;state=expired">Show them`)
		assert.NotContains(t, get(t, h, "/?state=expired&limit=5").body, "expired-banner", "the banner on the expired rows")

		// By expiry: the 35 expired (the longest expired first), then the
		// live ones, page after page.
		var seen []string
		for page, link := 0, "/?order=expiry&limit=10"; page < 4; page++ {
			r = get(t, h, link)
			require.Equal(t, http.StatusOK, r.status, r.body)
			seen = append(seen, keys(r.body)...)
			link = next(r.body)
			require.NotEmpty(t, link)
		}
		require.Len(t, seen, 40)
		assert.Equal(t, "t/20050", seen[0], "the longest expired first")
		distinct := map[string]bool{}
		for i, k := range seen {
			distinct[k] = true
			if i < 35 {
				assert.True(t, strings.HasSuffix(k, "050"), "row %d, %s, is not an expired one", i, k)
			} else {
				assert.True(t, strings.HasSuffix(k, "00"), "row %d, %s, is not a live one", i, k)
			}
		}
		assert.Len(t, distinct, 40, "a row on two pages")
		assert.Equal(t, "t/20050", keys(get(t, h, "/?order=age&limit=3").body)[0], "the longest silent first")
		r = get(t, h, "/?order=held&limit=2&state=live")
		assert.Equal(t, []string{"t/07700", "t/00000"}, keys(r.body), "the longest held first")
		assert.Regexp(t, `<td><span title="since [0-9: -]+Z">5h0m0s</span></td>`, rowOf(r.body, "t/07700"), "held for")

		r = get(t, h, "/?holder=worker-3&state=live&limit=1000")
		require.Equal(t, http.StatusOK, r.status, r.body)
		ks := keys(r.body)
		assert.Len(t, ks, 50, "the live rows of worker-3: one in 7 of 350")
		for _, k := range ks {
			assert.Contains(t, rowOf(r.body, k), "<td>worker-3</td>")
		}
		assert.Empty(t, keys(get(t, h, "/?holder=nobody").body))
		assert.Equal(t, http.StatusBadRequest, get(t, h, "/?order=random").status)
	})
}

// The identity that WithIdentity returns is recorded in the row of the
// action's target (who paused, who asked to stop, who released by
// force), and shown on the target's page and in the JSON view.
func TestIdentity_RecordedInTheRowOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		h, logs := newConsole(t, db, console.WithAuthorizer(allowAll),
			console.WithIdentity(func(r *http.Request) string { return r.Header.Get("X-User") }))
		as := func(user string) map[string]string {
			return map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin", "X-User": user}
		}
		require.Equal(t, http.StatusSeeOther, post(h, "pause", f.live, "deploy", as("alice")).status)
		require.Equal(t, http.StatusSeeOther, post(h, "stop", f.live, "stuck", as("bob")).status)
		li := state(t, f.repo, f.live)
		assert.Equal(t, "alice", li.PausedBy)
		assert.Equal(t, "bob", li.StopBy)
		page := get(t, h, "/target?id="+url.QueryEscape(f.live))
		assert.Contains(t, page.body, `<dd id="paused-by">alice</dd>`)
		assert.Contains(t, page.body, `<dd id="stop-by">bob</dd>`)
		js := get(t, h, "/target?format=json&id="+url.QueryEscape(f.live))
		assert.Contains(t, js.body, `"paused_by": "alice"`)
		assert.Contains(t, js.body, `"stop_by": "bob"`)

		require.Equal(t, http.StatusSeeOther, post(h, "release", f.live, "gone", as("carol")).status)
		li = state(t, f.repo, f.live)
		require.NotNil(t, li.Row.Failure)
		assert.Contains(t, *li.Row.Failure, "by operator carol")
		assert.Regexp(t, `msg="console: action done" action=release .* operator=carol`, logs.String())

		require.Equal(t, http.StatusSeeOther, post(h, "resume", f.live, "", as("alice")).status)
		assert.Empty(t, state(t, f.repo, f.live).PausedBy, "resume clears who paused")
		require.Equal(t, http.StatusSeeOther, post(h, "pause", f.released, "no name", as("")).status)
		assert.Empty(t, state(t, f.repo, f.released).PausedBy, `"" records no identity`)
	})
}

// A live lease's page and list row say since when it is held, and for
// how long; the JSON view too.
func TestHeldSince_OnTheListAndThePageOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		require.NoError(t, db.Table("job_lease").Where("target_id = ?", f.live).Update("acquired_at", s.Ago(90*time.Minute)).Error)
		h, _ := newConsole(t, db)
		list := get(t, h, "/?prefix="+url.QueryEscape(f.prefix))
		assert.Regexp(t, `<td><span title="since [0-9: -]+Z">1h30m0s</span></td>`, rowOf(list.body, f.live))
		assert.Contains(t, rowOf(list.body, f.released), `<td><span class="muted">–</span></td>`)
		page := get(t, h, "/target?id="+url.QueryEscape(f.live))
		assert.Regexp(t, `<dd id="held-since">[0-9: -]+Z \(held for 1h30m0s\)</dd>`, page.body)
		js := get(t, h, "/target?format=json&id="+url.QueryEscape(f.live))
		assert.Regexp(t, `"held_for_ms": 5400[0-9]{3},`, js.body)
		assert.Regexp(t, `"acquired_at": "[0-9T:.-]+Z"`, js.body)
	})
}
