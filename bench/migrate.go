package main

import (
	"context"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

func autoMigrate(ctx context.Context, db *gorm.DB) error {
	return gormlease.AutoMigrate(ctx, db)
}
