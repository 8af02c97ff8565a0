package aggregator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	runtimedebug "runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/test/syncbuf"
	"github.com/pulse-io/pulse/test/testpki"
)

func TestDebugOnItsOwnAddress(t *testing.T) {
	a := start(t, func(o *Options) { o.Serving.DebugAddr = "127.0.0.1:0" })
	get := func(url string) int { return httpGet(t, url) }
	if code := get("http://" + a.DebugAddr() + "/debug/workloads"); code != 200 {
		t.Fatalf("debug address: %d", code)
	}
	if code := get("http://" + a.HTTPAddr() + "/debug/workloads"); code != 404 {
		t.Fatalf("main HTTP address still serves the debug endpoint: %d", code)
	}
	if code := get("http://" + a.HTTPAddr() + "/metrics"); code != 200 {
		t.Fatalf("metrics: %d", code)
	}
}

func TestProfilesOnlyWhenAsked(t *testing.T) {
	for _, profiling := range []bool{false, true} {
		a := start(t, func(o *Options) { o.Serving.DebugAddr, o.Serving.Profiling = "127.0.0.1:0", profiling })
		want := map[bool]int{false: 404, true: 200}[profiling]
		if code := httpGet(t, "http://"+a.DebugAddr()+"/debug/pprof/heap"); code != want {
			t.Errorf("--profiling=%v: the heap profile answers %d, want %d", profiling, code, want)
		}
		if code := httpGet(t, "http://"+a.HTTPAddr()+"/debug/pprof/heap"); code != 404 {
			t.Errorf("--profiling=%v: the main HTTP address serves profiles beside a --debug-addr: %d", profiling, code)
		}
	}
}

// The fleet harness reads the live heap (docs/performance.md): heap in use
// also holds what the next GC frees; and the stacks the GC scanned, which
// its goal counts.
func TestMetricsHaveTheLiveHeap(t *testing.T) {
	a := start(t, func(*Options) {})
	httpGet(t, "http://"+a.HTTPAddr()+"/livez")
	body := metricsPage(t, a)
	for _, name := range []string{"\ngo_gc_heap_live_bytes ", "\ngo_memstats_heap_inuse_bytes ", "\ngo_gc_scan_stack_bytes ", "\ngo_gc_gogc_percent "} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics has no %s", strings.TrimSpace(name))
		}
	}
}

// metricsPage is a's /metrics.
func metricsPage(t *testing.T, a *Aggregator) string {
	t.Helper()
	resp, err := http.Get("http://" + a.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// httpGet is the status of GET url, retried while the listener starts.
func httpGet(t *testing.T, url string) int {
	t.Helper()
	for range 50 {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return resp.StatusCode
		}
	}
	t.Fatalf("GET %s never answered", url)
	return 0
}

// TestTheLeasesNamespaceFromNamespaceIsChecked: the Lease's namespace
// taken from --namespace, without --manage-certs (which checks it): every
// Lease create failed, and nothing was provisioned.
func TestTheLeasesNamespaceFromNamespaceIsChecked(t *testing.T) {
	o := NewOptions()
	o.Provision.Enabled, o.Provision.ScalerAddress, o.Certs.Namespace = true, "pulse-aggregator.pulse-system.svc:9090", "Pulse_System"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `--namespace "Pulse_System" (the Lease's`) {
		t.Errorf("Validate() = %v, want it to name --namespace as the Lease's", err)
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	o := NewOptions()
	o.Certs.Enabled, o.Certs.Namespace, o.ScalerTLS.CertFile, o.AgentAuth.Mode, o.IngestTLS.CertFile = true, "", "x", "maybe", "y"
	o.Serving.MaxIngestStreamsPerConnection, o.ScalerTLS.ClientName = 0, "keda-operator"
	refusedNaming(t, o, "--manage-certs and --tls-cert-file", "--namespace", "--cert-dns-name", "--ingest-tls", "--agent-auth", "go together", "--max-ingest-streams-per-connection", "--tls-client-name needs --tls-client-ca-file")
	// Names of what --manage-certs writes, empty (each write failed every
	// 10 s and the replica never became ready), an account that names no
	// namespace (refused only once the listeners were open), and every
	// problem of a group, not its first.
	o = NewOptions()
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames = true, "pulse-system", []string{"pulse-aggregator.pulse-system.svc"}
	o.Certs.Secret, o.Certs.KEDANamespace, o.Certs.TriggerAuthName, o.Certs.CAConfigMap = "", "", "", "Bad_Name"
	o.AgentAuth.Mode, o.AgentAuth.Audience, o.AgentAuth.Accounts = "maybe", "", []string{"pulse-agent", "a/b/c"}
	o.IngestTLS.Managed, o.IngestTLS.CertFile = true, "c"
	refusedNaming(t, o, "--cert-secret", "--keda-namespace", "--trigger-auth-name", "--ca-configmap", `--agent-service-account "pulse-agent"`,
		`--agent-service-account "a/b/c"`, "--agent-auth \"maybe\"", "go together", "choose one")
	// A namespace is a label, not a subdomain: keda.system passed, and
	// every certificate write failed.
	o = NewOptions()
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames, o.Certs.KEDANamespace = true, "pulse.system", []string{"pulse-aggregator.pulse-system.svc"}, "keda.system"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `--namespace "pulse.system"`) || !strings.Contains(err.Error(), `--keda-namespace "keda.system"`) {
		t.Errorf("Validate() = %v, want it to name --namespace and --keda-namespace", err)
	}
	// A certificate's name it cannot carry (not ASCII: issuing failed every
	// 10 s, for ever) or no client asks for (a port in it); a Lease's name
	// or namespace the API server refuses (no replica ever led). A
	// wildcard and a plain name are taken.
	o = NewOptions()
	o.Certs.Enabled, o.Certs.Namespace = true, "pulse-system"
	o.Certs.DNSNames = []string{"pulse-aggregator.pulse-system.svc", "*.pulse-system.svc", "impulsé.example", "pulse-aggregator.pulse-system.svc:9090"}
	o.Provision.Enabled, o.Provision.ScalerAddress = true, "pulse-aggregator.pulse-system.svc:9090"
	o.Provision.LeaseName, o.Provision.LeaseNamespace = "Pulse_Lease", "Pulse-System"
	said := refusedNaming(t, o, `--cert-dns-name "impulsé.example"`, `--cert-dns-name "pulse-aggregator.pulse-system.svc:9090"`,
		`--leader-elect-lease-name "Pulse_Lease"`, `--leader-elect-namespace "Pulse-System"`)
	for _, taken := range []string{`"pulse-aggregator.pulse-system.svc"`, `"*.pulse-system.svc"`} {
		if strings.Contains(said, taken) {
			t.Errorf("Validate() = %s, refused %s", said, taken)
		}
	}
}

// TestValidateNamesEveryProblemOfSizesAndPairs: the sizes and the flags
// that go in pairs, each problem named.
func TestValidateNamesEveryProblemOfSizesAndPairs(t *testing.T) {
	// Below the replicas trigger's default window, every workload
	// provisioned with the planner would be refused.
	o := NewOptions()
	o.Store.MaxWindow = 20 * time.Second
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--max-window must be at least 30s") {
		t.Errorf("Validate() = %v, want --max-window 20s refused", err)
	}
	o.Store.MaxWindow = 30 * time.Second
	if err := o.Validate(); err != nil {
		t.Errorf("--max-window 30s: %v", err)
	}
	o.Serving.MaxScalerStreams, o.Serving.MaxScalerStreamsPerNamespace = 0, -1
	refusedNaming(t, o, "--max-scaler-streams must be at least 1", "--max-scaler-streams-per-namespace must be 0")
	o.Serving.MaxScalerStreams, o.Serving.MaxScalerStreamsPerNamespace = 5, 0
	if err := o.Validate(); err != nil || o.Serving.ScalerStreamsPerNamespace() != 2 {
		t.Errorf("--max-scaler-streams 5: %v, %d a namespace; want no error and 2 (half)", err, o.Serving.ScalerStreamsPerNamespace())
	}
	o = NewOptions()
	o.IngestTLS.Managed = true
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--ingest-managed-tls needs --manage-certs") {
		t.Errorf("Validate() = %v, want --ingest-managed-tls to need --manage-certs", err)
	}
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = "c", "k"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Errorf("Validate() = %v, want managed and file TLS refused together", err)
	}
	// Managed ingest TLS with the CA published nowhere: every agent's
	// handshake failed for ever, and nothing was said at the start.
	o = NewOptions()
	o.IngestTLS.Managed = true
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames, o.Certs.CAConfigMap = true, "pulse-system", []string{"pulse-aggregator.pulse-system.svc"}, ""
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--ingest-managed-tls needs --ca-configmap") {
		t.Errorf("Validate() = %v, want --ingest-managed-tls to need --ca-configmap", err)
	}
	o.Certs.CAConfigMap = "pulse-aggregator-ca"
	if err := o.Validate(); err != nil {
		t.Errorf("--ingest-managed-tls with --ca-configmap: %v", err)
	}
	// Sizes whose products overflowed: every pod cut to 2 samples at each
	// append, or every catalogue refused.
	o = NewOptions()
	o.Store.MaxSamplesPerPod, o.Store.MaxPodsPerAgent = 1<<55, 1<<62
	refusedNaming(t, o, "--max-samples-per-pod 36028797018963968: at most 16777216", "--max-pods-per-agent 4611686018427387904: at most 16777216")
	o.Store.MaxSamplesPerPod, o.Store.MaxPodsPerAgent = 1<<24, 1<<24
	if err := o.Validate(); err != nil {
		t.Errorf("--max-samples-per-pod and --max-pods-per-agent at 16777216: %v", err)
	}
	// Flags that silently undid each other, and a validity whose CA (three
	// of them) overflowed into the past.
	o = NewOptions()
	o.AgentAuth.Mode, o.AgentAuth.Audience = "tokenreview", ""
	o.Warmup.AgentDaemonSet, o.Warmup.ExpectedAgents = "pulse-system/pulse-agent", 3
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames, o.Certs.Validity = true, "pulse-system", []string{"a"}, 876000*time.Hour
	o.Serving.DebugAddr = "localhost"
	o.Provision.Enabled, o.ScalerTLS.CertFile, o.ScalerTLS.KeyFile = true, "c", "k"
	refusedNaming(t, o, "--provision-trigger-auth", "--agent-audience", "--expected-agents and --agent-daemonset", "--cert-validity 876000h0m0s: from 1h to 87600h0m0s", `--debug-addr "localhost"`)
}

// refusedNaming checks that o.Validate() names each of wants, and returns
// what it says ("" when nothing).
func refusedNaming(t *testing.T, o *Options, wants ...string) string {
	t.Helper()
	err := o.Validate()
	for _, want := range wants {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestAnAgentDaemonSetThatCannotExistIsRefused: --agent-daemonset a/b/c
// (or a name the API refuses) was taken, and the warm-up waited its whole
// time for a DaemonSet that cannot exist.
func TestAnAgentDaemonSetThatCannotExistIsRefused(t *testing.T) {
	for _, v := range []string{"a/b/c", "pulse-system/", "/pulse-agent", "pulse-agent", "Pulse/agent", "pulse.system/agent", "pulse-system/agent_1"} {
		o := NewOptions()
		o.Warmup.AgentDaemonSet = v
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--agent-daemonset") {
			t.Errorf("--agent-daemonset %q: Validate() = %v, want it refused", v, err)
		}
	}
	for _, v := range []string{"pulse-system/pulse-agent", "kube-system/pulse.agent"} {
		o := NewOptions()
		o.Warmup.AgentDaemonSet = v
		if err := o.Validate(); err != nil {
			t.Errorf("--agent-daemonset %q: %v", v, err)
		}
	}
}

// TestWarnsWhenMaxPodsOutgrowMemory: --forward-histograms took a pod held
// from 27 to 81 KB, 796 MiB at the chart's default maxPods against its
// 512Mi limit, without a word until the OOM kill. The aggregator now warns,
// at its start and at the first histograms, when --max-pods pods would not
// fit in 80 % of its memory limit (GOMEMLIMIT, from the container's).
func TestWarnsWhenMaxPodsOutgrowMemory(t *testing.T) {
	old := runtimedebug.SetMemoryLimit(512 << 20)
	defer runtimedebug.SetMemoryLimit(old)
	for _, tc := range []struct {
		maxPods    int
		histograms bool
		long       bool // --max-window 10m, --max-samples-per-pod 600: what one tenant's trigger may then make every pod keep
		warn       bool
	}{{10000, false, false, false}, {10000, true, false, false}, {20000, true, false, true}, {20000, false, false, false}, {30000, false, false, true},
		{10000, false, true, true}} {
		var logs syncbuf.Buffer
		o := NewOptions()
		o.Store.MaxPods = tc.maxPods
		if tc.long {
			o.Store.MaxWindow, o.Store.MaxSamplesPerPod = 10*time.Minute, 600
		}
		a := &Aggregator{opts: o, log: slog.New(slog.NewTextHandler(&logs, nil))}
		a.warnIfPodsOutgrowMemory(tc.histograms)
		if got := strings.Contains(logs.String(), "may not fit the memory limit"); got != tc.warn {
			t.Errorf("maxPods %d, histograms %v, long windows %v: warned %v, want %v\n%s", tc.maxPods, tc.histograms, tc.long, got, tc.warn, logs.String())
		}
	}
}

// TestWarnsWhenStreamsOutgrowMemory: the start's estimate counts pods
// alone, and a node's agent stream costs about 20 KB of its own: 10,000
// pods with histograms on nodes of one pod each need about 460 MiB, past
// 80 % of the chart's 512Mi, and nothing said so. Once agents stream, the
// aggregator warns (once, until they fit again) when --max-pods pods and
// the streams open would not fit; pods that alone would not are warned of
// at the start, not again.
func TestWarnsWhenStreamsOutgrowMemory(t *testing.T) {
	old := runtimedebug.SetMemoryLimit(512 << 20)
	defer runtimedebug.SetMemoryLimit(old)
	var logs syncbuf.Buffer
	o := NewOptions()
	o.Store.MaxPods = 10000
	a := &Aggregator{opts: o, log: slog.New(slog.NewTextHandler(&logs, nil))}
	warnings := func() int { return strings.Count(logs.String(), "agents' streams open now may not fit") }
	for i, step := range []struct {
		streams    int
		histograms bool
		fits       bool
		warnings   int // in all, so far
	}{
		{100, true, true, 0},    // two pods a node or more: 270 MiB
		{10000, false, true, 0}, // one a node, no histograms: about 350 MiB
		{10000, true, false, 1}, // one a node, histograms: about 460 MiB
		{10000, true, false, 1}, // once
		{2000, true, true, 1},   // nodes gone: fits again
		{12000, true, false, 2}, // and warned again when it does not
	} {
		if fits := a.warnIfStreamsOutgrowMemory(step.streams, step.histograms); fits != step.fits || warnings() != step.warnings {
			t.Errorf("step %d, %d streams, histograms %v: fits %v, %d warnings; want %v, %d\n%s", i, step.streams, step.histograms, fits, warnings(), step.fits, step.warnings, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "streams=12000") || !strings.Contains(logs.String(), "maxPods=10000") {
		t.Errorf("the warning names neither the streams nor --max-pods:\n%s", logs.String())
	}
	a.opts.Store.MaxPods = 30000 // the pods alone do not fit: the start's warning said so
	if fits := a.warnIfStreamsOutgrowMemory(30000, true); fits || warnings() != 2 {
		t.Errorf("warned of streams where the pods alone do not fit:\n%s", logs.String())
	}
	runtimedebug.SetMemoryLimit(math.MaxInt64)
	if !a.warnIfStreamsOutgrowMemory(1<<20, true) {
		t.Error("with no memory limit, pods and streams do not fit")
	}
}

// duplicated collects the same series twice: a collection error.
type duplicated struct{ desc *prometheus.Desc }

func (d duplicated) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }
func (d duplicated) Collect(ch chan<- prometheus.Metric) {
	for range 2 {
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, 1, "a")
	}
}

// TestMetricsServeWhatCollects: a series that fails to collect (here the
// second with the same labels) is left out, counted and logged (once a
// minute); every other is served, with 200.
func TestMetricsServeWhatCollects(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(duplicated{prometheus.NewDesc("test_broken", "Collected twice.", []string{"tenant"}, nil)})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "test_fine", Help: "Collected once."}, func() float64 { return 7 }))
	var logs syncbuf.Buffer
	srv := httptest.NewServer(metricsHandler(reg, slog.New(slog.NewTextHandler(&logs, nil))))
	defer srv.Close()
	var body []byte
	for range 2 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "\ntest_fine 7\n") || strings.Count(string(body), "test_broken{") != 1 {
			t.Fatalf("/metrics: %d\n%s\nwant 200, test_fine and test_broken's first series only", resp.StatusCode, body)
		}
	}
	// The second page counts the first's failure.
	if !strings.Contains(string(body), `promhttp_metric_handler_errors_total{cause="gathering"} 1`) {
		t.Errorf("the failure is not counted:\n%s", body)
	}
	if n := strings.Count(logs.String(), "metrics left out of /metrics"); n != 1 || !strings.Contains(logs.String(), "test_broken") {
		t.Errorf("%d log lines for two failing scrapes within a minute, want 1 naming the series:\n%s", n, logs.String())
	}
}

// TestScalerStreamsAreBounded: the flags reach the scaler port. With at
// most 2 streams, 1 of a namespace, KEDA's second stream of namespace a
// is refused, b's first is held, and c's, the third in all, is refused;
// /metrics counts both.
func TestScalerStreamsAreBounded(t *testing.T) {
	a := start(t, func(o *Options) {
		o.Warmup.Duration, o.Serving.MaxScalerStreams, o.Serving.MaxScalerStreamsPerNamespace = 0, 2, 1
	})
	keda := externalscaler.NewExternalScalerClient(dial(t, a.ScalerAddr()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(ns string) error {
		s, err := keda.StreamMetricSpec(ctx, &externalscaler.ScaledObjectRef{Name: "so", Namespace: ns, ScalerMetadata: map[string]string{"workspace": "llama"}})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	for _, c := range []struct {
		ns   string
		want string // "" held
	}{{"a", ""}, {"a", `namespace "a" holds 1 streams open`}, {"b", ""}, {"c", "the aggregator holds 2 streams open"}} {
		err := open(c.ns)
		if c.want == "" && err != nil || c.want != "" && (status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), c.want)) {
			t.Fatalf("a stream of namespace %s: %v; want %q", c.ns, err, c.want)
		}
	}
	body := metricsPage(t, a)
	for _, want := range []string{"\npulse_aggregator_scaler_streams 2\n", "\npulse_aggregator_scaler_streams_refused_total{limit=\"all\"} 1\n", "\npulse_aggregator_scaler_streams_refused_total{limit=\"namespace\"} 1\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", strings.TrimSpace(want))
		}
	}
}

// The relays' certificate: its Secret and names go together, and each is
// one a Secret and a certificate can carry.
func TestValidateTheRelaysCertificate(t *testing.T) {
	o := NewOptions()
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames = true, "pulse-system", []string{"pulse-aggregator.pulse-system.svc"}
	o.Certs.RelaySecret = "pulse-relay-tls"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--relay-cert-secret and --relay-cert-dns-name go together") {
		t.Errorf("a relay secret without names: Validate() = %v", err)
	}
	o.Certs.RelaySecret, o.Certs.RelayDNSNames = "Relay_TLS", []string{"pulse-relay.pulse-system.svc", "pulse-relay:9091"}
	err := o.Validate()
	for _, want := range []string{`--relay-cert-secret "Relay_TLS"`, `--relay-cert-dns-name "pulse-relay:9091"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	// The Secret the relays' copy would overwrite: the managed
	// certificates', or KEDA's credentials' in the same namespace.
	o.Certs.RelayDNSNames = []string{"pulse-relay.pulse-system.svc"}
	o.Certs.Secret, o.Certs.TriggerAuthName, o.Certs.KEDANamespace = "pulse-certs", "pulse-creds", "pulse-system"
	for _, name := range []string{"pulse-certs", "pulse-creds"} {
		o.Certs.RelaySecret = name
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "name another") {
			t.Errorf("--relay-cert-secret %s: Validate() = %v, want it refused", name, err)
		}
	}
	o.Certs.RelaySecret = "pulse-relay-tls"
	if err := o.Validate(); err != nil {
		t.Errorf("a relay secret with its names: %v", err)
	}
	// The Secret retired is removed: never one the aggregator keeps, and
	// a name a Secret can carry.
	for _, name := range []string{"pulse-relay-tls", "pulse-certs", "pulse-creds"} {
		o.Certs.RetiredRelaySecret = name
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "it would be removed") {
			t.Errorf("--relay-cert-secret-retired %s: Validate() = %v, want it refused", name, err)
		}
	}
	o.Certs.RetiredRelaySecret = "Relay_TLS"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `--relay-cert-secret-retired "Relay_TLS"`) {
		t.Errorf("--relay-cert-secret-retired Relay_TLS: Validate() = %v, want it refused", err)
	}
	o.Certs.RelaySecret, o.Certs.RelayDNSNames, o.Certs.RetiredRelaySecret = "", nil, "pulse-relay-tls"
	if err := o.Validate(); err != nil {
		t.Errorf("the relays' Secret retired: %v", err)
	}
	// KEDA's copy written over the managed certificates' own Secret (pulse
	// in KEDA's namespace, both named alike) served KEDA's client pair as
	// the server's and made a new CA at every check; refused at start,
	// and taken in another namespace.
	o.Certs.RetiredRelaySecret, o.Certs.Secret = "", "pulse-creds"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `--cert-secret "pulse-creds" is KEDA's credentials' Secret`) {
		t.Errorf("--cert-secret as KEDA's credentials' Secret: Validate() = %v, want it refused", err)
	}
	o.Certs.KEDANamespace = "keda"
	if err := o.Validate(); err != nil {
		t.Errorf("--cert-secret named as KEDA's Secret in another namespace: %v", err)
	}
}

// TestAScalerRequestPastAnyValidOneIsRefusedUnread: a request on the
// scaler port larger than any trigger's valid metadata (64 keys of 1 KiB
// and their values) is refused before it is decoded; the largest valid
// one is served. At gRPC's 4 MiB default, a ScaledObject of 130,000
// empty keys was decoded whole (26 MB at each of KEDA's polls) before its
// keys were counted.
func TestAScalerRequestPastAnyValidOneIsRefusedUnread(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	keda := externalscaler.NewExternalScalerClient(dial(t, a.ScalerAddr()))
	largest := map[string]string{"workspace": "llama"}
	for i := len(largest); i < 64; i++ {
		largest[fmt.Sprintf("%01023d", i)] = strings.Repeat("v", 1024)
	}
	ref := &externalscaler.ScaledObjectRef{Name: strings.Repeat("s", 253), Namespace: strings.Repeat("n", 63), ScalerMetadata: largest}
	if _, err := keda.GetMetricSpec(context.Background(), ref); err != nil {
		t.Fatalf("the largest valid trigger (%d bytes): %v", proto.Size(ref), err)
	}
	many := map[string]string{"workspace": "llama"}
	for i := range 130_000 {
		many[strconv.FormatInt(int64(i), 36)] = ""
	}
	_, err := keda.GetMetricSpec(context.Background(), &externalscaler.ScaledObjectRef{Name: "so", Namespace: "ns", ScalerMetadata: many})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a trigger of 130,000 empty keys: %v; want ResourceExhausted, unread", err)
	}
}

// withKEDAsTLS is an aggregator whose scaler port serves mutual TLS,
// holding 2 connections of one address (and as set) and KEDA's
// credentials for it.
func withKEDAsTLS(t *testing.T, set func(*Options)) (*Aggregator, credentials.TransportCredentials) {
	t.Helper()
	ca := testpki.NewCA(t)
	cert, key := ca.Issue(t, "pulse-aggregator", 2, x509.ExtKeyUsageServerAuth)
	kcert, kkey := ca.Issue(t, "keda", 3, x509.ExtKeyUsageClientAuth)
	paths := testpki.Write(t, t.TempDir(), map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca.PEM}, "tls.crt", "tls.key", "ca.crt")
	a := start(t, func(o *Options) {
		o.Warmup.Duration, o.Serving.MaxScalerConnectionsPerAddress = 0, 2
		o.ScalerTLS.CertFile, o.ScalerTLS.KeyFile, o.ScalerTLS.ClientCAFile = paths[0], paths[1], paths[2]
		if set != nil {
			set(o)
		}
	})
	pair, err := tls.X509KeyPair(kcert, kkey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return a, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// kedaDial is a connection of KEDA's to a's scaler port, and the number
// of times it has dialled.
func kedaDial(t *testing.T, a *Aggregator, creds credentials.TransportCredentials) (externalscaler.ExternalScalerClient, *atomic.Int32) {
	t.Helper()
	var dials atomic.Int32
	conn, err := grpc.NewClient(a.ScalerAddr(), grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return externalscaler.NewExternalScalerClient(conn), &dials
}

// askSpec is KEDA's GetMetricSpec for a ScaledObject of namespace ns.
func askSpec(c externalscaler.ExternalScalerClient, ns string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.GetMetricSpec(ctx, &externalscaler.ScaledObjectRef{Name: "so", Namespace: ns, ScalerMetadata: map[string]string{"workspace": "llama"}})
	return err
}

// fullPort is withKEDAsTLS with a scaler port of 4 connections, each
// charged settle before it may be closed for room.
func fullPort(t *testing.T, settle time.Duration) (*Aggregator, credentials.TransportCredentials) {
	return withKEDAsTLS(t, func(o *Options) { o.Serving.maxScalerConns, o.Serving.scalerSettle = 4, settle })
}

// TestAFullScalerPortMakesRoomFromTheNamespaceHoldingTheMost: a tenant's
// spellings of the aggregator's address (KEDA's verified connections, out
// of the bound by address) filled the scaler port in all, and a
// connection of another namespace, or KEDA's shared one at its next
// connect, was closed at once. Now the port makes room by closing a
// connection whose namespaces are all past their share, of the namespace
// holding the most; the shared connection, naming namespaces within
// theirs, is never closed.
func TestAFullScalerPortMakesRoomFromTheNamespaceHoldingTheMost(t *testing.T) {
	a, creds := fullPort(t, time.Nanosecond)
	shared, sharedDials := kedaDial(t, a, creds)
	for _, ns := range []string{"team-a", "team-b"} {
		if err := askSpec(shared, ns); err != nil {
			t.Fatalf("the shared connection, %s: %v", ns, err)
		}
	}
	for i := range 3 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatalf("the tenant's connection %d: %v", i+1, err)
		}
	}
	// Full: another namespace's new connection is served all the same,
	// and so are the tenant's, each in the place of one of its own.
	other, _ := kedaDial(t, a, creds)
	if err := askSpec(other, "team-c"); err != nil {
		t.Fatalf("another namespace's connection, the port full: %v", err)
	}
	for i := range 4 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatalf("the tenant's connection %d, the port full: %v", i+4, err)
		}
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := askSpec(shared, ns); err != nil || sharedDials.Load() != 1 {
			t.Fatalf("the shared connection, %s: %v, dialled %d times; want it kept", ns, err, sharedDials.Load())
		}
	}
	if err := askSpec(other, "team-c"); err != nil {
		t.Fatalf("the other namespace's connection: %v", err)
	}
	if n := testutil.ToFloat64(a.scalerConns.evicted); n != 5 {
		t.Fatalf("%v connections evicted, want 5: the tenant's, one for each new one", n)
	}
}

// TestNamespacesActingTogetherCannotLockTheScalerPort: a tenant's two
// namespaces writing the same spellings make connections that each name
// both; charged to neither (a connection of two namespaces or more was
// taken for KEDA's shared one), they filled the port for good, and the
// shared connection was closed at once at its next connect. Each is past
// its share in both (found in a review).
func TestNamespacesActingTogetherCannotLockTheScalerPort(t *testing.T) {
	a, creds := fullPort(t, time.Nanosecond)
	for i := range 4 {
		c, _ := kedaDial(t, a, creds)
		for _, ns := range []string{"tenant-a", "tenant-b"} {
			if err := askSpec(c, ns); err != nil {
				t.Fatalf("the tenant's connection %d, %s: %v", i+1, ns, err)
			}
		}
	}
	shared, _ := kedaDial(t, a, creds) // KEDA's shared one, reconnecting
	if err := askSpec(shared, "team-c"); err != nil {
		t.Fatalf("the shared connection, the port full of one tenant's spellings: %v; want it served", err)
	}
}

// TestTheSharedConnectionIsNotClosedBeforeItSettles: after a restart the
// shared connection, the first to connect again, may make its first call
// for the tenant whose spellings then fill the port: charged to that
// namespace alone, and the oldest, it was closed for the tenant's next
// connection before its other namespaces' calls came. Connections not yet
// charged for the settling time go last, the newest first (found in a
// review).
func TestTheSharedConnectionIsNotClosedBeforeItSettles(t *testing.T) {
	a, creds := fullPort(t, time.Hour)
	shared, dials := kedaDial(t, a, creds)
	if err := askSpec(shared, "spellings"); err != nil { // its first call: the tenant's
		t.Fatal(err)
	}
	for i, ns := range []string{"spellings", "spellings", "team-b"} {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, ns); err != nil {
			t.Fatalf("connection %d, %s: %v", i+1, ns, err)
		}
	}
	next, _ := kedaDial(t, a, creds) // one of the tenant's, reconnecting
	if err := askSpec(next, "spellings"); err != nil {
		t.Fatalf("the tenant's next connection, none settled: %v", err)
	}
	if err := askSpec(shared, "team-a"); err != nil || dials.Load() != 1 {
		t.Fatalf("the shared connection: %v, dialled %d times; want it kept", err, dials.Load())
	}
}

// TestOneTenantsFullPortLetsTheSharedConnectionIn: after an aggregator's
// restart the tenant's spellings, retrying, may take every place before
// KEDA's shared connection comes back. With the share over the namespaces
// charged alone, the tenant's one namespace held exactly its share, none
// was past it, and the shared connection was refused at every retry. The
// new connection's namespace counts (found in a review).
func TestOneTenantsFullPortLetsTheSharedConnectionIn(t *testing.T) {
	a, creds := fullPort(t, time.Nanosecond)
	for i := range 4 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatalf("the tenant's connection %d: %v", i+1, err)
		}
	}
	time.Sleep(50 * time.Millisecond)  // settled
	shared, _ := kedaDial(t, a, creds) // KEDA's shared one, reconnecting
	for try := range 3 {
		if err := askSpec(shared, "team-a"); err != nil {
			t.Fatalf("the shared connection (try %d), the port full of one tenant's spellings: %v; want it served", try+1, err)
		}
	}
}

// TestOversizedCallsLeaveNoConnectionUnclosable: a trigger whose metadata
// is past the request's bound makes every call on its connection
// ResourceExhausted before any interceptor runs: never charged, such
// connections were never closed for room, and enough of them held the
// port for good. A connection whose calls named no namespace goes first
// (found in a review).
func TestOversizedCallsLeaveNoConnectionUnclosable(t *testing.T) {
	a, creds := fullPort(t, time.Nanosecond)
	big := map[string]string{"workspace": "llama"}
	for i := range 300 {
		big[fmt.Sprintf("k%04d", i)] = strings.Repeat("v", 1024)
	}
	for i := range 4 {
		c, _ := kedaDial(t, a, creds)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.GetMetricSpec(ctx, &externalscaler.ScaledObjectRef{Name: "so", Namespace: "spellings", ScalerMetadata: big})
		cancel()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the tenant's oversized call %d: %v, want ResourceExhausted", i+1, err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	shared, _ := kedaDial(t, a, creds) // KEDA's shared one, reconnecting
	if err := askSpec(shared, "team-c"); err != nil {
		t.Fatalf("the shared connection, the port full of a tenant's oversized spellings: %v; want it served", err)
	}
}

// TestATenantsChurnKeepsNoOtherOut: KEDA reconnects a closed connection at
// once, so one eviction of the tenant's starts a chain that leaves every
// one of its connections new; with settled connections alone closable,
// the port then closed none for another tenant's new connection (or the
// shared one's) for the settling time, the tenant far past its share.
// Connections not settled may go too, after the settled (found in a
// review).
func TestATenantsChurnKeepsNoOtherOut(t *testing.T) {
	a, creds := fullPort(t, 2*time.Second)
	shared, _ := kedaDial(t, a, creds)
	for _, ns := range []string{"team-a", "team-b"} {
		if err := askSpec(shared, ns); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatalf("the tenant's connection %d: %v", i+1, err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // all settled
	// The tenant's spellings reconnect in a chain, each closing the oldest
	// settled one of its own.
	for i := range 3 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatalf("the tenant's reconnect %d: %v", i+1, err)
		}
	}
	// Another tenant's first connection (its own TriggerAuthentication):
	// team-c holds none, the tenant 3 of 4 (its share 4/3).
	other, _ := kedaDial(t, a, creds)
	if err := askSpec(other, "team-c"); err != nil {
		t.Fatalf("another tenant's new connection, the tenant holding 3 of 4 (all new): %v; want it served", err)
	}
}

// oversized is a call past the request's bound: refused unread, its
// connection charged to no namespace.
func oversized(t *testing.T, c externalscaler.ExternalScalerClient) {
	t.Helper()
	big := map[string]string{"workspace": "llama"}
	for i := range 300 {
		big[fmt.Sprintf("k%04d", i)] = strings.Repeat("v", 1024)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.GetMetricSpec(ctx, &externalscaler.ScaledObjectRef{Name: "so", Namespace: "spellings", ScalerMetadata: big})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized call: %v", err)
	}
}

// TestAChurnOfNoNamespaceKeepsNoOtherOut: the churn of
// TestATenantsChurnKeepsNoOtherOut with triggers past the request's bound,
// every connection of the tenant naming no namespace: unsettled, none was
// closable, and every new connection was refused for the settling time
// (found in a review).
func TestAChurnOfNoNamespaceKeepsNoOtherOut(t *testing.T) {
	a, creds := fullPort(t, 2*time.Second)
	for range 4 {
		c, _ := kedaDial(t, a, creds)
		oversized(t, c)
	}
	time.Sleep(2500 * time.Millisecond) // all settled: class 0
	for range 4 {                       // KEDA reconnecting each one closed, each closing the next
		c, _ := kedaDial(t, a, creds)
		oversized(t, c)
	}
	other, _ := kedaDial(t, a, creds)
	if err := askSpec(other, "team-c"); err != nil {
		t.Fatalf("another tenant's new connection, the port full of the tenant's unnamed, unsettled ones: %v; want it served", err)
	}
}

// TestReconnectsThatHaveNotCalledKeepNoOtherOut: KEDA connects again at
// once to an address whose connection closed, and calls only when one of
// its streams retries (2 s, doubling to a minute): a chain of such
// reconnects left the tenant's called connections at its share and the
// rest uncalled, none closable, and the shared connection refused. One
// that has made no call within a grace goes last (found in a review).
func TestReconnectsThatHaveNotCalledKeepNoOtherOut(t *testing.T) {
	a, creds := fullPort(t, time.Nanosecond)
	for range 4 {
		c, _ := kedaDial(t, a, creds)
		if err := askSpec(c, "spellings"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // reconnects, no call yet: the tenant's called ones fall to its share
		conn, err := grpc.NewClient(a.ScalerAddr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		conn.Connect()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatalf("reconnect: %v", s)
			}
		}
		cancel()
	}
	shared, _ := kedaDial(t, a, creds)
	if err := askSpec(shared, "team-c"); err != nil {
		t.Fatalf("the shared connection, the tenant's reconnects not yet called: %v; want it served", err)
	}
}

// TestKEDAsVerifiedConnectionsAreNotBoundByItsAddress: KEDA's operator
// keeps a connection for each scaler address and TLS setting its
// triggers write, and a tenant writes its own: one tenant's spellings of
// the aggregator's address took every place KEDA's address had on the
// scaler port (--max-scaler-connections-per-address), and the connection
// every other tenant's triggers share was closed at its next connect. A
// connection whose client certificate the port verified is out of that
// bound (within the port's in all); one that has not handshaken still
// counts.
func TestKEDAsVerifiedConnectionsAreNotBoundByItsAddress(t *testing.T) {
	a, creds := withKEDAsTLS(t, nil)
	ref := &externalscaler.ScaledObjectRef{Name: "so", Namespace: "ns", ScalerMetadata: map[string]string{"workspace": "llama"}}
	// Four of KEDA's connections (four spellings), each its own, more
	// than the address's bound of 2.
	for i := range 4 {
		conn, err := grpc.NewClient(a.ScalerAddr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if _, err := externalscaler.NewExternalScalerClient(conn).GetMetricSpec(context.Background(), ref); err != nil {
			t.Fatalf("KEDA's connection %d: %v", i+1, err)
		}
	}
	// Two that never handshake hold the address's places; a third is
	// closed at once.
	for range 2 {
		c, err := net.Dial("tcp", a.ScalerAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	c, err := net.Dial("tcp", a.ScalerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection that has not handshaken: read %v; want it closed at once", err)
	}
}
