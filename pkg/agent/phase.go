package agent

import (
	"hash/fnv"
	"slices"
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
	uids     []string  // the scheduled pods, sorted: a stable order
	at       time.Time // their next scrape (zero: none scheduled)
}

// newPhaser schedules every pod at phase of interval.
func newPhaser(interval, phase time.Duration) *phaser {
	return &phaser{interval: interval, phase: phase}
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

// sync makes the scheduled pods exactly uids. The pods that stay keep their
// time; when none was scheduled, the next phase instant after now is.
// Every pod shares the node's phase, so one time serves them all.
func (p *phaser) sync(uids []string, now time.Time) {
	p.uids = append(p.uids[:0], uids...)
	slices.Sort(p.uids)
	switch {
	case len(p.uids) == 0:
		p.at = time.Time{}
	case p.at.IsZero():
		p.at = nextAt(now, p.interval, p.phase)
	}
}

// next is the time of the next scrape; false when no pod is scheduled.
func (p *phaser) next() (time.Time, bool) { return p.at, !p.at.IsZero() }

// due calls fn for every pod when their time has come and schedules the
// next phase instant after now: a time missed (a stalled process, a slow
// loop) is scraped once, never in a burst.
//
// The schedule is wall-clock time (the phase is pinned to the epoch): a
// clock stepped back (chrony, a VM resumed) left the next time as far in
// the future as the step, and the node's pods unscraped that long. A next
// time more than an interval away is scheduled again from now.
func (p *phaser) due(now time.Time, fn func(uid string)) {
	if !p.at.IsZero() && p.at.Sub(now) > p.interval {
		p.at = nextAt(now, p.interval, p.phase)
	}
	if p.at.IsZero() || p.at.After(now) {
		return
	}
	for _, uid := range p.uids {
		fn(uid)
	}
	p.at = nextAt(now, p.interval, p.phase)
}
