package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// serve starts the serve command with args on a free port and returns the
// console's URL; the command is stopped, and must exit 0, when t ends.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, outW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		defer outW.Close()
		code <- run(ctx, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...), env{
			getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: outW, stderr: io.Discard,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			assert.Equal(t, 0, c, "serve's exit code")
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30 s of the interrupt")
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "serve exited before it served")
	go io.Copy(io.Discard, out) // the rest of its output, until it exits
	m := regexp.MustCompile(`serving the console on (http://\S+/) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	return m[1]
}

// serve serves the console on every database, through tables of other
// names: read-only without -actions (a pause from its own origin is a
// 403), and with -actions a pause from its own origin pauses the target.
func TestCommand_ServeTheConsole(t *testing.T) {
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			ctx := context.Background()
			db := s.DB(t)
			names := gormlease.WithTableNames("serve_lease", "serve_result")
			require.NoError(t, gormlease.AutoMigrate(ctx, db, names))
			repo, err := gormlease.NewRepository(db, names)
			require.NoError(t, err)
			target := "serve/" + s.Name + "/" + time.Now().Format("150405.000000000")
			_, err = repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			flags := []string{"-dsn", s.DSN, "-lease-table", "serve_lease", "-result-table", "serve_result"}
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			pause := func(base string) int {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, base+"pause",
					strings.NewReader(url.Values{"target": {target}, "reason": {"from the test"}}.Encode()))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Origin", strings.TrimSuffix(base, "/"))
				resp, err := client.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				return resp.StatusCode
			}
			paused := func() bool {
				page, err := admin.New(repo).List(ctx, admin.ListOptions{Prefix: target, Limit: 1})
				require.NoError(t, err)
				require.Len(t, page, 1)
				return page[0].Paused
			}

			base := serve(t, flags...)
			resp, err := http.Get(base + "?prefix=" + url.QueryEscape(target))
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			assert.Contains(t, string(body), target)
			assert.Contains(t, string(body), "read-only")
			assert.Equal(t, http.StatusForbidden, pause(base), "read-only without -actions")
			assert.False(t, paused())

			base = serve(t, append(flags, "-actions")...)
			// A page of another name that resolves to 127.0.0.1 (DNS
			// rebinding) is same-origin to the browser: its Host and
			// Origin are its own name. It reads nothing, and pauses nothing.
			rebound := strings.Replace(base, "127.0.0.1", "attacker.example", 1)
			req, err := http.NewRequest(http.MethodGet, base, nil)
			require.NoError(t, err)
			req.Host = strings.TrimSuffix(strings.TrimPrefix(rebound, "http://"), "/")
			resp, err = client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "a page read through another name")
			req, err = http.NewRequest(http.MethodPost, base+"pause",
				strings.NewReader(url.Values{"target": {target}, "reason": {"rebound"}}.Encode()))
			require.NoError(t, err)
			req.Host = strings.TrimSuffix(strings.TrimPrefix(rebound, "http://"), "/")
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", strings.TrimSuffix(rebound, "/"))
			resp, err = client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "a pause through another name")
			assert.False(t, paused())

			assert.Equal(t, http.StatusSeeOther, pause(base))
			assert.True(t, paused())
		})
	}
}

// serve on tables that do not exist says so before it serves, and a bad
// -addr is bad usage.
func TestCommand_ServeRefusesWhatItCannotServe(t *testing.T) {
	s := testdb.SQLite(t)
	r := gl(t, "", "", "serve", "-dsn", s.EmptyDSN(t), "-addr", "127.0.0.1:0")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "gormlease migrate")
	r = gl(t, "", "", "serve", "-dsn", s.DSN, "-addr", "nowhere:port")
	assert.Equal(t, 2, r.code, r.stderr)
	assert.Contains(t, r.stderr, "-addr nowhere:port")
}
