package planner_test

import (
	"testing"
	"time"

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
