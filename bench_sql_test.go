package gormlease_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The benchmark's reference implementation, gormlease's SQL on raw pgx,
// runs the library's own PostgreSQL statements on a table of its own: when
// they change here, it must change too.
func TestBench_ReferenceSQLMatchesLibrary(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("bench/rawlease.go")
	require.NoError(t, err)
	repo := newRepository(t, testdb.Postgres(t).DB(t))
	// The bench derives the statement for a row known to exist from the
	// one statement, as bench/rawlease.go's withoutInsert does.
	head, rest, ok := strings.Cut(gormlease.PostgresAcquire, "\n), ins AS (")
	require.True(t, ok)
	_, answer, ok := strings.Cut(rest, "\n)\nSELECT COALESCE((SELECT generation FROM took), (SELECT generation FROM ins)),")
	require.True(t, ok)
	assert.Equal(t, gormlease.PostgresAcquireRow, head+"\n)\nSELECT (SELECT generation FROM took),"+answer,
		"AcquireRowSQL is no longer AcquireSQL without its INSERT: change withoutInsert in bench/rawlease.go")
	for name, stmt := range map[string]string{
		"acquire":          gormlease.PostgresAcquire,
		"release":          gormlease.ReleaseSQL(repo),
		"save and release": gormlease.SaveReleaseSQL(repo),
	} {
		assert.Contains(t, string(src), strings.ReplaceAll(stmt, "job_lease", "raw_lease"),
			"bench/rawlease.go no longer has the library's %s statement", name)
	}
}
