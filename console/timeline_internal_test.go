package console

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/admin"
)

// script is a history as a scripted run of a target writes it, newest
// first: generation 1 saves and ends saved, a pause and a resume between
// generations, generation 2 is asked to stop and stops, generation 3
// expires and generation 4 takes it over and fails, generation 5 is
// released by force, and generation 6 is held now.
func script(t0 time.Time) []admin.Event {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	acq := func(s int) *time.Time { a := at(s); return &a }
	evs := []admin.Event{
		{Seq: 1, At: at(0), Kind: admin.EventAcquired, Generation: 1, Holder: "w-1", How: "new"},
		{Seq: 2, At: at(1), Kind: admin.EventSaved, Generation: 1, Holder: "w-1"},
		{Seq: 3, At: at(2), Kind: admin.EventEnded, Generation: 1, Holder: "w-1", How: "saved", AcquiredAt: acq(0)},
		{Seq: 4, At: at(3), Kind: admin.EventPaused, Generation: 1, Operator: "alice", Detail: "deploy"},
		{Seq: 5, At: at(4), Kind: admin.EventResumed, Generation: 1, Operator: "bob"},
		{Seq: 6, At: at(5), Kind: admin.EventAcquired, Generation: 2, Holder: "w-2", How: "released", FromGeneration: 1},
		{Seq: 7, At: at(6), Kind: admin.EventStopRequested, Generation: 2, Holder: "w-2", Operator: "carol", Detail: "stuck"},
		{Seq: 8, At: at(8), Kind: admin.EventEnded, Generation: 2, Holder: "w-2", How: "stopped", AcquiredAt: acq(5)},
		{Seq: 9, At: at(10), Kind: admin.EventAcquired, Generation: 3, Holder: "w-3", How: "released", FromGeneration: 2},
		{Seq: 10, At: at(100), Kind: admin.EventEnded, Generation: 3, Holder: "w-3", How: "expired", AcquiredAt: acq(10)},
		{Seq: 11, At: at(100), Kind: admin.EventAcquired, Generation: 4, Holder: "w-4", How: "expired", FromGeneration: 3},
		{Seq: 12, At: at(101), Kind: admin.EventEnded, Generation: 4, Holder: "w-4", How: "failed", AcquiredAt: acq(100), Detail: "the API said no"},
		{Seq: 13, At: at(102), Kind: admin.EventAcquired, Generation: 5, Holder: "w-5", How: "released", FromGeneration: 4},
		{Seq: 14, At: at(112), Kind: admin.EventEnded, Generation: 5, Holder: "w-5", How: "forced", AcquiredAt: acq(102), Operator: "dave", Detail: "host gone"},
		{Seq: 15, At: at(120), Kind: admin.EventAcquired, Generation: 6, Holder: "w-6", How: "released", FromGeneration: 5},
	}
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs
}

// renderTarget renders the target page of v as the handler does.
func renderTarget(t *testing.T, v targetView) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, targetTmpl.ExecuteTemplate(&buf, "page", view{Title: v.TargetID, Nonce: "n", Body: v}))
	return buf.String()
}

var timelineItem = regexp.MustCompile(`<li class="(gen [a-z]+|op)"(?: data-generation="([0-9]+)")?`)

// The events group into one entry per generation, newest first, each
// with how it began, its saves, how it ended (with the operator and the
// failure's text) and how long it was held; the operator's actions
// between generations are entries of their own, in their place, and the
// one during a generation is in it. The generation held now says so.
func TestTimeline_GroupsAGenerationPerEntry(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	evs := script(t0)
	cur := &row{State: string(admin.StateLive), Generation: 6, AcquiredAt: &evs[0].At, HeldFor: 7 * time.Second}
	entries := group(evs, cur)
	var got []string
	for _, e := range entries {
		if e.Gen != nil {
			got = append(got, "gen "+e.Gen.Holder)
		} else {
			got = append(got, operatorAct(*e.Action))
		}
	}
	assert.Equal(t, []string{"gen w-6", "gen w-5", "gen w-4", "gen w-3", "gen w-2", "resumed", "paused", "gen w-1"}, got)

	g6, g5, g4, g3, g2, g1 := entries[0].Gen, entries[1].Gen, entries[2].Gen, entries[3].Gen, entries[4].Gen, entries[7].Gen
	assert.Equal(t, "live", g6.Now)
	assert.Equal(t, "held 7.0s so far", g6.Held())
	assert.Equal(t, "released from gen 5", g6.HowBegan())
	assert.Equal(t, "released by force", g5.HowEnded())
	assert.Equal(t, "held 10.0s", g5.Held())
	assert.Equal(t, "expired from gen 3", g4.HowBegan())
	assert.Equal(t, "failed", g4.HowEnded())
	assert.Equal(t, "expired, taken over", g3.HowEnded())
	assert.Equal(t, "held 1m30s", g3.Held())
	require.Len(t, g2.During, 1)
	assert.Equal(t, "carol", g2.During[0].Operator)
	assert.Equal(t, "stopped on request", g2.HowEnded())
	assert.Equal(t, "new", g1.HowBegan())
	assert.Equal(t, 1, g1.Saves)
	assert.Equal(t, "saved", g1.HowEnded())

	page := renderTarget(t, targetView{TargetID: "report", History: timeline{TargetID: "report", Kept: true, Events: evs, Entries: entries}})
	var items []string
	for _, m := range timelineItem.FindAllStringSubmatch(page, -1) {
		items = append(items, strings.TrimSpace(m[1]+" "+m[2]))
	}
	assert.Equal(t, []string{"gen open 6", "gen bad 5", "gen bad 4", "gen bad 3", "gen good 2", "op", "op", "gen good 1"}, items)
	for _, want := range []string{
		`Ended 2026-03-01 12:01:52Z: <span class="how">released by force</span> by <span class="operator">dave</span>: <q class="detail">host gone</q>`,
		`<span class="how">failed</span>: <q class="detail">the API said no</q>`,
		`<b>stop requested</b> by <span class="operator">carol</span>: <q class="detail">stuck</q>`,
		`<b>paused</b> by <span class="operator">alice</span>: <q class="detail">deploy</q>`,
		`Saved 1 time keeping the lease, the last 2026-03-01 12:00:01Z`,
		`Began 2026-03-01 12:01:40Z: expired from gen 3`,
		`<div class="ended muted">Held now</div>`,
	} {
		assert.Contains(t, page, want)
	}
	assert.NotContains(t, page, `id="older"`)
}

// Every text of an event (holder, operator, failure, reason) renders
// inert: escaped in the page, as it is in the JSON view.
func TestTimeline_HostileTextIsInert(t *testing.T) {
	hostile := []string{
		`<script>alert(1)</script>`,
		`"><img src=x onerror=alert(2)>`,
		`</q></li></ol><form action="https://evil.example/">`,
		`javascript:alert(3)`,
		"{{.Nonce}}\u2028\x1b[31m",
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var evs []admin.Event
	for i, s := range hostile {
		g := int64(i + 1)
		at := t0.Add(time.Duration(i) * time.Minute)
		evs = append([]admin.Event{
			{Seq: 3 * g, At: at.Add(time.Second), Kind: admin.EventEnded, Generation: g, Holder: s, How: s, Operator: s, Detail: s, AcquiredAt: &at},
			{Seq: 3*g - 1, At: at, Kind: admin.EventStopRequested, Generation: g, Holder: s, Operator: s, Detail: s},
			{Seq: 3*g - 2, At: at, Kind: admin.EventAcquired, Generation: g, Holder: s, How: s, FromGeneration: g - 1},
		}, evs...)
	}
	evs = append([]admin.Event{{Seq: 16, At: t0.Add(time.Hour), Kind: admin.EventKind(hostile[0]), Generation: 5, Operator: hostile[1], Detail: hostile[2]}}, evs...)
	tl := timeline{TargetID: hostile[1], Kept: true, Events: evs, Entries: group(evs, nil), Older: 1, Before: 99}
	page := renderTarget(t, targetView{TargetID: hostile[1], History: tl})
	for _, bad := range []string{"<script>alert", "<img", `<form action="https://evil`, `href="javascript:`} {
		assert.NotContains(t, page, bad)
	}
	assert.Contains(t, page, `<span class="holder">&lt;script&gt;alert(1)&lt;/script&gt;</span>`)
	assert.Contains(t, page, `<q class="detail">&#34;&gt;&lt;img src=x onerror=alert(2)&gt;</q>`)
	assert.Contains(t, page, `<q class="detail">&lt;/q&gt;&lt;/li&gt;&lt;/ol&gt;&lt;form action=&#34;https://evil.example/&#34;&gt;</q>`)
	// The links carry the hostile target ID in their query, encoded.
	assert.Contains(t, page, `id="older" href="target?id=%22%3E%3Cimg&#43;src%3Dx&#43;onerror%3Dalert%282%29%3E&amp;before=1#timeline"`)

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(tl.json()))
	var back historyJSON
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	require.Len(t, back.Events, len(evs))
	assert.Equal(t, hostile[2], back.Events[0].Detail, "the JSON view has the text as it is")
	assert.Equal(t, hostile[1], back.Events[0].Operator)
	assert.Equal(t, hostile[4], back.Events[1].Holder)
}

// A page shows at most historyPage events; with older ones, it ends at
// the oldest generation that begins on it, and the older link starts
// there; a page on which no generation begins is shown whole.
func TestTimeline_PageEndsAtAGenerationsBeginning(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	// 40 generations of 3 events (acquired, saved, ended): 120 events.
	var evs []admin.Event
	for g := int64(1); g <= 40; g++ {
		at := t0.Add(time.Duration(g) * time.Minute)
		evs = append([]admin.Event{
			{Seq: 3 * g, At: at, Kind: admin.EventEnded, Generation: g, How: "saved", AcquiredAt: &at},
			{Seq: 3*g - 1, At: at, Kind: admin.EventSaved, Generation: g},
			{Seq: 3*g - 2, At: at, Kind: admin.EventAcquired, Generation: g, How: "released", FromGeneration: g - 1},
		}, evs...)
	}
	page, older := pageOf(evs[:historyPage+1])
	require.Len(t, page, 99, "33 whole generations: the 34th's beginning is on the older page")
	assert.Equal(t, admin.EventAcquired, page[len(page)-1].Kind)
	assert.Equal(t, int64(22), older, "the older page begins below generation 8's acquisition")
	for _, e := range group(page, nil) {
		require.NotNil(t, e.Gen)
		assert.NotNil(t, e.Gen.Began, "gen %d", e.Gen.Generation)
		assert.NotNil(t, e.Gen.Ended, "gen %d", e.Gen.Generation)
	}
	page, older = pageOf(evs[99:])
	assert.Len(t, page, 21)
	assert.Zero(t, older, "the last page")

	// A generation of more events than a page: shown whole, the older
	// page goes on below it.
	evs = evs[:0]
	for s := int64(300); s > 300-historyPage-1; s-- {
		evs = append(evs, admin.Event{Seq: s, At: t0, Kind: admin.EventSaved, Generation: 9})
	}
	page, older = pageOf(evs)
	assert.Len(t, page, historyPage)
	assert.Equal(t, int64(201), older)
	entries := group(page, nil)
	require.Len(t, entries, 1)
	assert.Equal(t, historyPage, entries[0].Gen.Saves)
	assert.Nil(t, entries[0].Gen.Began)
	body := renderTarget(t, targetView{TargetID: "x", History: timeline{TargetID: "x", Kept: true, Events: page, Entries: entries, Older: older}})
	assert.Contains(t, body, "Began: not in the history shown")
	assert.Contains(t, body, "End not in the history shown")
	assert.Contains(t, body, `id="older" href="target?id=x&amp;before=201#timeline"`)
}

// Without history kept, the section says so in one line and how to turn
// it on; a read error is shown in the section, as an error.
func TestTimeline_NoHistoryAndErrors(t *testing.T) {
	body := renderTarget(t, targetView{TargetID: "x", History: timeline{TargetID: "x"}})
	assert.Contains(t, body, `<p class="muted" id="no-history">This lease table keeps no history: turn it on with <code>gormlease.AutoMigrate(ctx, db, gormlease.WithHistory())</code> or <code>gormlease migrate -history</code>.</p>`)
	assert.NotContains(t, body, `id="timeline"`)
	body = renderTarget(t, targetView{TargetID: "x", History: timeline{TargetID: "x", Kept: true, Err: "could not read the history: <boom>"}})
	assert.Contains(t, body, `<p class="error" id="history-error">could not read the history: &lt;boom&gt;</p>`)
}
