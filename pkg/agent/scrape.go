package agent

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-io/pulse/pkg/vllm"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Scraper reads one target's page; counters is the pod's counter state
// (see vllm.Counters), used by one scrape at a time.
type Scraper interface {
	// Scrape reads a model server's page, or with demand set a demand
	// source's series for one workload.
	Scrape(ctx context.Context, url string, demand *vllm.Demand, counters *vllm.Counters) (vllm.Page, error)
	// ScrapeDemand reads a demand source's page once and its series for
	// each of demands: a page and an error for each. arrs, nil or one per
	// demand, is each demand's arrival state (vllm.Arrivals; nil: none).
	ScrapeDemand(ctx context.Context, url string, demands []*vllm.Demand, arrs []*vllm.Arrivals) ([]vllm.Page, []error)
}

// ScrapeError is a failed scrape with its reason.
type ScrapeError struct {
	Reason pulsev1.MissingReason
	Err    error
}

func (e *ScrapeError) Error() string { return e.Err.Error() }
func (e *ScrapeError) Unwrap() error { return e.Err }

// acceptHeader asks for the text format first and OpenMetrics second:
// pulse reads both (see pkg/vllm), and the text format is the smaller
// page. Servers that ignore q-values take it as asking for OpenMetrics
// (prometheus_client's choose_encoder, which vLLM's and SGLang's pages
// use, picks OpenMetrics whenever it is named), and pulse reads that.
const acceptHeader = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5"

// acceptEncoding asks for the page uncompressed. On a pod network gzip costs
// more CPU (the server's to compress, the agent's to inflate) than the bytes
// it saves are worth, and a preference cannot be expressed with q-values:
// vLLM serves /metrics with prometheus_client, whose gzip_accepted compresses
// whenever "gzip" appears in Accept-Encoding at all. A server that sends gzip
// anyway is still read.
const acceptEncoding = "identity"

// A page up to smallPage bytes (vLLM's are 5–40 KB an engine; a V1
// server's data-parallel engines repeat its histograms, about 33 KB each)
// is read at once; a larger one (up to --max-page-bytes) first waits for
// one of largeSlots, within its scrape's timeout. So the page bytes in
// flight are bounded
// (--max-concurrent-scrapes × smallPage, plus largeSlots × --max-page-bytes)
// whatever the pods serve, and pods with large pages wait for each other,
// never for the others; a tenant (namespace) reads one large page at a
// time, so that one tenant's pods cannot hold every large read, and holds
// it (through the page's parse) while another waits for at most
// largeReadHold reading and as long again waiting for the parse, so that
// a few tenants' cannot either. Only
// small buffers are kept for reuse.
const (
	smallPage       = 256 << 10
	largeSlots      = 4
	maxPooledBuffer = 2 * smallPage // a read of smallPage+1 may grow it this far
)

// largeReadHold bounds how long a large read holds its slot: the rest of a
// page (at most --max-page-bytes, 1 MiB by default) comes in milliseconds
// from a pod on the node's network, once its server has sent the first
// 256 KiB. (A variable for the tests.)
var largeReadHold = 250 * time.Millisecond

var pageBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// httpScraper fetches pages over HTTP with keep-alive connections.
type httpScraper struct {
	client    *http.Client
	extractor *vllm.Extractor
	maxBytes  int64
	// large: the reads of pages over smallPage, largeSlots at once and
	// one a tenant.
	large *tenantSlots
	// parses: the pages parsed at once, and half of them a tenant's.
	// Parsing is CPU's work, and a parsed page takes some ten times its
	// bytes: the pages in flight are bounded, their parses are bounded
	// too, and one namespace's pages just under smallPage (some 30 ms of
	// parsing each) cannot take every parse.
	parses *tenantSlots
	// largeHold: largeReadHold when the scraper was made.
	largeHold time.Duration
}

// tenantSlots bounds what is under way in all (all's capacity) and of each
// tenant (per, or an equal share of all: share): a tenant past its own
// waits while another's goes.
type tenantSlots struct {
	all chan struct{}
	mu  sync.Mutex
	per int            // a tenant's slots
	by  map[string]int // the slots each tenant holds; only tenants holding one
	// freed is closed, and replaced, when a tenant's slot is given back or
	// per grows, if waiting: a tenant at its bound waits for it.
	freed   chan struct{}
	waiting int
	// queued: takes waiting for one of all (a large read held past
	// largeReadHold is cut only while one waits).
	queued atomic.Int32
}

func newTenantSlots(all, per int) *tenantSlots {
	return &tenantSlots{all: make(chan struct{}, all), per: per, by: map[string]int{}, freed: make(chan struct{})}
}

// tenantKey carries the scrape's tenant (the pod's namespace) in its
// context: withTenant.
type tenantKey struct{}

// withTenant is ctx for a scrape of a pod of namespace ns.
func withTenant(ctx context.Context, ns string) context.Context {
	return context.WithValue(ctx, tenantKey{}, ns)
}

var _ Scraper = (*httpScraper)(nil)

func newHTTPScraper(ex *vllm.Extractor, maxBytes int64, maxPods int, insecureSkipVerify bool) *httpScraper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if insecureSkipVerify {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the operator's choice, --https-insecure-skip-verify
	}
	// Idle connections: two a pod, and in all two for each pod the agent
	// may list. A bound of --max-concurrent-scrapes in all closed, after
	// each tick, the connections of the pods past it, and they paid a
	// handshake at every scrape.
	tr.MaxIdleConns = 2 * maxPods
	tr.MaxIdleConnsPerHost = 2
	tr.IdleConnTimeout = 90 * time.Second
	// A pod's server chooses its headers: bound them (vLLM's are a few
	// hundred bytes).
	tr.MaxResponseHeaderBytes = maxResponseHeaderBytes
	// A pod's page is read from the pod, never through a proxy the
	// agent's environment names.
	tr.Proxy = nil
	// HTTP/1.1 alone: over HTTP/2 (an https pod), a pod's server may go on
	// sending DATA frames on a stream whose response is complete, and Go's
	// client drops them and returns their flow control, so the pod
	// streamed into the agent (225 MiB a second) on a connection kept for
	// the next scrape, outside every timeout, slot and --max-page-bytes.
	// HTTP/1.1 closes a connection that sends what was not asked for.
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	return &httpScraper{client: &http.Client{Transport: tr, CheckRedirect: sameHostRedirect}, extractor: ex, maxBytes: maxBytes,
		large: newTenantSlots(largeSlots, 1), parses: newParseSlots(runtime.GOMAXPROCS(0)), largeHold: largeReadHold}
}

// newParseSlots: max(procs, 2) parses at once, half of them (at least one)
// a tenant's.
func newParseSlots(procs int) *tenantSlots {
	n := max(procs, 2)
	return newTenantSlots(n, max(n/2, 1))
}

// take waits for a slot: the scrape's tenant's own (a scrape with no
// tenant has none), then one of all.
func (t *tenantSlots) take(ctx context.Context) (release func(), ok bool) {
	tenant, _ := ctx.Value(tenantKey{}).(string)
	if tenant == "" {
		t.queued.Add(1)
		defer t.queued.Add(-1)
		select {
		case t.all <- struct{}{}:
			return func() { <-t.all }, true
		case <-ctx.Done():
			return nil, false
		}
	}
	for {
		t.mu.Lock()
		if t.by[tenant] < t.per {
			t.by[tenant]++
			t.mu.Unlock()
			break
		}
		t.waiting++
		freed := t.freed
		t.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			t.mu.Lock()
			t.waiting--
			t.mu.Unlock()
			return nil, false
		}
		t.mu.Lock()
		t.waiting--
		t.mu.Unlock()
	}
	t.queued.Add(1)
	defer t.queued.Add(-1)
	select {
	case t.all <- struct{}{}:
	case <-ctx.Done():
		t.give(tenant)
		return nil, false
	}
	return func() { <-t.all; t.give(tenant) }, true
}

// give gives back a slot of tenant's.
func (t *tenantSlots) give(tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by[tenant]--; t.by[tenant] <= 0 {
		delete(t.by, tenant)
	}
	t.wake()
}

// wake lets every tenant waiting look again. Called with t.mu held.
func (t *tenantSlots) wake() {
	if t.waiting > 0 {
		close(t.freed)
		t.freed = make(chan struct{})
	}
}

// share gives each of n tenants an equal share of the slots (at least
// one): all of them to one tenant, half to each of two, a third to each of
// three. A tenant holding more than its new share keeps what it holds,
// and takes no more until it is below it.
func (t *tenantSlots) share(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	per := max(cap(t.all)/max(n, 1), 1)
	if per > t.per {
		t.wake()
	}
	t.per = per
}

// bounds are the slots in all, and a tenant's.
func (t *tenantSlots) bounds() (all, per int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return cap(t.all), t.per
}

// maxResponseHeaderBytes bounds a page's response headers.
const maxResponseHeaderBytes = 64 << 10

// sameHostRedirect follows at most 3 redirects, each to the pod it was
// sent to: a pod's server must not turn the agent (which reaches every
// pod of its node, and the node) into a client of any other address.
func sameHostRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 3 {
		return errors.New("stopped after 3 redirects")
	}
	if req.URL.Host != via[0].URL.Host {
		return fmt.Errorf("redirect to another host (%s) refused", req.URL.Host)
	}
	return nil
}

// Scrape fetches and extracts one page. Its error is a *ScrapeError.
func (s *httpScraper) Scrape(ctx context.Context, url string, demand *vllm.Demand, counters *vllm.Counters) (vllm.Page, error) {
	var page vllm.Page
	err := s.fetch(ctx, url, func(body []byte) error {
		var err error
		if demand != nil {
			page, err = s.extractor.ExtractDemand(body, demand, nil)
		} else {
			page, err = s.extractor.ExtractWith(body, counters)
		}
		return extractError(url, err)
	})
	return page, err
}

// ScrapeDemand fetches a demand source's page once and extracts each of
// demands from it (read once for all that read the same metrics). Each error is a *ScrapeError: the page's, for all, or
// one demand's.
func (s *httpScraper) ScrapeDemand(ctx context.Context, url string, demands []*vllm.Demand, arrs []*vllm.Arrivals) ([]vllm.Page, []error) {
	pages, errs := make([]vllm.Page, len(demands)), make([]error, len(demands))
	err := s.fetch(ctx, url, func(body []byte) error {
		var extracted []error
		pages, extracted = s.extractor.ExtractDemands(body, demands, arrs)
		for i, err := range extracted {
			errs[i] = extractError(url, err)
		}
		return nil
	})
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return pages, errs
}

// extractError is an extraction's error as a *ScrapeError (nil for nil).
func extractError(url string, err error) error {
	switch {
	case errors.Is(err, vllm.ErrNotVLLM):
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_NOT_VLLM, fmt.Errorf("scrape %s: %w", url, err)}
	case err != nil:
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_PARSE, fmt.Errorf("scrape %s: %w", url, err)}
	}
	return nil
}

// fetch reads url's page into a reused buffer and hands it to use, which
// keeps nothing of it. Its error is a *ScrapeError.
func (s *httpScraper) fetch(ctx context.Context, url string, use func(body []byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_CONNECT, fmt.Errorf("scrape %s: %w", url, err)}
	}
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("Accept-Encoding", acceptEncoding)
	resp, err := s.client.Do(req)
	if err != nil {
		return classify(ctx, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS, fmt.Errorf("scrape %s: HTTP %s", url, resp.Status)}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		if mt != "text/plain" && mt != "application/openmetrics-text" {
			return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_PARSE, fmt.Errorf("scrape %s: content type %q is neither Prometheus text nor OpenMetrics", url, ct)}
		}
	}
	body, err := s.body(ctx, url, resp)
	if err != nil {
		return err
	}
	if c, ok := body.(io.Closer); ok {
		defer func() { _ = c.Close() }()
	}
	// The page is read into a reused buffer; the cap applies to the page as
	// parsed (after gzip).
	buf := pageBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledBuffer {
			pageBuffers.Put(buf)
		}
	}()
	first := min(s.maxBytes, smallPage)
	if _, err := buf.ReadFrom(io.LimitReader(body, first+1)); err != nil {
		return classifyRead(ctx, url, err, s.maxBytes)
	}
	large := int64(buf.Len()) > first && s.maxBytes > smallPage
	if large {
		release, ok := s.large.take(ctx)
		if !ok {
			return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TIMEOUT, fmt.Errorf("scrape %s: timed out waiting to read a page over %d bytes (%d such reads at once, one a namespace)", url, smallPage, largeSlots)}
		}
		defer release()
		if err := s.readRest(ctx, url, resp, body, buf); err != nil {
			return err
		}
	}
	if int64(buf.Len()) > s.maxBytes {
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TOO_LARGE, fmt.Errorf("scrape %s: page is over %d bytes (--max-page-bytes; a vLLM V1 server repeats its histograms for each data-parallel engine, about 33 KB an engine: raise it for one of 32 engines or more)", url, s.maxBytes)}
	}
	release, err := s.parseTurn(ctx, url, large)
	if err != nil {
		return err
	}
	defer release()
	// Nothing is kept of the buffer: values are parsed out of it.
	return use(buf.Bytes())
}

// parseTurn waits for the page's parse. A large page (its large read's
// slot held, and held through its parse) waits at most largeReadHold while
// another large read waits, as its read does: read whole, four
// namespaces' large pages waiting for their namespaces' parses (their
// other pods' pages) held every large read for about the scrape's whole
// timeout, at every tick, and another tenant's large page (a router's)
// timed out behind them (found in a review, 2026-12-07).
func (s *httpScraper) parseTurn(ctx context.Context, url string, large bool) (func(), error) {
	wctx := ctx
	if large {
		var cut context.CancelFunc
		wctx, cut = context.WithCancel(ctx)
		defer cut()
		defer s.hold(cut)()
	}
	release, ok := s.parses.take(wctx)
	switch {
	case ok:
		return release, nil
	case large && ctx.Err() == nil:
		return nil, &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TIMEOUT, fmt.Errorf("scrape %s: a page over %d bytes not parsed within %s of its read, another large read waiting (a large read's hold)", url, smallPage, s.largeHold)}
	}
	all, per := s.parses.bounds()
	return nil, &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TIMEOUT, fmt.Errorf("scrape %s: timed out waiting to parse the page (%d parses at once, %d a namespace)", url, all, per)}
}

// hold calls cut once the large read's slot has been held largeHold while
// another large read waits (looked at again every fifth of the hold while
// none waits), until the returned stop is called.
func (s *httpScraper) hold(cut func()) (stop func()) {
	var mu sync.Mutex // the timer's look against the stop
	var timer *time.Timer
	done := false // stopped: the timer does nothing more
	mu.Lock()
	timer = time.AfterFunc(s.largeHold, func() {
		mu.Lock()
		defer mu.Unlock()
		// A timer that fired as the hold ended ran after its Stop, and
		// armed itself again every fifth of the hold, holding the page,
		// while no other large read waited.
		if done {
			return
		}
		if s.large.queued.Load() > 0 {
			cut()
			return
		}
		timer.Reset(s.largeHold / 5) // looked at again, a fifth of the hold later
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		done = true
		timer.Stop()
		mu.Unlock()
	}
}

// readRest reads the rest of a large page (its slot taken) into buf. The
// slot is held for at most largeReadHold: four namespaces' pods, each
// sending 257 KiB and then trickling, held every large read for each
// scrape's whole timeout, at every tick, and another tenant's large page
// (a router's) timed out behind them. It is cut only while another waits
// for a large read: a busy server's page (an overloaded router's) is read
// whole when none does.
func (s *httpScraper) readRest(ctx context.Context, url string, resp *http.Response, body io.Reader, buf *bytes.Buffer) error {
	var cut atomic.Bool
	stop := s.hold(func() {
		cut.Store(true)
		_ = resp.Body.Close()
	})
	_, err := buf.ReadFrom(io.LimitReader(body, s.maxBytes+1-int64(buf.Len())))
	stop()
	switch {
	case err != nil && cut.Load():
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TIMEOUT, fmt.Errorf("scrape %s: the rest of a page over %d bytes not read within %s of its turn, another waiting (a large read's hold)", url, smallPage, s.largeHold)}
	case err != nil:
		return classifyRead(ctx, url, err, s.maxBytes)
	}
	return nil
}

// body is resp's page as sent (the response's body) or inflated (a gzip
// reader, to close).
func (s *httpScraper) body(ctx context.Context, url string, resp *http.Response) (io.Reader, error) {
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "", "identity":
		return struct{ io.Reader }{resp.Body}, nil // the response's body is closed by its reader
	case "gzip":
		// Only a server that ignores Accept-Encoding: identity gets here
		// (the transport inflates nothing for a request that sets it).
		// The compressed body is bounded too: one that inflates to
		// nothing (empty deflate blocks, empty members) was read at the
		// network's pace until the scrape's timeout, a CPU for each.
		zr, err := gzip.NewReader(&boundedBody{r: resp.Body, n: s.maxBytes})
		if err != nil {
			if ctx.Err() == nil && err == io.EOF { //nolint:errorlint // gzip's own io.EOF: no byte at all
				// No body: the page's fault. One cut within the header
				// (io.ErrUnexpectedEOF) may be the network's, a pod killed
				// mid-answer, as one cut in the deflate data is.
				err = gzip.ErrHeader
			}
			return nil, classifyRead(ctx, url, err, s.maxBytes) // a timeout in the header is one
		}
		return zr, nil
	default:
		return nil, &ScrapeError{pulsev1.MissingReason_MISSING_REASON_PARSE, fmt.Errorf("scrape %s: content encoding %q: want identity or gzip", url, enc)}
	}
}

// boundedBody reads at most n bytes of r, then fails with
// errCompressedOver: a compressed page's bound.
type boundedBody struct {
	r io.Reader
	n int64
}

var errCompressedOver = errors.New("compressed page over --max-page-bytes")

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errCompressedOver
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	k, err := b.r.Read(p)
	b.n -= int64(k)
	return k, err
}

// classifyRead is classify for a failed read of the page: a compressed
// page past its bound is too large, not a failure of the network.
// A gzip body that is not gzip (a bad header or checksum, corrupt deflate
// data) is the page's fault, parse, not the network's: it read as connect.
func classifyRead(ctx context.Context, url string, err error, maxBytes int64) error {
	var corrupt flate.CorruptInputError
	switch {
	case errors.Is(err, errCompressedOver):
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TOO_LARGE, fmt.Errorf("scrape %s: compressed page is over %d bytes (--max-page-bytes)", url, maxBytes)}
	case errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt):
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_PARSE, fmt.Errorf("scrape %s: compressed page: %w", url, err)}
	}
	return classify(ctx, url, err)
}

func classify(ctx context.Context, url string, err error) error {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_TIMEOUT, fmt.Errorf("scrape %s: timed out: %w", url, err)}
	}
	return &ScrapeError{pulsev1.MissingReason_MISSING_REASON_CONNECT, fmt.Errorf("scrape %s: %w", url, err)}
}
