package agent

import (
	"sync"

	"github.com/pulse-io/pulse/pkg/discovery"
)

// catalogue assigns each target a small id for the wire and versions the set.
type catalogue struct {
	mu      sync.Mutex
	entries map[string]*entry // by uid
	free    []uint32
	next    uint32
	version uint64
	changed chan struct{}
	// known is closed at the first Set: the node's pods have been listed.
	known     chan struct{}
	knownOnce sync.Once
}

type entry struct {
	id     uint32
	target discovery.Target
}

func newCatalogue() *catalogue {
	return &catalogue{entries: map[string]*entry{}, next: 1, changed: make(chan struct{}), known: make(chan struct{})}
}

// Set replaces the targets. Ids of pods that stay are kept; ids of removed
// pods are reused, which keeps ids small: the streams diff by id and uid, so
// a reused id is sent as a removal plus an upsert.
func (c *catalogue) Set(targets []discovery.Target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.knownOnce.Do(func() { close(c.known) })
	changed := false
	keep := make(map[string]bool, len(targets))
	for _, t := range targets {
		keep[t.UID] = true
	}
	for uid, e := range c.entries {
		if !keep[uid] {
			c.free = append(c.free, e.id)
			delete(c.entries, uid)
			changed = true
		}
	}
	for _, t := range targets {
		if e, ok := c.entries[t.UID]; ok {
			if !e.target.Equal(t) {
				e.target = t
				changed = true
			}
			continue
		}
		id := c.next
		if n := len(c.free); n > 0 {
			id, c.free = c.free[n-1], c.free[:n-1]
		} else {
			c.next++
		}
		c.entries[t.UID] = &entry{id: id, target: t}
		changed = true
	}
	if changed {
		c.version++
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// snapshot returns the version, a copy of the entries by id, and a channel
// closed at the next change.
func (c *catalogue) snapshot() (uint64, map[uint32]discovery.Target, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint32]discovery.Target, len(c.entries))
	for _, e := range c.entries {
		out[e.id] = e.target
	}
	return c.version, out, c.changed
}
