package scaler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// podSpec is one pod of a scenario: its state, and its waiting value when
// it reports.
type podSpec struct {
	name        string
	state       string // ready (reporting), starting, terminating, draining (terminating, still Ready), silent (ready, stale)
	waiting     float64
	terminating bool
}

// scenario lists the pods of llama in the store: ready ones report their
// value, silent ones reported once and then went stale.
func (f *fixture) scenario(pods ...podSpec) {
	var infos []store.PodInfo
	first, now := map[string]float64{}, map[string]float64{}
	for _, p := range pods {
		infos = append(infos, store.PodInfo{UID: "uid-" + p.name, Namespace: "demo", Name: p.name, Workloads: []store.Key{llama},
			Ready: p.state == "ready" || p.state == "silent" || p.state == "draining", Terminating: p.state == "terminating" || p.state == "draining"})
		switch p.state {
		case "ready":
			first[p.name], now[p.name] = p.waiting, p.waiting
		case "silent":
			first[p.name] = 100
		}
	}
	f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
	f.report(first)
	f.clock.Add(6 * time.Second) // silent pods go stale (staleAfter 5s)
	f.report(now)
}

// addStarting lists n more pods of llama that are starting (not ready).
func (f *fixture) addStarting(prefix string, n int) {
	var infos []store.PodInfo
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		infos = append(infos, store.PodInfo{UID: "uid-" + name, Namespace: "demo", Name: name, Workloads: []store.Key{llama}})
	}
	f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
}

// TestMissingPodRule: the value for every mix of ready, starting,
// terminating and silent pods, with each missingPods rule, aggregation and
// value type (docs/scaledobject.md, "Pods that start, stop, idle and fail").
func TestMissingPodRule(t *testing.T) {
	up := []podSpec{{"a", "ready", 12, false}, {"b", "ready", 15, false}, {"c", "silent", 0, false}}
	down := []podSpec{{"a", "ready", 6, false}, {"b", "ready", 8, false}, {"c", "silent", 0, false}}
	twoFailing := []podSpec{{"a", "ready", 12, false}, {"b", "ready", 12, false}, {"c", "silent", 0, false}, {"d", "silent", 0, false}}
	tests := map[string]struct {
		pods []podSpec
		md   map[string]string
		want float64
	}{
		// Reporting mean 13.5 > 10: the silent pod counts 0 (it cannot
		// inflate a scale-up): 12 + 15 + 0 = 27, which would flip the
		// direction (below 3 × 10), so the 3 pods are kept: 30 (the HPA's
		// rule; before 2026-11-30, 27).
		"hold, up: silent counts 0, and cannot cause a scale-down": {pods: up, want: 30},
		// Two pods at 12 beside two failing: 24 asked an overloaded
		// workload of 4 for 3 replicas.
		"hold, up: two failing of four keep the four": {pods: twoFailing, want: 40},
		"hold, up, average: two failing of four":      {pods: twoFailing, md: map[string]string{"valueType": "average"}, want: 10},
		"hold, up, max: three failing of four":        {pods: []podSpec{{"a", "ready", 12, false}, {"b", "silent", 0, false}, {"c", "silent", 0, false}, {"d", "silent", 0, false}}, md: map[string]string{"aggregation": "max"}, want: 40},
		// Reporting mean 7 <= 10: the silent pod holds at the threshold (it
		// cannot cause a scale-down): 6 + 8 + 10.
		"hold, down: silent holds at threshold": {pods: down, want: 24},
		"seed, down: silent counts 1.5x":        {pods: down, md: map[string]string{"missingPods": "seed"}, want: 29},
		"conservative is seed's former name":    {pods: down, md: map[string]string{"missingPods": "conservative"}, want: 29},
		"seed, up: silent counts 0":             {pods: up, md: map[string]string{"missingPods": "seed"}, want: 30},
		"ignore leaves it out":                  {pods: down, md: map[string]string{"missingPods": "ignore"}, want: 14},
		// The HPA multiplies by its 3 ready pods, the ignored one too: the
		// mean of the other two (7) is scaled by 2/3, so that its product
		// is theirs, 14, as with total (before 2026-11-30: 7, the product 21).
		"ignore, average: left out of the HPA's product too": {pods: down, md: map[string]string{"missingPods": "ignore", "valueType": "average"}, want: 14.0 / 3},
		// average (metricType Value): the HPA multiplies by its 3 ready pods.
		"hold, down, average":  {pods: down, md: map[string]string{"valueType": "average"}, want: 8},
		"hold, up, average":    {pods: up, md: map[string]string{"valueType": "average"}, want: 10},
		"max, up: 0 adds none": {pods: up, md: map[string]string{"aggregation": "max"}, want: 30},
		// max: the fill never exceeds the threshold, even with seed.
		"max, down, hold":        {pods: down, md: map[string]string{"aggregation": "max"}, want: 30},
		"max, down, seed capped": {pods: down, md: map[string]string{"aggregation": "max", "missingPods": "seed"}, want: 30},
		"max, down, average":     {pods: down, md: map[string]string{"aggregation": "max", "valueType": "average"}, want: 10},
		// max × the 2 counted (the failing one, 0, adds none): 30, over
		// the HPA's 3 Ready pods: it asks for 3, as total does (before
		// 2026-12-04, 15: the HPA asked for 5).
		"max, up, average":                {pods: up, md: map[string]string{"aggregation": "max", "valueType": "average"}, want: 10},
		"starting pods add no demand":     {pods: []podSpec{{"a", "ready", 9, false}, {"b", "starting", 0, false}, {"c", "starting", 0, false}}, want: 9},
		"starting pods: average of ready": {pods: []podSpec{{"a", "ready", 9, false}, {"b", "starting", 0, false}}, md: map[string]string{"valueType": "average"}, want: 9},
		"starting pods: max × ready pods": {pods: []podSpec{{"a", "ready", 2, false}, {"b", "ready", 2, false}, {"c", "starting", 0, false}}, md: map[string]string{"aggregation": "max"}, want: 4},
		"terminating pods are left out":   {pods: []podSpec{{"a", "ready", 5, false}, {"b", "ready", 5, false}, {"c", "terminating", 0, false}, {"d", "terminating", 0, false}}, want: 10},
		"terminating pods, average":       {pods: []podSpec{{"a", "ready", 5, false}, {"c", "terminating", 0, false}}, md: map[string]string{"valueType": "average"}, want: 5},
		// A pod draining in its grace period is still Ready, and the HPA
		// (metricType Value) multiplies by it too: the average over the 4
		// serving pods (10) is scaled by 4/5, so that the HPA asks for 4,
		// not 5 (one more at every scale-down, then undone).
		"draining pods, average: the HPA's product is the serving pods'": {pods: []podSpec{{"a", "ready", 10, false}, {"b", "ready", 10, false},
			{"c", "ready", 10, false}, {"d", "ready", 10, false}, {"e", "draining", 0, false}}, md: map[string]string{"valueType": "average"}, want: 8},
		"draining pods, total: left out": {pods: []podSpec{{"a", "ready", 10, false}, {"b", "ready", 10, false},
			{"c", "ready", 10, false}, {"d", "ready", 10, false}, {"e", "draining", 0, false}}, want: 40},
		// The worked example of docs/scaledobject.md.
		"worked example, down": {pods: []podSpec{{"llama-0", "ready", 4, false}, {"llama-1", "ready", 6, false}, {"llama-2", "silent", 0, false},
			{"llama-3", "starting", 0, false}, {"llama-4", "starting", 0, false}, {"llama-old", "terminating", 0, false}}, want: 20},
		"worked example, up": {pods: []podSpec{{"llama-0", "ready", 14, false}, {"llama-1", "ready", 16, false}, {"llama-2", "silent", 0, false},
			{"llama-3", "starting", 0, false}, {"llama-4", "starting", 0, false}, {"llama-old", "terminating", 0, false}}, want: 30},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.scenario(tc.pods...)
			md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10"}
			for k, v := range tc.md {
				md[k] = v
			}
			got, err := f.metric(t, md)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("GetMetrics = %v, want %v", got, tc.want)
			}
		})
	}
}

// hpaDesired is what the HPA makes of a value: ceil(value/threshold) for
// AverageValue (total), ceil(value/threshold × ready pods) for Value.
func hpaDesired(v, threshold float64, valueType string, ready int) int {
	if valueType == "average" {
		return int(math.Ceil(v / threshold * float64(ready)))
	}
	return int(math.Ceil(v / threshold))
}

// TestScaleUpDoesNotRunAway: 4 ready pods at 9 waiting and 4 starting after
// a burst. Before the fix each starting pod counted 1.5 × threshold and the
// HPA was asked for 10, 13, 18, 25, 36, 52 replicas on successive syncs.
func TestScaleUpDoesNotRunAway(t *testing.T) {
	for _, agg := range []string{"avg", "max"} {
		t.Run(agg, func(t *testing.T) {
			f := newFixture(t)
			f.scenario(podSpec{"a", "ready", 9, false}, podSpec{"b", "ready", 9, false}, podSpec{"c", "ready", 9, false}, podSpec{"d", "ready", 9, false})
			f.addStarting("burst", 4)
			md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10", "aggregation": agg}
			replicas := 8
			var asks []int
			for sync := range 6 {
				v, err := f.metric(t, md)
				if err != nil {
					t.Fatal(err)
				}
				want := hpaDesired(v, 10, "total", 0)
				asks = append(asks, want)
				if want > replicas { // the HPA adds pods: they start
					f.addStarting(fmt.Sprintf("sync%d", sync), want-replicas)
					replicas = want
				}
			}
			for _, a := range asks {
				if a > asks[0] || a > 4 {
					t.Fatalf("the HPA was asked for %v replicas on successive syncs; 4 ready pods at 9 waiting need at most 4", asks)
				}
			}
		})
	}
}

// TestScaleUpPropertyNeverAsksMore: for random mixes of ready, silent and
// starting pods, re-evaluating after the HPA has added the replicas it asked
// for (new pods starting, no new load) never asks for more than the first
// time, whatever the rule, aggregation or value type.
func TestScaleUpPropertyNeverAsksMore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		agg := []string{"avg", "max"}[rng.IntN(2)]
		vt := []string{"total", "average"}[rng.IntN(2)]
		mp := []string{"hold", "seed", "ignore"}[rng.IntN(3)]
		var pods []podSpec
		ready := 1 + rng.IntN(5)
		for j := range ready {
			pods = append(pods, podSpec{name: fmt.Sprintf("r%d", j), state: "ready", waiting: float64(rng.IntN(40))})
		}
		silent := rng.IntN(3)
		for j := range silent {
			pods = append(pods, podSpec{name: fmt.Sprintf("s%d", j), state: "silent"})
		}
		starting := rng.IntN(4)
		for j := range starting {
			pods = append(pods, podSpec{name: fmt.Sprintf("p%d", j), state: "starting"})
		}
		name := fmt.Sprintf("%d/%s/%s/%s/ready%d-silent%d-starting%d", i, agg, vt, mp, ready, silent, starting)
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.scenario(pods...)
			md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10", "aggregation": agg, "valueType": vt, "missingPods": mp}
			// The HPA's ready-pod count (metricType Value) is Kubernetes'
			// Ready pods: reporting and silent ones, never starting ones.
			k8sReady := ready + silent
			replicas := len(pods)
			var first int
			for sync := range 4 {
				v, err := f.metric(t, md)
				if err != nil {
					t.Fatal(err)
				}
				want := hpaDesired(v, 10, vt, k8sReady)
				if sync == 0 {
					first = want
				} else if want > first {
					t.Fatalf("sync %d asks for %d replicas, more than the first %d", sync, want, first)
				}
				if want > replicas {
					f.addStarting(fmt.Sprintf("sync%d", sync), want-replicas)
					replicas = want
				}
			}
		})
	}
}

// reportTTFT stores, per pod, cumulative TTFT sums and counts and its queue.
func (f *fixture) reportTTFT(vals map[string][3]float64) {
	f.ms += 1000
	var rs []store.Report
	for n, v := range vals {
		r := store.Report{UID: "uid-" + n}
		r.TimeMs = f.ms
		r.Values.Set(metric.TTFTSum, v[0])
		r.Values.Set(metric.TTFTCount, v[1])
		r.Values.Set(metric.Waiting, v[2])
		r.Values.Set(metric.Running, v[2])
		rs = append(rs, r)
	}
	f.store.Add(rs)
}

// TestIdlePodsAreLeftOut: the documented phi example (ttftSeconds,
// threshold 1.5, max, average) with one pod at 0.1 s and two idle pods.
// Before the fix the idle pods were filled with 1.5 × threshold: 2.25, and
// the HPA wanted 5 replicas for an almost idle workload.
func TestIdlePodsAreLeftOut(t *testing.T) {
	md := map[string]string{"workspace": "llama", "metric": "ttftSeconds", "threshold": "1.5", "aggregation": "max", "valueType": "average"}
	t.Run("one busy pod", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a", "b", "c")
		f.reportTTFT(map[string][3]float64{"a": {1, 10, 0}, "b": {5, 50, 0}, "c": {5, 50, 0}})
		f.reportTTFT(map[string][3]float64{"a": {2, 20, 0}, "b": {5, 50, 0}, "c": {5, 50, 0}})
		// 0.1 × the one counted pod, over the HPA's 3 Ready pods: the
		// HPA's product is 0.1, as total's value (before 2026-12-04, 0.1:
		// the HPA's product 0.3, the idle pods in it).
		got, err := f.metric(t, md)
		if err != nil || math.Abs(got-0.1/3) > 1e-9 {
			t.Fatalf("GetMetrics = %v, %v; want 0.1/3 (the idle pods left out of the HPA's product)", got, err)
		}
		if d := f.server.Evaluations()[0].Decision; d.Counted != 1 || d.LeftOut != 2 {
			t.Fatalf("decision %+v: want 1 counted, 2 left out", d)
		}
	})
	t.Run("every pod idle", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a", "b")
		f.reportTTFT(map[string][3]float64{"a": {1, 10, 0}, "b": {5, 50, 0}})
		f.reportTTFT(map[string][3]float64{"a": {1, 10, 0}, "b": {5, 50, 0}})
		if got, err := f.metric(t, md); err != nil || got != 0 {
			t.Fatalf("GetMetrics = %v, %v; want 0: nothing waits, runs or finishes", got, err)
		}
	})
	t.Run("queued but nothing finished is not idle", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a")
		f.reportTTFT(map[string][3]float64{"a": {1, 10, 3}})
		f.reportTTFT(map[string][3]float64{"a": {1, 10, 3}})
		if _, err := f.metric(t, md); status.Code(err) != codes.Unavailable {
			t.Fatalf("GetMetrics error %v, want Unavailable: requests wait and none finished", err)
		}
	})
}

func TestNoReadyPodIsAnError(t *testing.T) {
	f := newFixture(t)
	f.addStarting("loading", 2)
	_, err := f.metric(t, map[string]string{"workspace": "llama"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no pod is ready yet (2 starting") {
		t.Fatalf("GetMetrics error %v, want Unavailable: no pod is ready yet", err)
	}
}

// TestWindowPastKeptSamples: at 250 ms scrapes with 128 samples kept, a 1m
// window covered only the last 32 s, silently. Now it is InvalidArgument
// naming the key, the interval and the flag to raise.
func TestWindowPastKeptSamples(t *testing.T) {
	f := newFixture(t)
	f.keepSamples(128, "a", 240, 250, func(i int, v *metric.Values) {
		v.Set(metric.Waiting, float64(100*(1-i/120)))
	})
	_, err := f.metric(t, map[string]string{"workspace": "llama", "window": "1m"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"window"`) ||
		!strings.Contains(err.Error(), "--max-samples-per-pod to at least 242") {
		t.Fatalf("error %v: want InvalidArgument naming window and --max-samples-per-pod 242", err)
	}
	if got, err := f.metric(t, map[string]string{"workspace": "llama", "window": "30s"}); err != nil || got != 0 {
		t.Fatalf("a window within the kept samples: %v, %v", got, err)
	}
	// The planner's snapshot was not checked: it planned over the 32 s
	// kept as if they were the minute.
	_, err = f.metric(t, map[string]string{"workspace": "llama", "metric": "replicas", "window": "1m"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-samples-per-pod to at least 242") {
		t.Fatalf("a plan over a window past the kept samples: %v, want InvalidArgument", err)
	}
	if got, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "replicas", "window": "30s"}); err != nil || got != 1 {
		t.Fatalf("a plan over a window within the kept samples: %v, %v; want the one ready replica", got, err)
	}
}

// TestAnUndefinedWindowPastKeptSamplesSaysSo: a mean TTFT whose requests
// all finished in the part of the window the kept samples do not reach
// was refused as "not defined ... none finished in the window", where
// some had: the refusal now names the window and the flag, as a defined
// one's does.
func TestAnUndefinedWindowPastKeptSamplesSaysSo(t *testing.T) {
	f := newFixture(t)
	f.keepSamples(10, "a", 31, 1000, func(i int, v *metric.Values) {
		v.Set(metric.Running, 1)
		// Ten requests finished in the first 5 s, 2 s each; none since.
		n := float64(min(i, 5) * 2)
		v.Set(metric.TTFTCount, n)
		v.Set(metric.TTFTSum, 2*n)
	})
	_, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "ttftSeconds", "threshold": "1", "window": "30s"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-samples-per-pod to at least") {
		t.Fatalf("error %v: want InvalidArgument naming window and --max-samples-per-pod", err)
	}
}

// TestNoHistogramsPastKeptSamplesNamesForwardHistograms: a quantile
// whose pods' agents forward no histogram is no window's matter: raising
// --max-samples-per-pod, as the truncated window's refusal said, would
// only have led to the refusal naming --forward-histograms.
func TestNoHistogramsPastKeptSamplesNamesForwardHistograms(t *testing.T) {
	f := newFixture(t)
	f.keepSamples(10, "a", 31, 1000, func(_ int, v *metric.Values) {
		v.Set(metric.Running, 1)
	})
	_, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "ttftP90Seconds", "threshold": "2", "window": "30s"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--forward-histograms") {
		t.Fatalf("error %v: want Unavailable naming --forward-histograms", err)
	}
}

// keepSamples gives f a store that keeps kept samples a pod, lists pod and
// adds n samples of it, everyMs apart, their values set by set.
func (f *fixture) keepSamples(kept int, pod string, n int, everyMs int64, set func(i int, v *metric.Values)) {
	f.store = store.New(store.Options{Retention: time.Minute, MaxSamples: kept, Now: f.clock.Now})
	f.server.store = f.store
	f.pods(pod)
	for i := range n {
		f.ms += everyMs
		r := store.Report{UID: "uid-" + pod}
		r.TimeMs = f.ms
		set(i, &r.Values)
		f.store.Add([]store.Report{r})
	}
}

func TestThresholdBelowKEDAResolution(t *testing.T) {
	for _, v := range []string{"0.0004", "0.0009", "0"} {
		_, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "threshold": v}), time.Minute, nil)
		var me *MetadataError
		if !asMetadataError(err, &me) || me.Key != "threshold" {
			t.Errorf("threshold %s: %v, want an error naming threshold", v, err)
		}
	}
	if _, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "threshold": "0.001"}), time.Minute, nil); err != nil {
		t.Errorf("threshold 0.001: %v", err)
	}
}

func asMetadataError(err error, target **MetadataError) bool {
	return errors.As(err, target)
}

// TestWarmupGate: while the gate says the aggregator is warming up, every
// answer is Unavailable and StreamIsActive pushes nothing; then it answers.
func TestWarmupGate(t *testing.T) {
	f := newFixture(t)
	open := make(chan struct{})
	var asked atomic.Int64 // the gate's consultations while shut
	f.server.gate = func() error {
		select {
		case <-open:
			return nil
		default:
			asked.Add(1)
			return fmt.Errorf("aggregator warming up")
		}
	}
	f.pods("a")
	f.report(map[string]float64{"a": 20})
	md := map[string]string{"workspace": "llama", "window": "1s"}
	if _, err := f.metric(t, md); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "warming up") {
		t.Fatalf("GetMetrics during warm-up: %v, want Unavailable", err)
	}
	if _, err := f.client.IsActive(context.Background(), ref(md)); status.Code(err) != codes.Unavailable {
		t.Fatalf("IsActive during warm-up: %v, want Unavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.client.StreamIsActive(ctx, ref(md))
	if err != nil {
		t.Fatal(err)
	}
	type recv struct {
		result bool
		err    error
	}
	got := make(chan recv, 1)
	go func() {
		r, err := stream.Recv()
		got <- recv{r.GetResult(), err}
	}()
	// The pusher evaluates the stream (the gate consulted, after the
	// change) and hands nothing over while the gate is shut: its own
	// count, not a quiet window of wall time.
	before := asked.Load()
	f.report(map[string]float64{"a": 21})
	for deadline := time.Now().Add(10 * time.Second); asked.Load() < before+2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream was not evaluated during the warm-up")
		}
	}
	if n := f.server.push.handed.Load(); n != 0 {
		t.Fatalf("%d states handed over to push during the warm-up, want none", n)
	}
	close(open)
	select {
	case r := <-got:
		if r.err != nil || !r.result {
			t.Fatalf("after the warm-up: pushed %v, %v; want true", r.result, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing pushed within 10 s of the warm-up's end")
	}
	if got, err := f.metric(t, md); err != nil || got != 21 {
		t.Fatalf("after warm-up: %v, %v", got, err)
	}
}

// TestDecisionsRecordedAndExported: the last answer for each trigger shows
// every pod's use and reason, and is exported as lint-clean gauges.
func TestDecisionsRecordedAndExported(t *testing.T) {
	f := newFixture(t)
	f.scenario(podSpec{"a", "ready", 4, false}, podSpec{"b", "ready", 6, false}, podSpec{"c", "starting", 0, false},
		podSpec{"d", "terminating", 0, false}, podSpec{"e", "silent", 0, false})
	md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10"}
	if _, err := f.metric(t, md); err != nil {
		t.Fatal(err)
	}
	if _, err := f.metric(t, map[string]string{"workspace": "nobody"}); err == nil {
		t.Fatal("an unknown workload answered")
	}
	evs := f.server.Evaluations()
	if len(evs) != 2 {
		t.Fatalf("%d evaluations, want 2", len(evs))
	}
	e := evs[0]
	if e.Err != "" || e.Decision.Value != 20 || e.Desired() != 2 || e.Decision.Direction != "down" {
		t.Fatalf("evaluation %+v", e)
	}
	want := map[string]string{"a": "counted/", "b": "counted/", "c": "left out/starting", "d": "left out/terminating", "e": "filled/hold: threshold (stale)"}
	for _, p := range e.Decision.Pods {
		if got := p.Use + "/" + p.Why; got != want[p.Name] {
			t.Errorf("pod %s: %s, want %s", p.Name, got, want[p.Name])
		}
	}
	if evs[1].Err == "" || evs[1].Desired() != -1 {
		t.Fatalf("the failed evaluation: %+v", evs[1])
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	exp := `
# HELP pulse_aggregator_trigger_pods Pods in the trigger's last evaluation, by use: counted, filled (missing-pod rule) or left_out.
# TYPE pulse_aggregator_trigger_pods gauge
pulse_aggregator_trigger_pods{metric="waiting",namespace="demo",scaledobject="llama-so",use="counted",workload="Workspace demo/llama"} 2
pulse_aggregator_trigger_pods{metric="waiting",namespace="demo",scaledobject="llama-so",use="filled",workload="Workspace demo/llama"} 1
pulse_aggregator_trigger_pods{metric="waiting",namespace="demo",scaledobject="llama-so",use="left_out",workload="Workspace demo/llama"} 2
# HELP pulse_aggregator_trigger_desired_replicas The replica count the HPA derives from the last value, before its tolerance, behaviour and min/max.
# TYPE pulse_aggregator_trigger_desired_replicas gauge
pulse_aggregator_trigger_desired_replicas{metric="waiting",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "pulse_aggregator_trigger_pods", "pulse_aggregator_trigger_desired_replicas"); err != nil {
		t.Fatal(err)
	}
	// A ScaledObject not asked about for 10 minutes is forgotten.
	f.clock.Add(11 * time.Minute)
	if n := len(f.server.Evaluations()); n != 0 {
		t.Fatalf("%d evaluations kept after 11 minutes", n)
	}
}

// TestDashboardUsesExportedMetrics: every query of the chart's Grafana
// dashboard names a metric the decision collector exports, with its labels.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/aggregator/dashboards/pulse-decisions.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	ch := make(chan *prometheus.Desc, 32)
	decisionCollector{}.Describe(ch)
	close(ch)
	for d := range ch {
		name := strings.Split(strings.Split(d.String(), `fqName: "`)[1], `"`)[0]
		exported[name] = true
	}
	metricName := regexp.MustCompile(`pulse_[a-z_]+`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				n++
				if !exported[m] {
					t.Errorf("panel %q queries %s, which pulse does not export", p.Title, m)
				}
			}
			for _, l := range []string{"namespace", "scaledobject"} {
				if !strings.Contains(tg.Expr, l) {
					t.Errorf("panel %q does not filter by %s", p.Title, l)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("the dashboard queries nothing")
	}
}

// reportHist stores, per pod, cumulative TTFT bucket counts over the bounds
// 0.1, 1, 10, +Inf (nil: the pod forwards no histogram), with one request
// running so that an undefined value is not idle.
func (f *fixture) reportHist(counts map[string][]float64) {
	f.ms += 1000
	var rs []store.Report
	for n, c := range counts {
		r := store.Report{UID: "uid-" + n}
		r.TimeMs = f.ms
		r.Values.Set(metric.Waiting, 0)
		r.Values.Set(metric.Running, 1)
		if c != nil {
			r.Hist = &metric.Histograms{}
			r.Hist[metric.TTFTHist] = metric.Buckets{Bounds: []float64{0.1, 1, 10, math.Inf(1)}, Counts: c}
		}
		rs = append(rs, r)
	}
	f.store.Add(rs)
}

// TestQuantileIsTheWorkloads: ttftP90Seconds is the p90 of the workload's
// requests (its pods' bucket increases merged), not a mean of the pods'
// p90s; a stale pod is filled by the missing-pod rule as with any metric;
// a workload whose agents forward no histogram gets an error that says how
// to turn them on.
func TestQuantileIsTheWorkloads(t *testing.T) {
	md := map[string]string{"workspace": "llama", "metric": "ttftP90Seconds", "threshold": "2", "valueType": "average"}
	t.Run("merged", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a", "b")
		f.reportHist(map[string][]float64{"a": {0, 0, 0, 0}, "b": {0, 0, 0, 0}})
		// a: 90 requests under 0.1 s; b: 10 between 1 and 10 s. The
		// workload's p90 is at the top of the fast bucket (0.1); the pods'
		// own p90s are 0.1 and 9.1, whose mean would be 4.6.
		f.reportHist(map[string][]float64{"a": {90, 90, 90, 90}, "b": {0, 0, 10, 10}})
		got, err := f.metric(t, md)
		if err != nil || math.Abs(got-0.1) > 1e-9 {
			t.Fatalf("GetMetrics = %v, %v; want 0.1", got, err)
		}
		d := f.server.Evaluations()[0].Decision
		if d.Counted != 2 {
			t.Fatalf("decision %+v: want 2 counted", d)
		}
	})
	t.Run("stale pod held at the threshold", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a", "b")
		f.reportHist(map[string][]float64{"a": {0, 0, 0, 0}, "b": {0, 0, 0, 0}})
		f.clock.Add(6 * time.Second)
		f.reportHist(map[string][]float64{"a": {10, 10, 10, 10}}) // b went silent
		got, err := f.metric(t, md)
		// a's p90 is 0.09 (rank 9 of 10 in (0, 0.1]): below 2, so b holds at 2.
		if want := (0.09 + 2) / 2; err != nil || math.Abs(got-want) > 1e-9 {
			t.Fatalf("GetMetrics = %v, %v; want %v", got, err, want)
		}
	})
	t.Run("no histograms forwarded", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a")
		f.reportHist(map[string][]float64{"a": nil})
		f.reportHist(map[string][]float64{"a": nil})
		_, err := f.metric(t, md)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--forward-histograms") {
			t.Fatalf("GetMetrics error %v, want Unavailable naming --forward-histograms", err)
		}
	})
	t.Run("beyond the highest bound the pods share", func(t *testing.T) {
		// Every request past 10 s, the highest finite bound: the p90 is
		// somewhere past 10. Answered as 10 against a threshold of 20, the
		// trigger never scaled up; against 2 it is past it either way.
		f := newFixture(t)
		f.pods("a")
		f.reportHist(map[string][]float64{"a": {0, 0, 0, 0}})
		f.reportHist(map[string][]float64{"a": {0, 0, 0, 10}})
		above := map[string]string{"workspace": "llama", "metric": "ttftP90Seconds", "threshold": "20", "valueType": "average"}
		if got, err := f.metric(t, above); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "lies past 10 s") {
			t.Fatalf("threshold 20: GetMetrics = %v, %v; want Unavailable: the quantile is past 10, how far unknown", got, err)
		}
		if got, err := f.metric(t, md); err != nil || got != 10 {
			t.Fatalf("threshold 2: GetMetrics = %v, %v; want 10 (past the threshold either way)", got, err)
		}
	})
	t.Run("threshold required", func(t *testing.T) {
		f := newFixture(t)
		f.pods("a")
		if _, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "itlP99Seconds"}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("GetMetrics error %v, want InvalidArgument: threshold required", err)
		}
	})
}

// TestLostReplicasAreNoZero: a workload with a demand source whose replicas'
// agent is lost past the pod expiry (or whose pods are evicted) once read as
// demand alone: 0 and inactive, and KEDA scaled a serving workload down or
// to zero. Replicas that were reporting and are gone without their agent
// removing them are now an error (KEDA's fallback; the HPA holds); replicas
// the agent removes (a scale-down) still leave the routers' demand.
func TestLostReplicasAreNoZero(t *testing.T) {
	f := newFixture(t)
	router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
	reportDemand := func() {
		r := store.Report{UID: router.UID}
		r.TimeMs = f.clock.Now().UnixMilli()
		r.Values.Set(metric.PendingRequests, 0)
		f.store.Add([]store.Report{r})
	}
	_, _ = f.store.OpenSource("node-router")
	f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router}, false)
	_, _ = f.store.OpenSource("node-1")
	f.scenario(podSpec{name: "llama-0", state: "ready", waiting: 3}, podSpec{name: "llama-1", state: "ready", waiting: 4})
	reportDemand()
	tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: "total", Aggregation: "avg", Window: 10 * time.Second,
		StaleAfter: 5 * time.Second, MissingPods: "auto"}
	if d, err := f.server.Evaluate(tr); err != nil || d.Value != 7 {
		t.Fatalf("serving: %+v, %v", d, err)
	}
	// The replicas' agent is lost; past the expiry its pods are left out,
	// then swept.
	f.store.CloseSource("node-1", 1)
	f.clock.Add(11 * time.Minute)
	reportDemand()
	for _, sweep := range []bool{false, true} {
		if sweep {
			f.store.Sweep()
		}
		d, err := f.server.Evaluate(tr)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "2 replicas that were reporting are gone") {
			t.Fatalf("swept %v: %+v, %v; want Unavailable naming the 2 lost replicas", sweep, d, err)
		}
	}
	// A replica listed again: answers as before.
	_, _ = f.store.OpenSource("node-1")
	f.scenario(podSpec{name: "llama-0", state: "ready", waiting: 2})
	if d, err := f.server.Evaluate(tr); err != nil || d.Value != 2 {
		t.Fatalf("listed again: %+v, %v", d, err)
	}
	// Its agent removes it (a scale-down to zero): the routers' demand,
	// 0, is the answer.
	f.store.Remove("node-1", "uid-llama-0")
	reportDemand()
	if d, err := f.server.Evaluate(tr); err != nil || d.Value != 0 || d.Active {
		t.Fatalf("removed by its agent: %+v, %v; want 0 and inactive", d, err)
	}
}

// TestAStaleRouterIsNoZero: a workload at zero with two routers, one
// whose agent stopped reporting. The fresh one holding nothing was the
// whole answer, 0: the workload stayed at zero while the stale one held
// its requests. That is now an error (waiting and the planner alike);
// demand the fresh one reports is still answered.
func TestAStaleRouterIsNoZero(t *testing.T) {
	f := newFixture(t)
	router := func(name string) store.PodInfo {
		return store.PodInfo{UID: store.DemandUID("uid-"+name, "llama"), Namespace: "demo", Name: name, Ready: true, Demand: true, Workloads: []store.Key{llama}}
	}
	held := func(name string, n float64) {
		r := store.Report{UID: router(name).UID}
		r.TimeMs = f.clock.Now().UnixMilli()
		r.Values.Set(metric.PendingRequests, n)
		f.store.Add([]store.Report{r})
	}
	_, _ = f.store.OpenSource("node-router")
	f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router("epp-0"), router("epp-1")}, false)
	held("epp-0", 0)
	held("epp-1", 30)
	waiting := Trigger{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: "total", Aggregation: "avg", Window: 10 * time.Second,
		StaleAfter: 5 * time.Second, MissingPods: "auto"}
	replicas := waiting
	replicas.Metric, replicas.Threshold, replicas.Window, replicas.SLOTTFT = "replicas", 1, 30*time.Second, 2*time.Second
	if d, err := f.server.Evaluate(waiting); err != nil || d.Value != 30 {
		t.Fatalf("both reporting: %+v, %v; want the 30 held", d, err)
	}
	f.clock.Add(6 * time.Second)
	held("epp-0", 0) // epp-1's agent is lost
	for _, tr := range []Trigger{waiting, replicas} {
		d, err := f.server.Evaluate(tr)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "1 of ready routers have not reported within staleAfter") {
			t.Fatalf("%s, one router stale and the other holding nothing: %+v, %v; want Unavailable", tr.Metric, d, err)
		}
	}
	f.clock.Add(time.Second)
	held("epp-0", 4)
	if d, err := f.server.Evaluate(waiting); err != nil || d.Value != 4 || !d.Active {
		t.Fatalf("waiting, the fresh router holding 4: %+v, %v; want 4", d, err)
	}
	if d, err := f.server.Evaluate(replicas); err != nil || d.Value != 1 {
		t.Fatalf("replicas, the fresh router holding 4: %+v, %v; want 1", d, err)
	}
	// A replica starting (woken by epp-1's requests): the planner planned
	// from epp-0's 0, and KEDA scaled the replica away while epp-1 held
	// them.
	f.clock.Add(time.Second)
	held("epp-0", 0)
	_, _ = f.store.OpenSource("node-1")
	f.addStarting("llama", 1)
	for _, tr := range []Trigger{waiting, replicas} {
		d, err := f.server.Evaluate(tr)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "1 of ready routers have not reported") {
			t.Fatalf("%s, a replica starting, one router stale and the other holding nothing: %+v, %v; want Unavailable", tr.Metric, d, err)
		}
	}
	// A router starting or stopping (listed, not scraped) holds nothing:
	// a rollout of the routers is no error.
	notReady := router("epp-1")
	notReady.Ready = false
	f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router("epp-0"), notReady}, false)
	for _, tr := range []Trigger{waiting, replicas} {
		if d, err := f.server.Evaluate(tr); err != nil {
			t.Fatalf("%s, the stale router not ready: %+v, %v; want the fresh one's answer", tr.Metric, d, err)
		}
	}
}

// TestReplicasWaitingForRoomAreNoZero: a workload whose new replicas the
// store refused for room (--max-pods, --max-pods-per-namespace) read as
// the replicas held alone (a total, or the planner's load, short by the
// ones refused) or, none held, as the routers' demand alone (0, inactive:
// KEDA scaled it to zero) or NotFound. It is now Unavailable, for a
// threshold trigger and the planner alike.
func TestReplicasWaitingForRoomAreNoZero(t *testing.T) {
	router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
	replica := func(i int) store.PodInfo {
		return store.PodInfo{UID: fmt.Sprint("uid-llama-", i), Namespace: "demo", Name: fmt.Sprint("llama-", i), Ready: true, Workloads: []store.Key{llama}}
	}
	for name, room := range map[string]int{"none held": 1, "one held, one waiting": 2} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.store = store.New(store.Options{Retention: time.Minute, MaxPods: 10, MaxPodsPerNamespace: room, Now: f.clock.Now})
			f.server = New(f.store, Options{MaxWindow: time.Minute, Now: f.clock.Now})
			_, _ = f.store.OpenSource("node-1")
			if refused := f.store.Upsert(store.Source{Node: "node-1"}, []store.PodInfo{router, replica(0), replica(1)}, true); len(refused) != 3-room {
				t.Fatalf("refused %v, want %d refused for room", refused, 3-room)
			}
			var rs []store.Report
			for _, uid := range []string{router.UID, "uid-llama-0"} {
				r := store.Report{UID: uid}
				r.TimeMs = f.clock.Now().UnixMilli()
				r.Values.Set(metric.PendingRequests, 0)
				r.Values.Set(metric.Waiting, 3)
				rs = append(rs, r)
			}
			f.store.Add(rs)
			for _, tr := range []Trigger{
				{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: "total", Aggregation: "avg", Window: 10 * time.Second, StaleAfter: 5 * time.Second, MissingPods: "auto"},
				{Workload: llama, Metric: MetricReplicas, Threshold: 1, ValueType: "total", Window: time.Minute, StaleAfter: 5 * time.Second, SLOTTFT: 2 * time.Second},
			} {
				if d, err := f.server.Evaluate(tr); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "wait for room in the aggregator") {
					t.Fatalf("%s: %+v, %v; want Unavailable, replicas waiting for room", tr.Metric, d, err)
				}
			}
		})
	}
}

// TestHeldDemandSetsTheFillDirection: two replicas at 8 waiting (threshold
// 10), one stale, and 20 requests held at the router. By the HPA's rule the
// counted pods with the held requests are at 18 a pod: scaling up, so the
// stale pod counts 0 and the total is 36 (4 replicas). Ignoring the held
// requests, the direction was down, the stale pod counted 10 and the total
// 46 asked for 5.
func TestHeldDemandSetsTheFillDirection(t *testing.T) {
	f := newFixture(t)
	router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
	f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router}, false)
	f.scenario(podSpec{name: "a", state: "ready", waiting: 8}, podSpec{name: "b", state: "ready", waiting: 8}, podSpec{name: "c", state: "silent"})
	r := store.Report{UID: router.UID}
	r.TimeMs = f.clock.Now().UnixMilli()
	r.Values.Set(metric.PendingRequests, 20)
	f.store.Add([]store.Report{r})
	tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: "total", Aggregation: "avg", Window: 10 * time.Second,
		StaleAfter: 5 * time.Second, MissingPods: "auto"}
	d, err := f.server.Evaluate(tr)
	if err != nil || d.Value != 36 || d.Direction != "up" || d.DesiredReplicas(tr) != 4 {
		t.Fatalf("%+v, %v; want 36, up, 4 replicas", d, err)
	}
}

// TestADecisionListsBoundedPods: each trigger's last decision is kept (up
// to 10,000), and it listed every pod of its workload: one tenant's
// triggers on a workload of hundreds of pods held hundreds of megabytes.
// A decision lists at most maxPodDetail pods, those filled or left out
// first, and how many more there were; its counts cover them all.
func TestADecisionListsBoundedPods(t *testing.T) {
	f := newFixture(t)
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("p%02d", i))
	}
	f.pods(names...)
	waiting := map[string]float64{}
	for _, n := range names[3:] { // p00, p01 and p02 never report: filled
		waiting[n] = 5
	}
	f.report(waiting)
	if _, err := f.metric(t, map[string]string{"workspace": "llama"}); err != nil {
		t.Fatal(err)
	}
	d := f.server.Evaluations()[0].Decision
	if d.Counted != 37 || d.Filled != 3 || len(d.Pods) != maxPodDetail || d.PodsNotListed != 40-maxPodDetail {
		t.Fatalf("counted %d, filled %d, %d pods listed and %d not; want 37, 3, %d and %d", d.Counted, d.Filled, len(d.Pods), d.PodsNotListed, maxPodDetail, 40-maxPodDetail)
	}
	for i, want := range []string{"p00", "p01", "p02"} {
		if p := d.Pods[i]; p.Name != want || p.Use != UseFilled {
			t.Fatalf("pod %d listed: %+v, want %s filled first", i, p, want)
		}
	}
}

// TestHeldDemandBesideDrainingPodsIsSpreadForTheHPA: no pod serves (two
// draining in their grace period, still Ready, and one starting) and 20
// requests are held at the router. With valueType average the HPA
// multiplies the value by its 2 Ready pods: the whole 20 asked for 4
// replicas where the demand is 2's (threshold 10). It is now spread over
// them, as the held requests beside serving pods are; with total it is
// the whole.
func TestHeldDemandBesideDrainingPodsIsSpreadForTheHPA(t *testing.T) {
	for _, c := range []struct {
		valueType string
		want      float64
	}{{"average", 10}, {"total", 20}} {
		f := newFixture(t)
		router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
		f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router}, false)
		f.scenario(podSpec{name: "a", state: "draining"}, podSpec{name: "b", state: "draining"}, podSpec{name: "c", state: "starting"})
		r := store.Report{UID: router.UID}
		r.TimeMs = f.clock.Now().UnixMilli()
		r.Values.Set(metric.PendingRequests, 20)
		f.store.Add([]store.Report{r})
		tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: c.valueType, Aggregation: "avg", Window: 10 * time.Second,
			StaleAfter: 5 * time.Second, MissingPods: "auto"}
		d, err := f.server.Evaluate(tr)
		if err != nil || d.Value != c.want || hpaDesired(d.Value, 10, c.valueType, 2) != 2 || d.DesiredReplicas(tr) != 2 {
			t.Fatalf("%s: %+v, %v; want %v, 2 replicas", c.valueType, d, err, c.want)
		}
	}
}

// TestDesiredReplicasIsBounded: 1e15 over a threshold of 0.001 times 10
// ready pods is past an int's range; the conversion read -9.2e18 on amd64.
func TestDesiredReplicasIsBounded(t *testing.T) {
	for _, c := range []struct {
		valueType string
		value     float64
		ready     int
		want      int
	}{
		{"average", 1e15, 10, math.MaxInt32},
		{"total", 1e15, 10, math.MaxInt32},
		{"average", 1.5, 4, 6000},
		{"total", 1.5, 4, 1500},
	} {
		tr := Trigger{ValueType: c.valueType, Threshold: 0.001}
		if got := (Decision{Value: c.value, Ready: c.ready}).DesiredReplicas(tr); got != c.want {
			t.Errorf("%s %v over 0.001 with %d ready: %d, want %d", c.valueType, c.value, c.ready, got, c.want)
		}
	}
}

// TestHeldDemandKEDACannotCarryIsAnError: the routers' demand alone (no
// replica ready, or none at all) was answered as it was, unchecked: a
// router's page of huge values (summed to +Inf, or past MaxValue) reached
// KEDA, whose thousandths of it wrap negative. It is bounded as every
// answer is.
func TestHeldDemandKEDACannotCarryIsAnError(t *testing.T) {
	for _, pods := range [][]podSpec{nil, {{name: "c", state: "starting"}}} {
		for _, held := range []float64{1e16, math.Inf(1)} {
			f := newFixture(t)
			router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
			f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router}, false)
			if pods != nil {
				f.scenario(pods...)
			}
			r := store.Report{UID: router.UID}
			r.TimeMs = f.clock.Now().UnixMilli()
			r.Values.Set(metric.PendingRequests, held)
			f.store.Add([]store.Report{r})
			tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10, ValueType: "total", Aggregation: "avg", Window: 10 * time.Second,
				StaleAfter: 5 * time.Second, MissingPods: "auto"}
			d, err := f.server.Evaluate(tr)
			if status.Code(err) != codes.Internal {
				t.Errorf("%d pods, %g held: %+v, %v; want Internal", len(pods), held, d, err)
			}
		}
	}
}

// TestAGaugeNotForwardedYetDuringTheWarmUpIsNoRefusal: during the warm-up
// the pods held may be only those of agents that do not forward a gauge
// (agents of two --extra-metric lists, in a rollout or two node pools'
// DaemonSets), and a trigger on it was refused (InvalidArgument, counted
// and logged as the ScaledObject's fault, its stream ended) where every
// other answer is the warm-up's Unavailable. It passes until the gate
// opens; then, if no agent forwards it, it is refused.
func TestAGaugeNotForwardedYetDuringTheWarmUpIsNoRefusal(t *testing.T) {
	f := newFixture(t)
	var warm atomic.Bool
	f.server.gate = func() error {
		if warm.Load() {
			return nil
		}
		return fmt.Errorf("aggregator warming up")
	}
	f.pods("a") // an agent forwarding no gauge
	md := map[string]string{"workspace": "llama", "metricName": "my_gauge", "threshold": "1"}
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
		t.Fatalf("GetMetricSpec during the warm-up: %v, want the spec", err)
	}
	if _, err := f.metric(t, md); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetMetrics during the warm-up: %v, want Unavailable", err)
	}
	warm.Store(true)
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--extra-metric") {
		t.Fatalf("GetMetricSpec once warm: %v, want it refused as not forwarded", err)
	}
}

// TestARefusalListsAFewForwardedNames: a trigger on a gauge no agent
// forwards is refused naming what the agents forward, every node's (32
// names each), in KEDA's events and the HPA's conditions for the
// trigger's tenant: the whole list, 15 KB from one node's agent. It names
// the first 8 now, and how many more.
func TestARefusalListsAFewForwardedNames(t *testing.T) {
	f := newFixture(t)
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("vllm:gauge_%02d_%s", i, strings.Repeat("x", 500)))
	}
	f.store.Upsert(store.Source{Node: "other-node", ExtraNames: names},
		[]store.PodInfo{{UID: "o1", Namespace: "other", Name: "p", Ready: true, Workloads: []store.Key{{Namespace: "other", Kind: store.KindWorkspace, Name: "w"}}}}, true)
	md := map[string]string{"workspace": "llama", "metricName": "my_gauge", "threshold": "5"}
	_, err := f.client.GetMetricSpec(context.Background(), ref(md))
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "and 12 more") || !strings.Contains(msg, "vllm:gauge_07_") || strings.Contains(msg, "vllm:gauge_08_") || len(msg) > 1024 {
		t.Fatalf("refusal (%d bytes): %v; want InvalidArgument naming 8 names cut short and 12 more, within 1 KiB", len(msg), err)
	}
}

// TestTotalAndAverageAskForTheSame: with valueType average (metricType
// Value) the HPA multiplies the value by every pod Running and Ready
// (replica_calculator.go, getReadyPodsCount): failing pods, idle ones and
// those draining in their grace period too. Whatever the pods, it asks for
// the replicas total asks for: a failing pod under max (counted 0, out of
// total's count) and idle pods (left out of total's count) had been in its
// product all the same (3 replicas against 5, and 3 against 9). And a
// draining pod does not lower the activation value of a workload serving.
func TestTotalAndAverageAskForTheSame(t *testing.T) {
	for name, tc := range map[string]struct {
		pods []podSpec
		agg  string
	}{
		"max, one failing":    {[]podSpec{{"a", "ready", 12, false}, {"b", "ready", 15, false}, {"c", "silent", 0, false}}, "max"},
		"max, three failing":  {[]podSpec{{"a", "ready", 12, false}, {"b", "silent", 0, false}, {"c", "silent", 0, false}, {"d", "silent", 0, false}}, "max"},
		"avg, one failing":    {[]podSpec{{"a", "ready", 12, false}, {"b", "ready", 15, false}, {"c", "silent", 0, false}}, "avg"},
		"avg, down, draining": {[]podSpec{{"a", "ready", 6, false}, {"b", "ready", 8, false}, {"c", "draining", 0, false}}, "avg"},
		"max, up, draining":   {[]podSpec{{"a", "ready", 14, false}, {"b", "ready", 14, false}, {"c", "draining", 0, false}}, "max"},
	} {
		t.Run(name, func(t *testing.T) {
			k8sReady := 0
			for _, p := range tc.pods {
				if p.state == "ready" || p.state == "silent" || p.state == "draining" {
					k8sReady++
				}
			}
			want := -1
			for _, vt := range []string{"total", "average"} {
				f := newFixture(t)
				f.scenario(tc.pods...)
				v, err := f.metric(t, map[string]string{"workspace": "llama", "window": "1s", "threshold": "10", "aggregation": tc.agg, "valueType": vt})
				if err != nil {
					t.Fatal(err)
				}
				got := hpaDesired(v, 10, vt, k8sReady)
				if want < 0 {
					want = got
				} else if got != want {
					t.Fatalf("valueType average: the HPA asks for %d (value %v × %d Ready), total for %d", got, v, k8sReady, want)
				}
			}
		})
	}
	t.Run("idle pods", func(t *testing.T) {
		want := -1
		for _, vt := range []string{"total", "average"} {
			f := newFixture(t)
			f.pods("a", "b", "c")
			f.reportTTFT(map[string][3]float64{"a": {3, 1, 0}, "b": {5, 50, 0}, "c": {5, 50, 0}})
			f.reportTTFT(map[string][3]float64{"a": {6, 2, 0}, "b": {5, 50, 0}, "c": {5, 50, 0}})
			v, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "ttftSeconds", "threshold": "1", "aggregation": "max", "valueType": vt})
			if err != nil {
				t.Fatal(err)
			}
			got := hpaDesired(v, 1, vt, 3)
			if want < 0 {
				want = got
			} else if got != want {
				t.Fatalf("one pod at 3 s beside two idle, valueType average: the HPA asks for %d (value %v × 3 Ready), total for %d", got, v, want)
			}
		}
	})
	t.Run("activation beside a draining pod", func(t *testing.T) {
		for _, vt := range []string{"total", "average"} {
			f := newFixture(t)
			f.scenario(podSpec{"a", "ready", 8, false}, podSpec{"b", "draining", 0, false})
			md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10", "activationThreshold": "5", "valueType": vt}
			active, err := f.client.IsActive(context.Background(), ref(md))
			if err != nil || !active.Result {
				t.Fatalf("valueType %s: one pod at 8 waiting (activation 5) beside one draining: active %v, %v; want active", vt, active.GetResult(), err)
			}
		}
	})
}

// TestActivationIsTheSameWhateverTheValueType: activation with valueType
// average was checked against a value divided by pods that serve nothing:
// 20 requests held at the router beside two pods draining (no pod serves)
// read 10 over them, below an activation of 15, so that the workload was
// inactive until they were gone; one pod at 8 waiting beside one failing,
// left out under missingPods ignore, read 4, below an activation of 5.
// Either is active, as with total.
func TestActivationIsTheSameWhateverTheValueType(t *testing.T) {
	for _, vt := range []string{"total", "average"} {
		f := newFixture(t)
		router := store.PodInfo{UID: store.DemandUID("uid-epp", "llama"), Namespace: "demo", Name: "epp-0", Ready: true, Demand: true, Workloads: []store.Key{llama}}
		f.store.Upsert(store.Source{Node: "node-router"}, []store.PodInfo{router}, false)
		f.scenario(podSpec{name: "a", state: "draining"}, podSpec{name: "b", state: "draining"})
		r := store.Report{UID: router.UID}
		r.TimeMs = f.clock.Now().UnixMilli()
		r.Values.Set(metric.PendingRequests, 20)
		f.store.Add([]store.Report{r})
		md := map[string]string{"workspace": "llama", "threshold": "10", "activationThreshold": "15", "valueType": vt}
		if resp, err := f.client.IsActive(context.Background(), ref(md)); err != nil || !resp.Result {
			t.Errorf("valueType %s, 20 held beside two pods draining: active %v, %v; want active", vt, resp.GetResult(), err)
		}
	}
	for _, vt := range []string{"total", "average"} {
		f := newFixture(t)
		f.scenario(podSpec{"a", "ready", 8, false}, podSpec{"c", "silent", 0, false})
		md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10", "activationThreshold": "5", "valueType": vt, "missingPods": "ignore"}
		if resp, err := f.client.IsActive(context.Background(), ref(md)); err != nil || !resp.Result {
			t.Errorf("valueType %s, one pod at 8 beside one failing, ignored: active %v, %v; want active", vt, resp.GetResult(), err)
		}
	}
}
