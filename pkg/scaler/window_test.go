package scaler

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// counters serves pod "a" n seconds at rate tokens a second, one request
// every 1000 tokens, each queued queue seconds (the counters accumulate).
type counters struct{ tokens, reqs, queued float64 }

func (c *counters) serve(f *fixture, n int, rate, queue float64) {
	for range n {
		f.ms += 1000
		f.clock.Add(time.Second)
		c.tokens += rate
		c.reqs += rate / 1000
		c.queued += queue * rate / 1000
		r := store.Report{UID: "uid-a"}
		r.TimeMs = f.ms
		r.Values.Set(metric.PromptTokens, c.tokens)
		r.Values.Set(metric.TTFTCount, c.reqs)
		r.Values.Set(metric.TTFTSum, c.queued+0.1*c.reqs)
		r.Values.Set(metric.QueueTimeCount, c.reqs)
		r.Values.Set(metric.QueueTimeSum, c.queued)
		r.Values.Set(metric.Waiting, 0)
		r.Values.Set(metric.Running, 4)
		r.Values.Set(metric.KVCacheUsage, 0.1)
		f.store.Add([]store.Report{r})
	}
}

// TestAnotherScaledObjectsWindowIsNotThisOnesPlan: two ScaledObjects of
// one namespace plan workspace llama at the same SLO, one over the
// default 30 s window (it scales llama), one over 10 s (another target,
// a router say). Their states are one (planKey has no window): the 10 s
// trigger's observations — a 10 s window's noise, which DefaultPlanWindow
// exists to keep out of the peaks held — are held in the 30 s trigger's
// plan, and llama is scaled on them.
func TestAnotherScaledObjectsWindowIsNotThisOnesPlan(t *testing.T) {
	answer := func(withOther bool) float64 {
		f := newFixture(t)
		f.pods("a")
		var c counters
		llamaSO := ref(replicasMD())
		other := &externalscaler.ScaledObjectRef{Name: "router-so", Namespace: "demo", ScalerMetadata: replicasMD("window", "10s")}
		ask := func(r *externalscaler.ScaledObjectRef) float64 {
			resp, err := f.client.GetMetrics(t.Context(), &externalscaler.GetMetricsRequest{ScaledObjectRef: r})
			if err != nil {
				t.Fatal(err)
			}
			return resp.MetricValues[0].MetricValueFloat
		}
		// Learn a capacity of 10000/s (a break), then past the restart's
		// hold at 2000/s, each trigger asked every 5 s.
		c.serve(f, 40, 10000, 1)
		for range 12 * 10 {
			c.serve(f, 5, 2000, 0.01)
			ask(llamaSO)
			if withOther {
				ask(other)
			}
		}
		// A 10 s burst: the 30 s window averages it, the 10 s one does not.
		c.serve(f, 10, 14000, 1)
		if withOther {
			ask(other) // observes first
		}
		c.serve(f, 1, 2000, 0.01)
		return ask(llamaSO)
	}
	alone, shared := answer(false), answer(true)
	if shared != alone {
		t.Fatalf("llama's ScaledObject was answered %v replicas, and %v with another ScaledObject of its namespace planning llama over a 10 s window: another ScaledObject's window moved this one's plan", alone, shared)
	}
}

// TestTheWindowsFollowedAreBounded: a caller naming a new window each call
// (any duration is a valid window, to the nanosecond) holds a bounded set
// of followed windows, each at least what was asked for and less than
// 3.1 % more (the store keeps what any trigger reads). The windows were keyed
// as asked: 200,000 calls held 200,000 windows for 5 minutes, walked under
// the lock every evaluation takes.
func TestTheWindowsFollowedAreBounded(t *testing.T) {
	st := store.New(store.Options{})
	s := New(st, Options{MaxWindow: time.Minute, FollowWindows: true})
	for i := range 20_000 {
		ref := &externalscaler.ScaledObjectRef{Name: "so", Namespace: "demo", ScalerMetadata: map[string]string{
			"workspace": "nope", "window": fmt.Sprintf("%dus", 1_000_000+3*i)}}
		_, _ = s.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref})
	}
	s.windows.mu.Lock()
	n := len(s.windows.seen)
	s.windows.mu.Unlock()
	if n > 64 {
		t.Errorf("%d windows followed after 20,000 calls naming windows from 1s to 1.06s, want a few", n)
	}
	for _, d := range []time.Duration{time.Second, 1500 * time.Millisecond, 30 * time.Second, 45*time.Second + 1, time.Minute, 59*time.Second + 999*time.Millisecond, 66*time.Second + 1, 94245600 * time.Microsecond, 514*time.Second + 1, time.Hour + 1} {
		k := windowKey(d, 10*time.Minute)
		if k < d || float64(k) > 1.03125*float64(max(d, 32*time.Second)) {
			t.Errorf("window %v followed as %v: want at least it, and under a 32nd more (a second to 32s)", d, k)
		}
		if k := windowKey(d, time.Minute); k < d || (d <= time.Minute && k > time.Minute) {
			t.Errorf("window %v followed as %v with --max-window 1m: want at least it, and at most the minute (or it past that)", d, k)
		}
	}
	if k := windowKey(math.MaxInt64, 0); k != math.MaxInt64 {
		t.Errorf("the longest duration followed as %v", k)
	}
}
