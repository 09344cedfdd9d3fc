package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
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
	return serveEnv(t, nil, io.Discard, "127.0.0.1:0", args...)
}

// serveEnv starts the serve command with args on addr, with the
// environment vars and its stderr to stderr, and returns the console's
// URL, on 127.0.0.1 when addr is every interface's; the command is
// stopped, and must exit 0, when t ends.
func serveEnv(t *testing.T, vars map[string]string, stderr io.Writer, addr string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, outW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		defer outW.Close()
		code <- run(ctx, append([]string{"serve", "-addr", addr}, args...), env{
			getenv: func(k string) string { return vars[k] }, stdin: strings.NewReader(""), stdout: outW, stderr: stderr,
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
	if strings.HasPrefix(line, "{") {
		var j serveJSON
		require.NoError(t, json.Unmarshal([]byte(line), &j), line)
		return toLoopback(t, j.URL)
	}
	m := regexp.MustCompile(`serving the console on (http://\S+/) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	return toLoopback(t, m[1])
}

// toLoopback returns u, a URL of every interface's address (0.0.0.0,
// [::]), as 127.0.0.1's.
func toLoopback(t *testing.T, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	if ip := net.ParseIP(parsed.Hostname()); ip != nil && ip.IsUnspecified() {
		parsed.Host = net.JoinHostPort("127.0.0.1", parsed.Port())
	}
	return parsed.String()
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

// syncBuffer is a bytes.Buffer that a command writes while a test reads
// it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serve refuses an address that other machines can reach unless the
// environment gives it an authentication (bearer token, or basic auth's
// user and password), or it is told -trusted-network; an incomplete one,
// or a short token, is bad usage too. Nothing is listened on then.
func TestCommand_ServeRefusesAnOpenAddress(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLite(t).DSN
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want []string
	}{
		{"EveryInterface", nil, []string{"-addr", "0.0.0.0:0"},
			[]string{"-addr 0.0.0.0:0 can be reached from other machines", tokenEnv, userEnv, passwordEnv, "-trusted-network"}},
		{"NoHost", nil, []string{"-addr", ":0"}, []string{"-addr :0 can be reached"}},
		{"IPv6Any", nil, []string{"-addr", "[::]:0"}, []string{"-addr [::]:0 can be reached"}},
		{"AName", nil, []string{"-addr", "ops.example.com:8080"}, []string{"-addr ops.example.com:8080 can be reached"}},
		{"WithActions", nil, []string{"-addr", "0.0.0.0:0", "-actions"}, []string{"and act on it (-actions)"}},
		{"UserWithoutPassword", map[string]string{userEnv: "alice"}, []string{"-addr", "0.0.0.0:0"},
			[]string{"$GORMLEASE_CONSOLE_USER is set but $GORMLEASE_CONSOLE_PASSWORD is not"}},
		{"PasswordWithoutUser", map[string]string{passwordEnv: "secret"}, []string{},
			[]string{"$GORMLEASE_CONSOLE_PASSWORD is set but $GORMLEASE_CONSOLE_USER is not"}},
		{"ShortToken", map[string]string{tokenEnv: "short"}, []string{"-addr", "0.0.0.0:0"},
			[]string{"$GORMLEASE_CONSOLE_TOKEN is 5 bytes long: give at least 16"}},
		{"UserNotRecordable", map[string]string{userEnv: strings.Repeat("u", 256), passwordEnv: "p"}, []string{},
			[]string{"$GORMLEASE_CONSOLE_USER is 256 bytes long: the user is recorded as the operator"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{dsnEnv: dsn}
			for k, v := range tc.vars {
				vars[k] = v
			}
			r := glEnv(t, vars, "", append([]string{"serve"}, tc.args...)...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			for _, want := range tc.want {
				assert.Contains(t, r.stderr, want)
			}
			assert.Empty(t, r.stdout)
		})
	}
}

// With a token or a user and password in the environment, serve asks
// every request for them, pages and actions alike, on any address:
// without them, or with wrong ones, it answers 401 with a
// WWW-Authenticate header for the scheme, and an action writes nothing;
// with them it serves, and logs the operator of each action. With
// -trusted-network it serves every interface without authentication.
func TestCommand_ServeAuthenticates(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	db, names, _ := onTables(t, s, "auth_lease", "auth_result")
	repo, err := gormlease.NewRepository(db, names)
	require.NoError(t, err)
	op := admin.New(repo)
	ctx := context.Background()
	flags := []string{"-dsn", s.DSN, "-lease-table", "auth_lease", "-result-table", "auth_result"}
	const token = "0123456789abcdef0123456789abcdef"
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(base string, auth func(*http.Request)) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base, nil)
		require.NoError(t, err)
		if auth != nil {
			auth(req)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	pause := func(base, target string, auth func(*http.Request)) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"pause",
			strings.NewReader(url.Values{"target": {target}, "reason": {"from the test"}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", strings.TrimSuffix(base, "/"))
		if auth != nil {
			auth(req)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	paused := func(target string) bool {
		row, _, err := op.Get(ctx, target)
		require.NoError(t, err)
		return row.PausedAt != nil
	}
	pausedBy := func(target string) string {
		row, _, err := op.Get(ctx, target)
		require.NoError(t, err)
		return deref(row.PausedBy)
	}
	bearer := func(tok string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	basic := func(user, password string) func(*http.Request) {
		return func(r *http.Request) { r.SetBasicAuth(user, password) }
	}

	t.Run("Token", func(t *testing.T) {
		t.Parallel()
		target := fmt.Sprintf("auth/token/%d", time.Now().UnixNano())
		_, err := repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		logs := &syncBuffer{}
		base := serveEnv(t, map[string]string{tokenEnv: token}, logs, "0.0.0.0:0", append(flags, "-actions")...)

		resp := get(base, nil)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a page without the token")
		assert.Equal(t, []string{`Bearer realm="gormlease console"`}, resp.Header.Values("WWW-Authenticate"))
		assert.Equal(t, http.StatusUnauthorized, get(base, bearer(token+"x")).StatusCode, "a wrong token")
		assert.Equal(t, http.StatusUnauthorized, get(base, basic("token", token)).StatusCode, "the token as a password")
		assert.Equal(t, http.StatusOK, get(base, bearer(token)).StatusCode)

		assert.Equal(t, http.StatusUnauthorized, pause(base, target, nil), "an action without the token")
		assert.Equal(t, http.StatusUnauthorized, pause(base, target, bearer("0123456789abcdef0123456789abcdeF")))
		assert.False(t, paused(target), "an action without the token paused")
		assert.Equal(t, http.StatusSeeOther, pause(base, target, bearer(token)))
		assert.True(t, paused(target))
		assert.Equal(t, "token", pausedBy(target), "the operator recorded in the row")
		assert.Contains(t, logs.String(), "operator=token")
		assert.Contains(t, logs.String(), "authentication failed")
	})

	t.Run("Basic", func(t *testing.T) {
		t.Parallel()
		target := fmt.Sprintf("auth/basic/%d", time.Now().UnixNano())
		_, err := repo.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		logs := &syncBuffer{}
		base := serveEnv(t, map[string]string{userEnv: "alice", passwordEnv: "s3cret pass"}, logs, "0.0.0.0:0",
			append(flags, "-actions")...)

		resp := get(base, nil)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.Equal(t, []string{`Basic realm="gormlease console", charset="UTF-8"`}, resp.Header.Values("WWW-Authenticate"))
		assert.Equal(t, http.StatusUnauthorized, get(base, basic("alice", "s3cret")).StatusCode, "a wrong password")
		assert.Equal(t, http.StatusUnauthorized, get(base, basic("bob", "s3cret pass")).StatusCode, "a wrong user")
		assert.Equal(t, http.StatusOK, get(base, basic("alice", "s3cret pass")).StatusCode)

		assert.Equal(t, http.StatusUnauthorized, pause(base, target, basic("alice", "")))
		assert.False(t, paused(target))
		assert.Equal(t, http.StatusSeeOther, pause(base, target, basic("alice", "s3cret pass")))
		assert.True(t, paused(target))
		assert.Equal(t, "alice", pausedBy(target), "the operator recorded in the row")
		assert.Contains(t, logs.String(), "operator=alice")
	})

	t.Run("LoopbackToo", func(t *testing.T) {
		t.Parallel()
		base := serveEnv(t, map[string]string{tokenEnv: token}, io.Discard, "127.0.0.1:0", append(flags, "-json")...)
		assert.Equal(t, http.StatusUnauthorized, get(base, nil).StatusCode)
		assert.Equal(t, http.StatusOK, get(base, bearer(token)).StatusCode)
	})

	t.Run("TrustedNetwork", func(t *testing.T) {
		t.Parallel()
		logs := &syncBuffer{}
		base := serveEnv(t, nil, logs, "0.0.0.0:0", append(flags, "-trusted-network")...)
		assert.Equal(t, http.StatusOK, get(base, nil).StatusCode)
		assert.Contains(t, logs.String(), "no authentication on an address that other machines can reach")
	})
}

// serve -json writes the address it serves as a JSON object, and logs as
// JSON lines.
func TestCommand_ServeJSON(t *testing.T) {
	t.Parallel()
	s := testdb.SQLite(t)
	_, _, _ = onTables(t, s, "sj_lease", "sj_result")
	ctx, cancel := context.WithCancel(context.Background())
	out, outW := io.Pipe()
	logs := &syncBuffer{}
	code := make(chan int, 1)
	go func() {
		defer outW.Close()
		code <- run(ctx, []string{"serve", "-json", "-addr", "0.0.0.0:0", "-trusted-network", "-dsn", s.DSN,
			"-lease-table", "sj_lease", "-result-table", "sj_result"}, env{
			getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: outW, stderr: logs,
		})
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	cancel()
	go io.Copy(io.Discard, out)
	require.NoError(t, err)
	var j serveJSON
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&j), line)
	assert.Equal(t, "serve", j.Command)
	assert.Regexp(t, `^http://\S+:\d+/$`, j.URL)
	assert.Equal(t, "none", j.Auth)
	assert.True(t, j.TrustedNetwork)
	assert.Equal(t, 0, <-code)
	var logLine map[string]any
	first, _, _ := strings.Cut(logs.String(), "\n")
	require.NoError(t, json.Unmarshal([]byte(first), &logLine), logs.String())
	assert.Equal(t, "WARN", logLine["level"])
}
