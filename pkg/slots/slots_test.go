package slots

import (
	"slices"
	"strings"
	"testing"
)

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
	if all, a := s.Held("a"); all != 3 || a != 2 {
		t.Fatalf("held %d in all, %d of a; want 3 and 2", all, a)
	}
	if _, c := s.Held("c"); c != 0 || len(s.keys) != 2 {
		t.Fatalf("held %d of c, refused, and %d keys; want 0 and 2", c, len(s.keys))
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

// TestShareTakesTheKeysInTurn: past n, each key's items (in cmp's order)
// are taken a turn at a time, keys sorted, and a key run out takes no more
// turns; within n the items are as they were.
func TestShareTakesTheKeysInTurn(t *testing.T) {
	type item struct{ key, name string }
	items := []item{{"b", "b2"}, {"a", "a3"}, {"b", "b1"}, {"a", "a1"}, {"c", "c1"}, {"a", "a2"}, {"a", "a4"}}
	key := func(i item) string { return i.key }
	cmp := func(x, y item) int { return strings.Compare(x.name, y.name) }
	var got []string
	for _, i := range Share(items, 6, key, cmp) {
		got = append(got, i.name)
	}
	if want := []string{"a1", "b1", "c1", "a2", "b2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("Share of 6: %v, want %v", got, want)
	}
	if all := Share(items, 7, key, cmp); !slices.Equal(all, items) {
		t.Fatalf("within n: %v, want the items as they were", all)
	}
	if none := Share(items, 0, key, cmp); len(none) != 0 {
		t.Fatalf("n 0: %v", none)
	}
}
