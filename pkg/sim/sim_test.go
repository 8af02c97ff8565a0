package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/sim/hpa"
	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

func seedSO(t *testing.T, edits ...string) *ScaledObject {
	t.Helper()
	raw, err := os.ReadFile("testdata/baseline-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := string(raw)
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(y, edits[i]) {
			t.Fatalf("the baseline ScaledObject has no %q", edits[i])
		}
		y = strings.ReplaceAll(y, edits[i], edits[i+1])
	}
	so, err := ParseScaledObject([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return so
}

func profile(t *testing.T) *replica.Profile {
	t.Helper()
	p, err := replica.Load("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, spec string, seed uint64) []trace.Request {
	t.Helper()
	reqs, err := trace.Load(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func run(t *testing.T, c Config) *Report {
	t.Helper()
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func result(r *Report, name string) *PipelineResult {
	for _, p := range r.Pipelines {
		if p.Pipeline == name {
			return p
		}
	}
	return nil
}

// TestDeterministic: the same seed gives the same report, byte for byte;
// another seed another one.
func TestDeterministic(t *testing.T) {
	reqs := trace.Densify(load(t, "trace/testdata/azure-llm-2023-conv.csv", 1)[:6000], 6, 1)
	c := Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 7}
	a, _ := json.Marshal(run(t, c))
	b, _ := json.Marshal(run(t, c))
	if !bytes.Equal(a, b) {
		t.Fatal("two runs with the same seed differ")
	}
	c.Seed = 8
	if d, _ := json.Marshal(run(t, c)); bytes.Equal(a, d) {
		t.Fatal("another seed gave the same report")
	}
}

// TestStepReachesPulseBeforePrometheus: a step of load is seen by pulse
// within its scrape interval and by Prometheus within its 15 s; the
// difference of their first scale-ups, over many seeds (different phases of
// the HPA, KEDA and the scrapes), is positive and about the sampling
// difference — it is measured, not assumed.
func TestStepReachesPulseBeforePrometheus(t *testing.T) {
	so := seedSO(t, `threshold: "10"`, `threshold: "10"
      window: 1s`)
	var diffs []float64
	for seed := uint64(1); seed <= 20; seed++ {
		reqs := load(t, "steps:rates=5/60,step=5m,prompt=1000,output=200", seed)
		r := run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: seed, Pipelines: []string{"pulse", "prometheus"}})
		pu, pr := result(r, "pulse").FirstScaleUpSeconds, result(r, "prometheus").FirstScaleUpSeconds
		if pu == nil || pr == nil {
			t.Fatalf("seed %d: no scale-up (pulse %v, prometheus %v)", seed, pu, pr)
		}
		diffs = append(diffs, *pr-*pu)
	}
	mean := 0.0
	for _, d := range diffs {
		mean += d / float64(len(diffs))
	}
	// Prometheus' sample is on average half its interval older than
	// pulse's, and a sync that misses it costs a whole HPA period.
	if mean <= 0 || mean > (15*time.Second+15*time.Second).Seconds() {
		t.Fatalf("prometheus - pulse first scale-up: mean %.1fs over %v", mean, diffs)
	}
	t.Logf("prometheus - pulse first scale-up, 20 seeds: mean %.1fs (%v)", mean, diffs)
}

// TestScaleUpWithLoadingReplicasDoesNotRunAway: a one-minute burst on one
// replica, with a fast scale-up policy (4 pods per 15 s): the HPA asks for
// more replicas, which load for 240 s while the first drains its queue. Once
// the queue is empty, pulse must ask for no more than the oracle does
// (before the missing-pod rule each starting replica counted 1.5 ×
// threshold once the queue fell below it: 16 starting replicas made 240,
// and pulse ran to maxReplicaCount with an empty queue).
func TestScaleUpWithLoadingReplicasDoesNotRunAway(t *testing.T) {
	so := seedSO(t, "maxReplicaCount: 10", "maxReplicaCount: 30", "value: 1\n            periodSeconds: 300", "value: 4\n            periodSeconds: 15",
		"stabilizationWindowSeconds: 30\n", "stabilizationWindowSeconds: 0\n")
	reqs := load(t, "steps:rates=10/40/10/10/10/10/10/10/10,step=1m,prompt=1000,output=200", 3)
	r := run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: 3, Pipelines: []string{"pulse", "oracle"}})
	pulse, oracle := result(r, "pulse"), result(r, "oracle")
	if pulse.MaxReplicas > oracle.MaxReplicas || pulse.MaxReplicas >= 30 {
		t.Fatalf("pulse ran to %d replicas (%v); the oracle needed %d", pulse.MaxReplicas, pulse.Series.Replicas, oracle.MaxReplicas)
	}
	t.Logf("max replicas: pulse %d, oracle %d", pulse.MaxReplicas, oracle.MaxReplicas)
}

// TestKEDAActivationAndCooldown: with minReplicaCount 0 the workload goes
// to zero cooldownPeriod after its load stops; requests held at the gateway
// wake it where a signal sees them (the oracle) and stay held where none
// does (pulse and Prometheus read vLLM pods, and none runs).
func TestKEDAActivationAndCooldown(t *testing.T) {
	// running, not waiting: a workload that serves with an empty queue has
	// waiting 0 and would be inactive (docs/simulation.md). The cooldown
	// outlasts a replica's startup, or KEDA deactivates it while it loads.
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  cooldownPeriod: 300\n  initialCooldownPeriod: 300\n  pollingInterval: 5", "metric: waiting", "metric: running")
	reqs := load(t, "steps:rates=4/0/0/1,step=5m,prompt=500,output=200", 1)
	r := run(t, Config{Trace: reqs, ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"oracle", "pulse"},
		InitialReplicas: 1, Drain: 5 * time.Minute})
	oracle, pulse := result(r, "oracle"), result(r, "pulse")
	zeroAt := func(p *PipelineResult) float64 {
		for i, n := range p.Series.Replicas {
			if n == 0 {
				return float64(i) * r.Config.SampleSeconds
			}
		}
		return -1
	}
	for _, p := range []*PipelineResult{oracle, pulse} {
		// Idle from 5 min: zero a cooldown (300 s) later.
		if at := zeroAt(p); at < 600 || at > 660 {
			t.Errorf("%s reached zero replicas at %.0fs, want about 600s", p.Pipeline, at)
		}
	}
	last := len(oracle.Series.Ready) - 1
	if oracle.Series.Ready[last] != 1 || oracle.Unserved != 0 {
		t.Errorf("the oracle did not wake the workload when requests came back (ready %d, unserved %d)", oracle.Series.Ready[last], oracle.Unserved)
	}
	if pulse.Series.Replicas[last] != 0 || pulse.Unserved == 0 {
		t.Errorf("pulse woke a workload with no pod to measure (replicas %d, unserved %d): its scale from zero needs a demand source",
			pulse.Series.Replicas[last], pulse.Unserved)
	}
}

// TestScoresAddUp: every request is served, dropped, refused or unserved;
// GPU-hours are the replica count integrated over the run.
func TestScoresAddUp(t *testing.T) {
	reqs := load(t, "bursts:base=5,peak=60,on=2m,off=6m,duration=30m,prompt=800,output=150", 2)
	r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 2, DropOnScaleDown: true,
		Pipelines: []string{"pulse", "kaito", "prometheus-avg"}})
	for _, p := range r.Pipelines {
		if p.Requests != len(reqs) || p.SLOAttainment < 0 || p.SLOAttainment > 1 || p.Unserved < 0 {
			t.Errorf("%s: %+v", p.Pipeline, p)
		}
		var integral float64
		for _, n := range p.Series.Replicas {
			integral += float64(n) * r.Config.SampleSeconds / 3600
		}
		if math.Abs(integral-p.GPUHours) > 0.1*p.GPUHours+0.05 {
			t.Errorf("%s: %.2f GPU-hours, the sampled replica count integrates to %.2f", p.Pipeline, p.GPUHours, integral)
		}
	}
}

func TestBadConfigsAreRefused(t *testing.T) {
	reqs := load(t, "poisson:rate=1,duration=1m", 1)
	for name, c := range map[string]Config{
		"pipeline": {Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Pipelines: []string{"nope"}},
		"balancer": {Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Balancer: "random"},
		"trigger":  {Trace: reqs, ScaledObject: seedSO(t, `metric: waiting`, `metric: nope`), Profile: profile(t)},
		"trace":    {ScaledObject: seedSO(t), Profile: profile(t)},
		// Every request at one instant: scored 100 % for 0 GPU-hours
		// (found in a review, 2026-12-05).
		"one instant": {Trace: reqs[:1], ScaledObject: seedSO(t), Profile: profile(t)},
	} {
		if _, err := Run(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseScaledObject([]byte("spec: {scaleTargetRef: {name: x}, triggers: [{type: cron}]}")); err == nil {
		t.Error("a ScaledObject with no pulse trigger was accepted")
	}
	// A polling interval of 0 panicked the run; a maxReplicaCount of two
	// billion ran the references (static:1 … max) out of memory.
	for spec, want := range map[string]string{
		"pollingInterval: 0":                     "pollingInterval 0: want at least 1",
		"pollingInterval: -5":                    "pollingInterval -5",
		"cooldownPeriod: -1":                     "cooldownPeriod -1",
		"initialCooldownPeriod: -1":              "initialCooldownPeriod -1",
		"maxReplicaCount: 2000000000":            "1 <= max <= 10000",
		"minReplicaCount: 3, maxReplicaCount: 2": "0 <= min <= max",
		// What KEDA refuses of a fallback, and what pulse-sim does not
		// simulate (each was ignored without a word).
		"fallback: {failureThreshold: 3, replicas: -1}":                            "want both 0 or more",
		"fallback: {failureThreshold: 3, replicas: 2, behavior: nope}":             `fallback behavior "nope"`,
		"fallback: {failureThreshold: 3, replicas: 2, behavior: scalingModifiers}": "does not simulate scalingModifiers",
		"idleReplicaCount: 0":                        "does not simulate idle replicas",
		"advanced: {scalingModifiers: {formula: x}}": "does not simulate scaling modifiers",
	} {
		y := "spec: {" + spec + ", scaleTargetRef: {name: x}, triggers: [{type: external-push, metadata: {workspace: x}}]}"
		if _, err := ParseScaledObject([]byte(y)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", spec, err, want)
		}
	} // Read strictly (found in a review, 2026-12-05): a misspelt field,
	// one given twice, or another kind was ignored, and the run scored
	// under KEDA's defaults (maxReplicaCout: 2 ran up to 100 replicas).
	// KEDA's fields pulse-sim does not model are read and left.
	const head = "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\n"
	for doc, want := range map[string]string{
		head + "spec: {maxReplicaCout: 2, scaleTargetRef: {name: x}, triggers: [{type: external-push}]}":                                                                                   `unknown field "maxReplicaCout"`,
		head + "spec: {advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleDown: {stabilisationWindowSeconds: 0}}}}, scaleTargetRef: {name: x}, triggers: [{type: external-push}]}": "stabilisationWindowSeconds",
		head + "spec: {maxReplicaCount: 2, maxReplicaCount: 3, scaleTargetRef: {name: x}, triggers: [{type: external-push}]}":                                                              "maxReplicaCount",
		"apiVersion: keda.sh/v1alpha1\nkind: ScaledJob\nspec: {scaleTargetRef: {name: x}, triggers: [{type: external-push}]}":                                                              `kind "ScaledJob"`,
		"spec: {scaleTargetRef: {name: x}, triggers: [{type: external-push}]}":                                                                                                             "want keda.sh/v1alpha1, ScaledObject",
		head + "metadata: {name: a, labels: {team: x}, annotations: {a: b}}\nspec: {scaleTargetRef: {name: x, envSourceContainerName: c}, advanced: {restoreToOriginalReplicaCount: true, horizontalPodAutoscalerConfig: {name: h}}, triggers: [{type: external-push, name: t, authenticationRef: {name: auth}, metadata: {workspace: x}}]}\nstatus: {hpaName: h}": "",
		head + "spec: {scaleTargetRef: {name: x}, triggers: [{type: external-push, useCachedMetrics: true}]}":                                          "does not simulate KEDA's cached metrics",
		head + "spec: {scaleTargetRef: {name: x}, triggers: [{type: external-push}, {type: cpu, metricType: Utilization, metadata: {value: \"60\"}}]}": "2 triggers; pulse-sim simulates one",
	} {
		_, err := ParseScaledObject([]byte(doc))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s:\n%v, want %q", doc, err, want)
		}
	}
}

// failing is a pipeline whose every answer is an error.
type failing struct{ noHooks }

func (failing) Attach(*world)                  {}
func (failing) Metric(*world) (float64, error) { return 0, errors.New("Unavailable") }
func (failing) Active(*world) (bool, error)    { return false, errors.New("Unavailable") }

// TestKEDAFallback: while the signal fails, the HPA holds; after
// fallback.failureThreshold failed fetches KEDA hands it fallback.replicas ×
// target, and the workload goes to fallback.replicas.
func TestKEDAFallback(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 1\n  fallback:\n    failureThreshold: 3\n    replicas: 4",
		"value: 1\n            periodSeconds: 300", "value: 4\n            periodSeconds: 15")
	c := Config{Trace: load(t, "poisson:rate=1,duration=5m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}}
	if err := c.prepare(); err != nil {
		t.Fatal(err)
	}
	w := newWorld(&c, failing{})
	res := w.run()
	// Syncs every 15 s and polls every 30 s, each counting a failure
	// while the HPA's metric fails (its ScalingActive false, KEDA's poll
	// queries the scaler itself): the 4th (after 3), at 30 s, brings the
	// fallback.
	first := -1
	for i, n := range res.Series.Replicas {
		if n > 1 {
			first = i
			break
		}
	}
	at := float64(first) * c.SampleEvery.Seconds()
	if first < 0 || at < 30 || at > 50 || res.Series.Replicas[len(res.Series.Replicas)-1] != 4 || res.MetricErrors == 0 {
		t.Fatalf("replicas %v (first above 1 at %.0fs), %d metric errors: want 4 after the fourth failure (syncs and polls)", res.Series.Replicas, at, res.MetricErrors)
	}
}

// TestKEDAsPollCountsTowardTheFallback: KEDA's poll runs its query through
// the fallback as the HPA's do (scale_handler's observeMetric): past
// failureThreshold it is an active answer, so a workload at 0 whose scaler
// fails is scaled from zero (and then the HPA takes it to the fallback's
// replicas), and the cooldown restarts at each such poll. Only the HPA's
// syncs counted, and at 0 replicas, where the HPA asks for no metric, they
// counted an error each: the workload stayed at 0, and went to 0 at the
// first inactive poll after an outage.
func TestKEDAsPollCountsTowardTheFallback(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  pollingInterval: 30\n  cooldownPeriod: 300\n  fallback:\n    failureThreshold: 3\n    replicas: 4",
		"value: 1\n            periodSeconds: 300", "value: 4\n            periodSeconds: 15")
	cfg := Config{Trace: load(t, "poisson:rate=1,duration=5m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	w := newWorld(&cfg, failing{})
	for k := range 3 { // three failed polls at 0: the HPA, disabled, asks nothing
		w.now = time.Duration(k) * 30 * time.Second
		w.kedaPoll()
		w.hpaSync()
	}
	if w.spec != 0 || w.failures != 3 || w.st.metricErrors != 0 {
		t.Fatalf("after 3 failed polls at 0: %d replicas, %d failures, %d metric errors: want 0, 3 (the polls'), 0 (the HPA asks nothing at 0)", w.spec, w.failures, w.st.metricErrors)
	}
	w.now = 90 * time.Second
	w.kedaPoll() // the 4th, past the threshold: active
	if w.spec != 1 || w.lastAct != 90*time.Second {
		t.Fatalf("after the 4th failed poll: %d replicas, last active %v: want 1 (scaled from zero), 1m30s", w.spec, w.lastAct)
	}
	for k := 4; k <= 20; k++ { // the outage goes on: each poll is active
		w.now = time.Duration(k) * 30 * time.Second
		w.kedaPoll()
	}
	w.now = 630 * time.Second // the scaler answers again, inactive
	w.kedaScale(false, false)
	if w.spec == 0 {
		t.Errorf("scaled to zero at 630s, 30 s after a poll the fallback made active; KEDA's lastActiveTime is 600s, and it waits until 900s")
	}
	// A whole run from 0: the poll brings the first replica, the HPA's
	// syncs the fallback's 4.
	res := newWorld(&cfg, failing{}).run()
	if got := res.Series.Replicas[len(res.Series.Replicas)-1]; got != 4 {
		t.Errorf("a run from 0 with its scaler failing ends at %d replicas (%v), want the fallback's 4", got, res.Series.Replicas)
	}
}

// toggled is a pipeline failing while fail is set, and otherwise
// answering 1 (active).
type toggled struct {
	noHooks
	fail bool
}

func (*toggled) Attach(*world) {}
func (p *toggled) Metric(*world) (float64, error) {
	if p.fail {
		return 0, errors.New("Unavailable")
	}
	return 1, nil
}
func (p *toggled) Active(w *world) (bool, error) {
	v, err := p.Metric(w)
	return v > 0, err
}

// TestKEDAsPollAndTheHPAsObservation: with minReplicaCount at least 1 and
// the HPA's ScalingActive true, KEDA's poll takes the HPA's observation
// (counting nothing, and a fallback the HPA took as active); while the
// HPA's metric fails its polls count as its syncs do; above the maximum
// the HPA asks for no metric; a Value target's fallback needs a ready pod,
// so a workload at zero with one stays there.
func TestKEDAsPollAndTheHPAsObservation(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 1\n  fallback:\n    failureThreshold: 3\n    replicas: 2")
	cfg := Config{Trace: load(t, "poisson:rate=1,duration=5m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	p := &toggled{}
	w := newWorld(&cfg, p)
	w.spec = 1
	w.hpaSync() // the metric answers: ScalingActive
	p.fail = true
	w.now = 30 * time.Second
	w.kedaPoll()
	if w.failures != 0 {
		t.Fatalf("a poll while the HPA's observation stands in counted %d failures, want 0", w.failures)
	}
	for k := range 4 { // the HPA's syncs fail: its polls count too
		w.now = time.Duration(45+15*k) * time.Second
		w.hpaSync()
		if k == 1 {
			w.kedaPoll()
		}
	}
	if !w.hpaFallback || w.spec != 2 {
		t.Fatalf("after 4 failed syncs and a failed poll: fallback taken %v, %d replicas: want true, 2 (the 4th failure brings it)", w.hpaFallback, w.spec)
	}
	w.now = 120 * time.Second
	w.kedaPoll()
	if w.lastAct != 120*time.Second {
		t.Errorf("a poll after the HPA took the fallback: last active %v, want 2m0s (the observation's fallback is active)", w.lastAct)
	}
	// Above the maximum the HPA goes to it, asking nothing.
	w.spec, w.failures, w.st.metricErrors = so.MaxReplicas()+2, 0, 0
	w.hpaSync()
	if w.failures != 0 || w.st.metricErrors != 0 || w.spec != so.MaxReplicas() {
		t.Errorf("a sync above the maximum: %d failures, %d metric errors, %d replicas: want 0, 0, %d", w.failures, w.st.metricErrors, w.spec, so.MaxReplicas())
	}
	// A Value target at zero: no ready pod, no fallback, no wake.
	vso := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  fallback:\n    failureThreshold: 3\n    replicas: 2", "type: external-push", "type: external-push\n    metricType: Value")
	vcfg := Config{Trace: load(t, "poisson:rate=1,duration=5m", 1), ScaledObject: vso, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}}
	if err := vcfg.prepare(); err != nil {
		t.Fatal(err)
	}
	vw := newWorld(&vcfg, failing{})
	for k := range 10 {
		vw.now = time.Duration(k) * 30 * time.Second
		vw.kedaPoll()
	}
	if vw.spec != 0 || vw.failures != 10 {
		t.Errorf("a Value target at zero after 10 failed polls: %d replicas, %d failures: want 0 (no ready pod, no fallback), 10", vw.spec, vw.failures)
	}
}

// TestKEDAFallbackBehaviors: from 3 replicas, the fallback's metric is worth its replicas
// (static), the target's replicas now (currentReplicas), the more or the
// fewer of the two, as KEDA's doFallback computes it; a fallback of 0
// replicas is one (the HPA goes to its minimum). Every behavior was taken
// as static, and a fallback of 0 as none.
func TestKEDAFallbackBehaviors(t *testing.T) {
	for _, c := range []struct {
		fallback string
		want     int
	}{
		{"replicas: 4", 4},
		{"replicas: 4\n    behavior: static", 4},
		{"replicas: 4\n    behavior: currentReplicas", 3},
		{"replicas: 4\n    behavior: currentReplicasIfHigher", 4},
		{"replicas: 1\n    behavior: currentReplicasIfHigher", 3},
		{"replicas: 4\n    behavior: currentReplicasIfLower", 3},
		{"replicas: 1\n    behavior: currentReplicasIfLower", 1},
		{"replicas: 0", 1},
	} {
		so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 1\n  fallback:\n    failureThreshold: 3\n    "+c.fallback,
			"value: 1\n            periodSeconds: 300", "value: 4\n            periodSeconds: 15",
			"stabilizationWindowSeconds: 300", "stabilizationWindowSeconds: 0", "periodSeconds: 600", "periodSeconds: 15", `tolerance: "0.5"`, `tolerance: "0"`)
		cfg := Config{Trace: load(t, "poisson:rate=1,duration=5m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}, InitialReplicas: 3}
		if err := cfg.prepare(); err != nil {
			t.Fatal(err)
		}
		res := newWorld(&cfg, failing{}).run()
		if got := res.Series.Replicas[len(res.Series.Replicas)-1]; got != c.want {
			t.Errorf("fallback %q from 3 replicas: %d at the end (%v), want %d", c.fallback, got, res.Series.Replicas, c.want)
		}
	}
}

// TestPulsesStreamIsKEDAsAtOnce: pulse's StreamIsActive sends every change
// of its state, true and false (pkg/scaler/push.go), and KEDA takes each
// at once as a poll's answer: a turn to active at replicas > 0 refreshes
// its lastActiveTime within the next batch, not at its next poll (30 s
// here). pulse-sim pushed only a turn to active at zero replicas, so a
// burst between two polls was no activity, and a workload that may go to
// zero cycled through it more.
func TestPulsesStreamIsKEDAsAtOnce(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  cooldownPeriod: 300\n  initialCooldownPeriod: 3600\n  pollingInterval: 30",
		"maxReplicaCount: 10", "maxReplicaCount: 1")
	c := Config{Trace: load(t, "bursts:base=0.5,peak=40,on=15s,off=105s,duration=20m,prompt=2000,output=100", 1), ScaledObject: so,
		Profile: profile(t), Seed: 1, Pipelines: []string{"pulse"}, InitialReplicas: 1}
	if err := c.prepare(); err != nil {
		t.Fatal(err)
	}
	pp := newPulse(&c).(*pulsePipe)
	w := newWorld(&c, pp)
	var was bool
	var missed, turns int
	w.every(1500*time.Millisecond, time.Second, func() {
		d, err := pp.srv.Evaluate(c.trigger)
		now := err == nil && d.Active
		if now && !was && w.spec > 0 {
			turns++
			at := w.now
			w.at(at+2*time.Second, func() { // the stream's next evaluation has come
				if w.lastAct < at-time.Second {
					missed++
				}
			})
		}
		was = now
	})
	w.run()
	if turns == 0 {
		t.Fatal("pulse never turned active")
	}
	if missed > 0 {
		t.Fatalf("pulse turned active %d times at replicas > 0; KEDA's lastActiveTime was not refreshed for %d of them (polled every 30 s)", turns, missed)
	}
}

// TestKEDAIgnoresAnInactivePush: KEDA v2.21 ignores a push scaler's turn
// to inactive ("inactivation happens through the standard metric scaling
// logic", pkg/scaling/scale_handler.go): a workload goes to zero only at
// one of its polls. pulse-sim took the push at once, and went to zero up
// to a polling interval early (58 s here).
func TestKEDAIgnoresAnInactivePush(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  cooldownPeriod: 0\n  initialCooldownPeriod: 120\n  pollingInterval: 60",
		"metric: waiting", "metric: running")
	c := Config{Trace: load(t, "steps:rates=2/0,step=3m,prompt=500,output=100", 1), ScaledObject: so, Profile: profile(t),
		Seed: 1, Pipelines: []string{"pulse"}, InitialReplicas: 1, Drain: 5 * time.Minute}
	if err := c.prepare(); err != nil {
		t.Fatal(err)
	}
	w := newWorld(&c, newPulse(&c))
	const tick = 10 * time.Millisecond
	prev := int32(-1)
	var zeroAt []time.Duration
	w.every(0, tick, func() {
		if w.spec == 0 && prev > 0 {
			zeroAt = append(zeroAt, w.now)
		}
		prev = w.spec
	})
	w.run()
	if len(zeroAt) == 0 {
		t.Fatal("never went to zero")
	}
	every := so.PollingInterval()
	for _, z := range zeroAt {
		poll := c.kedaPhase + (z-c.kedaPhase)/every*every // the poll at or before the turn
		if z-poll >= tick {
			t.Errorf("scaled to zero at %.2fs, %.2fs after KEDA's poll at %.2fs (next at %.2fs): KEDA scales to zero only at a poll",
				z.Seconds(), (z - poll).Seconds(), poll.Seconds(), (poll + every).Seconds())
		}
	}
}

// TestAWarmupPastTheLastArrival: scoring after the warm-up stops at the
// last arrival, so a warm-up past it left every pipeline and fixed fleet
// at 0 % for 0 GPU-hours, the frontiers at one point, silently. One asked
// for is refused; the default (10 minutes) scores a shorter trace whole.
func TestAWarmupPastTheLastArrival(t *testing.T) {
	c := Config{Trace: load(t, "poisson:rate=2,duration=5m,prompt=500,output=100", 1), ScaledObject: seedSO(t), Profile: profile(t),
		Seed: 1, Pipelines: []string{"static:2"}, Warmup: 6 * time.Minute}
	if _, err := Run(c); err == nil || !strings.Contains(err.Error(), "leaves nothing of the trace") {
		t.Fatalf("a warm-up of 6m on a 5-minute trace: %v, want it refused", err)
	}
	c.Warmup = 0
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Pipelines[0]; r.Config.WarmupSeconds != 0 || p.SLOAfterWarmup != p.SLOAttainment || p.SLOAfterWarmup == 0 {
		t.Fatalf("the default warm-up on a 5-minute trace: warm-up %gs, %v after it of %v", r.Config.WarmupSeconds, p.SLOAfterWarmup, p.SLOAttainment)
	}
}

// TestABehaviorTheAPIServerRefusesIsRefused: the API server validates an
// HPA's behavior (policy type Pods or Percent, value above 0, periodSeconds
// 1 to 1800, stabilizationWindowSeconds 0 to 3600, selectPolicy Max, Min
// or Disabled), so KEDA cannot create such an HPA; pulse-sim simulated it
// (a policy of type "pods" proposed 0: the HPA never scaled up).
func TestABehaviorTheAPIServerRefusesIsRefused(t *testing.T) {
	raw, err := os.ReadFile("testdata/baseline-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := string(raw)
	if _, err := ParseScaledObject(raw); err != nil {
		t.Fatal(err)
	}
	for _, edit := range [][2]string{
		{"- type: Pods\n            value: 1\n            periodSeconds: 300", "- type: pods\n            value: 1\n            periodSeconds: 300"},
		{"periodSeconds: 300", "periodSeconds: 0"},
		{"periodSeconds: 600", "periodSeconds: 7200"},
		{"stabilizationWindowSeconds: 30", "stabilizationWindowSeconds: -30"},
		{"selectPolicy: Max\n        scaleDown", "selectPolicy: Maximum\n        scaleDown"},
	} {
		if !strings.Contains(y, edit[0]) {
			t.Fatalf("the baseline has no %q", edit[0])
		}
		if _, err := ParseScaledObject([]byte(strings.Replace(y, edit[0], edit[1], 1))); err == nil {
			t.Errorf("accepted %q", strings.ReplaceAll(edit[1], "\n", " "))
		}
	}
}

// TestKEDADeactivatesAtTheCooldownsPoll: KEDA scales to zero at the poll
// that finds the workload inactive a cooldownPeriod after it was last
// active (its LastActiveTime, kept to the second, plus the cooldown is
// before the poll's now), not one pollingInterval later: the simulator's
// polls fall on an exact grid, and a strict test of the tie kept one
// replica a poll longer at every deactivation.
func TestKEDADeactivatesAtTheCooldownsPoll(t *testing.T) {
	so := seedSO(t, "minReplicaCount: 1", "minReplicaCount: 0\n  cooldownPeriod: 300\n  pollingInterval: 30")
	cfg := Config{Trace: load(t, "poisson:rate=1,duration=1m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"oracle"}}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	w := newWorld(&cfg, nil)
	w.spec = 2
	w.now = 600 * time.Second
	w.kedaScale(true, false) // last active at 600 s
	for _, at := range []time.Duration{630, 870} {
		w.now = at * time.Second
		if w.kedaScale(false, false); w.spec != 2 {
			t.Fatalf("inactive at %s, %s after the last active poll: scaled to %d", w.now, w.now-600*time.Second, w.spec)
		}
	}
	w.now = 900 * time.Second
	if w.kedaScale(false, false); w.spec != 0 {
		t.Fatalf("inactive at %s, a cooldown after the last active poll: %d replicas, want 0", w.now, w.spec)
	}
}

// TestATerminationGraceKillsWhatItHasNotFinished: a replica removed by a
// scale-down goes on with its requests for the grace (its pod's
// terminationGracePeriodSeconds), then is killed: what it had not
// finished is dropped. With no bound it finishes every one, as before.
func TestATerminationGraceKillsWhatItHasNotFinished(t *testing.T) {
	reqs := load(t, "poisson:rate=8,duration=10m,prompt=500,output=2000", 1) // long answers: a minute and more of decode
	dropped := map[time.Duration]int{}
	for _, grace := range []time.Duration{0, time.Second, time.Hour} {
		r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), Seed: 1, TerminationGrace: grace,
			Pipelines: []string{"switch:from=4,to=1,at=0.5"}, Drain: 10 * time.Minute})
		p := r.Pipelines[0]
		dropped[grace] = p.Dropped
		if p.Requests != len(reqs) {
			t.Fatalf("grace %s: %d requests scored, want %d", grace, p.Requests, len(reqs))
		}
	}
	t.Logf("dropped by grace: %v", dropped)
	if dropped[0] != 0 || dropped[time.Hour] != 0 || dropped[time.Second] == 0 {
		t.Fatalf("dropped by grace: %v; want none with no bound or an hour, some with a second", dropped)
	}
	bad := Config{Trace: reqs, ScaledObject: seedSO(t), Profile: profile(t), TerminationGrace: -time.Second, Pipelines: []string{"static:1"}}
	if _, err := Run(bad); err == nil || !strings.Contains(err.Error(), "termination grace") {
		t.Fatalf("a negative grace: %v, want it refused", err)
	}
}

// TestPercentilesCountTheRequestsWithNoFirstToken: TTFT percentiles were
// over the requests that got a first token, so a pipeline that lost
// requests (refused, abandoned, dropped, unserved) had better ones for
// it. They are over every request offered, those with no first token
// above all the others: 8 of 10 served in 1..8 s put the p50 at 5 s and
// the p90 on a lost request (none), where the served alone put it at 8 s.
func TestPercentilesCountTheRequestsWithNoFirstToken(t *testing.T) {
	served := []float64{1, 2, 3, 4, 5, 6, 7, 8}
	if v := ttftPercentile(served, 10, 0.5); v == nil || *v != 5 {
		t.Errorf("p50 %v, want 5", v)
	}
	if v := ttftPercentile(served, 10, 0.8); v == nil || *v != 8 {
		t.Errorf("p80 %v, want 8 (the last served)", v)
	}
	for _, q := range []float64{0.9, 0.99} {
		if v := ttftPercentile(served, 10, q); v != nil {
			t.Errorf("p%g %v, want none: it falls on a request with no first token", 100*q, *v)
		}
	}
	if v := ttftPercentile(served, 8, 0.99); v == nil || *v != 8 {
		t.Errorf("every request served: p99 %v, want 8", v)
	}
	if v := ttftPercentile(nil, 0, 0.5); v != nil {
		t.Errorf("no request: p50 %v, want none", *v)
	}
}

// TestTTFTPercentilesSelectAsASortDoes: the percentiles a run reports,
// read by selection, are those of the sorted TTFTs, for any number of
// values, ties, requests with no first token, and ranks that coincide.
func TestTTFTPercentilesSelectAsASortDoes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	qss := [][]float64{{0.5, 0.9, 0.99}, {0, 0.5, 1}, {0.9, 0.9, 0.91}, {0.01}}
	for trial := range 3000 {
		n := rng.IntN(60)
		vals := make([]float64, n)
		for i := range vals {
			if trial/len(qss)%2 == 0 {
				vals[i] = float64(rng.IntN(5)) // ties, with each set of qs in turn
			} else {
				vals[i] = rng.Float64() * 10
			}
		}
		offered := n + rng.IntN(4)
		sorted := slices.Clone(vals)
		slices.Sort(sorted)
		qs := qss[trial%len(qss)]
		got := ttftPercentiles(slices.Clone(vals), offered, qs...)
		for i, q := range qs {
			want := ttftPercentile(sorted, offered, q)
			if (got[i] == nil) != (want == nil) || (want != nil && *got[i] != *want) {
				t.Fatalf("%v of %d offered, q %v: %v, the sort's %v", vals, offered, q, deref(got[i]), deref(want))
			}
		}
	}
}

func deref(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}

// TestKaitoReadsEveryReplicaOfAWorkspace: pulse-sim scales a Workspace past
// one replica as the HPA would an InferenceSet (a cluster's cannot pass
// one), and keda-kaito-scaler was modelled reading one random replica of
// it through one Service for the whole workload's value: a regime no
// cluster has, in which it lost to pulse. It reads every ready replica of
// a Workspace, as of an InferenceSet: the two runs are the same.
func TestKaitoReadsEveryReplicaOfAWorkspace(t *testing.T) {
	reqs := load(t, "bursts:base=5,peak=60,on=2m,off=6m,duration=30m,prompt=800,output=150", 3)
	var got []*PipelineResult
	for _, kind := range []string{"kind: Workspace", "kind: InferenceSet"} {
		r := run(t, Config{Trace: reqs, ScaledObject: seedSO(t, "kind: Workspace", kind), Profile: profile(t), Seed: 3, Pipelines: []string{"kaito"}})
		got = append(got, r.Pipelines[0])
	}
	ws, is := got[0], got[1]
	if ws.SLOAttainment != is.SLOAttainment || ws.GPUHours != is.GPUHours || !slices.Equal(ws.Series.Replicas, is.Series.Replicas) {
		t.Fatalf("kaito on a Workspace: %.4f at %.3f GPU-h; on an InferenceSet %.4f at %.3f: want the same", ws.SLOAttainment, ws.GPUHours, is.SLOAttainment, is.GPUHours)
	}
}

// TestALoadRiseOfAValueTargetIsTheHPAs: the load rise FirstScaleUpSeconds
// is measured from is the first second the true value asks for more
// replicas than run, as the HPA reads it: for metricType Value that is
// ceil(value / target × ready pods), not ceil(value / target) (the
// AverageValue rule), which with 2 replicas found no rise until the mean
// per pod was twice the target, and none at all when the scale-up came
// first (FirstScaleUpSeconds null).
func TestALoadRiseOfAValueTargetIsTheHPAs(t *testing.T) {
	so := seedSO(t, "metric: waiting", "metric: waiting\n      valueType: average",
		"- type: external-push", "- type: external-push\n    metricType: Value", "minReplicaCount: 1", "minReplicaCount: 2")
	cfg := Config{Trace: load(t, "poisson:rate=1,duration=20m", 1), ScaledObject: so, Profile: profile(t), Seed: 1, Pipelines: []string{"oracle"}}
	if err := cfg.prepare(); err != nil {
		t.Fatal(err)
	}
	w := newWorld(&cfg, &oracle{})
	w.warmFleet(2)
	for _, rp := range w.ready {
		for i := range 16 { // one admitted, fifteen waiting
			rp.r.Enqueue(0, replica.NewRequest(i, 8000, 10, 0))
		}
	}
	v := trueValue(w)
	res := hpa.New(hpa.Spec{MinReplicas: 2, MaxReplicas: 10}, hpa.DefaultOptions()).
		Sync(0, hpa.State{SpecReplicas: 2, StatusReplicas: 2, ReadyPods: 2}, []hpa.Reading{{Target: w.target, Milli: scaler.KEDAMilli(v)}})
	if v != 15 || res.Proposal != 3 {
		t.Fatalf("the mean waiting is %g, the HPA's proposal %d: want 15 and 3 (ceil(15 / 10 × 2))", v, res.Proposal)
	}
	w.watchLoadRise()
	if w.st.loadRise != 0 {
		t.Fatalf("the true value asks the HPA for 3 replicas with 2 running, and no load rise was found (loadRise %v)", w.st.loadRise)
	}
}

// TestAnEmptyPolicyListReachesTheHPAAsTheDefaults: a ScaledObject's
// "policies: []" is read as an empty list (not left out), which the HPA
// took as no policy (pkg/sim/hpa's TestAnEmptyPolicyListIsTheDefaults).
func TestAnEmptyPolicyListReachesTheHPAAsTheDefaults(t *testing.T) {
	so := seedSO(t, "policies:\n          - type: Pods\n            value: 1\n            periodSeconds: 300", "policies: []")
	if p := so.Behavior().ScaleUp.Policies; p == nil || len(p) != 0 {
		t.Fatalf("policies: [] read as %#v", p)
	}
	c := hpa.New(hpa.Spec{MinReplicas: so.HPAMinReplicas(), MaxReplicas: so.MaxReplicas(), Behavior: so.Behavior()}, hpa.DefaultOptions())
	if n := len(c.Spec().Behavior.ScaleUp.Policies); n != 2 {
		t.Fatalf("the HPA's scale-up has %d policies: want the 2 defaults", n)
	}
}
