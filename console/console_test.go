package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The list shows every row under the prefix, each with its state, holder,
// generation, heartbeat meter, expiry, slot and last save or failure; the
// state filter keeps one state; pages follow each other by their next
// link, every row once.
func TestList_EveryRowWithItsStateOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		h, _ := newConsole(t, db)
		r := get(t, h, "/?prefix="+url.QueryEscape(f.prefix))
		require.Equal(t, http.StatusOK, r.status, r.body)
		slot1, slot2 := f.slotted+"\x1f1", f.slotted+"\x1f2"
		assert.ElementsMatch(t, []string{f.live, f.expired, f.released, f.failed, f.saved, slot1, slot2}, keys(r.body))

		live := rowOf(r.body, f.live)
		assert.Contains(t, live, `class="state live"`)
		assert.Contains(t, live, "holder-of-")
		assert.Regexp(t, `<meter min="0" max="3600"[^>]* value="[0-9.e-]+"`, live, "the heartbeat age against the recorded timeout")
		assert.Regexp(t, `<td>(59m[0-9]+s|1h0m0s)</td>`, live, "expires in")
		assert.Contains(t, rowOf(r.body, f.expired), `class="state expired"`)
		assert.Contains(t, rowOf(r.body, f.expired), "expired 1h")
		assert.Contains(t, rowOf(r.body, f.released), `class="state released"`)
		assert.Contains(t, rowOf(r.body, f.failed), "failed: the API said no")
		assert.Contains(t, rowOf(r.body, f.saved), "saved gen 1")
		assert.Contains(t, rowOf(r.body, slot1), `<td class="num">1</td>`)
		assert.Contains(t, strings.ToLower(rowOf(r.body, slot1)), strings.ToLower(`href="target?id=`+url.QueryEscape(f.slotted)+`"`))

		r = get(t, h, "/?state=expired&prefix="+url.QueryEscape(f.prefix))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Equal(t, []string{f.expired}, keys(r.body))

		var seen []string
		next := "/?limit=3&prefix=" + url.QueryEscape(f.prefix)
		for pages := 0; next != ""; pages++ {
			require.Less(t, pages, 5, "the pages do not end")
			r = get(t, h, next)
			require.Equal(t, http.StatusOK, r.status, r.body)
			page := keys(r.body)
			assert.LessOrEqual(t, len(page), 3)
			seen = append(seen, page...)
			next = ""
			if m := regexp.MustCompile(`id="next" href="\./(\?[^"]*)"`).FindStringSubmatch(r.body); m != nil {
				next = "/" + strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		assert.Equal(t, []string{f.expired, f.failed, f.live, f.released, f.saved, slot1, slot2}, seen)
	})
}

// A target's page shows its row, its slots' rows and its result row; a
// target without any of them is a 404.
func TestTarget_RowSlotsAndResultOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		h, _ := newConsole(t, db)

		r := get(t, h, "/target?id="+url.QueryEscape(f.saved))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, `<dl id="row">`)
		assert.Contains(t, r.body, `class="state released"`)
		assert.Contains(t, r.body, "Generation 1, saved ")
		assert.Regexp(t, `<pre id="result">\{&#34;report&#34;: ?&#34;(&lt;b&gt;|\\u003cb\\u003e)ready`, r.body, "the result row, escaped")

		r = get(t, h, "/target?id="+url.QueryEscape(f.slotted))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.NotContains(t, r.body, `<dl id="row">`, "a slotted target has no row of its own")
		assert.Contains(t, r.body, "Slots: 2 rows, 1 held")
		assert.Regexp(t, `(?s)<td class="num">1</td><td><span class="state .*<td class="num">2</td><td><span class="state`, r.body)

		r = get(t, h, "/target?id="+url.QueryEscape(f.live))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, f.liveLease.Token.String())
		assert.Contains(t, r.body, "None saved")

		r = get(t, h, "/target?id="+url.QueryEscape(f.prefix+"never"))
		assert.Equal(t, http.StatusNotFound, r.status)
		assert.Contains(t, r.body, "No lease row for this target")
	})
}

// Release ends a live lease by force when the request is same-origin and
// the authorizer allows it: 303 to the target's page, the holder fenced
// off, and the action logged with its reason. On a slotted target it ends
// every slot's lease.
func TestRelease_EndsTheLeaseAndLogsTheReasonOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		var asked []string
		h, logs := newConsole(t, db, console.WithAuthorizer(func(r *http.Request, action, target string) error {
			asked = append(asked, action+" "+target)
			return nil
		}))
		r := post(h, "release", f.live, "holder is gone", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, "target?"+url.Values{"id": {f.live}, "done": {"release"}}.Encode(), r.header.Get("Location"))
		assert.Equal(t, []string{"release " + f.live}, asked)
		assert.Equal(t, admin.StateReleased, state(t, f.repo, f.live).State)
		assert.ErrorIs(t, f.repo.Heartbeat(context.Background(), f.liveLease), gormlease.ErrLeaseLost)
		assert.Regexp(t, `level=INFO msg="console: action done" action=release remote=\S+ target=\S+live reason="holder is gone"`, logs.String())

		page := get(t, h, "/"+r.header.Get("Location"))
		assert.Contains(t, page.body, `<p class="note" id="done">release: done.</p>`)

		// On a slotted target, release ends every slot's lease.
		r = post(h, "release", f.slotted, "slots stuck", nil)
		assert.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, 0, heldSlots(t, f.repo, f.slotted), "a slot is still held")

		r = post(h, "release", f.released, "again", nil)
		assert.Equal(t, http.StatusConflict, r.status, "no live lease to release")
		assert.Contains(t, r.body, "no live lease")
	})
}

// An action is refused with 403 and writes nothing when the request is
// cross-origin or says nothing of its origin, when the console has no
// authorizer, or when the authorizer says no (its error is shown,
// escaped); and with 405 when it is not a POST, 400 without a target or
// a reason.
func TestActions_RefusedWriteNothingOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		allowed, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
		readOnly, _ := newConsole(t, db)
		denied, logs := newConsole(t, db, console.WithAuthorizer(func(r *http.Request, action, target string) error {
			return errors.New("<b>only the on-call</b> may " + action)
		}))
		before := state(t, f.repo, f.live)
		for _, c := range []struct {
			name   string
			h      http.Handler
			header map[string]string
			status int
			says   string
		}{
			{"CrossOriginByOrigin", allowed, map[string]string{"Origin": "https://evil.example"}, 403, "cross-origin"},
			{"CrossSiteByFetchMetadata", allowed, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, 403, "cross-origin"},
			{"SameSiteIsNotSameOrigin", allowed, map[string]string{"Sec-Fetch-Site": "same-site"}, 403, "cross-origin"},
			{"NoOriginHeaders", allowed, map[string]string{}, 403, "neither a Sec-Fetch-Site nor an Origin header"},
			{"ReadOnly", readOnly, nil, 403, "read-only"},
			{"AuthorizerSaysNo", denied, nil, 403, "not allowed: &lt;b&gt;only the on-call&lt;/b&gt; may release"},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := post(c.h, "release", f.live, "try", c.header)
				assert.Equal(t, c.status, r.status, r.body)
				assert.Contains(t, r.body, c.says)
				assert.NotContains(t, r.body, "<b>only")
			})
		}
		assert.Contains(t, logs.String(), `level=WARN msg="console: action refused" action=release`)

		r := do(allowed, httptest.NewRequest(http.MethodGet, "/release?target="+url.QueryEscape(f.live), nil))
		assert.Equal(t, http.StatusMethodNotAllowed, r.status)
		assert.Equal(t, "POST", r.header.Get("Allow"))
		assert.Equal(t, http.StatusBadRequest, post(allowed, "release", "", "why", nil).status, "no target")
		assert.Equal(t, http.StatusBadRequest, post(allowed, "release", f.live, "", nil).status, "no reason")
		assert.Equal(t, http.StatusBadRequest, post(allowed, "release", f.live, strings.Repeat("x", 256), nil).status, "a reason longer than the row keeps")

		after := state(t, f.repo, f.live)
		assert.Equal(t, admin.StateLive, after.State)
		assert.Equal(t, before.Row.LeaseToken, after.Row.LeaseToken)
		assert.Equal(t, before.Row.Generation, after.Row.Generation)
		require.NoError(t, f.repo.Heartbeat(context.Background(), f.liveLease))
	})
}

// A target named like a script renders as text on the list and its page,
// and its link carries it escaped.
func TestPages_EscapeTargetIDs(t *testing.T) {
	s := testdb.SQLite(t)
	db := s.DB(t)
	ctx := context.Background()
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder(`<img src=x onerror=alert(2)>`))
	require.NoError(t, err)
	p := newPrefix(t)
	target := p + `<script>alert(1)</script>"'&`
	_, err = repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
	for _, page := range []string{"/?prefix=" + url.QueryEscape(p), "/target?id=" + url.QueryEscape(target)} {
		r := get(t, h, page)
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.NotContains(t, r.body, "<script>alert(1)")
		assert.NotContains(t, r.body, "<img src=x")
		assert.Contains(t, r.body, `&lt;script&gt;alert(1)&lt;/script&gt;`)
		assert.Contains(t, r.body, `&lt;img src=x onerror=alert(2)&gt;`)
	}
	r := get(t, h, "/?prefix="+url.QueryEscape(p))
	m := regexp.MustCompile(`href="target\?id=([^"]*)"`).FindStringSubmatch(r.body)
	require.NotNil(t, m, r.body)
	id, err := url.QueryUnescape(m[1])
	require.NoError(t, err)
	assert.Equal(t, target, id, "the link names the target")
}

// Every page carries a Content-Security-Policy that allows no source but
// the response's nonce, which its one style and one script carry; no
// page loads anything from elsewhere.
func TestPages_StrictContentSecurityPolicy(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
	nonces := map[string]bool{}
	for _, page := range []string{"/", "/target?id=nothing-here", "/nowhere"} {
		r := get(t, h, page)
		policy := r.header.Get("Content-Security-Policy")
		m := regexp.MustCompile(`^default-src 'none'; style-src 'nonce-([A-Za-z0-9]+)'; script-src 'nonce-([A-Za-z0-9]+)';`).FindStringSubmatch(policy)
		require.NotNil(t, m, "%s: policy %q", page, policy)
		require.Equal(t, m[1], m[2])
		nonces[m[1]] = true
		assert.Contains(t, policy, "form-action 'self'")
		assert.Contains(t, policy, "frame-ancestors 'none'")
		assert.Equal(t, 1, strings.Count(r.body, "<style"), page)
		assert.Contains(t, r.body, `<style nonce="`+m[1]+`">`)
		if strings.Contains(r.body, "<script") {
			assert.Contains(t, r.body, `<script nonce="`+m[1]+`">`)
			assert.Equal(t, 1, strings.Count(r.body, "<script"), page)
		}
		assert.NotRegexp(t, `(src|href)="(https?:)?//`, r.body, "an external asset")
		assert.NotContains(t, r.body, " style=", "an inline style attribute, which the policy blocks")
		assert.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"))
	}
	assert.Len(t, nonces, 3, "a nonce per response")
	assert.Contains(t, get(t, h, "/").body, "location.replace", "the list reloads itself")
}

// Mounted under a path prefix with http.StripPrefix, the console's links,
// forms and redirects stay under the prefix, and the prefix without its
// slash redirects to it.
func TestMount_UnderAPathPrefix(t *testing.T) {
	s := testdb.SQLite(t)
	db := s.DB(t)
	f := newFixture(t, s, db)
	h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
	mux := http.NewServeMux()
	mux.Handle("/ops/leases/", http.StripPrefix("/ops/leases", h))
	mux.Handle("/ops/leases", http.StripPrefix("/ops/leases", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	fetch := func(req *http.Request) (*http.Response, string) {
		t.Helper()
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b strings.Builder
		_, err = io.Copy(&b, resp.Body)
		require.NoError(t, err)
		return resp, b.String()
	}
	base, _ := url.Parse(srv.URL + "/ops/leases/")

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ops/leases?prefix=x", nil)
	resp, _ := fetch(req)
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	loc, _ := resp.Location()
	assert.Equal(t, "/ops/leases/?prefix=x", loc.RequestURI())

	req, _ = http.NewRequest(http.MethodGet, base.String()+"?prefix="+url.QueryEscape(f.prefix), nil)
	resp, body := fetch(req)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	m := regexp.MustCompile(`href="(target\?id=[^"]*live)"`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	link, _ := base.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
	assert.Equal(t, "/ops/leases/target", link.Path)

	req, _ = http.NewRequest(http.MethodGet, link.String(), nil)
	resp, body = fetch(req)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, `<a href="./">gormlease leases</a>`)
	assert.Contains(t, body, `formaction="release"`)

	form := url.Values{"target": {f.live}, "reason": {"test"}, "confirm": {"1"}}
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/ops/leases/release", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	resp, body = fetch(req)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	loc, _ = resp.Location()
	assert.Equal(t, "/ops/leases/target", loc.Path)
	assert.Equal(t, admin.StateReleased, state(t, f.repo, f.live).State)
}

// Every route answers as documented: unknown paths 404, pages refuse
// POST with 405, bad parameters 400; New refuses what it cannot use.
func TestRoutes_AndBadInput(t *testing.T) {
	db := testdb.SQLite(t).DB(t)
	h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
	for _, c := range []struct {
		method, target string
		status         int
		says           string
	}{
		{"GET", "/", 200, "<h1>Leases</h1>"},
		{"HEAD", "/", 200, ""},
		{"POST", "/", 405, "read with GET"},
		{"GET", "/nowhere", 404, "no such page"},
		{"GET", "/target", 400, "give the target"},
		{"GET", "/target?id=none", 404, "No lease row"},
		{"GET", "/?limit=0", 400, "give 1 to 1000"},
		{"GET", "/?limit=x", 400, "give 1 to 1000"},
		{"GET", "/?state=sleeping", 400, "state &#34;sleeping&#34;"},
		{"GET", "/?prefix=%00", 400, "prefix"},
		{"GET", "/pause", 405, "is a POST"},
	} {
		r := do(h, httptest.NewRequest(c.method, c.target, nil))
		assert.Equal(t, c.status, r.status, "%s %s: %s", c.method, c.target, r.body)
		assert.Contains(t, r.body, c.says, "%s %s", c.method, c.target)
	}

	_, err := console.New(nil)
	assert.ErrorContains(t, err, "db is nil")
	_, err = console.New(db, nil)
	assert.ErrorContains(t, err, "Option is nil")
	_, err = console.New(db, console.WithTables(nil))
	assert.ErrorContains(t, err, "WithTables")
	_, err = console.New(db, console.WithAuthorizer(nil))
	assert.ErrorContains(t, err, "WithAuthorizer")
	_, err = console.New(db, console.WithTables(gormlease.WithTableNames("Bad-Name", "r")))
	assert.ErrorContains(t, err, "WithTableNames")
}

// Pause marks the target paused with its reason, which the list's paused
// filter and the target's page show, and a Run on it is refused with
// ErrPaused; stop asks the live holder to stop; resume lets it run again.
// Each answers 303 to the target's page.
func TestPauseStopResume_OnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		h, logs := newConsole(t, db, console.WithAuthorizer(allowAll))

		r := post(h, "pause", f.released, "<deploy> & migrate", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, "target?"+url.Values{"id": {f.released}, "done": {"pause"}}.Encode(), r.header.Get("Location"))
		li := state(t, f.repo, f.released)
		assert.True(t, li.Paused)
		assert.Equal(t, "<deploy> & migrate", li.PauseReason)
		_, err := f.repo.Acquire(ctx, f.released, time.Minute)
		assert.ErrorIs(t, err, gormlease.ErrPaused)
		runner, err := gormlease.NewRunner[int](db)
		require.NoError(t, err)
		ran := false
		_, err = runner.Run(ctx, f.released, func(context.Context) (int, error) { ran = true; return 1, nil },
			func(*gorm.DB, int) error { return nil })
		assert.ErrorIs(t, err, gormlease.ErrPaused)
		assert.False(t, ran)

		list := get(t, h, "/?state=paused&prefix="+url.QueryEscape(f.prefix))
		require.Equal(t, http.StatusOK, list.status, list.body)
		assert.Equal(t, []string{f.released}, keys(list.body))
		assert.Contains(t, rowOf(list.body, f.released), `<span class="state paused" title="&lt;deploy&gt; &amp; migrate">paused</span>`)
		page := get(t, h, "/target?id="+url.QueryEscape(f.released))
		assert.Contains(t, page.body, `<dd id="pause-reason">&lt;deploy&gt; &amp; migrate</dd>`)

		r = post(h, "stop", f.live, "stuck on the API", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		li = state(t, f.repo, f.live)
		assert.True(t, li.StopRequested)
		assert.Equal(t, "stuck on the API", li.StopReason)
		assert.Contains(t, rowOf(get(t, h, "/?prefix="+url.QueryEscape(f.prefix)).body, f.live), "stop requested")
		r = post(h, "stop", f.expired+"-none", "nothing there", nil)
		assert.Equal(t, http.StatusConflict, r.status, "no live lease to stop: %s", r.body)

		r = post(h, "resume", f.released, "", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.False(t, state(t, f.repo, f.released).Paused)
		l, err := f.repo.Acquire(ctx, f.released, time.Minute)
		require.NoError(t, err, "resumed")
		require.NoError(t, f.repo.Release(ctx, l))
		assert.Regexp(t, `msg="console: action done" action=pause remote=\S+ target=\S+released reason="<deploy> & migrate"`, logs.String())
		assert.Regexp(t, `msg="console: action done" action=stop .* reason="stuck on the API"`, logs.String())
	})
}

// Without an authorizer every action is refused with 403, and nothing is
// written: no pause, no stop request, no release.
func TestActions_ReadOnlyRefusesEveryAction(t *testing.T) {
	s := testdb.SQLite(t)
	db := s.DB(t)
	f := newFixture(t, s, db)
	h, _ := newConsole(t, db)
	before := state(t, f.repo, f.live)
	for _, action := range []string{"pause", "resume", "stop", "release"} {
		r := post(h, action, f.live, "try", nil)
		assert.Equal(t, http.StatusForbidden, r.status, action)
		assert.Contains(t, r.body, "read-only", action)
	}
	assert.NotContains(t, get(t, h, "/target?id="+url.QueryEscape(f.live)).body, `id="actions"`, "no action buttons")
	after := state(t, f.repo, f.live)
	assert.Equal(t, before.Row.LeaseToken, after.Row.LeaseToken)
	assert.False(t, after.Paused)
	assert.False(t, after.StopRequested)
	assert.Equal(t, admin.StateLive, after.State)
}

// Stop, posted while a Runner's work is running, ends that work at its
// next heartbeat: Run returns an error wrapping ErrStopRequested, with
// the reason, and the lease is released.
func TestStop_EndsARunningRunOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		target := newPrefix(t) + "running"
		h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
		runner, err := gormlease.NewRunner[int](db, gormlease.WithHeartbeatInterval(100*time.Millisecond))
		require.NoError(t, err)
		started := make(chan struct{})
		returned := make(chan error, 1)
		go func() {
			_, err := runner.Run(context.Background(), target, func(ctx context.Context) (int, error) {
				close(started)
				<-ctx.Done()
				return 0, context.Cause(ctx)
			}, func(*gorm.DB, int) error { return nil })
			returned <- err
		}()
		select {
		case <-started:
		case err := <-returned:
			t.Fatalf("Run returned before its work started: %v", err)
		}
		r := post(h, "stop", target, "stuck on the API", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		select {
		case err := <-returned:
			require.ErrorIs(t, err, gormlease.ErrStopRequested)
			assert.Contains(t, err.Error(), "stuck on the API")
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30 s of the stop request")
		}
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		assert.Equal(t, admin.StateReleased, state(t, repo, target).State)
	})
}

// Stop and release take the form field slot: they then act on that slot
// of the target only, the other slots' holders keeping their leases; the
// authorizer is asked with the target's ID (the slot is in the form); the
// page offers both per slot, and says which slot an action was done on.
// A bad slot, or a slot given to pause or resume, is a 400 that writes
// nothing and asks no authorizer; the origin and authorizer rules hold as
// without a slot.
func TestSlotActions_StopAndReleaseOneSlotOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		target := f.prefix + "two-slots"
		gone, err := f.repo.AcquireSlot(ctx, target, 2, time.Hour)
		require.NoError(t, err)
		kept, err := f.repo.AcquireSlot(ctx, target, 2, time.Hour)
		require.NoError(t, err)
		slotOf := func(l gormlease.Lease) string { return strconv.Itoa(l.Slot) }
		form := func(slot string) url.Values {
			return url.Values{"target": {target}, "reason": {"stuck"}, "slot": {slot}, "confirm": {"1"}}
		}
		var asked []string
		h, logs := newConsole(t, db, console.WithAuthorizer(func(r *http.Request, action, target string) error {
			asked = append(asked, action+" "+target+" slot "+r.FormValue("slot"))
			return nil
		}))
		denied, _ := newConsole(t, db, console.WithAuthorizer(func(*http.Request, string, string) error {
			return errors.New("no")
		}))
		rows := func() []gormlease.JobLease {
			return []gormlease.JobLease{state(t, f.repo, target+"\x1f1").Row, state(t, f.repo, target+"\x1f2").Row}
		}
		before := rows()

		for _, c := range []struct {
			action, slot string
			says         string
		}{
			{"release", "0", "from 1 to 100"}, {"release", "101", "from 1 to 100"}, {"stop", "-1", "from 1 to 100"},
			{"stop", "x", "from 1 to 100"}, {"release", "1.5", "from 1 to 100"}, {"release", "<b>", "&#34;&lt;b&gt;&#34;"},
			{"pause", "1", "takes no slot"}, {"resume", "1", "takes no slot"},
		} {
			r := postForm(h, c.action, form(c.slot), nil)
			assert.Equal(t, http.StatusBadRequest, r.status, "%s slot %q: %s", c.action, c.slot, r.body)
			assert.Contains(t, r.body, c.says, "%s slot %q", c.action, c.slot)
		}
		r := postForm(h, "release", form(slotOf(gone)), map[string]string{"Origin": "https://evil.example"})
		assert.Equal(t, http.StatusForbidden, r.status, "cross-origin, with a slot")
		r = postForm(denied, "release", form(slotOf(gone)), nil)
		assert.Equal(t, http.StatusForbidden, r.status, "the authorizer says no, with a slot")
		assert.Empty(t, asked, "the authorizer was asked about bad input")
		assert.Equal(t, before, rows(), "a refused action wrote")

		r = postForm(h, "release", form(slotOf(gone)), nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, "target?"+url.Values{"id": {target}, "done": {"release"}, "slot": {slotOf(gone)}}.Encode(), r.header.Get("Location"))
		assert.Equal(t, []string{"release " + target + " slot " + slotOf(gone)}, asked)
		assert.ErrorIs(t, f.repo.Heartbeat(ctx, gone), gormlease.ErrLeaseLost)
		assert.NoError(t, f.repo.Heartbeat(ctx, kept), "the other slot's holder")
		assert.Regexp(t, `level=INFO msg="console: action done" action=release remote=\S+ target=\S+two-slots reason=stuck slot=`+slotOf(gone), logs.String())

		page := get(t, h, "/"+r.header.Get("Location"))
		assert.Contains(t, page.body, `<p class="note" id="done">release slot `+slotOf(gone)+`: done.</p>`)
		assert.Contains(t, page.body, `id="release-slot-`+slotOf(kept)+`"`, "the held slot's release")
		assert.Contains(t, page.body, `id="stop-slot-`+slotOf(kept)+`"`, "the held slot's stop")
		assert.NotContains(t, page.body, `id="release-slot-`+slotOf(gone)+`"`, "the released slot offers release")
		assert.Regexp(t, `<input type="hidden" name="slot" value="`+slotOf(kept)+`">`, page.body)

		r = postForm(h, "release", form(slotOf(gone)), nil)
		assert.Equal(t, http.StatusConflict, r.status, "released already: %s", r.body)

		r = postForm(h, "stop", form(slotOf(kept)), nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.True(t, state(t, f.repo, target+"\x1f"+slotOf(kept)).StopRequested, "the stop request")
		r = postForm(h, "stop", form(slotOf(gone)), nil)
		assert.Equal(t, http.StatusConflict, r.status, "no lease to stop on the released slot: %s", r.body)
	})
}
