package slots

import "testing"

func TestSlotsBoundAllAndEachKey(t *testing.T) {
	var s Slots
	for i := range 2 {
		if !s.Take("a", 3, 2) {
			t.Fatalf("a's slot %d refused", i+1)
		}
	}
	if s.Take("a", 3, 2) {
		t.Fatal("a third slot of a, past its 2, taken")
	}
	if !s.Take("b", 3, 2) {
		t.Fatal("b's first slot refused while a was full")
	}
	if s.Take("c", 3, 2) || s.Take("", 3, 2) {
		t.Fatal("a slot past the 3 of all taken")
	}
	if s.all != 3 || s.keys["a"] != 2 {
		t.Fatalf("taken %d in all, %d of a; want 3 and 2", s.all, s.keys["a"])
	}
	s.Give("a")
	if !s.Take("", 3, 2) {
		t.Fatal("a slot of no key refused after one was given back")
	}
	s.Give("")
	s.Give("a")
	s.Give("b")
	if s.all != 0 || s.keys["a"] != 0 || len(s.keys) != 0 {
		t.Fatalf("after every slot given back: %d in all, %d of a, %d keys kept", s.all, s.keys["a"], len(s.keys))
	}
	for range 10 {
		if !s.Take("k", 0, 10) {
			t.Fatal("with no bound on all, a key's slot within its own bound refused")
		}
	}
}
