// Package ops is the bridge from package gormlease to package admin, which
// operates on the rows of a *gormlease.Repository: admin runs its
// statements on the parts of the Repository that gormlease hands over
// here, and checks its arguments and words its errors with gormlease's own
// helpers, so that an operator's errors read and match as an
// application's do (ErrInvalidArgument, the "gormlease: " prefix once).
//
// Package gormlease sets every variable in its init, before any package
// that imports it runs; admin only reads them. Nothing else uses this
// package.
package ops

import (
	"context"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/wait"
)

// Repository is what an operator's steps need of a *gormlease.Repository.
type Repository struct {
	// DB is the pool that the Repository's own statements run on.
	DB *gorm.DB
	// Backend has the statements of DB's database, for the Repository's
	// tables.
	Backend backend.Backend
	// LeaseTable is the name of the lease table.
	LeaseTable string
	// WaitKey says whose watches the Repository's waiters share: those
	// that a Resume through it wakes at once.
	WaitKey wait.Key
	// Retry runs stmt, one statement in a transaction of its own, again
	// after a serialization failure, as the Repository's own steps do.
	Retry func(ctx context.Context, stmt func(ctx context.Context) error) error
}

var (
	// Parts returns the parts of repo, a *gormlease.Repository (any:
	// this package cannot name the type), and false when repo is nil or
	// not one.
	Parts func(repo any) (Repository, bool)

	// CheckTargetID returns an error wrapping gormlease.ErrInvalidArgument
	// when id cannot be a target ID.
	CheckTargetID func(id string) error

	// CheckText says what is wrong with s as a string of at most max
	// bytes that every database can store, or returns "" when nothing is.
	CheckText func(s string, max int) string

	// TruncateUTF8 cuts s to at most n bytes without splitting a
	// character, for quoting a bad argument in an error.
	TruncateUTF8 func(s string, n int) string

	// Invalidf returns an error that wraps gormlease.ErrInvalidArgument
	// and says what is wrong, in format's words.
	Invalidf func(format string, args ...any) error

	// Wrapf returns cause wrapped with the step that format names, read
	// "gormlease: <step>: <cause>" with the prefix once.
	Wrapf func(cause error, format string, args ...any) error
)

// MaxTargetIDLength is the longest target ID, in bytes, that gormlease
// accepts: the target_id columns hold 255 bytes on every database
// (varchar(255) on PostgreSQL, varbinary(255) on MySQL). Package
// gormlease checks target IDs against it, and admin the Prefix and the
// After of List's options.
const MaxTargetIDLength = 255
