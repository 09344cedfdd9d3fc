package testdb

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowestPort is the lowest port that FreePort and freePorts hand out.
const lowestPort = 10000

// FreePort returns a port on 127.0.0.1 that nothing listens on, chosen as
// freePorts chooses them: at random below the kernel's range of ephemeral
// ports. tests/dockerpass gives such ports to its containers' servers.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// freePorts returns n distinct ports on 127.0.0.1 that nothing listens on.
//
// They are chosen at random below the kernel's range of ephemeral ports, not
// by listening on port 0: a port from that range can be handed out again at
// once (one cluster got the same port for two of its listeners), and an
// outgoing connection can take it while its server is down, so that a node
// that a test kills could not start again on its own ports. Each chosen port
// is held open until all n are chosen, so that no two are the same.
func freePorts(n int) ([]int, error) {
	high := ephemeralLow()
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d free ports on 127.0.0.1 between %d and %d", n, lowestPort, high)
		}
		p := lowestPort + rand.IntN(high-lowestPort)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // in use
		}
		held = append(held, ln)
		ports = append(ports, p)
	}
	return ports, nil
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
