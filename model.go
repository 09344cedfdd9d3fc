package gormlease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

const (
	// maxTargetIDLength is the longest target ID, in bytes, that gormlease
	// accepts: the target_id columns hold 255 bytes on every database
	// (varchar(255) on PostgreSQL, varbinary(255) on MySQL).
	maxTargetIDLength = 255

	// maxHolderLength is the longest holder name, in bytes (see WithHolder).
	maxHolderLength = 255
)

// JobLease is a row of the job_lease table: the lease on one target.
//
// The row is kept when the lease is released (ReleasedAt is set), so that
// Generation keeps increasing across acquisitions. Timestamps are written by
// the database's clock, never the application's; create the table with
// AutoMigrate or the DDL in docs/, not with gorm's own AutoMigrate.
type JobLease struct {
	// TargetID names the target: the thing the work runs for at most once
	// at a time. It is 1 to 255 bytes of valid UTF-8, without NUL bytes:
	// every call that takes a target ID refuses another with an error
	// wrapping ErrInvalidArgument.
	TargetID string `gorm:"column:target_id;primaryKey"`
	// LeaseToken is minted afresh at every acquisition. Every later step of the
	// lease (heartbeat, commit, release) matches it, so a holder whose lease was
	// taken over can change nothing.
	LeaseToken uuid.UUID `gorm:"column:lease_token"`
	// Generation grows by one at every acquisition of the target, released
	// or taken over. It is 1 at the first acquisition, unless Prune has
	// deleted rows: a target without a row then starts above the highest
	// generation that Prune deleted (see Repository.Prune).
	Generation int64 `gorm:"column:generation"`
	// Holder names the process that holds the lease (see WithHolder).
	Holder string `gorm:"column:holder"`
	// UpdatedAt is the database time of the acquisition or last heartbeat.
	UpdatedAt time.Time `gorm:"column:updated_at;autoUpdateTime:false"`
	// ReleasedAt is the database time of the release, or nil while held.
	ReleasedAt *time.Time `gorm:"column:released_at"`
	// SavedGeneration is the last generation whose fenced commit saved a
	// result, or nil when none has. It is recorded in the fenced commit's
	// own transaction, and kept across acquisitions.
	SavedGeneration *int64 `gorm:"column:saved_generation"`
	// SavedAt is the database time of that save, or nil.
	SavedAt *time.Time `gorm:"column:saved_at"`
	// Failure is, for a generation that ended without saving because its
	// job failed, the start of the job's error message (see Runner.Do); nil
	// otherwise. An acquisition clears it.
	Failure *string `gorm:"column:failure"`
	// TimeoutMS is the lease timeout, in milliseconds, that the last
	// acquisition asked for, or that Repository.Hold recorded for the rest
	// of a minimum hold: how long the lease lives after UpdatedAt without
	// a heartbeat. It is nil in a row that no acquisition has
	// written since AutoMigrate added the column; such a row counts as
	// expired since UpdatedAt (see Repository.List).
	TimeoutMS *int64 `gorm:"column:timeout_ms"`
	// HoldGeneration is the generation whose holder ended its work and
	// left the row held, unrenewed, for the rest of its minimum hold
	// (WithMinHold, Repository.Hold), or nil. While it equals Generation
	// and the row is not released, the row is held by that hold alone, and
	// List reads it as released once the hold has passed (UpdatedAt plus
	// the TimeoutMS that Hold recorded). A later acquisition raises the
	// generation, which ends its meaning without a write.
	HoldGeneration *int64 `gorm:"column:hold_generation"`
	// PausedAt is the database time at which an operator paused the
	// target (Repository.Pause), or nil when it is not paused. While it is
	// set, no acquisition takes the row: Run and Acquire are refused with
	// ErrPaused, and RunWait, Do and Elector.Lead wait. Resume clears it.
	PausedAt *time.Time `gorm:"column:paused_at"`
	// PauseReason is the reason that Pause recorded, or nil.
	PauseReason *string `gorm:"column:pause_reason"`
	// StopGeneration is the generation whose holder an operator asked to
	// stop (Repository.RequestStop), or nil. The request applies while it
	// equals Generation and the row is not released: the holder's next
	// heartbeat finds it, and the holder stops. A later acquisition raises
	// the generation, which ends the request without a write.
	StopGeneration *int64 `gorm:"column:stop_generation"`
	// StopReason is the reason that RequestStop recorded, or nil.
	StopReason *string `gorm:"column:stop_reason"`
}

// TableName returns "job_lease".
func (JobLease) TableName() string { return "job_lease" }

// JobResult is a row of the job_result table, written by SaveJSON: the last
// result saved for a target, as JSON, with the generation of the lease under
// which it was saved.
type JobResult struct {
	// TargetID names the target.
	TargetID string `gorm:"column:target_id;primaryKey"`
	// Data is the result, encoded as JSON.
	Data []byte `gorm:"column:data"`
	// Generation is the generation of the lease that saved Data.
	Generation int64 `gorm:"column:generation"`
	// UpdatedAt is the database time of the save.
	UpdatedAt time.Time `gorm:"column:updated_at;autoUpdateTime:false"`
}

// TableName returns "job_result".
func (JobResult) TableName() string { return "job_result" }

// AutoMigrate creates the tables gormlease needs, or brings them up to
// date: the lease table (job_lease), its one-row generation floor, named
// after it with "_floor" (job_lease_floor, which Prune raises; see
// docs/design.md), and the result table (job_result). A table that exists
// keeps its rows: AutoMigrate only adds the columns that later versions of
// gormlease use and that it lacks (it never drops or changes one), and the
// floor's row when missing. ctx bounds the whole migration. It runs the
// database's own DDL (the same as in docs/schema.sql, or
// docs/schema-mysql.sql) rather than gorm's AutoMigrate, so that the columns
// get the types the lease statements rely on. It is safe to call from
// several processes at once: on PostgreSQL an advisory lock runs them one
// after another, and where the server has none (CockroachDB, YugabyteDB)
// one that collides with another runs its DDL again, which does nothing for
// what exists. On MySQL it first checks that the DSN reads the database's
// times right (parseTime=true, loc=UTC), and returns an error wrapping
// ErrInvalidArgument when not. Its one option is WithTableNames.
func AutoMigrate(ctx context.Context, db *gorm.DB, opts ...TableOption) error {
	if db == nil {
		return invalidf("db is nil")
	}
	if ctx == nil {
		return invalidf("context is nil")
	}
	cfg, err := newConfig(options(opts))
	if err != nil {
		return err
	}
	b, err := backendFor(db, cfg.tables)
	if err != nil {
		return err
	}
	if err := checkSettings(ctx, b, db.WithContext(ctx)); err != nil {
		return err
	}
	if err := b.Migrate(ctx, backend.Quiet(db.WithContext(ctx))); err != nil {
		var bad *backend.SettingsError
		if errors.As(err, &bad) {
			return invalidf("%s", bad.Problem)
		}
		return wrapf(err, "migrate")
	}
	return nil
}

// checkText says what is wrong with s as a target ID or holder name, or
// returns "" when it is fine: it must be 1 to max bytes of valid UTF-8
// without NUL bytes, which every supported database can store.
func checkText(s string, max int) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > max:
		return fmt.Sprintf("is %d bytes long, more than the %d the column holds", len(s), max)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Sprintf("has a NUL byte at offset %d", i)
		}
	}
	return ""
}

// checkTargetID returns an error wrapping ErrInvalidArgument when id cannot
// be a target ID.
func checkTargetID(id string) error {
	if problem := checkText(id, maxTargetIDLength); problem != "" {
		if len(id) > 40 {
			id = truncateUTF8(id, 40) + "..."
		}
		return invalidf("target ID %q %s", id, problem)
	}
	if i := strings.Index(id, backend.SlotSeparator); i >= 0 {
		return invalidf("target ID %q has the byte 0x1f at offset %d, which gormlease keeps for the keys of slot rows (WithSlots)",
			truncateUTF8(id, 40), i)
	}
	return nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
