// Package integration runs the whole data path over real transports: simulated
// vLLM servers over HTTP, a real agent, a real aggregator over loopback gRPC,
// and the aggregator's debug endpoint over HTTP.
package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/vllmsim"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startAggregator runs an aggregator on loopback until the test ends or stop
// is called.
func startAggregator(t *testing.T, ingestAddr string) (a *aggregator.Aggregator, stop func()) {
	t.Helper()
	o := aggregator.NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = ingestAddr, "127.0.0.1:0", "127.0.0.1:0"
	o.Warmup.Duration = 0 // answer at once: these tests are about the values
	return startAggregatorWith(t, o, aggregator.Deps{})
}

// runAggregator is startAggregator with options and clients.
func runAggregator(t *testing.T, o *aggregator.Options, deps aggregator.Deps) *aggregator.Aggregator {
	t.Helper()
	a, _ := startAggregatorWith(t, o, deps)
	return a
}

func startAggregatorWith(t *testing.T, o *aggregator.Options, deps aggregator.Deps) (a *aggregator.Aggregator, stop func()) {
	t.Helper()
	o.Store.FreshFor = 3 * time.Second
	a, err := aggregator.NewWithDeps(o, quietLog(), deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

type simPod struct {
	name, workload string
	state          string // a static target's extra line: "ready: false", "terminating: true"
	sim            *vllmsim.Server
	url            string
}

func startSims(t *testing.T, specs []simPod) []simPod {
	t.Helper()
	for i := range specs {
		if specs[i].sim == nil {
			specs[i].sim = vllmsim.New(vllmsim.Options{})
		}
		srv := httptest.NewServer(specs[i].sim.Handler())
		t.Cleanup(srv.Close)
		specs[i].url = srv.URL + "/metrics"
	}
	return specs
}

// startAgent runs a static-mode agent (no GPU) for pods.
func startAgent(t *testing.T, pods []simPod, aggregatorAddr string, extra ...string) *agent.Agent {
	t.Helper()
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{aggregatorAddr}, "node-1", gpu.ModeOff
	o.ExtraMetrics = extra
	return runAgent(t, o, agent.Deps{}, nil)
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o600) }

// workload fetches one workload from the debug endpoint.
func workload(httpAddr, name string) (debug.Workload, error) {
	resp, err := http.Get("http://" + httpAddr + "/debug/workloads/demo/" + name)
	if err != nil {
		return debug.Workload{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return debug.Workload{}, fmt.Errorf("HTTP %s", resp.Status)
	}
	var doc debug.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return debug.Workload{}, err
	}
	if len(doc.Workloads) != 1 {
		return debug.Workload{}, fmt.Errorf("%d workloads", len(doc.Workloads))
	}
	return doc.Workloads[0], nil
}

// eventually polls check until it passes; the bound only keeps a broken
// pipeline from hanging the test, it asserts no speed.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

// want is what a workload's pods should show.
type want map[string]map[string]float64 // pod → metric → value

func matches(w debug.Workload, pods want, averages map[string]float64) error {
	if len(w.Pods) != len(pods) {
		return fmt.Errorf("%d pods, want %d", len(w.Pods), len(pods))
	}
	for _, p := range w.Pods {
		if !p.Fresh {
			return fmt.Errorf("pod %s not fresh (missing %q)", p.Name, p.Missing)
		}
		for m, v := range pods[p.Name] {
			if got, ok := p.Values[m]; !ok || got != v {
				return fmt.Errorf("pod %s %s = %v (present %v), want %v", p.Name, m, got, ok, v)
			}
		}
	}
	for m, v := range averages {
		if got := w.Averages[m]; got != v {
			return fmt.Errorf("average %s = %v, want %v", m, got, v)
		}
	}
	return nil
}

func setLoad(p simPod, waiting, running, kv float64) {
	p.sim.SetLoad(vllmsim.Load{Waiting: &waiting, Running: &running, KVCacheUsage: &kv})
}

func TestPipelineReportsExactlyWhatTheSimulatorServes(t *testing.T) {
	pods := startSims(t, []simPod{
		{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"},
		{name: "llama-2", workload: "llama"}, {name: "phi-0", workload: "phi"},
	})
	agg, stopAgg := startAggregator(t, "127.0.0.1:0")
	ingestAddr := agg.IngestAddr()
	startAgent(t, pods, ingestAddr)

	setLoad(pods[0], 12, 4, 0.25)
	setLoad(pods[1], 9, 4, 0.5)
	setLoad(pods[2], 15, 4, 0.75)
	setLoad(pods[3], 2, 1, 0.125)
	eventually(t, "first load", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		return matches(w, want{
			"llama-0": {"waiting": 12, "running": 4, "kvCacheUsage": 0.25},
			"llama-1": {"waiting": 9, "running": 4, "kvCacheUsage": 0.5},
			"llama-2": {"waiting": 15, "running": 4, "kvCacheUsage": 0.75},
		}, map[string]float64{"waiting": 12, "running": 4, "kvCacheUsage": 0.5})
	})
	eventually(t, "phi", func() error {
		w, err := workload(agg.HTTPAddr(), "phi")
		if err != nil {
			return err
		}
		return matches(w, want{"phi-0": {"waiting": 2, "running": 1, "kvCacheUsage": 0.125}}, nil)
	})

	// The load changes: the aggregator follows, exactly.
	setLoad(pods[0], 30, 8, 0.9)
	setLoad(pods[1], 0, 2, 0.1)
	setLoad(pods[2], 3, 5, 0.2)
	eventually(t, "changed load", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		return matches(w, want{
			"llama-0": {"waiting": 30, "running": 8, "kvCacheUsage": 0.9},
			"llama-1": {"waiting": 0, "running": 2, "kvCacheUsage": 0.1},
			"llama-2": {"waiting": 3, "running": 5, "kvCacheUsage": 0.2},
		}, map[string]float64{"waiting": 11, "running": 5})
	})

	// Completed requests move the counters: rates and interval means appear.
	pods[3].sim.Complete(10, 0.6)
	eventually(t, "interval means", func() error {
		w, err := workload(agg.HTTPAddr(), "phi")
		if err != nil {
			return err
		}
		p := w.Pods[0]
		if got := p.Values["e2eLatencySeconds"]; got != 0.6 {
			return fmt.Errorf("e2eLatencySeconds = %v, want 0.6", got)
		}
		if got := p.Values["ttftSeconds"]; got != 0.4 {
			return fmt.Errorf("ttftSeconds = %v, want 0.4", got)
		}
		if p.Values["requestsPerSecond"] <= 0 {
			return fmt.Errorf("requestsPerSecond = %v, want > 0", p.Values["requestsPerSecond"])
		}
		return nil
	})

	// The aggregator dies and comes back on the same address: the same
	// agent, never restarted, feeds the new one.
	stopAgg()
	agg2, _ := startAggregator(t, ingestAddr)
	setLoad(pods[0], 7, 1, 0.3)
	eventually(t, "restarted aggregator", func() error {
		w, err := workload(agg2.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		return matches(w, want{
			"llama-0": {"waiting": 7, "running": 1, "kvCacheUsage": 0.3},
			"llama-1": {"waiting": 0, "running": 2, "kvCacheUsage": 0.1},
			"llama-2": {"waiting": 3, "running": 5, "kvCacheUsage": 0.2},
		}, map[string]float64{"waiting": 10.0 / 3})
	})
}

func TestTwoEngineV1PodIsSummedAndAveraged(t *testing.T) {
	sim := vllmsim.New(vllmsim.Options{Engines: 2})
	pods := startSims(t, []simPod{{name: "dp-0", workload: "dp", sim: sim}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr())
	sim.SetSeries(0, 5, 3, 0.2)
	sim.SetSeries(1, 7, 2, 0.6)
	eventually(t, "two engines", func() error {
		w, err := workload(agg.HTTPAddr(), "dp")
		if err != nil {
			return err
		}
		return matches(w, want{"dp-0": {"waiting": 12, "running": 5, "kvCacheUsage": 0.4}}, nil)
	})
}

func TestHungPodDelaysNoOtherPod(t *testing.T) {
	pods := startSims(t, []simPod{{name: "ok-0", workload: "w"}, {name: "hung-0", workload: "w"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr())
	setLoad(pods[0], 1, 1, 0.1)
	setLoad(pods[1], 1, 1, 0.1)
	eventually(t, "both report", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err != nil {
			return err
		}
		return matches(w, want{"ok-0": {"waiting": 1}, "hung-0": {"waiting": 1}}, nil)
	})

	pods[1].sim.SetHang(time.Hour) // until SetHang(0) below: no race against the hang's end
	defer pods[1].sim.SetHang(0)
	eventually(t, "hung pod shows missing: timeout", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err != nil {
			return err
		}
		for _, p := range w.Pods {
			if p.Name == "hung-0" {
				if p.Missing != "timeout" {
					return fmt.Errorf("hung-0 missing = %q, want timeout", p.Missing)
				}
				return nil
			}
		}
		return errors.New("no hung-0 on the page")
	})
	// While the other pod hangs (it is still missing with reason timeout
	// when each new value is seen), this one's new values keep arriving.
	for i := 2.0; i < 5; i++ {
		setLoad(pods[0], i, 1, 0.1)
		eventually(t, "healthy pod keeps reporting", func() error {
			w, err := workload(agg.HTTPAddr(), "w")
			if err != nil {
				return err
			}
			seen := 0
			for _, p := range w.Pods {
				if p.Name == "ok-0" && (p.Values["waiting"] != i || !p.Fresh) {
					return fmt.Errorf("ok-0 waiting = %v fresh %v, want %v", p.Values["waiting"], p.Fresh, i)
				}
				if p.Name == "hung-0" && p.Missing != "timeout" {
					return fmt.Errorf("hung-0 missing = %q, want timeout while it hangs", p.Missing)
				}
				if p.Name == "ok-0" || p.Name == "hung-0" {
					seen++
				}
			}
			if seen != 2 {
				return fmt.Errorf("%d of ok-0 and hung-0 on the page, want both", seen)
			}
			return nil
		})
	}
	pods[1].sim.SetHang(0)
}
