package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// historyTables are the tables of the timeline's test, made with history.
var historyTables = gormlease.WithTableNames("browser_hist_lease", "browser_hist_result")

// timelineEntries are the texts of the visible entries of the page's
// timeline, in order.
const timelineEntries = `Array.from(document.querySelectorAll('#timeline > li'))
	.filter(li => li.getBoundingClientRect().height > 0 && getComputedStyle(li).visibility === 'visible')
	.map(li => li.innerText.replace(/\s+/g, ' ').trim())`

// In Chromium, a target with a real history (60 runs released, a Run
// that saved, a pause with a reason and a resume clicked on its page, a
// lease released by force from its page) shows its timeline: the
// generation released by force by the operator, the resume, the pause
// with its reason, the saved run, then the older generations, newest
// first; with scripts off, its Older link pages on to the oldest, the
// first generation, new. At 400 px nothing scrolls sideways.
func TestBrowser_TimelineOnEveryDatabase(t *testing.T) {
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			ctx := context.Background()
			db := s.DB(t)
			require.NoError(t, gormlease.AutoMigrate(ctx, db, historyTables, gormlease.WithHistory()))
			target := fmt.Sprintf("browser/%s/%d/report:weekly", s.Name, time.Now().UnixNano())
			repo, err := gormlease.NewRepository(db, historyTables, gormlease.WithHolder("worker-7"))
			require.NoError(t, err)
			for range 60 {
				l, err := repo.Acquire(ctx, target, time.Minute)
				require.NoError(t, err)
				require.NoError(t, repo.Release(ctx, l))
			}
			runner, err := gormlease.NewRunner[string](db, historyTables, gormlease.WithHolder("worker-8"))
			require.NoError(t, err)
			_, err = runner.Run(ctx, target, func(context.Context) (string, error) { return "42 pages", nil }, gormlease.SaveJSON[string])
			require.NoError(t, err)

			h, err := console.New(db, console.WithTables(historyTables),
				console.WithAuthorizer(func(*http.Request, string, string) error { return nil }),
				console.WithIdentity(func(*http.Request) string { return "oncall-ana" }))
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			defer srv.Close()
			page := srv.URL + "/target?id=" + url.QueryEscape(target)
			bctx := browser(t)

			click := func(button, reason string, confirm bool) string {
				t.Helper()
				actions := []chromedp.Action[chromedp.Void]{chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#actions"))}
				if reason != "" {
					actions = append(actions, chromedp.SendKeys(chromedp.CSS("#actions input[name=reason]"), reason))
				}
				actions = append(actions, chromedp.Click(chromedp.CSS(button)))
				if confirm {
					actions = append(actions, chromedp.WaitVisible(chromedp.CSS("#confirm-button")), chromedp.Click(chromedp.CSS("#confirm-button")))
				}
				actions = append(actions, chromedp.WaitVisible(chromedp.CSS("#done")))
				require.NoError(t, chromedp.Do(bctx, actions...))
				done, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#done")))
				require.NoError(t, err)
				return strings.TrimSpace(done)
			}
			assert.Equal(t, "pause: done.", click("#pause", "deploy of v2", false))
			assert.Equal(t, "resume: done.", click("#resume", "", false))
			_, err = repo.Acquire(ctx, target, time.Minute)
			require.NoError(t, err)
			assert.Equal(t, "release: done.", click("#release", "the worker's host is gone", true))

			// The timeline needs no script: read it, and page, with
			// scripts off (which also stops the page's reloading).
			require.NoError(t, chromedp.Do(bctx,
				chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
					_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
					return err
				}),
				chromedp.Navigate(page),
				chromedp.WaitVisible(chromedp.CSS("#timeline")),
			))
			// Evaluate runs whatever the page's own scripts may do.
			got, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](timelineEntries))
			require.NoError(t, err)
			require.Greater(t, len(got), 5, "%q", got)
			assert.Regexp(t, `^Generation 62 · worker-7 · held [0-9.]+s Began .*: released from gen 61 Ended .*: released by force by oncall-ana$`, got[0])
			assert.Regexp(t, `^[-0-9 :Z]+: resumed by oncall-ana \(gen 61\)$`, got[1])
			assert.Regexp(t, `^[-0-9 :Z]+: paused by oncall-ana: .?deploy of v2.? \(gen 61\)$`, got[2])
			assert.Regexp(t, `^Generation 61 · worker-8 · held [0-9.]+s Began .*: released from gen 60 Ended .*: saved$`, got[3])
			assert.Regexp(t, `^Generation 60 · worker-7 · held [0-9.]+s Began .*: released from gen 59 Ended .*: released, nothing saved$`, got[4])
			last := generationOf(t, got[len(got)-1])
			for i := 4; i < len(got); i++ {
				assert.Equal(t, 64-i, generationOf(t, got[i]), "entry %d: %s", i, got[i])
			}
			screenshot(t, bctx, "timeline")

			require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#older")), chromedp.WaitVisible(chromedp.CSS("#newest"))))
			older, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](timelineEntries))
			require.NoError(t, err)
			require.NotEmpty(t, older)
			assert.Equal(t, last-1, generationOf(t, older[0]), "the older page follows on: %s", older[0])
			assert.Regexp(t, `^Generation 1 · worker-7 · held [0-9.]+s Began .*: new Ended`, older[len(older)-1])
			assert.Len(t, older, last-1, "every generation below, once")
			n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#older').length`))
			require.NoError(t, err)
			assert.Zero(t, n, "the oldest page has no older link")
			screenshot(t, bctx, "timeline-older")

			require.NoError(t, chromedp.Do(bctx, chromedp.EmulateViewport(400, 800), chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#timeline"))))
			width, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
			require.NoError(t, err)
			assert.LessOrEqual(t, width, 400, "the timeline scrolls sideways at 400 px")
			screenshot(t, bctx, "timeline-narrow")

			// Under prefers-color-scheme: dark, the timeline is light on dark.
			require.NoError(t, chromedp.Do(bctx,
				chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
					_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
						Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}},
					})
					return err
				}),
				chromedp.Navigate(page),
				chromedp.WaitVisible(chromedp.CSS("#timeline")),
			))
			colors, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`(function(){var li=document.querySelector('#timeline > li');
				return [getComputedStyle(document.body).backgroundColor, getComputedStyle(li).color, getComputedStyle(li).borderLeftColor]})()`))
			require.NoError(t, err)
			require.Len(t, colors, 3)
			assert.Less(t, luminance(t, colors[0]), 0.1, "dark: the background %s", colors[0])
			assert.Greater(t, luminance(t, colors[1]), 0.6, "dark: an entry's text %s", colors[1])
			assert.Less(t, luminance(t, colors[2]), 0.3, "dark: an entry's mark %s", colors[2])
			screenshot(t, bctx, "timeline-dark")
		})
	}
}

// generationOf is the generation of a timeline entry's text.
func generationOf(t *testing.T, entry string) int {
	t.Helper()
	var g int
	_, err := fmt.Sscanf(entry, "Generation %d", &g)
	require.NoError(t, err, "not a generation's entry: %s", entry)
	return g
}
