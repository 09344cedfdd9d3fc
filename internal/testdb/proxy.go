package testdb

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a database server, for fault tests: it can
// blackhole traffic (keep connections open and deliver nothing), delay it,
// rewrite what a client sends, and cut every connection.
type Proxy struct {
	ln     net.Listener // replaced by Admit after Refuse; under mu
	addr   string
	target string

	mu       sync.Mutex
	cond     *sync.Cond
	blocked  bool
	closed   bool
	refusing bool // see Refuse
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	trigger  *trigger         // see BlackholeOn
	rewrite  *rewrite         // see RewriteOn
	delay    [2]time.Duration // see SetDelay; [1] is towards the server
}

// NewProxy starts a proxy to target ("host:port") on a free loopback port.
// It is closed when tb ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept(ln)
	tb.Cleanup(p.Close)
	return p
}

// Addr is the address that clients connect to.
func (p *Proxy) Addr() string { return p.addr }

// Blackhole withholds all traffic, both ways, on every connection, old and
// new, until Restore. Connections stay open.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
}

// Restore delivers traffic again, including what was withheld.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.blocked = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// SetDelay delays every byte that the proxy receives from now on, on every
// connection, old and new: by toServer on its way from the client to the
// server, by toClient on its way back. Each chunk is held for the delay
// from the moment it arrived, not from when the one before it left, so a
// delay adds latency without lowering throughput, as a long link would.
// Nothing is closed or lost. Zero delays turn it off.
func (p *Proxy) SetDelay(toServer, toClient time.Duration) {
	p.mu.Lock()
	p.delay = [2]time.Duration{toClient, toServer}
	p.mu.Unlock()
}

// Cut closes every open connection; new ones are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy, closes its connections and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.blocked = false
	p.cond.Broadcast()
	ln := p.ln
	p.mu.Unlock()
	ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(client, server, true)
		go p.pipe(server, client, false)
	}
}

// track registers a connection pair, or closes it when the proxy is closed.
func (p *Proxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		a.Close()
		b.Close()
		return false
	}
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
	return true
}

// chunk is what the proxy read in one go, and when it may be delivered.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies from src to dst: it reads on its own goroutine, so that each
// chunk's delay counts from its arrival, and holds each chunk while the
// proxy is blocked. toServer says that src is the client.
func (p *Proxy) pipe(src, dst net.Conn, toServer bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	chunks := make(chan chunk, 64)
	done := make(chan struct{})
	defer close(done)
	p.wg.Add(1)
	go p.read(src, toServer, chunks, done)
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-done:
			}
			t.Stop()
		}
		p.mu.Lock()
		if toServer {
			p.rewriteLocked(c.data)
		}
		passes := toServer && p.tripLocked(c.data)
		for p.blocked && !p.closed && !passes {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if _, werr := dst.Write(c.data); werr != nil {
			return
		}
	}
}

// read reads src into chunks, each stamped with the time it may be
// delivered, until src fails (io.EOF or a closed connection: the pair is
// done) or pipe has returned (done).
func (p *Proxy) read(src net.Conn, toServer bool, chunks chan<- chunk, done <-chan struct{}) {
	defer p.wg.Done()
	defer close(chunks)
	dir := 0
	if toServer {
		dir = 1
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			due := time.Now().Add(p.delay[dir])
			p.mu.Unlock()
			select {
			case chunks <- chunk{data: append([]byte(nil), buf[:n]...), due: due}:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}
