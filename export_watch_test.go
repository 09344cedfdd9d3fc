package gormlease

// HasWatch reports whether callers of this process watch target's row in
// the default table, whatever the watch has read so far.
func HasWatch(target string) bool {
	hubs.Lock()
	defer hubs.Unlock()
	for _, h := range hubs.m {
		if h.watches[target] != nil && h.key.table == defaultLeaseTable {
			return true
		}
	}
	return false
}
