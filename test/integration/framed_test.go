package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/gpu"
)

// TestBothTransportsOnOnePort: an agent with --transport=framed and one
// with gRPC report to the same ingest port at once, each its own node's
// pods, exactly; the framed one reconnects to an aggregator restarted on
// the same address, as the gRPC one does; the port counts each transport's
// connections.
func TestBothTransportsOnOnePort(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}, {name: "phi-0", workload: "phi"}})
	agg, stopAgg := startAggregator(t, "127.0.0.1:0")
	ingestAddr := agg.IngestAddr()
	for i, transport := range []string{agent.TransportFramed, agent.TransportGRPC} {
		file := filepath.Join(t.TempDir(), "targets.yaml")
		writeTargets(t, file, pods[i:i+1])
		o := agent.NewOptions()
		o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{ingestAddr}, fmt.Sprintf("node-%d", i), gpu.ModeOff
		o.Transport = transport
		runAgent(t, o, agent.Deps{}, nil)
	}
	setLoad(pods[0], 12, 4, 0.25)
	setLoad(pods[1], 3, 1, 0.5)
	both := func(httpAddr string) func() error {
		return func() error {
			for _, c := range []struct {
				workload, pod string
				want          map[string]float64
			}{{"llama", "llama-0", map[string]float64{"waiting": 12, "running": 4, "kvCacheUsage": 0.25}},
				{"phi", "phi-0", map[string]float64{"waiting": 3, "running": 1, "kvCacheUsage": 0.5}}} {
				w, err := workload(httpAddr, c.workload)
				if err != nil {
					return err
				}
				if err := matches(w, want{c.pod: c.want}, nil); err != nil {
					return fmt.Errorf("%s: %w", c.workload, err)
				}
			}
			return nil
		}
	}
	eventually(t, "both agents' pods", both(agg.HTTPAddr()))
	if err := testutil.GatherAndCompare(servedMetrics(t, "http://"+agg.HTTPAddr()+"/metrics"), strings.NewReader(`
# HELP pulse_aggregator_ingest_connections_total Connections the ingest port served, by transport (grpc, framed: the agents' --transport).
# TYPE pulse_aggregator_ingest_connections_total counter
pulse_aggregator_ingest_connections_total{transport="framed"} 1
pulse_aggregator_ingest_connections_total{transport="grpc"} 1
`), "pulse_aggregator_ingest_connections_total"); err != nil {
		t.Error(err)
	}
	if err := streamsAre(t, agg.HTTPAddr(), 2); err != nil {
		t.Error(err)
	}

	stopAgg()
	agg2, _ := startAggregator(t, ingestAddr)
	setLoad(pods[0], 5, 2, 0.125)
	setLoad(pods[1], 3, 1, 0.5)
	eventually(t, "both agents' pods, after the restart", func() error {
		w, err := workload(agg2.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		if err := matches(w, want{"llama-0": {"waiting": 5, "running": 2, "kvCacheUsage": 0.125}}, nil); err != nil {
			return err
		}
		w, err = workload(agg2.HTTPAddr(), "phi")
		if err != nil {
			return err
		}
		return matches(w, want{"phi-0": {"waiting": 3, "running": 1, "kvCacheUsage": 0.5}}, nil)
	})
}
