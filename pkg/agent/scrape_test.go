package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/vllm"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/httpflood"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// TestAnHTTPSPodIsReadOverHTTP1: over HTTP/2 (what Go's transport takes
// for an https pod), a pod's server may go on sending DATA frames on a
// stream whose response is complete; Go's client drops them and returns
// their flow control, so a pod streamed into the agent (225 MiB a second,
// on the connection kept for its next scrape) outside every timeout, slot
// and --max-page-bytes. HTTP/1.1 closes a connection that sends what was
// not asked for; a server that offers HTTP/2 is read over HTTP/1.1.
func TestAnHTTPSPodIsReadOverHTTP1(t *testing.T) {
	page := vllmsim.New(vllmsim.Options{}).Page(false)
	var proto atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(page)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ex := newScraper(t, 1<<20).extractor
	sc := newHTTPScraper(ex, 1<<20, 16, true) // --https-insecure-skip-verify
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sc.Scrape(ctx, srv.URL+"/metrics", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := proto.Load(); got != "HTTP/1.1" {
		t.Fatalf("an https pod offering HTTP/2 was read over %v", got)
	}
}

// TestAGzipPageOfNothingIsBounded: --max-page-bytes bounds the page as
// inflated and, now, as sent: a gzip body that inflates to nothing (empty
// stored deflate blocks, for ever) was read at the network's pace until the
// scrape's timeout, a CPU for each such pod, and reported as a timeout.
func TestAGzipPageOfNothingIsBounded(t *testing.T) {
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		hdr := []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff} // a gzip header, then empty stored blocks
		n, _ := w.Write(hdr)
		written.Add(int64(n))
		block := []byte{0x00, 0x00, 0x00, 0xff, 0xff} // BFINAL=0, stored, LEN=0
		chunk := make([]byte, 0, 64<<10)
		for len(chunk)+len(block) <= cap(chunk) {
			chunk = append(chunk, block...)
		}
		for r.Context().Err() == nil {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := newScraper(t, 1<<20).Scrape(ctx, srv.URL+"/metrics", nil, nil)
	var se *ScrapeError
	if !errors.As(err, &se) || se.Reason != pulsev1.MissingReason_MISSING_REASON_TOO_LARGE {
		t.Fatalf("a page that inflates to nothing, sent without end: %v (the server wrote %d MiB), want it too large", err, written.Load()>>20)
	}
}

// TestACorruptGzipPageIsAParseError: a gzip body that is not one (a bad
// checksum, corrupt deflate data) is the page's fault, not the network's:
// it was reported as connect.
func TestACorruptGzipPageIsAParseError(t *testing.T) {
	var page bytes.Buffer
	zw := gzip.NewWriter(&page)
	_, _ = zw.Write([]byte("vllm:num_requests_waiting{model_name=\"m\"} 3\n"))
	_ = zw.Close()
	good := page.Bytes()
	badSum := bytes.Clone(good)
	badSum[len(badSum)-8] ^= 0xff                                        // the CRC-32 of the trailer
	badDeflate := append(bytes.Clone(good[:10]), 0x07, 0xff, 0xff, 0xff) // reserved block type 3
	for name, body := range map[string][]byte{"a bad checksum": badSum, "corrupt deflate data": badDeflate, "no body": nil} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(body)
		}))
		_, err := newScraper(t, 1<<20).Scrape(context.Background(), srv.URL+"/metrics", nil, nil)
		srv.Close()
		var se *ScrapeError
		if !errors.As(err, &se) || se.Reason != pulsev1.MissingReason_MISSING_REASON_PARSE {
			t.Errorf("%s: %v, want a parse error", name, err)
		}
	}
}

// TestTheAgentsHTTPPortHoldsBoundedConnections: the agent's /metrics,
// /livez and /readyz port (reachable from any pod: the chart has no
// NetworkPolicy for it) held every connection for up to its IdleTimeout,
// 19 KiB each: one pod opening thousands took the agent past its 128Mi
// limit. It holds at most maxHTTPConnsPerIP from one address, and the
// kubelet's probe, from another, still gets its answer.
func TestTheAgentsHTTPPortHoldsBoundedConnections(t *testing.T) {
	a := newIdleAgent(t)
	a.opts.HTTPAddr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.serveHTTP(ctx) }()
	waitUntil(t, "the http port listens", func() bool { return a.HTTPAddr() != "" })
	accepted, release := httpflood.Held(t, a.HTTPAddr(), "/livez", 200)
	if accepted == 0 || accepted > maxHTTPConnsPerIP {
		t.Fatalf("one address's 200 connections: %d held, want 1 to %d", accepted, maxHTTPConnsPerIP)
	}
	// The probe, from another address.
	if _, err := httpflood.GetFrom(a.HTTPAddr(), "/livez"); err != nil {
		t.Fatalf("the probe beside a flood: %v", err)
	}
	// The flood gone, its address is served again.
	release()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/livez")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood closed, its address is still refused: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEveryPodsConnectionIsKept: the scraper kept at most
// --max-concurrent-scrapes idle connections in all (64), while a node can
// list more pods: after each tick the connections past it were closed, and
// those pods paid a handshake (with TLS two) at every scrape. Each pod
// keeps its own, up to two.
func TestEveryPodsConnectionIsKept(t *testing.T) {
	sc := newScraper(t, 1<<20) // 12 pods, more than the 4 the old bound kept
	var conns atomic.Int64
	var urls []string
	for range 12 {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "vllm:num_requests_waiting{model_name=\"m\"} 1\n")
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL+"/metrics")
	}
	for tick := range 3 {
		for _, u := range urls {
			if _, err := sc.Scrape(context.Background(), u, nil, nil); err != nil {
				t.Fatalf("tick %d, %s: %v", tick, u, err)
			}
		}
	}
	if n := conns.Load(); n != 12 {
		t.Fatalf("%d connections for 12 pods scraped three times; want one a pod", n)
	}
}

// TestADataParallelPageAtTheDefaultBound: a vLLM V1 server repeats its
// histograms for each data-parallel engine (the simulator's V1 families,
// as OpenMetrics, which vLLM answers pulse's Accept header with): 16
// engines are read whole at the default --max-page-bytes, and 32 are
// refused saying the flag to raise (the docs gave pages as 5–40 KB, one
// engine's).
func TestADataParallelPageAtTheDefaultBound(t *testing.T) {
	for _, c := range []struct {
		engines int
		read    bool
	}{{16, true}, {32, false}} {
		page := vllmsim.New(vllmsim.Options{Engines: c.engines}).Page(true)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
			_, _ = w.Write(page)
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := newScraper(t, NewOptions().MaxPageBytes).Scrape(ctx, srv.URL+"/metrics", nil, vllm.NewCounters())
		cancel()
		srv.Close()
		switch {
		case c.read && err != nil:
			t.Errorf("%d engines, a page of %d bytes: %v", c.engines, len(page), err)
		case c.read:
			if _, ok := p.Get(metric.Waiting); !ok {
				t.Errorf("%d engines: no waiting read", c.engines)
			}
		case err == nil || !strings.Contains(err.Error(), "--max-page-bytes"):
			t.Errorf("%d engines, a page of %d bytes: %v, want refused naming --max-page-bytes", c.engines, len(page), err)
		}
	}
}
