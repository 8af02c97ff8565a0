package integration

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/store"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
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

// TestAutoReachesAnOlderAggregatorOverGRPCAndAnUpgradedOneFramed: the
// agent's default transport (auto) reports to an ingest port that serves
// gRPC alone (an aggregator of a version before the framed transport: the
// ingest handler on a gRPC server of its own), and, once an aggregator of
// this version replaces it on the same address, reconnects to it framed.
func TestAutoReachesAnOlderAggregatorOverGRPCAndAnUpgradedOneFramed(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	st := store.New(store.Options{Expiry: time.Minute})
	old := grpc.NewServer(grpc.ForceServerCodecV2(ingest.Codec()))
	pulsev1.RegisterIngestServer(old, ingest.New(st, ingest.Options{Log: quietLog(), Version: "older"}))
	go func() { _ = old.Serve(ln) }()
	defer old.Stop()

	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	if o.Transport != agent.TransportAuto {
		t.Fatalf("the agent's default transport is %q; want auto", o.Transport)
	}
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{addr}, "node-0", gpu.ModeOff
	runAgent(t, o, agent.Deps{}, nil)
	setLoad(pods[0], 7, 3, 0.5)
	eventually(t, "the pod on the older aggregator", func() error {
		if n := st.Pods(); n != 1 {
			return fmt.Errorf("%d pods in its store; want 1", n)
		}
		return nil
	})

	old.Stop()
	agg, _ := startAggregator(t, addr)
	eventually(t, "the pod on the upgraded aggregator", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		return matches(w, want{"llama-0": {"waiting": 7, "running": 3, "kvCacheUsage": 0.5}}, nil)
	})
	if err := testutil.GatherAndCompare(servedMetrics(t, "http://"+agg.HTTPAddr()+"/metrics"), strings.NewReader(`
# HELP pulse_aggregator_ingest_connections_total Connections the ingest port served, by transport (grpc, framed: the agents' --transport).
# TYPE pulse_aggregator_ingest_connections_total counter
pulse_aggregator_ingest_connections_total{transport="framed"} 1
pulse_aggregator_ingest_connections_total{transport="grpc"} 0
`), "pulse_aggregator_ingest_connections_total"); err != nil {
		t.Error(err)
	}
}
