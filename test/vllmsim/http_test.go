package vllmsim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// While the model loads, /health and /metrics answer 503; the load controls
// still answer, as the test drives them.
func TestLoading(t *testing.T) {
	srv := httptest.NewServer(New(Options{LoadTime: time.Hour}).Handler())
	defer srv.Close()
	for _, path := range []string{"/health", "/metrics"} {
		code, body := get(t, srv.URL+path)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "loading model") {
			t.Errorf("%s while loading: %d %q, want 503 loading model", path, code, body)
		}
	}
	if code, _ := get(t, srv.URL+"/load"); code != http.StatusOK {
		t.Errorf("/load while loading: %d", code)
	}
}

func TestLoaded(t *testing.T) {
	srv := httptest.NewServer(New(Options{}).Handler())
	defer srv.Close()
	if code, _ := get(t, srv.URL+"/health"); code != http.StatusOK {
		t.Errorf("/health: %d, want 200", code)
	}
	code, body := get(t, srv.URL+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, "vllm:num_requests_waiting") {
		t.Errorf("/metrics: %d, page without vllm:num_requests_waiting", code)
	}
}

// TestBadSteeringIsRefused: a typo ({"waitng":5}), a negative count or a
// KV-cache usage over 1 was once taken without a word; each is now a 400
// naming what is wrong, and the page keeps its load.
func TestBadSteeringIsRefused(t *testing.T) {
	sim := New(Options{})
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("/load", `{"waiting":5}`); code != http.StatusNoContent {
		t.Fatalf("a good load: %d %s", code, body)
	}
	for body, want := range map[string]string{
		`{"waitng":5}`:                `unknown field "waitng"`,
		`{"waiting":-1}`:              "waiting -1: want a count of 0 or more",
		`{"kvCacheUsage":1.7}`:        "kvCacheUsage 1.7: want 0 to 1",
		`{"running":-2,"swapped":-1}`: "running -2",
	} {
		if code, got := post("/load", body); code != http.StatusBadRequest || !strings.Contains(got, want) {
			t.Errorf("%s: %d %q, want 400 naming %q", body, code, got, want)
		}
	}
	for body, want := range map[string]string{
		`{"arrivalRate":5,"batchCapacity":0,"serviceRate":1}`: "batchCapacity >= 1",
		`{"arrivalRate":5,"batchCap":16,"serviceRate":1}`:     `unknown field "batchCap"`,
	} {
		if code, got := post("/model", body); code != http.StatusBadRequest || !strings.Contains(got, want) {
			t.Errorf("model %s: %d %q, want 400 naming %q", body, code, got, want)
		}
	}
	if code, got := post("/hang", `{"secs":3}`); code != http.StatusBadRequest || !strings.Contains(got, "secs") {
		t.Errorf("hang typo: %d %q", code, got)
	}
	if st := sim.State(); st.Waiting != 5 {
		t.Fatalf("the refused requests changed the load: waiting %v", st.Waiting)
	}
}
