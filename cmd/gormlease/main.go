// Command gormlease is an operator's tool for the lease table of
// github.com/gormlease/gormlease: list and show leases, prune old rows,
// release a lease by force.
//
//	gormlease list [-prefix P] [-state live|expired|released] [-after T] [-limit N] [-all] [-json]
//	gormlease show [-json] TARGET
//	gormlease prune -older-than 720h [-keep-results] [-batch N]
//	gormlease release [-yes] TARGET
//
// Every command takes -dsn (or the GORMLEASE_DSN environment variable):
// postgres://USER@HOST:5432/DB, mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or
// file:PATH (or a plain path) for SQLite; and -lease-table and
// -result-table when the tables have other names than job_lease and
// job_result. It does not create the tables: gormlease.AutoMigrate does,
// and a command run where they are missing says so. It exits 0 on
// success, 1 on failure and 2 on bad usage.
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
