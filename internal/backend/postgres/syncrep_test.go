package postgres

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/backend"
)

// The heartbeat's text, written in one pass, is what writing the two
// arrays and then each as a literal gives, for targets with every
// character that either quoting escapes.
func TestHeartbeatQueryWritesTheArraysAsLiterals(t *testing.T) {
	b := New(backend.Tables{Lease: "job_lease", Result: "job_result"})
	targets := []string{"plain", `back\slash`, `dou"ble`, "sin'gle", `{a,b}`, `\\"'`, "", "ünï cödé", `'"\`}
	leases := make([]backend.Lease, len(targets))
	for i, target := range targets {
		leases[i] = backend.Lease{TargetID: target, Token: uuid.New(), Generation: int64(i + 1)}
	}
	for n := range len(leases) + 1 {
		arrays, tokens := leaseArrays(leases[:n])
		arraysLit, err := literal(arrays)
		require.NoError(t, err)
		tokensLit, err := literal(tokens)
		require.NoError(t, err)
		want := strings.NewReplacer("$1", arraysLit, "$2", tokensLit).Replace(b.heartbeatSQL)
		got, err := b.heartbeatQuery(leases[:n])
		require.NoError(t, err)
		assert.Equal(t, want, got, "%d leases", n)
	}
}

// A target that no literal can carry makes the heartbeat's text an error,
// not a statement.
func TestHeartbeatQueryRefusesNUL(t *testing.T) {
	b := New(backend.Tables{Lease: "job_lease", Result: "job_result"})
	_, err := b.heartbeatQuery([]backend.Lease{{TargetID: "ok", Token: uuid.New()}, {TargetID: "n\x00l", Token: uuid.New()}})
	require.ErrorContains(t, err, "NUL")
}
