// Package procstat reads the CPU time of processes from /proc, for the
// benchmarks that charge the server's CPU to the client that caused it.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU returns the user and system time of process pid so far, from
// /proc/pid/stat, or 0 when it cannot be read (the process ended, or the
// system has no /proc).
func CPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
