package postgres

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/backend"
)

// The fenced commit's one-query BEGIN, written in one pass, is BEGIN and
// the statement that records the save and releases the lease with its
// target and token written in as literals, for targets with every character
// that the quoting escapes or that looks like a parameter, and for tables
// of other names.
func TestBeginLockedWritesTheTargetAndTokenAsLiterals(t *testing.T) {
	for _, tables := range []backend.Tables{backend.DefaultTables, {Lease: "app.lease", Result: "app.result"}} {
		b := New(tables)
		for _, target := range literalTargets {
			l := backend.Lease{TargetID: target, Token: uuid.New(), Generation: 7}
			targetLit, err := literal(target)
			require.NoError(t, err)
			tokenLit, err := literal(l.Token.String())
			require.NoError(t, err)
			want := beginSQL + "; " + strings.NewReplacer("$1", targetLit, "$2", tokenLit).Replace(b.OwnSQL(backend.SaveRelease))
			got, err := b.beginLocked(l)
			require.NoError(t, err)
			assert.Equal(t, want, got, "target %q, tables %v", target, tables)
		}
	}
}

// literalTargets are targets that a literal must carry unchanged.
var literalTargets = []string{"plain", "", `it's`, `back\slash`, `trailing\`, `\'`, `$1`, `$2$1`, `?`, "ünï cödé", `'"\`}

// A target that no literal can carry makes the BEGIN an error, not a
// query.
func TestBeginLockedRefusesNUL(t *testing.T) {
	b := New(backend.DefaultTables)
	_, err := b.beginLocked(backend.Lease{TargetID: "a\x00b", Token: uuid.New()})
	require.ErrorIs(t, err, errNUL)
}

// The rows affected are read from a command tag as pgconn reads them.
func TestRowsAffectedReadsTheCommandTag(t *testing.T) {
	for tag, want := range map[string]int64{
		"UPDATE 1": 1, "INSERT 0 25": 25, "SELECT 1000": 1000, "COMMIT": 0, "BEGIN": 0, "": 0, "DELETE 0": 0,
	} {
		assert.Equal(t, want, rowsAffected([]byte(tag)), "%q", tag)
		assert.Equal(t, pgconn.NewCommandTag(tag).RowsAffected(), rowsAffected([]byte(tag)), "%q", tag)
	}
}
