package testdb

import (
	"fmt"
	"net"
	"time"
)

// Refuse closes every open connection and stops listening, so that new
// connections are refused (ECONNREFUSED), as a server that is down or a
// pooler that turns clients away would, until Admit.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.refusing = true
	p.mu.Unlock()
	ln.Close()
	p.Cut()
}

// Admit listens again on the proxy's address after Refuse. It fails when
// the address cannot be had back within a few seconds (another socket took
// the port meanwhile).
func (p *Proxy) Admit() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.refusing || p.closed {
		return nil
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.ln, p.refusing = ln, false
			p.wg.Add(1)
			go p.accept(ln)
			return nil
		}
	}
	return fmt.Errorf("proxy: listen on %s again: %w", p.addr, err)
}
