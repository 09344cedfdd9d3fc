package recipes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// SchemaVersion is a row of the table in which MigrateOnce records the
// versions it applied.
type SchemaVersion struct {
	// Version is the version's name, as passed to MigrateOnce.
	Version string `gorm:"primaryKey;size:191"`
	// AppliedAt is when the migration was recorded, in UTC.
	AppliedAt time.Time
}

// TableName is the name of SchemaVersion's table.
func (SchemaVersion) TableName() string { return "recipes_schema_version" }

// MigrateOnce applies migration version with migrate once across every pod
// that starts with it, and returns in each of them only once it is
// applied. The pods call it at startup, at the same time: one takes the
// lease of target "migrate", under RunWait, and the others wait for it,
// holding no connection. Each one that gets the lease reads whether
// version is applied already; the first finds it is not, runs migrate, and
// records version in the transaction that releases the lease, so that the
// others find it recorded and run nothing. When migrate fails, nothing is
// recorded and the next pod in line tries again. runner's options are the
// caller's: the lease timeout decides how soon a pod that died during the
// migration is replaced. The SchemaVersion table and the gormlease tables
// must exist (AutoMigrate, before the migrations that matter).
func MigrateOnce(ctx context.Context, db *gorm.DB, runner *gormlease.Runner[bool], version string,
	migrate func(ctx context.Context, db *gorm.DB) error,
) error {
	if version == "" || migrate == nil {
		return fmt.Errorf("migrate once: version and migrate are required: %w", gormlease.ErrInvalidArgument)
	}
	_, err := runner.RunWait(ctx, "migrate", func(ctx context.Context) (bool, error) {
		var applied SchemaVersion
		err := db.WithContext(ctx).Take(&applied, "version = ?", version).Error
		switch {
		case err == nil:
			return false, nil // a pod before this one applied it
		case !errors.Is(err, gorm.ErrRecordNotFound):
			return false, err
		}
		return true, migrate(ctx, db.WithContext(ctx))
	}, func(tx *gorm.DB, ran bool) error {
		if !ran {
			return nil
		}
		return tx.Create(&SchemaVersion{Version: version, AppliedAt: time.Now().UTC()}).Error
	})
	if err != nil {
		return fmt.Errorf("migrate %s: %w", version, err)
	}
	return nil
}
