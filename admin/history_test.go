package admin_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
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

// historyDB opens a database of its own whose lease table keeps history.
func historyDB(t *testing.T, s *testdb.Server) *gorm.DB {
	t.Helper()
	db := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db, gormlease.WithHistory()))
	return db
}

// ev is an event that a test writes by hand, age ago on the database's
// clock; acquiredAge, when not 0, is the age of its AcquiredAt.
type ev struct {
	key                   string
	seq                   int64
	kind                  string
	generation            int64
	how, operator, detail string
	from                  int64
	age, acquiredAge      time.Duration
}

// addEvents writes events into the event table, as the triggers would.
func addEvents(t *testing.T, s *testdb.Server, db *gorm.DB, events ...ev) {
	t.Helper()
	null := func(v string) any {
		if v == "" {
			return nil
		}
		return v
	}
	for _, e := range events {
		var from, acquired any
		if e.from != 0 {
			from = e.from
		}
		if e.acquiredAge != 0 {
			acquired = s.Ago(e.acquiredAge)
		}
		require.NoError(t, db.Exec("INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how, from_generation,"+
			" acquired_at, operator, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			e.key, e.seq, s.Ago(e.age), e.kind, e.generation, fmt.Sprintf("host/%d", e.generation), null(e.how), from,
			acquired, null(e.operator), null(e.detail)).Error)
	}
}

// seqs are the Seqs of events, in their order.
func seqs(events []admin.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Seq
	}
	return out
}

// History returns a row's events newest first, every column as written,
// and pages back by Seq; a slot's row has its own events, and a target
// without events returns none, without an error.
func TestHistory_NewestFirstPagedBySeq(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		_, op := newOperator(t, db)
		addEvents(t, s, db,
			ev{key: "t", seq: 1, kind: "acquired", generation: 1, how: "new", age: 50 * time.Minute},
			ev{key: "t", seq: 2, kind: "ended", generation: 1, how: "failed", detail: "upstream 503", age: 40 * time.Minute, acquiredAge: 50 * time.Minute},
			ev{key: "t", seq: 3, kind: "paused", generation: 1, operator: "alice", detail: "deploy", age: 30 * time.Minute},
			ev{key: "t", seq: 4, kind: "resumed", generation: 1, operator: "bob", age: 20 * time.Minute},
			ev{key: "t", seq: 5, kind: "acquired", generation: 2, how: "released", from: 1, age: 10 * time.Minute},
			ev{key: "t\x1f2", seq: 1, kind: "acquired", generation: 7, how: "new", age: time.Minute},
			ev{key: "tt", seq: 1, kind: "acquired", generation: 1, how: "new", age: time.Minute},
		)

		all, err := op.History(ctx, "t", admin.HistoryOptions{})
		require.NoError(t, err)
		require.Equal(t, []int64{5, 4, 3, 2, 1}, seqs(all), "newest first")
		acq, ended, paused := all[0], all[3], all[2]
		assert.Equal(t, admin.Event{Key: "t", Seq: 5, At: acq.At, Kind: admin.EventAcquired, Generation: 2, Holder: "host/2",
			How: admin.HowReleased, FromGeneration: 1}, acq)
		assert.Equal(t, admin.EventEnded, ended.Kind)
		assert.Equal(t, admin.HowFailed, ended.How)
		assert.Equal(t, "upstream 503", ended.Detail)
		require.NotNil(t, ended.AcquiredAt)
		assert.InDelta(t, 10*time.Minute, ended.HeldFor(), float64(time.Second), "HeldFor of an ended event")
		assert.Zero(t, acq.HeldFor(), "HeldFor of an acquired event")
		assert.Equal(t, "alice", paused.Operator)
		assert.Equal(t, "deploy", paused.Detail)
		assert.Equal(t, "bob", all[1].Operator)
		assert.Zero(t, all[4].FromGeneration, "a new row's FromGeneration")
		for i := 1; i < len(all); i++ {
			assert.True(t, all[i].At.Before(all[i-1].At), "At of seq %d before seq %d's", all[i].Seq, all[i-1].Seq)
		}
		assert.WithinDuration(t, time.Now().Add(-10*time.Minute), acq.At, time.Minute, "At is the database's time")

		page, err := op.History(ctx, "t", admin.HistoryOptions{Limit: 2})
		require.NoError(t, err)
		assert.Equal(t, []int64{5, 4}, seqs(page))
		page, err = op.History(ctx, "t", admin.HistoryOptions{Limit: 2, Before: page[len(page)-1].Seq})
		require.NoError(t, err)
		assert.Equal(t, []int64{3, 2}, seqs(page))
		page, err = op.History(ctx, "t", admin.HistoryOptions{Limit: 2, Before: page[len(page)-1].Seq})
		require.NoError(t, err)
		assert.Equal(t, []int64{1}, seqs(page))
		page, err = op.History(ctx, "t", admin.HistoryOptions{Before: 1})
		require.NoError(t, err)
		assert.Empty(t, page, "before the first event")

		slot, err := op.History(ctx, "t", admin.HistoryOptions{Slot: 2})
		require.NoError(t, err)
		require.Len(t, slot, 1)
		assert.Equal(t, testkit.SlotKey("t", 2), slot[0].Key)
		assert.EqualValues(t, 7, slot[0].Generation)
		none, err := op.History(ctx, "t", admin.HistoryOptions{Slot: 1})
		require.NoError(t, err)
		assert.Empty(t, none, "a slot without events")
		none, err = op.History(ctx, "never", admin.HistoryOptions{})
		require.NoError(t, err)
		assert.Empty(t, none, "a target without events")
	})
}

// Without an event table, History says that the lease table keeps no
// history, with an error that wraps ErrNoHistory and not
// ErrMissingTables: nothing is missing that the steps need.
func TestHistory_NoEventTable(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		_, op := newOperator(t, emptyDB(t, s))
		_, err := op.History(ctx, "t", admin.HistoryOptions{Slot: 3})
		require.ErrorIs(t, err, admin.ErrNoHistory)
		assert.NotErrorIs(t, err, gormlease.ErrMissingTables)
		assert.Contains(t, err.Error(), `history "t" slot 3`)
		assert.Contains(t, err.Error(), "job_lease_event does not exist")
		assert.Contains(t, err.Error(), "gormlease.WithHistory()")
	})
}

// Bad input is refused with an error wrapping ErrInvalidArgument that
// names it, and reads nothing; the longest target ID, and the key of its
// last slot, which no row can have, are read as any other.
func TestHistory_HostileInput(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		_, op := newOperator(t, db)
		long := strings.Repeat("é", 127) + "x" // 255 bytes
		require.Len(t, long, 255)
		addEvents(t, s, db, ev{key: long, seq: 1, kind: "acquired", generation: 1, how: "new", age: time.Second})
		got, err := op.History(ctx, long, admin.HistoryOptions{})
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, long, got[0].Key)
		got, err = op.History(ctx, long, admin.HistoryOptions{Slot: gormlease.MaxSlots})
		require.NoError(t, err, "a slot key longer than a key can be")
		assert.Empty(t, got)
		got, err = op.History(ctx, "t", admin.HistoryOptions{Limit: 1000, Before: math.MaxInt64})
		require.NoError(t, err, "the largest Limit and Before")
		assert.Empty(t, got)

		for _, c := range []struct {
			name, target string
			opts         admin.HistoryOptions
			says         string
		}{
			{"SlotNegative", "t", admin.HistoryOptions{Slot: -1}, "Slot must be between 0"},
			{"SlotTooHigh", "t", admin.HistoryOptions{Slot: gormlease.MaxSlots + 1}, "got 101"},
			{"LimitNegative", "t", admin.HistoryOptions{Limit: -1}, "Limit -1 is not between 1 and 1000"},
			{"LimitHuge", "t", admin.HistoryOptions{Limit: math.MaxInt}, "is not between 1 and 1000"},
			{"LimitJustTooHigh", "t", admin.HistoryOptions{Limit: 1001}, "Limit 1001"},
			{"BeforeNegative", "t", admin.HistoryOptions{Before: -5}, "Before is -5"},
			{"TargetEmpty", "", admin.HistoryOptions{}, "is empty"},
			{"Target256Bytes", long + "y", admin.HistoryOptions{}, "256 bytes"},
			{"TargetNotUTF8", "t\xff\xfe", admin.HistoryOptions{}, "not valid UTF-8"},
			{"TargetNUL", "t\x00", admin.HistoryOptions{}, "NUL"},
			{"TargetSlotKey", testkit.SlotKey("t", 1), admin.HistoryOptions{}, "0x1f"},
		} {
			t.Run(c.name, func(t *testing.T) {
				got, err := op.History(ctx, c.target, c.opts)
				require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
				assert.Contains(t, err.Error(), c.says)
				assert.Nil(t, got)
			})
		}
		var nilOp *admin.Operator
		_, err = nilOp.History(ctx, "t", admin.HistoryOptions{})
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		_, err = admin.New(nil).History(ctx, "t", admin.HistoryOptions{})
		require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	})
}

// historyEvents is the number of events of the target whose pages
// TestHistory_PageAt100kEvents reads.
const historyEvents = 100_000

// fillEvents writes n events of key, seq 1 to n, one a second up to now,
// in one statement.
func fillEvents(t *testing.T, s *testdb.Server, db *gorm.DB, key string, n int) {
	t.Helper()
	digits := "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
		" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	// As many tables of digits as n-1 has digits: i runs from 1 to a
	// power of ten at least n.
	i, from := "(1", ""
	for k, p := 0, 1; k == 0 || p < n; k, p = k+1, p*10 {
		d := fmt.Sprintf("d%d", k)
		i += fmt.Sprintf(" + %d * %s.d", p, d)
		from += ", " + digits + " " + d
	}
	i += ")"
	at := map[string]string{
		"postgres": "now() - (? - " + i + ") * interval '1 second'",
		"mysql":    "UTC_TIMESTAMP(6) - INTERVAL (? - " + i + ") SECOND",
		"sqlite":   "strftime('%Y-%m-%d %H:%M:%f', julianday('now') - (? - " + i + ") / 86400.0)",
	}[s.Name]
	require.NoError(t, db.Exec("INSERT INTO job_lease_event (target_id, seq, at, kind, generation, holder, how)"+
		" SELECT ?, "+i+", "+at+", 'acquired', "+i+", 'host/1', 'released'"+
		" FROM "+from[2:]+
		" WHERE "+i+" <= ?", key, n, n).Error)
}

// A page of History costs the same however long the history: at 100,000
// events of one target, among others' events, the newest page and one
// from the middle each take a few milliseconds (the median of 7 reads is
// logged; the bound, 250 ms, holds on a loaded machine under -race, while
// a read of the whole history takes longer). Then Prune caps the
// histories, and logs how long it took.
func TestHistory_PageAt100kEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 events")
	}
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		_, op := newOperator(t, db)
		fillEvents(t, s, db, "busy", historyEvents)
		fillEvents(t, s, db, "busy/other", 5000)
		fillEvents(t, s, db, "a-before", 5000)
		var n int64
		require.NoError(t, db.Table("job_lease_event").Where("target_id = ?", "busy").Count(&n).Error)
		require.EqualValues(t, historyEvents, n)
		if s.Name == "postgres" {
			require.NoError(t, db.Exec("ANALYZE job_lease_event").Error)
		}

		for _, before := range []int64{0, historyEvents / 2} {
			var times []time.Duration
			for range 7 {
				start := time.Now()
				page, err := op.History(ctx, "busy", admin.HistoryOptions{Before: before})
				times = append(times, time.Since(start))
				require.NoError(t, err)
				require.Len(t, page, 100)
				first := int64(historyEvents)
				if before > 0 {
					first = before - 1
				}
				assert.Equal(t, first, page[0].Seq)
				assert.Equal(t, first-99, page[99].Seq)
			}
			slices.Sort(times)
			t.Logf("%s: a page of 100 at %d events, before %d: median %v, best %v", s.Name, historyEvents, before, times[3], times[0])
			assert.Less(t, times[0], 250*time.Millisecond, "the fastest of 7 reads of a page")
		}
		page, err := op.History(ctx, "busy", admin.HistoryOptions{Limit: 1000, Before: 1001})
		require.NoError(t, err)
		require.Len(t, page, 1000)
		assert.True(t, sort.SliceIsSorted(page, func(i, j int) bool { return page[i].Seq > page[j].Seq }))
		assert.EqualValues(t, 1, page[999].Seq)

		// Prune caps the histories in its default batches of 1,000 events,
		// reading the event table once: 107,000 events of the 110,000 go.
		var events int64
		start := time.Now()
		_, err = op.Prune(ctx, admin.PruneOptions{OlderThan: 10000 * time.Hour, KeepEvents: 1000, EventsDeleted: &events})
		elapsed := time.Since(start)
		require.NoError(t, err)
		assert.EqualValues(t, historyEvents-1000+2*4000, events)
		t.Logf("%s: Prune with KeepEvents 1000 deleted %d of %d events in %v", s.Name, events, historyEvents+10000, elapsed)
		page, err = op.History(ctx, "busy", admin.HistoryOptions{Limit: 1000})
		require.NoError(t, err)
		require.Len(t, page, 1000)
		assert.EqualValues(t, historyEvents-999, page[999].Seq)
	})
}

// kindHow is an event's kind, how and operator, as a test expects them.
type kindHow struct {
	kind       admin.EventKind
	generation int64
	how        string
	operator   string
}

// History returns what happened to a target, written by the lease
// table's triggers as it happened, newest first: a Run that saved, a Run
// whose work failed, an operator's pause and resume, an acquire and its
// forced release; each end with its cause and how long the generation
// was held, each operator's action with who acted and why.
func TestHistory_RecordsWhatHappened(t *testing.T) {
	t.Parallel()
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		repo, op := newOperator(t, db)
		r := testkit.NewRunner(t, db, gormlease.WithHolder("worker-1"))
		target := "report:42"
		_, err := r.Run(ctx, target, func(context.Context) (string, error) { return "ok", nil }, gormlease.SaveJSON[string])
		require.NoError(t, err)
		_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "", fmt.Errorf("upstream down") },
			gormlease.SaveJSON[string])
		require.Error(t, err)
		require.NoError(t, op.As("alice").Pause(ctx, target, "deploy"))
		require.NoError(t, op.As("bob").Resume(ctx, target))
		_, err = repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		_, err = op.As("carol").ForceRelease(ctx, target)
		require.NoError(t, err)

		events, err := op.History(ctx, target, admin.HistoryOptions{})
		require.NoError(t, err)
		var got []kindHow
		for _, e := range events {
			got = append(got, kindHow{e.Kind, e.Generation, e.How, e.Operator})
		}
		assert.Equal(t, []kindHow{
			{admin.EventEnded, 3, admin.HowForced, "carol"},
			{admin.EventAcquired, 3, admin.HowReleased, ""},
			{admin.EventResumed, 2, "", "bob"},
			{admin.EventPaused, 2, "", "alice"},
			{admin.EventEnded, 2, admin.HowFailed, ""},
			{admin.EventAcquired, 2, admin.HowReleased, ""},
			{admin.EventEnded, 1, admin.HowSaved, ""},
			{admin.EventAcquired, 1, admin.HowNew, ""},
		}, got)
		require.Len(t, events, 8)
		assert.Equal(t, []int64{8, 7, 6, 5, 4, 3, 2, 1}, seqs(events))
		assert.Contains(t, events[4].Detail, "upstream down", "the failure's text")
		assert.Equal(t, "deploy", events[3].Detail, "the pause's reason")
		assert.Equal(t, "worker-1", events[7].Holder)
		assert.EqualValues(t, 1, events[5].FromGeneration, "the acquisition of a released row names the generation before")
		for _, i := range []int{0, 4, 6} {
			e := events[i]
			if assert.NotNil(t, e.AcquiredAt, "seq %d's AcquiredAt", e.Seq) {
				assert.False(t, e.At.Before(*e.AcquiredAt), "seq %d ended before it began", e.Seq)
			}
		}
		for i := 1; i < len(events); i++ {
			assert.False(t, events[i].At.After(events[i-1].At), "seq %d after seq %d", events[i].Seq, events[i-1].Seq)
		}
	})
}
