package planner

import (
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
	// Four of six replicas swamped (more preemptions than first tokens;
	// vLLM counts no recompute, so 5,000 a second shown) beside two
	// healthy at 6,000, under a capacity of 10,000 learned on a lighter
	// mix: the fleet past its capacity, not one replica against it. The
	// capacity comes down (kept at 10,000 for the hour, the plan 5, when
	// any healthy replica's proof stopped every break; found in a review).
	st, at = learnedAt10000(t)
	var mixed []store.PodLoad
	for i := range 6 {
		l := serving(string(rune('a'+i)), 6000, 0.01)
		if i < 4 {
			l = serving(l.Name, 5000, 1)
			l.Preemptions = 10 // past its 5 first tokens a second
			l.Waiting, l.WaitingNow = 20, 20
		}
		mixed = append(mixed, l)
	}
	p, st, _ = run(t, st, cfg, at, time.Hour, mixed...)
	if st.Capacity > 7000 || p.Replicas < 6 {
		t.Fatalf("an hour of 4 of 6 replicas swamped at 5,000/s beside 2 healthy at 6,000/s under a capacity of 10,000: capacity %.0f, plan %d (%s)", st.Capacity, p.Replicas, p.Reason)
	}
	// Three replicas draining a burst's queue while the fleet has room
	// (two new ones healthy beside) are no fleet past its capacity: the
	// slow replica's breaks stay its own. Counted past capacity, they let
	// them pull the capacity from 10,000 to 2,618, and the fleet went to
	// 15 for 30,000/s (found in a third review).
	st, at = learnedAt10000(t)
	var drain []store.PodLoad
	for _, n := range []string{"a", "b", "c"} {
		l := serving(n, 4000, 1)
		l.Waiting, l.WaitingNow, l.WaitingGrowth = 30, 10, -1
		drain = append(drain, l)
	}
	drain = append(drain, serving("d", 3000, 0.01), serving("e", 3000, 0.01), fleetOf(1, 500, true)[0])
	p, st, at = run(t, st, cfg, at, 3*time.Minute, drain...)
	after, f := st.Capacity, p.Replicas
	for range 12 {
		p, st, at = run(t, st, cfg, at, 5*time.Minute, slowAndKnee10000(f, 30000)...)
		f = min(max(p.Replicas, 2), 50)
	}
	if after < 9000 || f > 6 {
		t.Fatalf("3 minutes of a drain beside one slow replica: capacity %.0f after it, %.0f an hour later; the fleet went to %d for 30,000/s (plan %d: %s), want 5 or 6",
			after, st.Capacity, f, p.Replicas, p.Reason)
	}
}

// slowAndKnee10000 is fleetOf's f replicas with one slow, the others
// past their capacity (queued 1 s, 20 waiting) beyond 10,000 a second.
func slowAndKnee10000(f int, w float64) []store.PodLoad {
	pods := fleetOf(f, w, true)
	for i := range pods[1:] {
		if l := &pods[1+i]; l.PromptTokens > 10000 {
			*l = serving(l.Name, 10000, 1)
			l.Waiting, l.WaitingNow = 20, 20
		}
	}
	return pods
}

// TestFirstTokensPastTheTokensTeachNoMeanWork: each request that has its
// first token prefilled one prompt token at least and generated one, so a
// window with more first tokens than tokens has counters that lag its
// TTFT histogram (SGLang counts a request's tokens when it finishes) or
// contradict it: it teaches no mean work a request, and is planned
// otherwise (rule 4). Taken into the mean, one pod's 100,000 first tokens
// a second against 10,000 tokens drew it from 1,000 to 0.4 in 20 minutes,
// and four replicas with 200 requests waiting each, queues growing, were
// planned as 5, not 12.
func TestFirstTokensPastTheTokensTeachNoMeanWork(t *testing.T) {
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
	if plans[1].Replicas < plans[0].Replicas || plans[1].WorkPerRequest != plans[0].WorkPerRequest || plans[1].Refused != 0 {
		t.Fatalf("one pod's first tokens past its tokens: %d replicas at %.3g work a request (%d refused), against %d at %.3g without it",
			plans[1].Replicas, plans[1].WorkPerRequest, plans[1].Refused, plans[0].Replicas, plans[0].WorkPerRequest)
	}
	// A mean that falls moves no faster than one that rises: a window's
	// requests of one token each (possible) move it a twentieth at most.
	st := State{WorkPerRequest: 1000}
	st.learnWorkPerRequest(1000, 1000)
	if st.WorkPerRequest < 950 {
		t.Fatalf("one window at 1 work a request moved the mean from 1000 to %.0f, want 950 at the least", st.WorkPerRequest)
	}
	// SGLang's burst: a one-replica workload that knows its capacity
	// (10,000 a second at 1,000 a request) gets 30 requests their first
	// token, none finished (no token counted yet), 170 waiting: its queue
	// is planned (refused, the workload was Unavailable until a request
	// finished; found in a review).
	_, known, at := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 10000, 1))
	burst := store.PodLoad{Name: "a", State: store.PodCounted, Tokens: true, Span: 30 * time.Second,
		FirstTokens: 1, TTFT: 3, TTFTOK: true, QueueTime: 2.5, QueueOK: true,
		Running: 30, Waiting: 120, WaitingNow: 170, WaitingGrowth: 5, KVCache: 0.5}
	p, _, err := Make(snap(at, burst), known, cfg)
	if err != nil || p.Replicas < 2 {
		t.Fatalf("a burst's first window on SGLang (30 first tokens, none finished, 170 waiting): plan %d (%s), %v; want the queue planned", p.Replicas, p.Reason, err)
	}
	// Nor does such a window teach the capacity, with an earlier short
	// request's 15 tokens counted in it: taken as a break at them, it
	// pulled a capacity of 10,000 to 97 within a minute; at a start, it
	// was learned at 0.5 with no mean work a request, and the queue was
	// planned as none (found in a third review).
	burst.PromptTokens = 0.5
	_, after, _ := run(t, known, cfg, at, time.Minute, burst)
	if after.Capacity < 9000 {
		t.Fatalf("a minute of a lagging window after 10,000 was learned: capacity %.0f", after.Capacity)
	}
	p, first, _ := run(t, State{}, cfg, t0, time.Minute, burst)
	if first.Capacity > 0 && first.WorkPerRequest == 0 || p.Replicas < 2 || p.Need < 10 {
		t.Fatalf("a lagging window at a start (15 tokens counted, 30 first tokens, 170 waiting): capacity %.3g at %.3g work a request, need %.2f, plan %d (%s)",
			first.Capacity, first.WorkPerRequest, p.Need, p.Replicas, p.Reason)
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
	// A replica just ready behind a long prompt's prefill (its running
	// gauge 0 at its first sample, 1 since: 0.67 on average, over 10 s),
	// or one whose page has no running gauge: not judged wedged (a mean
	// below 1 was, found in a review).
	busy, prefilling, justReady, justListed, ungauged := wedge, wedge, wedge, wedge, wedge
	busy.Running, busy.PromptTokens, busy.FirstTokens = 4, 2000, 2
	prefilling.Running = 1
	justReady.Running, justReady.Span = 0.67, 10*time.Second
	justListed.Span = 10 * time.Second // a third of its fleet's window
	ungauged.NoRunning = true
	for _, l := range []store.PodLoad{busy, prefilling, justReady, justListed, ungauged} {
		drained, _, _ := run(t, st, cfg, at, time.Minute, append(pods, l)...)
		if drained.DrainNeed <= without.Need+1 {
			t.Fatalf("500 waiting at a replica running %v (no gauge: %v), serving %v over %v: drain %.2f against a need of %.2f without it, want it planned",
				l.Running, l.NoRunning, l.PromptTokens, l.Span, drained.DrainNeed, without.Need)
		}
	}
}
