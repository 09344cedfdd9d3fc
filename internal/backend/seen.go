package backend

import "sync"

// SeenLimit bounds how many targets a Seen set remembers in each of its
// two generations.
const SeenLimit = 4096

// Seen is the set of targets whose rows a Backend has seen exist, each with
// whether the last acquire of it found it held: a hint that picks the
// acquire's statement, never a fact that a guarantee rests on (a Prune in
// another process may delete a row it holds, another holder may take it).
// It is bounded in two generations: when the current one is full it
// becomes the old one, and the old one is dropped, so that the targets
// acquired again and again stay in it while those acquired once fall out.
type Seen struct {
	mu       sync.Mutex
	cur, old map[string]bool
}

// Get reports whether target's row was seen to exist, and whether its last
// acquire found it held.
func (s *Seen) Get(target string) (held, seen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, ok := s.cur[target]; ok {
		return held, true
	}
	held, seen = s.old[target]
	return held, seen
}

// Has reports whether target's row was seen to exist.
func (s *Seen) Has(target string) bool {
	_, seen := s.Get(target)
	return seen
}

// Add records that target's row exists, and whether an acquire found it
// held.
func (s *Seen) Add(target string, held bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cur[target]; !ok && (s.cur == nil || len(s.cur) >= SeenLimit) {
		s.old, s.cur = s.cur, make(map[string]bool, 64)
	}
	s.cur[target] = held
}

// Drop records that target's row was found gone.
func (s *Seen) Drop(target string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cur, target)
	delete(s.old, target)
}
