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
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
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
		{"MarginLeavesNoHeartbeat", []gormlease.Option{gormlease.WithSafetyMargin(15 * time.Second)},
			"heartbeat interval 5s + margin 15s must be less than the lease timeout 20s"},
		{"NegativeClockSkew", []gormlease.Option{gormlease.WithClockSkew(-time.Second)}, "WithClockSkew: skew must be >= 0, got -1s"},
		{"ClockSkewLeavesNoHeartbeat", []gormlease.Option{gormlease.WithClockSkew(13 * time.Second)},
			"WithClockSkew: heartbeat interval 5s + margin 2s + clock skew 13s must be less than the lease timeout 20s"},
		{"ZeroOperationTimeout", []gormlease.Option{gormlease.WithOperationTimeout(0)}, "WithOperationTimeout"},
		{"ZeroReconnectWindow", []gormlease.Option{gormlease.WithReconnectWindow(0)}, "WithReconnectWindow: window must be > 0, got 0s"},
		{"ReconnectWindowPastTimeout", []gormlease.Option{gormlease.WithReconnectWindow(21 * time.Second)},
			"WithReconnectWindow: window 21s must be at most the lease timeout 20s"},
		{"EmptyHolder", []gormlease.Option{gormlease.WithHolder("")}, "WithHolder: holder is empty"},
		{"LongHolder", []gormlease.Option{gormlease.WithHolder(strings.Repeat("h", 300))}, "300 bytes long"},
		{"NilOption", []gormlease.Option{nil}, "option 0 is nil"},
		{"ZeroStatementAttempts", []gormlease.Option{gormlease.WithStatementAttempts(0)},
			"WithStatementAttempts: n must be between 1 and 100, got 0"},
		{"TooManyStatementAttempts", []gormlease.Option{gormlease.WithStatementAttempts(101)},
			"WithStatementAttempts: n must be between 1 and 100, got 101"},
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
	_, err = gormlease.NewRunner[string](db, gormlease.WithClockSkew(12*time.Second))
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
	_ = gormlease.AutoMigrate(ctx, nil, tables, gormlease.WithHistory())
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
			"gormlease.Option does not implement gormlease.MigrateOption"},
		{"HolderToAutoMigrate", `_ = gormlease.AutoMigrate(ctx, nil, gormlease.WithHolder("ops"))`,
			"gormlease.RepositoryOption does not implement gormlease.MigrateOption"},
		{"HistoryToNewRunner", `_, _ = gormlease.NewRunner[string](nil, gormlease.WithHistory())`,
			"gormlease.MigrateOption does not implement gormlease.Option"},
		{"HistoryToNewRepository", `_, _ = gormlease.NewRepository(nil, gormlease.WithHistory())`,
			"gormlease.MigrateOption does not implement gormlease.RepositoryOption"},
		{"HistoryToLoadJSON", `_, _, _ = gormlease.LoadJSON[string](ctx, nil, "t", gormlease.WithHistory())`,
			"gormlease.MigrateOption does not implement gormlease.TableOption"},
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

// One timing option is enough: the lease timeout alone sets the heartbeat
// interval to a quarter of it, the interval alone the timeout to four
// times it, and the safety margin, operation timeout and reconnect window
// follow the lease timeout. Both given and inconsistent are still refused,
// naming the option.
func TestNewRunner_OneTimingOptionIsEnough(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t).DB(t)
	type timings = gormlease.Timings
	cases := []struct {
		name string
		opts []gormlease.Option
		want timings
	}{
		{"Defaults", nil, timings{5 * time.Second, 20 * time.Second, 2 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"TimeoutAlone", []gormlease.Option{gormlease.WithLeaseTimeout(10 * time.Second)},
			timings{2500 * time.Millisecond, 10 * time.Second, time.Second, 10 * time.Second, 10 * time.Second}},
		{"ShortTimeoutAlone", []gormlease.Option{gormlease.WithLeaseTimeout(time.Second)},
			timings{250 * time.Millisecond, time.Second, 100 * time.Millisecond, time.Second, time.Second}},
		{"IntervalAlone", []gormlease.Option{gormlease.WithHeartbeatInterval(time.Second)},
			timings{time.Second, 4 * time.Second, 400 * time.Millisecond, 4 * time.Second, 4 * time.Second}},
		{"LongIntervalAlone", []gormlease.Option{gormlease.WithHeartbeatInterval(time.Minute)},
			timings{time.Minute, 4 * time.Minute, 24 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"OperationTimeoutAlone", []gormlease.Option{gormlease.WithOperationTimeout(5 * time.Minute)},
			timings{5 * time.Second, 20 * time.Second, 2 * time.Second, 5 * time.Minute, 5 * time.Minute}},
		{"OperationTimeoutGivenWithShortLease", []gormlease.Option{
			gormlease.WithLeaseTimeout(time.Second), gormlease.WithOperationTimeout(3 * time.Second)},
			timings{250 * time.Millisecond, time.Second, 100 * time.Millisecond, 3 * time.Second, 3 * time.Second}},
		{"SafetyMarginAlone", []gormlease.Option{gormlease.WithSafetyMargin(10 * time.Second)},
			timings{5 * time.Second, 20 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"ReconnectWindowWithTimeout", []gormlease.Option{
			gormlease.WithLeaseTimeout(5 * time.Second), gormlease.WithReconnectWindow(5 * time.Second)},
			timings{1250 * time.Millisecond, 5 * time.Second, 500 * time.Millisecond, 5 * time.Second, 5 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := gormlease.NewRunner[string](db, tc.opts...)
			require.NoError(t, err)
			assert.Equal(t, tc.want, gormlease.RunnerTimings(r))
			e, err := gormlease.NewElector(db, "role", tc.opts...)
			require.NoError(t, err)
			assert.Equal(t, tc.want, gormlease.ElectorTimings(e))
		})
	}

	refused := []struct {
		name string
		opts []gormlease.Option
		want string
	}{
		{"BothInconsistent", []gormlease.Option{
			gormlease.WithLeaseTimeout(10 * time.Second), gormlease.WithHeartbeatInterval(30 * time.Second)},
			"WithLeaseTimeout: timeout 10s must be at least twice the heartbeat interval 30s"},
		{"TimeoutTooShortToDerive", []gormlease.Option{gormlease.WithLeaseTimeout(3)},
			"WithLeaseTimeout: timeout 3ns is too short to derive a heartbeat interval from"},
		{"MarginPastDerivedTimeout", []gormlease.Option{
			gormlease.WithHeartbeatInterval(time.Second), gormlease.WithSafetyMargin(3 * time.Second)},
			"WithSafetyMargin: heartbeat interval 1s + margin 3s must be less than the lease timeout 4s"},
		{"ReconnectWindowPastDerivedTimeout", []gormlease.Option{
			gormlease.WithHeartbeatInterval(time.Second), gormlease.WithReconnectWindow(5 * time.Second)},
			"WithReconnectWindow: window 5s must be at most the lease timeout 4s"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gormlease.NewRunner[string](db, tc.opts...)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
			_, err = gormlease.NewElector(db, "role", tc.opts...)
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A Runner given only WithLeaseTimeout, or only WithHeartbeatInterval,
// records the lease timeout it derived in the row of each lease it takes,
// on every database.
func TestRun_OneTimingOptionRecordsDerivedTimeout(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			opt  gormlease.Option
			want int64
		}{
			{"TimeoutAlone", gormlease.WithLeaseTimeout(10 * time.Second), 10_000},
			{"IntervalAlone", gormlease.WithHeartbeatInterval(500 * time.Millisecond), 2_000},
		} {
			r := newRunner(t, db, tc.opt)
			target := "one-option/" + tc.name
			_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
				row, found, err := admin.New(r.Repository()).Get(ctx, target)
				require.NoError(t, err)
				require.True(t, found)
				if assert.NotNil(t, row.TimeoutMS, tc.name) {
					assert.Equal(t, tc.want, *row.TimeoutMS, tc.name)
				}
				return "", nil
			}, func(*gorm.DB, string) error { return nil })
			require.NoError(t, err, tc.name)
		}
	})
}
