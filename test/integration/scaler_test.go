package integration

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// kedaGetMetrics is a client of the scaler port and KEDA's GetMetrics call
// for the ScaledObject demo/llama with the given metadata.
func kedaGetMetrics(t *testing.T, addr string) (*grpc.ClientConn, func(md map[string]string) (float64, error)) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	keda := externalscaler.NewExternalScalerClient(conn)
	return conn, func(md map[string]string) (float64, error) {
		resp, err := keda.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{
			ScaledObjectRef: &externalscaler.ScaledObjectRef{Name: "llama", Namespace: "demo", ScalerMetadata: md}, MetricName: "x"})
		if err != nil {
			return 0, err
		}
		return resp.MetricValues[0].MetricValueFloat, nil
	}
}

// TestKEDASeesWhatThePodsServe runs simulated pods, an agent and an
// aggregator, and asks the aggregator's scaler port what KEDA would ask.
func TestKEDASeesWhatThePodsServe(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"}, {name: "llama-2", workload: "llama"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr(), "process_open_fds:max")
	setLoad(pods[0], 12, 1, 0.5)
	setLoad(pods[1], 9, 1, 0.5)
	setLoad(pods[2], 15, 1, 0.5)

	conn, get := kedaGetMetrics(t, agg.ScalerAddr())
	eventually(t, "HPA total", func() error {
		v, err := get(map[string]string{"workspace": "llama", "window": "1s"})
		if err != nil {
			return err
		}
		if v != 36 {
			return fmt.Errorf("total = %v, want 36", v)
		}
		return nil
	})
	// A gauge forwarded with --extra-metric scales like any other.
	eventually(t, "forwarded gauge", func() error {
		v, err := get(map[string]string{"workspace": "llama", "metricName": "process_open_fds", "valueType": "average", "threshold": "100"})
		if err != nil {
			return err
		}
		if v != 76 {
			return fmt.Errorf("process_open_fds = %v, want 76", v)
		}
		return nil
	})
	// The scaler port answers gRPC health, for native grpc: probes.
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}
}

func TestRatesSurviveARestartedVLLM(t *testing.T) {
	sim := vllmsim.New(vllmsim.Options{})
	pods := startSims(t, []simPod{{name: "p-0", workload: "w", sim: sim}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr())
	// A sample from before the requests complete: rates are increases.
	eventually(t, "first sample", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err == nil && w.Pods[0].AgeSeconds == nil {
			err = fmt.Errorf("no sample yet")
		}
		return err
	})
	sim.Complete(50, 1)
	eventually(t, "requests counted", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err != nil {
			return err
		}
		if w.Pods[0].Values["e2eLatencySeconds"] != 1 {
			return fmt.Errorf("e2eLatencySeconds = %v", w.Pods[0].Values["e2eLatencySeconds"])
		}
		return nil
	})
	sim.Restart() // every counter back to zero
	sim.Complete(2, 3)
	eventually(t, "after the restart", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err != nil {
			return err
		}
		p := w.Pods[0]
		if p.Values["requestsPerSecond"] < 0 || p.Values["e2eLatencySeconds"] != 3 {
			return fmt.Errorf("requestsPerSecond %v e2eLatencySeconds %v: want no negative rate and the new requests' mean 3",
				p.Values["requestsPerSecond"], p.Values["e2eLatencySeconds"])
		}
		return nil
	})
}

func TestSelfMetricsAreValid(t *testing.T) {
	pods := startSims(t, []simPod{{name: "p-0", workload: "w"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	ag := startAgent(t, pods, agg.IngestAddr())
	eventually(t, "pod reported", func() error { _, err := workload(agg.HTTPAddr(), "w"); return err })
	eventually(t, "agent listening", func() error {
		if ag.HTTPAddr() == "" {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	for _, url := range []string{"http://" + agg.HTTPAddr() + "/metrics", "http://" + ag.HTTPAddr() + "/metrics"} {
		served := servedMetrics(t, url)
		problems, err := testutil.GatherAndLint(served)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", url, p.Metric, p.Text)
		}
		// The Go runtime's and the process's own metrics, as every
		// Kubernetes component exports them.
		if n, err := testutil.GatherAndCount(served, "go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"); err != nil || n != 4 {
			t.Errorf("%s: Go and process metrics: %d series (%v), want 4", url, n, err)
		}
	}
	for _, url := range []string{"http://" + agg.HTTPAddr(), "http://" + ag.HTTPAddr()} {
		for _, path := range []string{"/livez", "/readyz"} {
			resp, err := http.Get(url + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s%s: %s", url, path, resp.Status)
			}
		}
	}
	// The agent's own metrics say what it did.
	resp, err := http.Get("http://" + ag.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"pulse_agent_targets 1", "pulse_agent_scrape_duration_seconds_count", `pulse_agent_aggregator_connected{aggregator="` + agg.IngestAddr() + `"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("agent metrics lack %q", want)
		}
	}
}

// servedMetrics is the page an HTTP /metrics endpoint serves, as a Gatherer
// for client_golang's testutil: what is linted is what a scraper reads.
func servedMetrics(t *testing.T, url string) prometheus.Gatherer {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	mfs := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		mfs = append(mfs, mf)
	}
	// In name order, as a registry gathers them (testutil compares in order).
	sort.Slice(mfs, func(i, j int) bool { return mfs[i].GetName() < mfs[j].GetName() })
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return mfs, nil })
}

// TestScalerCallsAreCounted: the scaler port counts KEDA's calls by method
// and code, and times the unary ones (grpc_server_handled_total and
// grpc_server_handling_seconds, as gRPC's Prometheus middleware names
// them): a call answered and a call refused each under its own code; every
// method's series from the start; none of the agents' stream.
func TestScalerCallsAreCounted(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startAgent(t, pods, agg.IngestAddr())
	_, get := kedaGetMetrics(t, agg.ScalerAddr())
	eventually(t, "GetMetrics answered", func() error {
		_, err := get(map[string]string{"workspace": "llama", "window": "1s"})
		return err
	})
	if _, err := get(map[string]string{"workspace": "llama", "metric": "no-such-metric"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown metric: %v, want InvalidArgument", err)
	}
	served := servedMetrics(t, "http://"+agg.HTTPAddr()+"/metrics")
	mfs, err := served.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{} // method/code and method/handled (handled), method (timed)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if strings.HasPrefix(mf.GetName(), "grpc_server_") && l["grpc_service"] != "externalscaler.ExternalScaler" && l["grpc_service"] != "grpc.health.v1.Health" {
				t.Errorf("%s{grpc_service=%q}: only the scaler port's calls are counted", mf.GetName(), l["grpc_service"])
			}
			switch mf.GetName() {
			case "grpc_server_started_total":
				counts[l["grpc_method"]+"/started"] += m.GetCounter().GetValue()
				counts["series/"+l["grpc_method"]]++
			case "grpc_server_handled_total":
				counts[l["grpc_method"]+"/"+l["grpc_code"]] += m.GetCounter().GetValue()
				counts[l["grpc_method"]+"/handled"] += m.GetCounter().GetValue()
			case "grpc_server_handling_seconds":
				counts[l["grpc_method"]] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if counts["GetMetrics/OK"] < 1 || counts["GetMetrics/InvalidArgument"] != 1 {
		t.Errorf("grpc_server_handled_total: GetMetrics OK %v, InvalidArgument %v; want at least 1 and 1",
			counts["GetMetrics/OK"], counts["GetMetrics/InvalidArgument"])
	}
	if counts["GetMetrics"] != counts["GetMetrics/handled"] {
		t.Errorf("grpc_server_handling_seconds: %v GetMetrics timed, want %v (every call handled)", counts["GetMetrics"], counts["GetMetrics/handled"])
	}
	// Every method's series is there from the start, at 0 until called.
	if counts["series/IsActive"] != 1 || counts["IsActive/started"] != 0 || counts["series/StreamIsActive"] != 1 {
		t.Errorf("grpc_server_started_total: IsActive %v series at %v, StreamIsActive %v series; want each method's at 0",
			counts["series/IsActive"], counts["IsActive/started"], counts["series/StreamIsActive"])
	}
	if problems, err := testutil.GatherAndLint(served, "grpc_server_handled_total", "grpc_server_handling_seconds"); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestLatencyQuantilesOfTheWorkload: an agent with --forward-histograms
// carries vLLM's TTFT buckets to the aggregator, and ttftP90Seconds is the
// quantile of the workload's requests (both pods' bucket increases merged),
// interpolated as histogram_quantile does; a mean of the pods' own p90s
// would be about 2.4 s.
func TestLatencyQuantilesOfTheWorkload(t *testing.T) {
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{agg.IngestAddr()}, "node-1", gpu.ModeOff
	o.ForwardHistograms = true
	runAgent(t, o, agent.Deps{}, nil)
	setLoad(pods[0], 0, 1, 0.5)
	setLoad(pods[1], 0, 1, 0.5)

	_, getMD := kedaGetMetrics(t, agg.ScalerAddr())
	get := func(name string) (float64, error) {
		return getMD(map[string]string{"workspace": "llama", "metric": name, "threshold": "1", "valueType": "average", "window": "1m"})
	}
	// Both pods report histograms (no request yet: nothing finished while
	// one runs, so the quantile is undefined, not 0).
	eventually(t, "histograms forwarded", func() error {
		_, err := get("ttftP90Seconds")
		if err == nil || !strings.Contains(err.Error(), "not defined on any reporting pod") {
			return fmt.Errorf("want undefined before any request, got %v", err)
		}
		return nil
	})
	// 90 fast requests (TTFT 0.03 s, in vLLM's (0.02, 0.04] bucket) on one
	// pod, 10 slow ones (TTFT 3 s, in (2.5, 5]) on the other.
	pods[0].sim.Complete(90, 0.045)
	pods[1].sim.Complete(10, 4.5)
	for name, want := range map[string]float64{"ttftP90Seconds": 0.04, "ttftP50Seconds": 0.02 + 0.02*50/90, "ttftP99Seconds": 2.5 + 2.5*9.0/10} {
		eventually(t, name, func() error {
			v, err := get(name)
			if err != nil {
				return err
			}
			if math.Abs(v-want) > 1e-9 {
				return fmt.Errorf("%s = %v, want %v", name, v, want)
			}
			return nil
		})
	}
}
