// Package admin is for operators and their tools (the console, the
// gormlease command, scripts, dashboards): it lists, reads, pauses,
// resumes, stops, releases by force and prunes the lease rows that
// gormlease's Runners, Electors and Repositories work on, and reports the
// library's own load in the process.
//
// An Operator works on the tables of the gormlease.Repository it is made
// from, through that Repository's pool, with the same argument checks and
// errors as the Repository's own steps: an error about bad input wraps
// gormlease.ErrInvalidArgument and writes nothing, and a stop request or a
// forced release on a target that has no lease to act on returns an error
// wrapping gormlease.ErrNoLiveLease (a pause creates the row it needs, and
// a resume of a target not paused is no error). Every action is recorded in
// the target's rows, where the holders' acquires and heartbeats already
// look, so it reaches holders in every process (see docs/operating.md, and
// docs/design.md for the statements on each database).
package admin

import (
	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/ops"
)

// Operator acts on the lease rows of one Repository's tables, for an
// operator. It is safe for concurrent use, holds no connection between
// calls, runs no goroutine and needs no closing.
type Operator struct {
	repo ops.Repository
	ok   bool // repo was made from a Repository
	// name is the operator that As named, recorded with each action ("":
	// none); badName is why As refused it.
	name    string
	badName error
}

// New returns an Operator on repo's tables and pool: a Repository from
// gormlease.NewRepository (with WithTableNames when the tables are not the
// default ones), or a Runner's or an Elector's (Runner.Repository). It
// writes nothing. With a nil repo, every method of the Operator returns an
// error wrapping gormlease.ErrInvalidArgument (Waiters a zero WaitStats,
// Listening false).
func New(repo *gormlease.Repository) *Operator {
	parts, ok := ops.Parts(repo)
	return &Operator{repo: parts, ok: ok}
}

// maxOperatorLength is the longest operator name that As accepts, in
// bytes: the paused_by and stop_by columns hold 255.
const maxOperatorLength = 255

// As returns an Operator on the same Repository that records name as the
// operator of its actions: Pause records it in the rows' paused_by
// (gormlease.JobLease.PausedBy, LeaseInfo.PausedBy) and Resume replaces
// it with its own as it clears the pause (LeaseInfo.PausedBy is empty once
// the row is not paused); RequestStop and RequestStopSlot record it in
// stop_by (JobLease.StopBy, LeaseInfo.StopBy); ForceRelease and
// ForceReleaseSlot record it in ended_by (JobLease.EndedBy) and write the
// failure "released by force by operator NAME" (cut to the 255 bytes that
// the column holds) instead of "released by force by an operator". The
// history (gormlease.WithHistory) carries these names as its events'
// operators. An Operator made by New records no name (NULL), and o itself
// is unchanged. name must be 1 to 255 bytes of valid UTF-8 without NUL:
// otherwise every method of the returned Operator returns an error
// wrapping gormlease.ErrInvalidArgument and writes nothing (Waiters a zero
// WaitStats, Listening false). It writes nothing itself.
func (o *Operator) As(name string) *Operator {
	as := &Operator{}
	if o != nil {
		*as = *o
	}
	as.name, as.badName = name, nil
	if problem := ops.CheckText(name, maxOperatorLength); problem != "" {
		as.badName = ops.Invalidf("admin: operator name %q %s", ops.TruncateUTF8(name, 40), problem)
	}
	return as
}

// parts returns the Repository that o operates on, or an error wrapping
// gormlease.ErrInvalidArgument when it has none, or its operator's name
// was refused.
func (o *Operator) parts() (ops.Repository, error) {
	switch {
	case o == nil || !o.ok:
		return ops.Repository{}, ops.Invalidf("admin: the Operator has no Repository: make it with admin.New(repo)")
	case o.badName != nil:
		return ops.Repository{}, o.badName
	}
	return o.repo, nil
}
