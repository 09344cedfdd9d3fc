package testdb

import (
	"bytes"
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
