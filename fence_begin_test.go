package gormlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// On PostgreSQL the fenced commit of CommitAndRelease sends its BEGIN and
// the statement that locks the row, records the save and releases the
// lease, together. When the server fails the BEGIN, that statement must
// not run on its own, outside a transaction, where it would commit the
// lease as released and saved without the saver's writes: the commit
// returns the server's error, the saver has not run, and the row is still
// the lease's, unreleased and unsaved. A proxy turns the BEGIN into a
// statement that fails (a division by zero) on its way to the server, on
// the pool of pgx's driver, whose commit sends the two in the extended
// protocol.
func TestCommit_FailedBeginCommitsNothing(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	db := s.DB(t)
	proxy := testdb.NewProxy(t, s.Addr)
	repo := newRepository(t, s.OpenVia(t, proxy.Addr()))
	ctx := context.Background()
	target, l := acquireNew(t, repo, time.Minute)
	const begin = "BEGIN ISOLATION LEVEL READ COMMITTED"
	rewritten := proxy.RewriteOn(t, begin, fmt.Sprintf("%-*s", len(begin), "SELECT 1/0"))
	saves := 0
	err := gormlease.CommitAndRelease(repo, ctx, l, func(tx *gorm.DB) error {
		saves++
		return gormlease.SaveJSON(tx, "result")
	})
	recv(t, rewritten, time.Second, "the proxy to rewrite the BEGIN")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SQLSTATE 22012", "the failed BEGIN's error")
	assert.Zero(t, saves, "saver calls")

	row := leaseRow(t, db, target)
	assert.Nil(t, row.ReleasedAt, "released by a commit that failed")
	assert.Nil(t, row.SavedGeneration, "saved by a commit that failed")
	assert.Zero(t, countRows(t, db, &gormlease.JobResult{}, target), "results")
	require.NoError(t, repo.Release(ctx, l), "the lease is still held")
}
