package gormlease_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
)

// docs/schema.sql is the DDL that AutoMigrate runs on PostgreSQL, with
// WithHistory's part last: a test keeps the two from drifting apart.
func TestSchemaDocMatchesAutoMigrate(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/schema.sql")
	require.NoError(t, err)
	require.Equal(t, normalizeSQL(gormlease.PostgresSchema+gormlease.PostgresHistorySchema), normalizeSQL(stripComments(string(doc))))
}

func stripComments(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func normalizeSQL(sql string) string { return strings.Join(strings.Fields(sql), " ") }
