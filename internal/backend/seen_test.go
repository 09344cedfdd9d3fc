package backend

import (
	"strconv"
	"testing"
)

func TestSeen_RemembersAndForgets(t *testing.T) {
	var s Seen
	if s.Has("a") {
		t.Fatal("an empty set has a")
	}
	s.Add("a", true)
	if held, ok := s.Get("a"); !ok || !held {
		t.Fatal("a was added held, not found so")
	}
	s.Add("a", false)
	if held, ok := s.Get("a"); !ok || held {
		t.Fatal("a was added free, not found so")
	}
	if !s.Has("a") {
		t.Fatal("a was added, not found")
	}
	s.Drop("a")
	if s.Has("a") {
		t.Fatal("a was dropped, still found")
	}
}

// The set stays within two generations of SeenLimit targets, and a target
// added in the generation before the current one is still found.
func TestSeen_Bounded(t *testing.T) {
	var s Seen
	s.Add("first", false)
	for i := range SeenLimit - 1 {
		s.Add(strconv.Itoa(i), false)
	}
	s.Add("next", false) // the first generation is full: it becomes the old one
	if !s.Has("first") || !s.Has("next") {
		t.Fatal("a target of the last two generations was forgotten")
	}
	for i := range SeenLimit {
		s.Add("x"+strconv.Itoa(i), false)
	}
	if s.Has("first") {
		t.Fatal("a target two generations old is still there")
	}
	if n := len(s.cur) + len(s.old); n > 2*SeenLimit {
		t.Fatalf("%d targets held, more than %d", n, 2*SeenLimit)
	}
}
