package browsertest

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests; goroutine leaks fail the run (see testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }

// chromiumPath is Debian's Chromium, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

// browser starts headless Chromium with a fresh profile, for tb, and
// returns a context of a tab in it. It skips tb, loudly, when Chromium is
// missing, or fails it under CI.
func browser(tb testing.TB) context.Context {
	tb.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		found, lookErr := exec.LookPath("chromium")
		if lookErr != nil {
			msg := fmt.Sprintf("BROWSER TESTS NOT RUN: no Chromium at %s nor on PATH: apt-get install -y chromium", chromiumPath)
			if os.Getenv("CI") != "" {
				tb.Fatal(msg + " (CI is set, so this fails instead of skipping)")
			}
			tb.Skip(msg)
		}
		path = found
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1400, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	tb.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit
	})
	// Start the browser now, on a context without a timeout (which would
	// stop the browser), so that a failure to start says so.
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("start Chromium %s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// screenshot saves the page as name.png in the test's artifact directory
// (kept with go test -artifacts), and logs where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: a PNG
	require.NoError(t, err)
	path := filepath.Join(t.ArtifactDir(), name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// updateDocsEnv, set to 1, makes the browser test write the console's
// picture in docs/operating.md, docs/console-list.png, from the list it
// shows on PostgreSQL.
const updateDocsEnv = "GORMLEASE_UPDATE_DOCS"

// docsScreenshot writes the page to docs/console-list.png when
// GORMLEASE_UPDATE_DOCS=1, at the width of a laptop's window.
func docsScreenshot(t *testing.T, ctx context.Context) {
	t.Helper()
	if os.Getenv(updateDocsEnv) != "1" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join("..", "..", "docs", "console-list.png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("docs screenshot: %s (%d bytes)", path, len(png))
}

// rows makes, under a prefix of its own, a live lease, an expired one, a
// released one and a target with two slots of which one is held, and
// a paused target, and returns the prefix.
func rows(t *testing.T, s *testdb.Server, db *gorm.DB) (prefix string) {
	t.Helper()
	ctx := context.Background()
	prefix = fmt.Sprintf("browser/%s/%d/", s.Name, time.Now().UnixNano())
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder("worker-7"))
	require.NoError(t, err)
	_, err = repo.Acquire(ctx, prefix+"report:user-42", time.Minute)
	require.NoError(t, err)
	_, err = repo.Acquire(ctx, prefix+"sync:crm", time.Minute)
	require.NoError(t, err)
	require.NoError(t, db.Table("job_lease").Where("target_id = ?", prefix+"sync:crm").
		Updates(map[string]any{"updated_at": s.Ago(50 * time.Second), "acquired_at": s.Ago(12 * time.Minute)}).Error)
	_, err = repo.Acquire(ctx, prefix+"export:daily", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, db.Table("job_lease").Where("target_id = ?", prefix+"export:daily").
		Updates(map[string]any{"updated_at": s.Ago(time.Hour), "acquired_at": s.Ago(65 * time.Minute)}).Error)
	l, err := repo.Acquire(ctx, prefix+"invoice:2026-11", time.Minute)
	require.NoError(t, err)
	require.NoError(t, repo.Release(ctx, l))
	_, err = repo.AcquireSlot(ctx, prefix+"thumbnails", 3, time.Minute)
	require.NoError(t, err)
	require.NoError(t, admin.New(repo).Pause(ctx, prefix+"backup:nightly", "storage migration until 14:00"))
	return prefix
}

// In Chromium, the list shows the live, expired, released, paused and
// slotted rows with their states; on a target's page, typing a reason and
// clicking Pause pauses it, and a Run on it is then refused with
// ErrPaused; clicking Release on another ends its lease; clicking a slot's
// own Release on a semaphore's page ends that slot's lease.
func TestBrowser_ListAndActOnEveryDatabase(t *testing.T) {
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			db := s.DB(t)
			prefix := rows(t, s, db)
			h, err := console.New(db, console.WithAuthorizer(func(*http.Request, string, string) error { return nil }))
			require.NoError(t, err)
			mux := http.NewServeMux()
			mux.Handle("/ops/leases/", http.StripPrefix("/ops/leases", h))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			ctx := browser(t)

			require.NoError(t, chromedp.Do(ctx,
				chromedp.Navigate(srv.URL+"/ops/leases/?prefix="+url.QueryEscape(prefix)),
				chromedp.WaitVisible(chromedp.CSS("#leases")),
			))
			got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
				`Array.from(document.querySelectorAll('#leases tbody tr')).map(tr => tr.cells[0].innerText.trim() + ' ' + tr.cells[1].innerText.trim())`))
			require.NoError(t, err)
			for _, want := range []string{"backup:nightly released paused", "export:daily expired", "invoice:2026-11 released",
				"report:user-42 live", "sync:crm live", "thumbnails live"} {
				assert.Contains(t, got, prefix+want)
			}
			assert.Len(t, got, 8, "five rows and three slot rows")
			text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#leases")))
			require.NoError(t, err)
			assert.Contains(t, text, "worker-7")
			screenshot(t, ctx, "list")
			if s.Name == "postgres" {
				docsScreenshot(t, ctx)
			}

			assert.Equal(t, "pause: done.", act(t, ctx, "invoice%3a2026-11", "#actions", "#pause", "month end: hold the invoices"))
			reason, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#pause-reason")))
			require.NoError(t, err)
			assert.Equal(t, "month end: hold the invoices", strings.TrimSpace(reason))
			screenshot(t, ctx, "target-paused")
			runner, err := gormlease.NewRunner[int](db)
			require.NoError(t, err)
			ran := false
			_, err = runner.Run(context.Background(), prefix+"invoice:2026-11", func(context.Context) (int, error) { ran = true; return 1, nil },
				func(*gorm.DB, int) error { return nil })
			require.ErrorIs(t, err, gormlease.ErrPaused)
			assert.Contains(t, err.Error(), "month end: hold the invoices")
			assert.False(t, ran, "the work ran on a paused target")

			target := prefix + "report:user-42"
			require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ops/leases/?prefix="+url.QueryEscape(prefix))))
			assert.Equal(t, "release: done.", act(t, ctx, "report%3auser-42", "#actions", "#release", "the worker's host is gone",
				"Release the lease by force?", "worker-7", "the worker's host is gone"))
			screenshot(t, ctx, "target-released")
			repo, err := gormlease.NewRepository(db)
			require.NoError(t, err)
			page, err := admin.New(repo).List(context.Background(), admin.ListOptions{Prefix: target, Limit: 1})
			require.NoError(t, err)
			require.Len(t, page, 1)
			assert.Equal(t, admin.StateReleased, page[0].State)

			// One slot of a semaphore: its own form, on the target's page.
			// (Held, or expired if this machine is slow: either is released.)
			thumbs := prefix + "thumbnails"
			held := func() []string {
				page, err := admin.New(repo).List(context.Background(), admin.ListOptions{Prefix: thumbs})
				require.NoError(t, err)
				var slots []string
				for _, li := range page {
					if li.Slot > 0 && li.State != admin.StateReleased {
						slots = append(slots, fmt.Sprint(li.Slot))
					}
				}
				return slots
			}
			slots := held()
			require.Len(t, slots, 1, "the held slot")
			slot := slots[0]
			require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ops/leases/?prefix="+url.QueryEscape(prefix))))
			assert.Equal(t, "release slot "+slot+": done.",
				act(t, ctx, "thumbnails", "#slot-"+slot, "#release-slot-"+slot, "the slot's worker is gone", "slot "+slot, "worker-7"))
			screenshot(t, ctx, "target-slot-released")
			assert.Empty(t, held(), "a slot still held")
		})
	}
}

// act follows the list's link whose href contains link to the target's
// page, types reason in the form that form selects and clicks button,
// and, given confirm, checks that the page that asks to confirm names
// what it names and clicks its button; it returns the notice of the page
// that the action answers with.
func act(t *testing.T, ctx context.Context, link, form, button, reason string, confirm ...string) string {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`a[href*="`+link+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(form)),
		chromedp.SendKeys(chromedp.CSS(form+` input[name=reason]`), reason),
		chromedp.Click(chromedp.CSS(button)),
	))
	if len(confirm) > 0 {
		require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#confirm"))))
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		require.NoError(t, err)
		for _, want := range confirm {
			assert.Contains(t, text, want, "the confirmation page")
		}
		screenshot(t, ctx, "confirm-"+strings.TrimPrefix(button, "#"))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-button"))))
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#done"))))
	done, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#done")))
	require.NoError(t, err)
	return strings.TrimSpace(done)
}

// At 400 px wide, no page scrolls sideways: the list's table scrolls
// inside its own box, and a target's page with a 255-byte ID wraps it.
// Under prefers-color-scheme: dark the pages are light on dark; under
// light, dark on white.
func TestBrowser_NarrowScreenAndDarkMode(t *testing.T) {
	s := testdb.Postgres(t)
	db := s.DB(t)
	prefix := rows(t, s, db)
	long := prefix + strings.Repeat("ü", (255-len(prefix))/2)
	long += strings.Repeat("x", 255-len(long))
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder("worker-with-a-rather-long-name-on-host-ip-10-0-12-34"))
	require.NoError(t, err)
	_, err = repo.Acquire(context.Background(), long, time.Minute)
	require.NoError(t, err)
	h, err := console.New(db, console.WithAuthorizer(func(*http.Request, string, string) error { return nil }))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx := browser(t)

	pages := map[string]string{
		"list":   srv.URL + "/?prefix=" + url.QueryEscape(prefix),
		"target": srv.URL + "/target?id=" + url.QueryEscape(long),
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(400, 800)))
	for name, page := range pages {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("h1"))))
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
		require.NoError(t, err)
		assert.LessOrEqual(t, width, 400, "%s: the page scrolls sideways at 400 px", name)
		screenshot(t, ctx, "narrow-"+name)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(pages["list"]), chromedp.WaitVisible(chromedp.CSS("#leases"))))
	inside, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`(function(){var b=document.getElementById('leases').parentElement;return getComputedStyle(b).overflowX==='auto'&&b.scrollWidth>b.clientWidth})()`))
	require.NoError(t, err)
	assert.True(t, inside, "the list's table scrolls inside its box")

	colors := func(scheme string) (body, text, live string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.EmulateViewport(1400, 900),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
					Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
				})
				return err
			}),
			chromedp.Navigate(pages["list"]),
			chromedp.WaitVisible(chromedp.CSS("#leases")),
		))
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[getComputedStyle(document.body).backgroundColor,
			getComputedStyle(document.body).color, getComputedStyle(document.querySelector('.state.live')).backgroundColor]`))
		require.NoError(t, err)
		require.Len(t, got, 3)
		screenshot(t, ctx, scheme+"-list")
		return got[0], got[1], got[2]
	}
	body, text, live := colors("dark")
	assert.Less(t, luminance(t, body), 0.1, "dark: the background %s", body)
	assert.Greater(t, luminance(t, text), 0.6, "dark: the text %s", text)
	assert.Less(t, luminance(t, live), 0.3, "dark: a live state's badge %s", live)
	body, text, _ = colors("light")
	assert.Equal(t, "rgb(255, 255, 255)", body, "light: the background")
	assert.Less(t, luminance(t, text), 0.2, "light: the text %s", text)
}

// luminance is the relative luminance, from 0 (black) to 1 (white), of
// a CSS color that getComputedStyle returns: rgb(r, g, b).
func luminance(t *testing.T, color string) float64 {
	t.Helper()
	var r, g, b float64
	_, err := fmt.Sscanf(color, "rgb(%g, %g, %g)", &r, &g, &b)
	require.NoError(t, err, "color %q", color)
	lin := func(c float64) float64 {
		c /= 255
		if c <= 0.03928 {
			return c / 12.92
		}
		return math.Pow((c+0.055)/1.055, 2.4)
	}
	return 0.2126*lin(r) + 0.7152*lin(g) + 0.0722*lin(b)
}
