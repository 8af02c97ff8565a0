package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// TestScrapeCountersCountEachScrapeOnce: three scrapes — one good, one HTTP
// 500, one unparsable page — count one error of each reason, three
// durations and the targets listed; every reason is exported from the
// start, at 0.
func TestScrapeCountersCountEachScrapeOnce(t *testing.T) {
	sim := vllmsim.New(vllmsim.Options{})
	mux := http.NewServeMux()
	mux.Handle("/metrics", sim.Handler())
	mux.HandleFunc("/500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", 500) })
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting{ 3\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	o := NewOptions()
	o.StaticTargets, o.NVML = filepath.Join(t.TempDir(), "targets.yaml"), gpu.ModeOff
	if err := os.WriteFile(o.StaticTargets, []byte("targets: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	targets := []discovery.Target{
		{UID: "u1", Namespace: "ns", Pod: "good", Ready: true, URL: srv.URL + "/metrics"},
		{UID: "u2", Namespace: "ns", Pod: "error", Ready: true, URL: srv.URL + "/500"},
		{UID: "u3", Namespace: "ns", Pod: "garbage", Ready: true, URL: srv.URL + "/garbage"},
	}
	a.SetTargets(targets)
	for _, tg := range targets {
		a.scrapeOne(context.Background(), tg, a.startScrape(tg.UID))
		a.endScrape(tg.UID)
	}
	want := `
# HELP pulse_agent_scrape_errors_total Failed scrapes by reason.
# TYPE pulse_agent_scrape_errors_total counter
pulse_agent_scrape_errors_total{reason="connect"} 0
pulse_agent_scrape_errors_total{reason="http_status"} 1
pulse_agent_scrape_errors_total{reason="not_vllm"} 0
pulse_agent_scrape_errors_total{reason="parse"} 1
pulse_agent_scrape_errors_total{reason="timeout"} 0
pulse_agent_scrape_errors_total{reason="too_large"} 0
# HELP pulse_agent_targets Pods this agent knows of.
# TYPE pulse_agent_targets gauge
pulse_agent_targets 3
# HELP pulse_agent_scrapes_skipped_total Scrapes not started because the previous one of the pod was still in flight.
# TYPE pulse_agent_scrapes_skipped_total counter
pulse_agent_scrapes_skipped_total 0
`
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want),
		"pulse_agent_scrape_errors_total", "pulse_agent_targets", "pulse_agent_scrapes_skipped_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, mf := range mfs {
		if mf.GetName() == "pulse_agent_scrape_duration_seconds" {
			observed = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 3 {
		t.Fatalf("scrape durations observed: %d, want 3", observed)
	}
	if got, err := testutil.GatherAndCount(a.reg, "go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"); err != nil || got != 3 {
		t.Fatalf("Go and process metrics: %d series (%v), want 3", got, err)
	}
	problems, err := testutil.GatherAndLint(a.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
