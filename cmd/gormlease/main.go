// Command gormlease is an operator's tool for the lease table of
// github.com/gormlease/gormlease: list and show leases, prune old rows,
// release a lease by force, pause and resume a target, ask a holder to
// stop, create the tables, serve the operator's console.
//
//	gormlease list [-prefix P] [-state live|expired|released] [-after T] [-limit N] [-all] [-json]
//	gormlease show [-json] TARGET
//	gormlease prune -older-than 30d [-keep-results] [-batch N]
//	gormlease release [-yes] [-slot N] TARGET
//	gormlease pause [-yes] -reason R TARGET
//	gormlease resume [-yes] TARGET
//	gormlease stop [-yes] -reason R [-slot N] TARGET
//	gormlease migrate
//	gormlease serve [-addr 127.0.0.1:8080] [-actions]
//
// Flags go before the target. list shows 100 rows a page (-limit, up to
// 10000; -all every page; -after the key of the last row of the previous
// page), with each slot row of a semaphore under its target; show, for a
// semaphore, lists its slots. prune deletes the rows released or expired
// at least -older-than ago (at least 1m), with their results unless
// -keep-results, -batch rows a transaction (up to 10000).
//
// release, pause, resume and stop say what they will do and ask for y on
// stdin, unless -yes. release ends a lease by force, fenced
// (admin.Operator.ForceRelease): on a semaphore (gormlease.WithSlots), every
// slot's lease that is not released, or with -slot N that slot's only
// (admin.Operator.ForceReleaseSlot). pause stops new acquisitions of the
// target and its slots until resume (admin.Operator.Pause, Resume); -reason
// is recorded in the row. stop asks the current holder to stop at its
// next heartbeat (admin.Operator.RequestStop): on a semaphore every slot's
// holder, or with -slot N that slot's (admin.Operator.RequestStopSlot).
// -slot takes a slot's number, from 1 to 100.
//
// Every command takes -dsn (or the GORMLEASE_DSN environment variable):
// postgres://USER@HOST:5432/DB (or postgresql://), PostgreSQL's keyword
// form (host=HOST user=USER dbname=DB), mysql://USER:PASSWORD@tcp(HOST:3306)/DB
// or the driver's own USER:PASSWORD@tcp(HOST:3306)/DB, sqlite:PATH or
// file:PATH for SQLite, or the path of an existing SQLite file; any other
// DSN exits 2 listing these forms, and no file is created for it. Every
// command takes -lease-table and -result-table when the tables have other
// names than job_lease and job_result. The migrate command creates the
// tables (gormlease.AutoMigrate); another command run where they are
// missing says so.
//
// The serve command serves the console of package
// github.com/gormlease/gormlease/console on -addr until interrupted:
// read-only unless -actions is given, and then to anyone who can reach
// the address, so it listens on 127.0.0.1 unless told otherwise. Each
// action is logged to stderr.
//
// It exits 0 on success, 1 on failure and 2 on bad usage.
//
// The command is a module of its own (github.com/gormlease/gormlease/cmd/gormlease),
// as the console is: in the core module, serve would make the core
// require the console's module, which requires the core.
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
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
