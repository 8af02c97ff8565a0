package planner_test

import (
	"os"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// TestPlansFromRealPages plans one replica from the pages of a simulated
// vLLM server (a queueing model: 4 requests at a time, each served at 1 a
// second), read by pulse's own extractor into pulse's store, scraped each
// second: at 2 requests a second the plan stays small; after a step to 10
// (2.5 times what one replica serves) it asks for at least 3. Twenty seeds:
// a queue time of a handful of requests once taught a capacity of almost
// nothing, and a plan of thousands.
func TestPlansFromRealPages(t *testing.T) {
	for seed := range uint64(20) {
		now := time.Unix(1_700_000_000, 0)
		st := store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
		k := store.Key{Namespace: "demo", Kind: store.KindInferenceSet, Name: "llama"}
		st.Upsert(store.Source{Node: "n", Instance: "agent"}, []store.PodInfo{{UID: "u", Namespace: "demo", Name: "llama-0", Ready: true, Workloads: []store.Key{k}}}, false)
		sim := vllmsim.New(vllmsim.Options{Seed: seed})
		model := vllmsim.QueueModel{ArrivalRate: 2, BatchCapacity: 4, ServiceRate: 1}
		sim.SetModel(model)
		ex, err := vllm.NewExtractor(nil)
		if err != nil {
			t.Fatal(err)
		}
		counters := vllm.NewCounters()
		var ps planner.State
		light, last := 0, 0
		for s := range 300 {
			if s == 150 {
				model.ArrivalRate = 10
				sim.SetModel(model)
			}
			for range 10 {
				sim.Step(0.1)
			}
			now = now.Add(time.Second)
			page, err := ex.ExtractWith(sim.Page(false), counters)
			if err != nil {
				t.Fatal(err)
			}
			r := store.Report{UID: "u", Sample: store.Sample{TimeMs: now.UnixMilli(), Values: page.Values}}
			st.Add([]store.Report{r})
			var p planner.Plan
			if p, ps, err = planner.Make(st.Snapshot(nil, k, 30*time.Second, 5*time.Second, 0), ps, planner.Default(0)); err != nil {
				t.Fatal(err)
			}
			if s < 150 {
				light = max(light, p.Replicas)
			}
			last = p.Replicas
		}
		if light > 4 || last < 3 || last > 10 {
			t.Errorf("seed %d: at most %d replicas at 2 requests a second (want at most 4), %d after the step to 10 (want 3 to 10)", seed, light, last)
		}
	}
}

// TestATGIPageTeachesCapacity: TGI's page (a real one, read by pulse's own
// extractor) has a queue-time histogram but no TTFT histogram. The requests
// that left its queue are its first tokens' evidence: without them no
// window was ever evidence, and a TGI workload stayed on the fallback (the
// ready replicas while it served, more only on a queue) for ever.
func TestATGIPageTeachesCapacity(t *testing.T) {
	ex, err := vllm.NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../vllm/testdata/DataDog-integrations-core__tgi-PARTIAL.txt")
	if err != nil {
		t.Fatal(err)
	}
	page, err := ex.Extract(b)
	if err != nil {
		t.Fatal(err)
	}
	if page.Has(metric.TTFTCount) || !page.Has(metric.QueueTimeCount) || !page.Has(metric.PromptTokens) {
		t.Fatalf("the TGI page maps TTFT count %v, queue-time count %v, prompt tokens %v; this test is of a page with the last two only",
			page.Has(metric.TTFTCount), page.Has(metric.QueueTimeCount), page.Has(metric.PromptTokens))
	}
	now := time.Unix(1_700_000_000, 0)
	st := store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
	k := store.Key{Namespace: "demo", Kind: store.KindInferenceSet, Name: "tgi"}
	st.Upsert(store.Source{Node: "n", Instance: "agent"}, []store.PodInfo{{UID: "u", Namespace: "demo", Name: "tgi-0", Ready: true, Workloads: []store.Key{k}}}, false)
	// The page's counters advanced as a replica serving 4 requests a
	// second (2,000 prompt and 200 generated tokens a second, 10 ms in the
	// queue each) would advance them; its gauges as they are.
	add := func(v *metric.Values, id metric.ID, by float64) {
		x, _ := v.Get(id)
		v.Set(id, x+by)
	}
	var ps planner.State
	var p planner.Plan
	for s := range 120 {
		now = now.Add(time.Second)
		v := page.Values
		add(&v, metric.PromptTokens, 2000*float64(s))
		add(&v, metric.GenerationTokens, 200*float64(s))
		add(&v, metric.QueueTimeCount, 4*float64(s))
		add(&v, metric.QueueTimeSum, 0.04*float64(s))
		st.Add([]store.Report{{UID: "u", Sample: store.Sample{TimeMs: now.UnixMilli(), Values: v}}})
		if p, ps, err = planner.Make(st.Snapshot(nil, k, 30*time.Second, 5*time.Second, 0), ps, planner.Default(0)); err != nil {
			t.Fatal(err)
		}
	}
	// Work 2,000 + 4 × 200 = 2,800 a second, proven within the SLO.
	if p.Observations == 0 || p.Capacity < 2800*0.99 || p.WorkPerRequest <= 0 {
		t.Fatalf("after 2 minutes of TGI pages: %d observations, capacity %.0f, work a request %.0f; want the 2,800 a second served proven (%s)",
			p.Observations, p.Capacity, p.WorkPerRequest, p.Reason)
	}
}
