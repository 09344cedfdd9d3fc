package gormlease_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// Point 10: NewRunner validates its options together and names the one at
// fault; a nil db is refused too.
func TestNewRunner_RejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, err := gormlease.NewRunner[string](nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "db is nil")

	db := testdb.Postgres(t).DB(t)
	cases := []struct {
		name string
		opts []gormlease.Option
		want string
	}{
		{"ZeroInterval", []gormlease.Option{gormlease.WithHeartbeatInterval(0)}, "WithHeartbeatInterval: interval must be > 0"},
		{"NegativeInterval", []gormlease.Option{gormlease.WithHeartbeatInterval(-time.Second)}, "interval must be > 0"},
		{"ZeroTimeout", []gormlease.Option{gormlease.WithLeaseTimeout(0)}, "WithLeaseTimeout: timeout must be > 0"},
		{"TimeoutBelowTwiceInterval", []gormlease.Option{
			gormlease.WithHeartbeatInterval(time.Minute), gormlease.WithLeaseTimeout(90 * time.Second),
		}, "timeout 1m30s must be at least twice the heartbeat interval 1m0s"},
		{"ZeroMargin", []gormlease.Option{gormlease.WithSafetyMargin(0)}, "WithSafetyMargin: margin must be > 0"},
		{"MarginLeavesNoHeartbeat", []gormlease.Option{gormlease.WithSafetyMargin(90 * time.Second)},
			"heartbeat interval 30s + margin 1m30s must be less than the lease timeout 2m0s"},
		{"NegativeClockSkew", []gormlease.Option{gormlease.WithClockSkew(-time.Second)}, "WithClockSkew: skew must be >= 0, got -1s"},
		{"ClockSkewLeavesNoHeartbeat", []gormlease.Option{gormlease.WithClockSkew(78 * time.Second)},
			"WithClockSkew: heartbeat interval 30s + margin 12s + clock skew 1m18s must be less than the lease timeout 2m0s"},
		{"ZeroOperationTimeout", []gormlease.Option{gormlease.WithOperationTimeout(0)}, "WithOperationTimeout"},
		{"ZeroReconnectWindow", []gormlease.Option{gormlease.WithReconnectWindow(0)}, "WithReconnectWindow: window must be > 0, got 0s"},
		{"ReconnectWindowPastTimeout", []gormlease.Option{gormlease.WithReconnectWindow(3 * time.Minute)},
			"WithReconnectWindow: window 3m0s must be at most the lease timeout 2m0s"},
		{"EmptyHolder", []gormlease.Option{gormlease.WithHolder("")}, "WithHolder: holder is empty"},
		{"LongHolder", []gormlease.Option{gormlease.WithHolder(strings.Repeat("h", 300))}, "300 bytes long"},
		{"NilOption", []gormlease.Option{nil}, "option 0 is nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := gormlease.NewRunner[string](db, tc.opts...)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
			assert.Nil(t, r)
		})
	}

	// The skew may take what the interval and the margin leave, but all of it.
	_, err = gormlease.NewRunner[string](db, gormlease.WithClockSkew(77*time.Second))
	assert.NoError(t, err)
	_, err = gormlease.NewRunner[string](db, gormlease.WithClockSkew(0))
	assert.NoError(t, err)

	// The smallest valid timeout is twice the interval.
	_, err = gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(time.Second), gormlease.WithLeaseTimeout(2*time.Second))
	assert.NoError(t, err)
}

// An option that a function cannot use does not compile: NewRepository
// takes RepositoryOptions, AutoMigrate and LoadJSON TableOptions, and the
// narrower options are Options too, so the one value serves every call.
// The snippets are compiled with the go command, in this module.
func TestOptions_UnusableOptionDoesNotCompile(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to compile the snippets with")
	}
	build := func(t *testing.T, body string) (string, error) {
		src := filepath.Join(t.TempDir(), "snippet.go")
		require.NoError(t, os.WriteFile(src, []byte(`package main

import (
	"context"
	"time"

	"github.com/gormlease/gormlease"
)

var _ = time.Second

func main() {
	ctx := context.Background()
	_ = ctx
`+body+`
}
`), 0o600))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, goCmd, "build", "-o", os.DevNull, src).CombinedOutput()
		return string(out), err
	}

	t.Run("NarrowOptionsServeWiderCalls", func(t *testing.T) {
		t.Parallel()
		out, err := build(t, `
	tables := gormlease.WithTableNames("app_lease", "app_result")
	holder := gormlease.WithHolder("ops")
	_ = gormlease.AutoMigrate(ctx, nil, tables)
	_, _, _ = gormlease.LoadJSON[string](ctx, nil, "t", tables)
	_, _ = gormlease.NewRepository(nil, tables, holder)
	_, _ = gormlease.NewRunner[string](nil, tables, holder, gormlease.WithLeaseTimeout(time.Minute))
	var _ gormlease.Option = tables
	var _ gormlease.RepositoryOption = tables`)
		require.NoError(t, err, "%s", out)
	})
	for _, tc := range []struct{ name, call, want string }{
		{"RunnerOptionToNewRepository", `_, _ = gormlease.NewRepository(nil, gormlease.WithLeaseTimeout(time.Minute))`,
			"gormlease.Option does not implement gormlease.RepositoryOption"},
		{"RunnerOptionToAutoMigrate", `_ = gormlease.AutoMigrate(ctx, nil, gormlease.WithObserver(nil))`,
			"gormlease.Option does not implement gormlease.TableOption"},
		{"HolderToAutoMigrate", `_ = gormlease.AutoMigrate(ctx, nil, gormlease.WithHolder("ops"))`,
			"gormlease.RepositoryOption does not implement gormlease.TableOption"},
		{"RunnerOptionToLoadJSON", `_, _, _ = gormlease.LoadJSON[string](ctx, nil, "t", gormlease.WithLeaseTimeout(time.Minute))`,
			"gormlease.Option does not implement gormlease.TableOption"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := build(t, "\t"+tc.call)
			require.Error(t, err, "the snippet compiled:\n%s", tc.call)
			assert.Contains(t, out, tc.want)
		})
	}
}
