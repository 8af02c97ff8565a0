package debug

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
)

func server(t *testing.T) *httptest.Server {
	t.Helper()
	st := store.New(store.Options{})
	k := store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: "llama"}
	st.Upsert(store.Source{Node: "n"}, []store.PodInfo{
		{UID: "a", Namespace: "demo", Name: "llama-0", Ready: true, Workloads: []store.Key{k}},
		{UID: "b", Namespace: "demo", Name: "llama-1", Ready: false, Workloads: []store.Key{k}},
	}, true)
	r := store.Report{UID: "a"}
	r.TimeMs = 1000
	r.Values.Set(metric.Waiting, 3)
	st.Add([]store.Report{r})
	mux := http.NewServeMux()
	(&Handler{Store: st, FreshFor: time.Minute, MaxWindow: time.Minute}).Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
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
		if code != 200 || !strings.Contains(body, "demo/llama (Workspace)  llama-0") || !strings.Contains(body, "starting") {
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
}

// TestTriggers: /debug/triggers shows each trigger's last answer: its value,
// the replicas it implies, and per pod whether it was counted, filled (by
// which rule) or left out (and why).
func TestTriggers(t *testing.T) {
	st := store.New(store.Options{})
	k := store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: "llama"}
	st.Upsert(store.Source{Node: "n"}, []store.PodInfo{
		{UID: "a", Namespace: "demo", Name: "llama-0", Ready: true, Workloads: []store.Key{k}},
		{UID: "b", Namespace: "demo", Name: "llama-1", Ready: false, Workloads: []store.Key{k}},
		{UID: "c", Namespace: "demo", Name: "llama-2", Ready: true, Terminating: true, Workloads: []store.Key{k}},
	}, true)
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
	mux := http.NewServeMux()
	(&Handler{Store: st, FreshFor: time.Minute, MaxWindow: time.Minute, Triggers: sc}).Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

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
}
