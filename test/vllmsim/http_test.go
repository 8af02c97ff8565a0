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
