package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/gpu"
)

func kedaClient(t *testing.T, addr string) externalscaler.ExternalScalerClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return externalscaler.NewExternalScalerClient(conn)
}

func getMetric(keda externalscaler.ExternalScalerClient, md map[string]string) (float64, error) {
	resp, err := keda.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{
		ScaledObjectRef: &externalscaler.ScaledObjectRef{Name: "llama-so", Namespace: "demo", ScalerMetadata: md}, MetricName: "x"})
	if err != nil {
		return 0, err
	}
	return resp.MetricValues[0].MetricValueFloat, nil
}

// TestDecisionUnderChurn: a static agent lists two serving pods, one
// starting and one terminating (as the demo can); KEDA's GetMetrics counts
// the serving pods only, and /debug/triggers says why for each pod.
func TestDecisionUnderChurn(t *testing.T) {
	pods := startSims(t, []simPod{
		{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"},
		{name: "llama-2", workload: "llama", state: "ready: false"},
		{name: "llama-3", workload: "llama", state: "terminating: true"},
	})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr())
	setLoad(pods[0], 14, 1, 0.5)
	setLoad(pods[1], 16, 1, 0.5)
	setLoad(pods[2], 50, 1, 0.5) // never scraped: it is starting
	keda := kedaClient(t, agg.ScalerAddr())
	md := map[string]string{"workspace": "llama", "window": "1s", "threshold": "10"}
	eventually(t, "the serving pods' total", func() error {
		v, err := getMetric(keda, md)
		if err != nil || v != 30 {
			return fmt.Errorf("GetMetrics = %v, %v; want 30 (14 + 16, the starting and terminating pods left out)", v, err)
		}
		return nil
	})
	doc, err := triggers(agg.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Triggers) != 1 || *doc.Triggers[0].DesiredReplicas != 3 {
		t.Fatalf("triggers %+v", doc.Triggers)
	}
	got := map[string]string{}
	for _, p := range doc.Triggers[0].Decision.Pods {
		got[p.Name] = p.Use + ":" + p.Why
	}
	want := map[string]string{"llama-0": "counted:", "llama-1": "counted:", "llama-2": "left out:starting", "llama-3": "left out:terminating"}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s: %q, want %q", n, got[n], w)
		}
	}
}

// TestRestartedAggregatorNeverAnswersAPartialTotal: two agents each report
// a pod at 20 waiting. The aggregator is killed and restarted on the same
// address while the second agent cannot reach it yet; until that agent is
// back, every answer is Unavailable — never the partial 20 a restarted
// aggregator used to return — and then the full 40.
func TestRestartedAggregatorNeverAnswersAPartialTotal(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"}})
	setLoad(pods[0], 20, 1, 0.5)
	setLoad(pods[1], 20, 1, 0.5)
	options := func(ingest string) *aggregator.Options {
		o := aggregator.NewOptions()
		o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = ingest, "127.0.0.1:0", "127.0.0.1:0"
		o.Warmup.Duration, o.Warmup.ExpectedAgents = time.Hour, 2
		return o
	}
	agg, stop := startAggregatorWith(t, options("127.0.0.1:0"), aggregator.Deps{})
	ingestAddr := agg.IngestAddr()
	link := newForwarder(t, ingestAddr) // the second agent's way to the aggregator
	for i, addr := range []string{ingestAddr, link.addr()} {
		file := filepath.Join(t.TempDir(), "targets.yaml")
		writeTargets(t, file, pods[i:i+1])
		ao := agent.NewOptions()
		ao.StaticTargets, ao.Aggregators, ao.NodeName, ao.NVML = file, []string{addr}, fmt.Sprintf("node-%d", i), gpu.ModeOff
		runAgent(t, ao, agent.Deps{}, nil)
	}
	md := map[string]string{"workspace": "llama", "window": "1s"}
	eventually(t, "the full total", func() error {
		v, err := getMetric(kedaClient(t, agg.ScalerAddr()), md)
		if err != nil || v != 40 {
			return fmt.Errorf("GetMetrics = %v, %v", v, err)
		}
		return nil
	})

	link.cut()
	stop()
	agg2, _ := startAggregatorWith(t, options(ingestAddr), aggregator.Deps{})
	keda := kedaClient(t, agg2.ScalerAddr())
	eventually(t, "the first agent back", func() error {
		w, err := workload(agg2.HTTPAddr(), "llama")
		if err != nil || len(w.Pods) != 1 || !w.Pods[0].Fresh {
			return fmt.Errorf("%+v %v", w, err)
		}
		return nil
	})
	for range 5 {
		if v, err := getMetric(keda, md); status.Code(err) != codes.Unavailable {
			t.Fatalf("GetMetrics with one of two agents back: %v, %v; want Unavailable, never the partial 20", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	link.heal()
	eventually(t, "every agent back", func() error {
		v, err := getMetric(keda, md)
		switch {
		case status.Code(err) == codes.Unavailable:
			return err
		case err != nil:
			t.Fatalf("GetMetrics: %v", err)
		case v != 40:
			t.Fatalf("GetMetrics answered %v; only Unavailable or the full 40 are right", v)
		}
		return nil
	})
}

// triggers reads /debug/triggers.
func triggers(httpAddr string) (debug.TriggersDocument, error) {
	var doc debug.TriggersDocument
	resp, err := http.Get("http://" + httpAddr + "/debug/triggers")
	if err != nil {
		return doc, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&doc)
	return doc, err
}

// forwarder is a TCP link to target that can be cut (every connection
// closed, new ones refused) and healed.
type forwarder struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); f.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) serve(c net.Conn) {
	f.mu.Lock()
	if f.down {
		f.mu.Unlock()
		c.Close()
		return
	}
	f.mu.Unlock()
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	f.conns = append(f.conns, c, up)
	f.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (f *forwarder) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func (f *forwarder) heal() {
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
}
