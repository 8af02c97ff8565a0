package agent

import (
	"container/heap"
	"hash/fnv"
	"time"
)

// phaser schedules pods at a fixed phase of the scrape interval, pinned to
// absolute time as Prometheus pins its targets' offsets (scrape/target.go,
// Target.offset), so that one pod's samples are exactly an interval apart
// and stay so across agent restarts. The phase is the node's (a hash of its
// name): nodes are spread over the interval, and a node's pods are scraped
// together, so the agent wakes once per interval. Spreading a node's pods
// over the interval as well woke it once per pod and cost 2.5 times the CPU
// (docs/performance.md) for no gain: each pod is its own server.
type phaser struct {
	interval time.Duration
	phase    time.Duration
	slots    map[string]*slot // by UID
	queue    slotQueue
}

type slot struct {
	uid   string
	phase time.Duration
	at    time.Time // the next scrape
	index int       // in queue; -1 once removed
}

// newPhaser schedules every pod at phase of interval.
func newPhaser(interval, phase time.Duration) *phaser {
	return &phaser{interval: interval, phase: phase, slots: map[string]*slot{}}
}

// phaseOf is name's offset within the interval.
func phaseOf(name string, interval time.Duration) time.Duration {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return time.Duration(h.Sum64() % uint64(interval))
}

// nextAt is the first instant after now at phase of interval, counted from
// the Unix epoch.
func nextAt(now time.Time, interval, phase time.Duration) time.Time {
	n := now.UnixNano()
	base := n - n%int64(interval) + int64(phase)
	if base <= n {
		base += int64(interval)
	}
	return time.Unix(0, base)
}

// sync makes the scheduled pods exactly uids: new ones get their next phase
// instant after now, gone ones are dropped, the rest keep their times.
func (p *phaser) sync(uids []string, now time.Time) {
	keep := make(map[string]bool, len(uids))
	for _, uid := range uids {
		keep[uid] = true
		if _, ok := p.slots[uid]; ok {
			continue
		}
		s := &slot{uid: uid, phase: p.phase, at: nextAt(now, p.interval, p.phase)}
		p.slots[uid] = s
		heap.Push(&p.queue, s)
	}
	for uid, s := range p.slots {
		if !keep[uid] {
			heap.Remove(&p.queue, s.index)
			delete(p.slots, uid)
		}
	}
}

// next is the time of the earliest scheduled scrape; false when none is.
func (p *phaser) next() (time.Time, bool) {
	if len(p.queue) == 0 {
		return time.Time{}, false
	}
	return p.queue[0].at, true
}

// due calls fn for every pod whose time has come and schedules each at its
// next phase instant after now: a pod whose time was missed (a stalled
// process, a slow loop) is scraped once, never in a burst.
func (p *phaser) due(now time.Time, fn func(uid string)) {
	for len(p.queue) > 0 && !p.queue[0].at.After(now) {
		s := p.queue[0]
		fn(s.uid)
		s.at = nextAt(now, p.interval, s.phase)
		heap.Fix(&p.queue, 0)
	}
}

// slotQueue is a min-heap of slots by time, then UID (a stable order for
// pods that share a phase).
type slotQueue []*slot

func (q slotQueue) Len() int { return len(q) }
func (q slotQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].uid < q[j].uid
}
func (q slotQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *slotQueue) Push(x any) {
	s := x.(*slot)
	s.index = len(*q)
	*q = append(*q, s)
}
func (q *slotQueue) Pop() any {
	old := *q
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.index = -1
	*q = old[:len(old)-1]
	return s
}
