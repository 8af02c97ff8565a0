package debug

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/signal"
	"github.com/pulse-io/pulse/pkg/store"
)

func server(t *testing.T) *httptest.Server {
	t.Helper()
	st := store.New(store.Options{})
	k := store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: "llama"}
	st.Upsert("n", nil, []store.PodInfo{
		{UID: "a", Namespace: "demo", Name: "llama-0", Ready: true, Workloads: []store.Key{k}},
		{UID: "b", Namespace: "demo", Name: "llama-1", Ready: false, Workloads: []store.Key{k}},
	}, true)
	r := store.Report{UID: "a"}
	r.TimeMs = 1000
	r.Values.Set(signal.Waiting, 3)
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
		if code != 200 || !strings.Contains(body, "demo/llama (Workspace)  llama-0") || !strings.Contains(body, "not-ready") {
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
