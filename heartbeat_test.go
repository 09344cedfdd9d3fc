package gormlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

func TestRepository_HeartbeatManyReportsExactlyTheLostLeases(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		repo := newRepository(t, db)
		ctx := context.Background()
		var leases []gormlease.Lease
		for range 5 {
			l, err := repo.Acquire(ctx, newTarget(t)+`"q\`, time.Minute)
			require.NoError(t, err)
			leases = append(leases, l)
		}
		lost, err := repo.HeartbeatMany(ctx, leases)
		require.NoError(t, err)
		require.Empty(t, lost)
	})
}
