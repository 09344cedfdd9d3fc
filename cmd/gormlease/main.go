// Command gormlease is an operator's tool for the lease table of
// github.com/gormlease/gormlease: list and show leases, show a target's
// history, prune old rows and events,
// release a lease by force, pause and resume a target, ask a holder to
// stop and wait until it has, create the tables, serve the operator's
// console. It is made for scripts as well as people: each outcome has an
// exit code of its own, and -json writes it as JSON.
//
//	gormlease list [-prefix P] [-state live|expired|released|paused] [-holder H] [-order key|age|held|expiry] [-after CURSOR] [-limit N] [-all] [-json]
//	gormlease show [-json] TARGET
//	gormlease history [-slot N] [-limit N] [-before SEQ] [-json] TARGET
//	gormlease prune -older-than 30d [-keep-events N] [-keep-results] [-batch N] [-dry-run] [-json]
//	gormlease release [-yes] [-json] [-as NAME] [-slot N] TARGET
//	gormlease pause [-yes] [-json] [-as NAME] [-new] -reason R TARGET
//	gormlease resume [-yes] [-json] [-as NAME] TARGET
//	gormlease stop [-yes] [-json] [-as NAME] -reason R [-slot N] [-wait [-timeout 2m]] TARGET
//	gormlease migrate [-history] [-json]
//	gormlease serve [-addr 127.0.0.1:8080] [-actions] [-trusted-network] [-json]
//
// Flags go before the target, or after it. list shows 100 rows a page (-limit, up to
// 10000; -all every page; -after the cursor of the last row of the
// previous page, which -json writes and which is its target when by key),
// with each slot row of a semaphore under its target. It keeps the rows
// of a -state (paused: the paused targets' rows, whatever their lease's
// state) and of a -holder, in the -order asked: by key (the default), by
// age (the longest silent first), by the time held (the longest held
// first) or by expiry (the soonest to expire first, the expired first);
// the database filters and sorts (admin.ListOptions). show, for a
// semaphore, lists its slots. Both say how long each lease has been held
// (since the acquisition that the row records), and who paused the target
// and who asked its holder to stop. prune deletes the rows released or
// expired at least -older-than ago (at least 1m), with their results
// unless -keep-results, -batch rows a transaction (up to 10000); where the
// table keeps history, then the events older than that, and with
// -keep-events N those of each target beyond its N newest, -batch events a
// batch; with -dry-run it counts them and deletes nothing.
//
// history shows the events of a target's row (admin.Operator.History),
// newest first, 100 a page (-limit, up to 1000; -before the seq of the
// previous page's last event), or with -slot N of that slot's row: each
// acquisition (how: new, released, expired or seized, from which
// generation), save, end of a generation (the cause, how long it was
// held, the failure), and operator's action (pause, resume, stop request,
// forced release: who, and, for a pause or a stop request, why). It needs a table that keeps history
// (migrate -history, or gormlease.AutoMigrate with gormlease.WithHistory);
// on another it fails, saying how to turn it on. A target without events
// and without a lease row exits 3; one with a lease row but no event
// (none since the history began, or pruned) says so and exits 0.
//
// release, pause, resume and stop say what they will do and ask for y on
// stdin, unless -yes. release ends a lease by force, fenced
// (admin.Operator.ForceRelease): on a semaphore (gormlease.WithSlots), every
// slot's lease that is not released, or with -slot N that slot's only
// (admin.Operator.ForceReleaseSlot). pause stops new acquisitions of the
// target and its slots until resume (admin.Operator.Pause, Resume); -reason
// is recorded in the row. A target that has no row (never acquired, or
// pruned: a typo, often) is paused only with -new, which makes its row.
// stop asks the current holder to stop at its next heartbeat
// (admin.Operator.RequestStop): on a semaphore every slot's holder, or
// with -slot N that slot's (admin.Operator.RequestStopSlot). With -wait,
// stop then reads the rows every 200 ms until each holder asked has
// stopped: its lease released, or taken over by a later generation (or its
// work ended under a minimum hold); -timeout (default 2m) bounds the wait.
// -slot takes a slot's number, from 1 to 100.
//
// Each of these four acts as an operator (admin.Operator.As): -as NAME, or
// else the environment variable GORMLEASE_OPERATOR, or else USER@HOST of
// the process (the user's name and the host's without its domain), 1 to
// 255 bytes of UTF-8, which -json writes as "operator". pause records it
// in the row's paused_by, stop in its stop_by, release in the failure it
// writes ("released by force by operator NAME"); resume records it
// nowhere, as it clears the pause and who made it. list and show say who
// paused and who asked to stop.
//
// With -json, every command writes its outcome on stdout as JSON, and
// nothing else there: list and show an object a row (a line each),
// history an object an event (a line each), the others one object, with "command" naming the command. Errors still go
// to stderr, with the exit code, and stdout then stays empty, except
// where something was done: prune says what it deleted before it failed,
// and stop -wait what it saw when -timeout passed. A command that would
// ask needs -yes with -json: no question comes in the middle of JSON.
//
// Every command takes -dsn (or the GORMLEASE_DSN environment variable):
// postgres://USER@HOST:5432/DB (or postgresql://), PostgreSQL's keyword
// form (host=HOST user=USER dbname=DB), mysql://USER:PASSWORD@tcp(HOST:3306)/DB
// or the driver's own USER:PASSWORD@tcp(HOST:3306)/DB, sqlite:PATH or
// file:PATH for SQLite, or the path of an existing SQLite file; any other
// DSN exits 2 listing these forms, and no file is created for it. Every
// command takes -lease-table and -result-table when the tables have other
// names than job_lease and job_result. The migrate command creates the
// tables (gormlease.AutoMigrate); with -history also the event table and
// the triggers that keep each target's history (gormlease.WithHistory);
// without it, a history kept stays. Another command run where the tables
// are missing says so.
//
// The serve command serves the console of package
// github.com/gormlease/gormlease/console on -addr until interrupted
// (SIGINT or SIGTERM): read-only unless -actions is given. On 127.0.0.1 (the default),
// localhost or [::1] it answers only requests addressed to this machine
// (console.WithAllowedHosts, against DNS rebinding). Another address, which other machines can reach, needs
// an authentication from the environment, never from the command line:
// GORMLEASE_CONSOLE_TOKEN, a bearer token of 16 bytes or more that each
// request sends as "Authorization: Bearer TOKEN", or
// GORMLEASE_CONSOLE_USER and GORMLEASE_CONSOLE_PASSWORD, for basic auth,
// which a browser asks for; or -trusted-network, to serve everyone who
// can reach it. With an authentication set, every request needs it,
// pages and actions, on any address: another gets 401 with a
// WWW-Authenticate header. Each action is logged to stderr; with an
// authentication set, its operator, the basic-auth user or "token", is
// recorded with it in the rows and the log (console.WithIdentity), and
// without one no operator is (-as and GORMLEASE_OPERATOR are not serve's).
//
// Exit codes:
//
//	0  done (stop -wait: the holder has stopped)
//	1  failed: the database, the tables, or another error
//	2  bad usage: a flag, an argument or the DSN; nothing was done
//	3  no such target: the target (or slot) has no lease row, never acquired or pruned
//	   (show, history when it has no event either, release, pause without -new, resume, stop)
//	4  nothing to do: the lease is released already (release, stop), or the target
//	   is not paused (resume); nothing changed
//	5  not confirmed: the answer at the prompt was not y; nothing changed
//	6  timed out: stop -wait's -timeout passed before the holder stopped; the request stays
//
// The command is a module of its own (github.com/gormlease/gormlease/cmd/gormlease),
// as the console is: in the core module, serve would make the core
// require the console's module, which requires the core.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env{
		getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		terminal: isTerminal(os.Stderr),
	})
	stop()
	os.Exit(code)
}

// isTerminal reports whether f is a terminal, where prune shows its
// progress.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
