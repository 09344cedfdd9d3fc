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
	"github.com/gormlease/gormlease/internal/ops"
)

const (
	// maxTargetIDLength is the longest target ID, in bytes, that gormlease
	// accepts (see ops.MaxTargetIDLength).
	maxTargetIDLength = ops.MaxTargetIDLength

	// maxHolderLength is the longest holder name, in bytes (see WithHolder).
	maxHolderLength = 255
)

// JobLease is a row of the job_lease table: the lease on one target, kept
// when released, with times on the database's clock. docs/design.md, section
// The row, tells each column. Create the table with AutoMigrate, not gorm's.
type JobLease struct {
	// TargetID names the target: 1 to 255 bytes of UTF-8, without NUL.
	TargetID string `gorm:"column:target_id;primaryKey"`
	// LeaseToken is minted at every acquisition; every later step matches it.
	LeaseToken uuid.UUID `gorm:"column:lease_token"`
	// Generation grows at every acquisition of the target, even after Prune.
	Generation int64 `gorm:"column:generation"`
	// Holder names the process that holds the lease (see WithHolder).
	Holder string `gorm:"column:holder"`
	// UpdatedAt is the database time of the acquisition or last heartbeat.
	UpdatedAt time.Time `gorm:"column:updated_at;autoUpdateTime:false"`
	// ReleasedAt is the database time of the release, or nil while held.
	ReleasedAt *time.Time `gorm:"column:released_at"`
	// SavedGeneration is the last generation whose fenced commit saved, or nil.
	SavedGeneration *int64 `gorm:"column:saved_generation"`
	// SavedAt is the database time of that save, or nil.
	SavedAt *time.Time `gorm:"column:saved_at"`
	// Failure says how the current generation's job failed (Runner.Do), or nil.
	Failure *string `gorm:"column:failure"`
	// TimeoutMS is how long, in ms, the lease lives after UpdatedAt, or nil.
	TimeoutMS *int64 `gorm:"column:timeout_ms"`
	// HoldGeneration is the generation in a minimum hold (Repository.Hold),
	// or nil.
	HoldGeneration *int64 `gorm:"column:hold_generation"`
	// PausedAt is when an operator paused the target
	// (admin.Operator.Pause), or nil.
	PausedAt *time.Time `gorm:"column:paused_at"`
	// PauseReason is the reason that Pause recorded, or nil.
	PauseReason *string `gorm:"column:pause_reason"`
	// StopGeneration is the generation whose holder an operator asked to
	// stop (admin.Operator.RequestStop), or nil.
	StopGeneration *int64 `gorm:"column:stop_generation"`
	// StopReason is the reason that RequestStop recorded, or nil.
	StopReason *string `gorm:"column:stop_reason"`
	// AcquiredAt is the database time at which the current generation was
	// acquired ("held since"), or nil when the row does not record it.
	AcquiredAt *time.Time `gorm:"column:acquired_at"`
	// PausedBy names the operator who paused the target
	// (admin.Operator.As) while it is paused; once resumed, the operator
	// who resumed it; nil when the action named none.
	PausedBy *string `gorm:"column:paused_by"`
	// StopBy names the operator who asked the holder to stop
	// (admin.Operator.As), or nil.
	StopBy *string `gorm:"column:stop_by"`
	// EndCause says how the last generation ended ("saved", "failed",
	// "forced", ...: docs/design.md, section History), written by the
	// statement that ended it and cleared by the next acquisition; nil
	// while the generation runs (a minimum hold records it when the hold
	// begins), and in rows ended before the column existed.
	EndCause *string `gorm:"column:end_cause"`
	// EndedBy names the operator who forced the last generation's release
	// (admin.Operator.ForceRelease, with admin.Operator.As), or nil.
	EndedBy *string `gorm:"column:ended_by"`
}

// TableName returns "job_lease".
func (JobLease) TableName() string { return "job_lease" }

// JobResult is a row of the job_result table, written by SaveJSON: the last
// result saved for a target.
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

// AutoMigrate creates the tables gormlease needs, or brings them up to date:
// the lease table, its one-row generation floor, and the result table; with
// WithHistory, also the event table and the triggers that write it. It
// only adds what is missing, never drops or changes a column (nor a
// history), and is safe to call from several processes at once; ctx
// bounds it all. It runs the DDL of docs/schema.sql (docs/schema-mysql.sql),
// not gorm's AutoMigrate. On MySQL, it refuses a DSN that does not read
// times right (parseTime=true, loc=UTC) with ErrInvalidArgument.
func AutoMigrate(ctx context.Context, db *gorm.DB, opts ...MigrateOption) error {
	if db == nil {
		return invalidf("db is nil")
	}
	if ctx == nil {
		return invalidf("context is nil")
	}
	var m migrateConfig
	for i, o := range opts {
		if o == nil {
			return invalidf("AutoMigrate: option %d is nil", i)
		}
		o.applyMigrate(&m)
	}
	cfg, err := newConfig(m.tables)
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
	if err := b.Migrate(ctx, backend.Quiet(db.WithContext(ctx)), m.history); err != nil {
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
