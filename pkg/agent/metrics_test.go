package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/vllm"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
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

	a := newIdleAgent(t)
	targets := []discovery.Target{
		{UID: "u1", Namespace: "ns", Pod: "good", Ready: true, URL: srv.URL + "/metrics"},
		{UID: "u2", Namespace: "ns", Pod: "error", Ready: true, URL: srv.URL + "/500"},
		{UID: "u3", Namespace: "ns", Pod: "garbage", Ready: true, URL: srv.URL + "/garbage"},
	}
	a.SetTargets(targets)
	for _, tg := range targets {
		a.scrapeOne(context.Background(), tg, a.startScrape(tg.UID, tg.Namespace))
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

// TestARouterIsOneScrape: a router's demand entries (one per workload it
// names) were each a scrape of the same page: a router naming 64
// workloads cost 64 fetches and 64 page buffers a tick, and a slow one
// filled every scrape slot of the node (a neighbour's pod went stale at
// 20 of 40 polls). Its entries are now one scrape unit: one fetch of the
// page a tick, each workload's value read from it.
func TestARouterIsOneScrape(t *testing.T) {
	var fetches atomic.Int64
	var page strings.Builder
	for i := range 64 {
		fmt.Fprintf(&page, "router_pending{model=\"w%d\"} %d\n", i, i)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetches.Add(1)
		_, _ = w.Write([]byte(page.String()))
	}))
	defer srv.Close()

	a := newIdleAgent(t)
	byID := map[uint32]discovery.Target{
		1: {UID: "model-pod", Namespace: "ns", Pod: "m", Ready: true, URL: srv.URL + "/metrics"},
		2: {UID: "starting", Namespace: "ns", Pod: "s", URL: srv.URL + "/metrics"},
	}
	for i := range 64 {
		byID[uint32(10+i)] = discovery.Target{UID: fmt.Sprintf("router/demand/w%d", i), Namespace: "ns", Pod: "router", Ready: true,
			URL: srv.URL + "/router", Demand: &vllm.Demand{Metrics: []string{"router_pending"}, Label: "model", Match: fmt.Sprintf("w%d", i)}}
	}
	// Another namespace's router at the same address (its IP reused before
	// a pod's status caught up): a unit of its own, never the first's.
	byID[100] = discovery.Target{UID: "other-router/demand/x", Namespace: "team-b", Pod: "router", Ready: true,
		URL: srv.URL + "/router", Demand: &vllm.Demand{Metrics: []string{"router_pending"}, Label: "model", Match: "w1"}}
	units := scrapeUnits(byID)
	router := units[demandUnit+"router"]
	if len(units) != 3 || len(units["model-pod"]) != 1 || len(router) != 64 || len(units[demandUnit+"other-router"]) != 1 {
		t.Fatalf("%d scrape units (model pod %d targets, router %d): want the model pod, the router's 64 entries in one, and the other router's apart", len(units), len(units["model-pod"]), len(router))
	}
	results := a.scrapeDemand(context.Background(), router)
	if len(results) != len(router) {
		t.Fatalf("%d results for the router's %d entries", len(results), len(router))
	}
	if fetches.Load() != 1 {
		t.Fatalf("the router's page was fetched %d times for its 64 workloads, want once", fetches.Load())
	}
	for i, r := range results {
		v, ok := r.page.Get(metric.PendingRequests)
		if r.uid != router[i].UID || !ok || r.err != "" {
			t.Fatalf("result %d: %+v, want %s's pending requests", i, r, router[i].UID)
		}
		var n int
		_, _ = fmt.Sscanf(r.uid, "router/demand/w%d", &n)
		if v != float64(n) {
			t.Fatalf("%s: pending %v, want %d", r.uid, v, n)
		}
	}
	// A page that fails fails every entry, with its reason.
	srv.Close()
	failed := a.scrapeDemand(context.Background(), router)
	if len(failed) != len(router) {
		t.Fatalf("%d results for the router's %d entries, its page failing", len(failed), len(router))
	}
	for _, r := range failed {
		if r.missing != pulsev1.MissingReason_MISSING_REASON_CONNECT || r.err == "" {
			t.Fatalf("%s: missing %v (%q), want connect", r.uid, r.missing, r.err)
		}
	}
}

// newIdleAgent is an agent of no static target and no GPU, not running:
// a test calls its parts.
func newIdleAgent(t *testing.T) *Agent {
	t.Helper()
	o := NewOptions()
	o.StaticTargets, o.NVML = filepath.Join(t.TempDir(), "targets.yaml"), gpu.ModeOff
	if err := os.WriteFile(o.StaticTargets, []byte("targets: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTheAgentsCounterSeriesAreBounded: each pod's counters followed at
// most 4,096 series, but nothing bounded them all: a node's pods each
// naming thousands took 37 MiB of an agent limited to 128 Mi at 110 pods.
// The agent's budget (maxSeries, half of it for one namespace) bounds
// them; a pod no longer listed gives its room back, once its scrape in
// flight ends.
func TestTheAgentsCounterSeriesAreBounded(t *testing.T) {
	srv := madeUpSeries(t)
	a := newIdleAgent(t)
	var targets []discovery.Target
	for i := range 10 {
		targets = append(targets, discovery.Target{UID: fmt.Sprint("h", i), Namespace: "hostile", Pod: fmt.Sprint("h", i), Ready: true, URL: fmt.Sprintf("%s/h%d", srv.URL, i)})
	}
	victim := discovery.Target{UID: "v", Namespace: "victim", Pod: "v", Ready: true, URL: srv.URL + "/v"}
	a.SetTargets(append(targets, victim))
	for _, tg := range targets {
		a.scrapeOne(context.Background(), tg, a.startScrape(tg.UID, tg.Namespace))
		a.endScrape(tg.UID)
	}
	if _, of := a.series.Held("hostile"); of != maxSeries/2 {
		t.Fatalf("the hostile namespace's pods hold %d series, want its share %d", of, maxSeries/2)
	}
	a.scrapeOne(context.Background(), victim, a.startScrape(victim.UID, victim.Namespace))
	a.endScrape(victim.UID)
	if all, of := a.series.Held("victim"); of != 4096 || all != maxSeries/2+4096 {
		t.Fatalf("held %d in all, %d of the victim's pod: want its 4096 followed", all, of)
	}
	// The hostile pods go, one of them with its scrape in flight.
	inFlight := a.startScrape("h0", "hostile")
	a.SetTargets([]discovery.Target{victim})
	if _, of := a.series.Held("hostile"); of != 4096 {
		t.Fatalf("the hostile namespace holds %d series after its pods went, want 4096: the one in flight's", of)
	}
	a.scrapeOne(context.Background(), targets[0], inFlight)
	a.endScrape("h0")
	if all, of := a.series.Held("hostile"); of != 0 || all != 4096 {
		t.Fatalf("held %d in all, %d of the hostile namespace, once its scrape ended: want 4096 (the victim's) and 0", all, of)
	}
}

// TestTwoNamespacesCannotTakeEveryCounterSeries: the budget's share for
// one namespace was a fixed half, so two namespaces' pages of made-up
// series took all of it, and every other namespace's counters were summed
// as their pages had them (an engine's restart read as its pod's). The
// share is the budget over the namespaces listed; a namespace past it,
// set lower since it took its room, gives its room back and takes it
// again up to the share; the third namespace's pod is followed whole.
func TestTwoNamespacesCannotTakeEveryCounterSeries(t *testing.T) {
	srv := madeUpSeries(t)
	a := newIdleAgent(t)
	var hostile []discovery.Target
	for _, ns := range []string{"a", "b"} {
		for i := range 8 {
			uid := fmt.Sprint(ns, i)
			hostile = append(hostile, discovery.Target{UID: uid, Namespace: ns, Pod: uid, Ready: true, URL: srv.URL + "/" + uid})
		}
	}
	scrape := func(ts ...discovery.Target) {
		for _, tg := range ts {
			a.scrapeOne(context.Background(), tg, a.startScrape(tg.UID, tg.Namespace))
			a.endScrape(tg.UID)
		}
	}
	a.SetTargets(hostile)
	scrape(hostile...)
	if all, _ := a.series.Held("a"); all != maxSeries {
		t.Fatalf("two namespaces of made-up series hold %d, want the whole budget %d (this test's premise)", all, maxSeries)
	}
	victim := discovery.Target{UID: "v", Namespace: "victim", Pod: "v", Ready: true, URL: srv.URL + "/v"}
	a.SetTargets(append(hostile, victim))
	scrape(hostile...)
	scrape(victim)
	share := maxSeries / 3
	for _, ns := range []string{"a", "b"} {
		if _, of := a.series.Held(ns); of > share {
			t.Errorf("namespace %s holds %d series, past its share %d of three namespaces", ns, of, share)
		}
	}
	if _, of := a.series.Held("victim"); of != 4096 {
		t.Fatalf("the third namespace's pod: %d of its 4096 series followed", of)
	}
}

// madeUpSeries serves, at every path, a page of 4,096 series of a counter
// the agent reads (a pod's most), named by the path: no two pods' alike.
func madeUpSeries(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 4096 {
			fmt.Fprintf(w, "vllm:prompt_tokens_total{req=%q} 1\n", r.URL.Path+fmt.Sprint(i))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestAFullBudgetIsSharedWithoutAPodEvent: the series' budget was shared
// again only at pod events. A namespace whose share was lowered (a third
// namespace listed) while the budget had room kept its room, and once the
// budget filled the third one's pods were held under their share, summed,
// until some pod came or went. Now a namespace under its share refused for
// a full budget has those past their share give their room back at the
// next scrape.
func TestAFullBudgetIsSharedWithoutAPodEvent(t *testing.T) {
	srv := madeUpSeries(t)
	a := newIdleAgent(t)
	pods := func(ns string, n int) []discovery.Target {
		var ts []discovery.Target
		for i := range n {
			uid := fmt.Sprint(ns, i)
			ts = append(ts, discovery.Target{UID: uid, Namespace: ns, Pod: uid, Ready: true, URL: srv.URL + "/" + uid})
		}
		return ts
	}
	scrape := func(ts ...discovery.Target) {
		for _, tg := range ts {
			a.scrapeOne(context.Background(), tg, a.startScrape(tg.UID, tg.Namespace))
			a.endScrape(tg.UID)
		}
	}
	big, other, late := pods("big", 8), pods("other", 5), pods("late", 4)
	a.SetTargets(append(slices.Clone(big), other...))
	scrape(append(slices.Clone(big), other...)...)
	a.SetTargets(append(append(slices.Clone(big), other...), late...)) // the share falls to a third; the budget has room
	scrape(late...)
	share := maxSeries / 3
	if all, of := a.series.Held("late"); all != maxSeries || of >= share {
		t.Fatalf("the budget holds %d, the late namespace %d: want it full and the late one under its share %d (this test's premise)", all, of, share)
	}
	scrape(big...) // no pod came or went
	scrape(late...)
	if _, of := a.series.Held("big"); of > share {
		t.Errorf("the namespace past its share still holds %d, want at most %d", of, share)
	}
	if _, of := a.series.Held("late"); of != 4*4096 {
		t.Fatalf("the late namespace's pods follow %d of their %d series", of, 4*4096)
	}
}

// TestARoutersArrivalsAreFollowedFromScrapeToScrape: a router's demand
// entry that counts arrivals keeps its series' state from one scrape to
// the next (a series gone keeps its count: the sum the aggregator reads
// never drops for it), and the state goes with the entry.
func TestARoutersArrivalsAreFollowedFromScrapeToScrape(t *testing.T) {
	var page atomic.Value
	page.Store("requests_total{model=\"llama\",endpoint=\"a\"} 5\nrequests_total{model=\"llama\",endpoint=\"b\"} 1000\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(page.Load().(string)))
	}))
	defer srv.Close()
	a := newIdleAgent(t)
	tg := discovery.Target{UID: "router/demand/llama", Namespace: "ns", Pod: "router", Ready: true, URL: srv.URL + "/metrics",
		Demand: &vllm.Demand{Metrics: []string{"requests_total"}, Label: "model", Match: "llama", Arrivals: true}}
	a.SetTargets([]discovery.Target{tg})
	for i, want := range []float64{1005, 1007} {
		r := a.scrapeDemand(context.Background(), []discovery.Target{tg})[0]
		if v, ok := r.page.Get(metric.ArrivedRequests); !ok || v != want || r.err != "" {
			t.Fatalf("scrape %d: arrivals %v (%v, %q), want %v", i, v, ok, r.err, want)
		}
		page.Store("requests_total{model=\"llama\",endpoint=\"b\"} 1002\n") // endpoint a's series gone
	}
	a.SetTargets(nil)
	a.inflightMu.Lock()
	n := len(a.arrivals)
	a.inflightMu.Unlock()
	if n != 0 {
		t.Fatalf("%d arrival states kept for entries no longer listed", n)
	}
}
