package gormlease

import "github.com/gormlease/gormlease/internal/wait"

// HasWatch reports whether callers of this process watch target's row in
// the default table, whatever the watch has read so far.
func HasWatch(target string) bool {
	return len(wait.Watches(defaultLeaseTable, target)) > 0
}
