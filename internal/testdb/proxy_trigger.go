package testdb

import (
	"bytes"
	"testing"
)

// trigger is a pending BlackholeOn.
type trigger struct {
	needle  []byte
	deliver bool
	tripped chan struct{}
}

// BlackholeOn arms the proxy to blackhole itself (as Blackhole does) as soon
// as a client sends a chunk that contains needle, compared without regard to
// ASCII case. With deliver set, that chunk still reaches the server and only
// what follows is withheld: the server acts on it, but its answer is lost.
// Without, the chunk itself is withheld too. The returned channel is closed
// when the trigger trips. It trips once; Restore ends the blackhole.
func (p *Proxy) BlackholeOn(needle string, deliver bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = &trigger{needle: bytes.ToLower([]byte(needle)), deliver: deliver, tripped: make(chan struct{})}
	return p.trigger.tripped
}

// tripLocked blackholes the proxy when chunk, from a client, trips the
// armed trigger, and reports whether chunk itself still goes through.
// p.mu is held.
func (p *Proxy) tripLocked(chunk []byte) bool {
	t := p.trigger
	if t == nil || !bytes.Contains(bytes.ToLower(chunk), t.needle) {
		return false
	}
	p.trigger = nil
	p.blocked = true
	close(t.tripped)
	return t.deliver
}

// Disarm takes back a BlackholeOn that has not tripped; its channel is
// never closed. It does not end a blackhole: Restore does.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = nil
}

// rewrite is a pending RewriteOn.
type rewrite struct {
	old, new  []byte
	rewritten chan struct{}
}

// RewriteOn arms the proxy to replace old with new, byte for byte, in the
// first chunk a client sends that contains old (compared exactly): the
// server reads new in its place. new must be as long as old, so that the
// lengths that frame the protocol's messages still hold. The returned
// channel is closed once the chunk was rewritten; it rewrites once.
func (p *Proxy) RewriteOn(tb testing.TB, old, new string) <-chan struct{} {
	tb.Helper()
	if len(old) != len(new) || old == "" {
		tb.Fatalf("proxy: rewrite of %q needs a replacement of %d bytes, not %q", old, len(old), new)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rewrite = &rewrite{old: []byte(old), new: []byte(new), rewritten: make(chan struct{})}
	return p.rewrite.rewritten
}

// rewriteLocked applies the armed rewrite to chunk, from a client, in
// place, if chunk contains its text. p.mu is held.
func (p *Proxy) rewriteLocked(chunk []byte) {
	r := p.rewrite
	if r == nil {
		return
	}
	i := bytes.Index(chunk, r.old)
	if i < 0 {
		return
	}
	copy(chunk[i:], r.new)
	p.rewrite = nil
	close(r.rewritten)
}
