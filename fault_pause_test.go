package gormlease_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The paused-holder test re-runs this test binary as a child process, in a
// helper mode chosen by these environment variables.
const (
	pausedModeEnv   = "GORMLEASE_HELPER_MODE" // "runner" or "repository"
	pausedDSNEnv    = "GORMLEASE_HELPER_DSN"
	pausedTargetEnv = "GORMLEASE_HELPER_TARGET"
	pauseTimeout    = time.Second // the child's lease timeout
)

// Fault: Kleppmann's process pause. A child process holds the lease and is
// frozen with SIGSTOP; its lease expires on the database's clock and this
// process takes the target over; the child is resumed with SIGCONT and
// carries on as if it still held the lease. It must neither save nor change
// the new holder's lease. With the Runner, the child's work ignores its
// context and returns a result; with the Repository, the child goes straight
// to CommitIfOwner and Release after the pause.
func TestFault_PausedHolder(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	direct := s.DB(t)
	for _, mode := range []string{"runner", "repository"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			target := newTarget(t)
			child := startHelper(t, direct, s.Addr, mode, target)
			line := child.expect(t, "ACQUIRED")
			oldGen, err := strconv.ParseInt(line, 10, 64)
			require.NoError(t, err)

			require.NoError(t, child.cmd.Process.Signal(syscall.SIGSTOP))
			other := newRepository(t, direct)
			var newLease gormlease.Lease
			waitFor(t, 10*time.Second, "the frozen holder's lease to expire", func() bool {
				l, err := other.Acquire(context.Background(), target, pauseTimeout)
				newLease = l
				return err == nil
			})
			require.Greater(t, newLease.Generation, oldGen)
			taken := leaseRow(t, direct, target)
			// Let the child go on as soon as it runs again, then wake it.
			_, err = io.WriteString(child.stdin, "go\n")
			require.NoError(t, err)
			require.NoError(t, child.cmd.Process.Signal(syscall.SIGCONT))

			outcome := child.expect(t, "DONE")
			require.NoError(t, child.wait(), "child process")
			assert.NotContains(t, child.lines(), "SAVER", "the paused holder's saver ran")
			// Every step the paused holder tried reports the loss.
			steps := map[string]int{"runner": 1, "repository": 3}[mode]
			assert.Equal(t, steps, strings.Count(outcome, "lease lost"), "steps told of the loss: %s", outcome)
			assert.Zero(t, countRows(t, direct, &gormlease.JobResult{}, target), "the paused holder saved")
			row := leaseRow(t, direct, target)
			assert.Equal(t, taken.LeaseToken, row.LeaseToken, "the new holder's token changed")
			assert.Equal(t, taken.UpdatedAt, row.UpdatedAt, "the paused holder renewed the new holder's lease")
			assert.Nil(t, row.ReleasedAt, "the paused holder released the new holder's lease")
			require.NoError(t, other.Release(context.Background(), newLease))
		})
	}
}

// helper is a child process of this test binary in a helper mode.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   chan string
	seen  []string
}

// startHelper starts the child on the same database and schema as db.
func startHelper(t *testing.T, db *gorm.DB, addr, mode, target string) *helper {
	t.Helper()
	var where struct{ User, Database, Schema string }
	require.NoError(t, db.Raw("SELECT current_user AS user, current_database() AS database, current_schema() AS schema").
		Scan(&where).Error)
	host, port, _ := strings.Cut(addr, ":")
	dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s search_path=%s sslmode=disable",
		host, port, where.User, where.Database, where.Schema)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPausedHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), pausedModeEnv+"="+mode, pausedDSNEnv+"="+dsn, pausedTargetEnv+"="+target)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	h := &helper{cmd: cmd, stdin: stdin, out: make(chan string, 64)}
	go func() {
		defer close(h.out)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "HELPER "); ok {
				h.out <- line
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// expect waits for the child's line that starts with word, and returns the
// rest of it.
func (h *helper) expect(t *testing.T, word string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-h.out:
			if !ok {
				t.Fatalf("the child ended without saying %s (said %q)", word, h.seen)
			}
			h.seen = append(h.seen, line)
			if rest, found := strings.CutPrefix(line, word); found {
				return strings.TrimSpace(rest)
			}
		case <-deadline:
			t.Fatalf("timed out waiting for the child to say %s (said %q)", word, h.seen)
		}
	}
}

// wait drains the child's output and waits for it to exit.
func (h *helper) wait() error {
	for line := range h.out {
		h.seen = append(h.seen, line)
	}
	return h.cmd.Wait()
}

func (h *helper) lines() string { return strings.Join(h.seen, "\n") }

// TestHelperPausedHolder is the child side of TestFault_PausedHolder. It
// does nothing unless the helper environment variables are set.
func TestHelperPausedHolder(t *testing.T) {
	mode := os.Getenv(pausedModeEnv)
	if mode == "" {
		return // not a child: nothing to do, and nothing to skip
	}
	db, err := gorm.Open(postgres.Open(os.Getenv(pausedDSNEnv)),
		&gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	require.NoError(t, err)
	defer func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	}()
	target := os.Getenv(pausedTargetEnv)
	say := func(format string, args ...any) { fmt.Printf("HELPER "+format+"\n", args...) }
	stdin := bufio.NewReader(os.Stdin)
	waitForGo := func() { _, _ = stdin.ReadString('\n') }
	save := func(tx *gorm.DB, v string) error {
		say("SAVER")
		return gormlease.SaveJSON(tx, v)
	}
	ctx := context.Background()
	switch mode {
	case "runner":
		r, err := gormlease.NewRunner[string](db,
			gormlease.WithHeartbeatInterval(100*time.Millisecond), gormlease.WithLeaseTimeout(pauseTimeout))
		require.NoError(t, err)
		_, err = r.Run(ctx, target, func(ctx context.Context) (string, error) {
			l, _ := gormlease.LeaseFromContext(ctx)
			say("ACQUIRED %d", l.Generation)
			waitForGo() // frozen here by the parent; ignores ctx
			return "stale result", nil
		}, save)
		say("DONE %v", err)
	case "repository":
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		l, err := repo.Acquire(ctx, target, pauseTimeout)
		require.NoError(t, err)
		say("ACQUIRED %d", l.Generation)
		waitForGo() // frozen here by the parent
		commitErr := repo.CommitIfOwner(ctx, l, func(tx *gorm.DB) error { return save(tx, "stale result") })
		releaseErr := repo.Release(ctx, l)
		hbErr := repo.Heartbeat(ctx, l)
		say("DONE commit: %v; release: %v; heartbeat: %v", commitErr, releaseErr, hbErr)
	}
}
