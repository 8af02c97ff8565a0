package sim

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

// TestStaticFleet: static:N runs N warm replicas for the whole run, with no
// scale event, whatever the traffic.
func TestStaticFleet(t *testing.T) {
	reqs := load(t, "bursts:base=1,peak=40,on=2m,off=6m,duration=20m", 1)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: []string{"static:3"}})
	p := result(r, "static:3")
	for i, n := range p.Series.Replicas {
		if n != 3 || p.Series.Ready[i] != 3 {
			t.Fatalf("sample %d: %d replicas, %d ready; want 3 and 3", i, n, p.Series.Ready[i])
		}
	}
	want := 3 * r.Config.HorizonSeconds / 3600
	if p.ScaleEvents != 0 || p.GPUHours < want-0.001 || p.GPUHours > want+0.001 {
		t.Fatalf("%d scale events, %.4f GPU-hours; want 0 and %.4f", p.ScaleEvents, p.GPUHours, want)
	}
	// After the warm-up, to the last arrival: the drain is charged to no one.
	wantWarm := 3 * (reqs[len(reqs)-1].At - DefaultWarmup).Hours()
	if p.GPUHoursAfterWarmup < wantWarm-0.001 || p.GPUHoursAfterWarmup > wantWarm+0.001 {
		t.Fatalf("%.4f GPU-hours after the warm-up, want %.4f", p.GPUHoursAfterWarmup, wantWarm)
	}
}

// TestSwitchChangesTheFleetOnce: switch:from=N,to=M,at=F runs N warm
// replicas, and asks for M once, a fraction F of the way from the end of
// the warm-up to the last arrival: up, a replica starts then and is Ready
// a startup later; down, one leaves then. Its GPU-hours after the warm-up
// lie between the two fleets'.
func TestSwitchChangesTheFleetOnce(t *testing.T) {
	reqs := load(t, "poisson:rate=4,duration=30m", 1)
	last := reqs[len(reqs)-1].At
	at := DefaultWarmup + (last-DefaultWarmup)/2
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1,
		Pipelines: []string{"static:2", "static:3", "switch:from=2,to=3,at=0.5", "switch:from=3,to=2,at=0.5"}})
	every := time.Duration(r.Config.SampleSeconds * float64(time.Second))
	i := int(at / every) // the sample at the switch (or just before it)
	up, down := result(r, "switch:from=2,to=3,at=0.5"), result(r, "switch:from=3,to=2,at=0.5")
	for _, c := range []struct {
		p                       *PipelineResult
		before, after, readyNow int
	}{{up, 2, 3, 2}, {down, 3, 2, 2}} {
		s := c.p.Series
		if s.Replicas[0] != c.before || s.Ready[0] != c.before || s.Replicas[i-1] != c.before || c.p.ScaleEvents != 1 {
			t.Fatalf("%s: %d replicas (%d ready) at 0, %d before the switch, %d scale events; want %d warm and one event",
				c.p.Pipeline, s.Replicas[0], s.Ready[0], s.Replicas[i-1], c.p.ScaleEvents, c.before)
		}
		// Up, the new replica is there (starting) from the switch on; down,
		// the one removed drains, and is gone by the end.
		if c.after > c.before && s.Replicas[i+1] != c.after {
			t.Fatalf("%s: %d replicas just after the switch, want %d", c.p.Pipeline, s.Replicas[i+1], c.after)
		}
		if s.Ready[i+1] != c.readyNow || s.Replicas[len(s.Replicas)-1] != c.after {
			t.Fatalf("%s: %d ready just after the switch, %d replicas at the end; want %d and %d",
				c.p.Pipeline, s.Ready[i+1], s.Replicas[len(s.Replicas)-1], c.readyNow, c.after)
		}
	}
	if s := up.Series; s.Ready[i+int(10*time.Minute/every)] != 3 {
		t.Fatalf("the replica asked for at the switch is not Ready 10 minutes later: %v", s.Ready[i:])
	}
	lo, hi := result(r, "static:2").GPUHoursAfterWarmup, result(r, "static:3").GPUHoursAfterWarmup
	for _, p := range []*PipelineResult{up, down} {
		if g := p.GPUHoursAfterWarmup; g <= lo+0.05 || g >= hi-0.05 {
			t.Fatalf("%s: %.3f GPU-hours after the warm-up, want well between static:2's %.3f and static:3's %.3f", p.Pipeline, g, lo, hi)
		}
	}
}

// TestClairvoyantScalesAheadOfAStep: a step of load at 10 minutes; the
// clairvoyant, knowing it and its replicas' startup times, has the capacity
// Ready when it comes (98 % or more within the SLO) and releases it after; a
// reactive pipeline on the same step misses requests while its replicas
// start.
func TestClairvoyantScalesAheadOfAStep(t *testing.T) {
	reqs := load(t, "steps:rates=2/60/2,step=10m,prompt=1000,output=200", 4)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 4, Pipelines: []string{"clairvoyant", "oracle"}})
	c, o := result(r, "clairvoyant"), result(r, "oracle")
	stepAt := int(10 * time.Minute / time.Duration(r.Config.SampleSeconds*float64(time.Second)))
	if c.Series.Ready[stepAt] < 2 {
		t.Fatalf("the clairvoyant had %d replicas ready when the step came (%v)", c.Series.Ready[stepAt], c.Series.Ready)
	}
	if c.Series.Ready[stepAt-int(6*time.Minute/time.Duration(r.Config.SampleSeconds*float64(time.Second)))] != 1 {
		t.Fatalf("the clairvoyant scaled more than a startup time early (%v)", c.Series.Ready)
	}
	last := len(c.Series.Replicas) - 1
	if c.SLOAttainment < 0.98 || c.Series.Replicas[last] != 1 {
		t.Fatalf("clairvoyant: %.4f within the SLO, %d replicas at the end", c.SLOAttainment, c.Series.Replicas[last])
	}
	if o.SLOAttainment >= c.SLOAttainment {
		t.Fatalf("the oracle (%.4f) reached the clairvoyant (%.4f) through the HPA on a step", o.SLOAttainment, c.SLOAttainment)
	}
}

// onAStep runs two planned pipelines on the step of load of
// TestClairvoyantScalesAheadOfAStep (2, 60, then 2 again, 10 minutes
// each): their results, and the series' sample period.
func onAStep(t *testing.T, names ...string) (a, b *PipelineResult, per time.Duration) {
	t.Helper()
	reqs := load(t, "steps:rates=2/60/2,step=10m,prompt=1000,output=200", 4)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 4, Pipelines: names})
	return result(r, names[0]), result(r, names[1]), time.Duration(r.Config.SampleSeconds * float64(time.Second))
}

// TestHindsightFollowsAStep: the same step as the clairvoyant's; hindsight
// sees it only once it has arrived, so its replicas are ready a startup
// after the step, not before, and it misses requests meanwhile as a
// reactive pipeline does; it holds the capacity for its hold after the
// step's end, then releases it.
func TestHindsightFollowsAStep(t *testing.T) {
	h, c, per := onAStep(t, "hindsight:hold=2m", "clairvoyant")
	stepAt := int(10 * time.Minute / per)
	if h.Series.Replicas[stepAt-1] != 1 || h.Series.Ready[stepAt+int(time.Minute/per)] != 1 {
		t.Fatalf("hindsight scaled before the step, or had replicas ready within a minute of it (%v)", h.Series.Ready)
	}
	if h.Series.Ready[stepAt+int(8*time.Minute/per)] < 2 {
		t.Fatalf("hindsight had %d replicas ready 8 minutes into the step (%v)", h.Series.Ready[stepAt+int(8*time.Minute/per)], h.Series.Ready)
	}
	endAt := int(20 * time.Minute / per)
	if h.Series.Replicas[endAt+int(time.Minute/per)] < 2 || h.Series.Replicas[endAt+int(5*time.Minute/per)] != 1 {
		t.Fatalf("hindsight did not hold the step's count for its 2-minute hold and then release it (%v)", h.Series.Replicas)
	}
	if h.SLOAttainment >= c.SLOAttainment {
		t.Fatalf("hindsight (%.4f) reached the clairvoyant (%.4f) on a step", h.SLOAttainment, c.SLOAttainment)
	}
}

// TestClairvoyantHoldKeepsTheStep: the same step; the clairvoyant with a
// hold is ready for it as the one without is (the same foresight), and
// keeps the step's count for its hold after the step's end where the one
// without releases it at once; it spends more GPU-hours, and never has
// fewer replicas.
func TestClairvoyantHoldKeepsTheStep(t *testing.T) {
	h, c, per := onAStep(t, "clairvoyant:hold=5m", "clairvoyant")
	stepAt, endAt := int(10*time.Minute/per), int(20*time.Minute/per)
	if h.Series.Ready[stepAt] < 2 {
		t.Fatalf("the clairvoyant with a hold had %d replicas ready when the step came (%v)", h.Series.Ready[stepAt], h.Series.Ready)
	}
	after := func(p *PipelineResult, d time.Duration) int { return p.Series.Replicas[endAt+int(d/per)] }
	if after(c, time.Minute) != 1 {
		t.Fatalf("the clairvoyant without a hold kept %d replicas a minute after the step (%v)", after(c, time.Minute), c.Series.Replicas)
	}
	if after(h, 4*time.Minute) < 2 || after(h, 7*time.Minute) != 1 {
		t.Fatalf("the clairvoyant with a 5-minute hold did not keep the step's count 4 minutes after it and release it by 7 (%v)", h.Series.Replicas)
	}
	for i := range h.Series.Replicas {
		if h.Series.Replicas[i] < c.Series.Replicas[i] {
			t.Fatalf("sample %d: %d replicas with the hold, %d without", i, h.Series.Replicas[i], c.Series.Replicas[i])
		}
	}
	if h.GPUHours <= c.GPUHours {
		t.Fatalf("the hold cost nothing: %.4f GPU-hours against %.4f", h.GPUHours, c.GPUHours)
	}
}

// jumpAt200 is a need of 1 replica until 200 s, then 3.
func jumpAt200() []float64 {
	need := make([]float64, 600)
	for i := range need {
		need[i] = 1
		if i >= 200 {
			need[i] = 3
		}
	}
	return need
}

// planEachSecond runs a clairvoyant with need jumpAt200 second by second
// from 0 to until, from ready replicas warm at 0 and the startups given
// for the replicas it then creates, in a world of its own (readiness
// events run as they fall due); it returns the world.
func planEachSecond(t *testing.T, ready int32, startups []time.Duration, until time.Duration) *world {
	t.Helper()
	cfg := Config{Trace: load(t, "poisson:rate=1,duration=15m", 1), ScaledObject: seedSO(t), Profile: profile(t), Seed: 1}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	c := &clairvoyant{util: 1, lo: 1, hi: 10}
	c.setNeed(jumpAt200())
	w := newWorld(&cfg, c)
	w.startups = startups
	w.warmFleet(ready)
	for w.now = 0; w.now <= until; w.now += time.Second {
		for len(w.ev) > 0 && w.ev[0].at <= w.now {
			w.fire(w.take(w.ev.pop()))
		}
		w.setSpec(c.plan(w), true)
	}
	return w
}

// TestEachReplicaTheClairvoyantAddsLeadsByItsOwnStartup: a jump at 200 s
// needs three replicas. Planned second by second, each replica it adds is
// started a startup of its own before the jump, in the order it creates
// them, and none it starts is given back before the jump (one started and
// cancelled the next second would be two scale events more): a second
// replica drawn 300 s starts at 0 with the first, drawn 60 s (Ready at
// 300 s: the jump came sooner than it could); drawn 60 s and 300 s from
// two running, the third starts at 140 s; a replica is released only when
// the ones that would bring it back are quick enough.
func TestEachReplicaTheClairvoyantAddsLeadsByItsOwnStartup(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		ready    int32
		startups []time.Duration
		events   int   // scale events to the jump
		atJump   int   // replicas ready at it
		kept     int32 // the count at 1 s
	}{
		{1, []time.Duration{60 * s, 300 * s, 60 * s}, 1, 2, 3},   // 1 → 3 at 0
		{2, []time.Duration{60 * s, 300 * s, 60 * s}, 1, 3, 2},   // 2 → 3 at 140 s
		{1, []time.Duration{60 * s, 60 * s, 60 * s}, 1, 3, 1},    // 1 → 3 at 140 s
		{1, []time.Duration{150 * s, 60 * s, 150 * s}, 2, 3, 1},  // 1 → 2 at 50 s, → 3 at 140 s
		{3, []time.Duration{60 * s, 60 * s, 60 * s}, 2, 3, 1},    // 3 → 1 at 0, → 3 at 140 s
		{3, []time.Duration{60 * s, 240 * s, 60 * s}, 2, 3, 2},   // 3 → 2 at 0 (the next draw would bring it back), → 3 at 140 s
		{3, []time.Duration{240 * s, 60 * s, 60 * s}, 0, 3, 3},   // bringing one back takes 240 s: all kept
		{3, []time.Duration{100 * s, 100 * s, 100 * s}, 2, 3, 1}, // 3 → 1 at 0, → 3 at 100 s
	} {
		if w := planEachSecond(t, c.ready, c.startups, time.Second); w.spec != c.kept {
			t.Errorf("%d running, startups %v: %d at 1 s, want %d", c.ready, c.startups, w.spec, c.kept)
		}
		w := planEachSecond(t, c.ready, c.startups, 200*s)
		if w.st.scaleEvents != c.events || len(w.ready) != c.atJump {
			t.Errorf("%d running, startups %v: %d scale events to the jump, %d ready at it; want %d and %d", c.ready, c.startups, w.st.scaleEvents, len(w.ready), c.events, c.atJump)
		}
	}
}

// TestTheClairvoyantStartsWarmWithWhatItKeeps: the warm fleet at 0 is what
// its plan keeps a second later: with the jump within a later replica's
// startup, that replica is warm too, not added late at 1 s.
func TestTheClairvoyantStartsWarmWithWhatItKeeps(t *testing.T) {
	s := time.Second
	c := clairvoyant{util: 1, lo: 1, hi: 10}
	c.setNeed(jumpAt200())
	if got := c.Initial(&world{startups: []time.Duration{240 * s, 60 * s, 300 * s}}); got != 3 {
		t.Errorf("draws 240, 60, 300 s and a jump to 3 at 200 s: %d warm, want 3", got)
	}
	if got := c.Initial(&world{startups: []time.Duration{60 * s, 60 * s, 60 * s}}); got != 1 {
		t.Errorf("draws of 60 s and a jump at 200 s: %d warm, want 1", got)
	}
	// Its plan a second later keeps them: the warm ones drew no startup,
	// so the draws that would bring one back are those Initial looked at.
	for _, draws := range [][]time.Duration{{240 * s, 60 * s, 300 * s}, {200 * s, 260 * s, 230 * s}, {100 * s, 250 * s, 90 * s}} {
		warm := c.Initial(&world{startups: draws})
		if w := planEachSecond(t, warm, draws, time.Second); w.st.scaleEvents != 0 {
			t.Errorf("draws %v: %d warm, then %d at 1 s", draws, warm, w.spec)
		}
	}
}

// TestUtilisationTracesAFrontier: a lower target utilisation buys more
// GPU-hours, never fewer.
func TestUtilisationTracesAFrontier(t *testing.T) {
	reqs := load(t, "bursts:base=2,peak=40,on=3m,off=7m,duration=30m", 2)
	names := []string{"clairvoyant:utilisation=0.4", "clairvoyant:utilisation=0.7", "clairvoyant:utilisation=1.2"}
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 2, Pipelines: names})
	for i := 1; i < len(names); i++ {
		a, b := result(r, names[i-1]), result(r, names[i])
		if a.GPUHours < b.GPUHours {
			t.Errorf("%s: %.3f GPU-hours, below %s's %.3f", a.Pipeline, a.GPUHours, b.Pipeline, b.GPUHours)
		}
	}
}

// TestNoSilentSwaps: a pipeline that cannot express the trigger's metric is
// refused by name when asked for, and left out (said in the report) when
// none was named — never run as another trigger.
func TestNoSilentSwaps(t *testing.T) {
	reqs := load(t, "poisson:rate=2,duration=15m", 1)
	so := seedSO(t, "metric: waiting", "metric: saturation", `threshold: "10"`, `threshold: "0.8"`)
	for _, p := range []string{"prometheus", "prometheus-avg", "kaito"} {
		_, err := Run(Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Pipelines: []string{p}})
		if err == nil || !strings.Contains(err.Error(), "pipeline "+p+" cannot express metric saturation") {
			t.Errorf("%s with saturation: %v", p, err)
		}
	}
	r := run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: 1})
	if got := strings.Join(r.Config.PipelineNames, ","); got != "pulse,oracle" {
		t.Errorf("pipelines run for saturation: %s, want pulse,oracle", got)
	}
	if len(r.Config.Skipped) != 3 || !strings.Contains(r.Config.Skipped[0], "prometheus cannot express metric saturation") {
		t.Errorf("skipped: %q", r.Config.Skipped)
	}
}

// TestPlannedPipelineNamesAreChecked: bad static, switch, clairvoyant and
// hindsight parameters are refused with what was wrong.
func TestPlannedPipelineNamesAreChecked(t *testing.T) {
	reqs := load(t, "poisson:rate=1,duration=15m", 1)
	for name, want := range map[string]string{
		"static:0":                    "static:N",
		"static:x":                    "static:N",
		"clairvoyant:utilisation=0":   "utilisation",
		"clairvoyant:window=1ms":      "window",
		"clairvoyant:colour=red":      "unknown key",
		"pulse:fast":                  "one of pulse",
		"clairvoyant:horizon=forever": `horizon "forever"`,
		"hindsight:hold=forever":      `hold "forever"`,
		"clairvoyant:hold=0s":         `hold "0s"`,
		"hindsight:horizon=5m":        `unknown key "horizon" (window, hold, utilisation)`,
		"hindsight:utilisation=9":     `utilisation "9"`,
		"switch:from=1,to=2":          "at is required",
		"switch:from=2,to=2,at=0.5":   "that is static:2",
		"switch:from=0,to=2,at=0.5":   `from "0"`,
		"switch:from=1,to=2,at=1":     `at "1"`,
		"switch:from=1,to=2,at=0.5,x": `unknown key "x" (from, to, at)`,
		// A key given twice: the last was taken (found in a review,
		// 2026-12-05).
		"switch:from=1,to=2,at=0.5,at=0.9":      "at given twice",
		"clairvoyant:window=10s,window=1m":      "window given twice",
		"hindsight:utilisation=1,utilisation=2": "utilisation given twice",
	} {
		_, err := Run(Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Pipelines: []string{name}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, want)
		}
	}
}

// TestPlanKeyWritesAPlanOneWay: names that plan alike have one key, names
// that plan differently do not, and other pipelines have none.
func TestPlanKeyWritesAPlanOneWay(t *testing.T) {
	for _, same := range [][]string{
		{"hindsight:utilisation=1,window=1m0s", "hindsight:window=1m,utilisation=1", "hindsight:window=60s,utilisation=1.0"},
		{"clairvoyant", "clairvoyant:utilisation=0.7", "clairvoyant:window=30s"},
		{"clairvoyant:hold=15m,utilisation=2", "clairvoyant:utilisation=2,window=30s,hold=900s"},
		{"switch:from=1,to=2,at=0.5", "switch:at=0.50,to=2,from=1"},
	} {
		want, ok := PlanKey(same[0])
		if !ok {
			t.Fatalf("%s has no key", same[0])
		}
		for _, n := range same[1:] {
			if got, _ := PlanKey(n); got != want {
				t.Errorf("%s: key %q, want %q (as %s)", n, got, want, same[0])
			}
		}
	}
	for _, pair := range [][2]string{
		{"hindsight:utilisation=1", "clairvoyant:utilisation=1"},
		{"clairvoyant:utilisation=1", "clairvoyant:utilisation=1,hold=1h"},
		{"hindsight:window=1m", "hindsight:window=10s"},
		{"switch:from=1,to=2,at=0.5", "switch:from=2,to=1,at=0.5"},
	} {
		a, _ := PlanKey(pair[0])
		b, _ := PlanKey(pair[1])
		if a == b {
			t.Errorf("%s and %s share key %q", pair[0], pair[1], a)
		}
	}
	for _, n := range []string{"pulse", "static:3", "hindsight:colour=red", "clairvoyant:window=1ms", "switch:from=1,to=2"} {
		if k, ok := PlanKey(n); ok {
			t.Errorf("%s: key %q, want none", n, k)
		}
	}
}

// TestWarmupScores: the after-warm-up scores count only requests arriving
// after it and replica-time after it up to the last arrival; goodput is
// their quotient.
func TestWarmupScores(t *testing.T) {
	// Overloaded at first (one replica, 40/s), then light: the warm-up
	// hides the bad start.
	reqs := load(t, "steps:rates=40/2/2,step=5m,prompt=1000,output=200", 3)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 3, Pipelines: []string{"static:1"},
		Warmup: 5 * time.Minute, Drain: time.Minute})
	p := result(r, "static:1")
	if p.SLOAfterWarmup <= p.SLOAttainment {
		t.Fatalf("after the warm-up %.4f, whole run %.4f: the warm-up should leave out the overload", p.SLOAfterWarmup, p.SLOAttainment)
	}
	if want := (reqs[len(reqs)-1].At - 5*time.Minute).Hours(); p.GPUHoursAfterWarmup < want-0.001 || p.GPUHoursAfterWarmup > want+0.001 {
		t.Fatalf("%.4f GPU-hours after the warm-up, want %.4f", p.GPUHoursAfterWarmup, want)
	}
	after := 0
	for _, q := range reqs {
		if q.At >= 5*time.Minute {
			after++
		}
	}
	want := float64(after) * p.SLOAfterWarmup / p.GPUHoursAfterWarmup
	if p.GoodputPerGPUHour < want*0.999 || p.GoodputPerGPUHour > want*1.001 {
		t.Fatalf("goodput %.1f per GPU-hour, want %.1f", p.GoodputPerGPUHour, want)
	}
	if _, err := Run(Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Warmup: 2 * time.Hour}); err == nil {
		t.Error("a warm-up longer than the run was accepted")
	}
}

// TestInitialReplicasAreWarm: --initial-replicas N starts N Ready replicas.
func TestInitialReplicasAreWarm(t *testing.T) {
	reqs := load(t, "poisson:rate=1,duration=15m", 1)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: []string{"oracle"}, InitialReplicas: 4})
	if p := result(r, "oracle"); p.Series.Ready[0] != 4 {
		t.Fatalf("%d ready at 0, want 4", p.Series.Ready[0])
	}
}

// TestAWarmFleetIsNotTakenToZeroAtOnce: a warm start is a service
// already serving, so KEDA was active a moment before; with
// minReplicaCount 0 and no lastActiveTime, its first poll that found the
// trigger inactive (a queue under its threshold) took the warm fleet to
// zero within 30 s. The cooldown (300 s) now counts from the start.
func TestAWarmFleetIsNotTakenToZeroAtOnce(t *testing.T) {
	reqs := load(t, "poisson:rate=5,duration=5m,prompt=1000,output=200", 1)
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0")
	res := result(run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}, WarmStart: true, SampleEvery: 10 * time.Second}), "pulse")
	for i, n := range res.Series.Replicas[:min(len(res.Series.Replicas), 25)] { // the first 4 minutes
		if n == 0 {
			t.Fatalf("the warm fleet at zero at %d s (%v); want it kept through the cooldown", i*10, res.Series.Replicas)
		}
	}
}

// TestAWarmStartGivesEveryPipelineTheClairvoyantsFleet: under a warm
// start the signal pipelines and hindsight start with the fleet the
// default clairvoyant plan has at 0, Ready, where without it they start
// at the HPA's minimum; it is refused beside --initial-replicas.
func TestAWarmStartGivesEveryPipelineTheClairvoyantsFleet(t *testing.T) {
	reqs := load(t, "poisson:rate=40,duration=15m,prompt=1000,output=200", 1)
	names := []string{"oracle", "hindsight", "clairvoyant"}
	warm := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: names, WarmStart: true, SampleEvery: 10 * time.Second})
	cold := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: names})
	want := result(warm, "clairvoyant").Series.Ready[0]
	if want < 2 {
		t.Fatalf("the clairvoyant starts with %d replicas at 40 requests/s; the test needs more than the minimum", want)
	}
	for _, n := range names[:2] {
		if got := result(warm, n).Series.Ready[0]; got != want {
			t.Errorf("%s: %d ready at 0 under a warm start, want the clairvoyant's %d", n, got, want)
		}
		if got := result(warm, n).Series.Replicas[2]; got != want { // at 20 s
			t.Errorf("%s: %d replicas at 20 s under a warm start, want the %d it started with", n, got, want)
		}
		if got := result(cold, n).Series.Ready[0]; got != 1 {
			t.Errorf("%s: %d ready at 0 without a warm start, want the minimum, 1", n, got)
		}
	}
	if _, err := Run(Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: names, WarmStart: true, InitialReplicas: 2}); err == nil || !strings.Contains(err.Error(), "warm start") {
		t.Errorf("a warm start beside initial replicas: %v, want refused", err)
	}
}

// TestClientTimeout: an overloaded replica; with a client timeout every
// request without a first token by then is abandoned (a miss), none waits
// longer, and the replica stops working on them.
func TestClientTimeout(t *testing.T) {
	reqs := load(t, "poisson:rate=40,duration=5m,prompt=2000,output=300", 5)
	base := Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 5, Pipelines: []string{"static:1"}, Drain: 5 * time.Minute, Warmup: -1}
	forever := result(run(t, base), "static:1")
	base.ClientTimeout = 30 * time.Second
	r := run(t, base)
	p := result(r, "static:1")
	if p.Abandoned == 0 || forever.Abandoned != 0 {
		t.Fatalf("abandoned %d with a timeout, %d without", p.Abandoned, forever.Abandoned)
	}
	// Without one, the overload's p99 is past 30 s, or no first token at
	// all by the horizon (unserved).
	if v := forever.TTFTP99; v != nil && *v <= 30 || v == nil && forever.Unserved == 0 {
		t.Fatalf("p99 TTFT %v without a timeout (%d unserved), want past 30s", v, forever.Unserved)
	}
	// A percentile is of every request offered: one that falls among the
	// abandoned has no first token (none); below them none waited past the
	// timeout.
	for q, v := range map[float64]*float64{0.5: p.TTFTP50, 0.9: p.TTFTP90, 0.99: p.TTFTP99} {
		among := int(math.Ceil(q*float64(p.Requests))) > p.Requests-p.Abandoned
		if among != (v == nil) || v != nil && *v > 30 {
			t.Errorf("p%g TTFT %v with a 30s timeout and %d of %d abandoned: want none only where it falls among the abandoned, else at most 30s", 100*q, v, p.Abandoned, p.Requests)
		}
	}
	if p.Requests != len(reqs) || p.Unserved != 0 {
		t.Fatalf("%d requests, %d unserved: every request is served, abandoned or refused", p.Requests, p.Unserved)
	}
	if p.SLOAttainment < forever.SLOAttainment {
		t.Fatalf("abandoned requests freed no capacity: %.4f with the timeout, %.4f without", p.SLOAttainment, forever.SLOAttainment)
	}
}

// TestGatewayHoldsRequests: with flow control no replica holds more than
// the gateway's queue depth waiting; the rest wait at the gateway, and
// all are served.
func TestGatewayHoldsRequests(t *testing.T) {
	reqs := load(t, "bursts:base=2,peak=60,on=1m,off=4m,duration=10m,prompt=3000,output=300", 6)
	c := Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 6, Pipelines: []string{"static:2"}, Balancer: BalanceGateway}
	if err := c.prepare(); err != nil {
		t.Fatal(err)
	}
	p, _ := newPipeline("static:2", &c)
	w := newWorld(&c, p)
	most, held := 0, 0
	w.every(0, time.Second, func() {
		for _, rp := range w.ready {
			w.touch(rp)
			most = max(most, rp.r.Waiting())
		}
		held = max(held, len(w.gate))
	})
	res := w.run()
	if most > GatewayQueueDepth || held == 0 {
		t.Fatalf("most waiting on a replica %d (depth %d), most held at the gateway %d", most, GatewayQueueDepth, held)
	}
	if res.Unserved != 0 {
		t.Fatalf("%d unserved", res.Unserved)
	}
}

// TestMooncakeAndAzureAgree: the same requests as a Mooncake JSONL file and
// as an Azure CSV give the same report.
func itoa(v int) string { return strconv.Itoa(v) }

func marshal(t *testing.T, r *Report) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMooncakeAndAzureAgree(t *testing.T) {
	reqs := load(t, "bursts:base=1,peak=20,on=1m,off=4m,duration=15m,lengths=lognormal", 9)
	var csv, jsonl strings.Builder
	csv.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	t0 := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, q := range reqs {
		q.At = q.At.Truncate(time.Millisecond)
		csv.WriteString(t0.Add(q.At).Format("2006-01-02 15:04:05.0000000") + "," + itoa(q.Prompt) + "," + itoa(q.Output) + "\n")
		jsonl.WriteString(`{"timestamp": ` + itoa(int(q.At.Milliseconds())) + `, "input_length": ` + itoa(q.Prompt) + `, "output_length": ` + itoa(q.Output) + `, "hash_ids": [1, 2]}` + "\n")
	}
	a, err := trace.ReadAzure(strings.NewReader(csv.String()))
	if err != nil {
		t.Fatal(err)
	}
	m, err := trace.ReadMooncake(strings.NewReader(jsonl.String()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(r []trace.Request) Config {
		return Config{Trace: r, ScaledObject: seedSO(t), Profile: profile(t), Seed: 9, Pipelines: []string{"pulse", "clairvoyant"}}
	}
	ra, rm := marshal(t, run(t, cfg(a))), marshal(t, run(t, cfg(m)))
	if ra != rm {
		t.Fatal("the Azure CSV and the Mooncake JSONL of the same requests gave different reports")
	}
}

// TestPlannerInTheSimulator: the ScaledObject pulse provisions (the
// planner) runs as pulse alone — every other pipeline says why it cannot
// express it, the oracle too — and scales a fleet past one replica when one
// cannot serve the load.
func TestPlannerInTheSimulator(t *testing.T) {
	so, err := ReadScaledObject("../../docs/simulation/default-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	names, skipped, err := Expressible(so)
	if err != nil || strings.Join(names, ",") != "pulse" || len(skipped) != 4 {
		t.Fatalf("expressible: %v, skipped %q, %v", names, skipped, err)
	}
	reqs := load(t, "poisson:rate=40,duration=20m", 1)
	if _, err := Run(Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Pipelines: []string{"oracle"}}); err == nil ||
		!strings.Contains(err.Error(), "pipeline oracle cannot express metric replicas") {
		t.Fatalf("oracle with the planner: %v", err)
	}
	r := run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}})
	p := result(r, "pulse")
	t.Logf("%d replicas at most, %.1f %% after the warm-up, %d requests", p.MaxReplicas, 100*p.SLOAfterWarmup, p.Requests)
	if p.MaxReplicas < 2 || p.SLOAfterWarmup < 0.9 {
		t.Fatalf("40 requests a second: at most %d replicas, %.1f %% after the warm-up; want a scale-up and at least 90 %%", p.MaxReplicas, 100*p.SLOAfterWarmup)
	}
}

// TestExplainKeepsThePlansAndChangesNothing: with Explain each sample of
// the planner's pipeline carries its last plan (none before the first
// evaluation; then the count it asked for, what it learned and why), one
// per sample; a fixed fleet carries none; and everything else in the
// report is the same as without Explain, byte for byte: sampling a plan
// evaluates nothing.
func TestExplainKeepsThePlansAndChangesNothing(t *testing.T) {
	so, err := ReadScaledObject("../../docs/simulation/default-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Trace: load(t, "steps:rates=5/40/10,step=5m", 1), ScaledObject: so, Profile: profile(t), Seed: 1,
		Pipelines: []string{"pulse", "static:2"}, WarmStart: true}
	plain := run(t, cfg)
	cfg.Explain = true
	explained := run(t, cfg)
	p, fixed := result(explained, "pulse"), result(explained, "static:2")
	if fixed.Series.Plans != nil {
		t.Fatalf("static:2 has %d plans; a fixed fleet has no planner", len(fixed.Series.Plans))
	}
	if len(p.Series.Plans) != len(p.Series.Replicas) {
		t.Fatalf("%d plans for %d samples", len(p.Series.Plans), len(p.Series.Replicas))
	}
	var asked, learned bool
	for i, pl := range p.Series.Plans {
		if pl == nil {
			if asked {
				t.Fatalf("sample %d has no plan after one was made", i)
			}
			continue
		}
		asked = true
		if pl.Reason == "" || pl.Replicas < 0 {
			t.Fatalf("sample %d: plan %+v", i, pl)
		}
		learned = learned || pl.Capacity > 0 && pl.Observations > 0
	}
	if !asked || !learned {
		t.Fatalf("plans made %v, a capacity learned %v: want both over 15 minutes of load", asked, learned)
	}
	// The plans are the only difference.
	p.Series.Plans = nil
	if a, b := marshal(t, plain), marshal(t, explained); a != b {
		t.Fatal("the report with Explain differs from the one without beyond its plans")
	}
	// A pulse trigger that is not the planner's has no plans at all (not
	// a list of nulls).
	r := run(t, Config{Trace: cfg.Trace, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}, Explain: true})
	if plans := result(r, "pulse").Series.Plans; plans != nil {
		t.Fatalf("a waiting trigger has %d plans, want none", len(plans))
	}
}

// TestThePlannerIsEvaluatedEachSecond: in a cluster KEDA's open
// StreamIsActive stream has the planner evaluated at each batch of
// samples, and it learns at each evaluation (an observation a replica at
// most every 5 s). The simulator evaluated it only at the HPA's syncs and
// KEDA's polls (15 s and 30 s): it learned from a third of the
// observations. Over 10 busy minutes one replica now gives one about
// every 5 s.
func TestThePlannerIsEvaluatedEachSecond(t *testing.T) {
	so, err := ReadScaledObject("../../docs/simulation/default-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	one := int32(1) // one replica: the observations are its own
	so.Spec.MaxReplicaCount = &one
	cfg := Config{Trace: load(t, "poisson:rate=4,duration=10m", 1), ScaledObject: so, Profile: profile(t), Seed: 1,
		Pipelines: []string{"pulse"}, InitialReplicas: 1}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	p, err := newPipeline("pulse", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	newWorld(&cfg, p).run()
	d, err := p.(*pulsePipe).srv.Evaluate(cfg.trigger)
	if err != nil || d.Plan == nil {
		t.Fatalf("plan: %+v, %v", d.Plan, err)
	}
	// 10 minutes of load on one replica: at the HPA's syncs and KEDA's
	// polls alone, at most 60 evaluations, so at most 60 observations.
	if d.Plan.Observations < 90 {
		t.Fatalf("%d observations over 10 busy minutes of one replica, want about one every 5 s (90 or more)", d.Plan.Observations)
	}
}

// TestTheClairvoyantPricesAPromptAsTheReplicaDoes: its work per request
// is the replica's prefill, attention to the context included where the
// profile prices it (a 15,000-token prompt on the 8B profile 28 % dearer
// than the linear model alone), so its frontier is not drawn for replicas
// faster than the simulated ones.
func TestTheClairvoyantPricesAPromptAsTheReplicaDoes(t *testing.T) {
	p, err := replica.Load("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	long, _ := Work(p, 15000, 1)
	// Its prefill, and one token's share of a decode step (at most a step
	// of its own).
	prefill := p.Beta1Seconds * p.PrefillUnits(15000, 0)
	step := max(p.Beta0Seconds+p.Beta2Seconds, p.ReadSeconds(15000))
	if prefill < 1.27*p.Beta1Seconds*15000 || long < prefill || long > prefill+step {
		t.Fatalf("a 15,000-token prompt and one token: %.4f s of work; its prefill %.4f s (the linear model's %.4f s), a step %.4f s",
			long, prefill, p.Beta1Seconds*15000, step)
	}
}

// TestMaxTableIsTheWalksMost: the sparse table answers every range of
// series of every length (ranges past either end clipped, empty ones 0, a
// series of negatives at least 0) as a walk over the range does.
func TestMaxTableIsTheWalksMost(t *testing.T) {
	walk := func(v []float64, from, to int) float64 {
		m := 0.0
		for i := max(from, 0); i <= min(to, len(v)-1); i++ {
			m = math.Max(m, v[i])
		}
		return m
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 40 {
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.Float64()*10 - 2
		}
		mt := newMaxTable(v)
		for from := -3; from <= n+2; from++ {
			for to := from - 2; to <= n+3; to++ {
				if got, want := mt.most(from, to), walk(v, from, to); got != want {
					t.Fatalf("n %d: most(%d, %d) = %v, the walk's %v", n, from, to, got, want)
				}
			}
		}
	}
	if got := maxTable(nil).most(0, 5); got != 0 {
		t.Fatalf("no table: %v, want 0", got)
	}
}
