package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowestPort is the lowest port that freePort hands out.
const lowestPort = 10000

// freePort returns a port on 127.0.0.1 that nothing listens on, chosen at
// random below the kernel's range of ephemeral ports, as internal/testdb
// chooses those of its own servers: a port from that range could be taken
// by an outgoing connection before the container's server listens on it.
func freePort() (int, error) {
	high := ephemeralLow()
	for range 1000 {
		p := lowestPort + rand.IntN(high-lowestPort)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // in use
		}
		ln.Close()
		return p, nil
	}
	return 0, fmt.Errorf("no free port on 127.0.0.1 between %d and %d", lowestPort, high)
}

// ephemeralLow is the lowest port of the kernel's range for outgoing
// connections (Linux's own default when it cannot be read).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	if low < lowestPort+1000 {
		low = lowestPort + 1000
	}
	return low
}
