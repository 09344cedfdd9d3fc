package gormlease_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// appName returns an application_name unique to t, by which its pool's
// backends can be found in pg_stat_activity (at most 63 bytes).
func appName(t *testing.T) string {
	name := fmt.Sprintf("gl%d_%s", targetSeq.Add(1), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if len(name) > 60 {
		name = name[:60]
	}
	return name
}

// backends returns the pids of app's backends that match the extra condition.
func backends(t *testing.T, db *gorm.DB, app, cond string) []int64 {
	t.Helper()
	var pids []int64
	q := "SELECT pid FROM pg_stat_activity WHERE application_name = ?"
	if cond != "" {
		q += " AND " + cond
	}
	if err := db.Raw(q, app).Scan(&pids).Error; err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return pids
}

// waitBackendLockWait waits until one of app's backends waits for a lock, and
// returns its pid.
func waitBackendLockWait(t *testing.T, db *gorm.DB, app string) int64 {
	t.Helper()
	var pid int64
	waitFor(t, 10*time.Second, app+" to wait on a lock", func() bool {
		pids := backends(t, db, app, "wait_event_type = 'Lock'")
		if len(pids) == 0 {
			return false
		}
		pid = pids[0]
		return true
	})
	return pid
}

// terminate kills backend pid with pg_terminate_backend.
func terminate(t *testing.T, db *gorm.DB, pid int64) {
	t.Helper()
	var ok bool
	if err := db.Raw("SELECT pg_terminate_backend(?)", pid).Scan(&ok).Error; err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

// soak reports whether GORMLEASE_SOAK is set: the long settings of the
// reliability suite (see docs/reliability.md) instead of the short ones that
// plain go test runs.
func soak() bool { return os.Getenv("GORMLEASE_SOAK") != "" }

// soakOr returns short, or long under GORMLEASE_SOAK.
func soakOr(short, long int) int {
	if soak() {
		return long
	}
	return short
}
