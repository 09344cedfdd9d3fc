package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/testdb"
)

// TestMain runs the tests (see testdb.Main: goroutine leaks fail the run).
func TestMain(m *testing.M) { testdb.Main(m) }

// literalCases are texts that a literal must carry unchanged: quotes and
// backslashes in every arrangement that escaping could confuse, the slot
// keys' separator and other control characters, and non-ASCII text.
var literalCases = []string{
	"", "plain", `it's`, `''`, `back\slash`, `trailing\`, `\'`, `\\'`, `'\`, `E'x'`, `"double"`,
	`x'; UPDATE job_lease SET released_at = NULL; --`, `$$dollar$$`, `$1`, `?`,
	"slot\x1f3", "\x01\x1f\x7f", "line\nbreak\ttab\r", "ünïcödé ✓ 日本 🙂",
}

// Each text is written as E'...' with every backslash escaped by a
// backslash and every single quote doubled, and nothing else escaped.
func TestLiteral_EscapesQuotesAndBackslashes(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"":              `E''`,
		"plain":         `E'plain'`,
		`it's`:          `E'it''s'`,
		`back\slash`:    `E'back\\slash'`,
		`\'`:            `E'\\'''`,
		"slot\x1f3":     "E'slot\x1f3'",
		"ünï ✓":         "E'ünï ✓'",
		`"q"`:           `E'"q"'`,
		"a\nb":          "E'a\nb'",
		`trailing\`:     `E'trailing\\'`,
		`''`:            `E''''''`,
		`x'; DROP --`:   `E'x''; DROP --'`,
		`\\`:            `E'\\\\'`,
		`E'x'`:          `E'E''x'''`,
		`$1 and $$ ? %`: `E'$1 and $$ ? %'`,
	} {
		got, err := postgres.Literal(s)
		require.NoError(t, err, "%q", s)
		assert.Equal(t, want, got, "%q", s)
	}
}

// A text that no literal can carry is refused with an error naming the
// problem, and no text.
func TestLiteral_RefusesNULAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	for s, problem := range map[string]string{
		"nul\x00inside": "NUL",
		"\x00":          "NUL",
		"bad\xffutf8":   "UTF-8",
		"\xc3":          "UTF-8", // a character cut short
	} {
		got, err := postgres.Literal(s)
		require.Error(t, err, "%q", s)
		assert.Contains(t, err.Error(), problem, "%q", s)
		assert.Empty(t, got, "%q", s)
	}
}

// The server reads each literal back as the text it was written from,
// with standard_conforming_strings on and off, and with backslash_quote
// off (which refuses a quote escaped by a backslash), in a query sent
// through the simple protocol, as the backend sends its literals.
func TestLiteral_ServerReadsTheText(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	// A pool of its own: each setting's queries are parsed under it, not
	// taken from a statement cache that an earlier setting filled.
	for _, settings := range []string{
		"backslash_quote = off", "standard_conforming_strings = on", "standard_conforming_strings = off",
	} {
		t.Run(settings, func(t *testing.T) {
			db := s.Open(t, nil)
			err := db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Exec("SET LOCAL "+settings).Error)
				for _, s := range literalCases {
					lit, err := postgres.Literal(s)
					require.NoError(t, err, "%q", s)
					// Parsed by the server as the backend's simple queries are.
					var got string
					require.NoError(t, tx.Raw("SELECT "+lit).Row().Scan(&got), "%q as %s", s, lit)
					assert.Equal(t, s, got, "%q as %s", s, lit)
				}
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// A driver that sends queries without arguments as prepared statements
// makes the server refuse BEGIN and the lock as one query; the refusal is
// recognised, so that the fenced commit goes through gorm's transaction
// instead, and nothing else is taken for it.
func TestRefusesQueries_RecognisesTheRefusal(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t).DB(t)
	// An argument makes pgx prepare the query, as such a driver would.
	err := db.WithContext(context.Background()).Exec("SELECT 1; SELECT ?", 2).Error
	require.Error(t, err)
	assert.True(t, postgres.RefusesQueries(err), "not recognised: %v", err)
	assert.False(t, postgres.RefusesQueries(db.Exec("SELEC 1").Error), "a syntax error taken for the refusal")
	assert.False(t, postgres.RefusesQueries(errors.New("multiple commands")), "an error without an SQLSTATE")
	// Without arguments the query is a simple query, which may hold several.
	assert.NoError(t, db.Exec("SELECT 1; SELECT 2").Error)
}
