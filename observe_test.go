package gormlease_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/observe"
)

// logRecord is a log record as recordingHandler keeps it.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

// recordingHandler is a slog.Handler that keeps every record, at every level.
type recordingHandler struct {
	mu      sync.Mutex
	records []logRecord
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// filter returns the elements of *xs that keep keeps, under mu.
func filter[V any](mu *sync.Mutex, xs *[]V, keep func(V) bool) []V {
	mu.Lock()
	defer mu.Unlock()
	var out []V
	for _, x := range *xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// find returns the records whose message contains msg.
func (h *recordingHandler) find(msg string) []logRecord {
	return filter(&h.mu, &h.records, func(r logRecord) bool { return strings.Contains(r.msg, msg) })
}

// atLeast returns the records at level or above.
func (h *recordingHandler) atLeast(level slog.Level) []logRecord {
	return filter(&h.mu, &h.records, func(r logRecord) bool { return r.level >= level })
}

// outcomesAtLeast is atLeast without the warnings about slow statements and
// heartbeats, which say how fast the machine was, not what the outcome was:
// a loaded test machine may log them for any run.
func (h *recordingHandler) outcomesAtLeast(level slog.Level) []logRecord {
	return filter(&h.mu, &h.records, func(r logRecord) bool {
		return r.level >= level && !strings.HasPrefix(r.msg, "gormlease: slow ")
	})
}

// one returns the one record whose message contains msg, failing t when
// there is not exactly one.
func (h *recordingHandler) one(t *testing.T, msg string) logRecord {
	t.Helper()
	recs := h.find(msg)
	require.Len(t, recs, 1, "log records %q", msg)
	return recs[0]
}

// assertLease checks a record's level and its lease attributes.
func assertLease(t *testing.T, r logRecord, level slog.Level, target string, gen int64, holder string) {
	t.Helper()
	assert.Equal(t, level, r.level, r.msg)
	assert.Equal(t, target, r.attrs["target"], r.msg)
	if gen > 0 {
		assert.Equal(t, gen, r.attrs["generation"], r.msg)
	} else {
		assert.NotContains(t, r.attrs, "generation", r.msg)
	}
	assert.Equal(t, holder, r.attrs["holder"], r.msg)
}

// spanRecord is a span as recordingObserver keeps it, once ended.
type spanRecord struct {
	span   observe.Span
	parent *observe.Span
	err    error
	ended  bool
}

// recordingObserver is an observe.Observer that keeps every span and event.
type recordingObserver struct {
	mu     sync.Mutex
	spans  []*spanRecord
	events []observe.Event
}

type spanKey struct{}

func (o *recordingObserver) Start(ctx context.Context, s observe.Span) (context.Context, func(error)) {
	rec := &spanRecord{span: s}
	if p, ok := ctx.Value(spanKey{}).(*spanRecord); ok {
		rec.parent = &p.span
	}
	o.mu.Lock()
	o.spans = append(o.spans, rec)
	o.mu.Unlock()
	return context.WithValue(ctx, spanKey{}, rec), func(err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if rec.ended {
			panic("span ended twice")
		}
		rec.err, rec.ended = err, true
	}
}

func (o *recordingObserver) Record(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

// eventsOf returns the events of kind.
func (o *recordingObserver) eventsOf(kind observe.EventKind) []observe.Event {
	return filter(&o.mu, &o.events, func(e observe.Event) bool { return e.Kind == kind })
}

// spansOf returns the spans of kind.
func (o *recordingObserver) spansOf(kind observe.SpanKind) []spanRecord {
	var out []spanRecord
	for _, s := range filter(&o.mu, &o.spans, func(s *spanRecord) bool { return s.span.Kind == kind }) {
		o.mu.Lock()
		out = append(out, *s)
		o.mu.Unlock()
	}
	return out
}

const obsHolder = "observed-holder"

// observed returns a Runner on db with a recording logger and observer.
func observed(t *testing.T, db *gorm.DB, opts ...gormlease.Option) (*gormlease.Runner[string], *recordingHandler, *recordingObserver) {
	t.Helper()
	h, o := &recordingHandler{}, &recordingObserver{}
	opts = append(append(fast(200*time.Millisecond, 2*time.Second), gormlease.WithHolder(obsHolder),
		gormlease.WithLogger(slog.New(h)), gormlease.WithObserver(o)), opts...)
	return newRunner(t, db, opts...), h, o
}

var dbSystems = map[string]string{"postgres": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}

func TestObserve_SavedRun(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		v, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			// Work long enough for a heartbeat to renew the lease.
			waitFor(t, 5*time.Second, "a heartbeat", func() bool {
				return len(obs.eventsOf(observe.EventHeartbeat)) > 0
			})
			return "done", nil
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
		require.Equal(t, "done", v)
		gen := leaseRow(t, db, target).Generation

		assertLease(t, logs.one(t, "lease acquired"), slog.LevelDebug, target, gen, obsHolder)
		assert.Contains(t, logs.one(t, "lease acquired").attrs, "duration")
		assertLease(t, logs.one(t, "result saved"), slog.LevelDebug, target, gen, obsHolder)
		assert.Empty(t, logs.outcomesAtLeast(slog.LevelWarn), "a saved run logs nothing above Debug")

		acq := obs.eventsOf(observe.EventAcquire)
		require.Len(t, acq, 1)
		assert.NoError(t, acq[0].Err, "the outcome of an acquire that took the lease")
		assert.Equal(t, gen, acq[0].Generation)
		assert.Equal(t, obsHolder, acq[0].Holder)
		ends := obs.eventsOf(observe.EventLeaseEnd)
		require.Len(t, ends, 1)
		assert.Positive(t, ends[0].Duration)
		commits := obs.eventsOf(observe.EventCommit)
		require.Len(t, commits, 1)
		assert.NoError(t, commits[0].Err, "the outcome of a commit that saved")
		assert.Positive(t, commits[0].Duration)
		hb := obs.eventsOf(observe.EventHeartbeat)[0]
		assert.Positive(t, hb.Duration)
		assert.NoError(t, hb.Err)
		for _, kind := range []observe.EventKind{observe.EventLeaseLost, observe.EventSelfFenced, observe.EventMaxHoldExceeded} {
			assert.Empty(t, obs.eventsOf(kind), "kind %d", kind)
		}

		runs := obs.spansOf(observe.SpanRun)
		require.Len(t, runs, 1)
		assert.True(t, runs[0].ended)
		assert.NoError(t, runs[0].err)
		assert.Nil(t, runs[0].parent)
		for _, kind := range []observe.SpanKind{observe.SpanAcquire, observe.SpanCommit, observe.SpanHeartbeat} {
			spans := obs.spansOf(kind)
			require.NotEmpty(t, spans, "span kind %d", kind)
			for _, sp := range spans {
				assert.True(t, sp.ended, "span kind %d", kind)
				require.NotNil(t, sp.parent, "span kind %d", kind)
				assert.Equal(t, observe.SpanRun, sp.parent.Kind, "span kind %d", kind)
				assert.Equal(t, target, sp.span.TargetID)
			}
		}
		assert.Equal(t, gen, obs.spansOf(observe.SpanCommit)[0].span.Generation)

		// Every lease statement is seen, under the step that ran it.
		stmts := obs.spansOf(observe.SpanStatement)
		parents := map[observe.SpanKind]int{}
		for _, sp := range stmts {
			assert.True(t, sp.ended)
			assert.Equal(t, dbSystems[s.Name], sp.span.System)
			assert.Equal(t, "job_lease", sp.span.Table)
			assert.NotEmpty(t, sp.span.Query)
			// SHOW: the one probe by which a Repository on MySQL asks,
			// at its first acquire, what its server is.
			assert.Contains(t, []string{"INSERT", "UPDATE", "SELECT", "BEGIN", "WITH", "SHOW"}, sp.span.Operation, sp.span.Query)
			if sp.parent != nil {
				parents[sp.parent.Kind]++
			} else {
				parents[0]++ // the shared heartbeat statements
				if s.Name == "postgres" {
					// Sent with the leases written in as literals, reported
					// with placeholders: no lease token in logs and traces.
					assert.Contains(t, sp.span.Query, "$1", "the heartbeat reported with its values")
				}
			}
		}
		assert.Positive(t, parents[observe.SpanAcquire], "acquire statements")
		assert.Positive(t, parents[observe.SpanCommit], "commit statements")
		assert.Positive(t, parents[0], "heartbeat statements")
	})
}

func TestObserve_Refused(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		l, err := repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err)
		t.Cleanup(func() { _ = repo.Release(context.Background(), l) })

		_, err = r.Run(context.Background(), target, func(context.Context) (string, error) {
			t.Error("work ran")
			return "", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseHeld)

		assertLease(t, logs.one(t, "lease held"), slog.LevelDebug, target, 0, obsHolder)
		assert.Empty(t, logs.outcomesAtLeast(slog.LevelWarn), "a refusal is not a warning")
		acq := obs.eventsOf(observe.EventAcquire)
		require.Len(t, acq, 1)
		assert.ErrorIs(t, acq[0].Err, gormlease.ErrLeaseHeld)
		runs := obs.spansOf(observe.SpanRun)
		require.Len(t, runs, 1)
		assert.ErrorIs(t, runs[0].err, gormlease.ErrLeaseHeld)
	})
}

func TestObserve_TakenOver(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			steal(t, s, db, target)
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("work not cancelled after the takeover")
			}
			return "late", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)

		rec := logs.one(t, "lease lost")
		assertLease(t, rec, slog.LevelWarn, target, leaseRow(t, db, target).Generation-1, obsHolder)
		assert.Equal(t, "taken_over", rec.attrs["cause"])
		assert.Contains(t, rec.attrs, "held")
		assert.Empty(t, logs.atLeast(slog.LevelError))
		lost := obs.eventsOf(observe.EventLeaseLost)
		require.Len(t, lost, 1)
		assert.ErrorIs(t, lost[0].Err, gormlease.ErrLeaseLost)
		assert.Positive(t, lost[0].Duration)
		assert.Empty(t, obs.eventsOf(observe.EventSelfFenced))
		assert.Len(t, obs.eventsOf(observe.EventLeaseEnd), 1)
		assert.Empty(t, obs.eventsOf(observe.EventCommit), "no commit was tried")
	})
}

// A lease taken over after the work returned is lost at the fenced commit:
// the commit's event carries ErrLeaseLost, and an EventLeaseLost follows.
func TestObserve_LostAtCommit(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db, gormlease.WithHeartbeatInterval(10*time.Second), gormlease.WithLeaseTimeout(time.Minute))
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, stolenBeforeCommit(t, s, db, target), noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)

		assert.Equal(t, "taken_over", logs.one(t, "taken over before the commit").attrs["cause"])
		commits := obs.eventsOf(observe.EventCommit)
		require.Len(t, commits, 1)
		assert.ErrorIs(t, commits[0].Err, gormlease.ErrLeaseLost)
		assert.NotErrorIs(t, commits[0].Err, gormlease.ErrCommitUnknown)
		lost := obs.eventsOf(observe.EventLeaseLost)
		require.Len(t, lost, 1)
		assert.ErrorIs(t, lost[0].Err, gormlease.ErrLeaseLost)
		assert.Equal(t, target, lost[0].TargetID)
		assert.Positive(t, lost[0].Duration)
	})
}

// lockRow holds target's lease row locked, in a transaction of db's, until
// the returned function is called: the lease's statements on the row wait.
func lockRow(t *testing.T, db *gorm.DB, target string) (unlock func()) {
	t.Helper()
	tx := db.Begin()
	require.NoError(t, tx.Error)
	// MySQL counts no row changed, but locks the row all the same.
	require.NoError(t, tx.Exec("UPDATE job_lease SET holder = holder WHERE target_id = ?", target).Error)
	var once sync.Once
	unlock = func() { once.Do(func() { require.NoError(t, tx.Rollback().Error) }) }
	t.Cleanup(unlock)
	return unlock
}

func TestObserve_SlowHeartbeat(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			// A heartbeat starts within an interval (200ms) of the lock, and
			// waits for it for at least 300ms: more than half the interval.
			unlock := lockRow(t, db, target)
			time.Sleep(500 * time.Millisecond) // the lock's hold, not a wait for an event
			unlock()
			waitFor(t, 5*time.Second, "a slow heartbeat's warning", func() bool { return len(logs.find("slow heartbeat")) > 0 })
			return "done", ctx.Err()
		}, func(*gorm.DB, string) error { return nil })
		require.NoError(t, err, "a slow heartbeat still renews the lease")

		rec := logs.find("slow heartbeat")[0]
		assert.Equal(t, slog.LevelWarn, rec.level)
		assert.Greater(t, rec.attrs["duration"], 100*time.Millisecond)
		assert.Equal(t, 200*time.Millisecond, rec.attrs["interval"])
		assert.EqualValues(t, 1, rec.attrs["leases"])
		var slowest time.Duration
		for _, e := range obs.eventsOf(observe.EventHeartbeat) {
			slowest = max(slowest, e.Duration)
		}
		assert.Greater(t, slowest, 100*time.Millisecond)
	})
}

func TestObserve_SelfFenced(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db, gormlease.WithLeaseTimeout(time.Second), gormlease.WithSafetyMargin(200*time.Millisecond))
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			// Heartbeats wait on the row lock past the trust window (800ms).
			unlock := lockRow(t, db, target)
			defer unlock()
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("work not cancelled by self-fencing")
			}
			return "late", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrLeaseLost)

		rec := logs.one(t, "lease lost")
		assert.Equal(t, slog.LevelWarn, rec.level)
		assert.Equal(t, "self_fenced", rec.attrs["cause"])
		assert.Equal(t, 800*time.Millisecond, rec.attrs["trust_window"])
		fenced := obs.eventsOf(observe.EventSelfFenced)
		require.Len(t, fenced, 1)
		assert.ErrorIs(t, fenced[0].Err, gormlease.ErrLeaseLost)
		assert.Empty(t, obs.eventsOf(observe.EventLeaseLost), "self-fencing is not a takeover")
	})
}

func TestObserve_ReleaseFailed(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, _ := observed(t, db, gormlease.WithOperationTimeout(300*time.Millisecond),
			gormlease.WithLeaseTimeout(4*time.Second))
		target := newTarget(t)
		workErr := errors.New("work failed")
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			lockRow(t, db, target) // until the test ends: the release times out
			return "", workErr
		}, noSave(t))
		require.ErrorIs(t, err, workErr)

		rec := logs.one(t, "release failed")
		assertLease(t, rec, slog.LevelError, target, leaseRow(t, db, target).Generation, obsHolder)
		assert.NotNil(t, rec.attrs["error"])
		assert.Empty(t, logs.find("lease released"))
	})
}

func TestRun_MaxHold(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db, gormlease.WithMaxHold(300*time.Millisecond))
		target := newTarget(t)
		workCtx := make(chan context.Context, 1)
		finish := make(chan struct{})
		done := goRun(t, context.Background(), r, target, func(ctx context.Context) (string, error) {
			workCtx <- ctx
			<-finish // ignores its context
			return "too late", nil
		}, noSave(t))

		ctx := recv(t, workCtx, 5*time.Second, "the work")
		recv(t, ctx.Done(), 5*time.Second, "the max hold's cancellation")
		cause := context.Cause(ctx)
		require.ErrorIs(t, cause, gormlease.ErrMaxHoldExceeded)
		require.NotErrorIs(t, cause, gormlease.ErrLeaseLost)
		assert.Nil(t, leaseRow(t, db, target).ReleasedAt, "held until the work returns")
		close(finish)

		res := recv(t, done, 5*time.Second, "Run")
		require.ErrorIs(t, res.Err, gormlease.ErrMaxHoldExceeded)
		assert.Empty(t, res.Value)
		row := leaseRow(t, db, target)
		assert.NotNil(t, row.ReleasedAt, "released")
		assert.Nil(t, row.SavedGeneration, "not saved")

		rec := logs.one(t, "max hold")
		assertLease(t, rec, slog.LevelWarn, target, row.Generation, obsHolder)
		assert.Equal(t, 300*time.Millisecond, rec.attrs["max_hold"])
		exceeded := obs.eventsOf(observe.EventMaxHoldExceeded)
		require.Len(t, exceeded, 1)
		assert.ErrorIs(t, exceeded[0].Err, gormlease.ErrMaxHoldExceeded)
		assert.Empty(t, obs.eventsOf(observe.EventLeaseLost), "the lease was given up, not lost")

		// Work that ends in time is saved as usual.
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) { return "quick", nil },
			func(*gorm.DB, string) error { return nil })
		require.NoError(t, err)
	})
}

func TestObserve_Wait(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, _, obs := observed(t, db)
		target := newTarget(t)
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		l, err := repo.Acquire(context.Background(), target, time.Minute)
		require.NoError(t, err)
		begin := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := r.RunWait(context.Background(), target, func(context.Context) (string, error) { return "v", nil },
				func(*gorm.DB, string) error { return nil })
			done <- err
		}()
		waitFor(t, 5*time.Second, "a refused try", func() bool { return len(obs.eventsOf(observe.EventAcquire)) > 0 })
		require.ErrorIs(t, obs.eventsOf(observe.EventAcquire)[0].Err, gormlease.ErrLeaseHeld)
		time.Sleep(300 * time.Millisecond) // the lease's hold after the refusal, not a wait for an event
		require.NoError(t, repo.Release(context.Background(), l))
		require.NoError(t, recv(t, done, 10*time.Second, "RunWait"))

		waits := obs.eventsOf(observe.EventRunWait)
		require.Len(t, waits, 1)
		assert.Equal(t, target, waits[0].TargetID)
		assert.GreaterOrEqual(t, waits[0].Duration, 300*time.Millisecond, "waited until the release")
		assert.Less(t, waits[0].Duration, time.Since(begin))

		// A call that finds the target free waits 0.
		_, _, err = r.Do(context.Background(), target, func(context.Context) (string, error) { return "v", nil },
			func(*gorm.DB, string) error { return nil }, func(*gorm.DB) (string, error) { return "", nil })
		require.NoError(t, err)
		assert.Len(t, obs.eventsOf(observe.EventRunWait), 1, "Do records no RunWait event")
		waits = obs.eventsOf(observe.EventDoWait)
		require.Len(t, waits, 1)
		assert.Equal(t, target, waits[0].TargetID)
		assert.Less(t, waits[0].Duration, time.Second)
	})
}

func TestObserve_NoLoggerNoObserver(t *testing.T) {
	_, err := gormlease.NewRunner[string](nil, gormlease.WithMaxHold(0))
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	require.ErrorContains(t, err, "WithMaxHold")
}

// An acquire refused because the target is paused is a refusal, not a
// fault: a Debug line naming the pause, nothing at Warn, and an
// EventAcquire whose Err matches ErrPaused (and ErrLeaseHeld).
func TestObserve_Paused(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		require.NoError(t, admin.New(r.Repository()).Pause(context.Background(), target, "maintenance"))
		_, err := r.Run(context.Background(), target, func(context.Context) (string, error) {
			t.Error("work ran")
			return "", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrPaused)

		assertLease(t, logs.one(t, "target paused"), slog.LevelDebug, target, 0, obsHolder)
		assert.Empty(t, logs.outcomesAtLeast(slog.LevelWarn), "a paused target is not a fault")
		acq := obs.eventsOf(observe.EventAcquire)
		require.Len(t, acq, 1)
		assert.ErrorIs(t, acq[0].Err, gormlease.ErrPaused)
		assert.ErrorIs(t, acq[0].Err, gormlease.ErrLeaseHeld)
	})
}

// A Run stopped by an operator's request records an EventStopRequested,
// with the request's cause and how long the lease was held, and an Info
// line; no loss is reported, and no commit is tried.
func TestObserve_StopRequested(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		r, logs, obs := observed(t, db)
		target := newTarget(t)
		_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			require.NoError(t, admin.New(r.Repository()).RequestStop(context.Background(), target, "drain"))
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("work not cancelled after the stop request")
			}
			return "late", nil
		}, noSave(t))
		require.ErrorIs(t, err, gormlease.ErrStopRequested)

		rec := logs.one(t, "asked the holder to stop")
		assertLease(t, rec, slog.LevelInfo, target, leaseRow(t, db, target).Generation, obsHolder)
		assert.Contains(t, rec.attrs, "held")
		assert.Empty(t, logs.outcomesAtLeast(slog.LevelWarn), "a stop request is not a fault")
		stopped := obs.eventsOf(observe.EventStopRequested)
		require.Len(t, stopped, 1)
		assert.ErrorIs(t, stopped[0].Err, gormlease.ErrStopRequested)
		assert.ErrorContains(t, stopped[0].Err, "drain")
		assert.Positive(t, stopped[0].Duration)
		assert.Equal(t, target, stopped[0].TargetID)
		assert.Empty(t, obs.eventsOf(observe.EventLeaseLost), "a stop is not a loss")
		assert.Len(t, obs.eventsOf(observe.EventLeaseEnd), 1)
		assert.Empty(t, obs.eventsOf(observe.EventCommit), "no commit was tried")
	})
}
