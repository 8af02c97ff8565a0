// Package slots counts what is under way — answers, streams — in all and
// per key (a namespace, a node), each bounded, so that one key cannot take
// every slot.
package slots

import "sync"

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
