package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/vllmsim"
)

func TestOptionsValidate(t *testing.T) {
	o := NewOptions()
	o.ScrapeInterval = time.Millisecond
	o.ExtraMetrics = app.StringList{"bad name"}
	for i := range 32 { // 33 in all: the aggregator refuses a hello of more than 32
		o.ExtraMetrics = append(o.ExtraMetrics, fmt.Sprint("gauge_", i))
	}
	o.Log.Format = "xml"
	o.NVML = "maybe"
	o.PodSelector = "a in (b"
	o.ReconnectMaxBackoff = 0 // the reconnect's jitter once panicked on it
	o.Relay = "pulse-relay"   // no port
	err := o.Validate()
	for _, want := range []string{"--aggregator is required", "--scrape-interval", "extra metric", "given 33 times; at most 32", "--log-format", "--nvml", "--pod-selector", "--reconnect-max-backoff", "--relay"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	// A timeout of the whole interval left a pod that never answers in
	// flight at its next tick: scraped every other one. It is taken as
	// 90% of the interval (refused, agents upgraded with it crash-looped).
	for timeout, want := range map[time.Duration]time.Duration{0: 800 * time.Millisecond, 500 * time.Millisecond: 500 * time.Millisecond,
		time.Second: 900 * time.Millisecond, 2 * time.Second: -1, -time.Second: -1} {
		o := NewOptions()
		o.Aggregators, o.NodeName, o.ScrapeTimeout = []string{"aggregator:9090"}, "node-1", timeout
		err := o.Validate()
		if ok := want >= 0; (err == nil) != ok || !ok && !strings.Contains(err.Error(), "--scrape-timeout") || ok && o.timeout() != want {
			t.Errorf("--scrape-timeout %s at a 1s interval: %v, timeout %s; want %s (-1: refused)", timeout, err, o.timeout(), want)
		}
	}
	// --transport: grpc or framed; framed goes to the aggregators, never
	// through a relay.
	for _, c := range []struct {
		transport, relay, want string
	}{{"grpc", "", ""}, {"framed", "", ""}, {"http", "", `--transport "http"`}, {"framed", "relay:9091", "--transport=framed reaches the aggregators directly"}, {"grpc", "relay:9091", ""}} {
		o := NewOptions()
		o.Aggregators, o.NodeName, o.Transport, o.Relay = []string{"aggregator:9091"}, "node-1", c.transport, c.relay
		err := o.Validate()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("--transport %s --relay %q: %v; want %q", c.transport, c.relay, err, c.want)
		}
	}
}

func newScraper(t *testing.T, maxBytes int64) *httpScraper {
	t.Helper()
	ex, err := vllm.NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newHTTPScraper(ex, maxBytes, 16, false)
}

// TestScrapeAsksForIdentityAndReadsGzip: the agent asks for the text format
// uncompressed (vLLM's prometheus_client gzips whenever "gzip" appears in
// Accept-Encoding, q-values or not); a server that gzips anyway is read; an
// encoding it cannot read is a parse error naming it.
func TestScrapeAsksForIdentityAndReadsGzip(t *testing.T) {
	sim := vllmsim.New(vllmsim.Options{Engines: 2})
	sim.SetLoad(vllmsim.Load{Waiting: vllmsim.F(6), KVCacheUsage: vllmsim.F(0.5)})
	var accept, encoding string
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		accept, encoding = r.Header.Get("Accept"), r.Header.Get("Accept-Encoding")
		sim.Handler().ServeHTTP(w, r)
	})
	mux.HandleFunc("/always-gzip", func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Accept-Encoding", "gzip") // as a server that ignores the request's
		r.URL.Path = "/metrics"
		sim.Handler().ServeHTTP(w, r)
	})
	mux.HandleFunc("/br", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Encoding", "br")
		_, _ = w.Write([]byte{1, 2, 3})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	sc := newScraper(t, 8<<20)
	page, err := sc.Scrape(context.Background(), srv.URL+"/metrics", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(accept, "text/plain;version=0.0.4") || !strings.Contains(accept, "application/openmetrics-text") || encoding != "identity" {
		t.Fatalf("Accept %q, Accept-Encoding %q", accept, encoding)
	}
	if w, _ := page.Get(metric.Waiting); w != 6 {
		t.Fatalf("waiting = %v", w)
	}
	for range 3 { // pooled gzip readers and buffers are reused
		page, err = sc.Scrape(context.Background(), srv.URL+"/always-gzip", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if w, _ := page.Get(metric.Waiting); w != 6 {
			t.Fatalf("gzip page: waiting = %v", w)
		}
	}
	_, err = sc.Scrape(context.Background(), srv.URL+"/br", nil, nil)
	var se *ScrapeError
	if !errors.As(err, &se) || se.Reason != pulsev1.MissingReason_MISSING_REASON_PARSE || !strings.Contains(err.Error(), `"br"`) {
		t.Fatalf("br: %v", err)
	}
}

func TestScrapeErrorsHaveReasons(t *testing.T) {
	sim := vllmsim.New(vllmsim.Options{})
	mux := http.NewServeMux()
	mux.Handle("/metrics", sim.Handler())
	mux.HandleFunc("/500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", 500) })
	mux.HandleFunc("/go", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("go_goroutines 3\n")) })
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting{ 3\n"))
	})
	mux.HandleFunc("/proto", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.google.protobuf")
		_, _ = w.Write([]byte{1, 2})
	})
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	tests := map[string]struct {
		url      string
		maxBytes int64
		reason   pulsev1.MissingReason
	}{
		"too large":    {srv.URL + "/metrics", 1024, pulsev1.MissingReason_MISSING_REASON_TOO_LARGE},
		"http status":  {srv.URL + "/500", 8 << 20, pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS},
		"not vllm":     {srv.URL + "/go", 8 << 20, pulsev1.MissingReason_MISSING_REASON_NOT_VLLM},
		"parse":        {srv.URL + "/garbage", 8 << 20, pulsev1.MissingReason_MISSING_REASON_PARSE},
		"content type": {srv.URL + "/proto", 8 << 20, pulsev1.MissingReason_MISSING_REASON_PARSE},
		"timeout":      {srv.URL + "/hang", 8 << 20, pulsev1.MissingReason_MISSING_REASON_TIMEOUT},
		"refused":      {deadURL + "/metrics", 8 << 20, pulsev1.MissingReason_MISSING_REASON_CONNECT},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Only the page that hangs needs the deadline: the others'
			// reasons are the page's, however long a loaded machine
			// takes to fetch it (a 200 ms deadline for all of them made
			// a slow fetch a timeout).
			d := 10 * time.Second
			if tc.reason == pulsev1.MissingReason_MISSING_REASON_TIMEOUT {
				d = 200 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			_, err := newScraper(t, tc.maxBytes).Scrape(ctx, tc.url, nil, nil)
			var se *ScrapeError
			if !errors.As(err, &se) || se.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %v", err, tc.reason)
			}
		})
	}
}

func TestCatalogueDiff(t *testing.T) {
	c := newCatalogue()
	a := discovery.Target{UID: "a", Namespace: "ns", Pod: "a", Ready: true, URL: "http://x"}
	b := discovery.Target{UID: "b", Namespace: "ns", Pod: "b", URL: "http://y"}
	c.Set([]discovery.Target{a, b})
	_, first, _ := c.snapshot()
	full := DiffCatalogue(nil, first, true)
	if !full.Full || len(full.Upsert) != 2 {
		t.Fatalf("first catalogue = %v", full)
	}
	// b becomes ready, a goes, d arrives and takes a's freed id; each
	// says when it was created and became ready.
	b.Ready, b.Created, b.ReadySince = true, time.UnixMilli(1_700_000_000_000), time.UnixMilli(1_700_000_215_000)
	d := discovery.Target{UID: "d", Namespace: "ns", Pod: "d", Ready: true, URL: "http://z"}
	c.Set([]discovery.Target{b, d})
	_, second, _ := c.snapshot()
	delta := DiffCatalogue(first, second, false)
	if delta.Full || len(delta.Upsert) != 2 || len(delta.Remove) != 1 {
		t.Fatalf("delta = %v: want b and d upserted, a's id removed", delta)
	}
	for _, p := range delta.Upsert {
		if want := map[string][2]int64{"b": {1_700_000_000_000, 1_700_000_215_000}, "d": {0, 0}}[p.Uid]; p.CreatedUnixMs != want[0] || p.ReadySinceUnixMs != want[1] {
			t.Fatalf("%s: created %d, ready since %d; want %v (0: unknown)", p.Uid, p.CreatedUnixMs, p.ReadySinceUnixMs, want)
		}
	}
	if delta.Remove[0] != delta.Upsert[0].Id && delta.Remove[0] != delta.Upsert[1].Id {
		t.Fatalf("a's freed id was not reused by d: %v", delta)
	}
	if got := DiffCatalogue(second, second, false); len(got.Upsert)+len(got.Remove) != 0 {
		t.Fatalf("no change gave %v", got)
	}
}

// TestBadStaticTargetsBeforeAnythingElse: a bad --static-targets file is
// the first and only thing the agent says (it used to log its NVML line
// first, then fail).
func TestBadStaticTargetsBeforeAnythingElse(t *testing.T) {
	file := filepath.Join(t.TempDir(), "targets.yaml")
	if err := os.WriteFile(file, []byte("targets:\n  - pood: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewOptions()
	o.StaticTargets, o.Aggregators, o.NVML = file, []string{"127.0.0.1:1"}, gpu.ModeAuto
	var logs bytes.Buffer
	_, err := NewWithDeps(o, slog.New(slog.NewTextHandler(&logs, nil)), Deps{})
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("err = %v, want the file named", err)
	}
	if logs.Len() != 0 {
		t.Fatalf("logged before the error:\n%s", logs.String())
	}
}

// TestScrapeErrorTextAlwaysEncodes: a page's server chooses the status line
// the agent quotes (here `HTTP/1.1 503 \xff\xfe`), and a long valid error
// cut at a byte count can split a character: proto3 refuses to marshal a
// string that is not UTF-8, and before the text was cleaned the send failed
// on every tick and the node went stale. The text is now valid UTF-8, cut
// on a character's boundary, and the batch marshals.
func TestScrapeErrorTextAlwaysEncodes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("HTTP/1.1 503 \xff\xfe\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			}()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, serr := newScraper(t, 8<<20).Scrape(ctx, "http://"+ln.Addr().String()+"/metrics", nil, nil)
	if serr == nil {
		t.Fatal("a 503 scraped")
	}
	long := "scrape failed: " + strings.Repeat("€", 100) // 315 bytes: byte 200 is inside a character
	for name, text := range map[string]string{"status line": serr.Error(), "long": long} {
		got := wire.CleanText(text, maxErrorBytes)
		if !utf8.ValidString(got) || len(got) > maxErrorBytes {
			t.Fatalf("%s: %q (%d bytes) is not valid UTF-8 of at most %d bytes", name, got, len(got), maxErrorBytes)
		}
		var b pulsev1.SampleBatch
		wire.NewEncoder().Append(&b, &wire.Sample{Pod: 1, Missing: pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS, Error: got})
		if _, err := proto.Marshal(&b); err != nil {
			t.Fatalf("%s: the batch does not marshal: %v", name, err)
		}
	}
	if got := wire.CleanText(long, maxErrorBytes); !strings.HasPrefix(long, got) || len(got) != 198 {
		t.Fatalf("cut at %d bytes, want 198 (the last whole character)", len(got))
	}
	// The wire itself never sends what proto3 cannot marshal.
	var b pulsev1.SampleBatch
	wire.NewEncoder().Append(&b, &wire.Sample{Pod: 1, Missing: pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS, Error: "HTTP 503 \xff\xfe"})
	if _, err := proto.Marshal(&b); err != nil {
		t.Fatalf("the wire sent a string proto3 refuses: %v", err)
	}
}

// TestScrapeFollowsRedirectsOnlyWithinThePod: a pod's page redirecting to
// another address once had the agent fetch it (the agent is a client on the
// node's network); it now follows a redirect only to the pod it scraped.
func TestScrapeFollowsRedirectsOnlyWithinThePod(t *testing.T) {
	var other atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { other.Add(1) }))
	defer elsewhere.Close()
	sim := vllmsim.New(vllmsim.Options{})
	mux := http.NewServeMux()
	mux.Handle("/metrics", sim.Handler())
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/metrics", http.StatusFound) })
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/metrics", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := newScraper(t, 8<<20).Scrape(ctx, srv.URL+"/moved", nil, nil); err != nil {
		t.Fatalf("a redirect within the pod: %v", err)
	}
	_, err := newScraper(t, 8<<20).Scrape(ctx, srv.URL+"/away", nil, nil)
	var se *ScrapeError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "redirect to another host") || other.Load() != 0 {
		t.Fatalf("err %v, %d requests elsewhere; want the redirect refused and none", err, other.Load())
	}
}

// largePages serves /metrics (a simulated vLLM page), /big (one over
// smallPage) and /held (one over smallPage whose end is held back until
// unblock; held gets a value as each has written past smallPage).
func largePages(t *testing.T) (srv *httptest.Server, held <-chan struct{}, unblock func()) {
	t.Helper()
	release := make(chan struct{})
	wrote := make(chan struct{}, 2*largeSlots)
	big := bytes.Repeat([]byte("# padding line of a large page\n"), (smallPage+64<<10)/31)
	sim := vllmsim.New(vllmsim.Options{})
	mux := http.NewServeMux()
	mux.Handle("/metrics", sim.Handler())
	mux.HandleFunc("/held", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(big)
		w.(http.Flusher).Flush()
		wrote <- struct{}{}
		<-release
		_, _ = w.Write(sim.Page(false)) // the page whole, once let go
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(append(big, sim.Page(false)...)) })
	srv = httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	unblock = sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before srv.Close, which waits for the held requests
	return srv, wrote, unblock
}

// TestLargePagesWaitForEachOther: pages up to --max-page-bytes (8 MiB
// then) were read by up to 64 scrapes at once: one router naming 8
// workloads on an 8 MiB page took the real agent to 168 MB against its
// 128Mi limit. A page over 256 KiB now waits for one of 4 large reads: a
// fifth large page times out waiting, saying why, while a normal page is
// read at once beside them.
func TestLargePagesWaitForEachOther(t *testing.T) {
	defer func(d time.Duration) { largeReadHold = d }(largeReadHold)
	largeReadHold = time.Minute // the held reads keep their slots past the fifth's deadline
	srv, held, unblock := largePages(t)
	sc := newScraper(t, 1<<20)
	var wg sync.WaitGroup
	for range largeSlots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = sc.Scrape(context.Background(), srv.URL+"/held", nil, nil)
		}()
	}
	for range largeSlots {
		<-held // each has written past smallPage
	}
	// Each has read past smallPage and takes its slot.
	waitUntil(t, "every large read holds its slot", func() bool { return len(sc.large.all) >= largeSlots })
	// The deadline is what the scrape waits for a large read: long past a
	// loopback fetch of the page's first bytes, so that it ends waiting.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := sc.Scrape(ctx, srv.URL+"/big", nil, nil)
	var se *ScrapeError
	if !errors.As(err, &se) || se.Reason != pulsev1.MissingReason_MISSING_REASON_TIMEOUT || !strings.Contains(err.Error(), "waiting to read a page over") {
		t.Fatalf("a fifth large page: %v, want a timeout waiting for a large read", err)
	}
	if _, err := sc.Scrape(context.Background(), srv.URL+"/metrics", nil, nil); err != nil {
		t.Errorf("a normal page beside 4 large reads: %v", err)
	}
	unblock()
	wg.Wait()
}

// TestALargePageWaitingToParseHoldsNoLargeReadForLong: a large read's slot
// is held until its page is parsed, and a page read whole that waited for
// its namespace's parse share kept the slot however long, past the hold.
// Four namespaces whose parse shares were busy (their other pods' pages)
// held every large read, and another tenant's large page (a router's)
// timed out behind pages already read (found in a review, 2026-12-07).
func TestALargePageWaitingToParseHoldsNoLargeReadForLong(t *testing.T) {
	defer func(d time.Duration) { largeReadHold = d }(largeReadHold)
	largeReadHold = 20 * time.Millisecond
	srv, _, unblock := largePages(t)
	defer unblock()
	sc := newScraper(t, 1<<20)
	// Room to parse for everyone; one parse a namespace.
	sc.parses = newTenantSlots(2*largeSlots+2, 1)
	var releases []func()
	for i := range largeSlots { // each namespace's parse share busy
		r, ok := sc.parses.take(withTenant(context.Background(), fmt.Sprintf("team-%d", i)))
		if !ok {
			t.Fatal("parse share refused")
		}
		releases = append(releases, r)
	}
	var wg sync.WaitGroup
	errs := make([]error, largeSlots)
	for i := range largeSlots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Long enough for a machine under load (CI's race
			// detector beside other packages): the test is of what
			// waits, not of how long a read takes.
			ctx, cancel := context.WithTimeout(withTenant(context.Background(), fmt.Sprintf("team-%d", i)), 60*time.Second)
			defer cancel()
			_, errs[i] = sc.Scrape(ctx, srv.URL+"/big", nil, nil)
		}()
	}
	for deadline := time.Now().Add(50 * time.Second); ; time.Sleep(time.Millisecond) {
		sc.parses.mu.Lock()
		n := sc.parses.waiting
		sc.parses.mu.Unlock()
		if n == largeSlots {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 50 s, %d large pages read whole and waiting to parse, want %d", n, largeSlots)
		}
	}
	ctx, cancel := context.WithTimeout(withTenant(context.Background(), "victim"), time.Second) // 50 holds
	defer cancel()
	_, err := sc.Scrape(ctx, srv.URL+"/big", nil, nil)
	for _, r := range releases {
		r()
	}
	wg.Wait()
	if err != nil {
		t.Fatalf("another tenant's large page behind four pages read whole, waiting to parse: %v; want it read (a large read held at most largeReadHold while another waits)", err)
	}
	cut := 0
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), "not parsed within") {
			cut++
		}
	}
	if cut == 0 {
		t.Fatalf("no page waiting to parse was cut, naming the hold: %v", errs)
	}
}

// TestFewTenantsHoldNoLargeReadForLong: four namespaces' pods, each
// sending 257 KiB and then trickling, held every large read for each
// scrape's whole timeout, at every tick, and another tenant's large page
// (a router's) timed out behind them. A large read holds its slot for at
// most largeReadHold while another waits: one of theirs is cut, saying
// why, and the other tenant's page is read; with no one waiting, a slow
// page is read whole.
func TestFewTenantsHoldNoLargeReadForLong(t *testing.T) {
	srv, held, unblock := largePages(t)
	defer unblock()
	sc := newScraper(t, 1<<20)
	errs := make(chan error, largeSlots)
	for i := range largeSlots {
		go func() {
			ctx, cancel := context.WithTimeout(withTenant(context.Background(), fmt.Sprintf("team-%d", i)), time.Minute)
			defer cancel()
			_, err := sc.Scrape(ctx, srv.URL+"/held", nil, nil)
			errs <- err
		}()
	}
	for range largeSlots {
		<-held
	}
	waitUntil(t, "the four large reads hold their slots", func() bool { return len(sc.large.all) >= largeSlots })
	ctx, cancel := context.WithTimeout(withTenant(context.Background(), "victim"), time.Minute)
	defer cancel()
	if _, err := sc.Scrape(ctx, srv.URL+"/big", nil, nil); err != nil {
		t.Fatalf("another tenant's large page behind four held reads: %v; want it read once one of theirs is cut", err)
	}
	// One at least was cut for it, saying why.
	err := <-errs
	var se *ScrapeError
	if !errors.As(err, &se) || se.Reason != pulsev1.MissingReason_MISSING_REASON_TIMEOUT || !strings.Contains(err.Error(), "a large read's hold") {
		t.Fatalf("a trickling page: %v; want a timeout naming the large read's hold", err)
	}
	unblock()
	for range largeSlots - 1 {
		if err := <-errs; err != nil && !errors.As(err, &se) {
			t.Fatalf("a held page once let go: %v; want a page or a scrape's error", err)
		}
	}
}

// TestASlowLargePageIsReadWholeWhenNoneWaits: the large read's hold cut
// a busy server's page (an overloaded router's) with no other large read
// waiting, as a timeout, when scaling mattered most. It is cut only while
// another waits: alone, a page slower than the hold is read whole.
func TestASlowLargePageIsReadWholeWhenNoneWaits(t *testing.T) {
	defer func(d time.Duration) { largeReadHold = d }(largeReadHold)
	largeReadHold = 20 * time.Millisecond
	srv, held, unblock := largePages(t)
	sc := newScraper(t, 1<<20)
	errs := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(withTenant(context.Background(), "team-1"), time.Minute)
		defer cancel()
		_, err := sc.Scrape(ctx, srv.URL+"/held", nil, nil)
		errs <- err
	}()
	<-held
	waitUntil(t, "the large read holds its slot", func() bool { return len(sc.large.all) == 1 })
	time.Sleep(10 * sc.largeHold) // held ten times the hold, no one waiting
	unblock()
	if err := <-errs; err != nil {
		t.Fatalf("a slow page with no one waiting: %v; want it read whole", err)
	}
}

// endingBody is a page's rest that ends as its read's hold timer fires,
// and counts the times it is closed after its read returned.
type endingBody struct {
	hold  time.Duration
	read  bool
	ended atomic.Bool
	late  *atomic.Int32
}

func (b *endingBody) Read([]byte) (int, error) {
	if !b.read {
		b.read = true
		time.Sleep(b.hold)
	}
	return 0, io.EOF
}

func (b *endingBody) Close() error {
	if b.ended.Load() {
		b.late.Add(1)
	}
	return nil
}

// TestALargeReadsHoldEndsWithIt: a hold timer that fired as its read
// ended ran after the read stopped it, and armed itself again every fifth
// of the hold, holding the page, for as long as no other large read
// waited: a tenant whose pages end about the hold's time, every second,
// made the node's agent keep timers and wake-ups without bound. Once a
// read has returned, its timer does nothing: with another large read
// waiting, none closes its page.
func TestALargeReadsHoldEndsWithIt(t *testing.T) {
	s := &httpScraper{maxBytes: 1 << 20, large: newTenantSlots(largeSlots, 1), largeHold: 2 * time.Millisecond}
	var late atomic.Int32
	for range 500 {
		b := &endingBody{hold: s.largeHold, late: &late}
		if err := s.readRest(context.Background(), "u", &http.Response{Body: b}, b, new(bytes.Buffer)); err != nil {
			t.Fatal(err)
		}
		b.ended.Store(true)
	}
	time.Sleep(20 * s.largeHold) // any timer left armed fires meanwhile
	s.large.queued.Store(1)      // a large read waits: a live hold closes its page
	defer s.large.queued.Store(0)
	time.Sleep(20 * s.largeHold)
	if n := late.Load(); n > 0 {
		t.Fatalf("%d holds closed their page after its read returned", n)
	}
}

// TestOneTenantReadsOneLargePageAtATime: four pods of one namespace that
// sent 257 KiB and then trickled held all four large reads, and every
// other tenant's page over 256 KiB timed out behind them. A namespace now
// reads one large page at a time: its others wait, another tenant's is
// read. Parses are bounded too: with every parse slot taken, a scrape
// waits for one within its timeout. Pages are read from the pod, never
// through a proxy of the agent's environment.
func TestOneTenantReadsOneLargePageAtATime(t *testing.T) {
	defer func(d time.Duration) { largeReadHold = d }(largeReadHold)
	largeReadHold = time.Minute // a's held read keeps its slot while b's is read
	srv, held, unblock := largePages(t)
	sc := newScraper(t, 1<<20)
	if tr := sc.client.Transport.(*http.Transport); tr.Proxy != nil {
		t.Error("the scraper's transport reads a proxy from the environment")
	}
	var wg sync.WaitGroup
	for range largeSlots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(withTenant(context.Background(), "a"), 5*time.Second)
			defer cancel()
			_, _ = sc.Scrape(ctx, srv.URL+"/held", nil, nil)
		}()
	}
	for range largeSlots {
		<-held // each has written past smallPage
	}
	waitUntil(t, "a large read holds its slot", func() bool { return len(sc.large.all) >= 1 })
	if n := len(sc.large.all); n != 1 {
		t.Fatalf("namespace a holds %d large reads, want 1", n)
	}
	bctx, bcancel := context.WithTimeout(withTenant(context.Background(), "b"), 5*time.Second)
	defer bcancel()
	if _, err := sc.Scrape(bctx, srv.URL+"/big", nil, nil); err != nil {
		t.Fatalf("namespace b's large page beside namespace a's held reads: %v", err)
	}
	for range cap(sc.parses.all) {
		sc.parses.all <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(withTenant(context.Background(), "b"), 2*time.Second) // long past a loopback fetch
	defer cancel()
	_, err := sc.Scrape(ctx, srv.URL+"/metrics", nil, nil)
	if !strings.Contains(fmt.Sprint(err), "waiting to parse") {
		t.Fatalf("a scrape with every parse slot taken: %v, want a timeout waiting to parse", err)
	}
	for range cap(sc.parses.all) {
		<-sc.parses.all
	}
	unblock()
	wg.Wait()
	sc.large.mu.Lock()
	defer sc.large.mu.Unlock()
	if len(sc.large.by) != 0 || len(sc.large.all) != 0 || sc.large.waiting != 0 {
		t.Fatalf("after the reads: %d tenants' slots and %d large reads held, want none", len(sc.large.by), len(sc.large.all))
	}
}

// TestOneTenantParsesHalfThePagesAtOnce: the parse slots were shared with
// no bound a namespace, so one namespace's pages just under the large-read
// size (some 30 ms of parsing each) held them all, and other tenants'
// scrapes timed out waiting to parse. A namespace parses at most half the
// pages at once: with its half held, its next waits and another's parses.
func TestOneTenantParsesHalfThePagesAtOnce(t *testing.T) {
	if s := newParseSlots(1); cap(s.all) != 2 || s.per != 1 {
		t.Fatalf("on one CPU: %d parses, %d a namespace; want 2 and 1", cap(s.all), s.per)
	}
	if s := newParseSlots(8); cap(s.all) != 8 || s.per != 4 {
		t.Fatalf("on eight CPUs: %d parses, %d a namespace; want 8 and 4", cap(s.all), s.per)
	}
	sc := newScraper(t, 1<<20)
	srv := httptest.NewServer(vllmsim.New(vllmsim.Options{Engines: 1}).Handler())
	defer srv.Close()
	a := withTenant(context.Background(), "a")
	var releases []func()
	for range sc.parses.per {
		release, ok := sc.parses.take(a)
		if !ok {
			t.Fatal("namespace a's own share of the parses refused")
		}
		releases = append(releases, release)
	}
	actx, acancel := context.WithTimeout(a, 2*time.Second) // long past a loopback fetch
	defer acancel()
	if _, err := sc.Scrape(actx, srv.URL+"/metrics", nil, nil); !strings.Contains(fmt.Sprint(err), "waiting to parse") {
		t.Fatalf("namespace a past its half of the parses: %v, want a timeout waiting to parse", err)
	}
	bctx, bcancel := context.WithTimeout(withTenant(context.Background(), "b"), 5*time.Second)
	defer bcancel()
	if _, err := sc.Scrape(bctx, srv.URL+"/metrics", nil, nil); err != nil {
		t.Fatalf("namespace b's page beside namespace a's parses: %v", err)
	}
	for _, r := range releases {
		r()
	}
}

// waitUntil polls cond until it holds, failing the test after 10 s (a
// loop with no bound hung to the test binary's timeout, naming nothing).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, still not: %s", what)
		}
	}
}

// TestAGPUReadFromBeforeAPodIsListedIsNotItsOwn: the pod-resources API
// names a pod, not its uid; a pod recreated under its name (a
// StatefulSet's) carried its predecessor's GPU values, from a read begun
// before it existed, for up to gpuStale intervals. A read counts for a pod
// only if what it read began after the agent listed the pod (one clock:
// a pod's creationTimestamp is the API server's).
func TestAGPUReadFromBeforeAPodIsListedIsNotItsOwn(t *testing.T) {
	a := newIdleAgent(t)
	a.SetTargets([]discovery.Target{{UID: "uid-old", Namespace: "demo", Pod: "llama-0"}})
	from := time.Now().Add(time.Millisecond)
	a.gpuPods.Store(&gpuRead{from: from, at: from, pods: map[string]gpu.PodGPU{
		"demo/llama-0": {Utilization: 0.5, HasUtilization: true, Memory: 0.25, HasMemory: true}}})
	read := func(uid string) (float64, bool, float64, bool) {
		var page vllm.Page
		a.addGPU(discovery.Target{UID: uid, Namespace: "demo", Pod: "llama-0"}, &page)
		u, hasU := page.Get(metric.GPUUtilization)
		m, hasM := page.Get(metric.GPUMemoryUsage)
		return u, hasU, m, hasM
	}
	if u, hasU, m, hasM := read("uid-old"); !hasU || !hasM || u != 0.5 || m != 0.25 {
		t.Fatalf("the pod listed before the read: utilization %v (%v), memory %v (%v); want the read's", u, hasU, m, hasM)
	}
	// Recreated under its name, listed after the read began: not its own.
	began := time.Now()
	a.SetTargets([]discovery.Target{{UID: "uid-new", Namespace: "demo", Pod: "llama-0"}})
	a.gpuPods.Store(&gpuRead{from: began, at: began, pods: map[string]gpu.PodGPU{
		"demo/llama-0": {Utilization: 0.5, HasUtilization: true, Memory: 0.25, HasMemory: true}}})
	if _, hasU, _, hasM := read("uid-new"); hasU || hasM {
		t.Fatal("the pod recreated under its name read its predecessor's GPU values")
	}
	// A read begun after it was listed is its own; listed again, it keeps
	// its first listing.
	a.SetTargets([]discovery.Target{{UID: "uid-new", Namespace: "demo", Pod: "llama-0"}})
	from = time.Now().Add(time.Millisecond)
	a.gpuPods.Store(&gpuRead{from: from, at: from, pods: map[string]gpu.PodGPU{"demo/llama-0": {Utilization: 0.75, HasUtilization: true}}})
	if u, hasU, _, _ := read("uid-new"); !hasU || u != 0.75 {
		t.Fatalf("a read begun after the pod was listed: %v (%v), want 0.75", u, hasU)
	}
}

// heldDemandScraper records the arrivals each ScrapeDemand is handed, and
// holds the first until release is closed.
type heldDemandScraper struct {
	mu      sync.Mutex
	arrs    [][]*vllm.Arrivals
	entered chan struct{}
	release chan struct{}
}

func (b *heldDemandScraper) Scrape(context.Context, string, *vllm.Demand, *vllm.Counters) (vllm.Page, error) {
	return vllm.Page{}, nil
}

func (b *heldDemandScraper) ScrapeDemand(_ context.Context, _ string, ds []*vllm.Demand, arrs []*vllm.Arrivals) ([]vllm.Page, []error) {
	b.mu.Lock()
	b.arrs = append(b.arrs, arrs)
	first := len(b.arrs) == 1
	b.mu.Unlock()
	if first {
		close(b.entered)
		<-b.release
	}
	return make([]vllm.Page, len(ds)), make([]error, len(ds))
}

// TestARoutersEntriesAreScrapedOnceAtATimeWhateverItsURL: a router's
// scrape unit, and so its in-flight guard, was keyed by its page's URL
// too; its pulse.io/port edited while a scrape of it ran, the next tick
// started a second scrape of the same entries, handed the same arrivals'
// state (used by one scrape at a time: a concurrent map write ends the
// agent, every tenant of the node with it). The unit is the router's,
// whatever its URL: the second is skipped while the first runs.
func TestARoutersEntriesAreScrapedOnceAtATimeWhateverItsURL(t *testing.T) {
	a := newIdleAgent(t)
	bs := &heldDemandScraper{entered: make(chan struct{}), release: make(chan struct{})}
	a.scraper = bs
	d := &vllm.Demand{Metrics: []string{"requests_total"}, Label: "model", Match: "llama", Arrivals: true}
	tg := discovery.Target{UID: "router/demand/llama", Namespace: "ns", Pod: "router", Ready: true, URL: "http://10.0.0.9:8000/metrics", Demand: d}
	unit := func() (string, []discovery.Target) {
		units := scrapeUnits(map[uint32]discovery.Target{1: tg})
		if len(units) != 1 {
			t.Fatalf("%d units of one router's entry", len(units))
		}
		for k, tgs := range units {
			return k, tgs
		}
		return "", nil
	}
	a.SetTargets([]discovery.Target{tg})
	key1, u1 := unit()
	if a.startScrape(key1, "ns") == nil {
		t.Fatal("the first scrape was not started")
	}
	done := make(chan struct{})
	go func() { defer close(done); defer a.endScrape(key1); a.scrapeDemand(context.Background(), u1) }()
	<-bs.entered

	tg.URL = "http://10.0.0.9:9000/metrics" // the tenant edits pulse.io/port
	a.SetTargets([]discovery.Target{tg})
	key2, _ := unit()
	started := a.startScrape(key2, "ns") != nil
	close(bs.release)
	<-done
	if started {
		a.endScrape(key2)
		t.Fatalf("a second scrape of the router's entries started (unit %q) while the first (unit %q) ran", key2, key1)
	}
	if a.startScrape(key2, "ns") == nil {
		t.Fatal("the router's next scrape, the first one done, was skipped")
	}
	a.endScrape(key2)
}
