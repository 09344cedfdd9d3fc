package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/console"
)

// defaultServeAddr is where serve listens without -addr: this machine
// only.
const defaultServeAddr = "127.0.0.1:8080"

// serveShutdown bounds how long serve waits, once interrupted, for the
// requests in flight.
const serveShutdown = 5 * time.Second

// serveFlags adds serve's flags to c.
func (c *command) serveFlags() {
	c.flags.StringVar(&c.addr, "addr", defaultServeAddr, "the address to listen on, host:port; "+
		"another than this machine's (127.0.0.1, localhost, [::1]) needs $"+tokenEnv+" or $"+userEnv+
		" and $"+passwordEnv+", or -trusted-network")
	c.flags.BoolVar(&c.actions, "actions", false,
		"allow pause, resume, stop and release from the pages: to anyone who may see them (default read-only)")
	c.flags.BoolVar(&c.trustedNetwork, "trusted-network", false,
		"serve an -addr that other machines can reach without authentication: every one of them may see the leases (and act, with -actions)")
}

// checkServe reads serve's authentication from the environment, and
// returns a usage error when it is incomplete, or when -addr can be
// reached from other machines and there is none and no -trusted-network.
func (c *command) checkServe() error {
	a, err := authFromEnv(c.env.getenv)
	if err != nil {
		return err
	}
	c.auth = a
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return usagef("-addr %s: %v: give host:port, e.g. 127.0.0.1:8080", c.addr, err)
	}
	if !isLoopback(host) && !a.set() && !c.trustedNetwork {
		may := "see every lease"
		if c.actions {
			may += " and act on it (-actions)"
		}
		return usagef("-addr %s can be reached from other machines, and the console has no authentication: "+
			"set %s (a bearer token, for scripts and proxies) or %s and %s (basic auth, for a browser) in the environment, "+
			"or give -trusted-network if everyone who can reach %s may %s", c.addr, tokenEnv, userEnv, passwordEnv, c.addr, may)
	}
	return nil
}

// serveJSON is what serve -json writes on stdout once it listens.
type serveJSON struct {
	Command string `json:"command"`
	// URL is the console's address.
	URL string `json:"url"`
	// Actions is -actions.
	Actions bool `json:"actions"`
	// Auth is the authentication asked of every request: "token",
	// "basic", "token and basic", or "none".
	Auth string `json:"auth"`
	// TrustedNetwork is -trusted-network.
	TrustedNetwork bool `json:"trusted_network"`
}

// serveCmd serves the console (package console) on c.addr until ctx ends:
// read-only unless -actions, and to those who authenticate when the
// environment sets a token or a user and password. Each action is logged
// to stderr.
func serveCmd(ctx context.Context, c *command) error {
	// Reading a row first says now, not on the first page, when the
	// tables are missing or old.
	if _, err := c.op.List(ctx, admin.ListOptions{Limit: 1}); err != nil {
		return invalid(err)
	}
	var logger *slog.Logger
	if c.json {
		logger = slog.New(slog.NewJSONHandler(c.env.stderr, nil))
	} else {
		logger = slog.New(slog.NewTextHandler(c.env.stderr, nil))
	}
	lease, result := c.repo.Tables()
	opts := []console.Option{
		console.WithTables(gormlease.WithTableNames(lease, result)),
		console.WithLogger(logger),
	}
	mode := "read-only (-actions allows pause, resume, stop and release)"
	if c.actions {
		// The command has no users to tell apart: whoever may see the
		// pages may act, from the console's own pages.
		opts = append(opts, console.WithAuthorizer(func(*http.Request, string, string) error { return nil }))
		mode = "actions allowed to anyone who may see the pages"
	}
	if c.auth.set() {
		// The console records who acted, in the rows and its log.
		opts = append(opts, console.WithIdentity(func(r *http.Request) string {
			id, _, _ := c.auth.identify(r)
			return id
		}))
	}
	host, _, _ := net.SplitHostPort(c.addr)
	if isLoopback(host) {
		// A page of another site whose name an attacker re-resolved to
		// this address (DNS rebinding) is same-origin to the browser, but
		// sends its own name as the Host: it gets 421, reads nothing and
		// does nothing.
		opts = append(opts, console.WithAllowedHosts("localhost", "127.0.0.1", "::1", host))
	} else if !c.auth.set() {
		logger.Warn("gormlease serve: no authentication on an address that other machines can reach (-trusted-network)",
			"addr", c.addr, "actions", c.actions)
	}
	h, err := console.New(c.db, opts...)
	if err != nil {
		return err
	}
	if c.auth.set() {
		h = c.auth.require(h, logger)
		mode += ", to those who authenticate (" + c.auth.kinds() + ")"
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return usagef("-addr %s: %v", c.addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	url := fmt.Sprintf("http://%s/", ln.Addr())
	if c.json {
		err = c.writeJSON(serveJSON{Command: "serve", URL: url, Actions: c.actions, Auth: c.auth.kinds(), TrustedNetwork: c.trustedNetwork})
	} else {
		_, err = fmt.Fprintf(c.env.stdout, "serving the console on %s (%s); interrupt to stop\n", url, mode)
	}
	if err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serveShutdown)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = serveErr
	}
	return err
}

// isLoopback reports whether host names this machine only: "" (every
// interface) does not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
