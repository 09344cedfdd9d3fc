package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	identity     func(r *http.Request) string
	identitySet  bool
	hosts        []string
	hostsSet     bool
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

// WithIdentity names the operator of a request: fn returns who is acting
// (the application's session user, the basic-auth user, a header its
// proxy sets). The console asks it only for an action that the authorizer
// (WithAuthorizer) has allowed, and records the name with the action: in
// the target's rows, through admin.Operator.As (who paused, who asked to
// stop, who released by force), and in the action's log line, as the
// attribute operator. A name must be 1 to 255 bytes of UTF-8 without a NUL
// byte: any other is refused with 500 and the action writes nothing. ""
// records no identity, as without the option.
func WithIdentity(fn func(r *http.Request) string) Option {
	return option(func(c *config) { c.identity, c.identitySet = fn, true })
}

// WithAllowedHosts serves only the requests whose Host header names one
// of hosts (compared without the port, ignoring case; an IPv6 address with
// or without its brackets): any other gets 421 Misdirected Request and
// nothing is read or written. It is the defence against DNS rebinding,
// where a page of another site, whose name an attacker re-resolved to the
// console's address, is same-origin to the browser and would pass the
// actions' origin check. Without it, every Host is served, and the
// application's own checks (its authentication, its server's Host
// routing) are the only defence.
func WithAllowedHosts(hosts ...string) Option {
	return option(func(c *config) { c.hosts, c.hostsSet = hosts, true })
}

// WithLogger sets the logger that records each action: what was asked,
// on which target, with which reason, by which remote address and
// operator (WithIdentity), and what came of it (Info when done, Warn when
// refused, Error when the database failed or WithIdentity's name cannot be
// recorded). Without it, slog.Default()
// records them: an operator's action is an audit event, not a library's
// chatter.
func WithLogger(logger *slog.Logger) Option {
	return option(func(c *config) { c.logger = logger })
}

// handler is the console: the http.Handler that New returns.
type handler struct {
	db        *gorm.DB
	op        *admin.Operator
	tables    []gormlease.TableOption
	authorize func(r *http.Request, action, targetID string) error
	identity  func(r *http.Request) string
	// hosts are the allowed Host names, lower case and without brackets;
	// nil serves every Host.
	hosts  map[string]bool
	logger *slog.Logger
}

// New returns an http.Handler that shows db's leases to an operator. It serves under any
// path prefix (mount it with http.StripPrefix). Without WithAuthorizer it is read-only:
// every action is refused with 403 and writes nothing.
//
// It serves, under its root: the list of leases (GET /, with the query
// parameters prefix, state, holder, order, after and limit), a target's
// page (GET /target?id=TARGET), both also as JSON (format=json), and the
// actions (POST /pause, /resume, /stop and /release, with the form fields
// target and reason, for stop and release of one slot, slot, and confirm=1
// to skip the confirmation that stop, release and a pause that creates a
// row ask for): see the package doc. New returns an error naming the
// problem when db is nil or an option is unusable (a nil WithTables,
// WithAuthorizer or WithIdentity, no host or a malformed one for
// WithAllowedHosts, or table names that gormlease.WithTableNames refuses).
// It opens nothing and writes nothing: the tables must exist
// (gormlease.AutoMigrate).
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
	h := &handler{db: db, authorize: c.authorize, identity: c.identity, logger: c.logger}
	switch {
	case c.tablesSet && c.tables == nil:
		return nil, errors.New("console: WithTables: the table option is nil")
	case c.authorizeSet && c.authorize == nil:
		return nil, errors.New("console: WithAuthorizer: fn is nil; leave the option out for a read-only console")
	case c.identitySet && c.identity == nil:
		return nil, errors.New("console: WithIdentity: fn is nil; leave the option out to record no identity")
	}
	if c.hostsSet {
		hosts, err := allowedHosts(c.hosts)
		if err != nil {
			return nil, err
		}
		h.hosts = hosts
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
	if h.hosts != nil && !h.hosts[hostName(r.Host)] {
		h.logger.Warn("console: request for another host refused", "host", r.Host, "remote", r.RemoteAddr)
		h.fail(w, r, http.StatusMisdirectedRequest, fmt.Sprintf("this console does not serve the host %q: open it by one of its own names", r.Host))
		return
	}
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
	if problem := checkFormat(r); problem != "" {
		h.fail(w, r, http.StatusBadRequest, problem)
		return
	}
	serve(w, r)
}

// allowedHosts checks WithAllowedHosts's hosts and returns them as the
// set that hostName's results are looked up in.
func allowedHosts(hosts []string) (map[string]bool, error) {
	if len(hosts) == 0 {
		return nil, errors.New("console: WithAllowedHosts: give at least one host name")
	}
	set := make(map[string]bool, len(hosts))
	for _, host := range hosts {
		name := hostName(host)
		if name == "" || strings.ContainsAny(host, "/ @?#\\") {
			return nil, fmt.Errorf("console: WithAllowedHosts: %q is not a host name (give names such as ops.example.com or 127.0.0.1)", host)
		}
		set[name] = true
	}
	return set, nil
}

// hostName is host (a Host header, or a name given to WithAllowedHosts)
// without its port and IPv6 brackets, in lower case.
func hostName(host string) string {
	if name, _, err := net.SplitHostPort(host); err == nil {
		host = name
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
}

// dbContext is r's context with the timeout of the console's statements.
func dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), requestTimeout)
}
