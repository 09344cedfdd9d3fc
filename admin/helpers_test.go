package admin_test

import (
	"testing"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testkit"
)

// newOperator makes a Repository on db and an Operator on it, failing t on
// error.
func newOperator(t *testing.T, db *gorm.DB) (*gormlease.Repository, *admin.Operator) {
	t.Helper()
	repo := testkit.NewRepository(t, db)
	return repo, admin.New(repo)
}
