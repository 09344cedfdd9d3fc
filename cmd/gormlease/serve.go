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
	c.flags.StringVar(&c.addr, "addr", defaultServeAddr, "the address to listen on, host:port")
	c.flags.BoolVar(&c.actions, "actions", false,
		"allow pause, resume, stop and release from the pages: to anyone who can reach -addr (default read-only)")
}

// serveCmd serves the console (package console) on c.addr until ctx ends:
// read-only unless -actions. Each action is logged to stderr.
func serveCmd(ctx context.Context, c *command) error {
	// Reading a row first says now, not on the first page, when the
	// tables are missing or old.
	if _, err := c.op.List(ctx, admin.ListOptions{Limit: 1}); err != nil {
		return invalid(err)
	}
	lease, result := c.repo.Tables()
	opts := []console.Option{
		console.WithTables(gormlease.WithTableNames(lease, result)),
		console.WithLogger(slog.New(slog.NewTextHandler(c.env.stderr, nil))),
	}
	mode := "read-only (-actions allows pause, resume, stop and release)"
	if c.actions {
		// The command has no users to tell apart: whoever reaches the
		// address may act, from the console's own pages.
		opts = append(opts, console.WithAuthorizer(func(*http.Request, string, string) error { return nil }))
		mode = "actions allowed to anyone who can reach this address"
	}
	h, err := console.New(c.db, opts...)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return usagef("-addr %s: %v", c.addr, err)
	}
	host, _, _ := net.SplitHostPort(c.addr)
	switch {
	case isLoopback(host):
		h = loopbackHostsOnly(h)
	case c.actions:
		fmt.Fprintf(c.env.stderr, "gormlease serve: warning: -actions on %s, which is not this machine only: "+
			"put the console behind your own authentication (see docs/operating.md)\n", c.addr)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.env.stdout, "serving the console on http://%s/ (%s); interrupt to stop\n", ln.Addr(), mode)
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

// loopbackHostsOnly serves, on a loopback address, only the requests whose
// Host names this machine (localhost, 127.0.0.1, [::1]): a page of another
// site whose name an attacker re-resolved to 127.0.0.1 (DNS rebinding) is
// same-origin to the browser, but sends its own name as the Host, and is
// answered 421, so that it can neither read the pages nor act.
func loopbackHostsOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if !isLoopback(strings.Trim(host, "[]")) {
			http.Error(w, "this console serves localhost only: open it as http://localhost or http://127.0.0.1", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isLoopback reports whether host names this machine only.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
