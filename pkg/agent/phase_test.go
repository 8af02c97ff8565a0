package agent

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// run drives p from start to end in steps of step, as the scrape loop does,
// and returns each pod's scrape times.
func run(p *phaser, start, end time.Time, step time.Duration) map[string][]time.Time {
	got := map[string][]time.Time{}
	for now := start; !now.After(end); now = now.Add(step) {
		p.due(now, func(uid string) { got[uid] = append(got[uid], now) })
	}
	return got
}

func uids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("2f9c1d3e-%04d-4b1a-9c55-7d0e8a6b%04d", i, i)
	}
	return out
}

// TestEachPodIsScrapedAtTheNodesFixedPhase: every pod's scrapes are exactly
// an interval apart, at the node's phase, pinned to absolute time; the
// node's pods are scraped together.
func TestEachPodIsScrapedAtTheNodesFixedPhase(t *testing.T) {
	const interval = time.Second
	start := time.Unix(1_800_000_000, 123_000_000)
	phase := phaseOf("gpu-node-7", interval)
	p := newPhaser(interval, phase)
	pods := uids(8)
	p.sync(pods, start)
	got := run(p, start, start.Add(30*time.Second), time.Millisecond)
	for _, uid := range pods {
		ts := got[uid]
		if len(ts) < 29 || len(ts) > 31 {
			t.Fatalf("%s scraped %d times in 30 intervals", uid, len(ts))
		}
		for i := 1; i < len(ts); i++ {
			if d := ts[i].Sub(ts[i-1]); d != interval {
				t.Fatalf("%s: scrapes %d and %d are %v apart, want %v", uid, i-1, i, d, interval)
			}
		}
		// The loop wakes on the millisecond grid here: the first wake at or
		// after the phase instant.
		if ph := time.Duration(ts[0].UnixNano() % int64(interval)); ph < phase || ph-phase >= time.Millisecond {
			t.Errorf("%s scraped at phase %v, want %v", uid, ph, phase)
		}
		if !slices.Equal(ts, got[pods[0]]) {
			t.Errorf("%s and %s were not scraped together", uid, pods[0])
		}
	}
}

// TestNodesSpreadOverTheInterval: the nodes' agents do not all scrape (and
// report) in one instant. 64 nodes over 1s: every tenth of the interval
// holds some and none holds more than a quarter of them.
func TestNodesSpreadOverTheInterval(t *testing.T) {
	const interval = time.Second
	var bins [10]int
	for i := range 64 {
		bins[phaseOf(fmt.Sprintf("aks-gpu-%d-vmss%06d", i%3, i), interval)*10/interval]++
	}
	for i, n := range bins {
		if n == 0 || n > 16 {
			t.Errorf("tenth %d of the interval holds %d of 64 nodes: %v", i, n, bins)
		}
	}
}

// TestSyncKeepsPhasesAndDropsGonePods: a change of the pod set moves no pod
// that stays; a pod that goes is never scraped again; one that comes is
// scraped from its next phase instant.
func TestSyncKeepsPhasesAndDropsGonePods(t *testing.T) {
	const interval = time.Second
	start := time.Unix(1_800_000_000, 0)
	pods := uids(3)
	p := newPhaser(interval, 250*time.Millisecond)
	p.sync(pods[:2], start)
	before := run(p, start, start.Add(5*time.Second), time.Millisecond)

	mid := start.Add(5*time.Second + time.Millisecond)
	p.sync(pods[1:], mid) // pods[0] goes, pods[2] comes
	after := run(p, mid, mid.Add(5*time.Second), time.Millisecond)

	if n := len(after[pods[0]]); n != 0 {
		t.Errorf("a removed pod was scraped %d more times", n)
	}
	kept := append(before[pods[1]], after[pods[1]]...)
	for i := 1; i < len(kept); i++ {
		if d := kept[i].Sub(kept[i-1]); d != interval {
			t.Fatalf("the kept pod's scrapes %d and %d are %v apart across the change", i-1, i, d)
		}
	}
	if n := len(after[pods[2]]); n < 4 || n > 6 {
		t.Errorf("the new pod was scraped %d times in 5 intervals", n)
	}
}

// TestLateLoopScrapesOnceNotInABurst: a loop that wakes 3.5 intervals late
// scrapes each pod once, then returns to the pod's phase.
func TestLateLoopScrapesOnceNotInABurst(t *testing.T) {
	const interval = time.Second
	start := time.Unix(1_800_000_000, 0)
	uid := uids(1)[0]
	const phase = 700 * time.Millisecond
	p := newPhaser(interval, phase)
	p.sync([]string{uid}, start)
	late := start.Add(3*interval + interval/2)
	var calls []time.Time
	p.due(late, func(string) { calls = append(calls, late) })
	if len(calls) != 1 {
		t.Fatalf("%d scrapes after a stall, want 1", len(calls))
	}
	at, ok := p.next()
	if !ok || !at.After(late) || at.Sub(late) > interval || time.Duration(at.UnixNano()%int64(interval)) != phase {
		t.Fatalf("next scrape at %v (phase %v), want the phase %v after %v", at, time.Duration(at.UnixNano()%int64(interval)), phase, late)
	}
}

// TestAClockSteppedBackKeepsScraping: the schedule is wall-clock time, and
// a clock stepped back ten minutes (chrony, a VM resumed) left the next
// scrape ten minutes away: no pod of the node was scraped meanwhile. A next
// time more than an interval away is scheduled again from now, at the
// node's phase.
func TestAClockSteppedBackKeepsScraping(t *testing.T) {
	const interval, phase = time.Second, 300 * time.Millisecond
	start := time.Unix(1_800_000_000, 0)
	p := newPhaser(interval, phase)
	p.sync(uids(2), start)
	var scraped int
	p.due(start.Add(interval), func(string) { scraped++ })
	if scraped != 2 {
		t.Fatalf("%d scrapes at the first phase, want 2", scraped)
	}
	back := start.Add(-10 * time.Minute)
	p.due(back, func(string) { scraped++ })
	at, ok := p.next()
	if !ok || at.Sub(back) > interval || !at.After(back) || time.Duration(at.UnixNano()%int64(interval)) != phase {
		t.Fatalf("after a step back of 10m the next scrape is at %v, %v after now; want within an interval, at the phase", at, at.Sub(back))
	}
	p.due(at, func(string) { scraped++ })
	if scraped != 4 {
		t.Fatalf("%d scrapes, want the 2 pods scraped again an interval after the step", scraped)
	}
}

func TestNextAt(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		now   time.Duration
		phase time.Duration
		want  time.Duration
	}{
		{0, 300 * time.Millisecond, 300 * time.Millisecond},
		{300 * time.Millisecond, 300 * time.Millisecond, 1300 * time.Millisecond}, // strictly after now
		{900 * time.Millisecond, 300 * time.Millisecond, 1300 * time.Millisecond},
		{900 * time.Millisecond, 0, time.Second},
	} {
		if got := nextAt(base.Add(c.now), time.Second, c.phase).Sub(base); got != c.want {
			t.Errorf("nextAt(+%v, phase %v) = +%v, want +%v", c.now, c.phase, got, c.want)
		}
	}
}
