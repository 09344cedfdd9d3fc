package postgres

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"

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
		want := strings.NewReplacer("$1", literal(arrays), "$2", literal(tokens)).Replace(b.heartbeatSQL)
		assert.Equal(t, want, b.heartbeatQuery(leases[:n]), "%d leases", n)
	}
}
