package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
	"github.com/gormlease/gormlease/leasetest"
)

// TestMain runs the tests; goroutine leaks fail the run (testdb.Main).
// Run with HTTPSERVICE_MAIN=1 in its environment, the test binary is the
// command instead (TestSIGTERM runs it so).
func TestMain(m *testing.M) {
	if os.Getenv("HTTPSERVICE_MAIN") == "1" {
		main()
		return
	}
	testdb.Main(m)
}

// fast are timings under which a stop or a takeover reaches the work
// within a tenth of a second.
var fast = testkit.Fast(100*time.Millisecond, 2*time.Second)

// service is a running Service of a test, on one database.
type service struct {
	db       *gorm.DB
	base     string // its URL, without a trailing slash
	logs     *logRecorder
	shutdown func() error // ends Serve as SIGTERM does, and returns its error
}

var migrated sync.Map // server name -> *sync.Once: the reports table made

// start serves a Service on db with cfg (its Logger set to a recorder),
// shut down with grace, at the test's end at the latest.
func start(t *testing.T, s *testdb.Server, db *gorm.DB, cfg Config, grace time.Duration) *service {
	t.Helper()
	made, _ := migrated.LoadOrStore(s.Name, new(sync.Once))
	made.(*sync.Once).Do(func() { require.NoError(t, migrate(context.Background(), db)) })
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	svc, err := NewService(context.Background(), db, cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ctx, ln, grace) }()
	var once sync.Once
	var serveErr error
	shutdown := func() error {
		once.Do(func() {
			cancel()
			select {
			case serveErr = <-served:
			case <-time.After(grace + releaseWait + 10*time.Second):
				serveErr = errors.New("Serve did not return")
			}
		})
		return serveErr
	}
	t.Cleanup(func() { shutdown() })
	return &service{db: db, base: "http://" + ln.Addr().String(), logs: logs, shutdown: shutdown}
}

// newID returns an id no other test uses, fit for a URL's path.
func newID() string { return "u" + uuid.NewString()[:13] }

// reply is an HTTP response, read whole.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

// call sends method path to svc, with ctx, and reads the answer.
func (svc *service) call(ctx context.Context, method, path string) reply {
	req, err := http.NewRequestWithContext(ctx, method, svc.base+path, nil)
	if err != nil {
		return reply{err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
}

// goCall sends method path on a goroutine, and sends its answer.
func (svc *service) goCall(ctx context.Context, method, path string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- svc.call(ctx, method, path) }()
	return ch
}

// gate is a Fetch that tests hold: each call says it started, then waits
// for open (and returns its answer) or for its context's end.
type gate struct {
	started chan string // the subject of each call, as it starts
	ended   chan error  // the context's cause, for a call that its context ended
	open    chan struct{}
	calls   atomic.Int64
	answer  error // what an opened call returns
}

func newGate() *gate {
	return &gate{started: make(chan string, 10), ended: make(chan error, 10), open: make(chan struct{})}
}

func (g *gate) fetch(ctx context.Context, subject string, generation int64) (string, error) {
	g.calls.Add(1)
	g.started <- subject
	select {
	case <-g.open:
		if g.answer != nil {
			return "", g.answer
		}
		return fmt.Sprintf("report on %s (generation %d)", subject, generation), nil
	case <-ctx.Done():
		g.ended <- context.Cause(ctx)
		return "", context.Cause(ctx)
	}
}

// logRecorder is a slog.Handler that keeps the records.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// find returns the records whose message starts with prefix.
func (l *logRecorder) find(prefix string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []slog.Record
	for _, r := range l.records {
		if strings.HasPrefix(r.Message, prefix) {
			found = append(found, r)
		}
	}
	return found
}

// errors returns the messages logged at Error.
func (l *logRecorder) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var msgs []string
	for _, r := range l.records {
		if r.Level >= slog.LevelError {
			msgs = append(msgs, r.Message)
		}
	}
	return msgs
}

// reports counts the reports saved of subject.
func reports(t *testing.T, db *gorm.DB, subject string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Model(&Report{}).Where("subject = ?", subject).Count(&n).Error)
	return n
}

// released asserts that target's lease is released now, not live (nor
// left to expire).
func released(t *testing.T, db *gorm.DB, target string) {
	t.Helper()
	info, ok := leasetest.State(t, db, target)
	require.True(t, ok, "no lease row for %s", target)
	assert.Equal(t, admin.StateReleased, info.State, "the lease of %s", target)
}

// POST /refresh runs the work and saves a report, under the next
// generation each time: 200 with the report.
func TestRefresh_SavesTheReport(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		close(g.open)
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		for gen := 1; gen <= 2; gen++ {
			r := svc.call(t.Context(), "POST", "/refresh/"+id)
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusOK, r.status, r.body)
			assert.Regexp(t, fmt.Sprintf(`"id":[1-9]\d*,"subject":"%s","body":"report on %s \(generation %d\)","generation":%d`, id, id, gen, gen), r.body)
		}
		assert.EqualValues(t, 2, reports(t, db, id))
		released(t, db, "refresh:"+id)
	})
}

// A request that finds the target in progress gets 409 at once, naming the
// holder, with a Retry-After as long as the job has run so far, at least
// 1 s: a few seconds for a short job, not the lease timeout (20 s by
// default), which ExpiresIn would give.
func TestRefresh_HeldGets409WithAShortRetryAfter(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		first := svc.goCall(t.Context(), "POST", "/refresh/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the first request's work")
		began := time.Now()
		r := svc.call(t.Context(), "POST", "/refresh/"+id)
		heldFor := time.Since(began)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusConflict, r.status)
		assert.Contains(t, r.body, "in progress on ")
		assert.Regexp(t, `\(generation 1, for \d+(\.\d)?m?s\)`, r.body)
		retry, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
		assert.GreaterOrEqual(t, retry, 1)
		assert.LessOrEqual(t, retry, int(heldFor.Seconds())+2, "Retry-After after a job of %v", heldFor)
		assert.Less(t, retry, int(gormlease.DefaultLeaseTimeout.Seconds()), "Retry-After is the lease timeout")
		assert.EqualValues(t, 1, g.calls.Load(), "work calls")
		close(g.open)
		assert.Equal(t, http.StatusOK, testkit.Recv(t, first, 10*time.Second, "the first answer").status)
	})
}

// A paused target gets 503 with the operator's reason, and no Retry-After:
// nothing runs.
func TestRefresh_PausedGets503WithTheReason(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		op := admin.New(testkit.NewRepository(t, db))
		require.NoError(t, op.Pause(t.Context(), "refresh:"+id, "deploy 42"))
		r := svc.call(t.Context(), "POST", "/refresh/"+id)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		assert.Equal(t, "paused by an operator: deploy 42\n", r.body)
		assert.Empty(t, r.header.Get("Retry-After"))
		assert.Zero(t, g.calls.Load(), "work calls")
	})
}

// An operator's stop ends the work: 503, nothing saved, the target
// released.
func TestRefresh_StopGets503(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch, Options: fast}, time.Second)
		id := newID()
		first := svc.goCall(t.Context(), "POST", "/refresh/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the work")
		op := admin.New(testkit.NewRepository(t, db))
		require.NoError(t, op.RequestStop(t.Context(), "refresh:"+id, "drain"))
		r := testkit.Recv(t, first, 10*time.Second, "the answer")
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		assert.Equal(t, "stopped by an operator: nothing saved\n", r.body)
		assert.ErrorIs(t, testkit.Recv(t, g.ended, time.Second, "the work's end"), gormlease.ErrStopRequested)
		assert.Zero(t, reports(t, db, id))
		released(t, db, "refresh:"+id)
	})
}

// Work that outlasts WithMaxHold is cancelled: 504, nothing saved, the
// target released.
func TestRefresh_MaxHoldGets504(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		opts := slices.Concat(fast, []gormlease.Option{gormlease.WithMaxHold(200 * time.Millisecond)})
		svc := start(t, s, db, Config{Fetch: g.fetch, Options: opts}, time.Second)
		id := newID()
		r := svc.call(t.Context(), "POST", "/refresh/"+id)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusGatewayTimeout, r.status)
		assert.Equal(t, "the report took too long: nothing saved\n", r.body)
		assert.ErrorIs(t, testkit.Recv(t, g.ended, time.Second, "the work's end"), gormlease.ErrMaxHoldExceeded)
		assert.Empty(t, svc.logs.errors(), "logged at Error")
		assert.Zero(t, reports(t, db, id))
		released(t, db, "refresh:"+id)
	})
}

// A lease taken over while the work runs: 503, nothing saved.
func TestRefresh_LostGets503(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch, Options: fast}, time.Second)
		id := newID()
		first := svc.goCall(t.Context(), "POST", "/refresh/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the work")
		leasetest.TakeOver(t, db, "refresh:"+id)
		r := testkit.Recv(t, first, 10*time.Second, "the answer")
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		assert.Equal(t, "lease lost: nothing saved; try again\n", r.body)
		assert.Equal(t, "1", r.header.Get("Retry-After"))
		assert.Zero(t, reports(t, db, id))
	})
}

// The external call's own failure: 502 with its message, nothing saved,
// the target released.
func TestRefresh_WorkFailureGets502(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		g.answer = errors.New("upstream answered 500")
		close(g.open)
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		r := svc.call(t.Context(), "POST", "/refresh/"+id)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusBadGateway, r.status)
		assert.Equal(t, "the report failed: upstream answered 500\n", r.body)
		assert.Zero(t, reports(t, db, id))
		released(t, db, "refresh:"+id)
	})
}

// A client that goes away cancels its work: the target is released,
// nothing saved, and the log says so at Info, not as an error.
func TestRefresh_ClientGoneIsNoError(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		ctx, cancel := context.WithCancel(t.Context())
		first := svc.goCall(ctx, "POST", "/refresh/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the work")
		cancel()
		assert.ErrorIs(t, testkit.Recv(t, first, 10*time.Second, "the client's end").err, context.Canceled)
		assert.ErrorIs(t, testkit.Recv(t, g.ended, 10*time.Second, "the work's end"), context.Canceled)
		leasetest.WaitFor(t, db, "refresh:"+id, admin.StateReleased, 10*time.Second)
		testkit.WaitFor(t, 10*time.Second, "the log of the client gone", func() bool { return len(svc.logs.find("client gone")) == 1 })
		assert.Equal(t, slog.LevelInfo, svc.logs.find("client gone")[0].Level)
		assert.Empty(t, svc.logs.errors())
		assert.Zero(t, reports(t, db, id))
	})
}

// An id that cannot be a target (over 255 bytes with its prefix): 400,
// nothing written.
func TestRefresh_BadIDGets400(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		r := svc.call(t.Context(), "POST", "/refresh/"+strings.Repeat("x", 250))
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusBadRequest, r.status)
		assert.Contains(t, r.body, "invalid argument")
		assert.Zero(t, g.calls.Load())
	})
}

// GET /report: two instances asked at once run the work once, and both
// answer it; the one that waited says Shared: true. Asked again within a
// minute, the saved report is answered without running the work.
func TestReport_SharesOneJob(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		one := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		two := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		id := newID()
		first := one.goCall(t.Context(), "GET", "/report/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the work")
		second := two.goCall(t.Context(), "GET", "/report/"+id)
		op := admin.New(testkit.NewRepository(t, db))
		testkit.WaitFor(t, 10*time.Second, "the second instance to wait", func() bool {
			w := op.Waiters("report:" + id)
			return w.Waits == 1 && w.Held
		})
		close(g.open)
		want := fmt.Sprintf(`{"subject":"%s","body":"report on %s (generation 1)","generation":1}`+"\n", id, id)
		for i, ch := range []<-chan reply{first, second} {
			r := testkit.Recv(t, ch, 10*time.Second, "an answer")
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusOK, r.status, r.body)
			assert.Equal(t, want, r.body)
			assert.Equal(t, strconv.FormatBool(i == 1), r.header.Get("Shared"))
		}
		r := two.call(t.Context(), "GET", "/report/"+id)
		assert.Equal(t, want, r.body)
		assert.Equal(t, "true", r.header.Get("Shared"))
		assert.EqualValues(t, 1, g.calls.Load(), "work calls")
	})
}

// GET /report waits for a job in progress only so long: then 409 with a
// Retry-After; a paused target, 503.
func TestReport_WaitsOnlySoLong(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch, ReportWait: 300 * time.Millisecond}, time.Second)
		id := newID()
		leasetest.Occupy(t, db, "report:"+id)
		r := svc.call(t.Context(), "GET", "/report/"+id)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusConflict, r.status, r.body)
		assert.NotEmpty(t, r.header.Get("Retry-After"))

		paused := newID()
		require.NoError(t, admin.New(testkit.NewRepository(t, db)).Pause(t.Context(), "report:"+paused, "maintenance"))
		r = svc.call(t.Context(), "GET", "/report/"+paused)
		assert.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
		assert.Equal(t, "paused by an operator: maintenance\n", r.body)
		assert.Zero(t, g.calls.Load())
	})
}

// Every outcome of Run and Do has a status of its own: the mapping, for
// the outcomes that a test cannot provoke on a healthy database (a COMMIT
// without an answer, a missing table) and the rest alike.
func TestOutcome_EveryError(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(live)
	cancel()
	stopping, cancelCause := context.WithCancelCause(live)
	cancelCause(errShuttingDown)
	held := &gormlease.HeldError{Target: "refresh:a", Holder: "pod-1", Generation: 3, ExpiresIn: 30 * time.Second}
	for _, c := range []struct {
		name   string
		ctx    context.Context
		err    error
		status int
		retry  time.Duration
		level  slog.Level
	}{
		{"held", live, held, 409, held.RetryAfter(), slog.LevelDebug},
		{"held, in a race", live, fmt.Errorf("acquire: %w", gormlease.ErrLeaseHeld), 409, time.Second, slog.LevelDebug},
		{"held past Do's wait", live, errors.Join(context.DeadlineExceeded, held), 409, held.RetryAfter(), slog.LevelDebug},
		{"paused", live, &gormlease.PausedError{Target: "refresh:a", Reason: "deploy"}, 503, 0, slog.LevelInfo},
		{"stop requested", live, fmt.Errorf("run: %w", gormlease.ErrStopRequested), 503, 0, slog.LevelInfo},
		{"max hold passed", live, fmt.Errorf("run: %w", gormlease.ErrMaxHoldExceeded), 504, 0, slog.LevelWarn},
		{"lease lost", live, fmt.Errorf("heartbeat: %w", gormlease.ErrLeaseLost), 503, time.Second, slog.LevelWarn},
		{"commit unknown", live, fmt.Errorf("commit: %w", gormlease.ErrCommitUnknown), 500, 0, slog.LevelError},
		{"shared job failed", live, &gormlease.SharedJobError{TargetID: "report:a", Message: "boom"}, 502, 0, slog.LevelInfo},
		{"work failed", live, &gormlease.WorkError{Step: "work", Target: "refresh:a", Err: errors.New("boom")}, 502, 0, slog.LevelWarn},
		{"save failed", live, &gormlease.WorkError{Step: "save", Target: "refresh:a", Err: errors.New("boom")}, 500, 0, slog.LevelError},
		{"missing tables", live, fmt.Errorf("acquire: %w", gormlease.ErrMissingTables), 500, 0, slog.LevelError},
		{"bad id", live, fmt.Errorf("%w: target too long", gormlease.ErrInvalidArgument), 400, 0, slog.LevelDebug},
		{"client gone", gone, context.Canceled, statusClientGone, 0, slog.LevelInfo},
		{"client gone while held", gone, errors.Join(context.Canceled, held), statusClientGone, 0, slog.LevelInfo},
		{"client gone during COMMIT", gone, errors.Join(context.Canceled, gormlease.ErrCommitUnknown), 500, 0, slog.LevelError},
		{"shutting down during COMMIT", stopping, errors.Join(errShuttingDown, gormlease.ErrCommitUnknown), 500, 0, slog.LevelError},
		{"shutting down", stopping, errShuttingDown, 503, time.Second, slog.LevelInfo},
		{"anything else", live, errors.New("connection refused"), 500, 0, slog.LevelError},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := outcome(c.ctx, c.err)
			assert.Equal(t, c.status, o.status, o.message)
			assert.Equal(t, c.retry, o.retryAfter, "Retry-After")
			assert.Equal(t, c.level, o.level, "log level")
		})
	}
}

// On shutdown, the work in progress ends on its own within the grace: its
// client gets its answer, its report is saved, and no lease is left live.
func TestShutdown_LetsTheWorkEnd(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, time.Minute)
		id := newID()
		first := svc.goCall(t.Context(), "POST", "/refresh/"+id)
		testkit.Recv(t, g.started, 10*time.Second, "the work")
		shut := make(chan error, 1)
		go func() { shut <- svc.shutdown() }()
		testkit.WaitFor(t, 10*time.Second, "the shutdown to begin", func() bool { return len(svc.logs.find("shutting down")) > 0 })
		close(g.open)
		r := testkit.Recv(t, first, 10*time.Second, "the answer")
		assert.Equal(t, http.StatusOK, r.status, r.body)
		require.NoError(t, testkit.Recv(t, shut, 10*time.Second, "the shutdown"))
		assert.EqualValues(t, 1, reports(t, db, id))
		released(t, db, "refresh:"+id)
	})
}

// Past the grace, the shutdown cancels the work in progress: each Run and
// Do releases its target (released now, not left to expire with the
// lease's 20 s), saves nothing, and its client gets 503; then Serve
// returns nil.
func TestShutdown_PastTheGraceReleasesTheTargets(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch}, 200*time.Millisecond)
		ids := []string{newID(), newID(), newID()}
		answers := []<-chan reply{
			svc.goCall(t.Context(), "POST", "/refresh/"+ids[0]),
			svc.goCall(t.Context(), "POST", "/refresh/"+ids[1]),
			svc.goCall(t.Context(), "GET", "/report/"+ids[2]),
		}
		for range answers {
			testkit.Recv(t, g.started, 10*time.Second, "the work")
		}
		began := time.Now()
		require.NoError(t, svc.shutdown())
		assert.Less(t, time.Since(began), releaseWait, "the shutdown's length")
		for _, ch := range answers {
			r := testkit.Recv(t, ch, time.Second, "an answer")
			assert.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
			assert.Equal(t, "shutting down: nothing saved; try again\n", r.body)
		}
		// Run's work ends with the shutdown's cause; Do's job, shared by
		// the callers of the process, ends when its last caller has gone.
		var causes []error
		for range answers {
			causes = append(causes, testkit.Recv(t, g.ended, time.Second, "the work's end"))
		}
		assert.ElementsMatch(t, []error{errShuttingDown, errShuttingDown, context.Canceled}, causes)
		released(t, db, "refresh:"+ids[0])
		released(t, db, "refresh:"+ids[1])
		released(t, db, "report:"+ids[2])
		assert.Zero(t, reports(t, db, ids[0])+reports(t, db, ids[1]))
	})
}

// The console is served only with the operators' token (bearer, or Basic
// auth's password), and acts: a pause from it records Basic auth's user
// as the operator, and refuses the next refresh. Without a token, no
// console.
func TestConsole_BehindTheToken(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		g := newGate()
		svc := start(t, s, db, Config{Fetch: g.fetch, OpsToken: "s3cret"}, time.Second)
		get := func(auth string) *http.Response {
			req, err := http.NewRequestWithContext(t.Context(), "GET", svc.base+"/ops/leases/", nil)
			require.NoError(t, err)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			return resp
		}
		for _, auth := range []string{"", "Bearer wrong", "Basic b3BzOndyb25n"} { // ops:wrong
			resp := get(auth)
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, auth)
			assert.Equal(t, `Basic realm="operators"`, resp.Header.Get("WWW-Authenticate"))
		}
		assert.Equal(t, http.StatusOK, get("Bearer s3cret").StatusCode)
		assert.Equal(t, http.StatusOK, get("Basic b3BzOnMzY3JldA==").StatusCode) // ops:s3cret

		// A pause of a target without a row asks first: a script that
		// means it posts confirm=1.
		id := newID()
		form := url.Values{"target": {"refresh:" + id}, "reason": {"on-call"}, "confirm": {"1"}}
		req, err := http.NewRequestWithContext(t.Context(), "POST", svc.base+"/ops/leases/pause", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", svc.base)
		req.SetBasicAuth("alice", "s3cret")
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		info, ok := leasetest.State(t, db, "refresh:"+id)
		require.True(t, ok)
		assert.Equal(t, "alice", info.PausedBy, "the operator recorded in the row")
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		r := svc.call(ctx, "POST", "/refresh/"+id)
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		assert.Equal(t, "paused by an operator: on-call\n", r.body)
		assert.Zero(t, g.calls.Load(), "work calls")

		bare := start(t, s, db, Config{Fetch: g.fetch}, time.Second)
		assert.Equal(t, http.StatusNotFound, bare.call(t.Context(), "GET", "/ops/leases/").status)
	})
}

// On a database without the tables, the service does not start: the
// error says which table is missing and how to make it.
func TestNewService_MissingTables(t *testing.T) {
	testkit.EachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		empty := s.OpenEmpty(t, nil)
		g := newGate()
		_, err := NewService(t.Context(), empty, Config{Fetch: g.fetch})
		require.ErrorIs(t, err, gormlease.ErrMissingTables)
		assert.Contains(t, err.Error(), "gormlease migrate")

		require.NoError(t, migrate(t.Context(), empty))
		_, err = NewService(t.Context(), empty, Config{Fetch: g.fetch})
		require.NoError(t, err)
	})
}
