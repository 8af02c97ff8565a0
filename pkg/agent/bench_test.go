package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// BenchmarkScrape: one scrape of a 40 KB vLLM page over loopback HTTP
// (keep-alive, identity encoding), extracted: the agent's work per pod per
// interval. The page is rendered once by the simulator and served as bytes,
// so that only the agent's side is measured. See docs/performance.md.
func BenchmarkScrape(b *testing.B) {
	sim := vllmsim.New(vllmsim.Options{})
	sim.SetLoad(vllmsim.Load{Waiting: vllmsim.F(6), Running: vllmsim.F(12), KVCacheUsage: vllmsim.F(0.5)})
	page := sim.Page(false)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(page)
	}))
	defer srv.Close()
	ex, err := vllm.NewExtractor(nil)
	if err != nil {
		b.Fatal(err)
	}
	sc := newHTTPScraper(ex, 8<<20, 16, false)
	counters := vllm.NewCounters()
	url := srv.URL + "/metrics"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sc.Scrape(context.Background(), url, nil, counters); err != nil {
			b.Fatal(err)
		}
	}
}
