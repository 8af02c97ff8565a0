package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/router"
)

// startRouterAgent runs a static-mode agent for the simulated pods and a
// router whose annotations make it a demand source.
func startRouterAgent(t *testing.T, pods []simPod, routerURL string, annotations map[string]string, ingestAddr string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) == 0 {
		body = []byte("targets:\n")
	}
	body = append(body, fmt.Sprintf("- namespace: demo\n  pod: router-0\n  url: %s/metrics\n  annotations:\n", routerURL)...)
	for k, v := range annotations {
		body = append(body, fmt.Sprintf("    %s: %q\n", k, v)...)
	}
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{ingestAddr}, "node-1", gpu.ModeOff
	runAgent(t, o, agent.Deps{}, nil)
}

// send posts one completion request for model to the router, in the
// background; the request is held until the router has a backend.
func send(t *testing.T, url, model string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader([]byte(`{"model":"`+model+`"}`)))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
}

func wantValue(get func(map[string]string) (float64, error), md map[string]string, want float64) func() error {
	return func() error {
		v, err := get(md)
		if err != nil {
			return err
		}
		if v != want {
			return fmt.Errorf("value %v, want %v", v, want)
		}
		return nil
	}
}

// TestHeldRequestsActivateAWorkloadAtZero: an endpoint picker holds requests
// for a model with no replica; the agent reports them as the workload's
// pendingRequests, and KEDA's push stream turns active with no pod of the
// workload anywhere. llm-d's endpoint picker reports the same gauge under
// two names: it is counted once.
func TestHeldRequestsActivateAWorkloadAtZero(t *testing.T) {
	rt := router.New(router.Options{LLMD: true})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startRouterAgent(t, nil, srv.URL, map[string]string{
		"pulse.io/demand-source": "epp", "pulse.io/demand-workloads": "mistral=mistralai/Mistral-7B",
	}, agg.IngestAddr())
	conn, get := kedaGetMetrics(t, agg.ScalerAddr())
	md := map[string]string{"workspace": "mistral", "activationThreshold": "0"}
	// With nothing held the workload's value is 0, not an error.
	eventually(t, "router reports", wantValue(get, md, 0))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := externalscaler.NewExternalScalerClient(conn).StreamIsActive(ctx,
		&externalscaler.ScaledObjectRef{Name: "mistral", Namespace: "demo", ScalerMetadata: md})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.Result {
		t.Fatalf("first push %v, %v; want inactive", first, err)
	}
	send(t, srv.URL, "mistralai/Mistral-7B")
	send(t, srv.URL, "mistralai/Mistral-7B")
	send(t, srv.URL, "other-model")
	pushed := make(chan error, 1)
	go func() {
		r, err := stream.Recv()
		if err == nil && !r.Result {
			err = fmt.Errorf("pushed %v", r.Result)
		}
		pushed <- err
	}()
	select {
	case err := <-pushed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a bound against a hang, not a speed claim
		t.Fatal("no push after requests were held")
	}
	eventually(t, "held requests counted once", wantValue(get, md, 2))
	rt.SetBackend("mistralai/Mistral-7B", true)
	eventually(t, "released", wantValue(get, md, 0))
}

// TestHeldRequestsAddToTheReplicasQueue: with a replica up, requests the
// router still holds are waiting too, and are in no replica's queue.
func TestHeldRequestsAddToTheReplicasQueue(t *testing.T) {
	rt := router.New(router.Options{})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}})
	setLoad(pods[0], 3, 1, 0.5)
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startRouterAgent(t, pods, srv.URL, map[string]string{"pulse.io/demand-source": "epp", "pulse.io/demand-workloads": "llama"}, agg.IngestAddr())
	_, get := kedaGetMetrics(t, agg.ScalerAddr())
	send(t, srv.URL, "llama")
	send(t, srv.URL, "llama")
	eventually(t, "3 waiting + 2 held", wantValue(get, map[string]string{"workspace": "llama", "window": "1s"}, 5))
	eventually(t, "average: held over the ready pods", wantValue(get, map[string]string{"workspace": "llama", "window": "1s", "valueType": "average"}, 5))
	// Other metrics are the replicas' alone.
	eventually(t, "running", wantValue(get, map[string]string{"workspace": "llama", "window": "1s", "metric": "running"}, 1))
}

// TestArrivalsAtARouterThatRefuses: production-stack's router answers 503
// for a model scaled to zero and counts the request; the arrivals over the
// window are the demand of a workload with no ready replica.
func TestArrivalsAtARouterThatRefuses(t *testing.T) {
	rt := router.New(router.Options{ProductionStack: true})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	agg, _ := startAggregator(t, "127.0.0.1:0")
	startRouterAgent(t, nil, srv.URL, map[string]string{"pulse.io/demand-source": "production-stack", "pulse.io/demand-workloads": "phi"}, agg.IngestAddr())
	_, get := kedaGetMetrics(t, agg.ScalerAddr())
	md := map[string]string{"workspace": "phi", "window": "30s"}
	eventually(t, "router reports", wantValue(get, md, 0))
	for range 3 {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", bytes.NewReader([]byte(`{"model":"phi"}`)))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("router answered %s, want 503", resp.Status)
		}
	}
	eventually(t, "three arrivals", wantValue(get, md, 3))
}
