package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
)

// stop -wait returns, 0, once the holder has stopped: a Runner whose work
// honours its context stops at its next heartbeat and releases the lease,
// which stop then reads released; with -json it says so in "wait". A
// holder that ignores the request keeps stop waiting until -timeout, and
// stop then exits 6, saying who still holds the lease; a lease released
// by force meanwhile is "taken over".
func TestCommand_StopWait(t *testing.T) {
	t.Parallel()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, names, cmd := onTables(t, s, "cli_wait_lease", "cli_wait_result")
			run := fmt.Sprintf("w%d/", time.Now().UnixNano())

			t.Run("RunnerStops", func(t *testing.T) {
				for _, asJSON := range []bool{false, true} {
					target := fmt.Sprintf("%srunner-%v", run, asJSON)
					r, err := gormlease.NewRunner[string](db, names, gormlease.WithHolder("worker-5"),
						gormlease.WithHeartbeatInterval(300*time.Millisecond), gormlease.WithLeaseTimeout(10*time.Second))
					require.NoError(t, err)
					started, done := make(chan struct{}), make(chan error, 1)
					go func() {
						_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
							close(started)
							<-ctx.Done()
							return "", context.Cause(ctx)
						}, func(*gorm.DB, string) error { return nil })
						done <- err
					}()
					select {
					case <-started:
					case err := <-done:
						t.Fatalf("Run returned before its work started: %v", err)
					case <-time.After(30 * time.Second):
						t.Fatal("the work did not start within 30 s")
					}

					args := []string{"-yes", "-wait", "-timeout", "60s", "-reason", "drain", target}
					if asJSON {
						args = append([]string{"-json"}, args...)
					}
					res := cmd("stop", args...)
					require.Equal(t, exitOK, res.code, res.stderr)
					row, _, err := admin.New(r.Repository()).Get(ctx, target)
					require.NoError(t, err)
					assert.NotNil(t, row.ReleasedAt, "stop -wait returned while the lease was held")
					if asJSON {
						var a actionJSON
						decodeOne(t, res.stdout, &a)
						require.NotNil(t, a.Wait)
						assert.True(t, a.Wait.Stopped)
						assert.InDelta(t, 60, a.Wait.TimeoutSeconds, 0.001)
						assert.Equal(t, []waitRowJSON{{Generation: 1, Holder: "worker-5", Outcome: outcomeReleased}}, a.Wait.Rows)
					} else {
						assert.Contains(t, res.stdout, "Waiting for it to stop (at most 1m0s)")
						assert.Regexp(t, `"`+target+`": generation 1 released after \S+\.`, res.stdout)
					}
					select {
					case err := <-done:
						require.ErrorIs(t, err, gormlease.ErrStopRequested)
					case <-time.After(30 * time.Second):
						t.Fatal("Run did not return within 30 s of the stop")
					}
				}
			})

			t.Run("HolderIgnoresIt", func(t *testing.T) {
				repo, err := gormlease.NewRepository(db, names, gormlease.WithHolder("deaf-1"))
				require.NoError(t, err)
				target := run + "deaf"
				l, err := repo.Acquire(ctx, target, time.Hour)
				require.NoError(t, err)

				start := time.Now()
				res := cmd("stop", "-yes", "-wait", "-timeout", "1s", "-reason", "drain", target)
				assert.Equal(t, exitTimedOut, res.code, res.stderr)
				assert.GreaterOrEqual(t, time.Since(start), time.Second, "stop gave up before -timeout")
				assert.Contains(t, res.stderr, fmt.Sprintf(`the holder of %q has not stopped within 1s; the request stays`, target))
				assert.Contains(t, res.stderr, `generation 1, held by "deaf-1", live`)

				res = cmd("stop", "-yes", "-json", "-wait", "-timeout", "500ms", "-reason", "drain", target)
				assert.Equal(t, exitTimedOut, res.code, res.stderr)
				var a actionJSON
				decodeOne(t, res.stdout, &a)
				require.NotNil(t, a.Wait)
				assert.False(t, a.Wait.Stopped)
				assert.Equal(t, []waitRowJSON{{Generation: 1, Holder: "deaf-1", Outcome: outcomeRunning}}, a.Wait.Rows)
				require.NoError(t, repo.Heartbeat(ctx, l), "the holder lost its lease")
			})

			t.Run("ReleasedByForce", func(t *testing.T) {
				repo, err := gormlease.NewRepository(db, names)
				require.NoError(t, err)
				op := admin.New(repo)
				target := run + "forced"
				_, err = repo.Acquire(ctx, target, time.Hour)
				require.NoError(t, err)
				res := make(chan result, 1)
				go func() { res <- cmd("stop", "-yes", "-wait", "-timeout", "60s", "-reason", "drain", target) }()
				deadline := time.Now().Add(30 * time.Second)
				for {
					row, _, err := op.Get(ctx, target)
					require.NoError(t, err)
					if row.StopGeneration != nil {
						break
					}
					require.True(t, time.Now().Before(deadline), "stop did not ask within 30 s")
					time.Sleep(10 * time.Millisecond)
				}
				_, err = op.ForceRelease(ctx, target)
				require.NoError(t, err)
				select {
				case r := <-res:
					require.Equal(t, exitOK, r.code, r.stderr)
					assert.Contains(t, r.stdout, "generation 1 taken over after")
				case <-time.After(30 * time.Second):
					t.Fatal("stop -wait did not return within 30 s of the forced release")
				}
			})
		})
	}
}

// -timeout goes with -wait, and is positive.
func TestCommand_StopWaitUsage(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLite(t).DSN
	r := gl(t, dsn, "", "stop", "-yes", "-reason", "r", "-timeout", "1m", "t")
	assert.Equal(t, exitUsage, r.code, r.stderr)
	assert.Contains(t, r.stderr, "-timeout bounds -wait")
	r = gl(t, dsn, "", "stop", "-yes", "-reason", "r", "-wait", "-timeout", "0s", "t")
	assert.Equal(t, exitUsage, r.code, r.stderr)
	assert.Contains(t, r.stderr, "-timeout 0s")
}
