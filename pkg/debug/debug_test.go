package debug

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/provision"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
)

// llama is the workload every test here reports on.
var llama = store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: "llama"}

// pods puts pods of llama on node n, named llama-<i> in the order given.
func pods(st *store.Store, ps ...store.PodInfo) {
	for i := range ps {
		ps[i].Namespace, ps[i].Name, ps[i].Workloads = "demo", fmt.Sprintf("llama-%d", i), []store.Key{llama}
	}
	st.Upsert(store.Source{Node: "n"}, ps, true)
}

// serve serves st's debug pages until the test ends.
func serve(t testing.TB, st *store.Store, triggers *scaler.Server) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	h := &Handler{Store: st, FreshFor: time.Minute, MaxWindow: time.Minute}
	if triggers != nil {
		h.Triggers = triggers
	}
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func server(t *testing.T) *httptest.Server {
	t.Helper()
	st := store.New(store.Options{})
	pods(st,
		store.PodInfo{UID: "a", Ready: true},
		store.PodInfo{UID: "b", Ready: false},
	)
	r := store.Report{UID: "a"}
	r.TimeMs = 1000
	r.Values.Set(metric.Waiting, 3)
	st.Add([]store.Report{r})
	return serve(t, st, nil)
}

func get(t *testing.T, url, accept string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestJSON(t *testing.T) {
	srv := server(t)
	code, body := get(t, srv.URL+"/debug/workloads/demo/llama", "")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var doc Document
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	w := doc.Workloads[0]
	if w.Kind != "Workspace" || len(w.Pods) != 2 || w.Averages["waiting"] != 3 || !w.Pods[0].Fresh || w.Pods[1].AgeSeconds != nil {
		t.Fatalf("doc = %s", body)
	}
}

func TestTableAndErrors(t *testing.T) {
	srv := server(t)
	for _, c := range []struct{ url, accept string }{
		{srv.URL + "/debug/workloads?format=table", ""},
		{srv.URL + "/debug/workloads", "text/plain"},
	} {
		code, body := get(t, c.url, c.accept)
		if code != 200 || !strings.Contains(body, "Workspace demo/llama  llama-0") || !strings.Contains(body, "starting") {
			t.Errorf("%s: %d\n%s", c.url, code, body)
		}
	}
	if code, _ := get(t, srv.URL+"/debug/workloads/demo/nope", ""); code != 404 {
		t.Errorf("unknown workload: %d", code)
	}
	if code, body := get(t, srv.URL+"/debug/workloads?window=2h", ""); code != 400 || !strings.Contains(body, "window") {
		t.Errorf("window over max: %d %s", code, body)
	}
	if code, _ := get(t, srv.URL+"/debug/workloads?window=30s", ""); code != 200 {
		t.Errorf("window: %d", code)
	}
	// Within what the store keeps, at least a second (found in a review,
	// 2026-12-07): past it a window was answered over what was kept, a
	// minute's mean over its last 10 s; under a second, over one sample
	// or none, its rates left out unsaid.
	short := store.New(store.Options{Retention: 10 * time.Second})
	shortSrv := serve(t, short, nil)
	for u, want := range map[string]int{
		"/debug/workloads?window=1ns":   400,
		"/debug/workloads?window=500ms": 400,
		"/debug/workloads?window=0":     200,
		"/debug/workloads?window=10s":   200,
		"/debug/workloads?window=11s":   400, // within --max-window, past what is kept
	} {
		if code, body := get(t, shortSrv.URL+u, ""); code != want || code == 400 && !strings.Contains(body, "from 1s to 10s") {
			t.Errorf("%s with 10s kept: %d %s; want %d", u, code, body, want)
		}
	}
	// A format the endpoint does not have was silently JSON.
	for _, u := range []string{"/debug/workloads?format=csv", "/debug/workloads/demo/llama?format=yaml"} {
		if code, body := get(t, srv.URL+u, ""); code != 400 || !strings.Contains(body, "json (the default) or table") {
			t.Errorf("%s: %d %s", u, code, body)
		}
	}
	if code, _ := get(t, srv.URL+"/debug/workloads?format=json", ""); code != 200 {
		t.Errorf("format=json: %d", code)
	}
	// A refusal quotes what was asked cut: a ?format= of 64 KiB of
	// control bytes was answered four times its size, before the bounds
	// on answers under way.
	long := url.QueryEscape(strings.Repeat("\x01", 64<<10))
	for _, u := range []string{"/debug/workloads?format=" + long, "/debug/workloads?window=" + long} {
		if code, body := get(t, srv.URL+u, ""); code != 400 || len(body) > 512 {
			t.Errorf("a query of 64 KiB: %d, an answer of %d bytes; want 400, at most 512", code, len(body))
		}
	}
	// So does the refusal of a workload not found (it wrote the path's
	// name whole, raw).
	if code, body := get(t, srv.URL+"/debug/workloads/demo/"+url.PathEscape(strings.Repeat("\x01", 64<<10)), ""); code != 404 || len(body) > 512 || strings.Contains(body, "\x01") {
		t.Errorf("a workload's name of 64 KiB: %d, an answer of %d bytes; want 404, at most 512, quoted", code, len(body))
	}
	// An explicit format decides over Accept: format=json was answered a
	// table to a client that accepts text/plain.
	if code, body := get(t, srv.URL+"/debug/workloads?format=json", "text/plain"); code != 200 || !strings.HasPrefix(strings.TrimSpace(body), "[") && !strings.HasPrefix(strings.TrimSpace(body), "{") {
		t.Errorf("format=json with Accept text/plain: %d\n%s", code, body)
	}
}

// TestTriggers: /debug/triggers shows each trigger's last answer: its value,
// the replicas it implies, and per pod whether it was counted, filled (by
// which rule) or left out (and why).
func TestTriggers(t *testing.T) {
	st := store.New(store.Options{})
	pods(st,
		store.PodInfo{UID: "a", Ready: true},
		store.PodInfo{UID: "b", Ready: false},
		store.PodInfo{UID: "c", Ready: true, Terminating: true},
	)
	r := store.Report{UID: "a"}
	r.TimeMs = time.Now().UnixMilli()
	r.Values.Set(metric.Waiting, 25)
	st.Add([]store.Report{r})
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	ref := &externalscaler.ScaledObjectRef{Name: "llama-so", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "llama", "threshold": "10"}}
	if _, err := sc.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref}); err != nil {
		t.Fatal(err)
	}
	bad := &externalscaler.ScaledObjectRef{Name: "gone-so", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "gone"}}
	if _, err := sc.IsActive(context.Background(), bad); err == nil {
		t.Fatal("a workload with no pod answered")
	}
	srv := serve(t, st, sc)
	// A window is a trigger's own: one asked for here is refused, not
	// silently ignored (found in a review, 2026-12-07).
	for _, u := range []string{"/debug/triggers?window=30s", "/debug/triggers/demo?window=garbage"} {
		if code, body := get(t, srv.URL+u, ""); code != 400 || !strings.Contains(body, "only /debug/workloads takes one") {
			t.Errorf("%s: %d %s; want 400", u, code, body)
		}
	}

	code, body := get(t, srv.URL+"/debug/triggers", "")
	var doc TriggersDocument
	if err := json.Unmarshal([]byte(body), &doc); code != 200 || err != nil {
		t.Fatalf("%d %v\n%s", code, err, body)
	}
	if len(doc.Triggers) != 2 {
		t.Fatalf("%d triggers, want 2:\n%s", len(doc.Triggers), body)
	}
	gone, tr := doc.Triggers[0], doc.Triggers[1]
	if gone.ScaledObject != "gone-so" || gone.Error == "" || gone.Decision != nil {
		t.Fatalf("failed trigger: %+v", gone)
	}
	if tr.ScaledObject != "llama-so" || tr.Metric != "waiting" || tr.Decision.Value != 25 || *tr.DesiredReplicas != 3 ||
		tr.Decision.Counted != 1 || tr.Decision.LeftOut != 2 {
		t.Fatalf("trigger: %s", body)
	}
	whys := map[string]string{}
	for _, p := range tr.Decision.Pods {
		whys[p.Name] = p.Use + ":" + p.Why
	}
	if whys["llama-0"] != "counted:" || whys["llama-1"] != "left out:starting" || whys["llama-2"] != "left out:terminating" {
		t.Fatalf("pods: %v", whys)
	}
	code, table := get(t, srv.URL+"/debug/triggers?format=table", "")
	for _, want := range []string{"demo/llama-so", "waiting", "25", "up", "1/0/2", "llama-1", "starting", "demo/gone-so", "error"} {
		if code != 200 || !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	// A pod's value sits under VALUE, its use under COUNTED/FILLED/LEFT
	// OUT, its reason under WHY (they used to sit under METRIC and VALUE).
	value, use, why := column(t, table, "VALUE"), column(t, table, "COUNTED/FILLED/LEFT OUT"), column(t, table, "WHY")
	counted, left := lineOf(t, table, "pod llama-0"), lineOf(t, table, "pod llama-1")
	if !strings.HasPrefix(counted[value:], "25") || !strings.HasPrefix(counted[use:], "counted") {
		t.Errorf("counted pod's row misaligned:\n%s", table)
	}
	if !strings.HasPrefix(left[value:], "-") || !strings.HasPrefix(left[use:], "left out") || !strings.HasPrefix(left[why:], "starting") {
		t.Errorf("left-out pod's row misaligned:\n%s", table)
	}
}

// column is the offset of header's column name in the table's first line.
func column(t *testing.T, table, name string) int {
	t.Helper()
	header, _, _ := strings.Cut(table, "\n")
	i := strings.Index(header, name)
	if i < 0 {
		t.Fatalf("no column %s in %q", name, header)
	}
	return i
}

// lineOf is the table's line that contains s.
func lineOf(t *testing.T, table, s string) string {
	t.Helper()
	for _, l := range strings.Split(table, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("no line with %q in\n%s", s, table)
	return ""
}

// TestTableShowsNoStaleValues: a pod whose last scrape failed shows its
// state and no values (it used to show its last values beside
// missing:timeout), and the table says what "-" means.
func TestTableShowsNoStaleValues(t *testing.T) {
	st := store.New(store.Options{})
	pods(st,
		store.PodInfo{UID: "a", Ready: true},
		store.PodInfo{UID: "b", Ready: true},
	)
	now := time.Now().UnixMilli()
	ok := store.Report{UID: "a"}
	ok.TimeMs = now
	ok.Values.Set(metric.Waiting, 7)
	before := store.Report{UID: "b"}
	before.TimeMs = now - 2000
	before.Values.Set(metric.Waiting, 41)
	failed := store.Report{UID: "b"}
	failed.TimeMs, failed.Missing = now-1000, "timeout"
	st.Add([]store.Report{ok, before})
	st.Add([]store.Report{failed})
	srv := serve(t, st, nil)
	_, table := get(t, srv.URL+"/debug/workloads?format=table", "")
	missing := lineOf(t, table, "llama-1")
	if !strings.Contains(missing, "missing:timeout") || strings.Contains(missing, "41") {
		t.Errorf("missing pod's line %q: want its state and no stale value", missing)
	}
	waiting := column(t, table, "waiting")
	if l := lineOf(t, table, "llama-0"); !strings.HasPrefix(l[waiting:], "7 ") {
		t.Errorf("fresh pod's waiting not under its column:\n%s", table)
	}
	if !strings.Contains(table, "-: no value") {
		t.Errorf("the table does not say what - means:\n%s", table)
	}
}

// TestTriggersExplainThePlan: a replicas trigger's answer carries its plan
// (work, capacity, lead time, held peak, the reason), in JSON and under WHY
// in the table.
func TestTriggersExplainThePlan(t *testing.T) {
	st := store.New(store.Options{})
	pods(st, store.PodInfo{UID: "a", Ready: true})
	now := time.Now().UnixMilli()
	for i := range 20 {
		r := store.Report{UID: "a"}
		r.TimeMs = now - int64(19-i)*1000
		r.Values.Set(metric.PromptTokens, 5000*float64(i))
		r.Values.Set(metric.TTFTCount, 5*float64(i))
		r.Values.Set(metric.TTFTSum, 0.2*float64(i))
		r.Values.Set(metric.QueueTimeCount, 5*float64(i))
		r.Values.Set(metric.QueueTimeSum, 0.05*float64(i))
		r.Values.Set(metric.Waiting, 0)
		r.Values.Set(metric.KVCacheUsage, 0.2)
		st.Add([]store.Report{r})
	}
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	ref := &externalscaler.ScaledObjectRef{Name: "llama-so", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "llama", "metric": "replicas"}}
	if _, err := sc.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref}); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, st, sc)
	_, body := get(t, srv.URL+"/debug/triggers", "")
	var doc TriggersDocument
	if err := json.Unmarshal([]byte(body), &doc); err != nil || len(doc.Triggers) != 1 || doc.Triggers[0].Decision.Plan == nil {
		t.Fatalf("%v\n%s", err, body)
	}
	p := doc.Triggers[0].Decision.Plan
	// Proven: the 5000/s served less one standard error of a window of 95
	// first tokens (5 a second over its 19 s), √(2/95) of it
	// (docs/planner.md, rule 2): 4275.
	if p.Replicas != 2 || p.Capacity != 5000 || math.Round(p.Proven) != 4275 || p.Broke != 0 || p.Work != 5000 || p.LeadTimeSeconds != 300 || p.Reason == "" {
		t.Fatalf("plan %+v", p)
	}
	_, table := get(t, srv.URL+"/debug/triggers?format=table", "")
	why := column(t, table, "WHY")
	row, plan := lineOf(t, table, "demo/llama-so"), lineOf(t, table, "  plan")
	if !strings.HasPrefix(row[why:], "work 5000/s over 5000/s per replica") || !strings.HasPrefix(plan[why:], "work 5000/s, capacity 5000/s per replica") ||
		!strings.Contains(plan, "backlog 0 (0 when capacity asked for now is ready)") || !strings.Contains(plan, "proven 4275/s, no break yet") ||
		// The replicas the plan counts, each as docs/planner.md lists them
		// (unseen, unready and terminating were in the JSON alone).
		!strings.Contains(plan, "0 unseen, 0 unready), 0 starting, 0 stuck, 0 terminating") {
		t.Fatalf("the plan is not under WHY:\n%s", table)
	}
	// The rest of what docs/planner.md lists ("Every plan explained"): it
	// was in the JSON alone.
	more := lineOf(t, table, "  plan, more")
	for _, want := range []string{"work per request", "planned for 6250/s", "surge", "level's surge", "trend", "peak", "drain need", "KV need", "hold extension", "rule " + p.Rule} {
		if !strings.Contains(more[why:], want) {
			t.Errorf("the table's plan lacks %q:\n%s", want, more)
		}
	}
}

// TestBrokeAtSaysWhenNoneBroke: the table's plan line names the level
// replicas broke at, or that none has (not "broke at 0/s").
func TestBrokeAtSaysWhenNoneBroke(t *testing.T) {
	if got := brokeAt(0); got != "no break yet" {
		t.Errorf("brokeAt(0) = %q", got)
	}
	if got := brokeAt(12000.4); got != "broke at 12000/s" {
		t.Errorf("brokeAt(12000.4) = %q", got)
	}
}

// TestTableShowsRejectedValues: a pod whose last sample had values refused
// (a negative gauge) is shown so, without values, not as fresh with its
// older ones.
func TestTableShowsRejectedValues(t *testing.T) {
	st := store.New(store.Options{})
	pods(st, store.PodInfo{UID: "a", Ready: true})
	r := store.Report{UID: "a", Sample: store.Sample{TimeMs: time.Now().UnixMilli(), Rejected: "negative waiting"}}
	r.Values.Set(metric.Running, 3)
	st.Add([]store.Report{r})
	srv := serve(t, st, nil)
	_, table := get(t, srv.URL+"/debug/workloads?format=table", "")
	row := lineOf(t, table, "llama-0")
	if !strings.Contains(row, "rejected:negative-waiting") || strings.Contains(row, " 3 ") {
		t.Fatalf("the pod's row: %q, want its state rejected and no values", row)
	}
	_, body := get(t, srv.URL+"/debug/workloads", "")
	if !strings.Contains(body, `"rejected": "negative waiting"`) {
		t.Fatalf("JSON without the refused values: %s", body)
	}
}

// TestDocsSampleIsTheRealTable: docs/scaledobject.md ("Why this number?")
// shows a sample of /debug/triggers?format=table; it had drifted from the
// real table. The same scenario is rendered here and compared with it, cell
// by cell (the age aside).
func TestDocsSampleIsTheRealTable(t *testing.T) {
	now := time.Now()
	st := store.New(store.Options{Now: func() time.Time { return now }})
	pods(st,
		store.PodInfo{UID: "a", Ready: true},
		store.PodInfo{UID: "b", Ready: true},
		store.PodInfo{UID: "c", Ready: true},
		store.PodInfo{UID: "d"},
		store.PodInfo{UID: "e"},
		store.PodInfo{UID: "f", Terminating: true},
	)
	var rs []store.Report
	for uid, waiting := range map[string]float64{"a": 4, "b": 6} {
		r := store.Report{UID: uid}
		r.TimeMs = now.UnixMilli()
		r.Values.Set(metric.Waiting, waiting)
		rs = append(rs, r)
	}
	miss := store.Report{UID: "c"}
	miss.TimeMs, miss.Missing = now.UnixMilli(), "timeout"
	st.Add(append(rs, miss))
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	ref := &externalscaler.ScaledObjectRef{Name: "llama", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "llama", "metric": "waiting", "threshold": "10"}}
	if _, err := sc.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref}); err != nil {
		t.Fatal(err)
	}
	_, table := get(t, serve(t, st, sc).URL+"/debug/triggers?format=table", "")

	doc, err := os.ReadFile("../../docs/scaledobject.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "/debug/triggers?format=table'\n```\n\n```\n")
	sample, _, ok2 := strings.Cut(after, "```\n")
	if !ok || !ok2 {
		t.Fatal("docs/scaledobject.md has no sample after its /debug/triggers?format=table command")
	}
	if got, want := cells(table), cells(sample); got != want {
		t.Errorf("docs/scaledobject.md's sample table is not what pulse prints; pulse:\n%s\ndocs:\n%s", table, sample)
	}
}

// age is a duration as the table prints an age.
var age = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s|m)\b`)

// cells is a table's lines, each as its space-separated cells, ages as AGE.
func cells(table string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(table), "\n") {
		out = append(out, age.ReplaceAllString(strings.Join(strings.Fields(l), " "), "AGE"))
	}
	return strings.Join(out, "\n")
}

// provisioningOf is a provisioner's state, as given.
type provisioningOf provision.Provisioning

// ProvisioningOf keeps namespace ns's workloads, as the provisioner does.
func (p provisioningOf) ProvisioningOf(ns string) provision.Provisioning {
	out := provision.Provisioning(p)
	out.Workloads = slices.DeleteFunc(slices.Clone(out.Workloads), func(s provision.Status) bool { return ns != "" && s.Namespace != ns })
	return out
}

// TestOneNamespacesViews: a tenant may be granted its own namespace's
// debug pages alone (RBAC nonResourceURLs of those paths, behind
// --metrics-auth): /debug/workloads/{namespace} and
// /debug/provisioning/{namespace} show that namespace's, nothing of
// another's.
func TestOneNamespacesViews(t *testing.T) {
	st := store.New(store.Options{})
	pods(st, store.PodInfo{UID: "a", Ready: true})
	other := store.Key{Namespace: "team-b", Kind: store.KindDeployment, Name: "secret-model"}
	st.Upsert(store.Source{Node: "m"}, []store.PodInfo{{UID: "b", Namespace: "team-b", Name: "b-0", Ready: true, Workloads: []store.Key{other}}}, true)
	mux := http.NewServeMux()
	h := &Handler{Store: st, FreshFor: time.Minute, MaxWindow: time.Minute, Provisioning: provisioningOf{Leading: true, Workloads: []provision.Status{
		{Kind: "Workspace", Namespace: "demo", Name: "llama", State: provision.StateProvisioned},
		{Kind: "Deployment", Namespace: "team-b", Name: "secret-model", State: provision.StateProvisioned}}}}
	h.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, path := range []string{"/debug/workloads/demo", "/debug/provisioning/demo", "/debug/workloads/demo?format=table", "/debug/provisioning/demo?format=table"} {
		code, body := get(t, srv.URL+path, "")
		if code != http.StatusOK || !strings.Contains(body, "llama") || strings.Contains(body, "secret-model") || strings.Contains(body, "team-b") {
			t.Errorf("%s: %d %s; want demo's alone", path, code, body)
		}
	}
	if code, body := get(t, srv.URL+"/debug/workloads/nobody", ""); code != http.StatusOK || !strings.Contains(body, `"workloads": []`) {
		t.Errorf("a namespace with nothing: %d %s", code, body)
	}
}

// blockingTriggers holds each /debug/triggers answer until released.
type blockingTriggers struct{ in, release chan struct{} }

func (b blockingTriggers) EvaluationsOf(string) []scaler.Evaluation {
	select {
	case b.in <- struct{}{}:
		<-b.release
	case <-b.release:
	}
	return nil
}

// At most InFlight debug answers are under way, and InFlightPerNamespace
// of one namespace's paths (each a whole document, the store decoded for
// it): past them, 503 at once, not one more held; a tenant asking its own
// in a loop leaves the others theirs.
func TestDebugAnswersAreBounded(t *testing.T) {
	b := blockingTriggers{in: make(chan struct{}), release: make(chan struct{})}
	mux := http.NewServeMux()
	h := &Handler{Store: store.New(store.Options{}), FreshFor: time.Minute, MaxWindow: time.Minute, Triggers: b}
	h.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	codes := make(chan int, InFlight)
	hold := func(path string) {
		go func() {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
		<-b.in
	}
	hold("/debug/triggers/team-a")
	if code, body := get(t, srv.URL+"/debug/triggers/team-a", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "under way") {
		t.Errorf("team-a's second answer while its first is under way: %d %s, want 503", code, body)
	}
	if code, body := get(t, srv.URL+"/debug/workloads/team-b", ""); code != http.StatusOK {
		t.Errorf("team-b's while team-a's is under way: %d %s, want 200", code, body)
	}
	for range InFlight - 1 {
		hold("/debug/triggers")
	}
	for _, path := range []string{"/debug/triggers", "/debug/workloads", "/debug/workloads/team-b?format=table"} {
		if code, body := get(t, srv.URL+path, ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "under way") {
			t.Errorf("%s with %d answers under way: %d %s, want 503", path, InFlight, code, body)
		}
	}
	// The refusal quotes the namespace cut (it quoted a name of control
	// bytes whole, four times its size).
	if code, body := get(t, srv.URL+"/debug/workloads/"+url.PathEscape(strings.Repeat("\x01", 64<<10)), ""); code != http.StatusServiceUnavailable || len(body) > 512 {
		t.Errorf("a namespace of 64 KiB with %d answers under way: %d, an answer of %d bytes; want 503, at most 512", InFlight, code, len(body))
	}
	close(b.release)
	for range InFlight {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("an answer under way: %d, want 200", code)
		}
	}
	for _, path := range []string{"/debug/workloads", "/debug/triggers/team-a"} {
		if code, body := get(t, srv.URL+path, ""); code != http.StatusOK {
			t.Errorf("%s after the answers: %d %s, want 200", path, code, body)
		}
	}
}

// /debug/triggers/{namespace}: one namespace's ScaledObjects' triggers, for
// a tenant granted that path alone.
func TestOneNamespacesTriggers(t *testing.T) {
	st := store.New(store.Options{})
	pods(st, store.PodInfo{UID: "a", Ready: true})
	other := store.Key{Namespace: "team-b", Kind: store.KindDeployment, Name: "secret-model"}
	st.Upsert(store.Source{Node: "m"}, []store.PodInfo{{UID: "b", Namespace: "team-b", Name: "b-0", Ready: true, Workloads: []store.Key{other}}}, true)
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute, AllowCrossNamespace: true})
	for _, ref := range []*externalscaler.ScaledObjectRef{
		{Name: "llama-so", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "llama"}},
		{Name: "secret-so", Namespace: "team-b", ScalerMetadata: map[string]string{"deployment": "secret-model"}},
		// Across namespaces (the operator allowed it): the other's pods, so
		// in neither namespace's view.
		{Name: "across-so", Namespace: "demo", ScalerMetadata: map[string]string{"deployment": "secret-model", "namespace": "team-b"}},
		{Name: "reader-so", Namespace: "team-b", ScalerMetadata: map[string]string{"workspace": "llama", "namespace": "demo"}},
	} {
		_, _ = sc.IsActive(context.Background(), ref)
	}
	srv := serve(t, st, sc)
	// Refused for reading across namespaces (not allowed there): the
	// tenant's own, shown to it.
	strict := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	if _, err := strict.IsActive(context.Background(), &externalscaler.ScaledObjectRef{Name: "refused-so", Namespace: "demo",
		ScalerMetadata: map[string]string{"deployment": "secret-model", "namespace": "team-b"}}); err == nil {
		t.Fatal("a trigger across namespaces was not refused")
	}
	if code, body := get(t, serve(t, st, strict).URL+"/debug/triggers/demo", ""); code != http.StatusOK || !strings.Contains(body, "refused-so") || !strings.Contains(body, `"refused": true`) {
		t.Errorf("demo's refused trigger on its own page: %d %s", code, body)
	}
	if code, body := get(t, srv.URL+"/debug/triggers", ""); code != http.StatusOK || !strings.Contains(body, "llama-so") || !strings.Contains(body, "secret-so") || !strings.Contains(body, "across-so") {
		t.Fatalf("every trigger: %d %s", code, body)
	}
	for _, path := range []string{"/debug/triggers/demo", "/debug/triggers/demo?format=table"} {
		code, body := get(t, srv.URL+path, "")
		if code != http.StatusOK || !strings.Contains(body, "llama-so") || strings.Contains(body, "secret") || strings.Contains(body, "team-b") || strings.Contains(body, "across") || strings.Contains(body, "reader") {
			t.Errorf("%s: %d %s; want demo's alone", path, code, body)
		}
	}
	if code, body := get(t, srv.URL+"/debug/triggers/nobody", ""); code != http.StatusOK || !strings.Contains(body, `"triggers": []`) {
		t.Errorf("a namespace with no trigger: %d %s", code, body)
	}
}

// TestTablesHoldTenantTextInItsCell: a tenant's workload name
// (pulse.io/workload: any UTF-8 of at most 253 bytes) and trigger metadata
// are written into the tables as one cell each: a newline in a name forged
// a row under another namespace's name in /debug/workloads, and escape
// sequences reached the terminal of whoever read either table.
func TestTablesHoldTenantTextInItsCell(t *testing.T) {
	st := store.New(store.Options{})
	forged := "llama\nDeployment team-b/secret-model  secret-0  fresh  0.0s  999\x1b]0;owned\x07"
	k := store.Key{Namespace: "team-a", Kind: store.KindDeployment, Name: forged}
	st.Upsert(store.Source{Node: "n"}, []store.PodInfo{{UID: "a", Namespace: "team-a", Name: "a-0", Ready: true, Workloads: []store.Key{k}}}, true)
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	_, _ = sc.IsActive(context.Background(), &externalscaler.ScaledObjectRef{Name: "so", Namespace: "team-a",
		ScalerMetadata: map[string]string{"workspace": "x\x1b[2J"}})
	srv := serve(t, st, sc)
	for _, path := range []string{"/debug/workloads?format=table", "/debug/triggers?format=table"} {
		code, body := get(t, srv.URL+path, "")
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "Deployment team-b/") {
				t.Errorf("%s: a row forged under team-b's name by team-a's workload name: %q", path, line)
			}
		}
		if strings.ContainsAny(body, "\x1b\x07") {
			t.Errorf("%s: terminal escapes from tenant text passed through: %q", path, body)
		}
	}
	if got := cell("a\tb\r\nc\x00\x7f\u0085é"); got != "a b  c\uFFFD\uFFFD\uFFFDé" {
		t.Errorf("cell: %q", got)
	}
}

// TestARoutersRowIsFresh: a demand source's row (a router's requests held
// for the workload) was left with no age and never fresh, so a router
// reporting every second read "stale", never reported, on the pages; its
// table state "router: N held" could not show. It reads as fresh as it
// is, and its values stay out of the replicas' averages.
func TestARoutersRowIsFresh(t *testing.T) {
	st := store.New(store.Options{})
	pods(st, store.PodInfo{UID: "a", Ready: true})
	st.Upsert(store.Source{Node: "n"}, []store.PodInfo{{UID: store.DemandUID("router", "llama"), Namespace: "demo", Name: "router",
		Ready: true, Demand: true, Workloads: []store.Key{llama}}}, false)
	r := store.Report{UID: "a"}
	r.TimeMs = time.Now().UnixMilli()
	r.Values.Set(metric.Waiting, 3)
	d := store.Report{UID: store.DemandUID("router", "llama")}
	d.TimeMs = r.TimeMs
	d.Values.Set(metric.PendingRequests, 7)
	st.Add([]store.Report{r, d})
	srv := serve(t, st, nil)
	_, body := get(t, srv.URL+"/debug/workloads/demo/llama", "")
	var doc Document
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	w := doc.Workloads[0]
	var router *Pod
	for i := range w.Pods {
		if w.Pods[i].Name == "router" {
			router = &w.Pods[i]
		}
	}
	if router == nil || !router.Fresh || router.AgeSeconds == nil {
		t.Fatalf("the router's row: %+v; want fresh, with its age\n%s", router, body)
	}
	if _, ok := w.Averages["pendingRequests"]; ok || w.Averages["waiting"] != 3 {
		t.Fatalf("averages %v: want the replica's waiting 3 and nothing of the router's", w.Averages)
	}
	if _, table := get(t, srv.URL+"/debug/workloads?format=table", ""); !strings.Contains(table, "router: 7 held") {
		t.Fatalf("the table's router row does not say what it holds:\n%s", table)
	}
}

// records is a trigger source of n evaluations of namespace "team", each
// with a plan and 32 pods; bad, if at least 0, is one whose value JSON has
// no form for. Each answer is a copy of the one slice of records, as the
// scaler's EvaluationsOf copies its own (a record's pods are shared).
type records []scaler.Evaluation

func newRecords(n, bad int) records {
	at := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	out := make(records, 0, n)
	for i := range n {
		e := scaler.Evaluation{TriggerID: scaler.TriggerID{Namespace: "team", ScaledObject: fmt.Sprintf("so-%05d", i)}, At: at}
		e.Trigger = scaler.Trigger{Workload: store.Key{Namespace: "team", Kind: store.KindWorkspace, Name: fmt.Sprintf("w-%d", i)},
			Metric: "replicas", Threshold: 1, ValueType: "total", Aggregation: "sum", MissingPods: scaler.MissingHold, Window: time.Minute}
		e.Decision = scaler.Decision{Value: 3, Direction: "up", Counted: 32, Ready: 32,
			Plan: &planner.Plan{Replicas: 3, Reason: "the work over a replica's capacity", Work: 9000, Capacity: 3000, Confidence: 0.9}}
		for p := range 32 {
			e.Decision.Pods = append(e.Decision.Pods, scaler.PodDecision{Name: fmt.Sprintf("w-%d-pod-%d", i, p), Use: scaler.UseCounted, Value: float64(p)})
		}
		if i == bad {
			e.Decision.Plan.Work = math.NaN()
		}
		out = append(out, e)
	}
	return out
}

func (s records) EvaluationsOf(string) []scaler.Evaluation { return slices.Clone(s) }

func serveRecords(t testing.TB, src TriggerSource) *httptest.Server {
	mux := http.NewServeMux()
	(&Handler{Store: store.New(store.Options{}), FreshFor: time.Minute, Triggers: src}).Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestAPageIsWrittenAsOneDocument: /debug/triggers, written a trigger at a
// time, is byte for byte the document json.MarshalIndent made of the whole
// page, with none, one and many triggers.
func TestAPageIsWrittenAsOneDocument(t *testing.T) {
	for _, n := range []int{0, 1, 3, 200} {
		src := newRecords(n, -1)
		_, body := get(t, serveRecords(t, src).URL+"/debug/triggers", "")
		doc := TriggersDocument{Triggers: []Trigger{}}
		for _, e := range src.EvaluationsOf("") {
			tr, _ := triggerOf(&e, "")
			doc.Triggers = append(doc.Triggers, tr)
		}
		want, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if body != string(want)+"\n" {
			t.Fatalf("%d triggers: the page is not the document made whole:\n%s\nwant\n%s", n, body, want)
		}
	}
}

// TestATriggerWithNoJSONFormLosesNoOther: a trigger whose record holds a
// value JSON has no form for (NaN) is written as an error in its place;
// the page made whole answered 500 and showed no trigger at all.
func TestATriggerWithNoJSONFormLosesNoOther(t *testing.T) {
	src := newRecords(3, 1)
	for i := range src {
		src[i].MetricName = "s0-pulse-waiting" // one ScaledObject's trigger of several
	}
	code, body := get(t, serveRecords(t, src).URL+"/debug/triggers", "")
	var doc TriggersDocument
	if err := json.Unmarshal([]byte(body), &doc); code != http.StatusOK || err != nil || len(doc.Triggers) != 3 {
		t.Fatalf("%d, %v:\n%s", code, err, body)
	}
	// Named in the page's own fields (a review found it written as
	// "name", which a client of the page read as no ScaledObject).
	bad := doc.Triggers[1]
	if bad.Namespace != "team" || bad.ScaledObject != "so-00001" || bad.MetricName != "s0-pulse-waiting" ||
		!strings.Contains(bad.Error, "could not be encoded") || bad.Decision != nil {
		t.Fatalf("the trigger with a NaN: %+v", bad)
	}
	for _, i := range []int{0, 2} {
		if doc.Triggers[i].Decision == nil {
			t.Fatalf("trigger %d lost its decision: %+v", i, doc.Triggers[i])
		}
	}
}

// TestRowsAlignAsTabwriter: writeRows, which holds no row, writes what
// text/tabwriter (padding 2, spaces), which holds them all, wrote for the
// same rows: cells of any width, empty ones, runes of several bytes, a
// column empty throughout.
func TestRowsAlignAsTabwriter(t *testing.T) {
	var rows [][]string
	for i := range 40 {
		rows = append(rows, []string{strings.Repeat("ü", i%7), fmt.Sprint(i * i * i), "", strings.Repeat("x", (i*13)%11), fmt.Sprintf("last %d", i)})
	}
	rows = append(rows, []string{"", "", "", "", ""})
	var want, got strings.Builder
	tw := tabwriter.NewWriter(&want, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	writeRows(&got, slices.Values(rows))
	if got.String() != want.String() {
		t.Fatalf("writeRows:\n%s\ntabwriter:\n%s", got.String(), want.String())
	}
}

// BenchmarkTriggersPage: /debug/triggers of 10,000 triggers, each with a
// plan and 32 pods, read by a client. live-MB is the heap live (after a
// GC) at the answer's first bytes and at each 4 MB more that the client
// reads, at most: what one answer under way holds (docs/performance.md,
// "The debug pages").
func BenchmarkTriggersPage(b *testing.B) {
	srv := serveRecords(b, newRecords(10_000, -1))
	for _, format := range []string{"json", "table"} {
		b.Run(format, func(b *testing.B) { benchmarkPage(b, srv.URL+"/debug/triggers?format="+format) })
	}
}

func benchmarkPage(b *testing.B, url string) {
	var peak uint64
	var ms runtime.MemStats
	b.ReportAllocs()
	buf := make([]byte, 4<<20)
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, err := io.ReadFull(resp.Body, buf)
			runtime.GC()
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > base {
				peak = max(peak, ms.HeapAlloc-base)
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
	}
	b.ReportMetric(float64(peak)/1e6, "live-MB")
}

// TestRowsThatWidenStayApart: the workloads page views the store again for
// the table's second pass, and a value may have grown wider since the
// first. Such a cell ran into the next (no space left after it).
func TestRowsThatWidenStayApart(t *testing.T) {
	pass := 0
	rows := func(yield func([]string) bool) {
		pass++
		v := "1.0"
		if pass > 1 {
			v = "12345.678"
		}
		_ = yield([]string{"POD", "running", "waiting"}) && yield([]string{"llama-0", v, "3"})
	}
	var got strings.Builder
	writeRows(&got, rows)
	if want := "POD      running  waiting\nllama-0  12345.678  3\n"; got.String() != want {
		t.Fatalf("writeRows:\n%q\nwant\n%q", got.String(), want)
	}
}

// BenchmarkWorkloadsPage: /debug/workloads of 10,000 workloads of 8 pods,
// each with 20 s of a busy vLLM pod's values, read by a client (live-MB as
// BenchmarkTriggersPage's).
func BenchmarkWorkloadsPage(b *testing.B) {
	now := time.UnixMilli(1_700_000_000_000)
	const n = 80_000
	st := store.New(store.Options{MaxPods: n, Now: func() time.Time { return now }})
	infos := make([]store.PodInfo, n)
	for i := range infos {
		infos[i] = store.PodInfo{UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i), Namespace: fmt.Sprintf("tenant-%d", i%50),
			Name: fmt.Sprintf("llama-%d", i), Ready: true}
		infos[i].Workloads = []store.Key{{Namespace: infos[i].Namespace, Kind: store.KindWorkspace, Name: fmt.Sprintf("llama-%d", i/8)}}
	}
	for a := range n / 8 {
		st.Upsert(store.Source{Node: fmt.Sprintf("node-%d", a), Instance: "agent"}, infos[a*8:a*8+8], true)
	}
	reports := make([]store.Report, n)
	for s := range 20 {
		now = now.Add(time.Second)
		for j := range reports {
			r := store.Report{UID: infos[j].UID}
			r.TimeMs = now.UnixMilli()
			for k, id := range []metric.ID{metric.PromptTokens, metric.GenerationTokens, metric.RequestSuccess, metric.TTFTSum, metric.TTFTCount} {
				r.Values.Set(id, float64(s*(k+1)*100))
			}
			r.Values.Set(metric.Waiting, float64(s%9))
			r.Values.Set(metric.Running, float64(40+s%17))
			r.Values.Set(metric.KVCacheUsage, 0.5)
			reports[j] = r
		}
		st.Add(reports)
	}
	if got := st.Pods(); got != n {
		b.Fatalf("%d pods held, want %d", got, n)
	}
	infos = nil
	srv := serve(b, st, nil)
	for _, format := range []string{"json", "table"} {
		b.Run(format, func(b *testing.B) { benchmarkPage(b, srv.URL+"/debug/workloads?window=10s&format="+format) })
	}
}

// TestAQueryAskedTwiceOrUnparsedIsRefused: ?format= and ?window= were read
// by their first value alone (url.Values.Get), and a query Go's parser
// drops a pair of (a semicolon) was read without it: a format or window
// asked for and silently not given, the answer a 200 in another form
// (?format=&format=table: JSON; ?window=&window=30s: each pod's latest;
// ?format=table;x=1: JSON), where a format asked for and not given is
// refused (checked). Asked twice, or unparsed, the query is a 400.
func TestAQueryAskedTwiceOrUnparsedIsRefused(t *testing.T) {
	srv := server(t)
	for _, q := range []string{
		"?format=&format=table",
		"?format=json&format=yaml",
		"?format=table&format=json",
		"?window=&window=30s",
		"?window=30s&window=forever",
		"?format=table;x=1",
		"?window=30s;format=table",
	} {
		code, body := get(t, srv.URL+"/debug/workloads"+q, "")
		if code != 400 {
			t.Errorf("/debug/workloads%s: %d %.80q; want 400", q, code, body)
		}
	}
	// One value each is served as before.
	for _, q := range []string{"?format=table", "?window=30s&format=json", "?format=table&window=0"} {
		if code, body := get(t, srv.URL+"/debug/workloads"+q, ""); code != 200 || strings.Contains(q, "table") && !strings.Contains(body, "WORKLOAD") {
			t.Errorf("/debug/workloads%s: %d %.80q; want 200", q, code, body)
		}
	}
}
