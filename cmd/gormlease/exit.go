package main

import "fmt"

// The exit codes, one per outcome that a script tells apart: the package
// doc, the usage text and docs/operating.md list them.
const (
	// exitOK: the command did what it was asked (stop -wait: the holder
	// stopped).
	exitOK = 0
	// exitFailure: the database, the tables, or another error.
	exitFailure = 1
	// exitUsage: a flag, an argument or the DSN is wrong; nothing was done.
	exitUsage = 2
	// exitNoTarget: the target (or the slot) has no lease row: it was
	// never acquired, or its row was pruned.
	exitNoTarget = 3
	// exitNothingToDo: the target has rows, but nothing to act on: its
	// leases are released already (release, stop), or it is not paused
	// (resume).
	exitNothingToDo = 4
	// exitNotConfirmed: the answer at the prompt was not y; nothing
	// changed.
	exitNotConfirmed = 5
	// exitTimedOut: stop -wait's -timeout passed before the holder
	// stopped; the request stays.
	exitTimedOut = 6
)

// exitCodes is the list of the exit codes in the usage text and each
// command's -h.
const exitCodes = `exit codes:
  0  done (stop -wait: the holder has stopped)
  1  failed: the database, the tables, or another error
  2  bad usage: a flag, an argument or the DSN; nothing was done
  3  no such target: the target (or slot) has no lease row, never acquired or pruned
     (show, history when it has no event either, release, pause without -new, resume, stop)
  4  nothing to do: the lease is released already (release, stop), or the target
     is not paused (resume); nothing changed
  5  not confirmed: the answer at the prompt was not y; nothing changed
  6  timed out: stop -wait's -timeout passed before the holder stopped; the request stays
`

// exitError is an error that ends the command with its own exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// exitf returns an error that ends the command with code.
func exitf(code int, format string, args ...any) error {
	return &exitError{code, fmt.Sprintf(format, args...)}
}

// usagef returns an error in how the command was called: exit code 2.
func usagef(format string, args ...any) error { return exitf(exitUsage, format, args...) }
