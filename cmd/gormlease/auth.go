package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"
)

// The environment variables that give serve its authentication. They
// are never flags: a command line is visible to every user of the
// machine (ps), and kept in shell histories.
const (
	// tokenEnv is a bearer token: a request sends
	// "Authorization: Bearer TOKEN".
	tokenEnv = "GORMLEASE_CONSOLE_TOKEN"
	// userEnv and passwordEnv are the user and password of basic auth,
	// which a browser asks for.
	userEnv     = "GORMLEASE_CONSOLE_USER"
	passwordEnv = "GORMLEASE_CONSOLE_PASSWORD"
)

// minTokenLength is the shortest bearer token, in bytes: 16 random bytes
// in hex are 32.
const minTokenLength = 16

// tokenIdentity is the operator's identity of a request that presented
// the bearer token: the token names no one.
const tokenIdentity = "token"

// auth is what serve asks of every request: a bearer token, basic auth,
// either, or nothing. It keeps the SHA-256 of each secret, so that every
// comparison is of 32 bytes, in constant time.
type auth struct {
	token          *[sha256.Size]byte
	user, password *[sha256.Size]byte
	// userName is the basic-auth user, the identity of its requests.
	userName string
}

// authFromEnv reads serve's authentication from the environment: a usage
// error when it is incomplete (a user without a password, or the
// reverse) or the token is short.
func authFromEnv(getenv func(string) string) (auth, error) {
	var a auth
	token, user, password := getenv(tokenEnv), getenv(userEnv), getenv(passwordEnv)
	if token != "" {
		if len(token) < minTokenLength {
			return auth{}, usagef("$%s is %d bytes long: give at least %d, e.g. the output of openssl rand -hex 16",
				tokenEnv, len(token), minTokenLength)
		}
		a.token = hash(token)
	}
	switch {
	case user != "" && password == "":
		return auth{}, usagef("$%s is set but $%s is not: basic auth needs both", userEnv, passwordEnv)
	case user == "" && password != "":
		return auth{}, usagef("$%s is set but $%s is not: basic auth needs both", passwordEnv, userEnv)
	case strings.Contains(user, ":"):
		return auth{}, usagef("$%s has a colon, which basic auth cannot carry in a user name", userEnv)
	case user != "" && checkOperator(user) != "":
		return auth{}, usagef("$%s %s: the user is recorded as the operator of each action: give 1 to %d bytes of UTF-8 without NUL",
			userEnv, checkOperator(user), maxOperatorLength)
	case user != "":
		a.user, a.password, a.userName = hash(user), hash(password), user
	}
	return a, nil
}

func hash(s string) *[sha256.Size]byte {
	h := sha256.Sum256([]byte(s))
	return &h
}

// set reports whether a asks anything of a request.
func (a auth) set() bool { return a.token != nil || a.user != nil }

// kinds names what a asks: "token", "basic", "token and basic" or "none".
func (a auth) kinds() string {
	switch {
	case a.token != nil && a.user != nil:
		return "token and basic"
	case a.token != nil:
		return tokenIdentity
	case a.user != nil:
		return "basic"
	}
	return "none"
}

// identify returns the operator's identity of r, "token" or the basic
// user, and whether r authenticates; given reports whether r sent
// credentials at all.
func (a auth) identify(r *http.Request) (identity string, ok, given bool) {
	if a.token != nil {
		if scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
			given = true
			if subtle.ConstantTimeCompare(hash(strings.TrimSpace(token))[:], a.token[:]) == 1 {
				return tokenIdentity, true, true
			}
		}
	}
	if a.user != nil {
		if user, password, found := r.BasicAuth(); found {
			given = true
			// Both compared, whichever differs.
			u := subtle.ConstantTimeCompare(hash(user)[:], a.user[:])
			p := subtle.ConstantTimeCompare(hash(password)[:], a.password[:])
			if u&p == 1 {
				return a.userName, true, true
			}
		}
	}
	return "", false, given
}

// require serves h to the requests that authenticate, pages and actions
// alike, and answers the others 401, with a WWW-Authenticate header for
// each scheme that a accepts. Credentials given and wrong are logged as a
// warning. (The console logs each action with its operator, which
// console.WithIdentity gives it.)
func (a auth) require(h http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok, given := a.identify(r); !ok {
			if given {
				logger.Warn("gormlease serve: authentication failed", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			}
			if a.user != nil {
				w.Header().Add("WWW-Authenticate", `Basic realm="gormlease console", charset="UTF-8"`)
			}
			if a.token != nil {
				w.Header().Add("WWW-Authenticate", `Bearer realm="gormlease console"`)
			}
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
