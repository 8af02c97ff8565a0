package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/httpflood"
)

// start runs an aggregator on loopback until the test ends.
func start(t *testing.T, mutate func(*Options)) *Aggregator { return startWith(t, mutate, Deps{}) }

// startWith runs an aggregator with the given clients.
func startWith(t *testing.T, mutate func(*Options), deps Deps) *Aggregator {
	t.Helper()
	o := NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	mutate(o)
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return a
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	for range 100 {
		resp, err := http.Get(url)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	t.Fatalf("GET %s never answered", url)
	return 0, ""
}

func healthOf(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	return r.Status
}

// report opens an agent stream for node and reports one pod of Workspace
// llama waiting w; the stream stays open until the test ends.
func report(t *testing.T, addr, node string, w float64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := pulsev1.NewIngestClient(dial(t, addr)).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *pulsev1.AgentMessage) {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: node, ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}})
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Full: true, Upsert: []*pulsev1.Pod{{
		Id: 1, Uid: "uid-" + node, Namespace: "demo", Name: "llama-" + node, Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}}}}})
	var b pulsev1.SampleBatch
	b.Seq, b.TimeUnixMs = 1, time.Now().UnixMilli()
	s := wire.Sample{Pod: 1}
	s.Values.Set(metric.Waiting, w)
	wire.NewEncoder().Append(&b, &s)
	send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}})
	if _, err := stream.Recv(); err != nil { // the ack: the batch is stored
		t.Fatal(err)
	}
}

func getMetrics(conn *grpc.ClientConn) (float64, error) {
	resp, err := externalscaler.NewExternalScalerClient(conn).GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{
		ScaledObjectRef: &externalscaler.ScaledObjectRef{Name: "so", Namespace: "demo", ScalerMetadata: map[string]string{"workspace": "llama"}}})
	if err != nil {
		return 0, err
	}
	return resp.MetricValues[0].MetricValueFloat, nil
}

// TestWarmupHoldsAnswersUntilTheAgentsAreBack: after a restart, GetMetrics
// answered from whatever agents had reconnected (40 of a true 60, no
// error). A starting aggregator now stays unready and answers Unavailable
// until the agents it expects have reported (or the warm-up has passed).
func TestWarmupHoldsAnswersUntilTheAgentsAreBack(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration, o.Warmup.ExpectedAgents = time.Hour, 3 })
	scaler, ingest := dial(t, a.ScalerAddr()), a.IngestAddr()
	if code, body := httpStatus(t, "http://"+a.HTTPAddr()+"/readyz"); code != 503 || !strings.Contains(body, "0 of 3 agents") {
		t.Fatalf("/readyz = %d %q during the warm-up", code, body)
	}
	if code, _ := httpStatus(t, "http://"+a.HTTPAddr()+"/livez"); code != 200 {
		t.Fatalf("/livez = %d: a warming-up aggregator is live", code)
	}
	for _, svc := range []string{"readiness", ""} {
		if st := healthOf(t, scaler, svc); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %q = %v during the warm-up", svc, st)
		}
	}
	if st := healthOf(t, dial(t, ingest), "liveness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness = %v", st)
	}
	report(t, ingest, "node-1", 20)
	report(t, ingest, "node-2", 20)
	if _, err := getMetrics(scaler); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "2 of 3 agents") {
		t.Fatalf("GetMetrics with 2 of 3 agents back: %v; want Unavailable, never the partial 40", err)
	}
	report(t, ingest, "node-3", 20)
	if v, err := getMetrics(scaler); err != nil || v != 60 {
		t.Fatalf("GetMetrics with every agent back = %v, %v; want 60", v, err)
	}
	if code, _ := httpStatus(t, "http://"+a.HTTPAddr()+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d after the warm-up", code)
	}
	if st := healthOf(t, scaler, "readiness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness = %v after the warm-up", st)
	}
	if _, err := healthpb.NewHealthClient(scaler).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "other"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown health service: %v", err)
	}
	// Its name quoted cut: anyone who reaches the port names it, and a
	// name of control bytes was answered four times its size (a request
	// past 256 KiB is refused unread: maxScalerRequest).
	_, err := healthpb.NewHealthClient(scaler).Check(context.Background(), &healthpb.HealthCheckRequest{Service: strings.Repeat("\x01", 200<<10)})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.NotFound || len(msg) > 512 {
		t.Fatalf("a health service of 200 KiB: %v, a message of %d bytes; want NotFound, at most 512", status.Code(err), len(msg))
	}
}

// TestWarmupEndsAfterItsDuration: with no expected count, the aggregator
// answers Unavailable during the warm-up, and the warm-up ends when its
// duration has passed (on the warm-up's clock: a test of a 300 ms warm-up
// on the wall clock needed its start, a dial and a report within it).
func TestWarmupEndsAfterItsDuration(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration = time.Hour })
	report(t, a.IngestAddr(), "node-1", 7)
	if _, err := getMetrics(dial(t, a.ScalerAddr())); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetMetrics during the warm-up: %v, want Unavailable", err)
	}
	now := time.Unix(1_700_000_000, 0)
	w := newWarmup(store.New(store.Options{}), time.Minute, 0, func() time.Time { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now = now.Add(59 * time.Second)
	if err := w.check(); err == nil || !strings.Contains(err.Error(), "in 1s at the latest") {
		t.Fatalf("59 s into a minute's warm-up: %v, want it on, ending in 1s", err)
	}
	// The warm-up ends with a sweep that may adopt the API's replicas on
	// nodes no agent streams from, before any answer: answers began up to
	// a housekeeping tick before it, a restart's plans made from some
	// replicas alone (the others' node's agent lost).
	var sweeps []string
	w.sweep = func() {
		sweeps = append(sweeps, fmt.Sprintf("adopting %v, answering %v", w.over.Load(), w.done.Load()))
	}
	now = now.Add(time.Second)
	if err := w.check(); err != nil {
		t.Fatalf("a minute into a minute's warm-up: %v, want it over", err)
	}
	_ = w.check()
	if len(sweeps) != 1 || sweeps[0] != "adopting true, answering false" {
		t.Fatalf("the sweeps as the warm-up ended: %q; want one, adopting and not yet answering", sweeps)
	}
	// With no warm-up, the same at the first check once the pod cache the
	// sweep adopts from has synced (before it, the sweep adopted nothing).
	w = newWarmup(store.New(store.Options{}), 0, 0, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sweeps = nil
	w.sweep = func() {
		sweeps = append(sweeps, fmt.Sprintf("adopting %v, answering %v", w.over.Load(), w.done.Load()))
	}
	synced := errors.New("the pod cache has not synced")
	w.ready = func() error { return synced }
	if err := w.check(); err == nil || !strings.Contains(err.Error(), "pod cache has not synced") || len(sweeps) != 0 {
		t.Fatalf("no warm-up, the pod cache not synced: %v, sweeps %q; want it warming, no sweep", err, sweeps)
	}
	synced = nil
	if err := w.check(); err != nil || len(sweeps) != 1 || sweeps[0] != "adopting true, answering false" {
		t.Fatalf("no warm-up, the pod cache synced: %v, sweeps %q; want answers after one sweep, adopting", err, sweeps)
	}
}

// TestLivezFailsWhenHousekeepingStalls: /livez reflects a stalled loop.
func TestLivezFailsWhenHousekeepingStalls(t *testing.T) {
	h := newHealth(time.Second)
	if err := h.live(); err != nil {
		t.Fatal(err)
	}
	h.lastTick.Store(time.Now().Add(-2 * time.Second).UnixNano())
	if err := h.live(); err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("live() = %v after a 2s stall of a 1s loop", err)
	}
	h.tick()
	h.addCheck("thing", func() error { return io.EOF })
	if err := h.ready(); err == nil || !strings.Contains(err.Error(), "thing: EOF") {
		t.Fatalf("ready() = %v", err)
	}
}

// TestWarmupExpectsTheAgentDaemonSet: with --agent-daemonset, the number of
// agents waited for is the DaemonSet's desiredNumberScheduled.
func TestWarmupExpectsTheAgentDaemonSet(t *testing.T) {
	st := store.New(store.Options{})
	w := newWarmup(st, time.Hour, 0, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kube := fake.NewClientset(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "pulse-agent", Namespace: "pulse-system"},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.followDaemonSet(ctx, kube, "pulse-system", "pulse-agent")
	for _, node := range []string{"n1", "n2"} {
		_, _ = st.OpenSource(node)
		st.MarkHeard(node)
		deadline := time.Now().Add(10 * time.Second)
		for w.expected.Load() != 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		err := w.check()
		if node == "n1" && (err == nil || !strings.Contains(err.Error(), "1 of 2 agents")) {
			t.Fatalf("one of two agents heard: %v", err)
		}
		if node == "n2" && err != nil {
			t.Fatalf("both agents heard: %v", err)
		}
	}
}

// blockingCollector blocks every gathering until release is closed.
type blockingCollector struct {
	started chan struct{}
	release chan struct{}
}

func (b blockingCollector) Describe(chan<- *prometheus.Desc) {}
func (b blockingCollector) Collect(chan<- prometheus.Metric) {
	b.started <- struct{}{}
	<-b.release
}

// TestMetricsGatheringsAreBounded: /metrics had no bound on gatherings at
// once, and the servers none on a request's time but its headers': a
// client opening requests it never reads held a whole page each. At most
// MetricsInFlight gather at once (the next is answered 503), and the
// servers bound reading, writing and idling.
func TestMetricsGatheringsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := blockingCollector{started: make(chan struct{}, app.MetricsInFlight), release: make(chan struct{})}
	reg.MustRegister(b)
	srv := httptest.NewServer(metricsHandler(reg, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	var wg sync.WaitGroup
	for range app.MetricsInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.Get(srv.URL); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for range app.MetricsInFlight {
		<-b.started
	}
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a gathering past %d at once: %d, want 503", app.MetricsInFlight, resp.StatusCode)
	}
	close(b.release)
	wg.Wait()
	s := app.NewHTTPServer(http.NotFoundHandler(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout < 30*time.Second || s.IdleTimeout <= 0 {
		t.Fatalf("server bounds %+v: want every timeout set, writing at least a CPU profile's 30 s", s)
	}
}

// runToStop runs an aggregator on loopback, with no warm-up, and opts;
// cancel starts its stop, and done gives Run's answer.
func runToStop(t *testing.T, opts func(*Options)) (a *Aggregator, cancel context.CancelFunc, done chan error) {
	t.Helper()
	o := NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.Warmup.Duration = 0
	opts(o)
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return a, cancel, done
}

// TestAStopIsNotReadyBeforeItCloses: readiness went false at the instant
// the listeners closed, so no probe saw it and the Service still sent new
// connections to a replica that refused them. With --shutdown-delay the
// replica answers not ready, its listeners still open, for that long, then
// stops within --shutdown-timeout; the gRPC health Watch of a service it
// does not know is SERVICE_UNKNOWN on an open stream, as the protocol says.
func TestAStopIsNotReadyBeforeItCloses(t *testing.T) {
	a, cancel, done := runToStop(t, func(o *Options) { o.Serving.ShutdownDelay = 3 * time.Second })
	base := "http://" + a.HTTPAddr()
	if code, _ := httpStatus(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the stop: %d", code)
	}
	w, err := healthpb.NewHealthClient(dial(t, a.scalerLn.Addr().String())).Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "nonesuch"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
		t.Fatalf("Watch of an unknown service: %v, %v; want SERVICE_UNKNOWN on an open stream", r, err)
	}
	cancel()
	for !a.health.stopping.Load() {
		time.Sleep(time.Millisecond)
	}
	if code, _ := httpStatus(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz once stopping, within --shutdown-delay: %d, want 503 from a listener still open", code)
	}
	if err := <-done; err != nil {
		t.Fatalf("a stop: %v", err)
	}
}

// TestAStopCutsWhatOutlastsItsTimeout: past --shutdown-timeout a stop cuts
// what is still running rather than wait for it: a CPU profile asked for
// 50 s on the http port, and a gRPC stream on the scaler port that never
// ends by itself (a health Watch). The stop returns, and each client sees
// its answer cut.
func TestAStopCutsWhatOutlastsItsTimeout(t *testing.T) {
	a, cancel, done := runToStop(t, func(o *Options) { o.Serving.ShutdownTimeout, o.Serving.Profiling = 500*time.Millisecond, true })
	base := "http://" + a.HTTPAddr()
	profile := make(chan error, 1)
	ask := func() {
		resp, err := http.Get(base + "/debug/pprof/profile?seconds=50")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				err = errors.New(resp.Status)
			}
		}
		profile <- err
	}
	go ask()
	// The server's profile is running once this process's CPU profiler is
	// taken (asked again if this probe took it first).
	for pprof.StartCPUProfile(io.Discard) == nil {
		pprof.StopCPUProfile()
		time.Sleep(10 * time.Millisecond)
		select {
		case err := <-profile:
			if !strings.HasPrefix(err.Error(), "500") {
				t.Fatalf("the profile ended before the stop: %v", err)
			}
			go ask()
		default:
		}
	}
	w, err := healthpb.NewHealthClient(dial(t, a.scalerLn.Addr().String())).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a stop: %v", err)
		}
	case <-time.After(40 * time.Second): // the profile alone would hold it 50 s
		t.Fatal("the stop waited for the profile")
	}
	if err := <-profile; err == nil || strings.HasPrefix(err.Error(), "200") {
		t.Errorf("the profile's client: %v, want its answer cut", err)
	}
	for {
		if _, err := w.Recv(); err != nil {
			break // the Watch ended: NOT_SERVING first, then the cut
		}
	}
}

// largeCollector is a page of about size bytes: 8 series, each a label
// value of size/8 bytes.
type largeCollector struct {
	desc  *prometheus.Desc
	value string
}

func newLargeCollector(size int) largeCollector {
	return largeCollector{desc: prometheus.NewDesc("large", "A large page.", []string{"v", "i"}, nil), value: strings.Repeat("x", size/8)}
}

func (c largeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c largeCollector) Collect(ch chan<- prometheus.Metric) {
	for i := range 8 {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, c.value, strconv.Itoa(i))
	}
}

// TestMetricsAnswersNotReadAreBounded: promhttp gathers a page into a
// buffer and writes it after, its bound on gatherings released before the
// write: clients that asked and never read held a whole page each until
// the write timeout, as many as they asked for. At most MetricsWriting
// answers are under way at once (the next 503, before any gathering); a
// client that reads gets its page once they are gone.
func TestMetricsAnswersNotReadAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newLargeCollector(8 << 20)) // more than the kernel's buffers hold
	srv := httptest.NewServer(metricsHandler(reg, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	// Clients with a small receive buffer that never read.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		_ = c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return err
	}}
	var stuck []net.Conn
	defer func() {
		for _, c := range stuck {
			_ = c.Close()
		}
	}()
	// Ask on new connections until the next client is refused: each
	// answer gathered is held by its client; those promhttp refused (its
	// 4 gatherings at once) are done.
	var code int
	var body string
	for len(stuck) < 4*app.MetricsWriting {
		c, err := d.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, c)
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: aggregator\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if code, body = httpStatus(t, srv.URL); code == http.StatusServiceUnavailable && strings.Contains(body, "under way") {
			break
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "answers of /metrics are under way") {
		t.Fatalf("with %d answers not read: %d %.80q, want 503 for the answers under way", len(stuck), code, body)
	}
	for _, c := range stuck {
		_ = c.Close()
	}
	stuck = nil
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, _ = httpStatus(t, srv.URL); code == http.StatusOK {
			break
		}
	}
	if code != http.StatusOK {
		t.Fatalf("once the clients that did not read are gone: %d, want the page", code)
	}
}

// TestIngestConnectionsAreBounded: the ingest port accepted connections
// without bound (any client of it, with --agent-auth=none: each a TLS
// handshake and HTTP/2 buffers). Past --max-ingest-connections a new one
// waits to be accepted until one closes.
func TestIngestConnectionsAreBounded(t *testing.T) {
	a := start(t, func(o *Options) { o.Serving.MaxIngestConnections = 1; o.Warmup.Duration = 0 })
	check := func(conn *grpc.ClientConn, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"})
		return err
	}
	first := dial(t, a.IngestAddr())
	if err := check(first, 10*time.Second); err != nil {
		t.Fatalf("the first connection: %v", err)
	}
	second := dial(t, a.IngestAddr())
	if err := check(second, time.Second); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a second connection past the bound: %v, want it not served (DeadlineExceeded)", err)
	}
	first.Close()
	if err := check(second, 10*time.Second); err != nil {
		t.Fatalf("the second connection once the first closed: %v", err)
	}
}

// TestTheHTTPPortsHoldBoundedConnections: the health port (open to every
// pod for the kubelet's probes) and the http port held every connection
// for up to their IdleTimeout, 19 and 10 KiB each, unbounded: one pod
// opening 30,000 took every replica past its 512Mi limit. Each holds at
// most maxHTTPConnsPerIP from one address, and a probe from another
// address is answered beside the flood.
func TestTheHTTPPortsHoldBoundedConnections(t *testing.T) {
	a := start(t, func(o *Options) { o.Serving.HealthAddr = "127.0.0.1:0"; o.Warmup.Duration = 0 })
	for _, port := range []struct{ name, addr string }{{"health", a.healthLn.Addr().String()}, {"http", a.HTTPAddr()}} {
		if accepted, _ := httpflood.Held(t, port.addr, "/livez", 2*maxHTTPConnsPerIP); accepted == 0 || accepted > maxHTTPConnsPerIP {
			t.Errorf("%s port: one address's %d connections, %d held; want 1 to %d", port.name, 2*maxHTTPConnsPerIP, accepted, maxHTTPConnsPerIP)
		}
		if _, err := httpflood.GetFrom(port.addr, "/livez"); err != nil {
			t.Fatalf("%s port: the probe beside a flood: %v", port.name, err)
		}
	}
}

// TestWarmupCountsAnAgentWithNoReadyPod: an agent whose node has no ready
// vLLM pod (an idle GPU node, or its pods loading their model) sends its
// catalogue and no batch (it has nothing to scrape), and the warm-up
// counted only agents a batch came from: with --agent-daemonset (the
// chart's default) or --expected-agents, one such node held every
// restarted replica unready and answering Unavailable for the whole
// --warmup, though every agent was back and its state complete. Such an
// agent is counted at its full catalogue.
func TestWarmupCountsAnAgentWithNoReadyPod(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration, o.Warmup.ExpectedAgents = time.Hour, 2 })
	report(t, a.IngestAddr(), "node-1", 20)
	// node-2's agent: its one pod is loading its model (not ready).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pulsev1.NewIngestClient(dial(t, a.IngestAddr())).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "node-2", ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}})
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Full: true, Upsert: []*pulsev1.Pod{{
		Id: 1, Uid: "uid-node-2", Namespace: "demo", Name: "llama-node-2", Ready: false,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}}}}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := httpStatus(t, "http://"+a.HTTPAddr()+"/readyz")
		if code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("both agents back, their catalogues in: /readyz %d %q", code, strings.TrimSpace(body))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnIdleAgentConnectionEnds: a stream ends at its token's expiry only
// when a message comes, so a node's idle stream (its token copied) held
// what it listed for ever, another tenant's deleted pods among them. An
// agent connection lives at most ingestConnectionAge (a GOAWAY, then
// ingestConnectionGrace): the idle stream ends, what it listed goes
// --pod-expiry later, and an honest agent reconnects with its current
// token and lists its pods in full.
func TestAnIdleAgentConnectionEnds(t *testing.T) {
	defer func(a, g time.Duration) { ingestConnectionAge, ingestConnectionGrace = a, g }(ingestConnectionAge, ingestConnectionGrace)
	// The hello and its welcome come within the age and its grace (1 s
	// in all was near a race on a loaded machine).
	ingestConnectionAge, ingestConnectionGrace = 2*time.Second, 2*time.Second
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pulsev1.NewIngestClient(dial(t, a.IngestAddr())).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "node-1", ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := stream.Recv(); ended <- err }() // idle: nothing more sent
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the idle stream got a message, want it ended")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("an idle agent stream outlived its connection's age")
	}
}

// TestHealthWatchesAreBounded: nothing authenticates a health Watch (the
// kubelet's probes call Check), and each lived until the server stopped,
// a goroutine reading the checks every second: a client of any pod
// opened them without end. At most maxWatchers are open; past it a Watch
// is ResourceExhausted, and one that ends gives its place back.
func TestHealthWatchesAreBounded(t *testing.T) {
	h := newHealth(time.Second)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	client := healthpb.NewHealthClient(dial(t, ln.Addr().String()))
	watch := func(ctx context.Context) error {
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, cancelFirst := context.WithCancel(ctx)
	if err := watch(first); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < maxWatchers; i++ {
		if err := watch(ctx); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	if err := watch(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("watch %d: %v, want ResourceExhausted", maxWatchers+1, err)
	}
	cancelFirst()
	for deadline := time.Now().Add(10 * time.Second); h.watchers.Load() >= maxWatchers; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ended watch kept its place")
		}
	}
	if err := watch(ctx); err != nil {
		t.Fatalf("a watch once one ended: %v", err)
	}
}

// TestTheLoopsBehindTheAnswersRunThroughTheStop: every loop ran on the
// signal's context, so the caches, the learner and the housekeeping
// stopped at once while the replica went on answering KEDA for
// --shutdown-delay and the drain (a ScaledObject made meanwhile was
// Unavailable, a pod relabelled read from a frozen cache). They run
// until the stop has ended: the housekeeping ticks within the delay.
func TestTheLoopsBehindTheAnswersRunThroughTheStop(t *testing.T) {
	a, cancel, done := runToStop(t, func(o *Options) { o.Serving.ShutdownDelay = 3 * housekeepEvery })
	cancel()
	for !a.health.stopping.Load() {
		time.Sleep(time.Millisecond)
	}
	at := a.health.lastTick.Load()
	for a.health.lastTick.Load() == at {
		select {
		case err := <-done:
			t.Fatalf("the stop ended (%v) with no housekeeping since it began", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("a stop: %v", err)
	}
}
