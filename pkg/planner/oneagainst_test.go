package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
)

// Tests of one replica against its fleet: a replica slower than the
// others, one whose counters contradict its histogram, one wedged (found
// in a review of the planner's safety, 2026-12-06, sixteenth session).

// fleetOf is f replicas sharing work w, healthy; with slow, one of them a
// throttled GPU that serves 500 a second with a queue standing and its
// queue time past the break in every window.
func fleetOf(f int, w float64, slow bool) []store.PodLoad {
	var pods []store.PodLoad
	if slow {
		s := serving("slow", 500, 1)
		s.FirstTokens = 0.5 // 15 first tokens a window: evidence, not thin
		s.Waiting, s.WaitingNow = 3, 3
		pods = append(pods, s)
		w -= 500
		f--
	}
	for i := range f {
		pods = append(pods, serving(string(rune('a'+i)), w/float64(f), 0.01))
	}
	return pods
}

// learnedAt10000 is the state of a workload whose six replicas broke at
// 10,000 a second for 20 minutes, and the time after.
func learnedAt10000(t *testing.T) (State, time.Time) {
	t.Helper()
	var pods []store.PodLoad
	for i := range 6 {
		pods = append(pods, serving(string(rune('a'+i)), 10000, 1))
	}
	_, st, at := run(t, State{}, Default(0), t0, 20*time.Minute, pods...)
	if st.Capacity != 10000 {
		t.Fatalf("learned %v, want 10000", st.Capacity)
	}
	return st, at
}

// TestAReplicaSlowerThanItsFleetIsNoBreakOfTheCapacity: a break below
// what another replica proved within the SLO at the same observation is
// that replica's slowness, not the fleet's capacity (rule 2). A steady
// 40,000 a second on replicas that broke at 10,000, one of them slow (500
// a second past its capacity in every window), with an HPA applying the
// plan every 5 minutes up to 50: learned from, the slow replica's breaks
// pulled the capacity to what the healthy ones served, the plan asked for
// a quarter more each time, and the fleet was at 50 within three hours.
func TestAReplicaSlowerThanItsFleetIsNoBreakOfTheCapacity(t *testing.T) {
	cfg := Default(0)
	st, at := learnedAt10000(t)
	f := 6
	var p Plan
	for range 48 { // 4 hours
		p, st, at = run(t, st, cfg, at, 5*time.Minute, fleetOf(f, 40000, true)...)
		f = min(max(p.Replicas, 1), 50)
	}
	// 40,000 at 0.8 of 10,000 is 5 replicas; the slow one is a sixth.
	if f > 7 || st.Capacity < 9000 {
		t.Fatalf("a steady 40,000/s, one replica slow: the fleet went to %d (capacity %.0f, plan %d: %s), want 6 or 7", f, st.Capacity, p.Replicas, p.Reason)
	}
	// A break at what the healthy replicas serve, or above, is learned:
	// the fleet's replicas past capacity together.
	st, at = learnedAt10000(t)
	all := fleetOf(6, 6*6000, false)
	for i := range all {
		all[i] = serving(all[i].Name, 6000, 1)
	}
	_, st, _ = run(t, st, cfg, at, 5*time.Minute, all...)
	if st.Capacity > 6500 {
		t.Fatalf("every replica past capacity at 6,000/s for 5 minutes: capacity %.0f, want it learned near 6000", st.Capacity)
	}
}

// TestFirstTokensPastTheTokensAreRefused: each request that has its first
// token prefilled one prompt token at least and generated one, so a window
// with more first tokens than tokens has a TTFT histogram its counters
// contradict: refused as a liar (rule 8). Believed, one pod's 100,000
// first tokens a second against 10,000 tokens drew the mean work a
// request from 1,000 to 0.4 in 20 minutes, and four replicas with 200
// requests waiting each, queues growing, were planned as 5, not 12.
func TestFirstTokensPastTheTokensAreRefused(t *testing.T) {
	cfg := Default(0)
	fleet := func(liar, queued bool) []store.PodLoad {
		pods := fleetOf(4, 40000, false)
		if liar {
			pods[3].FirstTokens = 1e5
		}
		for i := range pods {
			if queued {
				pods[i].QueueTime, pods[i].TTFT = 1, 1.1
				pods[i].Waiting, pods[i].WaitingNow, pods[i].WaitingGrowth = 150, 200, 5
			}
		}
		return pods
	}
	var plans [2]Plan
	for i, liar := range []bool{false, true} {
		_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, fleet(liar, false)...)
		p, _, err := Make(snap(at, fleet(liar, true)...), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		plans[i] = p
	}
	if plans[1].Replicas < plans[0].Replicas || plans[1].WorkPerRequest != plans[0].WorkPerRequest {
		t.Fatalf("one pod's first tokens past its tokens: %d replicas at %.3g work a request, against %d at %.3g without it",
			plans[1].Replicas, plans[1].WorkPerRequest, plans[0].Replicas, plans[0].WorkPerRequest)
	}
	if plans[1].Refused != 1 || !strings.Contains(plans[1].RefusedWhy, "past its") {
		t.Fatalf("refused %d (%q), want the one pod named", plans[1].Refused, plans[1].RefusedWhy)
	}
	// A mean that falls moves no faster than one that rises: a window's
	// requests of one token each (possible) move it a twentieth at most.
	st := State{WorkPerRequest: 1000}
	st.learnWorkPerRequest(1000, 1000)
	if st.WorkPerRequest < 950 {
		t.Fatalf("one window at 1 work a request moved the mean from 1000 to %.0f, want 950 at the least", st.WorkPerRequest)
	}
}

// TestAWedgedReplicasQueueIsNoDrainOfTheFleet: a replica whose queue
// stands through its window while it runs and serves nothing (an engine
// stuck, its page answering) has a queue no count of replicas drains, so
// the per-replica drain (rule 4) leaves it out. Four replicas carry
// 32,000 a second on a capacity of 10,000; planned for, a fifth's 500
// requests held the plan at 7 for as long as they stood.
func TestAWedgedReplicasQueueIsNoDrainOfTheFleet(t *testing.T) {
	cfg := Default(0)
	st, at := learnedAt10000(t)
	pods := fleetOf(4, 32000, false)
	wedge := store.PodLoad{Name: "wedged", State: store.PodCounted, Tokens: true, Span: 30 * time.Second,
		Waiting: 500, WaitingNow: 500, KVCache: 0.1}
	without, _, _ := run(t, st, cfg, at, time.Hour, pods...)
	with, _, _ := run(t, st, cfg, at, time.Hour, append(pods, wedge)...)
	if with.Replicas > without.Replicas+1 || with.DrainNeed > without.Need+1 {
		t.Fatalf("an hour of a wedged replica's 500 waiting: plan %d (drain %.2f: %s), against %d without it", with.Replicas, with.DrainNeed, with.Reason, without.Replicas)
	}
	// The same queue at a replica that serves, or runs a request whose
	// first token has not come in its window (a long prompt's prefill),
	// is drained by the fleet: it is planned for.
	busy, prefilling := wedge, wedge
	busy.Running, busy.PromptTokens, busy.FirstTokens = 4, 2000, 2
	prefilling.Running = 1
	for _, l := range []store.PodLoad{busy, prefilling} {
		drained, _, _ := run(t, st, cfg, at, time.Minute, append(pods, l)...)
		if drained.DrainNeed <= without.Need+1 {
			t.Fatalf("500 waiting at a replica running %v, serving %v: drain %.2f against a need of %.2f without it, want it planned",
				l.Running, l.PromptTokens, drained.DrainNeed, without.Need)
		}
	}
}
