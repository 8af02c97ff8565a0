package scaler

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/store"
)

// serve stores n seconds of samples for each pod: prompt tokens at
// tokensPerSec, one request a second, each queued queueSec.
func (f *fixture) serve(n int, tokensPerSec, queueSec float64, names ...string) {
	for range n {
		f.ms += 1000
		f.clock.Add(time.Second)
		var rs []store.Report
		for _, name := range names {
			rs = append(rs, servingReport(name, f.ms, tokensPerSec, queueSec, 0.1))
		}
		f.store.Add(rs)
	}
}

// servingReport is name's sample at ms (the agents' clock) of a pod that
// has served tokensPerSec prompt tokens and one request a second (none
// when it served no tokens: an idle pod), each queued queueSec, since
// 1,700,000,000,000 ms, its KV cache at kv.
func servingReport(name string, ms int64, tokensPerSec, queueSec, kv float64) store.Report {
	r := store.Report{UID: "uid-" + name}
	r.TimeMs = ms
	s := float64(ms-1_700_000_000_000) / 1000
	n := s // requests
	if tokensPerSec == 0 {
		n = 0
	}
	r.Values.Set(metric.PromptTokens, tokensPerSec*s)
	r.Values.Set(metric.TTFTCount, n)
	r.Values.Set(metric.TTFTSum, (queueSec+0.1)*n)
	r.Values.Set(metric.QueueTimeCount, n)
	r.Values.Set(metric.QueueTimeSum, queueSec*n)
	r.Values.Set(metric.Waiting, 0)
	r.Values.Set(metric.Running, 4)
	r.Values.Set(metric.KVCacheUsage, kv)
	return r
}

func replicasMD(extra ...string) map[string]string {
	md := map[string]string{"workspace": "llama", "metric": "replicas"}
	for i := 0; i+1 < len(extra); i += 2 {
		md[extra[i]] = extra[i+1]
	}
	return md
}

func TestReplicasTriggerPlansOverGRPC(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	// One replica serving 10000 prompt tokens a second, its requests
	// queued 1 s: past its capacity at the 2 s SLO.
	f.serve(40, 10000, 1, "a")
	md := replicasMD()
	spec, err := f.client.GetMetricSpec(context.Background(), ref(md))
	if err != nil {
		t.Fatal(err)
	}
	if ms := spec.MetricSpecs[0]; ms.TargetSizeFloat != 1 {
		t.Fatalf("target %v, want 1 (AverageValue 1: the HPA's desired count is the plan)", ms.TargetSizeFloat)
	}
	got, err := f.metric(t, md)
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Fatalf("GetMetrics = %v, want 2 replicas (10000/s over 0.8 × 10000/s)", got)
	}
	active, err := f.client.IsActive(context.Background(), ref(md))
	if err != nil || !active.Result {
		t.Fatalf("IsActive = %v, %v; want true", active, err)
	}
	ev := f.server.Evaluations()
	if len(ev) != 1 || ev[0].Decision.Plan == nil || ev[0].Desired() != 2 {
		t.Fatalf("decision records %+v: want one, with its plan, desiring 2", ev)
	}
	if p := ev[0].Decision.Plan; p.Breaks == 0 || p.Capacity != 10000 || !strings.Contains(p.Reason, "work") {
		t.Fatalf("plan %+v: want a break teaching capacity 10000 and the work as reason", p)
	}
}

func TestReplicasSLOIsTheKnob(t *testing.T) {
	for _, tc := range []struct {
		slo    string
		breaks bool
	}{{"", true}, {"10s", false}} {
		f := newFixture(t)
		f.pods("a")
		f.serve(40, 10000, 1, "a")
		tr, err := ParseTrigger(ref(replicasMD("sloTtft", tc.slo)), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := f.server.Evaluate(tr)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Plan.Breaks > 0; got != tc.breaks {
			t.Fatalf("sloTtft %q: requests queued 1 s broke the SLO: %v, want %v", tc.slo, got, tc.breaks)
		}
	}
}

func TestReplicasNeverScaleDownAfterRestart(t *testing.T) {
	f := newFixture(t)
	f.pods("a", "b", "c")
	f.serve(40, 0, 0, "a", "b", "c")
	// A new server is an aggregator restarted over the same pods: three
	// idle replicas are held until it has watched them for a hold.
	srv := New(f.store, Options{MaxWindow: time.Minute, Now: f.clock.Now})
	tr, err := ParseTrigger(ref(replicasMD()), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := srv.Evaluate(tr)
	if err != nil || d.Value != 3 {
		t.Fatalf("after a restart: %v, %v; want 3 (the ready replicas held)", d.Value, err)
	}
	if !strings.Contains(d.Plan.Reason, "holding the 3 ready replicas") {
		t.Fatalf("reason %q", d.Plan.Reason)
	}
}

func TestReplicasStaleIsAnError(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.serve(10, 1000, 0, "a")
	f.clock.Add(10 * time.Second)
	if _, err := f.metric(t, replicasMD()); status.Code(err) != codes.Unavailable {
		t.Fatalf("stale replica: %v, want Unavailable", err)
	}
	if _, err := f.metric(t, map[string]string{"workspace": "nobody", "metric": "replicas"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown workload: %v, want NotFound", err)
	}
}

func TestReplicasMetadata(t *testing.T) {
	for name, tc := range map[string]struct {
		md  map[string]string
		key string
	}{
		"threshold not 1":      {replicasMD("threshold", "2"), "threshold"},
		"valueType average":    {replicasMD("valueType", "average"), "valueType"},
		"sloTtft not duration": {replicasMD("sloTtft", "fast"), "sloTtft"},
		"sloTtft over 10m":     {replicasMD("sloTtft", "11m"), "sloTtft"},
		"sloTtft on waiting":   {map[string]string{"workspace": "llama", "sloTtft": "2s"}, "sloTtft"},
		"sloTtft 0":            {replicasMD("sloTtft", "0s"), "sloTtft"},
		// A quarter of it is the engine's own step: the plan ran away.
		"sloTtft 1ms":           {replicasMD("sloTtft", "1ms"), "sloTtft"},
		"sloTtft 99ms":          {replicasMD("sloTtft", "99ms"), "sloTtft"},
		"sloItl negative":       {replicasMD("sloItl", "-50ms"), "sloItl"},
		"sloItl on running":     {map[string]string{"workspace": "llama", "metric": "running", "sloItl": "50ms"}, "sloItl"},
		"sloTtft typo is named": {replicasMD("sloTTFTs", "2s"), ""},
		"sloPercentile 100":     {replicasMD("sloPercentile", "100"), "sloPercentile"},
		"sloPercentile 0.9":     {replicasMD("sloPercentile", "0.9"), "sloPercentile"},
		"sloPercentile p90":     {replicasMD("sloPercentile", "p90"), "sloPercentile"},
		"sloPercentile on kv":   {map[string]string{"workspace": "llama", "metric": "kvCacheUsage", "sloPercentile": "90"}, "sloPercentile"},
		// Checked, then ignored by the planner.
		"aggregation":         {replicasMD("aggregation", "max"), "aggregation"},
		"missingPods":         {replicasMD("missingPods", "ignore"), "missingPods"},
		"a saturation target": {replicasMD("kvCacheTarget", "0.5"), "kvCacheTarget"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseTrigger(ref(tc.md), time.Minute, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.key != "" && !strings.Contains(err.Error(), `"`+tc.key+`"`) {
				t.Fatalf("error %q does not name %s", err, tc.key)
			}
			if tc.key == "" && !strings.Contains(err.Error(), "did you mean sloTtft") {
				t.Fatalf("error %q has no hint", err)
			}
		})
	}
	if tr, err := ParseTrigger(ref(replicasMD("sloTtft", "100ms")), time.Minute, nil); err != nil || tr.SLOTTFT != MinSLOTTFT {
		t.Fatalf("sloTtft 100ms: %+v, %v; want it taken", tr, err)
	}
	tr, err := ParseTrigger(ref(replicasMD("sloTtft", "1500ms", "sloItl", "80ms", "sloPercentile", "99.5")), time.Minute, nil)
	if err != nil || tr.SLOTTFT != 1500*time.Millisecond || tr.SLOITL != 80*time.Millisecond || tr.SLOPercentile != 99.5 || tr.Threshold != 1 || tr.Window != DefaultPlanWindow {
		t.Fatalf("parsed %+v, %v", tr, err)
	}
}

func TestPlanGauges(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.serve(40, 10000, 1, "a")
	if _, err := f.metric(t, replicasMD()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	exp := `
# HELP pulse_aggregator_plan_capacity_per_replica Work per second one replica sustains within the SLO, as the planner has learned it (0 before it has).
# TYPE pulse_aggregator_plan_capacity_per_replica gauge
pulse_aggregator_plan_capacity_per_replica{metric="replicas",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 10000
# HELP pulse_aggregator_plan_drain_need_replicas Replicas among which the arriving work must be spread for the largest queue at one ready replica, when capacity asked for now is ready, to be gone a minute after (a replica's queue drains only through it); the need is at least this.
# TYPE pulse_aggregator_plan_drain_need_replicas gauge
pulse_aggregator_plan_drain_need_replicas{metric="replicas",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 0
# HELP pulse_aggregator_plan_lead_time_seconds A replica's startup (created to Ready) as the planner has learned it, or assumed before it has seen one.
# TYPE pulse_aggregator_plan_lead_time_seconds gauge
pulse_aggregator_plan_lead_time_seconds{metric="replicas",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 300
# HELP pulse_aggregator_trigger_desired_replicas The replica count the HPA derives from the last value, before its tolerance, behaviour and min/max.
# TYPE pulse_aggregator_trigger_desired_replicas gauge
pulse_aggregator_trigger_desired_replicas{metric="replicas",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "pulse_aggregator_plan_capacity_per_replica",
		"pulse_aggregator_plan_drain_need_replicas", "pulse_aggregator_plan_lead_time_seconds", "pulse_aggregator_trigger_desired_replicas"); err != nil {
		t.Fatal(err)
	}
	// Every gauge of the plan is its part of the plan, by name.
	evs := f.server.Evaluations()
	if len(evs) != 1 || evs[0].Decision.Plan == nil {
		t.Fatalf("evaluations %+v, want the one plan", evs)
	}
	p := evs[0].Decision.Plan
	heldUntil := 0.0 // no peak past the need held
	if !p.HeldUntil.IsZero() {
		heldUntil = float64(p.HeldUntil.UnixNano()) / 1e9
	}
	want := map[string]float64{
		"work_per_second": p.Work, "capacity_per_replica": p.Capacity, "capacity_confidence": p.Confidence,
		"capacity_observations": float64(p.Observations), "lead_time_seconds": p.LeadTime.Seconds(), "need_replicas": p.Need,
		"held_peak_replicas": p.HeldPeak, "held_until_timestamp_seconds": heldUntil, "backlog": p.Backlog, "backlog_then": p.BacklogThen, "drain_need_replicas": p.DrainNeed,
		"starting_replicas": float64(p.Starting), "surge_work_per_second": p.Surge, "level_surge_work_per_second": p.LevelSurge,
		"trend_work_per_second": p.Trend, "planned_work_per_second": p.Level, "refused_replicas": float64(p.Refused), "stuck_replicas": float64(p.Stuck),
		"unseen_replicas": float64(p.Unseen), "unready_replicas": float64(p.Unready),
	}
	if p.Work == 0 || p.Confidence == 0 || p.Need == 0 || p.Level == 0 {
		t.Fatalf("plan %+v: want work, confidence, need and level to tell the gauges apart", p)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		name, ok := strings.CutPrefix(mf.GetName(), "pulse_aggregator_plan_")
		if !ok {
			continue
		}
		seen++
		if w, known := want[name]; !known || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != w {
			t.Errorf("%s: %v, want the plan's %v (known %v)", mf.GetName(), mf.GetMetric(), w, known)
		}
	}
	if seen != len(want) {
		t.Errorf("%d plan gauges exported, want %d", seen, len(want))
	}
}

// serveSlowTail serves like serve, with a request or two always waiting
// and a TTFT histogram whose slowest 30 % took 0.5–4 s: a p90 of 2.83 s
// above the 2 s SLO, while the mean queue time (0.3 s) is within a quarter
// of it.
func (f *fixture) serveSlowTail(n int, tokensPerSec float64, name string) {
	for range n {
		f.ms += 1000
		f.clock.Add(time.Second)
		r := store.Report{UID: "uid-" + name}
		r.TimeMs = f.ms
		s := float64(f.ms-1_700_000_000_000) / 1000
		r.Values.Set(metric.PromptTokens, tokensPerSec*s)
		r.Values.Set(metric.TTFTCount, s)
		r.Values.Set(metric.TTFTSum, 0.4*s)
		r.Values.Set(metric.QueueTimeCount, s)
		r.Values.Set(metric.QueueTimeSum, 0.3*s)
		r.Values.Set(metric.Waiting, 2)
		r.Values.Set(metric.Running, 4)
		r.Values.Set(metric.KVCacheUsage, 0.1)
		var h metric.Histograms
		h[metric.TTFTHist].Bounds = []float64{0.5, 4, math.Inf(1)}
		h[metric.TTFTHist].Counts = []float64{0.7 * s, s, s}
		r.Hist = &h
		f.store.Add([]store.Report{r})
	}
}

func TestPercentileSLOReadsTheTTFTHistogram(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.serveSlowTail(40, 10000, "a")
	plan := func(md map[string]string) *planner.Plan {
		t.Helper()
		if _, err := f.metric(t, md); err != nil {
			t.Fatal(err)
		}
		for _, e := range f.server.Evaluations() {
			if e.Err == "" && e.Decision.Plan != nil && e.Trigger.SLOPercentile == md2pct(md) {
				return e.Decision.Plan
			}
		}
		t.Fatalf("no plan evaluated for %v", md)
		return nil
	}
	// On means the replica is neither past its capacity (its mean queue
	// time is within a quarter of the SLO) nor within it (requests wait).
	if p := plan(replicasMD()); p.Breaks != 0 || p.Capacity != 0 || !strings.HasPrefix(p.Rule, "means") {
		t.Fatalf("on means: %d breaks, capacity %v, rule %q: want none learned", p.Breaks, p.Capacity, p.Rule)
	}
	// Its p90 TTFT, 2.83 s with requests waiting, is past a p90 SLO of 2 s:
	// the capacity is what it served.
	if p := plan(replicasMD("sloPercentile", "90")); p.Breaks != 1 || p.Capacity != 10000 || !strings.Contains(p.Rule, "p90 TTFT within 2s, read of the TTFT histograms") {
		t.Fatalf("p90: %d breaks, capacity %v, rule %q: want one break at 10000", p.Breaks, p.Capacity, p.Rule)
	}
}

func md2pct(md map[string]string) float64 {
	v, _ := strconv.ParseFloat(md["sloPercentile"], 64)
	return v
}

// TestOneTenantsPlansForgetOnlyItsOwn: the learned states were one LRU of
// 10,000 for every tenant, and a trigger naming a workload that does not
// exist added one at every evaluation: one tenant's made-up workloads, or
// its triggers of many SLOs, pushed every other tenant's learned capacity
// and lead time out. Now a workload with no pod holds no state, and past
// the bound the namespace holding the most forgets its own.
func TestOneTenantsPlansForgetOnlyItsOwn(t *testing.T) {
	f := newFixture(t)
	for i := range 50 {
		if _, err := f.metric(t, map[string]string{"workspace": fmt.Sprintf("nobody-%d", i), "metric": "replicas"}); status.Code(err) != codes.NotFound {
			t.Fatalf("unknown workload: %v, want NotFound", err)
		}
	}
	if n := f.server.plans.n; n != 0 {
		t.Fatalf("%d states held for workloads with no pod, want 0", n)
	}

	p := newPlans()
	p.max = 4
	key := func(ns, w string) planKey {
		return planKey{Key: store.Key{Namespace: ns, Kind: store.KindWorkspace, Name: w}, Owner: ns}
	}
	p.put(key("quiet", "llama"), planner.State{Capacity: 7})
	for i := range 20 {
		p.put(key("noisy", fmt.Sprint(i)), planner.State{Capacity: float64(i)})
	}
	if got := p.get(key("quiet", "llama")); got.Capacity != 7 {
		t.Fatalf("the quiet tenant's state was forgotten: %+v", got)
	}
	if p.n != 4 || p.ns["noisy"].Len() != 3 {
		t.Fatalf("%d states held, %d of the noisy tenant; want 4 and 3", p.n, p.ns["noisy"].Len())
	}
	if got := p.get(key("noisy", "19")); got.Capacity != 19 {
		t.Fatalf("the noisy tenant's newest state: %+v", got)
	}
	if got := p.get(key("noisy", "0")); got.Capacity != 0 {
		t.Fatalf("the noisy tenant's oldest state was kept: %+v", got)
	}
	// Namespaces of one state each, full: a second state of one of them
	// may forget its first, and its list; the new state is still held, and
	// the count stays true.
	q := newPlans()
	q.max = 3
	for _, ns := range []string{"a", "b", "c"} {
		q.put(key(ns, "w"), planner.State{Capacity: 1})
	}
	for i := range 20 {
		ns := []string{"a", "b", "c"}[i%3]
		q.put(key(ns, fmt.Sprint(i)), planner.State{Capacity: float64(i + 2)})
		held := 0
		for _, l := range q.ns {
			held += l.Len()
		}
		if got := q.get(key(ns, fmt.Sprint(i))); got.Capacity != float64(i+2) || held != q.n || q.n > q.max {
			t.Fatalf("put %d: state %+v, %d held, counted %d (at most %d)", i, got, held, q.n, q.max)
		}
	}
}

// TestOneTenantsRecordsPushOutOnlyItsOwn: past maxDecisions the oldest
// record went, whoever's it was: one tenant's many ScaledObjects pushed
// every other tenant's /debug/triggers records and trigger gauges out. Now
// the namespace holding the most loses its oldest.
func TestOneTenantsRecordsPushOutOnlyItsOwn(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newRecorder(func() time.Time { return now })
	r.record(&externalscaler.ScaledObjectRef{Namespace: "quiet", Name: "llama"}, Trigger{Metric: "waiting"}, Decision{Value: 1}, nil)
	for i := range maxDecisions + 50 {
		now = now.Add(time.Millisecond)
		r.record(&externalscaler.ScaledObjectRef{Namespace: "noisy", Name: fmt.Sprint(i)}, Trigger{Metric: "waiting"}, Decision{Value: 1}, nil)
	}
	held := 0
	for _, l := range r.ns {
		held += l.Len()
	}
	if !r.ns["noisy"].Contains(idOf(&externalscaler.ScaledObjectRef{Namespace: "noisy", Name: fmt.Sprint(maxDecisions + 49)}, Trigger{Metric: "waiting"})) {
		t.Fatal("the noisy tenant's newest record is not found by its key")
	}
	if quiet := r.ns["quiet"].Len(); quiet != 1 || held != maxDecisions || r.n != held {
		t.Fatalf("%d records (counted %d), %d of the quiet tenant; want %d and 1", held, r.n, quiet, maxDecisions)
	}
	if r.ns["noisy"].Contains(idOf(&externalscaler.ScaledObjectRef{Namespace: "noisy", Name: "0"}, Trigger{Metric: "waiting"})) {
		t.Fatal("the noisy tenant's oldest record was kept")
	}
	// Records past decisionTTL go, at the next record when full (at most
	// one walk a decisionSweep) and at every read.
	now = now.Add(decisionTTL + time.Second)
	r.record(&externalscaler.ScaledObjectRef{Namespace: "fresh", Name: "x"}, Trigger{Metric: "waiting"}, Decision{Value: 1}, nil)
	if r.n != 1 || len(r.ns) != 1 {
		t.Fatalf("%d records in %d namespaces after the TTL, want the fresh one alone", r.n, len(r.ns))
	}
}

// TestOneWorkloadsPlanWaitsForNoOther: one lock was held across every
// plan, so one tenant's large workloads made every other tenant's plans
// (KEDA's polls, the pusher's) wait for them. Now only the plans of one
// key wait for each other: with another key's plan under way, this one's
// is made.
func TestOneWorkloadsPlanWaitsForNoOther(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.report(map[string]float64{"a": 1})
	md := map[string]string{"workspace": "llama", "metric": "replicas"}
	mine := planKey{Key: llama, TTFT: 2 * time.Second, Window: DefaultPlanWindow, StaleAfter: DefaultStaleAfter, Owner: llama.Namespace}
	var other planKey
	for i := 0; ; i++ { // another tenant's key, under another lock
		other = planKey{Key: store.Key{Namespace: "team-b", Kind: store.KindWorkspace, Name: fmt.Sprint("big-", i)}, TTFT: 2 * time.Second, Owner: "team-b"}
		if f.server.plans.lockFor(other) != f.server.plans.lockFor(mine) {
			break
		}
	}
	busy := f.server.plans.lockFor(other)
	busy.Lock() // its plan under way
	defer busy.Unlock()
	// The call in a goroutine of its own, its checks in the test's (a
	// t.Fatal there ends only that goroutine).
	done := make(chan error, 1)
	go func() {
		_, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "x"})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the plan waited for another workload's")
	}
	f.server.plans.mu.Lock()
	held := f.server.plans.ns["demo"] != nil && f.server.plans.ns["demo"].Contains(mine)
	f.server.plans.mu.Unlock()
	if !held {
		t.Fatal("no state under the key the test holds apart: the test's key is not the plan's")
	}
}

// TestADeletedWorkloadForgetsWhatItLearned: a workload whose pods are all
// gone (no router holds requests for it) holds no learned state, and one
// made again under its name (a 70B where an 8B was) is planned on its own
// capacity: the old state was kept, its proof of capacity (8,000 a
// second) flooring the new workload's, which breaks at 3,000, for an hour.
func TestADeletedWorkloadForgetsWhatItLearned(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.serve(40, 8000, 0.01, "a") // the old model: 8000/s proven within the SLO
	tr, err := ParseTrigger(ref(replicasMD()), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 12 {
		f.serve(5, 8000, 0.01, "a")
		if _, err := f.server.Evaluate(tr); err != nil {
			t.Fatal(err)
		}
	}
	f.store.Upsert(store.Source{Node: "node-1"}, nil, true) // deleted: its agent lists it no more
	f.clock.Add(time.Minute)
	if _, err := f.server.Evaluate(tr); status.Code(err) != codes.NotFound {
		t.Fatalf("no pod: %v, want NotFound", err)
	}
	f.server.plans.mu.Lock()
	st, held := f.server.plans.get(keyOf(tr, planner.Default(2*time.Second))), f.server.plans.n
	f.server.plans.mu.Unlock()
	if st.Capacity != 0 || !st.Since.IsZero() || held != 0 {
		t.Fatalf("the workload has no pod: %d states held, capacity %v, since %s; want none", held, st.Capacity, st.Since)
	}
	f.pods("x")
	f.serve(40, 3000, 1, "x")
	var d Decision
	for range 8 * 12 {
		f.serve(5, 3000, 1, "x")
		if d, err = f.server.Evaluate(tr); err != nil {
			t.Fatal(err)
		}
	}
	if d.Plan.Capacity > 3000*1.01 {
		t.Fatalf("the workload made again broke at 3000/s: capacity %v, plan %v (%s); want about 3000", d.Plan.Capacity, d.Value, d.Plan.Reason)
	}
}

// TestAReadersPlansForgetOnlyItsOwn: with cross-namespace triggers allowed,
// a planner state was counted in the namespace of the workload it reads,
// so another tenant's triggers on a workload of this one (one per SLO)
// were counted in this one's namespace and, past the bound, forgot its own
// learned state. A state is its ScaledObject's namespace's.
func TestAReadersPlansForgetOnlyItsOwn(t *testing.T) {
	f := newFixture(t)
	f.server.crossNS = true
	f.server.plans.max = 4
	f.pods("a")
	f.report(map[string]float64{"a": 1})
	if _, err := f.client.IsActive(t.Context(), ref(replicasMD())); err != nil {
		t.Fatal(err)
	}
	own := planKey{Key: llama, TTFT: 2 * time.Second, Window: DefaultPlanWindow, StaleAfter: DefaultStaleAfter, Owner: llama.Namespace}
	f.server.plans.mu.Lock()
	before := f.server.plans.get(own)
	f.server.plans.mu.Unlock()
	if before.Since.IsZero() {
		t.Fatal("the victim's plan held no state")
	}
	for i := range 8 {
		_, err := f.client.IsActive(t.Context(), &externalscaler.ScaledObjectRef{Name: "reader-so", Namespace: "reader",
			ScalerMetadata: replicasMD("namespace", llama.Namespace, "sloTtft", fmt.Sprintf("%dms", 1100+i))})
		if err != nil {
			t.Fatalf("the reader's trigger: %v", err)
		}
	}
	f.server.plans.mu.Lock()
	after, held := f.server.plans.get(own), f.server.plans.n
	f.server.plans.mu.Unlock()
	if after.Since.IsZero() || held != 4 {
		t.Fatalf("another tenant's 8 triggers: the victim's state %+v, %d states held; want it kept, and 4 held", after, held)
	}
}

// TestAnAgentBackPastExpiryIsNoScaleDown: a node's agent lost past
// --pod-expiry and back, end to end through the store: its replicas, which
// served all along, are listed anew with one sample each, and the first
// plan after was 3 for 4 replicas serving (KV cache alone), until their
// second samples. It holds (an error: the HPA keeps its count) or keeps 4.
func TestAnAgentBackPastExpiryIsNoScaleDown(t *testing.T) {
	f := newFixture(t)
	names := []string{"a", "b", "c", "d"}
	list := func() store.Stream {
		st, err := f.store.OpenSource("node-1")
		if err != nil {
			t.Fatal(err)
		}
		var infos []store.PodInfo
		for _, n := range names {
			infos = append(infos, store.PodInfo{UID: "uid-" + n, Namespace: "demo", Name: n, Ready: true, Workloads: []store.Key{llama},
				CreatedMs: 1_699_999_000_000, ReadySinceMs: 1_699_999_240_000})
		}
		if _, err := f.store.UpsertStream(store.Source{Node: "node-1", Stream: st}, infos, true); err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := list()
	tr, err := ParseTrigger(ref(replicasMD()), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.serve(40, 8000, 0.01, names...)
	for range 12 * 15 { // 15 minutes serving
		f.serve(5, 8000, 0.01, names...)
		if _, err := f.server.Evaluate(tr); err != nil {
			t.Fatal(err)
		}
	}
	f.store.CloseSource("node-1", st)
	for range 12 * 12 { // 12 minutes with the agent lost
		f.clock.Add(5 * time.Second)
		f.ms += 5000
		f.store.Sweep()
		_, _ = f.server.Evaluate(tr)
	}
	if _, err := f.server.Evaluate(tr); err == nil {
		t.Fatal("a lost agent's workload: planned")
	}
	list()
	f.ms += 1000
	f.clock.Add(time.Second)
	var rs []store.Report
	for _, n := range names { // the first scrape: the counters where they are
		rs = append(rs, servingReport(n, f.ms, 8000, 0.01, 0.5))
	}
	f.store.Add(rs)
	if d, err := f.server.Evaluate(tr); err == nil && d.Value < 4 {
		t.Fatalf("4 replicas serving 8000/s each, their agent back: plan %v (%s); want an error (the HPA holds) or at least 4", d.Value, d.Plan.Reason)
	}
}

// TestAWorkloadMadeAgainLearnsAnew: a workload and its ScaledObject deleted
// together (a helm uninstall) are planned no more, so the plan that
// forgets a workload with no pod never ran, and a model installed again
// under the names was planned over the old one's state: 2 replicas at
// 40,000 a second, then new ones breaking at 8,000, planned 1. A state not
// planned for planForget whose pods were all made since is forgotten; one
// planned within it is kept, and so is one whose pods were there before
// (KEDA's operator away for longer, and nothing else planning).
func TestAWorkloadMadeAgainLearnsAnew(t *testing.T) {
	for _, c := range []struct {
		gap       time.Duration
		reinstall bool
		kept      bool
	}{{planForget + time.Minute, true, false}, {planForget / 2, true, true}, {planForget + time.Minute, false, true}} {
		f := newFixture(t)
		made := func(names ...string) { // listed with their creation, now
			var infos []store.PodInfo
			for _, n := range names {
				infos = append(infos, store.PodInfo{UID: "uid-" + n, Namespace: "demo", Name: n, Ready: true, Workloads: []store.Key{llama},
					CreatedMs: f.clock.Now().UnixMilli()})
			}
			f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
		}
		made("a", "b")
		tr, err := ParseTrigger(ref(replicasMD()), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.serve(40, 40000, 0.01, "a", "b")
		var d Decision
		for range 12 * 15 {
			f.serve(5, 40000, 0.01, "a", "b")
			if d, err = f.server.Evaluate(tr); err != nil {
				t.Fatal(err)
			}
		}
		learnt := d.Plan.Observations
		pods := []string{"a", "b"}
		if c.reinstall {
			f.store.Remove("node-1", "uid-a", "uid-b")
			pods = []string{"c", "d"}
		}
		// (Without a reinstall: KEDA's operator away, and nothing else
		// plans, its pods serving on.)
		f.clock.Add(c.gap)
		f.ms += c.gap.Milliseconds()
		if c.reinstall {
			made(pods...)
		}
		f.serve(40, 8000, 1.5, pods...) // past capacity: queued 1.5 s
		if d, err = f.server.Evaluate(tr); err != nil {
			t.Fatal(err)
		}
		if kept := d.Plan.Observations > learnt; kept != c.kept {
			t.Fatalf("planned again %s after (made again: %v): %d observations (%d before), capacity %.0f, plan %v; want the state kept: %v", c.gap, c.reinstall, d.Plan.Observations, learnt, d.Plan.Capacity, d.Value, c.kept)
		}
	}
}
