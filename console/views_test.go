package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/console"
	"github.com/gormlease/gormlease/internal/testdb"
)

// With WithAllowedHosts, a request whose Host is not one of the hosts
// (a DNS-rebound name) gets 421 and neither reads nor writes, even a
// same-origin action; the allowed names are served whatever their port
// and case. Without the option every Host is served.
func TestAllowedHosts_RefuseOtherHosts(t *testing.T) {
	s := testdb.SQLite(t)
	db := s.DB(t)
	f := newFixture(t, s, db)
	h, logs := newConsole(t, db, console.WithAuthorizer(allowAll), console.WithAllowedHosts("ops.example.com", "127.0.0.1", "[::1]"))
	page := "/?prefix=" + url.QueryEscape(f.prefix)
	at := func(method, target, host string) response {
		var r *http.Request
		if method == http.MethodPost {
			form := url.Values{"target": {f.live}, "reason": {"rebound"}, "confirm": {"1"}}
			r = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.Header.Set("Origin", "http://"+host)
			r.Header.Set("Sec-Fetch-Site", "same-origin")
		} else {
			r = httptest.NewRequest(method, target, nil)
		}
		r.Host = host
		return do(h, r)
	}
	for _, host := range []string{"rebound.attacker.example", "rebound.attacker.example:8080", "ops.example.com.attacker.example", "localhost"} {
		r := at(http.MethodGet, page, host)
		assert.Equal(t, http.StatusMisdirectedRequest, r.status, host)
		assert.Contains(t, r.body, "does not serve the host")
		assert.NotContains(t, r.body, f.live)
		r = at(http.MethodGet, "/target?id="+url.QueryEscape(f.live)+"&format=json", host)
		assert.Equal(t, http.StatusMisdirectedRequest, r.status, host)
		r = at(http.MethodPost, "/release", host)
		assert.Equal(t, http.StatusMisdirectedRequest, r.status, host)
	}
	assert.Equal(t, admin.StateLive, state(t, f.repo, f.live).State, "a refused host released")
	assert.Contains(t, logs.String(), `msg="console: request for another host refused" host=rebound.attacker.example`)
	for _, host := range []string{"ops.example.com", "OPS.Example.COM:8443", "127.0.0.1:8080", "[::1]:80"} {
		assert.Equal(t, http.StatusOK, at(http.MethodGet, page, host).status, host)
	}
	r := at(http.MethodPost, "/release", "ops.example.com")
	assert.Equal(t, http.StatusSeeOther, r.status, r.body)

	open, _ := newConsole(t, db)
	assert.Equal(t, http.StatusOK, do(open, httptest.NewRequest(http.MethodGet, "http://anything.example/", nil)).status)
	_, err := console.New(db, console.WithAllowedHosts())
	assert.ErrorContains(t, err, "WithAllowedHosts: give at least one host name")
	_, err = console.New(db, console.WithAllowedHosts("ops.example.com", "http://ops.example.com/"))
	assert.ErrorContains(t, err, `"http://ops.example.com/" is not a host name`)
}

// ?format=json on the list and a target's page answers the same rows as
// JSON, with the same filters and paging; target IDs, holders and
// reasons come as they are (no HTML escaping); errors are JSON too.
func TestJSON_ListAndTargetOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		f := newFixture(t, s, db)
		odd := f.prefix + `<b>&"'`
		require.NoError(t, admin.New(f.repo).Pause(ctx, odd, "<deploy> & \"migrate\""))
		h, _ := newConsole(t, db)
		type list struct {
			Rows []struct {
				Key, TargetID, State, Holder string
				Slot                         int
				Paused                       bool
				PauseReason                  string `json:"pause_reason"`
				Generation                   int64
				TimeoutMS                    *int64 `json:"timeout_ms"`
				ExpiresInMS                  *int64 `json:"expires_in_ms"`
				Failure                      *string
			}
			Next, State, Prefix string
		}
		read := func(target string, v any) response {
			t.Helper()
			r := get(t, h, target)
			assert.Equal(t, "application/json", r.header.Get("Content-Type"), target)
			require.NoError(t, json.Unmarshal([]byte(r.body), v), r.body)
			return r
		}
		var l list
		r := read("/?format=json&prefix="+url.QueryEscape(f.prefix), &l)
		require.Equal(t, http.StatusOK, r.status, r.body)
		var ks []string
		for _, row := range l.Rows {
			ks = append(ks, row.Key)
		}
		assert.Equal(t, keys(get(t, h, "/?prefix="+url.QueryEscape(f.prefix)).body), ks, "the same rows as the page")
		assert.Contains(t, r.body, `"key": "`+f.prefix+`<b>&\"'"`, "HTML-escaped JSON")
		assert.Contains(t, r.body, `"pause_reason": "<deploy> & \"migrate\""`)
		assert.Empty(t, l.Next)

		r = read("/?format=json&state=expired&prefix="+url.QueryEscape(f.prefix), &l)
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Len(t, l.Rows, 1)
		assert.Equal(t, f.expired, l.Rows[0].Key)
		assert.Equal(t, "expired", l.Rows[0].State)
		require.NotNil(t, l.Rows[0].ExpiresInMS)
		assert.Less(t, *l.Rows[0].ExpiresInMS, int64(0))
		assert.Equal(t, int64(60000), *l.Rows[0].TimeoutMS)

		var seen []string
		for next, pages := "", 0; ; pages++ {
			require.Less(t, pages, 10)
			r = read("/?format=json&limit=2&prefix="+url.QueryEscape(f.prefix)+"&after="+url.QueryEscape(next), &l)
			require.Equal(t, http.StatusOK, r.status, r.body)
			for _, row := range l.Rows {
				seen = append(seen, row.Key)
			}
			if next = l.Next; next == "" {
				break
			}
		}
		assert.Equal(t, ks, seen, "pages of two, by the cursor")

		var tv struct {
			TargetID  string `json:"target_id"`
			Row       *struct{ Holder, State, LeaseToken string }
			Slots     []struct{ Slot int }
			HeldSlots int `json:"held_slots"`
			Result    *struct {
				Generation int64
				Size       int
				Data       map[string]string
			}
		}
		r = read("/target?format=json&id="+url.QueryEscape(f.saved), &tv)
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Equal(t, f.saved, tv.TargetID)
		require.NotNil(t, tv.Row)
		assert.Equal(t, "released", tv.Row.State)
		require.NotNil(t, tv.Result)
		assert.Equal(t, map[string]string{"report": "<b>ready</b>"}, tv.Result.Data)
		tv.Result = nil
		r = read("/target?format=json&id="+url.QueryEscape(f.slotted), &tv)
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Nil(t, tv.Row)
		assert.Len(t, tv.Slots, 2)
		assert.Equal(t, 1, tv.HeldSlots)
		assert.Nil(t, tv.Result)

		var e struct {
			Error  string
			Status int
		}
		r = read("/target?format=json&id="+url.QueryEscape(f.prefix+"none"), &e)
		assert.Equal(t, http.StatusNotFound, r.status)
		r = read("/?format=json&state=sleeping", &e)
		assert.Equal(t, http.StatusBadRequest, r.status)
		assert.Equal(t, 400, e.Status)
		assert.Contains(t, e.Error, `state "sleeping"`)
		r = get(t, h, "/?format=xml")
		assert.Equal(t, http.StatusBadRequest, r.status)
		assert.Contains(t, r.body, "give json, or html")
	})
}

// WithIdentity's name is asked only once the authorizer allowed the
// action, and is recorded in the action's log line (operator=); a name
// that cannot be recorded is a 500 that writes nothing.
func TestIdentity_RecordedWithTheActionOnEveryDatabase(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		f := newFixture(t, s, db)
		var asked []string
		identity := console.WithIdentity(func(r *http.Request) string {
			asked = append(asked, r.URL.Path)
			return r.Header.Get("X-User")
		})
		h, logs := newConsole(t, db, identity, console.WithAuthorizer(func(r *http.Request, action, target string) error {
			if r.Header.Get("X-User") == "" {
				return errors.New("log in first")
			}
			return nil
		}))
		same := func(user string) map[string]string {
			return map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin", "X-User": user}
		}
		r := post(h, "pause", f.live, "deploy", same(""))
		require.Equal(t, http.StatusForbidden, r.status, r.body)
		assert.Empty(t, asked, "the identity was asked before the authorizer allowed")

		r = post(h, "pause", f.live, "deploy", same("alice@example.com"))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Regexp(t, `level=INFO msg="console: action done" action=pause remote=\S+ target=\S+live reason=deploy operator=alice@example.com`, logs.String())
		r = post(h, "stop", f.live, "stuck", same("bob"))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Regexp(t, `msg="console: action done" action=stop .* operator=bob`, logs.String())

		before := state(t, f.repo, f.live).Row
		for _, bad := range []string{strings.Repeat("a", 256), "nul\x00"} {
			r = post(h, "release", f.live, "gone", same(bad))
			assert.Equal(t, http.StatusInternalServerError, r.status, r.body)
			assert.Contains(t, r.body, "the operator&#39;s identity cannot be recorded")
		}
		assert.Equal(t, before, state(t, f.repo, f.live).Row, "an action by an unrecordable operator wrote")
		assert.Contains(t, logs.String(), `level=ERROR msg="console: action refused: the identity cannot be recorded"`)
		_, err := console.New(db, console.WithIdentity(nil))
		assert.ErrorContains(t, err, "WithIdentity: fn is nil")
	})
}
