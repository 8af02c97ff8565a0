package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
)

var t0 = time.Unix(1_700_000_000, 0)

// serving is a ready replica serving w work per second (all prompt tokens)
// with the given mean queue time.
func serving(name string, w, queue float64) store.PodLoad {
	return store.PodLoad{Name: name, State: store.PodCounted, PromptTokens: w, Tokens: true, FirstTokens: w / 1000, Span: 30 * time.Second,
		TTFT: queue + 0.1, TTFTOK: true, QueueTime: queue, QueueOK: true, KVCache: w / 1e5}
}

func snap(at time.Time, pods ...store.PodLoad) Input {
	return Input{At: at, Found: len(pods) > 0, Pods: pods}
}

// run feeds the planner the same pods every 5 s for d, from at.
func run(t *testing.T, st State, cfg Config, at time.Time, d time.Duration, pods ...store.PodLoad) (Plan, State, time.Time) {
	t.Helper()
	var p Plan
	var err error
	for end := at.Add(d); !at.After(end); at = at.Add(5 * time.Second) {
		if p, st, err = Make(snap(at, pods...), st, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return p, st, at
}

func TestBreakTeachesCapacityAndScalesUpAtOnce(t *testing.T) {
	cfg := Default(0)
	// One replica serving 10000/s with requests queued 1 s (half the SLO):
	// it is past its capacity, which is then about 10000/s.
	p, st, err := Make(snap(t0, serving("a", 10000, 1)), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity != 10000 || st.Breaks != 1 {
		t.Fatalf("capacity %v breaks %d, want 10000 and 1", st.Capacity, st.Breaks)
	}
	// Work 10000 at utilisation 0.8 of 10000: 1.25 replicas: 2, at once.
	if p.Replicas != 2 || p.Need < 1.24 || p.Need > 1.26 {
		t.Fatalf("plan %d (need %.2f), want 2 (1.25): %s", p.Replicas, p.Need, p.Reason)
	}
}

func TestHealthyThroughputProvesCapacity(t *testing.T) {
	cfg := Default(0)
	p, st, err := Make(snap(t0, serving("a", 8000, 0.01)), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 - 1/(1+0.1); p.Observations != 1 || math.Abs(p.Confidence-want) > 1e-12 {
		t.Fatalf("one observation: %d, confidence %v; want 1 and %v", p.Observations, p.Confidence, want)
	}
	// 8000 a second proven by 240 first tokens (30 s of 8 a second): less
	// one standard error of the window's work, √(2/240).
	if want := 8000 * (1 - math.Sqrt(2.0/240)); st.Capacity != 8000 || math.Abs(st.HealthyMax-want) > 1e-9 || st.Breaks != 0 {
		t.Fatalf("capacity %v, healthy max %v, breaks %d: want 8000, %v, 0", st.Capacity, st.HealthyMax, st.Breaks, want)
	}
	// A later break at 7500 pulls the capacity toward it (one above is
	// held until another replica's corroborates it, or it is shown for
	// longer than its window: TestABreakProvesNoMoreThanTheFleetCorroborates).
	p, st, _ = Make(snap(t0.Add(5*time.Second), serving("a", 7500, 2)), st, cfg)
	if want := 8000 - learnRate*500; st.Capacity != want || st.BreakCapacity != 7500 {
		t.Fatalf("capacity %v, break capacity %v, want %v and 7500", st.Capacity, st.BreakCapacity, want)
	}
	// The plan shows the proof and the breaks' level (/debug/triggers).
	if p.Proven != st.HealthyMax || p.Broke != 7500 || p.Proven < 0.999*proof(8000, 240) {
		t.Fatalf("plan: proven %v, broke at %v; want the state's %v and 7500", p.Proven, p.Broke, st.HealthyMax)
	}
	// Confidence grows with the observations: 2 of them, then 121.
	if want := 1 - 1/(1+0.2); math.Abs(p.Confidence-want) > 1e-12 {
		t.Fatalf("two observations: confidence %v, want %v", p.Confidence, want)
	}
	if p, _, _ = run(t, st, cfg, t0.Add(10*time.Second), 10*time.Minute, serving("a", 8000, 0.01)); p.Observations != 123 || p.Confidence < 0.92 {
		t.Fatalf("10 minutes more: %d observations, confidence %v; want 123 and above 0.92", p.Observations, p.Confidence)
	}
	// A replica that preempted broke, whatever its queue time.
	preempting := serving("a", 9000, 0.01)
	preempting.Preemptions = 0.5
	if _, st, _ = Make(snap(t0.Add(time.Hour), preempting), st, cfg); st.Breaks != 2 {
		t.Fatalf("a window with preemptions: %d breaks, want 2", st.Breaks)
	}
}

// TestTheProofOfCapacityFadesWithTime: the most a replica served within
// the SLO fades by half in about an hour of time, not of observations: a
// workload unobserved for two hours (at zero, or its agent lost) comes
// back with a quarter of its proof, as one observed all along would. It
// faded only at an observation, so two hours unobserved kept it whole,
// and a changed mix of lengths was planned on the old floor for another
// hour.
func TestTheProofOfCapacityFadesWithTime(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 10000, 0.01))
	proven := proof(10000, 300)
	if st.HealthyMax < 0.99*proven {
		t.Fatalf("proven %v after a minute at 10000, want about %v", st.HealthyMax, proven)
	}
	_, observed, _ := run(t, st, cfg, at, 2*time.Hour, serving("a", 1000, 0.01))
	_, st, err := Make(snap(at.Add(2*time.Hour), serving("a", 1000, 0.01)), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := proven * math.Pow(healthyDecay, float64(2*time.Hour/cfg.ObserveEvery)); math.Abs(st.HealthyMax-want) > 0.01*want ||
		math.Abs(observed.HealthyMax-want) > 0.01*want {
		t.Fatalf("proven after two hours unobserved %.0f, observed every 5 s %.0f; want both %.0f (a quarter, about)", st.HealthyMax, observed.HealthyMax, want)
	}
}

func TestObservesAtMostOncePerInterval(t *testing.T) {
	cfg := Default(0)
	st := State{}
	var err error
	for i := range 10 {
		_, st, err = Make(snap(t0.Add(time.Duration(i)*100*time.Millisecond), serving("a", 10000, 1)), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
	}
	if st.Breaks != 1 {
		t.Fatalf("ten evaluations within a second made %d observations, want 1", st.Breaks)
	}
}

func TestPeakHeldForLeadTimeThenReleased(t *testing.T) {
	cfg := Default(0)
	// Learn: two replicas at capacity 10000.
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 8000, 0.01), serving("b", 8000, 0.01))
	// A peak of 4 replicas' work, then the load falls to 1 replica's.
	p, st, at := run(t, st, cfg, at, 30*time.Second, serving("a", 16000, 0.01), serving("b", 16000, 0.01))
	peak := p.Replicas
	p, st, at = run(t, st, cfg, at, 2*time.Minute, serving("a", 2000, 0.01), serving("b", 2000, 0.01))
	if p.Replicas != peak || p.HeldUntil.IsZero() || !strings.Contains(p.Reason, "holding a peak") {
		t.Fatalf("2 min after a peak of %d: plan %d (%s), want the peak held", peak, p.Replicas, p.Reason)
	}
	// The hold is the assumed lead time (no startup seen) and the margin,
	// from the peak, 2 to 2½ minutes ago.
	hold := cfg.LeadTime + cfg.HoldMargin + p.HoldExtra
	if left := p.HeldUntil.Sub(at); left > hold-2*time.Minute || left < hold-2*time.Minute-35*time.Second {
		t.Fatalf("held until %s, %s from now; want the hold %s from the peak", p.HeldUntil, left, hold)
	}
	p, _, _ = run(t, st, cfg, at, cfg.LeadTime+cfg.HoldMargin+p.HoldExtra, serving("a", 2000, 0.01), serving("b", 2000, 0.01))
	if p.Replicas >= peak || p.Replicas < 1 {
		t.Fatalf("after the hold: plan %d, want fewer than the peak's %d and at least 1", p.Replicas, peak)
	}
}

func TestLeadTimeLearnedFromStartups(t *testing.T) {
	cfg := Default(0)
	ready := serving("a", 1000, 0.01)
	ready.Startup, ready.Age = 3*time.Minute, 4*time.Minute
	p, st, err := Make(snap(t0, ready), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.LeadTime != 3*time.Minute || p.Startups != 1 {
		t.Fatalf("lead time %s from %d startups, want 3m0s from 1", p.LeadTime, p.Startups)
	}
	// The same pod seen again is not counted again; a second one is.
	other := serving("b", 1000, 0.01)
	other.Startup, other.Age = 5*time.Minute, 5*time.Minute
	ready.Age += 5 * time.Second
	p, _, _ = Make(snap(t0.Add(5*time.Second), ready, other), st, cfg)
	if p.Startups != 2 || p.LeadTime != 3*time.Minute+30*time.Second {
		t.Fatalf("lead time %s from %d startups, want 3m30s from 2", p.LeadTime, p.Startups)
	}
}

// TestAStartupListedLateIsCounted: the newest ready time counted was the
// mark, so a pod listed a snapshot after one ready later than it (its
// agent's report a few seconds behind) never had its startup counted. It
// is counted once, as is the one before it; and a pod made again under a
// name counted before is another startup.
func TestAStartupListedLateIsCounted(t *testing.T) {
	cfg := Default(0)
	late := serving("a", 1000, 0.01)
	late.Startup, late.Age = 2*time.Minute, 2*time.Minute+3*time.Second // ready 3 s ago
	early := serving("b", 1000, 0.01)
	early.Startup, early.Age = 4*time.Minute, 4*time.Minute+time.Second // ready 1 s ago
	p, st, err := Make(snap(t0, early), State{}, cfg)
	if err != nil || p.Startups != 1 {
		t.Fatalf("the first pod listed: %d startups (%v), want 1", p.Startups, err)
	}
	at := t0.Add(5 * time.Second)
	late.Age += 5 * time.Second
	early.Age += 5 * time.Second
	p, st, _ = Make(snap(at, early, late), st, cfg)
	if p.Startups != 2 {
		t.Fatalf("the pod listed a snapshot late, ready before the one counted: %d startups, want 2", p.Startups)
	}
	at = at.Add(5 * time.Second)
	late.Age += 5 * time.Second
	early.Age += 5 * time.Second
	p, st, _ = Make(snap(at, early, late), st, cfg)
	if p.Startups != 2 {
		t.Fatalf("the same two seen again: %d startups, want 2", p.Startups)
	}
	again := serving("a", 1000, 0.01)
	again.Startup, again.Age = time.Minute, time.Minute
	early.Age += 5 * time.Second
	p, _, _ = Make(snap(at.Add(5*time.Second), early, again), st, cfg)
	if p.Startups != 3 {
		t.Fatalf("a pod made again under a name counted: %d startups, want 3", p.Startups)
	}
}

func TestStartingReplicasAreCapacityComing(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	before, _, _ := Make(snap(at, serving("a", 10000, 1)), st, cfg)
	// While the replicas it asked for start, the overloaded replica's
	// queue grows: the plan does not grow with it (no cascade).
	for i := range 48 { // 4 minutes
		a := serving("a", 10000, 1)
		a.WaitingNow, a.WaitingGrowth = float64(10*i), 2
		age := time.Duration(i) * 5 * time.Second
		starting := []store.PodLoad{{Name: "b", State: store.PodStarting, Age: age}, {Name: "c", State: store.PodStarting, Age: age}}
		p, next, err := Make(snap(at, append([]store.PodLoad{a}, starting...)...), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Replicas > max(before.Replicas, 3) {
			t.Fatalf("%d queued while 2 replicas start: plan %d, was %d (%s)", 10*i, p.Replicas, before.Replicas, p.Reason)
		}
		st, at = next, at.Add(5*time.Second)
	}
}

func TestNeverBelowReadyBeforeHoldAfterRestart(t *testing.T) {
	cfg := Default(0)
	// A fresh state (the aggregator restarted) sees four idle replicas: it
	// holds them until it has watched for a hold.
	pods := []store.PodLoad{serving("a", 0, 0), serving("b", 0, 0), serving("c", 0, 0), serving("d", 0, 0)}
	p, st, at := run(t, State{}, cfg, t0, 5*time.Minute, pods...)
	if p.Replicas != 4 {
		t.Fatalf("5 min after a restart, four idle replicas planned %d (%s), want 4", p.Replicas, p.Reason)
	}
	p, _, _ = run(t, st, cfg, at, 2*time.Minute, pods...)
	if p.Replicas != 0 {
		t.Fatalf("after the hold, idle replicas planned %d (%s), want 0", p.Replicas, p.Reason)
	}
}

func TestStaleAndLostAreErrorsMissingPodsHold(t *testing.T) {
	cfg := Default(0)
	missing := store.PodLoad{Name: "a", State: store.PodMissing, Reason: "stale"}
	if _, _, err := Make(snap(t0, missing), State{}, cfg); !errors.Is(err, ErrStale) {
		t.Fatalf("only a stale replica: error %v, want ErrStale", err)
	}
	lost := Input{At: t0, LostOK: true, Lost: store.Lost{At: t0, Pods: 3}}
	if _, _, err := Make(lost, State{}, cfg); !errors.Is(err, ErrLost) {
		t.Fatalf("lost replicas: error %v, want ErrLost", err)
	}
	if _, _, err := Make(Input{At: t0}, State{}, cfg); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no replica: error %v, want ErrNotFound", err)
	}
	// One replica of three stale, long after any restart, with no load:
	// the ready count is held.
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("b", 0, 0), serving("c", 0, 0))
	p, _, err := Make(snap(at, missing, serving("b", 0, 0), serving("c", 0, 0)), st, cfg)
	if err != nil || p.Replicas != 3 || p.Missing != 1 {
		t.Fatalf("one of three replicas stale: plan %d, missing %d, %v (%s); want 3, 1", p.Replicas, p.Missing, err, p.Reason)
	}
}

// A replica that served and lost its readiness is no replica starting:
// every one of them unready is an error, never a plan of no work, and one
// of them neither lengthens the lead time nor counts as capacity coming.
func TestReplicasReadyBeforeAndNotNowAreHeldNotStarting(t *testing.T) {
	cfg := Default(0)
	busy := []store.PodLoad{serving("a", 10000, 1), serving("b", 10000, 1), serving("c", 10000, 1), serving("d", 10000, 1)}
	before, st, at := run(t, State{}, cfg, t0, 20*time.Minute, busy...)
	unready := func(name string) store.PodLoad {
		return store.PodLoad{Name: name, State: store.PodStarting, Unready: true, Age: 50 * time.Minute}
	}
	all := []store.PodLoad{unready("a"), unready("b"), unready("c"), unready("d")}
	for range 120 { // 10 minutes, past the hold
		_, next, err := Make(snap(at, all...), st, cfg)
		if !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "4 of them ready before") {
			t.Fatalf("every replica ready before and not now: error %v, want ErrStale naming them", err)
		}
		st, at = next, at.Add(5*time.Second)
	}
	p, next, err := Make(snap(at, unready("a"), busy[1], busy[2], busy[3]), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Starting != 0 || p.Unready != 1 || p.Missing != 1 || p.Ready != 4 || p.Replicas < before.Replicas {
		t.Fatalf("one of four ready before and not now: plan %d (was %d), ready %d, missing %d, unready %d, starting %d (%s); want it held as ready and missing",
			p.Replicas, before.Replicas, p.Ready, p.Missing, p.Unready, p.Starting, p.Reason)
	}
	if lead := next.lead(cfg); lead >= 50*time.Minute {
		t.Fatalf("a replica unready 50 min after its creation set the lead time to %s", lead)
	}
	// Unready as long as a stuck start (crash-looping for good), it is
	// stuck: it holds the workload no longer.
	gone := unready("a")
	gone.UnreadyFor = 2 * time.Hour
	p, _, err = Make(snap(at, gone, busy[1], busy[2], busy[3]), st, cfg)
	if err != nil || p.Stuck != 1 || p.Unready != 0 || p.Ready != 3 || p.Missing != 0 {
		t.Fatalf("a replica unready for 2 h: ready %d, missing %d, unready %d, stuck %d, %v (%s); want it stuck",
			p.Ready, p.Missing, p.Unready, p.Stuck, err, p.Reason)
	}
}

// The hold after a restart counts from the first plan, not from errors:
// a workload answered ErrLost for longer than the hold, then back, is not
// planned below its ready replicas at its first observation.
func TestTheRestartHoldCountsFromTheFirstPlan(t *testing.T) {
	cfg := Default(0)
	st, at := State{}, t0
	lost := func(at time.Time) Input { return Input{At: at, LostOK: true, Lost: store.Lost{At: t0, Pods: 5}} }
	for range 360 { // 30 minutes
		_, next, err := Make(lost(at), st, cfg)
		if !errors.Is(err, ErrLost) {
			t.Fatalf("error %v, want ErrLost", err)
		}
		st, at = next, at.Add(5*time.Second)
	}
	p, _, err := Make(snap(at, serving("a", 40000, 0.01), serving("b", 10000, 0.01), serving("c", 10000, 0.01), serving("d", 10000, 0.01), serving("e", 10000, 0.01)), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas < 5 {
		t.Fatalf("after 30 min of errors, the first plan of 5 ready replicas is %d (%s); want them held for the hold", p.Replicas, p.Reason)
	}
}

// A TTFT percentile beyond the histogram's highest bound, that bound
// within the SLO (buckets that stop at 10 s, an SLO of 15 s), says nothing
// of the SLO: the means judge the replica, and a mean queue time past a
// quarter of the SLO is a break (the clamped 10 s had read as within it).
func TestAPercentileBeyondTheBucketsIsNoProofOfHealth(t *testing.T) {
	cfg := Default(15 * time.Second)
	cfg.Percentile = 0.9
	l := serving("a", 10000, 5) // a mean queue time of 5 s: past 15 s / 4
	l.Waiting, l.TTFTQuantile, l.TTFTQuantileOK, l.TTFTQuantileBeyond = 3, 10, true, true
	if broke, _ := health(&l, cfg, false); !broke {
		t.Fatal("a p90 beyond the 10 s buckets, a mean queue time of 5 s: not a break")
	}
	// Within the buckets, the percentile judges as before.
	l.TTFTQuantileBeyond = false
	if broke, _ := health(&l, cfg, false); broke {
		t.Fatal("a p90 of 10 s, within a 15 s SLO and the buckets: a break")
	}
	// Beyond a bound at the SLO (buckets and SLO at 10 s): past it, a
	// queue standing and the means within it.
	at := Default(10 * time.Second)
	at.Percentile = 0.9
	l = serving("a", 10000, 0.1)
	l.Waiting, l.TTFTQuantile, l.TTFTQuantileOK, l.TTFTQuantileBeyond = 3, 10, true, true
	if broke, healthy := health(&l, at, false); !broke || healthy {
		t.Fatalf("a p90 beyond 10 s buckets, an SLO of 10 s, a queue: broke %v healthy %v; want a break", broke, healthy)
	}
}

func TestDemandWithNoReplicaNeedsOne(t *testing.T) {
	in := Input{At: t0, Demand: store.DemandValue{Sources: 1, Held: 3}}
	p, _, err := Make(in, State{}, Default(0))
	if err != nil || p.Replicas != 1 {
		t.Fatalf("3 requests held, no replica: plan %d, %v; want 1", p.Replicas, err)
	}
	in.Demand.Held = 0
	if p, _, err = Make(in, State{}, Default(0)); err != nil || p.Replicas != 0 {
		t.Fatalf("nothing held, no replica: plan %d, %v; want 0", p.Replicas, err)
	}
	// A workload scaled to zero still shows what it learned while it had
	// replicas: /debug/triggers showed capacity 0 and the default lead.
	// With requests waiting, the peak of its last minute (1.25 replicas)
	// is held as with replicas listed (a node drained of its replicas,
	// their replacements pending); past the hold, one replica.
	_, learned, _ := run(t, State{}, Default(0), t0, time.Minute, serving("a", 8000, 0.01))
	in.At, in.Demand.Held = t0.Add(2*time.Minute), 3
	p, _, err = Make(in, learned, Default(0))
	if err != nil || p.Replicas != 2 || p.Capacity != learned.Capacity || p.Capacity == 0 || p.Proven != learned.HealthyMax ||
		p.Observations != learned.Observations || p.Confidence == 0 || p.LeadTimeSeconds != DefaultLeadTime.Seconds() {
		t.Fatalf("no replica after a minute of one: plan %+v, %v; want the peak held (2) and the capacity learned (%v)", p, err, learned.Capacity)
	}
	in.At = t0.Add(time.Hour)
	if p, _, err = Make(in, learned, Default(0)); err != nil || p.Replicas != 1 {
		t.Fatalf("no replica, requests held, past the hold: plan %d, %v (%s); want 1", p.Replicas, err, p.Reason)
	}
}

// TestADrainedWorkloadKeepsItsPeakWhileRequestsWait: a node drained of
// every replica of a workload, their replacements pending (no agent lists
// them), and its requests waiting at the routers: the peaks held were
// dropped with the replicas, the plan was 1, and the HPA took the
// pending replacements back. The peak is held as with replicas listed.
func TestADrainedWorkloadKeepsItsPeakWhileRequestsWait(t *testing.T) {
	cfg := Default(0)
	before, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 0.01), serving("b", 10000, 0.01), serving("c", 10000, 0.01))
	p, _, err := Make(Input{At: at.Add(time.Minute), Demand: store.DemandValue{Sources: 1, Held: 40}}, st, cfg)
	if err != nil || p.Replicas < before.Replicas {
		t.Fatalf("drained, 40 requests waiting at the routers: plan %d, %v (%s); want the %d held", p.Replicas, err, p.Reason, before.Replicas)
	}
}

func TestKVCacheNeed(t *testing.T) {
	cfg := Default(0)
	a, b := serving("a", 1000, 0.01), serving("b", 1000, 0.01)
	a.KVCache, b.KVCache = 0.95, 0.85
	// 300 first tokens a window: the work's need 2.2 at most, under the
	// KV cache's.
	a.FirstTokens, b.FirstTokens = 10, 10
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, a, b)
	p, _, _ := Make(snap(at, a, b), st, cfg)
	// 1.8 replicas' worth of KV cache at target 0.8: 2.25, so 3.
	if p.Replicas != 3 || !strings.Contains(p.Reason, "KV cache") {
		t.Fatalf("KV cache 0.95 and 0.85: plan %d (%s), want 3 for the KV cache", p.Replicas, p.Reason)
	}
}

// TestAGaugeAbsentIsNotAZero: the snapshot gave a gauge absent from a
// replica's window as 0, so a replica whose page lost its queue gauge (or
// whose every value was refused) was planned as one with an empty queue,
// and judged healthy; one without a KV-cache gauge as an empty cache. A
// replica with no queue gauge is now refused (held, carrying the others'
// load); one with no KV-cache gauge carries the others' KV share (TGI's
// pages have none: then the KV need says nothing).
func TestAGaugeAbsentIsNotAZero(t *testing.T) {
	cfg := Default(0)
	a, b := serving("a", 1000, 0.01), serving("b", 1000, 0.01)
	a.KVCache, b.KVCache = 0.95, 0
	a.FirstTokens, b.FirstTokens = 10, 10 // as in TestKVCacheNeed
	b.NoKV = true
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, a, b)
	p, _, err := Make(snap(at, a, b), st, cfg)
	// b carries a's 0.95: 1.9 replicas' worth at target 0.8, so 3 (b
	// read as an empty cache gave 0.95/0.8: 2).
	if err != nil || p.Replicas != 3 || !strings.Contains(p.Reason, "KV cache") {
		t.Fatalf("b without a KV-cache gauge: plan %d (%s), %v; want 3 for the KV cache", p.Replicas, p.Reason, err)
	}

	quiet := serving("quiet", 1000, 0.01)
	quiet.NoWaiting = true
	p, _, err = Make(snap(at, serving("a", 1000, 0.01), quiet), st, cfg)
	if err != nil || p.Refused != 1 || p.Missing != 1 || !strings.Contains(p.RefusedWhy, "quiet: no requests-waiting gauge") || p.Replicas < 2 {
		t.Fatalf("a replica without a queue gauge: refused %d (%q), missing %d, plan %d, %v; want it refused, the plan at least the 2 ready",
			p.Refused, p.RefusedWhy, p.Missing, p.Replicas, err)
	}
	if _, _, err = Make(snap(at, quiet), st, cfg); !errors.Is(err, ErrStale) {
		t.Fatalf("the only replica without a queue gauge: %v, want ErrStale", err)
	}
}

// TestLoadWithoutTokenCountersKeepsTheReadyReplicas: a page with no token
// counters teaches no capacity, and its replicas' work reads 0; while they
// run requests the fallback never plans below the ready replicas (it
// judged the load by the work alone, and planned 4 replicas at 30 % of
// their KV cache down to 2).
func TestLoadWithoutTokenCountersKeepsTheReadyReplicas(t *testing.T) {
	cfg := Default(0)
	var pods []store.PodLoad
	for _, name := range []string{"a", "b", "c", "d"} {
		pods = append(pods, store.PodLoad{Name: name, State: store.PodCounted, Span: 30 * time.Second, Running: 5, KVCache: 0.3})
	}
	p, st, _ := run(t, State{}, cfg, t0, 10*time.Minute, pods...)
	if st.Capacity != 0 || p.Replicas != 4 {
		t.Fatalf("4 replicas running requests, no token counters, after 10 minutes: capacity %v, plan %d (%s); want none learned and the 4 held", st.Capacity, p.Replicas, p.Reason)
	}
	for i := range pods {
		pods[i].Running = 0
	}
	if p, _, _ = run(t, st, cfg, t0.Add(10*time.Minute), time.Minute, pods...); p.Replicas != 2 {
		t.Fatalf("idle, KV cache at 0.3 each: plan %d (%s), want 2 (1.2 replicas' worth of KV cache at 0.8)", p.Replicas, p.Reason)
	}
}

func TestProbeNeverPlansPastProvenThroughput(t *testing.T) {
	cfg := Default(0)
	// Healthy at 5000 each for an hour: probes raise the capacity to at
	// most 5000 / utilisation, and no further.
	_, st, _ := run(t, State{}, cfg, t0, time.Hour, serving("a", 5000, 0.01), serving("b", 5000, 0.01))
	if limit := st.HealthyMax / cfg.Utilisation; st.Capacity > limit+1e-9 || st.Capacity <= 5000 {
		t.Fatalf("capacity %v after an hour healthy at 5000: want above 5000 and at most %v", st.Capacity, limit)
	}
}

func TestRegretLengthensTheHold(t *testing.T) {
	cfg := Default(0)
	st := State{}
	busy := []store.PodLoad{serving("a", 8000, 0.01), serving("b", 8000, 0.01)}
	_, st, at := run(t, st, cfg, t0, 10*time.Minute, busy...)
	// Idle past the hold: released, and a replica goes (the minimum keeps
	// the other); busy again within a lead time: regret.
	p, st, at := run(t, st, cfg, at, cfg.LeadTime+cfg.HoldMargin+10*time.Second, serving("a", 0, 0), serving("b", 0, 0))
	if p.Replicas != 0 {
		t.Fatalf("idle past the hold: plan %d, want 0", p.Replicas)
	}
	_, st, at = run(t, st, cfg, at, 10*time.Second, serving("a", 0, 0))
	if st.HoldExtra != 0 {
		t.Fatalf("released: hold extension %s, want none yet", st.HoldExtra)
	}
	p, st, at = run(t, st, cfg, at, time.Minute, serving("a", 16000, 0.01))
	if p.Replicas < 2 || st.HoldExtra != cfg.LeadTime {
		t.Fatalf("the released replica needed again a minute after it went (plan %d): hold extension %s, want the lead time %s", p.Replicas, st.HoldExtra, cfg.LeadTime)
	}
	// The peak held says what its hold is made of, the extension included
	// (it named the lead time and the margin only).
	p, _, _ = run(t, st, cfg, at, 30*time.Second, serving("a", 0, 0), serving("b", 0, 0))
	if want := fmt.Sprintf("(a hold of %s: lead time and its deviations %s, margin %s, after regrets %s)", st.hold(cfg), cfg.LeadTime, cfg.HoldMargin, cfg.LeadTime); !strings.Contains(p.Reason, want) {
		t.Fatalf("reason %q, want it to hold %q", p.Reason, want)
	}
}

// TestTheWorkShownIsTheWorkPlanned: replicas without a fresh sample carry
// the fresh ones' mean work, in the plan and in what it shows (the plan
// was made on 4 replicas' work and said 2's).
func TestTheWorkShownIsTheWorkPlanned(t *testing.T) {
	cfg := Default(0)
	fresh := []store.PodLoad{serving("a", 1000, 0.01), serving("b", 1000, 0.01)}
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, append(fresh, serving("c", 1000, 0.01), serving("d", 1000, 0.01))...)
	missing := store.PodLoad{Name: "c", State: store.PodMissing, Reason: "stale"}
	p, _, err := Make(snap(at, append(fresh, missing, missing)...), st, cfg)
	if err != nil || p.Work != 4000 || !strings.Contains(p.Reason, "work 4000/s") {
		t.Fatalf("2 fresh replicas at 1000/s and 2 missing: work %v (%s), %v; want 4000 shown as planned", p.Work, p.Reason, err)
	}
}

// A plan that falls and comes back while no replica went released nothing:
// KEDA's stream has the planner evaluated about once a second, and a need
// seen at one evaluation and not the next, or a plan below the HPA's
// minimum, removes no replica. Counted a regret, each doubled the hold.
func TestADipThatReleasedNothingIsNoRegret(t *testing.T) {
	cfg := Default(0)
	busy := []store.PodLoad{serving("a", 8000, 0.01), serving("b", 8000, 0.01)}
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, busy...)
	p, st, at := run(t, st, cfg, at, cfg.LeadTime+cfg.HoldMargin+10*time.Second, serving("a", 0, 0), serving("b", 0, 0))
	if p.Replicas != 0 {
		t.Fatalf("idle past the hold: plan %d, want 0", p.Replicas)
	}
	p, st, _ = run(t, st, cfg, at, time.Minute, busy...)
	if p.Replicas < 2 || st.HoldExtra != 0 {
		t.Fatalf("planned %d again with both replicas still there: hold extension %s, want none", p.Replicas, st.HoldExtra)
	}
}

// A replica lost while the plan still wanted it (a node drained, a
// rollout's pod replaced) is no release of the plan's: asking its count
// again is no regret.
func TestALostReplicaIsNoRelease(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 8000, 0.01), serving("b", 8000, 0.01))
	p, st, _ := run(t, st, cfg, at, time.Minute, serving("a", 16000, 0.01))
	if p.Replicas < 2 || st.released != 0 || st.HoldExtra != 0 {
		t.Fatalf("plan %d after b went while planned: released %d, hold extension %s, want none", p.Replicas, st.released, st.HoldExtra)
	}
}

// A replica that has been starting past stuckAfter is still listed (the
// HPA counts it): it turning stuck releases nothing.
func TestAReplicaTurningStuckIsNoRelease(t *testing.T) {
	cfg := Default(0)
	a := serving("a", 8000, 0.01)
	starting := store.PodLoad{Name: "b", State: store.PodStarting, Age: stuckAfter - time.Minute}
	_, st, at := run(t, State{}, cfg, t0, time.Minute, a, starting)
	starting.Age = stuckAfter + time.Minute
	p, st, _ := run(t, st, cfg, at, time.Minute, a, starting)
	if p.Stuck != 1 || st.released != 0 || st.HoldExtra != 0 {
		t.Fatalf("stuck %d, released %d, hold extension %s: a replica turning stuck went nowhere", p.Stuck, st.released, st.HoldExtra)
	}
}

func TestMakeDoesNotModifyPrev(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 8000, 0.01))
	n, proven := len(st.peaks), st.HealthyMax
	if _, _, err := Make(snap(at, serving("a", 9000, 0.01)), st, cfg); err != nil {
		t.Fatal(err)
	}
	if len(st.peaks) != n || st.HealthyMax != proven {
		t.Fatalf("Make changed the state it was given")
	}
}

func TestFewRequestsTeachNothing(t *testing.T) {
	cfg := Default(0)
	// Two requests in the window, queued 1 s: noise, not a break.
	l := serving("a", 50, 1)
	l.FirstTokens = 2 / l.Span.Seconds()
	_, st, err := Make(snap(t0, l), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity != 0 || st.Breaks != 0 || st.Observations != 0 {
		t.Fatalf("two requests taught capacity %v (%d breaks)", st.Capacity, st.Breaks)
	}
}

// TestAWindowOfFewRequestsProvesLess: what a healthy window proves is the
// work it served less one standard error of a window's work, √(2/n) of it
// for n first tokens. With 12,000-token prompts a replica's 30 s window
// holds a few requests, and the most of many such windows is a lucky one:
// the proof held the capacity above what the replica broke at, through
// every break (docs/planner-history.md, "Measured": the proof less its
// window's error).
func TestAWindowOfFewRequestsProvesLess(t *testing.T) {
	cfg := Default(0)
	many, few := serving("a", 10000, 0.01), serving("a", 10000, 0.01)
	few.FirstTokens = 0.3 // 9 in the window
	_, stMany, _ := Make(snap(t0, many), State{}, cfg)
	_, stFew, _ := Make(snap(t0, few), State{}, cfg)
	for _, c := range []struct {
		st State
		n  float64
	}{{stMany, 300}, {stFew, 9}} {
		// The capacity is what was served; the proof, less its error.
		if want := 10000 * (1 - math.Sqrt(2/c.n)); c.st.Capacity != 10000 || math.Abs(c.st.HealthyMax-want) > 1e-9 {
			t.Fatalf("%v first tokens: capacity %v, proven %v; want 10000 and %v", c.n, c.st.Capacity, c.st.HealthyMax, want)
		}
	}
	// Five minutes of breaks at 6000: the proof of many requests holds the
	// capacity (a break below it was a burst); the proof of few does not.
	brk := serving("a", 6000, 1)
	brk.FirstTokens = 0.3
	_, stMany, _ = run(t, stMany, cfg, t0.Add(5*time.Second), 5*time.Minute, brk)
	_, stFew, _ = run(t, stFew, cfg, t0.Add(5*time.Second), 5*time.Minute, brk)
	if stMany.Capacity < 0.9*proof(10000, 300) || stFew.Capacity > 6010 {
		t.Fatalf("after breaks at 6000: capacity %v after a proof of 300 requests (want about %v), %v after one of 9 (want about 6000)",
			stMany.Capacity, proof(10000, 300), stFew.Capacity)
	}
}

func TestBreakBelowProvenKeepsProven(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 8000, 0.01))
	// A burst queues requests at 3000/s: the replica served 8000/s within
	// the SLO a minute ago; its capacity is no less.
	_, st, _ = Make(snap(at, serving("a", 3000, 1)), st, cfg)
	if st.Capacity < st.HealthyMax || st.Breaks != 1 {
		t.Fatalf("capacity %v below the healthy %v after a break at 3000", st.Capacity, st.HealthyMax)
	}
}

// TestInstantStartupDrainsWithinTheSLO: replicas seen starting and Ready
// within a millisecond (a lead time of almost nothing) drain a backlog
// within the SLO, not within the millisecond (which once planned thousands
// of replicas for 40 queued requests).
func TestInstantStartupDrainsWithinTheSLO(t *testing.T) {
	cfg := Default(0)
	a := serving("a", 8000, 0.01)
	a.Startup, a.Age = time.Millisecond, time.Minute
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, a)
	a.WaitingNow = 40
	p, _, _ := Make(snap(at, a), st, cfg)
	// 40 requests of 8 work units each... at 1000 work per request:
	// 40000 over 8000/s × 2 s: 2.5 replicas more than the 1.25 the work
	// needs.
	if p.Replicas > 4 || p.Replicas < 3 || p.LeadTime > time.Millisecond {
		t.Fatalf("40 queued with a lead time of %s: plan %d (%s), want 3 or 4 (2 would leave the backlog undrained)", p.LeadTime, p.Replicas, p.Reason)
	}
}

// TestStartingLongerThanLearned: a replica starting for longer than the
// lead time learned says the lead time is at least that long.
func TestStartingLongerThanLearned(t *testing.T) {
	cfg := Default(0)
	a := serving("a", 8000, 0.01)
	a.Startup, a.Age = 10*time.Millisecond, 10*time.Minute
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, a)
	b := store.PodLoad{Name: "b", State: store.PodStarting, Age: 90 * time.Second}
	p, st, _ := Make(snap(at, a, b), st, cfg)
	if p.LeadTime != 90*time.Second {
		t.Fatalf("lead time %s with a replica starting for 90s, want 1m30s", p.LeadTime)
	}
	// Every replica gone, requests held at the routers: none is starting,
	// and the lead time is the one learned again (the replica that was
	// starting had lengthened it until one was listed again).
	learned := st.LeadTime
	p, _, err := Make(Input{At: at.Add(5 * time.Second), Demand: store.DemandValue{Sources: 1, Held: 3}}, st, cfg)
	if err != nil || p.LeadTime != learned {
		t.Fatalf("no replica listed: lead time %s, %v; want the %s learned", p.LeadTime, err, learned)
	}
}

// TestITLSLOBreaks: with an ITL SLO a replica has met, a window past it is
// a break; without the SLO the same window is healthy.
func TestITLSLOBreaks(t *testing.T) {
	cfg := Default(0)
	cfg.ITL = 50 * time.Millisecond
	l := serving("a", 8000, 0.01)
	l.ITL, l.ITLOK = 0.03, true
	_, st, err := Make(snap(t0, l), State{}, cfg)
	if err != nil || st.Breaks != 0 || !st.ITLMetAt.Equal(t0) {
		t.Fatalf("30 ms between tokens against a 50 ms SLO: %d breaks, met at %v, %v; want none, met", st.Breaks, st.ITLMetAt, err)
	}
	l.ITL = 0.08
	p, st, err := Make(snap(t0.Add(time.Minute), l), st, cfg)
	if err != nil || st.Breaks != 1 {
		t.Fatalf("80 ms between tokens against a 50 ms SLO met a minute before: %d breaks, %v; want 1", st.Breaks, err)
	}
	if !strings.Contains(p.Rule, "mean ITL within 50ms") {
		t.Fatalf("rule %q does not say the ITL judges", p.Rule)
	}
	// Without an ITL SLO the same replica is healthy.
	if _, st, _ = Make(snap(t0, l), State{}, Default(0)); st.Breaks != 0 || st.HealthyMax != proof(8000, 240) {
		t.Fatalf("no ITL SLO: %d breaks, proven %v", st.Breaks, st.HealthyMax)
	}
}

// TestAnITLSLONoReplicaMeetsIsNoBreak: an ITL SLO below every time between
// tokens the workload's replicas show (the model's step at a batch of one
// is longer) counts no window a break: the plan is the one without the
// SLO, and the rule says why. Each such window counted a break, and the
// plan ran to the maximum for an SLO no replica count meets.
func TestAnITLSLONoReplicaMeetsIsNoBreak(t *testing.T) {
	cfg := Default(0)
	cfg.ITL = 10 * time.Millisecond
	a, b := serving("a", 8000, 0.01), serving("b", 2000, 0.01)
	a.ITL, a.ITLOK, b.ITL, b.ITLOK = 0.04, true, 0.02, true
	p, st, _ := run(t, State{}, cfg, t0, 20*time.Minute, a, b)
	q, _, _ := run(t, State{}, Default(0), t0, 20*time.Minute, a, b)
	if st.Breaks != 0 || p.Replicas != q.Replicas || p.Capacity != q.Capacity {
		t.Fatalf("ITL SLO 10ms, least ITL 20ms: %d breaks, %d replicas at capacity %v; without the SLO %d at %v", st.Breaks, p.Replicas, p.Capacity, q.Replicas, q.Capacity)
	}
	if !strings.Contains(p.Rule, "judges nothing: no replica met it") || !strings.Contains(p.Rule, "least mean ITL seen 20ms") {
		t.Fatalf("rule %q does not say the ITL SLO is unmet", p.Rule)
	}
	// Met once, the SLO judges for itlMemory, then no more.
	b.ITL = 0.008
	_, st, at := run(t, st, cfg, t0.Add(21*time.Minute), 0, a, b)
	b.ITL = 0.02
	_, st, at = run(t, st, cfg, at, 5*time.Second, a, b)
	if st.Breaks == 0 {
		t.Fatal("the ITL SLO met a moment before: no break at twice it")
	}
	breaks := st.Breaks
	p, st, _ = run(t, st, cfg, at.Add(itlMemory+time.Minute), 5*time.Minute, a, b)
	if st.Breaks != breaks || !strings.Contains(p.Rule, "judges nothing") {
		t.Fatalf("ITL SLO last met over %s before: breaks %d -> %d, rule %q", itlMemory, breaks, st.Breaks, p.Rule)
	}
}

// ramp feeds the planner n replicas whose work goes linearly from w0 to w1
// over d, every 5 s.
func ramp(t *testing.T, st State, cfg Config, at time.Time, d time.Duration, n int, w0, w1 float64) (Plan, State, time.Time) {
	t.Helper()
	var p Plan
	var err error
	for end := at.Add(d); !at.After(end); at = at.Add(5 * time.Second) {
		w := w0 + (w1-w0)*float64(at.Sub(end.Add(-d)))/float64(d)
		pods := make([]store.PodLoad, n)
		for i := range pods {
			pods[i] = serving(string(rune('a'+i)), w/float64(n), 0.01)
		}
		if p, st, err = Make(snap(at, pods...), st, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return p, st, at
}

func TestLoadThatJumpedIsPlannedToJumpAgain(t *testing.T) {
	cfg := Default(0)
	// Learn at 6000 on one replica, then the work jumps to 24000 (4
	// replicas) for two minutes, and falls back to 6000 for 20 minutes.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	_, st, at = ramp(t, st, cfg, at, 2*time.Minute, 4, 24000, 24000)
	// Two minutes at 24000 fill the last quarter of a lead time (75 s of
	// the 5 min assumed), against an older half at 6000: the level moved
	// as the window did.
	if st.Surge != 18000 || st.PeakWork != 24000 || st.LevelSurge != 18000 {
		t.Fatalf("surge %v, peak work %v, the level's surge %v: want 18000, 24000 and 18000", st.Surge, st.PeakWork, st.LevelSurge)
	}
	p, st, _ := ramp(t, st, cfg, at, 20*time.Minute, 4, 6000, 6000)
	// The work it may jump back to, faded for 20 minutes, is planned for
	// at the utilisation, as the work now is: the move less the 1500 the
	// utilisation's headroom holds over 6000, up to the peak. The work
	// alone would need one replica.
	f := math.Exp2(-(20*time.Minute + 5*time.Second).Seconds() / surgeHalfLife.Seconds())
	level := min(6000+18000*f-1500, 24000*f) / cfg.Utilisation
	if math.Abs(p.Level-level) > 50 || math.Abs(p.Surge-st.Surge) > 0 || math.Abs(p.PeakWork-st.PeakWork) > 0 {
		t.Fatalf("planned for %v (surge %v, peak %v), want about %v", p.Level, p.Surge, p.PeakWork, level)
	}
	if want := ceil(level / st.Capacity); p.Replicas < want || p.Replicas <= ceil(6000/(cfg.Utilisation*st.Capacity)) {
		t.Fatalf("plan %d (%s), want at least %d: more than the work alone needs", p.Replicas, p.Reason, want)
	}
	if p.Need != p.Level/st.Capacity {
		t.Fatalf("need %v, want the level planned for over the capacity, %v", p.Need, p.Level/st.Capacity)
	}
}

func TestLoadThatDroppedIsPlannedToComeBack(t *testing.T) {
	cfg := Default(0)
	// 24000 on four replicas for 10 minutes, then it drops to 6000 for 20
	// minutes: a fall from a level held teaches the surge as a rise does.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 4, 24000, 24000)
	if st.Surge != 0 {
		t.Fatalf("surge %v at a steady load", st.Surge)
	}
	p, st, _ := ramp(t, st, cfg, at, 20*time.Minute, 4, 6000, 6000)
	// The surge (18000) was learned at the drop, or up to half a lead time
	// after it (when the level before it is all the older half of the lead
	// time holds), and has faded since; the level is the work plus it, up to
	// the peak (24000, faded from the drop).
	fade := func(d time.Duration) float64 { return math.Exp2(-d.Seconds() / surgeHalfLife.Seconds()) }
	since := 20*time.Minute + 5*time.Second
	if st.Surge < 18000*fade(since)-1 || st.Surge > 18000*fade(since-st.lead(cfg)/2)+1 || math.Abs(st.PeakWork-24000*fade(since)) > 1 {
		t.Fatalf("surge %v, peak %v: want 18000 faded from the drop, or up to half a lead time after it, and 24000 faded from the drop", st.Surge, st.PeakWork)
	}
	// The level fell as the window did, once the last quarter of a lead
	// time was all after the drop and the older half all before it.
	if st.LevelSurge < 18000*fade(since)-1 || st.LevelSurge > 18000*fade(since-st.lead(cfg)/2)+1 {
		t.Fatalf("the level's surge %v: want 18000 faded from the drop", st.LevelSurge)
	}
	want := min(6000+st.LevelSurge-1500, st.PeakWork) / cfg.Utilisation
	if math.Abs(p.Level-want) > 1e-6 || !strings.Contains(p.Reason, "moved") {
		t.Fatalf("planned for %v (%s), want %v", p.Level, p.Reason, want)
	}
	if p.Replicas <= ceil(6000/(cfg.Utilisation*st.Capacity)) {
		t.Fatalf("plan %d (%s): want more than the work alone needs", p.Replicas, p.Reason)
	}
}

func TestLoadThatDriftedIsFollowedDown(t *testing.T) {
	cfg := Default(0)
	// The same range, but risen and fallen over an hour each: no rise
	// within a lead time comes near the headroom of the utilisation.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	_, st, at = ramp(t, st, cfg, at, time.Hour, 4, 6000, 24000)
	p, st, _ := ramp(t, st, cfg, at, time.Hour, 4, 24000, 6000)
	if st.Surge > 1600 {
		t.Fatalf("surge %v over a ramp of 1500 per 5 min", st.Surge)
	}
	if p.Level != 6000/cfg.Utilisation || strings.Contains(p.Reason, "moved") {
		t.Fatalf("planned for %v (%s), want the work over the utilisation, %v", p.Level, p.Reason, 6000/cfg.Utilisation)
	}
}

func TestAWindowsNoiseIsNoMoveOfTheLevel(t *testing.T) {
	cfg := Default(0)
	// Windows of 3000 and 9000 in turn: the work moves by 6000 from one
	// observation to the next, its level (6000) not at all. The noise's
	// peak is planned at full utilisation, as it always was; only a move
	// of the level is planned at the utilisation.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 2, 6000, 6000)
	var p Plan
	for i := range 120 {
		w := 3000.0
		if i%2 == 1 {
			w = 9000
		}
		at = at.Add(5 * time.Second)
		var err error
		if p, st, err = Make(snap(at, serving("a", w/2, 0.01), serving("b", w/2, 0.01)), st, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if st.Surge < 5900 || st.LevelSurge > 300 || st.Trend != 0 {
		t.Fatalf("surge %v, the level's surge %v, trend %v: want about 6000, about none and none", st.Surge, st.LevelSurge, st.Trend)
	}
	if want := max(9000/cfg.Utilisation, min(9000+st.Surge, st.PeakWork)); math.Abs(p.Level-want) > 1e-6 {
		t.Fatalf("planned for %v (%s), want %v: the noise's peak at full utilisation", p.Level, p.Reason, want)
	}
}

func TestALoadRisingQuarterAfterQuarterIsPlannedAhead(t *testing.T) {
	cfg := Default(0)
	// 6000 for 10 minutes, then a rise to 18000 over 10 minutes: 6000 a
	// lead time (the 5 min assumed), more than the 4500 the utilisation's
	// headroom holds over 18000. Each quarter of the last lead time rose
	// on the one before, so the rise is planned to go on for the lead time
	// that capacity asked for now takes: past the most the load has had.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	p, st, _ := ramp(t, st, cfg, at, 10*time.Minute, 2, 6000, 18000)
	// The quarters' means lie 72.5 to 77.5 s apart (observations every
	// 5 s): the slowest quarter's rise, 1450, four times.
	if math.Abs(st.Trend-5800) > 1e-6 || p.Trend != st.Trend {
		t.Fatalf("trend %v (plan %v): want 5800, the slowest quarter's rise of 1450 four times", st.Trend, p.Trend)
	}
	want := (p.Work + st.Trend - p.Work*(1/cfg.Utilisation-1)) / cfg.Utilisation
	if math.Abs(p.Work-18000) > 1e-6 || math.Abs(p.Level-want) > 1e-6 || p.Level <= st.PeakWork/cfg.Utilisation {
		t.Fatalf("work %v, planned for %v (%s): want 18000 and %v, past the peak over the utilisation (%v)",
			p.Work, p.Level, p.Reason, want, st.PeakWork/cfg.Utilisation)
	}
	if !strings.Contains(p.Reason, "rising 5800/s a lead time") {
		t.Fatalf("reason %q: want the trend named", p.Reason)
	}
}

func TestAStepIsNoTrend(t *testing.T) {
	cfg := Default(0)
	// A step from 6000 to 24000, watched for a lead time after it: it
	// rises within one quarter of the lead time, not in each, so at no
	// observation is it planned to go on rising (the surge rules hold it).
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	step := at
	for range 6 * 12 {
		at = at.Add(5 * time.Second)
		p, next, err := Make(snap(at, serving("a", 6000, 0.01), serving("b", 6000, 0.01), serving("c", 6000, 0.01), serving("d", 6000, 0.01)), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		st = next
		if st.Trend != 0 || p.Level > 24000/cfg.Utilisation {
			t.Fatalf("%v after the step: trend %v, planned for %v: want no trend, at most the step over the utilisation", at.Sub(step), st.Trend, p.Level)
		}
	}
}

func TestNoWorkHoldsNoSurge(t *testing.T) {
	cfg := Default(0)
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	_, st, at = ramp(t, st, cfg, at, 2*time.Minute, 4, 24000, 24000)
	// Idle past the hold: the surge plans nothing, and the workload can
	// scale to zero.
	p, _, _ := ramp(t, st, cfg, at, 20*time.Minute, 4, 0, 0)
	if p.Replicas != 0 || p.Level != 0 {
		t.Fatalf("idle: plan %d for %v work (%s), want 0", p.Replicas, p.Level, p.Reason)
	}
}

func TestPercentileSLOPastWithoutAQueueTeachesNothing(t *testing.T) {
	cfg := Default(0)
	cfg.Percentile = 0.9
	slow := serving("a", 10000, 0.01)
	// Its p90 TTFT is 3 s with nothing queued: its prompts alone take
	// longer than the SLO, and no replica count changes that.
	slow.TTFTQuantile, slow.TTFTQuantileOK = 3, true
	p, st, _ := run(t, State{}, cfg, t0, time.Minute, slow)
	if st.Observations != 0 || st.Capacity != 0 || p.Replicas != 1 {
		t.Fatalf("%d observations, capacity %v, plan %d (%s): want nothing learned and the ready replica held", st.Observations, st.Capacity, p.Replicas, p.Reason)
	}
	// With requests queued it broke; within the SLO with none queued, it
	// was healthy.
	slow.Waiting = 3
	if _, st, _ = run(t, State{}, cfg, t0, 0, slow); st.Breaks != 1 {
		t.Fatalf("p90 3 s with a queue: %d breaks, want 1", st.Breaks)
	}
	fast := serving("a", 10000, 0.01)
	fast.TTFTQuantile, fast.TTFTQuantileOK = 1.5, true
	if _, st, _ = run(t, State{}, cfg, t0, 0, fast); st.Breaks != 0 || st.Observations != 1 || st.Capacity != 10000 {
		t.Fatalf("p90 1.5 s: %d breaks, %d observations, capacity %v: want a healthy 10000", st.Breaks, st.Observations, st.Capacity)
	}
	// Within the SLO with its requests queued past a quarter of it (0.8 s
	// on average) and under one waiting on average, it is neither: a queue
	// stood by the queue time's measure. It was proof of 10000.
	queuing := fast
	queuing.QueueTime, queuing.TTFT, queuing.Waiting = 0.8, 0.9, 0.5
	if _, st, _ = run(t, State{}, cfg, t0, 0, queuing); st.Breaks != 0 || st.Observations != 0 || st.Capacity != 0 || st.HealthyMax != 0 {
		t.Fatalf("p90 1.5 s, queued 0.8 s: %d breaks, %d observations, capacity %v, proven %v: want nothing learned", st.Breaks, st.Observations, st.Capacity, st.HealthyMax)
	}
	// Without the histogram, the means judge, and the plan says so.
	p, _, _ = run(t, State{}, cfg, t0, 0, serving("a", 10000, 0.01))
	if !strings.Contains(p.Rule, "no replica's TTFT histogram is forwarded") {
		t.Fatalf("rule %q", p.Rule)
	}
}

func TestBacklogDrainedIsNoSurge(t *testing.T) {
	cfg := Default(0)
	// 20000 arrive, served by two replicas; then four replicas drain a
	// backlog: they serve 40000, their queues shrinking by 20 requests
	// (20000 of work) a second. What arrives has not changed.
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 2, 20000, 20000)
	draining := make([]store.PodLoad, 4)
	for i := range draining {
		draining[i] = serving(string(rune('a'+i)), 10000, 0.01)
		draining[i].Waiting, draining[i].WaitingNow, draining[i].WaitingGrowth = 10, 10, -5
	}
	_, st, _ = run(t, st, cfg, at, 2*time.Minute, draining...)
	if st.Surge > 1 || math.Abs(st.PeakWork-20000) > 1 {
		t.Fatalf("surge %v, peak %v while a backlog drained: want 0 and 20000 (the arrivals)", st.Surge, st.PeakWork)
	}
}

func TestLoadArrivingIsNoSurge(t *testing.T) {
	cfg := Default(0)
	// Idle for a minute, then 24000 arrive: within the first lead time
	// watched, that is the workload's load arriving, not rising.
	_, st, at := ramp(t, State{}, cfg, t0, time.Minute, 1, 0, 0)
	_, st, _ = ramp(t, st, cfg, at, 3*time.Minute, 4, 24000, 24000)
	if st.Surge != 0 || st.PeakWork != 24000 {
		t.Fatalf("surge %v, peak %v: want 0 and 24000", st.Surge, st.PeakWork)
	}
}

// TestBacklogProjectedToWhenCapacityArrives: the backlog the need drains is
// the one there will be when capacity asked for now is ready: the queue
// grows by what the ready replicas do not serve until then, less what the
// replicas already starting serve from when they are ready, never below
// empty.
func TestBacklogProjectedToWhenCapacityArrives(t *testing.T) {
	lead := 300 * time.Second
	starting := func(ages ...time.Duration) Input {
		in := snap(t0, serving("a", 10000, 1))
		for _, a := range ages {
			in.Pods = append(in.Pods, store.PodLoad{Name: "s", State: store.PodStarting, Age: a})
		}
		return in
	}
	for _, c := range []struct {
		name                      string
		backlog, excess, capacity float64
		in                        Input
		want                      float64
	}{
		{"growing, nothing starting", 0, 1000, 1000, starting(), 300_000},
		{"one starting that serves the excess once ready, 100 s from now", 5000, 1000, 1000, starting(200 * time.Second), 105_000},
		{"one starting that drains it once ready", 5000, 1000, 3000, starting(200 * time.Second), 0},
		{"two starting, the older ready first", 0, 3000, 2000, starting(150*time.Second, 250*time.Second), 150_000 + 100_000 - 150_000},
		{"one starting for longer than the lead: ready now", 1000, 1000, 2000, starting(400 * time.Second), 0},
		{"shrinking", 50_000, -1000, 1000, starting(), 0},
	} {
		if got, _ := projectBacklog(c.backlog, c.excess, c.capacity, c.in, lead, stuckAfter); math.Abs(got-c.want) > 1e-6 {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestGrowingQueueIsPlannedAsItWillBe: an overloaded replica whose queue
// grows while nothing starts is planned the work and the backlog the queue
// will hold a lead time from now, drained over a lead time; and, since
// that queue drains only through its own replica, the work is spread over
// enough replicas for it to be gone a minute after.
func TestGrowingQueueIsPlannedAsItWillBe(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	a := serving("a", 10000, 1)
	a.WaitingNow, a.WaitingGrowth = 30, 4 // 4 requests a second more than it serves
	p, _, err := Make(snap(at, a), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A request is 1000 work: 30 queued are 30000, growing 4000/s for the
	// 5-minute lead: 1.23 M then, drained over 5 minutes by 10000/s a
	// replica: 0.41 replicas, on top of 14000/s over 0.8 × 10000: 1.75,
	// 2.16 in all. But the 1.23 M stand at the one replica: gone within a
	// minute would need 20500/s of its 10000/s, so it is left half its
	// capacity for new work: 14000/s over 5000/s a replica, 2.8.
	if math.Abs(p.BacklogThen-1_230_000) > 1 || math.Abs(p.DrainNeed-2.8) > 0.01 || math.Abs(p.Need-2.8) > 0.01 || p.Replicas != 3 {
		t.Fatalf("backlog then %.0f, drain need %.3f, need %.3f, plan %d: want 1230000, 2.8, 2.8, 3 (%s)", p.BacklogThen, p.DrainNeed, p.Need, p.Replicas, p.Reason)
	}
	if !strings.Contains(p.Reason, "drains only through it") {
		t.Errorf("reason %q does not name the drain", p.Reason)
	}
}

// TestReplicasStartingWithNothingToSayTheLoadAreNoZero: no replica ready,
// no router, replicas starting (an aggregator restarted while they
// loaded, or a node drained and its replicas' replacements load): the
// load is not known, and it was planned 0, so the HPA took back the
// replicas starting. They are kept now, with a fresh state (past its first
// hold too) and with one learned (its held peak above them) alike; with
// routers, their demand is the plan, as before.
func TestReplicasStartingWithNothingToSayTheLoadAreNoZero(t *testing.T) {
	cfg := Default(0)
	starting := []store.PodLoad{{Name: "x", State: store.PodStarting, Age: 2 * time.Minute},
		{Name: "y", State: store.PodStarting, Age: 2 * time.Minute}, {Name: "z", State: store.PodStarting, Age: 2 * time.Minute}}
	_, learned, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1), serving("b", 10000, 1), serving("c", 10000, 1))
	for name, c := range map[string]struct {
		st State
		at time.Time
	}{"a fresh state": {State{}, t0}, "a fresh state past its hold": {State{Since: t0}, t0.Add(time.Hour)}, "a state learned": {learned, at}} {
		p, _, err := Make(snap(c.at, starting...), c.st, cfg)
		if err != nil || p.Replicas < 3 {
			t.Errorf("%s: plan %d (%s), error %v; want the 3 replicas starting kept", name, p.Replicas, p.Reason, err)
		}
	}
	in := snap(t0, starting...)
	in.Demand = store.DemandValue{Sources: 1, Held: 4}
	if p, _, err := Make(in, State{}, cfg); err != nil || p.Replicas < 1 {
		t.Fatalf("with a router holding requests: plan %d, %v; want it planned on their demand", p.Replicas, err)
	}
}

// TestARestartHoldsAScaleUpUnderWay: an aggregator restarted while
// replicas it asked for were starting kept no peak that asked for them,
// and the first hold held the ready replicas alone: a Recreate rollout's 4
// replicas loading with requests held at the routers were planned 1, and 4
// busy ready replicas with 4 starting were planned 5 on their KV cache.
// Both keep the replicas starting now.
func TestARestartHoldsAScaleUpUnderWay(t *testing.T) {
	cfg := Default(0)
	starting := func(name string) store.PodLoad {
		return store.PodLoad{Name: name, State: store.PodStarting, Age: time.Minute}
	}
	loading := snap(t0, starting("a"), starting("b"), starting("c"), starting("d"))
	loading.Demand = store.DemandValue{Sources: 2, Held: 10}
	if p, _, err := Make(loading, State{}, cfg); err != nil || p.Replicas != 4 {
		t.Errorf("4 starting, 10 requests held at the routers, nothing learned: plan %d, %v (%s); want the 4 kept", p.Replicas, err, p.Reason)
	}
	busy := func(name string) store.PodLoad {
		l := serving(name, 0, 0)
		l.Tokens, l.KVCache = false, 0.9
		return l
	}
	pods := []store.PodLoad{busy("r1"), busy("r2"), busy("r3"), busy("r4"), starting("s1"), starting("s2"), starting("s3"), starting("s4")}
	p, st, err := Make(snap(t0, pods...), State{}, cfg)
	if err != nil || p.Replicas != 8 || !strings.Contains(p.Reason, "4 starting") {
		t.Fatalf("4 ready, 4 starting, at the first plan: %d, %v (%s); want 8 held", p.Replicas, err, p.Reason)
	}
	at := t0
	for at.Sub(t0) < st.hold(cfg)+10*time.Second { // past the hold the plan is the load's again
		at = at.Add(5 * time.Second)
		if p, st, err = Make(snap(at, pods...), st, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if p.Replicas >= 8 {
		t.Fatalf("past the first hold: plan %d (%s); want the load's, below 8", p.Replicas, p.Reason)
	}
}

// TestAnUnreadyReplicaDrainsNoBacklog: a replica that served and lost its
// readiness (its probe failing under the overload) is planned as a ready
// one without a fresh sample; it was also taken as a replica starting that
// joins at once, so the backlog growing at the replicas serving was
// projected drained on it, and the workload planned short just as one of
// its replicas stopped taking requests. Its backlog is now that of the
// same replica listed ready with no fresh sample.
func TestAnUnreadyReplicaDrainsNoBacklog(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1), serving("b", 10000, 1))
	a := serving("a", 10000, 1)
	a.WaitingNow, a.WaitingGrowth = 30, 4
	unready := store.PodLoad{Name: "b", State: store.PodStarting, Unready: true, Age: 50 * time.Minute}
	missing := store.PodLoad{Name: "b", State: store.PodMissing}
	pu, _, err := Make(snap(at, a, unready), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pm, _, err := Make(snap(at, a, missing), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pu.Unready != 1 || pu.Starting != 0 || pm.BacklogThen == 0 || pu.BacklogThen != pm.BacklogThen || pu.Need != pm.Need {
		t.Fatalf("unready: backlog then %.0f, need %.3f (%s); listed ready without a sample: %.0f, %.3f (%s); want the same, and a backlog",
			pu.BacklogThen, pu.Need, pu.Reason, pm.BacklogThen, pm.Need, pm.Reason)
	}
}

// TestAReplicasQueueDrainsOnlyThroughIt: the queue standing at each ready
// replica when capacity asked for now is ready is planned to be gone a
// minute after, at what the replica's capacity leaves over from an even
// share of the work; demand held at the routers is not, since any replica
// drains it; and a queue no replica could drain within a minute asks at
// most twice the replicas the work alone needs.
func TestAReplicasQueueDrainsOnlyThroughIt(t *testing.T) {
	for _, c := range []struct {
		name                  string
		work, share, capacity float64
		want                  float64
	}{
		{"no queue", 14000, 0, 10000, 0},
		// 120000 in a minute: 2000/s of the 10000/s, 8000/s left for new
		// work: 14000/s over 8000/s.
		{"a queue a replica drains in a minute with room to spare", 14000, 120_000, 10000, 1.75},
		// 300000 in a minute: 5000/s, exactly the floor's half.
		{"at the floor", 14000, 300_000, 10000, 2.8},
		{"past the floor: at most twice the work's replicas", 14000, 6_000_000, 10000, 2.8},
		{"no capacity learned", 14000, 120_000, 0, 0},
	} {
		if got := drainNeed(c.work, c.share, c.capacity); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	cfg := Default(0)
	// Two replicas at 5000/s each, well within 10000/s (probed no higher
	// here: the capacity is what the first break taught).
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1), serving("b", 10000, 1))
	a, b := serving("a", 5000, 0.1), serving("b", 5000, 0.1)
	a.WaitingNow, b.WaitingNow = 60, 60 // 120 requests of 1000 work, steady
	p, _, err := Make(snap(at, a, b), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Capacity <= 0 || p.BacklogThen != 120_000 {
		t.Fatalf("capacity %v, backlog then %v: want some and 120000", p.Capacity, p.BacklogThen)
	}
	// 60000 each, gone within a minute: 1000/s of each replica's capacity.
	want := 10000 / (p.Capacity - 1000)
	if math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("drain need %v, want %v (capacity %v)", p.DrainNeed, want, p.Capacity)
	}

	// The same backlog held at the routers (a gateway's queue) instead:
	// any replica drains it, so no replica's own drain is planned.
	a.WaitingNow, b.WaitingNow = 0, 0
	in := snap(at, a, b)
	in.Demand = store.DemandValue{Sources: 1, Held: 120}
	if p, _, err = Make(in, st, cfg); err != nil {
		t.Fatal(err)
	}
	if p.BacklogThen != 120_000 || p.DrainNeed != 0 {
		t.Fatalf("backlog then %v, drain need %v: want 120000 and 0", p.BacklogThen, p.DrainNeed)
	}
}

// TestDrainSetsTheCount: a queue standing at each of two replicas is planned
// a replica more than the pooled drain over a lead time asks, and a backlog
// half at the replicas, half at the routers, is planned on the replicas'
// half only.
func TestDrainSetsTheCount(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	a, b := serving("a", 7000, 0.1), serving("b", 7000, 0.1)
	a.WaitingNow, b.WaitingNow = 300, 300 // 300000 work at each, steady
	p, _, err := Make(snap(at, a, b), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pooled := p.Level/p.Capacity + p.BacklogThen/(p.Capacity*max(p.LeadTime, cfg.TTFT).Seconds())
	if want := drainNeed(p.Work, 300_000, p.Capacity); math.Abs(p.DrainNeed-want) > 1e-9 || p.Need != p.DrainNeed {
		t.Fatalf("drain need %v, need %v: want both %v", p.DrainNeed, p.Need, want)
	}
	if p.Replicas != ceil(p.DrainNeed) || ceil(pooled) >= p.Replicas {
		t.Fatalf("plan %d (drain need %.2f, pooled %.2f): want the drain's count, above the pooled one (%s)", p.Replicas, p.DrainNeed, pooled, p.Reason)
	}

	a.WaitingNow, b.WaitingNow = 150, 150
	in := snap(at, a, b)
	in.Demand = store.DemandValue{Sources: 1, Held: 300}
	if p, _, err = Make(in, st, cfg); err != nil {
		t.Fatal(err)
	}
	// 600000 in all, half of it at the replicas: 150000 each.
	if want := drainNeed(p.Work, 150_000, p.Capacity); p.BacklogThen != 600_000 || math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("backlog then %v, drain need %v: want 600000 and %v", p.BacklogThen, p.DrainNeed, want)
	}
}

// TestReplicaBacklogProjection: one replica's queue grows or shrinks as the
// ready replicas' do on average, less, from when each starting replica
// joins, that one's part of the arriving work; it never goes below empty.
func TestReplicaBacklogProjection(t *testing.T) {
	for _, c := range []struct {
		name               string
		q, growth, arrived float64
		ready              int
		joins              []time.Duration
		lead               time.Duration
		want               float64
	}{
		{"steady, nothing joining", 1000, 0, 100, 2, nil, time.Minute, 1000},
		{"growing", 0, 10, 100, 2, nil, time.Minute, 600},
		{"shrinking to empty, never below", 1000, -10, 100, 2, nil, 2 * time.Minute, 0},
		// 30 s at +20/s: 600; then the third replica takes 100/2 - 100/3
		// of the arrivals from each: 20 - 16.67 = 3.33/s for 60 s: 800.
		{"a replica joins", 0, 20, 100, 2, []time.Duration{30 * time.Second}, 90 * time.Second, 800},
		// Empty after 10 s at -10/s, and it stays empty (-26.67/s after
		// the join).
		{"emptied before a join", 100, -10, 100, 2, []time.Duration{30 * time.Second}, 90 * time.Second, 0},
		// Joining at once (it started more than a lead time ago).
		{"joined at once", 0, 50, 100, 1, []time.Duration{0}, time.Minute, 0},
	} {
		if got := replicaBacklog(c.q, c.growth, c.arrived, c.ready, c.joins, c.lead); math.Abs(got-c.want) > 1e-6 {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestTheLargestQueueDrainsFromTheArrivals: the drain is planned for the
// replica with the largest queue (not the mean over replicas, which a
// replica just ready with an empty queue dilutes), and spreads the work
// arriving (not the work served, which includes the queue being drained).
func TestTheLargestQueueDrainsFromTheArrivals(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	a, b := serving("a", 7000, 0.1), serving("b", 7000, 0.1)
	a.WaitingNow = 300 // 300000 work at a, none at b (just ready), steady
	p, _, err := Make(snap(at, a, b), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := drainNeed(p.Work, 300_000, p.Capacity); math.Abs(p.DrainNeed-want) > 1e-9 || p.BacklogThen != 300_000 {
		t.Fatalf("drain need %v, backlog then %v: want %v (a's whole queue) and 300000", p.DrainNeed, p.BacklogThen, want)
	}

	// Both queues shrink by half a request a second: 13000/s arrive of the
	// 14000/s served, and each queue is 300000 - 500 × lead when capacity
	// asked for now is ready.
	a.WaitingNow, b.WaitingNow = 300, 300
	a.WaitingGrowth, b.WaitingGrowth = -0.5, -0.5
	if p, _, err = Make(snap(at, a, b), st, cfg); err != nil {
		t.Fatal(err)
	}
	share := 300_000 - 500*p.LeadTime.Seconds()
	if want := drainNeed(13000, share, p.Capacity); share <= 0 || math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("drain need %v, want %v (a share of %v, lead %s)", p.DrainNeed, want, share, p.LeadTime)
	}
}

// TestAStartingReplicaTakesItsPartOfTheArrivals: through Make, a replica
// starting joins the projection of the largest queue when it is ready (a
// lead time after it was listed), from then taking its part of the
// arrivals; and a ready replica without a fresh sample carries the fresh
// ones' mean load in the arrivals spread.
func TestAStartingReplicaTakesItsPartOfTheArrivals(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	a, b := serving("a", 7000, 0.1), serving("b", 7000, 0.1)
	a.WaitingNow, b.WaitingNow = 300, 300       // 300000 work each
	a.WaitingGrowth, b.WaitingGrowth = 0.5, 0.5 // +500 work/s each
	p, _, err := Make(snap(at, a, b), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lead := p.LeadTime.Seconds()
	// 15000/s arrive (14000 served, 1000 queued); nothing starting: the
	// queue grows at 500/s for a lead time.
	if want := drainNeed(15000, 300_000+500*lead, p.Capacity); math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("drain need %v, want %v (lead %s)", p.DrainNeed, want, p.LeadTime)
	}

	// A third replica listed half a lead time ago joins half a lead time
	// from now: from then each ready replica gets 15000/3 a second, not
	// 15000/2, and its queue shrinks at 500 - 2500 = -2000/s.
	c := store.PodLoad{Name: "c", State: store.PodStarting, Age: p.LeadTime / 2}
	if p, _, err = Make(snap(at, a, b, c), st, cfg); err != nil {
		t.Fatal(err)
	}
	share := 300_000 + 500*lead/2 - 2000*lead/2
	if want := drainNeed(15000, share, p.Capacity); share <= 0 || math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("drain need %v, want %v (a share of %v)", p.DrainNeed, want, share)
	}

	// b ready but without a fresh sample: the arrivals are a's scaled to
	// two replicas (7500 × 2), the growth a's.
	b.State = store.PodMissing
	if p, _, err = Make(snap(at, a, b), st, cfg); err != nil {
		t.Fatal(err)
	}
	if want := drainNeed(15000, 300_000+500*lead, p.Capacity); p.Missing != 1 || math.Abs(p.DrainNeed-want) > 1e-9 {
		t.Fatalf("drain need %v with %d missing, want %v", p.DrainNeed, p.Missing, want)
	}
}

func TestAReplicaCountIsBounded(t *testing.T) {
	for _, c := range []struct {
		x    float64
		want int
	}{{1e30, math.MaxInt32}, {math.Inf(1), math.MaxInt32}, {math.NaN(), 0}, {-1e30, 0}, {2.5, 3}} {
		if got := ceil(c.x); got != c.want {
			t.Errorf("ceil(%g) = %d, want %d", c.x, got, c.want)
		}
	}
	// A queue priced at an enormous mean work: the need is past any int,
	// and the plan is the most replicas there can be, never a negative.
	cfg := Default(0)
	st := State{Since: t0.Add(-time.Hour), Capacity: 1000, HealthyMax: 1000, WorkPerRequest: 1e13}
	pod := serving("a", 1000, 0.01)
	pod.WaitingNow, pod.Waiting = 9e5, 9e5
	p, _, err := Make(snap(t0, pod), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas != math.MaxInt32 {
		t.Fatalf("plan %d (need %g), want %d", p.Replicas, p.Need, math.MaxInt32)
	}
}

func TestImplausibleWindowsAreRefusedAlone(t *testing.T) {
	cfg := Default(0)
	liar := serving("liar", 3e14, 0.01)
	nan := serving("nan", 10000, 0.01)
	nan.TTFTQuantile, nan.TTFTQuantileOK = math.NaN(), true
	queue := serving("queue", 10000, 0.01)
	queue.WaitingNow = 9e15
	p, st, err := Make(snap(t0, serving("a", 10000, 0.01), liar, serving("b", 10000, 0.01), nan, queue), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Refused != 3 || p.Missing != 3 || p.Ready != 5 || !strings.HasPrefix(p.RefusedWhy, "liar: 3e+14 tokens a second") {
		t.Fatalf("refused %d (%q), missing %d, ready %d: want 3 refused, the liar named first, 3 missing of 5", p.Refused, p.RefusedWhy, p.Missing, p.Ready)
	}
	// What is learned is the believable replicas' alone, and the plan
	// never goes below the ready ones while some are refused.
	if st.Capacity != 10000 || st.HealthyMax != proof(10000, 300) {
		t.Fatalf("capacity %v, healthy max %v: want 10000 and %v (the believable replicas')", st.Capacity, st.HealthyMax, proof(10000, 300))
	}
	if p.Replicas < 5 || !strings.Contains(p.Reason, "3 ready replicas refused: liar: 3e+14 tokens a second") {
		t.Fatalf("plan %d (%s): want at least the 5 ready replicas, and the refusal named", p.Replicas, p.Reason)
	}
	// With no believable replica, the plan is an error that says why, not
	// a count.
	_, _, err = Make(snap(t0, liar), State{}, cfg)
	if !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "liar: 3e+14 tokens a second") {
		t.Fatalf("error %v, want ErrStale naming the refused replica", err)
	}
}

// TestBelowZeroAndRunawayQueuesAreRefused: a window with a rate, count or
// gauge below 0, a queue moving by more than a replica is believed to
// hold in a second, or preemptions past the first tokens one is believed
// to give, is refused as a liar is. FuzzMake found the queue: growing
// 10³⁰⁰ a second, it planned 2³¹−1 replicas and kept an infinite need
// among the peaks held, which no plan could show. The preemptions had no
// bound until the fourteenth session; past the first tokens they mark a
// window swamped (rule 2).
func TestBelowZeroAndRunawayQueuesAreRefused(t *testing.T) {
	cfg := Default(0)
	negative := serving("negative", 10000, 0.01)
	negative.FirstTokens = -3
	runaway := serving("runaway", 10000, 0.01)
	runaway.WaitingGrowth = 1e300
	preempting := serving("preempting", 10000, 0.01)
	preempting.Preemptions = 1e300
	p, st, err := Make(snap(t0, serving("a", 10000, 0.01), negative, runaway, preempting), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Refused != 3 || !strings.HasPrefix(p.RefusedWhy, "negative: a rate, count, mean or gauge below 0") {
		t.Fatalf("refused %d (%q): want all three, the negative one named first", p.Refused, p.RefusedWhy)
	}
	// The refused replicas carry the believable one's load: 40,000 over
	// 10,000 a replica at 0.8, 5 replicas, and nothing else is held.
	if p.Need != 5 || p.Replicas != 5 || len(st.peaks) != 1 || st.peaks[0].need != 5 {
		t.Fatalf("plan %d, need %v, peaks %+v: want 5 on a need of 5 (the believable replica's load, four times), and that need held", p.Replicas, p.Need, st.peaks)
	}
}

// TestImplausibleDemandIsRefused: the routers' demand (requests held, and
// arrived while no replica is ready) past what is believed — not a finite
// number, below 0, or past a million requests — is left out of the plan
// and named in it; with no replica it is an error, not 0 or 1 (found by
// FuzzMake: a NaN held planned a NaN backlog, which no plan could show).
func TestImplausibleDemandIsRefused(t *testing.T) {
	cfg := Default(0)
	st := State{Since: t0.Add(-time.Hour), Capacity: 10000, HealthyMax: 10000, WorkPerRequest: 1000}
	for _, d := range []store.DemandValue{{Sources: 1, Held: math.NaN()}, {Sources: 1, Held: 5, Arrived: math.Inf(1)}, {Sources: 1, Held: -4}, {Sources: 1, Held: 2e6}} {
		in := snap(t0, serving("a", 4000, 0.01))
		in.Demand = d
		p, _, err := Make(in, st, cfg)
		if err != nil || p.Backlog != 0 || !strings.Contains(p.RefusedWhy, "the routers' demand") || !strings.Contains(p.Reason, "the routers' demand") || p.Refused != 0 {
			t.Fatalf("demand %+v: plan %+v, %v: want no backlog, the demand named as refused, no replica refused", d, p, err)
		}
		if _, err := json.Marshal(p); err != nil {
			t.Fatalf("demand %+v: the plan cannot be shown: %v", d, err)
		}
		if _, _, err := Make(Input{At: t0, Demand: d}, st, cfg); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "the routers' demand") {
			t.Fatalf("demand %+v with no replica: error %v, want ErrRefused naming the demand", d, err)
		}
		// With a replica starting and none ready, the same: the demand
		// was taken as none and the replica starting planned away (0).
		starting := Input{At: t0, Found: true, Pods: []store.PodLoad{{Name: "b", State: store.PodStarting, Age: 20 * time.Second}}, Demand: d}
		if p, _, err := Make(starting, st, cfg); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "the routers' demand") {
			t.Fatalf("demand %+v with a replica starting, none ready: plan %d (%s), error %v; want ErrRefused naming the demand", d, p.Replicas, p.Reason, err)
		}
	}
	// Believable demand still counts: 5 requests held, with no replica.
	p, _, err := Make(Input{At: t0, Demand: store.DemandValue{Sources: 1, Held: 5}}, st, cfg)
	if err != nil || p.Replicas != 1 {
		t.Fatalf("5 held, no replica: plan %d, %v: want 1", p.Replicas, err)
	}
}

// TestEveryReplicaTerminatingIsNoZero: every replica draining (a node
// drained, a Recreate rollout), their replacements not listed yet and no
// router reporting: nothing says the load, and the answer is an error (the
// HPA holds), with or without state learned. It was a plan of 0 (at once
// after a restart; after one hold otherwise), and the HPA took back the
// replacements pending.
func TestEveryReplicaTerminatingIsNoZero(t *testing.T) {
	cfg := Default(0)
	a, b, c := serving("a", 6000, 0.01), serving("b", 6000, 0.01), serving("c", 6000, 0.01)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, a, b, c)
	for _, l := range []*store.PodLoad{&a, &b, &c} {
		l.State = store.PodTerminating
	}
	for _, from := range []State{st, {}} {
		s := from
		for end := at.Add(time.Hour); at.Before(end); at = at.Add(5 * time.Second) {
			p, next, err := Make(snap(at, a, b, c), s, cfg)
			if !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "3 terminating") {
				t.Fatalf("3 replicas terminating at %s, none starting, no router: plan %d (%s), error %v; want ErrStale", at.Sub(t0), p.Replicas, p.Reason, err)
			}
			s = next
		}
	}
	// A replacement listed starting: the plan keeps it.
	d := store.PodLoad{Name: "d", State: store.PodStarting, Age: 30 * time.Second}
	if p, _, err := Make(snap(at, a, b, c, d), st, cfg); err != nil || p.Replicas < 1 || p.Terminating != 3 {
		t.Fatalf("3 terminating, 1 starting: plan %d (%d terminating), %v; want the one starting kept", p.Replicas, p.Terminating, err)
	}
	// Routers that report nothing held say the load is gone: 0, a
	// workload let scale to zero.
	in := snap(at, a, b, c)
	in.Demand = store.DemandValue{Sources: 1}
	if p, _, err := Make(in, st, cfg); err != nil || p.Replicas != 0 {
		t.Fatalf("3 terminating, routers holding nothing: plan %d, %v; want 0", p.Replicas, err)
	}
}

func TestALyingWindowMovesTheMeanWorkLittle(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 10000, 0.01)) // 1,000 work a request
	if st.WorkPerRequest != 1000 {
		t.Fatalf("work per request %v, want 1000", st.WorkPerRequest)
	}
	// A whole window whose tokens jumped while one request got its first
	// token (50,000 times the mean's work a request) moves the mean a
	// tenth of the way toward at most twice it, an observation.
	lie := serving("a", 5e7, 0.01)
	lie.FirstTokens = 1.0 / 30
	_, st, _ = run(t, st, cfg, at, 30*time.Second, lie)
	if most := 1000 * math.Pow(1+0.1*(maxRise-1), 7); st.WorkPerRequest > most+1e-9 {
		t.Fatalf("work per request %v after a window that lied, want at most %v", st.WorkPerRequest, most)
	}
	// The first observation (after a restart, say) is taken whole, but
	// never past a request's most.
	_, st, _ = run(t, State{}, cfg, t0, 0, lie)
	if st.WorkPerRequest != maxRequestWork {
		t.Fatalf("work per request %v at a first window that lied, want %v", st.WorkPerRequest, float64(maxRequestWork))
	}
}

func TestAStuckReplicaIsNoCapacityComing(t *testing.T) {
	cfg := Default(0)
	// A capacity learned, and queues growing at the two ready replicas: a
	// replica starting is planned to drain its part of them once ready.
	st := State{Since: t0.Add(-time.Hour), Capacity: 10000, HealthyMax: 10000, WorkPerRequest: 1000}
	pods := []store.PodLoad{serving("a", 10000, 1), serving("b", 10000, 1)}
	for i := range pods {
		pods[i].WaitingNow, pods[i].Waiting, pods[i].WaitingGrowth = 200, 150, 5
	}
	without, _, err := Make(snap(t0, pods...), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	starting := store.PodLoad{Name: "c", State: store.PodStarting, Age: 4 * time.Minute}
	coming, _, err := Make(snap(t0, append(pods, starting)...), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if coming.BacklogThen >= without.BacklogThen {
		t.Fatalf("a replica a minute from ready drains nothing of the backlog: %v with it, %v without", coming.BacklogThen, without.BacklogThen)
	}
	// Starting for 72 hours, it is stuck: the plan is the one without it.
	stuckPod := store.PodLoad{Name: "c", State: store.PodStarting, Age: 72 * time.Hour}
	with, next, err := Make(snap(t0, append(pods, stuckPod)...), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if with.Replicas != without.Replicas || with.Need != without.Need || with.BacklogThen != without.BacklogThen || with.Stuck != 1 || with.Starting != 0 {
		t.Fatalf("with a pod starting for 72 h: plan %d (need %v, backlog then %v, stuck %d, starting %d); without it %d (need %v, backlog then %v)",
			with.Replicas, with.Need, with.BacklogThen, with.Stuck, with.Starting, without.Replicas, without.Need, without.BacklogThen)
	}
	if h := next.hold(cfg); h > cfg.LeadTime+cfg.HoldMargin {
		t.Fatalf("hold %s with a stuck pod, want the assumed lead time's %s", h, cfg.LeadTime+cfg.HoldMargin)
	}
	// Nor is a startup that long learned once the pod is ready.
	ready := serving("c", 10000, 0.01)
	ready.Startup, ready.Age = 72*time.Hour, 72*time.Hour+time.Minute
	_, next, err = Make(snap(t0.Add(5*time.Second), append(pods, ready)...), next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if next.Startups != 0 {
		t.Fatalf("a 72 h startup learned (%d startups, lead time %s)", next.Startups, next.LeadTime)
	}
	// A workload whose replicas are learned to start in 40 minutes waits
	// three of them before a replica is stuck.
	slow := st
	slow.Startups, slow.LeadTime = 3, 40*time.Minute
	p, _, err := Make(snap(t0, append(pods, store.PodLoad{Name: "c", State: store.PodStarting, Age: 90 * time.Minute})...), slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Stuck != 0 || p.Starting != 1 {
		t.Fatalf("a replica starting 90 minutes where startups take 40: stuck %d, starting %d; want starting", p.Stuck, p.Starting)
	}
}

func TestANeedWithinTheToleranceAddsNoReplica(t *testing.T) {
	cfg := Default(0)
	three := func(w, waiting float64) []store.PodLoad {
		var pods []store.PodLoad
		for _, n := range []string{"a", "b", "c"} {
			l := serving(n, w, 0.01)
			l.Waiting, l.WaitingNow = waiting, waiting
			pods = append(pods, l)
		}
		return pods
	}
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, three(10000, 0)...)
	// Three replicas each at 1.05 × the utilisation of the capacity learned
	// need 3.15 replicas, within the tolerance of 3 (each at 0.84 of its
	// capacity): kept at 3 while no queue stands. (A second after the last
	// observation: nothing is learned from these.)
	f, at := st.Capacity*cfg.Utilisation, at.Add(-4*time.Second)
	for _, c := range []struct {
		what       string
		w, waiting float64
		want       int
	}{
		{"within the tolerance, no queue", 1.05 * f, 0, 3},
		{"within the tolerance, a request waiting at each replica", 1.05 * f, 1, 4},
		{"past the tolerance", 1.15 * f, 0, 4},
	} {
		p, _, err := Make(snap(at, three(c.w, c.waiting)...), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Replicas != c.want || p.Need <= 3 {
			t.Errorf("%s: need %.2f planned %d (%s), want %d", c.what, p.Need, p.Replicas, p.Reason, c.want)
		}
	}
	cfg.Tolerance = 0
	if p, _, _ := Make(snap(at, three(1.05*f, 0)...), st, cfg); p.Replicas != 4 {
		t.Errorf("with no tolerance, need %.2f planned %d (%s), want 4", p.Need, p.Replicas, p.Reason)
	}
}

// TestAReplicaJustReadyProvesNoCapacity: a replica ready for a second has
// rates over that second, while the others' cover the whole window; a
// second's prompts make a rate far above what the replica sustains. A
// window less than half the longest of the workload's replicas proves no
// capacity, whatever its first tokens (it took a second's 24,000 a second
// for proof, and raised the capacity to it); once its window is long
// enough it does. A workload whose windows are all short (an aggregator
// just started) is observed as before.
func TestAReplicaJustReadyProvesNoCapacity(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 0.01))
	capacity, healthyMax := st.Capacity, st.HealthyMax
	old := serving("a", (29*10000+5000)/30.0, 0.01)
	fresh := serving("b", 24000, 0.01)
	fresh.Span, fresh.FirstTokens = time.Second, 8
	_, next, err := Make(snap(at.Add(5*time.Second), old, fresh), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if next.Capacity != capacity || next.HealthyMax > healthyMax {
		t.Fatalf("capacity %v, healthy max %v after a one-second window; want %v and at most %v", next.Capacity, next.HealthyMax, capacity, healthyMax)
	}
	// Long enough, it proves what another replica's window corroborates
	// (riseBound: TestOneWindowProvesNoMoreThanTheFleetCorroborates).
	fresh.Span = 16 * time.Second
	high := serving("a", 24000, 0.01)
	if _, next, err = Make(snap(at.Add(5*time.Second), high, fresh), st, cfg); err != nil || next.Capacity < min(24000, 2*max(capacity, healthyMax)) {
		t.Fatalf("capacity %v, %v after a 16-second window of 24,000 a second within the SLO beside another's: want at least %v", next.Capacity, err, min(24000, 2*max(capacity, healthyMax)))
	}
	a, b := serving("a", 12000, 0.01), serving("b", 12000, 0.01)
	a.Span, b.Span = 2*time.Second, 2*time.Second
	if _, next, err = Make(snap(at.Add(5*time.Second), a, b), st, cfg); err != nil || next.Capacity != 12000 {
		t.Fatalf("capacity %v, %v: want the windows of an aggregator just started observed (12000)", next.Capacity, err)
	}
}

// TestAReplicaStartingForRequestsWaitingIsKept: a workload scaled to zero
// (a capacity learned, every hold past) whose routers hold requests is
// planned one replica; once that replica is listed, starting, the backlog
// is projected to drain on it, and the plan was 0 — the replica it counted
// on, released (KEDA deactivates it before it is ready when it starts for
// longer than the cooldown, and the requests wait on).
func TestAReplicaStartingForRequestsWaitingIsKept(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	if st.Capacity == 0 || st.WorkPerRequest == 0 {
		t.Fatal("no capacity learned")
	}
	demand := store.DemandValue{Sources: 1}
	for end := at.Add(20 * time.Minute); at.Before(end); at = at.Add(5 * time.Second) {
		p, next, err := Make(Input{At: at, Demand: demand}, st, cfg)
		if err != nil || p.Replicas != 0 {
			t.Fatalf("idle at zero: %d, %v", p.Replicas, err)
		}
		st = next
	}
	demand.Held = 10
	p, st, err := Make(Input{At: at, Demand: demand}, st, cfg)
	if err != nil || p.Replicas != 1 {
		t.Fatalf("10 requests held, no replica: %d, %v; want 1", p.Replicas, err)
	}
	for i := range 12 {
		at = at.Add(5 * time.Second)
		starting := store.PodLoad{Name: "new", State: store.PodStarting, Age: 20*time.Second + time.Duration(i)*5*time.Second}
		p, st, err = Make(Input{At: at, Found: true, Pods: []store.PodLoad{starting}, Demand: demand}, st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Replicas < 1 {
			t.Fatalf("10 requests held at the routers, the one replica starting for %s: planned %d (%s; backlog %.0f, then %.0f); want 1",
				starting.Age, p.Replicas, p.Reason, p.Backlog, p.BacklogThen)
		}
	}
}

// TestNoPeakHeldHoldsUntilNothing: under steady load no peak past the need
// is held, and the plan says so (HeldUntil zero, and its gauge 0, as the
// docs say); the newest observation's own need, held a hold from now, was
// reported as a peak held.
func TestNoPeakHeldHoldsUntilNothing(t *testing.T) {
	cfg := Default(0)
	p, _, _ := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 5000, 0.01), serving("b", 5000, 0.01))
	if p.HeldPeak > p.Need+1e-9 {
		t.Fatalf("steady load: a peak of %v past the need %v held", p.HeldPeak, p.Need)
	}
	if !p.HeldUntil.IsZero() {
		t.Fatalf("steady load, held peak %.3f == need %.3f: held until %s, want zero", p.HeldPeak, p.Need, p.HeldUntil)
	}
}

// TestATinyCapacityIsNoCapacity: a window that served less than a token in
// 15 minutes, within every bound believed, teaches no capacity: one that
// broke at 1e-306 tokens a second took the capacity there, the need to
// +Inf (held among the peaks), and a plan no JSON can hold, which failed
// /debug/triggers for every tenant.
func TestATinyCapacityIsNoCapacity(t *testing.T) {
	cfg := Default(0)
	tiny := store.PodLoad{Name: "a", State: store.PodCounted, PromptTokens: 1e-306, Tokens: true, FirstTokens: 1e-306, Span: 30 * time.Second,
		TTFT: 1.1, TTFTOK: true, QueueTime: 1, QueueOK: true}
	_, st, err := Make(snap(t0, tiny), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity != 0 {
		t.Fatalf("capacity %g learned from 1e-306 tokens a second", st.Capacity)
	}
	busy := serving("a", 1e4, 0.01)
	busy.FirstTokens = 0 // teaches nothing
	p, next, err := Make(snap(t0.Add(5*time.Second), busy), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := json.Marshal(p); err != nil {
		t.Fatalf("the plan cannot be shown: %v (need %v)", err, p.Need)
	}
	for _, pk := range next.peaks {
		if math.IsInf(pk.need, 0) || math.IsNaN(pk.need) {
			t.Fatalf("a peak held is %+v", pk)
		}
	}
}

// TestTheTrendIsNoMemoryWhileAReplicaStartsLong: the trend is set anew at
// each observation, and is 0 once a quarter does not rise (rule 5); a
// replica starting for longer than the workload has been watched
// lengthens the lead time past the time watched, and the trend of a rise
// that had stopped was kept, planned ahead for as long as it started.
func TestTheTrendIsNoMemoryWhileAReplicaStartsLong(t *testing.T) {
	cfg := Default(0)
	_, st, at := ramp(t, State{}, cfg, t0, 10*time.Minute, 1, 6000, 6000)
	_, st, at = ramp(t, st, cfg, at, 10*time.Minute, 2, 6000, 18000)
	if st.Trend <= 0 {
		t.Fatalf("no trend learned: %v", st.Trend)
	}
	slow := store.PodLoad{Name: "slow", State: store.PodStarting, Age: 40 * time.Minute}
	var p Plan
	for end := at.Add(10 * time.Minute); at.Before(end); {
		at = at.Add(5 * time.Second)
		slow.Age += 5 * time.Second
		var err error
		if p, st, err = Make(snap(at, serving("a", 9000, 0.01), serving("b", 9000, 0.01), slow), st, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if st.Trend != 0 || p.Trend != 0 {
		t.Fatalf("10 minutes flat at 18000 (a replica starting for %s): trend %v, planned for %v (%s); want no trend", slow.Age, st.Trend, p.Level, p.Reason)
	}
}

// TestAPageWithoutTokenCountersIsNoZeroWork: once a capacity is learned, a
// fresh replica whose page has no token counters (a server of another
// version in a rollout) carries the others' mean work, as one with no fresh
// sample does; it counted as no work, and four replicas serving were
// planned down to two once the surge faded. With no page of token
// counters at all, the ready replicas are kept.
func TestAPageWithoutTokenCountersIsNoZeroWork(t *testing.T) {
	cfg := Default(0)
	pods := []store.PodLoad{serving("a", 8000, 0.01), serving("b", 8000, 0.01), serving("c", 8000, 0.01), serving("d", 8000, 0.01)}
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, pods...)
	for _, i := range []int{2, 3} {
		pods[i] = store.PodLoad{Name: pods[i].Name, State: store.PodCounted, Span: 30 * time.Second, Running: 50, KVCache: 0.1}
	}
	p, st2, at2 := run(t, st, cfg, at, 3*time.Hour, pods...)
	if p.Replicas < 4 {
		t.Fatalf("4 replicas serving, 2 of them with no token counters: planned %d (%s); want the 4 kept", p.Replicas, p.Reason)
	}
	for _, i := range []int{0, 1} {
		pods[i] = store.PodLoad{Name: pods[i].Name, State: store.PodCounted, Span: 30 * time.Second, Running: 50, KVCache: 0.1}
	}
	if p, _, _ = run(t, st2, cfg, at2, time.Hour, pods...); p.Replicas < 4 {
		t.Fatalf("4 replicas serving, none with token counters: planned %d (%s); want the 4 kept", p.Replicas, p.Reason)
	}
}

// TestAReturningAgentsReplicasAreNoZeroWork: a node's agent lost past
// --pod-expiry, its replicas dropped and held as unseen, then back: each
// is listed anew with one sample (no rate yet), and was counted as no
// work, so four replicas serving were planned fewer than four (3, on the
// KV cache alone) until their second samples, a scale-down any HPA sync
// in that second took. A replica ready before this process listed it is
// planned as ready without a fresh sample until it has a rate.
func TestAReturningAgentsReplicasAreNoZeroWork(t *testing.T) {
	cfg := Default(0)
	names := []string{"a", "b", "c", "d"}
	var pods []store.PodLoad
	for _, n := range names {
		pods = append(pods, serving(n, 8000, 0.01))
	}
	_, st, at := run(t, State{}, cfg, t0, 15*time.Minute, pods...)
	var err error
	for end := at.Add(12 * time.Minute); at.Before(end); at = at.Add(5 * time.Second) {
		var missing []store.PodLoad
		for _, n := range names {
			missing = append(missing, store.PodLoad{Name: n, State: store.PodMissing, Unseen: true})
		}
		if _, st, err = Make(snap(at, missing...), st, cfg); err == nil {
			t.Fatal("every replica unseen: planned")
		}
	}
	var back []store.PodLoad
	for _, n := range names {
		back = append(back, store.PodLoad{Name: n, State: store.PodCounted, KVCache: 0.5, Waiting: 0.4, WaitingNow: 0.4, Running: 30, Samples: 1, StartupUnseen: true})
	}
	if p, _, err := Make(snap(at, back...), st, cfg); err == nil && p.Replicas < 4 {
		t.Fatalf("4 replicas serving, back from a lost agent with one sample each: plan %d (%s); want an error (the HPA holds) or at least 4", p.Replicas, p.Reason)
	}
}

// TestEveryReplicaStuckIsNoZero: every replica served, then lost its
// readiness; past the stuck bound (an hour) none is ready, starting or
// terminating, and with no router reporting nothing says the load: it was
// planned 0 once the peaks were released (KEDA deactivated a workload let
// scale to zero). It is an error, as every replica terminating is.
func TestEveryReplicaStuckIsNoZero(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 8000, 0.01), serving("b", 8000, 0.01))
	var unready []store.PodLoad
	for _, n := range []string{"a", "b"} {
		unready = append(unready, store.PodLoad{Name: n, State: store.PodStarting, Unready: true, Age: 3 * time.Hour, UnreadyFor: stuckAfter + time.Minute})
	}
	for end := at.Add(15 * time.Minute); at.Before(end); at = at.Add(5 * time.Second) {
		p, next, err := Make(snap(at, unready...), st, cfg)
		if err == nil && p.Replicas < 2 {
			t.Fatalf("every replica unready past the stuck bound, no router: plan %d (%s); want an error, or the replicas kept", p.Replicas, p.Reason)
		}
		st = next
	}
}

// TestAReplicasQueueDrainsOverTheWholeWork: pages without token counters
// (a server of another version in a rollout) carry the others' mean work,
// but each replica's queue was drained against the work of the pages with
// counters alone: with 2 of 4 without, half the work arriving, and the
// drain's need read low. The drain's need is the same whichever pages have
// counters.
func TestAReplicasQueueDrainsOverTheWholeWork(t *testing.T) {
	cfg := Default(0)
	var pods []store.PodLoad
	for _, n := range []string{"a", "b", "c", "d"} {
		pods = append(pods, serving(n, 8000, 0.01))
	}
	_, st, at := run(t, State{}, cfg, t0, 15*time.Minute, pods...)
	queued := func(counters int) Plan {
		var ps []store.PodLoad
		for i, l := range pods {
			l.Waiting, l.WaitingNow, l.WaitingGrowth = 300, 400, 2
			if i >= counters {
				l.Tokens, l.PromptTokens, l.FirstTokens = false, 0, 0
			}
			ps = append(ps, l)
		}
		p, _, err := Make(snap(at, ps...), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	all, half := queued(4), queued(2)
	if all.DrainNeed == 0 || math.Abs(all.DrainNeed-half.DrainNeed) > 1e-9*all.DrainNeed {
		t.Fatalf("the drain's need %.3f with every page's counters, %.3f with half the pages': want the same", all.DrainNeed, half.DrainNeed)
	}
}

// TestARolloutsSurgePodIsNoRelease: a rolling update (maxSurge 1) starts a
// new pod beside the plan's replicas, then takes an old one back: the
// fleet fell from one over the plan to the plan, which was recorded as a
// release of the replica the plan never asked for, and the rise after it
// within a lead time as a regret, lengthening the hold at every step of
// the rollout (docs/planner.md, rule 7: a rollout's pod replaced is no
// release of the plan's).
func TestARolloutsSurgePodIsNoRelease(t *testing.T) {
	cfg := Default(0)
	four := []store.PodLoad{serving("a", 4800, 0.01), serving("b", 4800, 0.01), serving("c", 4800, 0.01), serving("d", 4800, 0.01)}
	_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, four...)
	pods := []store.PodLoad{serving("a", 3840, 0.01), serving("b", 3840, 0.01), serving("c", 3840, 0.01), serving("d", 3840, 0.01), serving("f", 3840, 0.01)}
	_, st, at = run(t, st, cfg, at, 20*time.Minute, pods...)
	for i := range 36 { // the surge pod starts for 3 minutes
		s := store.PodLoad{Name: "e", State: store.PodStarting, Age: time.Duration(i) * 5 * time.Second}
		_, st, _ = run(t, st, cfg, at, 0, append(pods[:5:5], s)...)
		at = at.Add(5 * time.Second)
	}
	next := []store.PodLoad{serving("e", 3840, 0.01), pods[1], pods[2], pods[3], pods[4], {Name: "a", State: store.PodTerminating}}
	_, st, at = run(t, st, cfg, at, 30*time.Second, next...) // ready; a goes
	up := []store.PodLoad{serving("e", 4800, 0.01), serving("b", 4800, 0.01), serving("c", 4800, 0.01), serving("d", 4800, 0.01), serving("f", 4800, 0.01)}
	p, st, _ := run(t, st, cfg, at, 30*time.Second, up...) // the load rises
	if st.HoldExtra != 0 {
		t.Fatalf("a rollout's pod replaced, then %d asked: the hold lengthened by %s, want not (no release of the plan's)", p.Replicas, st.HoldExtra)
	}
}

// TestOneWindowProvesNoMoreThanTheFleetCorroborates: a healthy window
// above the capacity set the capacity at once to what it served, and the
// floor of what breaks teach (HealthyMax, halved only each hour) to as
// much. One replica's window that lies, or a burst of prefix-cache hits
// (vLLM counts them as prompt tokens), for the 30 s it stays in the window,
// made four replicas past capacity planned as 3 for most of an hour (at 24,000
// a second against 10,000) or as 2 for more than two (at 800,000). One
// observation proves the second most its healthy windows served, and at
// most twice what was known; a rise the fleet shows is still learned.
func TestOneWindowProvesNoMoreThanTheFleetCorroborates(t *testing.T) {
	four := func(w, q float64) []store.PodLoad {
		return []store.PodLoad{serving("a", w, q), serving("b", w, q), serving("c", w, q), serving("d", w, q)}
	}
	cfg := Default(0)
	for _, lie := range []float64{24000, 8e5} {
		_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, four(10000, 1)...) // past capacity: about 10,000
		_, st, at = run(t, st, cfg, at, 20*time.Minute, four(8000, 0.01)...)
		bad := four(8000, 0.01)
		bad[0] = serving("a", lie, 0.01)
		_, st, at = run(t, st, cfg, at, 30*time.Second, bad...)
		if st.Capacity > 2*10000 || st.HealthyMax > 2*10000 {
			t.Fatalf("one replica's window of %v a second: capacity %.0f, proved %.0f; want neither past the fleet's", lie, st.Capacity, st.HealthyMax)
		}
		p, _, _ := run(t, st, cfg, at, 10*time.Minute, four(10000, 1)...)
		if p.Replicas < 5 {
			t.Fatalf("ten minutes after one replica's window of %v a second, 4 replicas past capacity planned %d (capacity %.0f); want 5", lie, p.Replicas, st.Capacity)
		}
	}
	// One healthy window alone (one replica; or the others past capacity),
	// seen at every observation of its 30 s: a bound of twice what was
	// known, measured at each, let it through whole (800,000 a second
	// planned 4 replicas past capacity as 2, one as 1). Shown for longer
	// than its window, it is proved.
	for _, fleet := range [][]store.PodLoad{{serving("a", 10000, 1)}, four(10000, 1)} {
		_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, fleet...)
		bad := slices.Clone(fleet)
		bad[0] = serving("a", 8e5, 0.01)
		_, st, at = run(t, st, cfg, at, 30*time.Second, bad...)
		if st.Capacity > 4*10000 || st.HealthyMax > 1.01*10000 {
			t.Fatalf("%d replicas, one window of 800,000 a second alone: capacity %.0f, proved %.0f; want the capacity at most four times what was known, the proof no more", len(fleet), st.Capacity, st.HealthyMax)
		}
		p, _, _ := run(t, st, cfg, at, 10*time.Minute, fleet...)
		if p.Replicas <= len(fleet) {
			t.Fatalf("%d replicas past capacity, ten minutes after one window of 800,000 alone: planned %d", len(fleet), p.Replicas)
		}
		if len(fleet) == 1 {
			_, st, _ = run(t, st, cfg, at, 2*time.Minute, serving("a", 15000, 0.01))
			if st.Capacity < 15000 {
				t.Fatalf("one replica serving 15,000 a second within the SLO for two minutes: capacity %.0f, want it proved", st.Capacity)
			}
		}
	}
	// The fleet's rise is learned: every replica serving 24,000 within the
	// SLO proves it within a minute.
	_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, four(10000, 1)...)
	_, st, _ = run(t, st, cfg, at, time.Minute, four(24000, 0.01)...)
	if st.Capacity < 24000 {
		t.Fatalf("four replicas serving 24,000 a second within the SLO for a minute: capacity %.0f, want 24,000", st.Capacity)
	}
}

// TestABreakProvesNoMoreThanTheFleetCorroborates: a window past capacity
// moves the capacity 30 % of the way to what it served. Above what is
// known it moves it no further than a second replica past capacity served
// too, or than one alone showed for longer than its window, never more
// than twice what was known a window's span before: one window of 30,000
// a second that queued, among replicas serving 9,000 within the SLO, took
// the capacity from 10,000 to 28,000 within its 30 s, and four replicas
// were planned as 2.
func TestABreakProvesNoMoreThanTheFleetCorroborates(t *testing.T) {
	four := func(w, q float64) []store.PodLoad {
		return []store.PodLoad{serving("a", w, q), serving("b", w, q), serving("c", w, q), serving("d", w, q)}
	}
	cfg := Default(0)
	_, known, at0 := run(t, State{}, cfg, t0, 20*time.Minute, four(10000, 1)...) // past capacity: about 10,000
	bad := four(9000, 0.01)
	bad[0] = serving("a", 30000, 1)
	_, st, at := run(t, known, cfg, at0, 30*time.Second, bad...)
	if st.Capacity > 1.01*known.Capacity || st.BreakCapacity < 0.99*known.BreakCapacity {
		t.Fatalf("one window of 30,000 a second past capacity beside three of 9,000 within it: capacity %.0f, breaks' level %.0f; want both kept at %.0f and %.0f", st.Capacity, st.BreakCapacity, known.Capacity, known.BreakCapacity)
	}
	if p, _, _ := run(t, st, cfg, at, 10*time.Minute, four(9000, 0.01)...); p.Replicas < 5 {
		t.Fatalf("four replicas serving 9,000 a second after it: planned %d (capacity %.0f), want 5 (36,000 over 10,000 at 0.8)", p.Replicas, st.Capacity)
	}
	// Clipped, it says nothing of the probes' ceiling (the breaks' level)
	// below: one above the capacity, as a first break taken whole leaves
	// it, is kept.
	above := known
	above.BreakCapacity = 1.2 * known.Capacity
	if _, st, _ = run(t, above, cfg, at0, 30*time.Second, bad...); st.BreakCapacity != above.BreakCapacity {
		t.Fatalf("the window of 30,000 clipped: breaks' level %.0f, want %.0f kept", st.BreakCapacity, above.BreakCapacity)
	}
	// A first break, clipped, sets no ceiling for the probes at what
	// was known (it served more): none was known.
	probed := known
	probed.BreakCapacity = 0
	if _, st, _ = run(t, probed, cfg, at0, 20*time.Second, bad...); st.BreakCapacity != 0 {
		t.Fatalf("a first break, clipped: breaks' level %.0f, want none", st.BreakCapacity)
	}
	// The window that lies, seen once more after its span (an
	// observation late): not yet shown for longer than its window; nor
	// is one within the SLO, which riseBound holds alone.
	_, alone, at1 := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 10000, 1))
	for _, pods := range [][]store.PodLoad{bad, {serving("a", 8e5, 0.01)}} {
		from, at := known, at0
		if len(pods) == 1 {
			from, at = alone, at1
		}
		_, st, at = run(t, from, cfg, at, 25*time.Second, pods...)
		// (Within the SLO, one replica's window alone raises the capacity
		// until proved at most twice what was known at the span's start,
		// four times across a start: riseBound.)
		most := known.Capacity
		if len(pods) == 1 {
			most *= 4
		}
		if _, st, _ = Make(snap(at.Add(500*time.Millisecond), pods...), st, cfg); st.Capacity > 1.01*most || st.HealthyMax > known.Capacity {
			t.Fatalf("the window that lies (queued %v s), seen at 0 to 30.5 s: capacity %.0f, proved %.0f; want the proof at most %.0f", pods[0].QueueTime, st.Capacity, st.HealthyMax, known.Capacity)
		}
	}
	// A break held to what is known moves the capacity not down; one
	// below it, down as ever.
	_, st, at = run(t, alone, cfg, at1, 10*time.Second, serving("a", 30000, 1))
	if st.Capacity < alone.Capacity {
		t.Fatalf("one replica past capacity at 30,000 for 10 s: capacity %.0f, want %.0f kept", st.Capacity, alone.Capacity)
	}
	if _, low, _ := run(t, st, cfg, at, 0, serving("a", 8000, 1)); low.Capacity > st.Capacity-0.29*(st.Capacity-8000) {
		t.Fatalf("capacity %.0f, then a break at 8,000: capacity %.0f; want it moved 30 %% toward 8,000", st.Capacity, low.Capacity)
	}
	// Two windows that lie, 10 s of the replica's own windows apart, are
	// not one shown for longer than its window.
	_, st, at = run(t, known, cfg, at0, 30*time.Second, bad...)
	_, st, at = run(t, st, cfg, at, 10*time.Second, four(9000, 0.01)...)
	if _, st, _ = run(t, st, cfg, at, 30*time.Second, bad...); st.Capacity > 1.01*known.Capacity {
		t.Fatalf("two windows that lie, 10 s apart: capacity %.0f, want %.0f", st.Capacity, known.Capacity)
	}
	// Two windows that lie, one judged window of the replica's own
	// between them: their run's least is that window.
	_, st, at = run(t, known, cfg, at0, 30*time.Second, bad...)
	_, st, at = run(t, st, cfg, at.Add(5*time.Second), 0, four(9000, 0.01)...)
	if _, st, _ = run(t, st, cfg, at.Add(5*time.Second), 30*time.Second, bad...); st.Capacity > 1.01*known.Capacity {
		t.Fatalf("two windows that lie, one of 9,000 between: capacity %.0f, want %.0f", st.Capacity, known.Capacity)
	}
}

// TestABreakAloneAcrossAGapIsNoWait: a replica past capacity alone proves
// what it shows for longer than its window only where it was seen all
// along (TestABreakAloneProvesWhatItShowsForLongerThanItsWindow).
func TestABreakAloneAcrossAGapIsNoWait(t *testing.T) {
	cfg := Default(0)
	_, known, at0 := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 10000, 1), serving("b", 10000, 1), serving("c", 10000, 1), serving("d", 10000, 1))
	st, at := known, at0
	// A gap is no wait: two spans of 20 s with no observation for 25 s
	// between them, or two windows that lied with the replica's window
	// missing for one to three observations between them (no fresh
	// sample, a page refused, or no replica found), are not one window
	// shown for longer than its own.
	_, st, at = run(t, st, cfg, at, 20*time.Second, serving("a", 14000, 1))
	_, st, _ = run(t, st, cfg, at.Add(20*time.Second), 20*time.Second, serving("a", 14000, 1))
	if st.Capacity > 1.01*known.Capacity {
		t.Fatalf("one replica past capacity at 14,000 for two spans of 20 s apart: capacity %.0f, want %.0f", st.Capacity, known.Capacity)
	}
	lie := []store.PodLoad{serving("a", 30000, 1), serving("b", 9000, 0.01)}
	refused := serving("a", 3e14, 0.01)
	for gap := 1; gap <= 3; gap++ {
		for _, missing := range [][]store.PodLoad{{serving("b", 9000, 0.01)}, {refused, serving("b", 9000, 0.01)}, nil} {
			_, st, at = run(t, known, cfg, at0, 30*time.Second, lie...)
			for range gap {
				if len(missing) == 0 {
					_, st, _ = Make(Input{At: at}, st, cfg)
				} else {
					_, st, _ = Make(snap(at, missing...), st, cfg)
				}
				at = at.Add(5 * time.Second)
			}
			if _, st, _ = run(t, st, cfg, at, 30*time.Second, lie...); st.Capacity > 1.01*known.Capacity {
				t.Fatalf("two windows of 30,000 past capacity, %d observations apart with %d pods seen: capacity %.0f, want %.0f", gap, len(missing), st.Capacity, known.Capacity)
			}
		}
	}
}

// TestTwoReplicasPastCapacityCorroborateEachOther: two windows past
// capacity above what is known move the capacity at once, no more than
// twice what was known at the bound's span start
// (TestABreakProvesNoMoreThanTheFleetCorroborates).
func TestTwoReplicasPastCapacityCorroborateEachOther(t *testing.T) {
	four := func(w, q float64) []store.PodLoad {
		return []store.PodLoad{serving("a", w, q), serving("b", w, q), serving("c", w, q), serving("d", w, q)}
	}
	cfg := Default(0)
	_, known, at0 := run(t, State{}, cfg, t0, 20*time.Minute, four(10000, 1)...)
	var st State
	var at time.Time
	// Two replicas that lie at once corroborate each other, no more than
	// twice what was known at the start of the bound's span: four times
	// where their 30 s cross a start (left: a bound from the lesser of two
	// starts cost 11 % more GPU-hours over the 286 cases of
	// docs/planner-history.md, "Measured").
	pair := four(9000, 0.01)
	pair[0], pair[1] = serving("a", 1e6, 1), serving("b", 1e6, 1)
	for off := time.Duration(0); off < 35*time.Second; off += 5 * time.Second {
		_, st, at = run(t, known, cfg, at0, off, four(10000, 1)...)
		if _, st, _ = run(t, st, cfg, at.Add(5*time.Second), 30*time.Second, pair...); st.Capacity > 4*known.Capacity {
			t.Fatalf("two windows of 1,000,000 past capacity, %s into the span: capacity %.0f, want at most %.0f", off, st.Capacity, 4*known.Capacity)
		}
	}
	// Two replicas past capacity corroborate each other: the capacity
	// moves at once.
	two := four(9000, 0.01)
	two[0], two[1] = serving("a", 14000, 1), serving("b", 14000, 1)
	if _, st, _ = run(t, known, cfg, at0, 30*time.Second, two...); st.Capacity < 13000 {
		t.Fatalf("two replicas past capacity at 14,000 a second for 30 s: capacity %.0f, want it moved toward 14,000", st.Capacity)
	}
}

// TestABreakAloneProvesWhatItShowsForLongerThanItsWindow: one replica past
// capacity above what is known, with no other to corroborate it, proves
// the least it showed over its window's last span once it has shown it
// for longer (TestABreakProvesNoMoreThanTheFleetCorroborates): a dip does
// not reset the wait (a gap does: TestABreakAloneAcrossAGapIsNoWait), and
// a busy replica past capacity in some windows and within it in others
// shows its throughput in both.
func TestABreakAloneProvesWhatItShowsForLongerThanItsWindow(t *testing.T) {
	cfg := Default(0)
	_, known, at0 := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 10000, 1), serving("b", 10000, 1), serving("c", 10000, 1), serving("d", 10000, 1))
	// A skewed balancer's busy replica, past capacity at 14,000 in some
	// windows and within it at 12,000 in others, beside one light
	// replica, shows 12,000 all along: the capacity rises to it.
	st, at := known, at0
	for i := range 120 { // ten minutes
		busy := serving("a", 14000, 1)
		if i%10 >= 6 {
			busy = serving("a", 12000, 0.01)
		}
		_, st, _ = run(t, st, cfg, at, 0, serving("b", 3000, 0.01), busy)
		at = at.Add(5 * time.Second)
	}
	if st.Capacity < 11500 {
		t.Fatalf("a busy replica at 12,000 to 14,000 beside a light one, ten minutes: capacity %.0f, want it past 11,500", st.Capacity)
	}
	// One alone proves what it shows for longer than its window: an
	// observation in which it queued below the break (a dip) does not
	// reset its wait.
	dip := serving("a", 14000, 0.1)
	dip.Waiting = 2
	st, at = known, at0
	for i := range 24 { // two minutes
		pods := []store.PodLoad{serving("a", 14000, 1)}
		if i%4 == 3 {
			pods[0] = dip
		}
		if _, st, _ = run(t, st, cfg, at, 0, pods...); i == 7 && st.Capacity > 1.01*known.Capacity {
			t.Fatalf("one replica past capacity at 14,000 for 35 s: capacity %.0f, want %.0f until shown for longer than its window", st.Capacity, known.Capacity)
		}
		at = at.Add(5 * time.Second)
	}
	if st.Capacity < 13000 {
		t.Fatalf("one replica past capacity at 14,000 a second for two minutes, a dip every 20 s: capacity %.0f, want it moved toward 14,000", st.Capacity)
	}
	// Each replica's run is its own: one that broke once above what is
	// known, then serves within it, holds back no other's.
	st, at = known, at0
	_, st, at = run(t, st, cfg, at, 0, serving("a", 14000, 1), serving("b", 9000, 0.01), serving("c", 5000, 0.01))
	_, st, _ = run(t, st, cfg, at.Add(5*time.Second), 5*time.Minute, serving("a", 12000, 0.01), serving("b", 16000, 1), serving("c", 5000, 0.01))
	if st.Capacity < 15000 {
		t.Fatalf("one replica past capacity at 16,000 for five minutes, another that broke once at 14,000 serving 12,000 within the SLO since: capacity %.0f, want it moved toward 16,000", st.Capacity)
	}
	// A trigger's window of 10 s, observed every 5 s from the end of the
	// last (a little over): half a span is no gap between two
	// observations. And where every call observes, 10 a second, the run
	// is kept in few enough parts to be proved too.
	short := serving("a", 14000, 1)
	short.Span = 10 * time.Second
	every := cfg
	every.ObserveEvery = 0
	for _, c := range []struct {
		cfg  Config
		each time.Duration
	}{{cfg, 5100 * time.Millisecond}, {every, 100 * time.Millisecond}} {
		st, at = known, at0
		for end := at.Add(time.Minute); at.Before(end); at = at.Add(c.each) {
			_, st, _ = run(t, st, c.cfg, at, 0, short)
		}
		if st.Capacity < 13000 || len(st.breakRuns) != 1 || len(st.breakRuns[0].obs) > 20 {
			t.Fatalf("one replica past capacity at 14,000 a second for a minute, a window of 10 s observed every %s: capacity %.0f, runs %+v; want it moved toward 14,000, one run in 20 parts at most", c.each, st.Capacity, st.breakRuns)
		}
	}
}

// TestARiseAloneIsNotKnownUntilShown: one replica's window within the SLO
// above what is known raises the capacity, and proves it only once shown
// for longer than its window. The capacity it raised was taken as known
// at the next observation, where the window was then no longer above
// it: a window of up to twice what was known proved itself at once, and
// the proof floored the capacity through the breaks that followed, one
// replica that needs 2 planned as 1 for most of an hour. Nor is a gap a
// wait: two windows apart are not one shown long.
func TestARiseAloneIsNotKnownUntilShown(t *testing.T) {
	cfg := Default(0)
	_, known, at0 := run(t, State{}, cfg, t0, 20*time.Minute, serving("a", 10000, 1)) // past capacity: about 10,000
	for _, lie := range []float64{20000, 30000} {
		_, st, at := run(t, known, cfg, at0, 30*time.Second, serving("a", lie, 0.01))
		if st.HealthyMax > known.Capacity {
			t.Fatalf("one replica's window of %.0f within the SLO for 30 s: proved %.0f, want at most %.0f", lie, st.HealthyMax, known.Capacity)
		}
		if p, _, _ := run(t, st, cfg, at, 10*time.Minute, serving("a", 10000, 1)); p.Replicas < 2 {
			t.Fatalf("ten minutes of breaks at 10,000 after a window of %.0f: planned %d, want 2", lie, p.Replicas)
		}
	}
	_, st, _ := run(t, known, cfg, at0, 2*time.Minute, serving("a", 20000, 0.01))
	if st.HealthyMax < 18000 {
		t.Fatalf("one replica serving 20,000 within the SLO for two minutes: proved %.0f, want it proved", st.HealthyMax)
	}
	_, st, at := run(t, known, cfg, at0, 20*time.Second, serving("a", 20000, 0.01))
	if _, st, _ = run(t, st, cfg, at.Add(20*time.Second), 20*time.Second, serving("a", 20000, 0.01)); st.HealthyMax > known.Capacity {
		t.Fatalf("one replica's window of 20,000 within the SLO for two spans of 20 s, 25 s apart: proved %.0f, want at most %.0f", st.HealthyMax, known.Capacity)
	}
	// Nor, once part of it is proved (at twice what was known, the
	// bound), is what it raised past that: a window of 80,000 seen at two
	// observations 5 s apart after 55 s of 50,000 is not proved.
	_, st, at = run(t, known, cfg, at0, 55*time.Second, serving("a", 50000, 0.01))
	if _, st, _ = run(t, st, cfg, at, 5*time.Second, serving("a", 80000, 0.01)); st.HealthyMax > 60000 {
		t.Fatalf("one replica's window of 50,000 within the SLO for 55 s, then 80,000 at two observations 5 s apart: proved %.0f, want no more than the 50,000 shown long", st.HealthyMax)
	}
	// The rise stays unknown once its wait is broken off (an observation
	// with no window within the SLO, a queue standing): the window seen
	// again is above what is known, not the capacity it raised.
	dip := serving("a", 20000, 0.1)
	dip.Waiting = 2
	_, st, at = run(t, known, cfg, at0, 10*time.Second, serving("a", 20000, 0.01))
	_, st, at = run(t, st, cfg, at, 0, dip)
	if _, st, _ = run(t, st, cfg, at.Add(5*time.Second), 10*time.Second, serving("a", 20000, 0.01)); st.HealthyMax > known.Capacity {
		t.Fatalf("one replica's window of 20,000 within the SLO, a queue standing between: proved %.0f, want at most %.0f", st.HealthyMax, known.Capacity)
	}
}

// TestASilentRoutersQueueIsUnknownNotNone: with replicas ready, what a
// router whose agent is lost holds is read as none once the peak its queue
// asked for has been held for the hold (rule 7), and the plan said "no
// queue stands": it says the routers are silent, and what is read of them.
// (Holding the replicas listed while a router is silent, tried first,
// added nothing to the peak's hold within it, and past it pinned a
// workload whose router's page keeps failing for ever: found in a review.)
func TestASilentRoutersQueueIsUnknownNotNone(t *testing.T) {
	cfg := Default(0)
	at4 := func(w float64) []store.PodLoad {
		return []store.PodLoad{serving("a", w, 0.01), serving("b", w, 0.01), serving("c", w, 0.01), serving("d", w, 0.01)}
	}
	_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, at4(10000)...)
	four := at4(7000)
	_, st, at = run(t, st, cfg, at, 20*time.Minute, four...)
	if p, _, _ := Make(snap(at, four...), st, cfg); p.Replicas != 4 {
		t.Fatalf("4 replicas serving 7,000 a second, no router: planned %d (%s), want 4", p.Replicas, p.Reason)
	}
	heard, st, err := Make(Input{At: at, Found: true, Pods: four, Demand: store.DemandValue{Sources: 1, Held: 20000}}, st, cfg)
	if err != nil || heard.Replicas < 5 {
		t.Fatalf("a router holding 20,000 requests: planned %d, %v; want more than the 4 ready", heard.Replicas, err)
	}
	withFifth := append(slices.Clone(four), store.PodLoad{Name: "e", State: store.PodStarting, Age: 30 * time.Second})
	silent := Input{Found: true, Pods: withFifth, Demand: store.DemandValue{Stale: 1, Silent: 1}}
	lost := silentFor(t, &st, cfg, &at, silent, 3*time.Minute, func(p Plan) {
		if p.Replicas < 5 {
			t.Fatalf("%s after the router's agent was lost: planned %d (%s); want the 4 ready and the one starting held", at.Sub(t0), p.Replicas, p.Reason)
		}
	})
	if !strings.Contains(lost.Reason, "1 of the routers ready have not reported") || !strings.Contains(lost.Reason, "read as none") {
		t.Fatalf("reason %q: want the silent router named, and how it is read", lost.Reason)
	}
	// Silent past the hold (a router whose page keeps failing is silent
	// too): not held for ever, and said.
	p := silentFor(t, &st, cfg, &at, silent, 20*time.Minute, nil)
	if p.Replicas >= heard.Replicas || !strings.Contains(p.Reason, "1 of the routers ready have not reported") {
		t.Fatalf("a router silent for 20 minutes: planned %d (%s), want the peak's hold over and the silence said", p.Replicas, p.Reason)
	}
}

// silentFor plans in every 5 s for d, from *at, checking each plan.
func silentFor(t *testing.T, st *State, cfg Config, at *time.Time, in Input, d time.Duration, check func(Plan)) Plan {
	t.Helper()
	var p Plan
	for end := at.Add(d); at.Before(end); {
		*at = at.Add(5 * time.Second)
		in.At = *at
		var err error
		if p, *st, err = Make(in, *st, cfg); err != nil {
			t.Fatal(err)
		}
		if check != nil {
			check(p)
		}
	}
	return p
}

// TestLongPromptsWithoutAQueueTimeHistogramTeachNoBreak: on pages without a
// queue-time histogram the mean TTFT judged alone, at any load: long
// prompts whose mean TTFT is past half the SLO with nothing queued broke
// every window, the capacity followed each replica's throughput down, and
// the plan rose by a quarter each round (4 replicas to 75 in an hour at an
// unchanged load, the HPA applying each plan a minute). Past the bound
// with nothing queued, nothing is learned, as with a percentile; with a
// queue standing, it is a break.
func TestLongPromptsWithoutAQueueTimeHistogramTeachNoBreak(t *testing.T) {
	cfg := Default(0)
	const total = 24000.0
	pod := func(i int, w, waiting float64) store.PodLoad {
		return store.PodLoad{Name: fmt.Sprintf("p%d", i), State: store.PodCounted, PromptTokens: w, Tokens: true,
			FirstTokens: w / 2000, Span: 30 * time.Second, TTFT: 1.2, TTFTOK: true, KVCache: 0.05, Waiting: waiting}
	}
	n, at := 4, t0
	var st State
	for range 60 {
		pods := make([]store.PodLoad, n)
		for i := range pods {
			pods[i] = pod(i, total/float64(n), 0)
		}
		var p Plan
		p, st, at = run(t, st, cfg, at, 55*time.Second, pods...)
		n = max(1, min(p.Replicas, 500))
	}
	if n > 8 || st.Breaks > 0 {
		t.Fatalf("an unchanged load (%.0f a second, mean TTFT 1.2 s of an SLO of %s, nothing queued): %d replicas after an hour from 4, %d breaks; want no break learned", total, cfg.TTFT, n, st.Breaks)
	}
	// With requests queued, the same TTFT is a break.
	_, st, _ = run(t, State{}, cfg, t0, time.Minute, pod(0, 6000, 5))
	if st.Breaks == 0 {
		t.Fatal("a mean TTFT past the bound with 5 requests queued: no break learned")
	}
}

// TestAQueueOfRequestsFinishingNowIsNoBreak: vLLM observes a request's
// queue time when it finishes, so after a burst that queued for minutes
// the windows of a replica serving every first token within 15 ms read
// the queue of the long outputs finishing in them (226 s in pulse-sim's
// decode-heavy bursts). Each was taken as past capacity: the capacity fell
// toward what those quiet windows served, and the breaks' level with it.
// A mean queue time above the mean TTFT is not of now: the mean TTFT
// judges the window, as on a page without a queue-time histogram (read as
// at most the mean TTFT, it still broke long prompts whose prefill alone
// takes a quarter of the SLO). One at most the mean TTFT, and past a
// quarter of the SLO, is a break.
func TestAQueueOfRequestsFinishingNowIsNoBreak(t *testing.T) {
	cfg := Default(0)
	// A burst: the replica preempted while it served 40000 a second.
	burst := serving("a", 40000, 0.01)
	burst.Preemptions = 2
	_, st, at := run(t, State{}, cfg, t0, time.Minute, burst)
	known := st
	if known.Breaks == 0 || known.Capacity != 40000 {
		t.Fatalf("the burst: %d breaks, capacity %v; want breaks at 40000", known.Breaks, known.Capacity)
	}
	// The burst over, the requests it queued finish: first tokens within
	// 15 ms, none waiting, the mean queue time of those finishing 226 s.
	after := serving("a", 15000, 226)
	after.TTFT = 0.015
	_, st, at = run(t, st, cfg, at.Add(5*time.Second), time.Minute, after)
	if st.Breaks != known.Breaks || st.Capacity != known.Capacity || st.BreakCapacity != known.BreakCapacity {
		t.Fatalf("windows with first tokens in 15 ms and a queue of 226 s finishing: %d breaks, capacity %v, breaks' level %v; want %d, %v and %v as before",
			st.Breaks, st.Capacity, st.BreakCapacity, known.Breaks, known.Capacity, known.BreakCapacity)
	}
	// Long prompts, their prefill 0.7 s of a 2 s SLO, none waiting, by
	// the means or by a percentile past the SLO (which teaches nothing):
	// no break. By the means, no proof either: with the queue time not of
	// now, a mean TTFT past a quarter of the SLO may be queue or prefill.
	for _, pct := range []float64{0, 0.9} {
		cfg := cfg
		cfg.Percentile = pct
		long := serving("a", 15000, 226)
		long.TTFT, long.TTFTQuantile, long.TTFTQuantileOK = 0.7, 2.5, pct > 0
		if _, st, _ := run(t, known, cfg, at.Add(5*time.Second), time.Minute, long); st.Breaks != known.Breaks || st.Capacity != known.Capacity || st.HealthyMax != known.HealthyMax {
			t.Fatalf("percentile %v: long prompts (mean TTFT 0.7 s) with a queue of 226 s finishing: %d breaks, capacity %v, proven %v; want nothing learned (%d, %v and %v)",
				pct, st.Breaks, st.Capacity, st.HealthyMax, known.Breaks, known.Capacity, known.HealthyMax)
		}
	}
	// Nor is the queue time just above the mean TTFT proof of what just
	// below it is a break (by the means) or is not (by a percentile within
	// the SLO, which then teaches nothing): a mean TTFT of 0.8 s, under
	// one waiting.
	near := serving("a", 15000, 0.79)
	near.TTFT, near.Waiting = 0.8, 0.8
	if _, st, _ := Make(snap(at.Add(5*time.Second), near), known, cfg); st.Breaks != known.Breaks+1 {
		t.Fatalf("queued 0.79 s, mean TTFT 0.8 s: %d breaks, want %d", st.Breaks, known.Breaks+1)
	}
	near.TTFTQuantile = 1.5
	for _, pct := range []float64{0, 0.9} {
		cfg := cfg
		cfg.Percentile, near.TTFTQuantileOK = pct, pct > 0
		for _, q := range []float64{0.79, 0.81} {
			near.QueueTime = q
			if pct == 0 && q < near.TTFT {
				continue // the break above
			}
			if _, st, _ := run(t, known, cfg, at.Add(5*time.Second), time.Minute, near); st.Breaks != known.Breaks || st.HealthyMax != known.HealthyMax {
				t.Fatalf("percentile %v, queued %v s, mean TTFT 0.8 s: %d breaks, proven %v; want nothing learned (%d, %v)", pct, q, st.Breaks, st.HealthyMax, known.Breaks, known.HealthyMax)
			}
		}
	}
	// A queue the first tokens show too is load now: a break.
	after.TTFT = 1.1
	after.QueueTime = 1
	if _, st, _ = Make(snap(at.Add(5*time.Second), after), st, cfg); st.Breaks != known.Breaks+1 {
		t.Fatalf("a mean queue of 1 s with a mean TTFT of 1.1 s: %d breaks, want %d", st.Breaks, known.Breaks+1)
	}
}

// TestAQueueStandingIsABreakBeforeItsRequestsFinish: a queue of requests
// with long outputs shows in their TTFT while it stands, and in their
// queue time (observed at their finish) only once they finish, a decode
// later; by then their TTFT says no queue, and a mean queue time above it
// is not of now. So a queue standing, its mean TTFT past half the SLO, is
// a break (a page without a queue-time histogram breaks there with any
// request waiting, the queue shrinking or not): it was one only
// past the whole SLO, and a queue that stood for less than its requests'
// decode was a break in no window.
func TestAQueueStandingIsABreakBeforeItsRequestsFinish(t *testing.T) {
	cfg := Default(0)
	queued := serving("a", 10000, 0.01) // the requests finishing queued 10 ms
	queued.TTFT, queued.Waiting = 1.5, 3
	if _, st, _ := Make(snap(t0, queued), State{}, cfg); st.Breaks != 1 || st.Capacity != 10000 {
		t.Fatalf("3 requests waiting, a mean TTFT of 1.5 s of a 2 s SLO: %d breaks, capacity %v; want a break at 10000", st.Breaks, st.Capacity)
	}
	// Within half the SLO, the same queue is no break.
	within := queued
	within.TTFT = 0.9
	if _, st, _ := Make(snap(t0, within), State{}, cfg); st.Breaks != 0 {
		t.Fatalf("3 requests waiting, a mean TTFT of 0.9 s: %d breaks, want none", st.Breaks)
	}
	// The queue shrinking, it is no break.
	queued.WaitingGrowth = -0.5
	if _, st, _ := Make(snap(t0, queued), State{}, cfg); st.Breaks != 0 {
		t.Fatalf("3 requests waiting, the queue shrinking: %d breaks, want none", st.Breaks)
	}
}

// TestAReplicaStartingWithAnAgeBelowZeroIsNoCascade: a replica starting
// whose age is below 0 (a garbled snapshot; the store's never are, and
// FuzzMake's durations hold −5 s) was taken to join after the lead time,
// and the backlog's projection ran backwards past it: the replica starting
// asked for more than the plan without it (2 → 7 here). It is a replica
// just created now.
func TestAReplicaStartingWithAnAgeBelowZeroIsNoCascade(t *testing.T) {
	cfg := Default(0)
	st := State{Since: t0.Add(-2 * time.Hour), Capacity: 10000, HealthyMax: 8000, WorkPerRequest: 1000,
		Startups: 1, LeadTime: time.Minute, lastObserve: t0}
	ready := serving("a", 8000, 0.01)
	ready.Waiting, ready.WaitingNow = 2, 2
	p, _, err := Make(snap(t0.Add(time.Second), ready), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, age := range []time.Duration{-5 * time.Minute, 0} {
		q, _, err := Make(snap(t0.Add(time.Second), ready, store.PodLoad{Name: "b", State: store.PodStarting, Age: age}), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if q.Replicas > max(p.Replicas, q.Ready+q.Starting) {
			t.Fatalf("a replica starting, %s old, planned %d (%s) against %d without it, with %d listed: a cascade", age, q.Replicas, q.Reason, p.Replicas, q.Ready+q.Starting)
		}
	}
}

// TestTheLeadTimeLearnedIsBounded: a startup is learned when within
// stuckLeads lead times, and each such moved the lead time half again; with
// no ceiling, startups each just within it (an agent's times that lie) took
// it to 57 hours in 10 and past a century in 34, where the hold wrapped to
// its margin alone and the stuck limit to an hour. No startup past
// maxStartup is learned now.
func TestTheLeadTimeLearnedIsBounded(t *testing.T) {
	cfg := Default(0)
	var st State
	at := t0
	for i := range 60 {
		d := st.stuckAfter() - time.Second
		pods := []store.PodLoad{serving("a", 8000, 0.01), {Name: fmt.Sprintf("s%d", i), State: store.PodMissing, Startup: d, Age: d}}
		var err error
		if _, st, err = Make(snap(at, pods...), st, cfg); err != nil {
			t.Fatal(err)
		}
		at = at.Add(5 * time.Second)
	}
	if st.LeadTime > maxStartup || st.hold(cfg) < st.LeadTime || st.stuckAfter() < stuckAfter {
		t.Fatalf("lead time %s, hold %s, stuck after %s: want a lead time at most %s, held at least as long", st.LeadTime, st.hold(cfg), st.stuckAfter(), maxStartup)
	}
}

// TestANeedAboveZeroIsAReplica: a need above 0 within the rounding's
// 1e-9 was planned as 0 replicas: a replica that taught a capacity of 5e8
// work units a second with a window believed (each counter within
// maxTokenRate), then serving 0.3 tokens a second with a request running on
// a page with no KV-cache gauge, was planned 0 (KEDA deactivates a
// workload allowed to scale to zero, with a request in flight).
func TestANeedAboveZeroIsAReplica(t *testing.T) {
	cfg := Default(0)
	big := store.PodLoad{Name: "a", State: store.PodCounted, PromptTokens: 1e8, GenerationTokens: 1e8, Tokens: true,
		FirstTokens: 10, Span: 30 * time.Second, QueueTime: 1, QueueOK: true, Waiting: 2, KVCache: 0.5}
	_, st, err := Make(snap(t0, big), State{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	small := store.PodLoad{Name: "a", State: store.PodCounted, PromptTokens: 0.3, Tokens: true, FirstTokens: 0.01,
		Span: 30 * time.Second, Running: 1, NoKV: true}
	p, _, err := Make(snap(t0.Add(time.Hour), small), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Need <= 0 || p.Replicas != 1 {
		t.Fatalf("capacity %g, work %g: need %g planned %d replicas (%s); want a need above 0, planned 1", st.Capacity, p.Work, p.Need, p.Replicas, p.Reason)
	}
}

// pastCapacityAt60000 is replica a's run past its capacity at 60000 a
// second for a minute, its queue standing: what it can serve, known.
func pastCapacityAt60000(t *testing.T, cfg Config) (State, time.Time) {
	t.Helper()
	_, known, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 60000, 1))
	if known.Capacity != 60000 || known.BreakCapacity != 60000 {
		t.Fatalf("capacity %v, breaks' level %v; want 60000 and 60000", known.Capacity, known.BreakCapacity)
	}
	return known, at
}

// heldAtTheKnee fails t unless st, after a minute of replica a's windows
// (what) past capacity following known, counted them as breaks and held
// the capacity and the breaks' level where known had them.
func heldAtTheKnee(t *testing.T, what string, st, known State) {
	t.Helper()
	if st.Breaks <= known.Breaks || !st.LastBreak.After(known.LastBreak) {
		t.Fatalf("%s: %d breaks, last at %v; want more than %d, after %v", what, st.Breaks, st.LastBreak, known.Breaks, known.LastBreak)
	}
	if st.Capacity != known.Capacity || st.BreakCapacity != known.BreakCapacity {
		t.Fatalf("%s after a run at 60000: capacity %v, breaks' level %v; want %v and %v as before",
			what, st.Capacity, st.BreakCapacity, known.Capacity, known.BreakCapacity)
	}
}

// TestASwampedReplicaIsLearnedAtItsKnee: a replica that preempts more
// requests a second than it gives a first token is swamped: it redoes work
// its counters do not show (vLLM counts a prompt once, not its recompute
// after a preemption), so what it served is below what it can serve. Its
// window is a break at the most of what it served and its knee, the most
// the replica served in its run past capacity while not swamped. Learned
// from as any break, one replica swamped by a burst pulled the capacity
// from 66,000 to 44,000 a second, and the breaks' level kept the probes
// there (a plan of 4 or 5 replicas where 2 serve).
func TestASwampedReplicaIsLearnedAtItsKnee(t *testing.T) {
	cfg := Default(0)
	known, at := pastCapacityAt60000(t, cfg)
	// Then swamped, in the same run: 40 first tokens a second, 50
	// preemptions a second.
	swamped := serving("a", 40000, 30)
	swamped.Preemptions = 50
	_, st, _ := run(t, known, cfg, at, time.Minute, swamped)
	heldAtTheKnee(t, "swamped (50 preemptions a second, 40 admitted)", st, known)
	// Preempting less than it admits, what it served is its level.
	partly := swamped
	partly.Preemptions = 30
	if _, st, _ = run(t, known, cfg, at, time.Minute, partly); st.Capacity > 45000 || st.BreakCapacity > 45000 {
		t.Fatalf("30 preemptions a second, 40 admitted: capacity %v, breaks' level %v; want them pulled toward 40000", st.Capacity, st.BreakCapacity)
	}
	// Swamped from its run's start (a capacity known too high, a replica
	// overloaded as soon as it serves): nothing shows more, and it pulls
	// the capacity and the breaks' level down as any break does.
	b := swamped
	b.Name = "b"
	if _, st, _ = run(t, known, cfg, at, time.Minute, b); st.Capacity > 45000 || st.BreakCapacity > 45000 {
		t.Fatalf("another replica swamped from its run's start: capacity %v, breaks' level %v; want them pulled toward 40000", st.Capacity, st.BreakCapacity)
	}
	// Down no further than its run showed while not swamped: 50000, then
	// swamped at 40000.
	var lower State
	_, lower, at = run(t, known, cfg, at, 5*time.Second, serving("c", 50000, 1))
	c := swamped
	c.Name = "c"
	if _, st, _ = run(t, lower, cfg, at, time.Minute, c); st.Capacity < 49000 || st.Capacity > 51000 {
		t.Fatalf("swamped after its run showed 50000: capacity %v; want about 50000", st.Capacity)
	}
	// The run ends at a gap: swamped again a minute later, nothing shows
	// more.
	if _, st, _ = run(t, lower, cfg, at.Add(time.Minute), time.Minute, c); st.Capacity > 45000 {
		t.Fatalf("swamped a minute after its run showed 50000: capacity %v; want it pulled toward 40000", st.Capacity)
	}
	// Swamped for longer than a hold since it last served unswamped (the
	// capacity asked for has had time to come), it pulls the capacity
	// down as any break: the capacity may be what is too high.
	if _, st, _ = run(t, known, cfg, at, known.hold(cfg)+2*time.Minute, swamped); st.Capacity > 45000 || st.BreakCapacity > 45000 {
		t.Fatalf("swamped for a hold and more after a run at 60000: capacity %v, breaks' level %v; want them pulled toward 40000", st.Capacity, st.BreakCapacity)
	}
	// Its queue shrinking, it is swamped by a backlog only it can drain
	// (no engine hands its queue to another): the knee holds.
	draining := swamped
	draining.WaitingGrowth = -1
	if _, st, _ = run(t, known, cfg, at, known.hold(cfg)+2*time.Minute, draining); st.Capacity != known.Capacity || st.BreakCapacity != known.BreakCapacity {
		t.Fatalf("swamped for a hold and more, draining its queue, after a run at 60000: capacity %v, breaks' level %v; want %v and %v as before",
			st.Capacity, st.BreakCapacity, known.Capacity, known.BreakCapacity)
	}
}

// TestAReplicaDrainingItsBacklogIsLearnedAtItsKnee: a replica past
// capacity whose queue shrinks over the window while the fleet has room
// (another replica serves within its capacity, and the replicas judged
// serve, on average, less than the planned utilisation of the capacity)
// serves a backlog built before the capacity came: its requests' queue
// time is the backlog's, and what it served falls as the backlog runs out
// (the router sends new work to the replicas that came for it). Its
// window is a break at the most of what it served and its knee, as a
// swamped replica's is.
// Learned at what it served, the two replicas a burst had overrun pulled
// the capacity from 42,000 to 21,000 a second as they drained (the 8B RAG
// bursts), and the plan held twice the replicas the later bursts needed.
func TestAReplicaDrainingItsBacklogIsLearnedAtItsKnee(t *testing.T) {
	cfg := Default(0)
	known, at := pastCapacityAt60000(t, cfg)
	// In the same run, draining: its requests queued 30 s, its queue
	// shrinking, 20000 a second served, while a replica that came for
	// the load serves 10000 within the SLO.
	draining := serving("a", 20000, 30)
	draining.Waiting, draining.WaitingGrowth = 5, -1
	came := serving("h", 10000, 0)
	_, st, _ := run(t, known, cfg, at, time.Minute, draining, came)
	heldAtTheKnee(t, "draining at 20000 beside a replica within its capacity", st, known)
	// Its queue not shrinking, what it served is a break as any.
	standing := draining
	standing.WaitingGrowth = 0
	pulledDown(t, "a queue standing at 20000", known, cfg, at, 30000, standing, came)
	// No replica within its capacity: the capacity is what is in
	// question, so it is no evidence of room. (Judged by it alone, a
	// capacity twice too high kept a saturated replica's every window at
	// the knee while its queue shrank.)
	pulledDown(t, "draining at 20000 alone", known, cfg, at, 30000, draining)
	// The replicas judged serve past the planned utilisation of the
	// capacity (0.8 of 60000 on average): a fleet still past capacity
	// whose queues move. (Taken at the knee, a run's highest window held
	// the capacity up through a step.)
	busy := serving("a", 50000, 30)
	busy.Waiting, busy.WaitingGrowth = 5, -1
	within := serving("h", 50000, 0)
	pulledDown(t, "draining at 50000 beside a replica within its capacity at 50000", known, cfg, at, 55000, busy, within)
	// Nor do replicas with no window judged (one just ready, one thin)
	// count toward room: counted, they made room of their own.
	ready := store.PodLoad{Name: "new", State: store.PodCounted, Tokens: true, Span: 30 * time.Second}
	thin := serving("t", 20000, 0)
	thin.Span = 5 * time.Second
	pulledDown(t, "draining at 50000 beside a replica within its capacity at 50000, one just ready and one thin", known, cfg, at, 55000, busy, within, ready, thin)
	// Draining from its run's start, nothing shows more: what it served.
	b := draining
	b.Name = "b"
	pulledDown(t, "another replica draining from its run's start at 20000", known, cfg, at, 30000, b, came)
}

// pulledDown fails t unless a minute of pods' windows from at, after
// known, left the capacity at most below.
func pulledDown(t *testing.T, what string, known State, cfg Config, at time.Time, below float64, pods ...store.PodLoad) {
	t.Helper()
	if _, st, _ := run(t, known, cfg, at, time.Minute, pods...); st.Capacity > below {
		t.Fatalf("%s after a run at 60000: capacity %v, breaks' level %v; want the capacity pulled down to %v or less", what, st.Capacity, st.BreakCapacity, below)
	}
}

// TestASwampedWindowSetsNoLevelOfItsOwn: a swamped replica's window (more
// preemptions a second than first tokens) is the first evidence taken
// whole, but sets no breaks' level where none was known (the probes
// would stop at what it served); it is learned after the other windows
// of its observation, whatever order the replicas come in; and under a
// capacity still climbing to the breaks' level, it pulls that level no
// lower than its knee.
func TestASwampedWindowSetsNoLevelOfItsOwn(t *testing.T) {
	cfg := Default(0)
	swamped := serving("a", 40000, 30)
	swamped.Preemptions = 50
	if _, st, _ := Make(snap(t0, swamped), State{}, cfg); st.Capacity != 40000 || st.Breaks != 1 || st.BreakCapacity != 0 {
		t.Fatalf("swamped, nothing known: capacity %v, breaks' level %v, %d breaks; want 40000, none and 1", st.Capacity, st.BreakCapacity, st.Breaks)
	}
	// In one observation, the swamped are learned after the others,
	// whatever order the replicas come in.
	_, ab, _ := Make(snap(t0, swamped, serving("d", 66000, 1)), State{}, cfg)
	_, ba, _ := Make(snap(t0, serving("d", 66000, 1), swamped), State{}, cfg)
	if ab.Capacity != ba.Capacity || ab.BreakCapacity != ba.BreakCapacity {
		t.Fatalf("a swamped replica and another past capacity unswamped: capacity %v and breaks' level %v in one order, %v and %v in the other",
			ab.Capacity, ab.BreakCapacity, ba.Capacity, ba.BreakCapacity)
	}
	// Swamped at or above a capacity below the breaks' level (a capacity
	// still climbing to it), the breaks' level is pulled no lower than
	// the knee: taken as any break, one serving more moved it lower.
	for _, w := range []float64{45000, 52000, 60000} {
		st := State{Capacity: 50000, BreakCapacity: 66000}
		st.learnBroken(window{name: "e", w: w, n: 100, broke: true, thrash: true, knee: 66000}, math.Inf(1), t0, false, 0)
		if st.BreakCapacity != 66000 || st.Capacity < 50000 {
			t.Fatalf("swamped at %v, its knee 66000, under a capacity of 50000 and breaks' level of 66000: capacity %v, breaks' level %v; want the level kept, the capacity not lowered",
				w, st.Capacity, st.BreakCapacity)
		}
	}
}

// TestAQuietObservationKeepsNoKnee: an observation with no window past
// capacity, and no run to end, allocates no knee (each made a slice at
// every observation of every workload), and a run's knee is kept only
// while its replica stays past capacity.
func TestAQuietObservationKeepsNoKnee(t *testing.T) {
	var st State
	quiet := []window{{name: "a", w: 30000, n: 100, healthy: true}, {name: "b", w: 20000, n: 100, thin: true}}
	if allocs := testing.AllocsPerRun(100, func() { st.kneesOf(quiet, t0, time.Minute, time.Hour) }); allocs != 0 || st.knees != nil {
		t.Fatalf("%v allocations, knees %+v: want none", allocs, st.knees)
	}
	broke := []window{{name: "a", w: 60000, n: 100, broke: true}, quiet[1]}
	st.kneesOf(broke, t0, time.Minute, time.Hour)
	if len(st.knees) != 1 || st.knees[0].most != 60000 || broke[0].knee != 60000 {
		t.Fatalf("knees %+v, window's knee %v: want a's run, at 60000", st.knees, broke[0].knee)
	}
	st.kneesOf(quiet, t0.Add(5*time.Second), time.Minute, time.Hour)
	if st.knees != nil {
		t.Fatalf("knees %+v after a's window within capacity: want its run ended", st.knees)
	}
}

// TestAQueueHandedToAReplicaJustReadyIsNoArrival: 40 requests a gateway
// held are handed to replica e a second after it is ready. Its gauge's
// first two samples (0, then 40, a second apart) read as a queue growing
// 40 requests a second, while the gateway's fall by 40 read as nothing:
// the same 40 requests were planned as new arrivals, 4 replicas to 14 at
// an unchanged load, and the surge learned of it held the plan at 14 five
// minutes on. A window shorter than the others' grows over theirs.
func TestAQueueHandedToAReplicaJustReadyIsNoArrival(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 10000, 1))
	pods := []store.PodLoad{serving("a", 7000, 0.1), serving("b", 7000, 0.1), serving("c", 7000, 0.1), serving("d", 7000, 0.1)}
	e := store.PodLoad{Name: "e", State: store.PodCounted, Tokens: true, Span: time.Second, KVCache: 0.01}
	in := func(held float64) Input {
		return Input{At: at, Found: true, Pods: append(slices.Clone(pods), e), Demand: store.DemandValue{Sources: 1, Held: held}}
	}
	atGateway, stGateway, err := Make(in(40), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Waiting, e.WaitingNow, e.WaitingGrowth = 20, 40, 40
	handed, stHanded, err := Make(in(0), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if handed.Replicas > atGateway.Replicas+1 {
		t.Errorf("the 40 requests at the gateway: plan %d; handed to e, just ready: %d (%s)", atGateway.Replicas, handed.Replicas, handed.Reason)
	}
	steady := []store.PodLoad{serving("a", 5600, 0.1), serving("b", 5600, 0.1), serving("c", 5600, 0.1), serving("d", 5600, 0.1), serving("e", 5600, 0.1)}
	g, _, _ := run(t, stGateway, cfg, at.Add(5*time.Second), 5*time.Minute, steady...)
	h, _, _ := run(t, stHanded, cfg, at.Add(5*time.Second), 5*time.Minute, steady...)
	if h.Replicas > g.Replicas+1 {
		t.Errorf("5 minutes of the same load on: plan %d after the hand-over, %d after the gateway held them (%s)", h.Replicas, g.Replicas, h.Reason)
	}
}

// TestOneSnapshotAheadOfTheClockCorruptsNothing: one snapshot stamped a
// day ahead (a clock stepped forward and back, a garbled caller), then the
// clock as before, the load unchanged. Its observation's time became the
// last observation's, and its need a peak a day ahead: nothing was observed
// for the day (no capacity, surge or lead time learned) and its peak, never
// past its hold, was held for the day and a hold.
func TestOneSnapshotAheadOfTheClockCorruptsNothing(t *testing.T) {
	cfg := Default(0)
	a, b := serving("a", 4000, 0.01), serving("b", 4000, 0.01)
	_, st, at := run(t, State{}, cfg, t0, 20*time.Minute, a, b)
	before := st.Observations
	var err error
	if _, st, err = Make(snap(at.Add(24*time.Hour), a, b), st, cfg); err != nil {
		t.Fatal(err)
	}
	p, st, end := run(t, st, cfg, at.Add(5*time.Second), 2*time.Hour, a, b)
	if p.HeldUntil.After(end.Add(st.hold(cfg))) || st.Observations < before+1000 {
		t.Fatalf("two hours back on the clock: %d observations since (want the observations going on, 1,440 of them), a peak held until %s, %s after the last plan (want within a hold, %s)",
			st.Observations-before, p.HeldUntil.UTC().Format(time.RFC3339), p.HeldUntil.Sub(end), st.hold(cfg))
	}
}

// TestASnapshotAheadWithNoFreshPodLearnsStartupsAfter: a snapshot stamped
// an hour ahead whose ready pods have no fresh sample (ErrStale, its state
// kept by the scaler) still counts their startups: startupsTo an hour
// ahead. rebase returns early unless lastObserve, Since, surgeAt or
// healthyAt is ahead, none of which that path sets, so startupsTo stays
// ahead and every startup ready before it less lateListing is passed over:
// no lead time learned for the hour.
func TestASnapshotAheadWithNoFreshPodLearnsStartupsAfter(t *testing.T) {
	cfg := Default(0)
	_, st, at := run(t, State{}, cfg, t0, time.Minute, serving("a", 4000, 0.01))
	stale := store.PodLoad{Name: "s", State: store.PodMissing, Startup: 2 * time.Minute, Age: 2 * time.Minute}
	var err error
	if _, st, err = Make(snap(at.Add(time.Hour), stale), st, cfg); !errors.Is(err, ErrStale) {
		t.Fatalf("an hour ahead with no fresh pod: %v, want ErrStale", err)
	}
	startups := st.Startups
	fresh := store.PodLoad{Name: "new", State: store.PodMissing, Startup: 3 * time.Minute, Age: 3*time.Minute + 10*time.Second}
	if _, st, err = Make(snap(at.Add(5*time.Second), serving("a", 4000, 0.01), fresh), st, cfg); err != nil {
		t.Fatal(err)
	}
	if st.Startups != startups+1 || st.startupsTo.After(at.Add(5*time.Second)) {
		t.Fatalf("back on the clock: %d startups counted (want %d), startupsTo %s ahead", st.Startups-startups, 1, st.startupsTo.Sub(at.Add(5*time.Second)))
	}
}
