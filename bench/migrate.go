package main

import (
	"context"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

func autoMigrate(ctx context.Context, db *gorm.DB) error {
	return gormlease.AutoMigrate(ctx, db)
}

// historyTables are the tables of the implementation "gormlease, with
// history": the lease table keeps a history (gormlease.WithHistory), its
// triggers writing an event row for each acquisition and each end.
var historyTables = gormlease.WithTableNames("hist_lease", "hist_result")

// autoMigrateHistory makes historyTables, with their history.
func autoMigrateHistory(ctx context.Context, db *gorm.DB) error {
	return gormlease.AutoMigrate(ctx, db, historyTables, gormlease.WithHistory())
}
