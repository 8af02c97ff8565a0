package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestSoakJudgesLeaks(t *testing.T) {
	series := func(heap func(i int) float64, goroutines func(i int) float64) *soakResult {
		r := &soakResult{}
		for i := range 61 {
			r.Samples = append(r.Samples, soakSample{Seconds: float64(i) * 30, HeapInuse: heap(i), Goroutines: goroutines(i), FDs: 40})
		}
		r.fit()
		return r
	}
	flat := func(int) float64 { return 1000 }
	wobble := func(i int) float64 { return 100e6 + float64(i%3)*1e6 }
	tests := map[string]struct {
		r        *soakResult
		leak     bool
		contains string
	}{
		"steady":              {r: series(wobble, flat)},
		"heap grows 20 %":     {r: series(func(i int) float64 { return 100e6 + float64(i)*0.5e6 }, flat), leak: true, contains: "heap grew"},
		"goroutines grow":     {r: series(wobble, func(i int) float64 { return 1000 + float64(i) }), leak: true, contains: "goroutines grew"},
		"start-up is ignored": {r: series(func(i int) float64 { return 100e6 + float64(min(i, 15))*2e6 }, flat)},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if tt.r.Leak != tt.leak || !strings.Contains(tt.r.LeakReason, tt.contains) {
				t.Errorf("leak %v (%q), want %v (%q); heap slope %.0f B/h", tt.r.Leak, tt.r.LeakReason, tt.leak, tt.contains, tt.r.HeapSlopeBytesPerHour)
			}
		})
	}
}

func TestProxyHoldsTrafficWhilePartitioned(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	from := make(chan net.Addr, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from <- c.RemoteAddr()
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	p, err := newProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// A client of its own address, as the fleet's agents are.
	client := net.IPv4(127, 1, 0, 9)
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: client}}).Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	echo := func(msg string, within time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		buf := make([]byte, len(msg))
		n, err := io.ReadFull(c, buf)
		return string(buf[:n]), err
	}
	if got, err := echo("one", 5*time.Second); got != "one" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	if a := (<-from).(*net.TCPAddr); !a.IP.Equal(client) {
		t.Errorf("the upstream saw the proxy's connection from %v, want the client's %v (the aggregator bounds the connections of one address)", a.IP, client)
	}
	p.Partition()
	if got, err := echo("two", 300*time.Millisecond); err == nil {
		t.Fatalf("partitioned, the echo came back: %q", got)
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "two" {
		t.Fatalf("after the heal: %q, %v; want what was held", buf, err)
	}
}

func TestParseMetricsSumsFamiliesAndKeepsSeries(t *testing.T) {
	page := `# TYPE pulse_aggregator_pod_samples_total counter
pulse_aggregator_pod_samples_total{outcome="ok"} 10
pulse_aggregator_pod_samples_total{outcome="missing"} 2
# TYPE go_goroutines gauge
go_goroutines 7
`
	m, err := parseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"pulse_aggregator_pod_samples_total": 12, "pulse_aggregator_pod_samples_total{outcome=ok}": 10, "go_goroutines": 7} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if _, err := parseMetrics(strings.NewReader("not a page {")); err == nil {
		t.Error("a broken page parsed")
	}
}

// TestGetMetricsHandlingQuantile: the server-side p99 is read from the aggregator's
// grpc_server_handling_seconds buckets of GetMetrics (not another method's)
// as they grew over the measurement.
func TestGetMetricsHandlingQuantile(t *testing.T) {
	page := func(b1, b2, b3, count int) map[string]float64 {
		m, err := parseMetrics(strings.NewReader(fmt.Sprintf(`# TYPE grpc_server_handling_seconds histogram
grpc_server_handling_seconds_bucket{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="0.0005"} %d
grpc_server_handling_seconds_bucket{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="0.001"} %d
grpc_server_handling_seconds_bucket{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="0.002"} %d
grpc_server_handling_seconds_bucket{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="+Inf"} %d
grpc_server_handling_seconds_sum{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary"} 1
grpc_server_handling_seconds_count{grpc_method="GetMetrics",grpc_service="externalscaler.ExternalScaler",grpc_type="unary"} %d
grpc_server_handling_seconds_bucket{grpc_method="IsActive",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="0.0005"} 0
grpc_server_handling_seconds_bucket{grpc_method="IsActive",grpc_service="externalscaler.ExternalScaler",grpc_type="unary",le="+Inf"} 5000
grpc_server_handling_seconds_sum{grpc_method="IsActive",grpc_service="externalscaler.ExternalScaler",grpc_type="unary"} 900
grpc_server_handling_seconds_count{grpc_method="IsActive",grpc_service="externalscaler.ExternalScaler",grpc_type="unary"} 5000
`, b1, b2, b3, count, count)))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Before: 1,000 calls all slow; over the measurement, 1,000 more: 985
	// within 0.5 ms, 10 more within 1 ms, 5 more within 2 ms.
	m0, m1 := page(0, 0, 0, 1000), page(985, 995, 1000, 2000)
	for _, tt := range []struct {
		q, want float64
	}{{0.5, 0.0005}, {0.99, 0.001}, {0.999, 0.002}} {
		if got := getMetricsHandlingQuantile(m0, m1, tt.q); got != tt.want {
			t.Errorf("q %v: %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := getMetricsHandlingQuantile(m0, page(985, 995, 996, 2000), 0.999); got != -1 {
		t.Errorf("past the last bound: %v, want -1", got)
	}
	if got := getMetricsHandlingQuantile(m0, m0, 0.99); got != 0 {
		t.Errorf("nothing observed: %v, want 0", got)
	}
}

// serveTest serves each connection with handle (nil: the echo) on a
// loopback listener closed with the test; it returns the address.
func serveTest(t *testing.T, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if handle == nil {
		go func() { _ = serveEcho(ln) }()
	} else {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
	}
	return ln.Addr().String()
}

// echoChanged echoes each 32-byte message through change.
func echoChanged(change func([]byte)) func(net.Conn) {
	return func(c net.Conn) {
		defer func() { _ = c.Close() }()
		b := make([]byte, echoSize)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			change(b)
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
}

// countAtLeast is how many of ds are at least the least given.
func countAtLeast(ds []float64, least float64) int {
	n := 0
	for _, d := range ds {
		if d >= least {
			n++
		}
	}
	return n
}

func TestEchoerTimesRoundTripsAndRefusesAWrongAnswer(t *testing.T) {
	serve := serveTest
	t.Run("echo", func(t *testing.T) {
		var e echoer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		addr := serve(t, nil) // in the test's goroutine: it may t.Fatal
		go func() { e.run(ctx, addr, time.Millisecond, nil); close(done) }()
		deadline := time.Now().Add(10 * time.Second)
		var got []float64
		for len(got) < 20 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			e.mu.Lock()
			got = slices.Clone(e.rtts)
			e.mu.Unlock()
		}
		cancel()
		<-done
		rtts, err := e.take()
		if err != nil {
			t.Fatalf("the run's end is no failure: %v", err)
		}
		if len(rtts) < 20 {
			t.Fatalf("%d round trips timed, want at least 20", len(rtts))
		}
		for _, d := range rtts {
			if d <= 0 {
				t.Fatalf("round trip of %v s", d)
			}
		}
		if again, _ := e.take(); len(again) != 0 {
			t.Errorf("a second take returned %d round trips, want those since the first: none", len(again))
		}
	})
	// Open loop: the round trips due while the echo stalls are sent on
	// time and each is timed from its send, so a stall is many samples,
	// as it is of the polls (one at a time on a ticker, it was one).
	t.Run("stall", func(t *testing.T) {
		var n atomic.Int32
		addr := serve(t, echoChanged(func([]byte) {
			if n.Add(1) == 10 {
				time.Sleep(300 * time.Millisecond)
			}
		}))
		var e echoer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { e.run(ctx, addr, 5*time.Millisecond, nil); close(done) }()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			e.mu.Lock()
			k := len(e.rtts)
			e.mu.Unlock()
			if k >= 80 {
				break
			}
		}
		cancel()
		<-done
		rtts, err := e.take()
		if err != nil {
			t.Fatal(err)
		}
		slow := countAtLeast(rtts, 0.1)
		if slow < 5 {
			t.Errorf("a stall of 300 ms with a round trip due every 5 ms: %d of %d samples of 100 ms or more, want the many due during it", slow, len(rtts))
		}
	})
	// The round trips under way when the run ends run to their answers,
	// as a poll under way does: a stall at the end is in the floor too.
	t.Run("stall at the end", func(t *testing.T) {
		var n atomic.Int32
		stalled := make(chan struct{})
		addr := serve(t, echoChanged(func([]byte) {
			if n.Add(1) == 10 {
				close(stalled)
				time.Sleep(300 * time.Millisecond)
			}
		}))
		var e echoer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { e.run(ctx, addr, 5*time.Millisecond, nil); close(done) }()
		<-stalled
		time.Sleep(150 * time.Millisecond)
		cancel() // mid-stall
		<-done
		rtts, err := e.take()
		if err != nil {
			t.Fatalf("the run's end is no failure: %v", err)
		}
		slow := countAtLeast(rtts, 0.1)
		if slow < 5 {
			t.Errorf("a run ended 150 ms into a 300 ms stall, a round trip due every 5 ms: %d of %d samples of 100 ms or more, want those under way", slow, len(rtts))
		}
	})
	t.Run("wrong answer", func(t *testing.T) {
		addr := serve(t, echoChanged(func(b []byte) { b[0] = 'x' }))
		var e echoer
		e.run(t.Context(), addr, time.Millisecond, nil) // returns at the first wrong answer
		rtts, err := e.take()
		if err == nil || !strings.Contains(err.Error(), "echo answered") {
			t.Fatalf("err %v, want the wrong answer named", err)
		}
		if len(rtts) != 0 {
			t.Errorf("%d round trips kept from a wrong echo", len(rtts))
		}
	})
}

// TestAnEchoUnansweredAtTheEndIsAFailure: a round trip under way at the
// end and still unanswered when the drain is over is a failure, as a poll
// past its deadline is an error (it was dropped, and the floor kept no
// trace of the stall).
func TestAnEchoUnansweredAtTheEndIsAFailure(t *testing.T) {
	var n atomic.Int32
	stalled, release := make(chan struct{}), make(chan struct{})
	addr := serveTest(t, echoChanged(func([]byte) {
		if n.Add(1) == 10 {
			close(stalled)
			<-release
		}
	}))
	defer close(release)
	e := echoer{drain: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.run(ctx, addr, 5*time.Millisecond, nil); close(done) }()
	<-stalled
	cancel() // the stall outlasts the drain
	<-done
	if _, err := e.take(); err == nil || !strings.Contains(err.Error(), "not answered within 50ms") {
		t.Fatalf("err %v: want the round trip unanswered at the end named", err)
	}
}

// TestEchoerSkipsTurnsNotItsOwn: while the polls are apart the harness's
// echoer times nothing (the pollers' process times the floor).
func TestEchoerSkipsTurnsNotItsOwn(t *testing.T) {
	var served atomic.Int64
	addr := serveTest(t, echoChanged(func([]byte) { served.Add(1) }))
	var e echoer
	var skip atomic.Bool
	skip.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.run(ctx, addr, time.Millisecond, skip.Load); close(done) }()
	time.Sleep(100 * time.Millisecond) // a hundred turns, each skipped
	if rtts, _ := e.take(); len(rtts) != 0 || served.Load() != 0 {
		t.Fatalf("%d round trips timed, %d echoed while skipping, want none", len(rtts), served.Load())
	}
	skip.Store(false)
	// Wait on the echoer's own count: the server counts an echo before
	// the echoer has read it, so a count of the server's can end the run
	// with the last round trip still in flight.
	timed := func() int { e.mu.Lock(); defer e.mu.Unlock(); return len(e.rtts) }
	for deadline := time.Now().Add(10 * time.Second); timed() < 5 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if rtts, err := e.take(); len(rtts) < 5 || err != nil {
		t.Fatalf("once no longer skipping: %d round trips, %v; want them timed", len(rtts), err)
	}
}

// TestMemoryLimitIsTheChartsGOMEMLIMIT: --memory-limit takes a Kubernetes
// quantity, as resources.limits.memory does, and the aggregator gets 90 %
// of it in bytes as GOMEMLIMIT (what it sets itself in a container of that
// limit), over any the environment sets; a bad size is refused.
func TestMemoryLimitIsTheChartsGOMEMLIMIT(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "64MiB")
	for _, c := range []struct {
		arg        string
		want, soft int64
	}{{"1G", 1_000_000_000, 900_000_000}, {"1Gi", 1 << 30, 966_367_641}, {"512Mi", 512 << 20, 483_183_820}} {
		o := defaultOptions()
		fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
		o.addFlags(fs)
		if err := fs.Parse([]string{"--memory-limit", c.arg}); err != nil {
			t.Fatalf("--memory-limit %s: %v", c.arg, err)
		}
		if o.memoryLimit != c.want {
			t.Errorf("--memory-limit %s = %d bytes, want %d", c.arg, o.memoryLimit, c.want)
		}
		p, err := newAggregator(o, t.TempDir(), 1)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("true")
		cmd.Env = p.env
		var got string
		for _, kv := range cmd.Environ() {
			if v, ok := strings.CutPrefix(kv, "GOMEMLIMIT="); ok {
				got = v
			}
		}
		if want := strconv.FormatInt(c.soft, 10); got != want {
			t.Errorf("--memory-limit %s: the aggregator's GOMEMLIMIT is %q, want %q", c.arg, got, want)
		}
	}
	o := defaultOptions()
	p, err := newAggregator(o, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(p.env, "GOMEMLIMIT=64MiB") {
		t.Error("without --memory-limit the aggregator does not get the environment's GOMEMLIMIT")
	}
	for _, bad := range []string{"abc", "0", "-1G"} {
		o := defaultOptions()
		fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.addFlags(fs)
		if err := fs.Parse([]string{"--memory-limit", bad}); err == nil {
			t.Errorf("--memory-limit %s was accepted (%d bytes)", bad, o.memoryLimit)
		}
	}
}

// TestMetricsAreReadAgainAfterAFailure: a read of /metrics that fails (here
// an answer other than 200) is tried again, and the time given is when the
// attempt that read the values began; a page that keeps failing is an
// error naming each attempt.
func TestMetricsAreReadAgainAfterAFailure(t *testing.T) {
	var calls atomic.Int32
	var servedAt atomic.Int64
	failing := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := calls.Add(1)
		if failing.Load() || n < 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		servedAt.Store(time.Now().UnixNano())
		fmt.Fprintln(w, "pulse_aggregator_pods 8")
	}))
	defer srv.Close()
	p := &aggregatorProc{httpAddr: strings.TrimPrefix(srv.URL, "http://"), http: srv.Client()}
	before := time.Now()
	m, at, err := p.MetricsAt(context.Background())
	if err != nil || m["pulse_aggregator_pods"] != 8 {
		t.Fatalf("after two failures: %v, %v", m, err)
	}
	if calls.Load() != 3 || at.Before(before) || at.UnixNano() > servedAt.Load() {
		t.Fatalf("%d attempts, the values' time %v (began %v, served %v)", calls.Load(), at, before, time.Unix(0, servedAt.Load()))
	}
	failing.Store(true)
	calls.Store(0)
	if _, err := p.Metrics(context.Background()); err == nil || calls.Load() != metricsAttempts || !strings.Contains(err.Error(), "503") {
		t.Fatalf("a page that keeps failing: %d attempts, %v", calls.Load(), err)
	}
}

// TestServesVLLMKnowsAVLLMPage: a server started on an address found free
// is taken for the simulated pod only when that address serves a vLLM
// page (another process may have bound it first).
func TestServesVLLMKnowsAVLLMPage(t *testing.T) {
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "vllm:num_requests_waiting{model_name=\"m\"} 0")
	}))
	defer vllm.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "go_goroutines 7")
	}))
	defer other.Close()
	if !servesVLLM(strings.TrimPrefix(vllm.URL, "http://"), 5*time.Second) {
		t.Error("a vLLM page was not recognised")
	}
	if servesVLLM(strings.TrimPrefix(other.URL, "http://"), 100*time.Millisecond) {
		t.Error("another server's page was taken for a vLLM page")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if servesVLLM(addr, 100*time.Millisecond) {
		t.Error("an address nothing serves was taken for a vLLM page")
	}
}

// A probe's rise is counted when it begins; one that fell without being
// pushed is missed whether or not a rise followed it within the
// measurement (the last of each probe was never judged).
func TestProbeRisesAndMisses(t *testing.T) {
	epoch := time.Now().Add(-10 * probeHalf)
	f := &fleet{epoch: epoch, probes: map[int]*probeState{7: {}, 8: {}}}
	at := func(half int) time.Time { return epoch.Add(time.Duration(half)*probeHalf + time.Second) }
	f.probeRise(7, at(1))
	f.probeRise(7, at(1)) // another agent's batch of the same rise
	f.probeRise(8, at(1))
	f.probeActive(7, time.Now())
	if f.pushRises != 2 || len(f.push) != 1 {
		t.Fatalf("rises %d, pushed %d: want 2 and 1", f.pushRises, len(f.push))
	}
	// Probe 8's rise began probeHalf and more ago and was never pushed.
	if n := f.unpushed(time.Now().Add(probeHalf + time.Second)); n != 1 {
		t.Errorf("unpushed %d, want probe 8's", n)
	}
	f.probeRise(8, at(3)) // its next rise: the one before is missed
	if f.pushMissed != 1 || f.pushRises != 3 {
		t.Errorf("missed %d, rises %d: want 1 and 3", f.pushMissed, f.pushRises)
	}
	// A tick built in the high half and sent late is still that rise.
	f.probeRise(8, at(3).Add(probeHalf-2*time.Second))
	if f.pushRises != 3 {
		t.Errorf("a late batch of the same rise counted as a new one: rises %d", f.pushRises)
	}
}

// TestTheSettleForgetsTheRisesBeforeIt: the settle cleared the counts but
// not the probes: a rise begun before it and never pushed was counted a
// miss of the measurement at the probe's next rise, and one pushed within
// it a push of no rise counted (pushes past rises).
func TestTheSettleForgetsTheRisesBeforeIt(t *testing.T) {
	epoch := time.Now().Add(-10 * probeHalf)
	f := &fleet{epoch: epoch, probes: map[int]*probeState{7: {}, 8: {}}}
	at := func(half int) time.Time { return epoch.Add(time.Duration(half)*probeHalf + time.Second) }
	f.probeRise(7, at(1))
	f.probeRise(8, at(1))
	if err := f.settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.probeActive(7, time.Now()) // the push of a rise begun before the settle
	f.probeRise(8, at(3))        // probe 8's rise before the settle was never pushed
	if f.pushRises != 1 || len(f.push) != 0 || f.pushMissed != 0 {
		t.Fatalf("rises %d, pushes %d, missed %d: want the measurement's own rise alone (1, 0, 0)", f.pushRises, len(f.push), f.pushMissed)
	}
}

// TestErrorsDuringAFaultAreCountedApart: an error while a fault was under
// way was dropped, though the docs say counted apart; it is in the
// scenario's own count, and outside a fault in the run's.
func TestErrorsDuringAFaultAreCountedApart(t *testing.T) {
	f := &fleet{errs: map[string]int64{}}
	f.setFaulting(true)
	f.count("GetMetrics Unavailable")
	f.count("GetMetrics Unavailable")
	r, err := f.fault(context.Background(), "nonesuch") // ends the fault, taking its errors
	if err == nil || r.Errors["GetMetrics Unavailable"] != 2 {
		t.Fatalf("the fault's errors %v (%v): want the 2 counted apart", r.Errors, err)
	}
	f.count("IsActive Unavailable")
	if len(f.errs) != 1 || f.errs["IsActive Unavailable"] != 1 || f.faultErrs != nil {
		t.Fatalf("outside the fault: run's %v, fault's %v; want the run's alone", f.errs, f.faultErrs)
	}
}

// TestAMissedRiseIsAnError: a rise StreamIsActive never pushed was in no
// error, and the push percentiles were of the rises pushed alone: a run
// missing them passed. Each is an error of the run.
func TestAMissedRiseIsAnError(t *testing.T) {
	epoch := time.Now().Add(-10 * probeHalf)
	f := &fleet{epoch: epoch, errs: map[string]int64{}, probes: map[int]*probeState{8: {}}}
	f.probeRise(8, epoch.Add(probeHalf+time.Second))
	f.probeRise(8, epoch.Add(3*probeHalf+time.Second)) // the rise before was never pushed
	if _, _, missed, rises, _ := f.timed(); missed != 1 || rises != 2 || f.errs["pushMissed"] != 1 {
		t.Fatalf("missed %d of %d rises, errors %v: want the miss an error", missed, rises, f.errs)
	}
}
