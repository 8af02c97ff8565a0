package sim

import (
	"os"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

// BenchmarkHourFiftyReplicas: the shipped hour of Azure traffic at 250 times
// its rate (4.8 M requests, about 1,400 per second at the peak) against up
// to 50 Llama-3.1-8B replicas, every pipeline: one op is the whole
// simulation (docs/performance.md).
func BenchmarkHourFiftyReplicas(b *testing.B) {
	reqs, err := trace.Load("trace/testdata/azure-llm-2023-conv.csv", 1)
	if err != nil {
		b.Fatal(err)
	}
	reqs = trace.Densify(reqs, 250, 1)
	raw, err := os.ReadFile("testdata/baseline-scaledobject.yaml")
	if err != nil {
		b.Fatal(err)
	}
	// Up to 50 replicas, 10 pods per period each way.
	y := strings.Replace(strings.ReplaceAll(string(raw), "value: 1\n", "value: 10\n"), "maxReplicaCount: 10", "maxReplicaCount: 50", 1)
	so, err := ParseScaledObject([]byte(y))
	if err != nil {
		b.Fatal(err)
	}
	p, _ := replica.Load("llama-3.1-8b-h100")
	b.ResetTimer()
	for range b.N {
		r, err := Run(Config{Trace: reqs, ScaledObject: so, Profile: p, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		most := 0
		for _, pr := range r.Pipelines {
			most = max(most, pr.MaxReplicas)
		}
		b.ReportMetric(float64(len(reqs)), "requests")
		b.ReportMetric(float64(most), "max-replicas")
	}
}
