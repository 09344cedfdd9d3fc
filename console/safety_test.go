package console_test

import (
	"context"
	"html"
	"net/http"
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

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]*)" value="([^"]*)">`)

// confirmation is the form of a confirmation page: its action and fields.
func confirmation(t *testing.T, body string) (action string, form url.Values) {
	t.Helper()
	m := regexp.MustCompile(`<form class="act" method="post" action="([a-z]+)">`).FindStringSubmatch(body)
	require.NotNil(t, m, "no confirmation form in %s", body)
	form = url.Values{}
	for _, f := range hiddenField.FindAllStringSubmatch(body, -1) {
		form.Set(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
	}
	return m[1], form
}

// Release and stop take a confirmation: a POST without confirm=1 answers
// a page that names the target, its holder and generation, and writes
// nothing; posting that page's form acts. A confirmation of a lease that
// changed since (another generation) is refused with 409, writing
// nothing; the same-origin check holds for the confirmed POST.
func TestConfirm_ReleaseAndStopAskFirstOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		h, logs := newConsole(t, db, console.WithAuthorizer(allowAll))
		before := state(t, f.repo, f.live)
		for _, action := range []string{"release", "stop"} {
			r := postForm(h, action, url.Values{"target": {f.live}, "reason": {"<why> & how"}}, nil)
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Contains(t, r.body, `<code id="target">`+html.EscapeString(f.live)+`</code>`)
			assert.Contains(t, r.body, `<td class="holder">`+html.EscapeString(before.Row.Holder)+`</td>`)
			assert.Contains(t, r.body, `<td class="num generation">1</td>`)
			assert.Contains(t, r.body, `<q id="reason">&lt;why&gt; &amp; how</q>`)
			got, form := confirmation(t, r.body)
			assert.Equal(t, action, got)
			assert.Equal(t, url.Values{"target": {f.live}, "reason": {"<why> & how"}, "generation": {"1"}, "confirm": {"1"}}, form)
			assert.Equal(t, before.Row, state(t, f.repo, f.live).Row, "%s without a confirmation wrote", action)
			r = postForm(h, action, form, map[string]string{"Origin": "https://evil.example"})
			assert.Equal(t, http.StatusForbidden, r.status, "a cross-origin confirmation")
			assert.Equal(t, before.Row, state(t, f.repo, f.live).Row, "%s cross-origin wrote", action)
		}
		require.NoError(t, f.repo.Heartbeat(ctx, f.liveLease))
		assert.NotContains(t, logs.String(), "action done")

		// Confirmed: the stop is recorded, then the release ends the lease.
		_, form := confirmation(t, postForm(h, "stop", url.Values{"target": {f.live}, "reason": {"stuck"}}, nil).body)
		r := postForm(h, "stop", form, nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.True(t, state(t, f.repo, f.live).StopRequested)
		_, form = confirmation(t, postForm(h, "release", url.Values{"target": {f.live}, "reason": {"gone"}}, nil).body)
		r = postForm(h, "release", form, nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, admin.StateReleased, state(t, f.repo, f.live).State)

		// A confirmation of generation 1, posted after another run took
		// the target (generation 2), acts on nothing.
		target := f.prefix + "changing"
		l, err := f.repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		_, form = confirmation(t, postForm(h, "release", url.Values{"target": {target}, "reason": {"stuck"}}, nil).body)
		require.NoError(t, f.repo.Release(ctx, l))
		l, err = f.repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		before = state(t, f.repo, target)
		r = postForm(h, "release", form, nil)
		assert.Equal(t, http.StatusConflict, r.status, r.body)
		assert.Contains(t, r.body, "changed since the confirmation of generation 1: it is now generation 2")
		assert.Equal(t, before.Row, state(t, f.repo, target).Row, "a stale confirmation wrote")
		require.NoError(t, f.repo.Heartbeat(ctx, l))

		// A slot's confirmation names the slot and its generation.
		page, err := admin.New(f.repo).List(ctx, admin.ListOptions{Prefix: f.slotted + "\x1f", State: admin.StateLive})
		require.NoError(t, err)
		require.Len(t, page, 1)
		slot := strconv.Itoa(page[0].Slot)
		r = postForm(h, "release", url.Values{"target": {f.slotted}, "reason": {"stuck"}, "slot": {slot}}, nil)
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, "slot "+slot+"</h1>")
		_, form = confirmation(t, r.body)
		assert.Equal(t, slot, form.Get("slot"))
		assert.Equal(t, "1", form.Get("generation"))
		assert.Equal(t, 1, heldSlots(t, f.repo, f.slotted), "released without a confirmation")
	})
}

// The target page offers the actions that match the target's state:
// pause or resume, never both; stop and release only for a lease not
// released. An action that does not match the state when it is posted is
// a 409 that writes nothing.
func TestActions_MatchTheStateOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
		paused := f.prefix + "paused"
		require.NoError(t, admin.New(f.repo).Pause(ctx, paused, "hold"))
		buttons := func(target string) []string {
			body := get(t, h, "/target?id="+url.QueryEscape(target)).body
			var ids []string
			for _, m := range regexp.MustCompile(`<button type="submit" formaction="[a-z]+" id="([a-z]+)"`).FindAllStringSubmatch(body, -1) {
				ids = append(ids, m[1])
			}
			return ids
		}
		assert.Equal(t, []string{"pause", "stop", "release"}, buttons(f.live), "live")
		assert.Equal(t, []string{"pause", "stop", "release"}, buttons(f.expired), "expired")
		assert.Equal(t, []string{"pause"}, buttons(f.released), "released")
		assert.Equal(t, []string{"resume"}, buttons(paused), "paused, without a lease")
		assert.Equal(t, []string{"pause"}, buttons(f.prefix+"nothing"), "no row")
		assert.Equal(t, []string{"pause", "stop", "release"}, buttons(f.slotted), "a slot held")

		rows := func() []gormlease.JobLease {
			return []gormlease.JobLease{state(t, f.repo, f.live).Row, state(t, f.repo, f.released).Row, state(t, f.repo, paused).Row}
		}
		before := rows()
		for _, c := range []struct{ action, target, says string }{
			{"resume", f.live, "it is not paused"},
			{"pause", paused, "it is paused already"},
			{"stop", f.released, "no live lease to stop"},
			{"release", f.released, "no live lease to release"},
			{"release", paused, "no live lease to release"},
			{"stop", f.prefix + "nothing", "no live lease to stop"},
		} {
			r := post(h, c.action, c.target, "try", nil)
			assert.Equal(t, http.StatusConflict, r.status, "%s %s: %s", c.action, c.target, r.body)
			assert.Contains(t, r.body, c.says, "%s %s", c.action, c.target)
			assert.Contains(t, r.body, "nothing was done")
		}
		assert.Equal(t, before, rows(), "an action that did not match the state wrote")
		assert.Equal(t, "hold", state(t, f.repo, paused).PauseReason)
		_, found, err := admin.New(f.repo).Get(ctx, f.prefix+"nothing")
		require.NoError(t, err)
		assert.False(t, found, "a stop made a row")
	})
}

// Pausing a target that has no row asks first, saying that a paused row
// will be created, and creates nothing until confirmed; pausing a target
// that has a row takes no confirmation.
func TestPause_WarnsBeforeCreatingARowOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
		target := f.prefix + "typo"
		page := get(t, h, "/target?id="+url.QueryEscape(target))
		assert.Contains(t, page.body, "pausing it creates one")

		r := postForm(h, "pause", url.Values{"target": {target}, "reason": {"deploy"}}, nil)
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, `<p id="creates">This target has <strong>no lease row</strong>: pausing it creates a paused row`)
		_, found, err := admin.New(f.repo).Get(ctx, target)
		require.NoError(t, err)
		assert.False(t, found, "a pause without confirmation created a row")
		action, form := confirmation(t, r.body)
		assert.Equal(t, "pause", action)
		assert.Empty(t, form.Get("generation"))
		r = postForm(h, action, form, nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.True(t, state(t, f.repo, target).Paused)

		r = postForm(h, "pause", url.Values{"target": {f.released}, "reason": {"deploy"}}, nil)
		require.Equal(t, http.StatusSeeOther, r.status, "a target with a row: %s", r.body)
		assert.True(t, state(t, f.repo, f.released).Paused)
	})
}

// A target ID of 255 bytes (the most a row holds), of multi-byte UTF-8
// characters, has its page, its link on the list and its actions; an ID
// that no target can have is a 400 that says why.
func TestTarget_LongestIDHasAPageOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		p := newPrefix(t)
		target := p + strings.Repeat("é", (255-len(p))/2)
		target += strings.Repeat("x", 255-len(target))
		require.Len(t, target, 255)
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		_, err = repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))

		r := get(t, h, "/target?id="+url.QueryEscape(target))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, `<code id="target">`+target+`</code>`)
		assert.Contains(t, r.body, `class="state live"`)
		list := get(t, h, "/?prefix="+url.QueryEscape(p))
		assert.Equal(t, []string{target}, keys(list.body))
		r = post(h, "release", target, "too long a name", nil)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, admin.StateReleased, state(t, repo, target).State)

		for _, c := range []struct{ id, says string }{
			{target + "x", "256 bytes long: a target ID has at most 255 bytes"},
			{"bad\xff", "not valid UTF-8"},
			{"nul\x00", "NUL byte"},
			{"slot\x1f1", "the byte 0x1f"},
		} {
			r := get(t, h, "/target?id="+url.QueryEscape(c.id))
			assert.Equal(t, http.StatusBadRequest, r.status, "%q: %s", c.id, r.body)
			assert.Contains(t, r.body, c.says)
			r = post(h, "pause", c.id, "try", nil)
			assert.Equal(t, http.StatusBadRequest, r.status, "pause %q: %s", c.id, r.body)
		}
	})
}

// A semaphore that has a row of its own besides its slots' (made by a
// pause, and left released by the resume) is confirmed as every
// semaphore is: the page names each slot's lease concerned, not the
// target's own released row, and carries no generation.
func TestConfirm_SemaphoreWithItsOwnRowOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		op := admin.New(f.repo)
		require.NoError(t, op.Pause(ctx, f.slotted, "maintenance"))
		require.NoError(t, op.Resume(ctx, f.slotted))
		own, found, err := op.Get(ctx, f.slotted)
		require.NoError(t, err)
		require.True(t, found, "the pause made the target's own row")
		require.NotNil(t, own.ReleasedAt)
		h, _ := newConsole(t, db, console.WithAuthorizer(allowAll))
		for _, action := range []string{"stop", "release"} {
			r := postForm(h, action, url.Values{"target": {f.slotted}, "reason": {"stuck"}}, nil)
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Contains(t, r.body, "<th>Slot</th>", "%s: the slots concerned", action)
			assert.Contains(t, r.body, `<td class="holder">holder-of-`, "%s: the live slot's holder", action)
			_, form := confirmation(t, r.body)
			assert.Empty(t, form.Get("generation"), "%s: a whole semaphore's confirmation carries no generation", action)
			assert.Equal(t, 1, heldSlots(t, f.repo, f.slotted), "%s without a confirmation wrote", action)
		}
	})
}
