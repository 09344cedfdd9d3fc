package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// historyTables are the tables of the tests that need a history: the
// shared pool's default tables keep none.
var historyTables = gormlease.WithTableNames("hist_lease", "hist_result")

// historyOnce makes historyTables with history once per server.
var historyOnce sync.Map // server name -> *sync.Once

// historyDB is s's shared pool with historyTables made, keeping history.
func historyDB(t testing.TB, s *testdb.Server) *gorm.DB {
	t.Helper()
	db := s.DB(t)
	once, _ := historyOnce.LoadOrStore(s.Name, &sync.Once{})
	var err error
	once.(*sync.Once).Do(func() {
		err = gormlease.AutoMigrate(context.Background(), db, historyTables, gormlease.WithHistory())
	})
	require.NoError(t, err)
	return db
}

// historyEvent is an event of the JSON view.
type historyEvent struct {
	Seq            int64
	Kind           string
	Generation     int64
	Holder         string
	How            string
	FromGeneration int64 `json:"from_generation"`
	Operator       string
	Detail         string
	HeldForMS      *int64 `json:"held_for_ms"`
}

// targetHistory is the history of a target page's JSON view.
type targetHistory struct {
	Kept   bool
	Error  string
	Slot   int
	Events []historyEvent
	Older  int64
}

// readHistory reads the history of the JSON view of the target page at
// query (after target?).
func readHistory(t *testing.T, h http.Handler, query string) (targetHistory, response) {
	t.Helper()
	r := get(t, h, "/target?format=json&"+query)
	var v struct{ History targetHistory }
	require.NoError(t, json.Unmarshal([]byte(r.body), &v), r.body)
	return v.History, r
}

var entryTag = regexp.MustCompile(`<li class="(?:gen [a-z]+" data-generation="([0-9]+)"|op"><span class="act-([a-z_]+)")`)

// entries are the timeline's entries in a target page, in order: "gen N"
// for a generation, the event's kind for an operator's action.
func entries(body string) []string {
	var out []string
	for _, m := range entryTag.FindAllStringSubmatch(body, -1) {
		if m[1] != "" {
			out = append(out, "gen "+m[1])
		} else {
			out = append(out, m[2])
		}
	}
	return out
}

// entryOf is the timeline's entry of generation gen in a target page, or
// "".
func entryOf(body string, gen int64) string {
	i := strings.Index(body, fmt.Sprintf(`data-generation="%d"`, gen))
	if i < 0 {
		return ""
	}
	return body[i : i+strings.Index(body[i:], "\n</li>")]
}

// The target page's timeline shows, after a scripted sequence (a Run
// that saves; a takeover of an expired lease by a Run that fails; a
// pause and a resume from the console; a lease asked to stop and then
// released by force from the console), one entry per generation, newest
// first, with how it began and ended and how long it was held, and the
// operator's actions in their places; the JSON view has the same events.
func TestTimeline_ScriptedHistoryOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		target := newPrefix(t) + "report"
		saver, err := gormlease.NewRunner[string](db, historyTables, gormlease.WithHolder("worker-1"))
		require.NoError(t, err)
		_, err = saver.Run(ctx, target, func(context.Context) (string, error) { return "done", nil }, gormlease.SaveJSON[string])
		require.NoError(t, err)

		repo, err := gormlease.NewRepository(db, historyTables, gormlease.WithHolder("worker-2"))
		require.NoError(t, err)
		_, err = repo.Acquire(ctx, target, time.Minute)
		require.NoError(t, err)
		require.NoError(t, db.Table("hist_lease").Where("target_id = ?", target).
			Updates(map[string]any{"updated_at": s.Ago(time.Hour), "acquired_at": s.Ago(time.Hour)}).Error)
		failer, err := gormlease.NewRunner[string](db, historyTables, gormlease.WithHolder("worker-3"))
		require.NoError(t, err)
		_, err = failer.Run(ctx, target, func(context.Context) (string, error) { return "", errors.New("the API said <no>") }, gormlease.SaveJSON[string])
		require.ErrorContains(t, err, "the API said <no>")

		h, _ := newConsole(t, db, console.WithTables(historyTables), console.WithAuthorizer(allowAll),
			console.WithIdentity(func(r *http.Request) string { return r.Header.Get("X-User") }))
		as := func(user string) map[string]string {
			return map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin", "X-User": user}
		}
		require.Equal(t, http.StatusSeeOther, post(h, "pause", target, "deploy <v2>", as("alice")).status)
		require.Equal(t, http.StatusSeeOther, post(h, "resume", target, "", as("bob")).status)
		_, err = repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		require.Equal(t, http.StatusSeeOther, post(h, "stop", target, "stuck", as("carol")).status)
		require.Equal(t, http.StatusSeeOther, post(h, "release", target, "host gone", as("dave")).status)

		r := get(t, h, "/target?id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Equal(t, []string{"gen 4", "resumed", "paused", "gen 3", "gen 2", "gen 1"}, entries(r.body))
		g4, g3, g2, g1 := entryOf(r.body, 4), entryOf(r.body, 3), entryOf(r.body, 2), entryOf(r.body, 1)
		assert.Contains(t, g4, `<span class="holder">worker-2</span>`)
		assert.Contains(t, g4, "released from gen 3")
		assert.Contains(t, g4, `<span class="how">released by force</span> by <span class="operator">dave</span>`)
		assert.NotContains(t, g4, `<q class="detail">released by force`, "the row's failure text repeats the page")
		assert.Regexp(t, `<b>stop requested</b> by <span class="operator">carol</span>: <q class="detail">stuck</q>`, g4)
		assert.Contains(t, g3, `<span class="holder">worker-3</span>`)
		assert.Contains(t, g3, "expired from gen 2")
		assert.Regexp(t, `<span class="how">failed</span>: <q class="detail">[^<]*the API said &lt;no&gt;</q>`, g3)
		assert.Contains(t, g2, `<span class="how">expired, taken over</span>`)
		assert.Regexp(t, `<span class="held">held (59m|1h)`, g2, "held from its acquisition to its takeover: an hour, by the aged heartbeat")
		assert.Contains(t, g1, `<span class="holder">worker-1</span>`)
		assert.Contains(t, g1, "Began 20")
		assert.Contains(t, g1, ": new</div>")
		assert.Contains(t, g1, `<span class="how">saved</span>`)
		assert.Regexp(t, `<b>paused</b> by <span class="operator">alice</span>: <q class="detail">deploy &lt;v2&gt;</q>`, r.body)
		assert.Regexp(t, `<b>resumed</b> by <span class="operator">bob</span>`, r.body)
		assert.NotContains(t, r.body, `id="older"`)

		hist, r := readHistory(t, h, "id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.True(t, hist.Kept)
		var kinds []string
		for _, e := range hist.Events {
			kinds = append(kinds, fmt.Sprintf("%s %d %s", e.Kind, e.Generation, e.How))
		}
		assert.Equal(t, []string{
			"ended 4 forced", "stop_requested 4 ", "acquired 4 released",
			"resumed 3 ", "paused 3 ",
			"ended 3 failed", "acquired 3 expired", "ended 2 expired", "acquired 2 released",
			"ended 1 saved", "acquired 1 new",
		}, kinds)
		assert.Contains(t, hist.Events[5].Detail, ": the API said <no>", "as stored, not escaped")
		assert.Equal(t, int64(2), hist.Events[6].FromGeneration)
		assert.Equal(t, "alice", hist.Events[4].Operator)
		assert.Zero(t, hist.Older)
	})
}

// The page of a target whose lease table keeps no history says so in one
// line, with how to turn it on; the JSON view has kept false. A target
// with neither rows nor events is still a 404.
func TestTimeline_NoHistoryOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		h, _ := newConsole(t, db)
		r := get(t, h, "/target?id="+url.QueryEscape(f.live))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, `<p class="muted" id="no-history">This lease table keeps no history: turn it on with <code>gormlease.AutoMigrate(ctx, db, gormlease.WithHistory())</code> or <code>gormlease migrate -history</code>.</p>`)
		assert.Contains(t, r.body, `class="state live"`, "the rest of the page")
		hist, r := readHistory(t, h, "id="+url.QueryEscape(f.live))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.False(t, hist.Kept)
		assert.Empty(t, hist.Error)
		assert.NotNil(t, hist.Events)
		assert.Empty(t, hist.Events)

		hdb := historyDB(t, s)
		hh, _ := newConsole(t, hdb, console.WithTables(historyTables))
		r = get(t, hh, "/target?id="+url.QueryEscape(f.prefix+"nothing"))
		assert.Equal(t, http.StatusNotFound, r.status, r.body)
		assert.Contains(t, r.body, "No events.")
	})
}

// An error reading the history (an event table that is not what
// AutoMigrate makes) is shown in the history's section, as an error, and
// logged; the rest of the page is as usual. A bad ?before= or ?history=
// is a 400 that says why.
func TestTimeline_ReadErrorOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		tables := gormlease.WithTableNames("broken_lease", "broken_result")
		require.NoError(t, gormlease.AutoMigrate(ctx, db, tables))
		require.NoError(t, db.Exec("CREATE TABLE IF NOT EXISTS broken_lease_event (target_id varchar(255) NOT NULL, note varchar(16))").Error)
		repo, err := gormlease.NewRepository(db, tables)
		require.NoError(t, err)
		target := newPrefix(t) + "broken"
		_, err = repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		h, logs := newConsole(t, db, console.WithTables(tables))
		r := get(t, h, "/target?id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Regexp(t, `<p class="error" id="history-error">could not read the history: [^<]+</p>`, r.body)
		assert.Contains(t, r.body, `class="state live"`, "the rest of the page")
		assert.Contains(t, logs.String(), `msg="console: read history"`)
		hist, r := readHistory(t, h, "id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.True(t, hist.Kept)
		assert.Contains(t, hist.Error, "could not read the history")

		for _, c := range []struct{ query, says string }{
			{"&before=0", `before "0": give a position in the history`},
			{"&before=x", `before "x"`},
			{"&history=0", `history "0": give a slot's number, from 1 to 100`},
			{"&history=101", `history "101"`},
		} {
			r := get(t, h, "/target?id="+url.QueryEscape(target)+c.query)
			assert.Equal(t, http.StatusBadRequest, r.status, c.query)
			assert.Contains(t, html.UnescapeString(r.body), c.says, c.query)
		}
	})
}

// A semaphore's page links to each slot's history, and ?history=N shows
// slot N's.
func TestTimeline_SlotHistoryOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		target := newPrefix(t) + "thumbs"
		repo, err := gormlease.NewRepository(db, historyTables, gormlease.WithHolder("slot-worker"))
		require.NoError(t, err)
		l, err := repo.AcquireSlot(ctx, target, 2, time.Hour)
		require.NoError(t, err)
		_, err = repo.AcquireSlot(ctx, target, 2, time.Hour)
		require.NoError(t, err)
		require.NoError(t, repo.Release(ctx, l))
		h, _ := newConsole(t, db, console.WithTables(historyTables))
		r := get(t, h, "/target?id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		esc := strings.ReplaceAll(url.QueryEscape(target), "+", "&#43;")
		assert.Contains(t, r.body, `<a href="target?id=`+esc+`&amp;history=1#timeline">slot 1</a>`)
		assert.Contains(t, r.body, `<a href="target?id=`+esc+`&amp;history=2#timeline">slot 2</a>`)

		for slot := 1; slot <= 2; slot++ {
			r = get(t, h, "/target?history="+strconv.Itoa(slot)+"&id="+url.QueryEscape(target))
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Contains(t, r.body, fmt.Sprintf("History of slot %d</h2>", slot))
			hist, _ := readHistory(t, h, "history="+strconv.Itoa(slot)+"&id="+url.QueryEscape(target))
			assert.Equal(t, slot, hist.Slot)
			assert.NotEmpty(t, hist.Events, "slot %d", slot)
		}
	})
}

// bulkEvents writes n events (n <= 100,000) of target's history, as the
// triggers write them: generations of an acquisition and an end (saved),
// in one statement on s.
func bulkEvents(t testing.TB, s *testdb.Server, db *gorm.DB, target string, n int) {
	t.Helper()
	div, at := "/", "?" // integer division; a time parameter
	switch s.Name {
	case "mysql":
		div = "DIV"
	case "postgres":
		at = "CAST(? AS timestamptz)"
	}
	digits := "(SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
		" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	require.NoError(t, db.Exec(`INSERT INTO hist_lease_event
		(target_id, seq, at, kind, generation, holder, how, from_generation, acquired_at, operator, detail)
		SELECT ?, s.n, `+at+`, CASE WHEN s.n % 2 = 1 THEN 'acquired' ELSE 'ended' END, (s.n + 1) `+div+` 2, 'worker-1',
			CASE WHEN s.n = 1 THEN 'new' WHEN s.n % 2 = 1 THEN 'released' ELSE 'saved' END,
			CASE WHEN s.n % 2 = 1 AND s.n > 1 THEN (s.n - 1) `+div+` 2 END,
			CASE WHEN s.n % 2 = 0 THEN `+at+` END, NULL, NULL
		FROM (SELECT a.n + 10*b.n + 100*c.n + 1000*d.n + 10000*e.n + 1 AS n
			FROM `+digits+` a, `+digits+` b, `+digits+` c, `+digits+` d, `+digits+` e) s
		WHERE s.n <= ?`, target, time.Now().UTC(), time.Now().UTC().Add(-time.Second), n).Error)
}

// A target with 100,000 events: its page reads one page of them, and
// takes about the time of a target with 100 (logged; the figures are in
// the commit that added the test); its older link pages on, each page
// following the last without a gap.
func TestTimeline_HundredThousandEventsOnEveryDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 events per database")
	}
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db := historyDB(t, s)
		p := newPrefix(t)
		big, small := p+"big", p+"small"
		bulkEvents(t, s, db, big, 100000)
		bulkEvents(t, s, db, small, 100)
		// The statistics that autovacuum (PostgreSQL) or InnoDB would
		// gather soon after such a load: with those of an empty table,
		// PostgreSQL reads every event of the target and sorts them.
		analyze := map[string]string{"postgres": "ANALYZE hist_lease_event", "mysql": "ANALYZE TABLE hist_lease_event", "sqlite": "ANALYZE hist_lease_event"}
		require.NoError(t, db.Exec(analyze[s.Name]).Error)
		h, _ := newConsole(t, db, console.WithTables(historyTables))
		page := func(target string) time.Duration {
			start := time.Now()
			r := get(t, h, "/target?id="+url.QueryEscape(target))
			took := time.Since(start)
			require.Equal(t, http.StatusOK, r.status, r.body)
			return took
		}
		median := func(target string) time.Duration {
			page(target) // untimed: the pool's connections are open
			var took []time.Duration
			for range 15 {
				took = append(took, page(target))
			}
			slices.Sort(took)
			return took[len(took)/2]
		}
		bigTook, smallTook := median(big), median(small)
		t.Logf("%s: target page with 100,000 events: median %v; with 100: %v", s.Name, bigTook, smallTook)
		assert.Less(t, bigTook, 2*time.Second, "a page of 100,000 events")

		hist, r := readHistory(t, h, "id="+url.QueryEscape(big))
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Len(t, hist.Events, 100, "one page: 50 whole generations")
		assert.Equal(t, int64(100000), hist.Events[0].Seq)
		assert.Equal(t, "acquired", hist.Events[99].Kind)
		assert.Equal(t, int64(99901), hist.Older)
		body := get(t, h, "/target?id="+url.QueryEscape(big)).body
		assert.Len(t, entries(body), 50)
		for range 3 {
			older := hist.Older
			hist, r = readHistory(t, h, "id="+url.QueryEscape(big)+"&before="+strconv.FormatInt(older, 10))
			require.Equal(t, http.StatusOK, r.status, r.body)
			require.Len(t, hist.Events, 100)
			assert.Equal(t, older-1, hist.Events[0].Seq, "the older page follows on")
			assert.Equal(t, older-100, hist.Older)
		}
		hist, _ = readHistory(t, h, "id="+url.QueryEscape(big)+"&before=3")
		assert.Len(t, hist.Events, 2)
		assert.Zero(t, hist.Older, "the last page")
		assert.Equal(t, "new", hist.Events[1].How)
	})
}
