package console_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// eachDB runs fn on PostgreSQL, MariaDB and SQLite, in subtests named
// after them.
func eachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) { fn(t, s, s.DB(t)) })
	}
}

var keySeq atomic.Int64

// newPrefix returns a target prefix of the test's own.
func newPrefix(t *testing.T) string {
	return fmt.Sprintf("console/%s/%d-%d/", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

// fixture is a set of lease rows under one prefix, one in each state.
type fixture struct {
	prefix                                   string
	live, expired, released, failed, slotted string
	saved                                    string
	repo                                     *gormlease.Repository
	liveLease                                gormlease.Lease
}

// newFixture makes, under a prefix of the test's own: a live lease, an
// expired one, a released one, one that failed, a target with two slots
// of which one is held, and a target whose run saved a result.
func newFixture(t *testing.T, s *testdb.Server, db *gorm.DB) fixture {
	t.Helper()
	ctx := context.Background()
	p := newPrefix(t)
	f := fixture{prefix: p, live: p + "live", expired: p + "expired", released: p + "released",
		failed: p + "failed", slotted: p + "slotted", saved: p + "saved"}
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder("holder-of-"+p))
	require.NoError(t, err)
	f.repo = repo
	f.liveLease, err = repo.Acquire(ctx, f.live, time.Hour)
	require.NoError(t, err)
	_, err = repo.Acquire(ctx, f.expired, time.Minute)
	require.NoError(t, err)
	require.NoError(t, db.Table("job_lease").Where("target_id = ?", f.expired).Update("updated_at", s.Ago(2*time.Hour)).Error)
	l, err := repo.Acquire(ctx, f.released, time.Hour)
	require.NoError(t, err)
	require.NoError(t, repo.Release(ctx, l))
	l, err = repo.Acquire(ctx, f.failed, time.Hour)
	require.NoError(t, err)
	require.NoError(t, repo.Release(ctx, l))
	// The failure that a Runner's release records when its job failed.
	require.NoError(t, db.Table("job_lease").Where("target_id = ?", f.failed).Update("failure", "the API said no").Error)
	_, err = repo.AcquireSlot(ctx, f.slotted, 2, time.Hour)
	require.NoError(t, err)
	runner, err := gormlease.NewRunner[map[string]string](db)
	require.NoError(t, err)
	_, err = runner.Run(ctx, f.saved, func(context.Context) (map[string]string, error) {
		return map[string]string{"report": "<b>ready</b>"}, nil
	}, gormlease.SaveJSON[map[string]string])
	require.NoError(t, err)
	return f
}

// logBuffer is a slog handler's output, safe for the handler's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newConsole returns the console on db, with opts, logging into the
// returned buffer.
func newConsole(t testing.TB, db *gorm.DB, opts ...console.Option) (http.Handler, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	opts = append([]console.Option{console.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	h, err := console.New(db, opts...)
	require.NoError(t, err)
	return h, logs
}

// allowAll is an authorizer that allows every action.
func allowAll(*http.Request, string, string) error { return nil }

// response is what a request to the console got.
type response struct {
	status int
	header http.Header
	body   string
}

// get asks h for the page at target (a path and query below the root).
func get(t *testing.T, h http.Handler, target string) response {
	t.Helper()
	return do(h, httptest.NewRequest(http.MethodGet, target, nil))
}

// post posts the action with the form fields target and reason, and
// confirm=1 (as a script does, skipping the confirmation page), from the
// console's own origin unless header says otherwise.
func post(h http.Handler, action, target, reason string, header map[string]string) response {
	return postForm(h, action, url.Values{"target": {target}, "reason": {reason}, "confirm": {"1"}}, header)
}

// postForm posts the action with the form fields of form, from the
// console's own origin unless header says otherwise.
func postForm(h http.Handler, action string, form url.Values, header map[string]string) response {
	r := httptest.NewRequest(http.MethodPost, "/"+action, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if header == nil {
		header = map[string]string{"Origin": "http://" + r.Host, "Sec-Fetch-Site": "same-origin"}
	}
	for k, v := range header {
		r.Header.Set(k, v)
	}
	return do(h, r)
}

func do(h http.Handler, r *http.Request) response {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return response{w.Code, w.Header(), w.Body.String()}
}

var dataKey = regexp.MustCompile(`data-key="([^"]*)"`)

// keys are the keys of the rows of a list page, in order.
func keys(body string) []string {
	var out []string
	for _, m := range dataKey.FindAllStringSubmatch(body, -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

// rowOf is the table row of key in a list page, or "".
func rowOf(body, key string) string {
	i := strings.Index(body, `data-key="`+html.EscapeString(key)+`"`)
	if i < 0 {
		return ""
	}
	end := strings.Index(body[i:], "</tr>")
	return body[i : i+end]
}

// state reads targetID's row as List does.
func state(t *testing.T, repo *gormlease.Repository, key string) admin.LeaseInfo {
	t.Helper()
	page, err := admin.New(repo).List(context.Background(), admin.ListOptions{Prefix: key, Limit: 1})
	require.NoError(t, err)
	require.NotEmpty(t, page, "no row for %q", key)
	require.Equal(t, key, page[0].Key)
	return page[0]
}

// heldSlots counts the live slot rows of target.
func heldSlots(t *testing.T, repo *gormlease.Repository, target string) int {
	t.Helper()
	page, err := admin.New(repo).List(context.Background(), admin.ListOptions{Prefix: target + "\x1f", State: admin.StateLive})
	require.NoError(t, err)
	return len(page)
}
