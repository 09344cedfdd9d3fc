package console

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// requestTimeout bounds the database statements of one request.
const requestTimeout = 10 * time.Second

// Option configures New.
type Option interface{ apply(*config) }

type option func(*config)

func (o option) apply(c *config) { o(c) }

// config is what the options set.
type config struct {
	tables       gormlease.TableOption
	tablesSet    bool
	authorize    func(r *http.Request, action, targetID string) error
	authorizeSet bool
	logger       *slog.Logger
}

// WithTables names the tables, as gormlease.WithTableNames does for a
// Runner: pass the same option that the application passes to
// gormlease.AutoMigrate and its Runners. Without it the console reads
// job_lease and job_result.
func WithTables(t gormlease.TableOption) Option {
	return option(func(c *config) { c.tables, c.tablesSet = t, true })
}

// WithAuthorizer allows an action (one of "pause", "resume", "stop",
// "release") on a target when fn returns nil; its error is shown to the
// operator, with 403, and nothing is written. fn runs only for requests
// that are same-origin, after the form was read and found valid, so it
// may look at the request's session cookie, headers and form
// (r.FormValue("reason"), and r.FormValue("slot") for a stop or release
// of one slot: targetID is the target's, never a slot row's key).
// Without WithAuthorizer the console is read-only: it shows no action
// buttons, and refuses every action with 403.
func WithAuthorizer(fn func(r *http.Request, action, targetID string) error) Option {
	return option(func(c *config) { c.authorize, c.authorizeSet = fn, true })
}

// WithLogger sets the logger that records each action: what was asked,
// on which target, with which reason, by which remote address, and what
// came of it (Info when done, Warn when refused, Error when the database
// failed). Without it, slog.Default() records them: an operator's action
// is an audit event, not a library's chatter.
func WithLogger(logger *slog.Logger) Option {
	return option(func(c *config) { c.logger = logger })
}

// handler is the console: the http.Handler that New returns.
type handler struct {
	db        *gorm.DB
	op        *admin.Operator
	tables    []gormlease.TableOption
	authorize func(r *http.Request, action, targetID string) error
	logger    *slog.Logger
}

// New returns an http.Handler that shows db's leases to an operator. It serves under any
// path prefix (mount it with http.StripPrefix). Without WithAuthorizer it is read-only:
// every action is refused with 403 and writes nothing.
//
// It serves, under its root: the list of leases (GET /, with the query
// parameters prefix, state, after and limit), a target's page (GET
// /target?id=TARGET) and the actions (POST /pause, /resume, /stop and
// /release, with the form fields target and reason, and for stop and
// release of one slot, slot). New returns an error
// naming the problem when db is nil or an option is unusable (a nil
// WithTables or WithAuthorizer, or table names that
// gormlease.WithTableNames refuses). It opens nothing and writes nothing:
// the tables must exist (gormlease.AutoMigrate).
func New(db *gorm.DB, opts ...Option) (http.Handler, error) {
	if db == nil {
		return nil, errors.New("console: db is nil")
	}
	var c config
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("console: an Option is nil")
		}
		o.apply(&c)
	}
	h := &handler{db: db, authorize: c.authorize, logger: c.logger}
	switch {
	case c.tablesSet && c.tables == nil:
		return nil, errors.New("console: WithTables: the table option is nil")
	case c.authorizeSet && c.authorize == nil:
		return nil, errors.New("console: WithAuthorizer: fn is nil; leave the option out for a read-only console")
	}
	if c.tablesSet {
		h.tables = []gormlease.TableOption{c.tables}
	}
	if h.logger == nil {
		h.logger = slog.Default()
	}
	repoOpts := make([]gormlease.RepositoryOption, len(h.tables))
	for i, t := range h.tables {
		repoOpts[i] = t
	}
	repo, err := gormlease.NewRepository(db, repoOpts...)
	if err != nil {
		return nil, errors.New("console: " + strings.TrimPrefix(err.Error(), "gormlease: "))
	}
	h.op = admin.New(repo)
	return h, nil
}

// ServeHTTP routes r by its path below the console's root.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; p {
	case "":
		// Mounted as StripPrefix("/ops/leases", h) and asked for
		// /ops/leases: the page's relative links need the slash.
		h.toRoot(w, r)
	case "/":
		h.page(w, r, h.listPage)
	case "/target":
		h.page(w, r, h.targetPage)
	default:
		if a := strings.TrimPrefix(p, "/"); isAction(a) {
			h.action(w, r, a)
			return
		}
		h.fail(w, r, http.StatusNotFound, "no such page: the console serves its list (./), target?id=TARGET and the actions pause, resume, stop and release")
	}
}

// toRoot redirects a request for the console's root without its
// trailing slash to the same path with it.
func (h *handler) toRoot(w http.ResponseWriter, r *http.Request) {
	path := r.RequestURI
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	last := path[strings.LastIndex(path, "/")+1:]
	if last == "" {
		last = "."
	}
	target := last + "/"
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusMovedPermanently)
}

// page serves a page with GET or HEAD, and refuses other methods.
func (h *handler) page(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request)) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		h.fail(w, r, http.StatusMethodNotAllowed, "this page is read with GET; the actions are POSTs to pause, resume, stop and release")
		return
	}
	serve(w, r)
}

// dbContext is r's context with the timeout of the console's statements.
func dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), requestTimeout)
}
