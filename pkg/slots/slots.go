// Package slots counts what is under way — answers, streams — in all and
// per key (a namespace, a node), each bounded, so that one key cannot take
// every slot.
package slots

import (
	"maps"
	"slices"
	"sync"
)

// Slots counts the slots taken; its zero value has none taken.
type Slots struct {
	mu   sync.Mutex
	all  int
	keys map[string]int
}

// Take takes a slot of all (at most all; 0: no bound) and, for a key that
// is not empty, one of key's (at most perKey); false, nothing taken, when
// either is full.
func (s *Slots) Take(key string, all, perKey int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if all > 0 && s.all >= all || key != "" && s.keys[key] >= perKey {
		return false
	}
	s.all++
	if key != "" {
		if s.keys == nil {
			s.keys = map[string]int{}
		}
		s.keys[key]++
	}
	return true
}

// Held is the slots taken in all, and for key.
func (s *Slots) Held(key string) (all, ofKey int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all, s.keys[key]
}

// Give gives back a slot Take took for key.
func (s *Slots) Give(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all--
	if key != "" {
		if s.keys[key]--; s.keys[key] <= 0 {
			delete(s.keys, key)
		}
	}
}

// Share is at most n of items, shared fairly among their keys: the keys
// in turn (sorted), each key's items in the order cmp gives; items as they
// are when they are n or fewer. One key's many items (a tenant's pods,
// its ScaledObjects) take no more than their turn of another's.
func Share[T any](items []T, n int, key func(T) string, cmp func(a, b T) int) []T {
	if len(items) <= n {
		return items
	}
	byKey := map[string][]T{}
	for _, it := range items {
		byKey[key(it)] = append(byKey[key(it)], it)
	}
	keys := slices.Sorted(maps.Keys(byKey))
	for _, k := range keys {
		slices.SortFunc(byKey[k], cmp)
	}
	out := make([]T, 0, max(n, 0))
	for i := 0; len(out) < n && len(keys) > 0; i++ {
		left := keys[:0] // the keys with an item past i
		for _, k := range keys {
			if len(out) == n {
				break
			}
			out = append(out, byKey[k][i])
			if i+1 < len(byKey[k]) {
				left = append(left, k)
			}
		}
		keys = left
	}
	return out
}
