package ctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/test/testpki"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

const goodSO = `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama-so, namespace: demo}
spec:
  scaleTargetRef: {apiVersion: kaito.sh/v1alpha1, kind: InferenceSet, name: llama}
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", inferenceSet: llama, metric: waiting, threshold: "10"}
  - type: cron
    metadata: {timezone: UTC}
`

func TestCheckValidAndInvalid(t *testing.T) {
	// The shipped default, percentile and tuned ScaledObjects, and those of
	// docs/simulation.md's signals (three of them averages left at KEDA's
	// AverageValue until 2026-12-01), are valid.
	signals, err := filepath.Glob("../../docs/simulation/signals/*-scaledobject.yaml")
	if err != nil || len(signals) < 7 {
		t.Fatalf("the signals' ScaledObjects: %v, %v", signals, err)
	}
	shipped := append([]string{"../../docs/simulation/default-scaledobject.yaml", "../../docs/simulation/p90-scaledobject.yaml",
		"../../docs/simulation/tuned-scaledobject.yaml"}, signals...)
	if code, out, _ := run(append([]string{"check"}, shipped...)...); code != 0 || strings.Count(out, ": valid") != len(shipped) {
		t.Fatalf("shipped ScaledObjects: exit %d\n%s", code, out)
	}
	bad := goodSO + "---\n" + typoSO + `---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: window, namespace: demo}
spec:
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", workspace: llama, window: 5m}
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: elsewhere, namespace: demo}
spec:
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", workspace: llama, namespace: other}
---
apiVersion: kaito.sh/v1alpha1
kind: InferenceSet
metadata:
  name: planned
  namespace: demo
  annotations: {pulse.io/autoscale: "true", pulse.io/slo-ttft: fast}
`
	checkSays(t, bad,
		"ScaledObject demo/llama-so: valid",
		"ScaledObject demo/typo: trigger 1: trigger metadata: unknown key treshold (did you mean threshold?)",
		`ScaledObject demo/window: trigger 1: trigger metadata "window"`,
		"ScaledObject demo/elsewhere: trigger 1: namespace other",
		"InferenceSet demo/planned: annotation pulse.io/slo-ttft",
		"4 problems")
	// The aggregator's own flags move the limits.
	if code, out, _ := run("check", "--max-window", "10m", "--allow-cross-namespace-triggers", write(t, bad)); code != 1 || strings.Contains(out, "demo/window: trigger") ||
		strings.Contains(out, "demo/elsewhere: trigger") {
		t.Fatalf("with the aggregator's flags: exit %d\n%s", code, out)
	}
}

// TestCheckHoldsTheProvisionersLimits: the aggregator's cap on replicas, as
// its flag, and the ScaledObject names KEDA takes.
func TestCheckHoldsTheProvisionersLimits(t *testing.T) {
	big := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: big\n  namespace: demo\n  annotations: {pulse.io/autoscale: \"true\", pulse.io/max-replicas: \"500\"}\n"
	if code, out, _ := run("check", write(t, big)); code != 0 {
		t.Errorf("500 replicas with no cap: exit %d\n%s", code, out)
	}
	if code, out, _ := run("check", "--provision-max-replicas", "64", write(t, big)); code != 1 || !strings.Contains(out, "past the cluster's cap of 64") {
		t.Errorf("500 replicas with a cap of 64: exit %d\n%s", code, out)
	}
	if code, _, errs := run("check", "--provision-max-replicas", "-1", write(t, big)); code != 2 {
		t.Errorf("a negative cap: exit %d, want 2\n%s", code, errs)
	}
	// A name KEDA cannot take for the ScaledObject pulse would make.
	long := strings.Replace(big, "name: big", "name: "+strings.Repeat("l", 64), 1)
	if code, out, _ := run("check", write(t, long)); code != 1 || !strings.Contains(out, "KEDA takes ScaledObject names of at most 63") {
		t.Errorf("a 64-character workload name: exit %d\n%s", code, out)
	}
}

// TestCheckSplitsDocumentsAsKubectl: a separator with a comment or blanks
// after it once hid the document after it, reported valid; kubectl get -o
// yaml writes a List, whose items are read.
func TestCheckSplitsDocumentsAsKubectl(t *testing.T) {
	typo := "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: typo, namespace: demo}\nspec:\n  triggers:\n  - type: external-push\n    metadata: {scalerAddress: \"x:9090\", workspace: llama, treshold: \"10\"}\n"
	for _, sep := range []string{"--- # the bad one\n", "---   \n", "---\r\n"} {
		if code, out, _ := run("check", write(t, goodSO+sep+typo)); code != 1 || !strings.Contains(out, "demo/typo: trigger 1") {
			t.Errorf("separator %q: exit %d, want 1 naming demo/typo\n%s", sep, code, out)
		}
	}
	list := "apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.TrimSuffix(typo, "\n"), "\n", "\n  ") + "\n"
	if code, out, _ := run("check", write(t, list)); code != 1 || !strings.Contains(out, "demo/typo: trigger 1") {
		t.Errorf("a List: exit %d, want 1 naming demo/typo\n%s", code, out)
	}
	if code, _, _ := run("check", write(t, "kind: ConfigMap\n")); code != 1 {
		t.Fatalf("nothing of pulse's: exit %d, want 1", code)
	}
	// A trigger of type external is another scaler's: it was read as
	// pulse's, and said valid.
	other := strings.Replace(typo, "type: external-push", "type: external", 1)
	if code, out, _ := run("check", write(t, other)); code != 1 || !strings.Contains(out, "no pulse trigger") {
		t.Fatalf("another scaler's external trigger: exit %d, want 1 and nothing of pulse's\n%s", code, out)
	}
	if code, _, _ := run("check"); code != 2 {
		t.Fatalf("no file: exit %d, want 2", code)
	}
}

// serve runs a real scaler over loopback, and its debug endpoint, on a
// store with one pod of InferenceSet llama at 25 waiting.
func serve(t *testing.T) (scalerAddr, debugURL string) {
	t.Helper()
	st := store.New(store.Options{Retention: time.Minute})
	k := store.Key{Namespace: "demo", Kind: store.KindInferenceSet, Name: "llama"}
	st.Upsert(store.Source{Node: "n"}, []store.PodInfo{{UID: "u", Namespace: "demo", Name: "llama-0", Ready: true, Workloads: []store.Key{k}}}, false)
	r := store.Report{UID: "u", Sample: store.Sample{TimeMs: time.Now().UnixMilli()}}
	r.Values.Set(metric.Waiting, 25)
	st.Add([]store.Report{r})
	sc := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	addr := serveScaler(t, sc)
	mux := http.NewServeMux()
	(&debug.Handler{Store: st, Triggers: sc, FreshFor: time.Minute, MaxWindow: time.Minute}).Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return addr, hs.URL
}

func TestQueryAsksWhatKEDAWould(t *testing.T) {
	addr, _ := serve(t)
	code, out, errs := run("query", "--scaler", addr, "-f", write(t, goodSO))
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{"ScaledObject demo/llama-so trigger 1:", "target 10 per replica", "GetMetrics: 25", "IsActive: true", "): 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("query output lacks %q:\n%s", want, out)
		}
	}
	// A refused trigger: the error, exit 1.
	bad := strings.Replace(goodSO, `threshold: "10"`, `threshold: "ten"`, 1)
	if code, out, _ := run("query", "--scaler", addr, "-f", write(t, bad)); code != 1 || !strings.Contains(out, "InvalidArgument") {
		t.Fatalf("a bad threshold: exit %d\n%s", code, out)
	}
	if code, _, _ := run("query", "--scaler", addr); code != 2 {
		t.Fatalf("no file: exit %d, want 2", code)
	}
	// A manifest naming no namespace (applied with -n): KEDA would send
	// the one it is applied in; the scaler refuses a call with none.
	anon := strings.Replace(goodSO, "{name: llama-so, namespace: demo}", "{name: llama-so}", 1)
	if anon == goodSO {
		t.Fatal("the test's ScaledObject names no namespace to take out")
	}
	if code, out, _ := run("query", "--scaler", addr, "-f", write(t, anon)); code != 1 || !strings.Contains(out, "set its metadata.namespace") {
		t.Fatalf("no namespace: exit %d\n%s", code, out)
	}
}

func TestTopShowsTheDecisions(t *testing.T) {
	addr, url := serve(t)
	if code, out, errs := run("query", "--scaler", addr, "-f", write(t, goodSO)); code != 0 {
		t.Fatalf("query: %d %s %s", code, out, errs)
	}
	code, out, errs := run("top", "--debug", url, "-n", "1")
	if code != 0 || !strings.Contains(out, "demo/llama-so") || !strings.Contains(out, "waiting") {
		t.Fatalf("top: exit %d\n%s%s", code, out, errs)
	}
	if code, _, _ := run("top", "--debug", "http://127.0.0.1:1", "-n", "1"); code != 1 {
		t.Fatalf("top against nothing: exit %d, want 1", code)
	}
	// Nonsense flags are refused, not run (--interval 0 polled without a
	// pause).
	for _, args := range [][]string{{"--interval", "0"}, {"--interval", "-5s"}, {"-n", "-1"}} {
		if code, _, errs := run(append([]string{"top", "--debug", url}, args...)...); code != 2 || !strings.Contains(errs, "want an interval above 0") {
			t.Errorf("top %v: exit %d, want 2\n%s", args, code, errs)
		}
	}
	if code, _, errs := run("query", "--scaler", addr, "-f", write(t, goodSO), "--timeout", "-1s"); code != 2 || !strings.Contains(errs, "--timeout -1s") {
		t.Errorf("query --timeout -1s: exit %d, want 2\n%s", code, errs)
	}
	// What a server sends is printed as text: a terminal's escapes in it
	// are not passed on.
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\x1b]0;owned\x07\x1b[2Jrow\u009b31m\n")
	}))
	defer hostile.Close()
	if code, out, _ := run("top", "--debug", hostile.URL, "-n", "1"); code != 0 || strings.ContainsAny(out, "\x1b\x07\u009b") || !strings.Contains(out, "ok\uFFFD]0;owned") {
		t.Fatalf("top of a hostile server: exit %d, output %q", code, out)
	}
}

// top asks one namespace's triggers with --namespace (the path a tenant is
// granted), and goes on past a 503 (the aggregator answers a few debug
// pages at once) to the next refresh.
func TestTopOneNamespaceAndPastABusyAnswer(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		if len(paths) == 1 {
			http.Error(w, "4 debug answers are under way", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "SCALEDOBJECT\nteam-a/llama-so\n")
	}))
	defer srv.Close()
	code, out, errs := run("top", "--debug", srv.URL, "--namespace", "team-a", "-n", "2", "--interval", "1ms")
	if code != 0 || !strings.Contains(out, "team-a/llama-so") || !strings.Contains(errs, "under way") || len(paths) != 2 || paths[1] != "/debug/triggers/team-a" {
		t.Fatalf("top --namespace past a 503: exit %d, paths %v\n%s%s", code, paths, out, errs)
	}
	// A namespace that is no DNS label is refused, nothing asked: "."
	// was /debug/triggers/., which the server redirects to every
	// namespace's page, shown under the one asked for.
	paths = nil
	for _, ns := range []string{".", "..", "team-a/x", "Team-A"} {
		if code, out, errs := run("top", "--debug", srv.URL, "--namespace", ns, "-n", "1"); code != 2 || len(paths) != 0 || strings.Contains(out, "llama-so") || !strings.Contains(errs, "is no namespace") {
			t.Fatalf("top --namespace %q: exit %d, paths %v\n%s%s; want 2, nothing asked", ns, code, paths, out, errs)
		}
	}
	// A 503 at the last refresh is the answer.
	if code, _, errs := run("top", "--debug", srv.URL, "-n", "1"); code != 1 || !strings.Contains(errs, "503") {
		t.Fatalf("top -n 1 answered 503: exit %d, want 1\n%s", code, errs)
	}
}

func TestVersionAndUsage(t *testing.T) {
	if code, out, _ := run("version"); code != 0 || !strings.HasPrefix(out, "pulsectl ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, _, errs := run("frobnicate"); code != 2 || !strings.Contains(errs, "unknown command") {
		t.Fatalf("unknown command: %d %q", code, errs)
	}
}

// TestTopReadsTheDebugEndpointWithATokenOverTLS: with the chart's
// debug.localhostOnly=false the debug endpoints are on the http port, over
// TLS with the aggregator's own CA and behind a token review; top could
// read neither. It now trusts --ca-cert, verifies --server-name, and sends
// the token in --token-file, never in plaintext but to a loopback address.
func TestTopReadsTheDebugEndpointWithATokenOverTLS(t *testing.T) {
	ca := testpki.NewCA(t)
	cert, key := ca.Issue(t, "pulse-aggregator", 2, x509.ExtKeyUsageServerAuth)
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer reader-token" {
			http.Error(w, "the token is not authenticated", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, "SCALEDOBJECT  demo/llama-so\n")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	paths := testpki.Write(t, dir, map[string][]byte{"ca.crt": ca.PEM, "token": []byte("reader-token\n"), "wrong": []byte("nope")}, "ca.crt", "token", "wrong")
	base := []string{"top", "--debug", srv.URL, "-n", "1", "--ca-cert", paths[0]}
	if code, out, errs := run(append(base, "--token-file", paths[1], "--server-name", "localhost")...); code != 0 || !strings.Contains(out, "demo/llama-so") {
		t.Fatalf("top with the CA and a token: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := run(append(base, "--token-file", paths[2])...); code != 1 || !strings.Contains(errs, "401") {
		t.Errorf("top with a token refused: exit %d, want 1 and the 401\n%s", code, errs)
	}
	if code, _, errs := run(append(base, "--token-file", paths[1], "--server-name", "pulse-aggregator.pulse-system.svc")...); code != 1 || !strings.Contains(errs, "certificate") {
		t.Errorf("top verifying a name the certificate lacks: exit %d, want 1\n%s", code, errs)
	}
	if code, _, errs := run("top", "--debug", srv.URL, "-n", "1", "--token-file", paths[1]); code != 1 || !strings.Contains(errs, "certificate") {
		t.Errorf("top without the aggregator's CA: exit %d, want 1 (not trusted)\n%s", code, errs)
	}
	// A token past what the aggregator reviews is refused before any
	// request, naming the bound (past its headers' bound it got a bare
	// 431 from the server).
	long := filepath.Join(dir, "long")
	if err := os.WriteFile(long, []byte(strings.Repeat("t", app.MaxBearerToken+1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("top", "-n", "1", "--debug", srv.URL, "--token-file", long); code != 2 || !strings.Contains(errs, "at most 16384 bytes") {
		t.Errorf("top with a token of 16 KiB + 1: exit %d, want 2 and the bound named\n%s", code, errs)
	}
	// Bad usage, refused before any request.
	for _, args := range [][]string{
		{"--debug", "http://10.0.0.1:8080", "--token-file", paths[1]}, // a token in plaintext off the machine
		{"--debug", "http://127.0.0.1:1", "--ca-cert", paths[0]},      // a CA for plain HTTP
		{"--debug", srv.URL, "--token-file", filepath.Join(dir, "missing")},
		{"--debug", srv.URL, "--ca-cert", paths[1]}, // not a certificate
		{"--debug", "ftp://127.0.0.1:1"},
	} {
		if code, _, errs := run(append([]string{"top", "-n", "1"}, args...)...); code != 2 {
			t.Errorf("top %v: exit %d, want 2\n%s", args, code, errs)
		}
	}
}

// slowScaler answers each of KEDA's calls after delay.
// deadlineScaler answers KEDA's three calls after delay, recording each
// call's deadline as the server has it.
type deadlineScaler struct {
	externalscaler.UnimplementedExternalScalerServer
	delay     time.Duration
	mu        sync.Mutex
	deadlines []time.Time
}

func (s *deadlineScaler) called(ctx context.Context) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, d)
	s.mu.Unlock()
	time.Sleep(s.delay)
}

func (s *deadlineScaler) GetMetricSpec(ctx context.Context, _ *externalscaler.ScaledObjectRef) (*externalscaler.GetMetricSpecResponse, error) {
	s.called(ctx)
	return &externalscaler.GetMetricSpecResponse{MetricSpecs: []*externalscaler.MetricSpec{{MetricName: "m", TargetSizeFloat: 10}}}, nil
}

func (s *deadlineScaler) GetMetrics(ctx context.Context, _ *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	s.called(ctx)
	return &externalscaler.GetMetricsResponse{MetricValues: []*externalscaler.MetricValue{{MetricName: "m", MetricValueFloat: 25}}}, nil
}

func (s *deadlineScaler) IsActive(ctx context.Context, _ *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	s.called(ctx)
	return &externalscaler.IsActiveResponse{Result: true}, nil
}

// serveScaler serves sc as an external scaler on loopback until the test
// ends, and returns its address.
func serveScaler(t *testing.T, sc externalscaler.ExternalScalerServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	externalscaler.RegisterExternalScalerServer(g, sc)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// valueScaler answers a target and a value.
type valueScaler struct {
	externalscaler.UnimplementedExternalScalerServer
	target, value float64
}

func (s valueScaler) GetMetricSpec(context.Context, *externalscaler.ScaledObjectRef) (*externalscaler.GetMetricSpecResponse, error) {
	return &externalscaler.GetMetricSpecResponse{MetricSpecs: []*externalscaler.MetricSpec{{MetricName: "m", TargetSizeFloat: s.target}}}, nil
}

func (s valueScaler) GetMetrics(context.Context, *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	return &externalscaler.GetMetricsResponse{MetricValues: []*externalscaler.MetricValue{{MetricName: "m", MetricValueFloat: s.value}}}, nil
}

func (s valueScaler) IsActive(context.Context, *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	return &externalscaler.IsActiveResponse{Result: true}, nil
}

// TestQueryDesiredIsTheHPAs: the desired count query prints is the HPA's,
// made on the thousandths KEDA gives it: three pods' 0.4 summed to
// 1.2000000000000002, over a target of 0.4, printed 4 where the HPA asks
// for 3 (found in a review, 2026-12-05).
func TestQueryDesiredIsTheHPAs(t *testing.T) {
	addr := serveScaler(t, valueScaler{target: 0.4, value: math.Nextafter(1.2, 2)})
	code, out, errs := run("query", "--scaler", addr, "-f", write(t, goodSO))
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "min/max): 3\n") {
		t.Fatalf("query printed:\n%s\nwant 3 desired replicas", out)
	}
}

// TestQueryTimeoutIsPerCall: --timeout bounds each of KEDA's three calls,
// as the README and the flag say; one context bounded all three, so three
// calls of 400 ms each failed a --timeout of 1s. Each call's deadline is
// its own: it moves on with the call's start, by at least the call before
// it took (one context for all gave each the same deadline). No call
// comes near its timeout: the test reads the deadlines, not a race
// against them.
func TestQueryTimeoutIsPerCall(t *testing.T) {
	sc := &deadlineScaler{delay: 200 * time.Millisecond}
	addr := serveScaler(t, sc)
	if code, out, errs := run("query", "--scaler", addr, "-f", write(t, goodSO), "--timeout", "1m"); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.deadlines) != 3 {
		t.Fatalf("%d calls, want 3", len(sc.deadlines))
	}
	for i, d := range sc.deadlines {
		if d.IsZero() {
			t.Fatalf("call %d had no deadline", i+1)
		}
		if i > 0 {
			if moved := d.Sub(sc.deadlines[i-1]); moved < sc.delay/2 {
				t.Errorf("call %d's deadline %s after the one before, which took %s: one deadline for all the calls", i+1, moved, sc.delay)
			}
		}
	}
}

// TestTopSendsTheTokenToItsHostAlone: top's token goes to --debug's scheme
// and host alone; a redirect elsewhere (here another port, in plaintext)
// got it too, a RoundTripper's header outliving the client's rules for
// redirects.
func TestTopSendsTheTokenToItsHostAlone(t *testing.T) {
	var mu sync.Mutex
	var got []string
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, "SCALEDOBJECT\n")
	}))
	defer elsewhere.Close()
	ca := testpki.NewCA(t)
	cert, key := ca.Issue(t, "pulse-aggregator", 2, x509.ExtKeyUsageServerAuth)
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	var home []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		home = append(home, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Redirect(w, r, elsewhere.URL+"/debug/triggers?format=table", http.StatusFound)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	paths := testpki.Write(t, t.TempDir(), map[string][]byte{"ca.crt": ca.PEM, "token": []byte("reader-token\n")}, "ca.crt", "token")
	code, out, errs := run("top", "--debug", srv.URL, "-n", "1", "--ca-cert", paths[0], "--token-file", paths[1], "--server-name", "localhost")
	mu.Lock()
	defer mu.Unlock()
	if len(home) == 0 || home[0] != "Bearer reader-token" {
		t.Fatalf("--debug's host got %q (exit %d)\n%s%s", home, code, out, errs)
	}
	if len(got) == 0 {
		t.Fatalf("the redirect was not followed (exit %d)\n%s%s", code, out, errs)
	}
	for _, h := range got {
		if h != "" {
			t.Errorf("the token went in plaintext to another host after a redirect: %q", h)
		}
	}
}

// TestCheckRefusesAMaxWindowTheAggregatorWould: --max-window below the
// aggregator's least (30s) is bad usage, as the aggregator refuses it at
// start; every trigger of a valid file was reported a problem instead.
func TestCheckRefusesAMaxWindowTheAggregatorWould(t *testing.T) {
	for _, mw := range []string{"0s", "-1m", "29s"} {
		if code, out, errs := run("check", "--max-window", mw, write(t, goodSO)); code != 2 || !strings.Contains(errs, "want at least 30s") {
			t.Errorf("check --max-window %s: exit %d, want 2 (bad usage)\n%s%s", mw, code, out, errs)
		}
	}
}

// TestQueryDesiredForAnAverageTrigger: a metricType Value trigger (with
// valueType average; what pulse provisions for latencies) is multiplied by
// the HPA's ready replicas, which KEDA's calls do not say: query prints
// the ratio, where it printed ceil(value / target) labelled AverageValue
// (3 for 4 pods at 25 waiting against 10, where the HPA asks for 10). The
// formula is the trigger's metricType's (it was chosen by valueType: an
// average left at KEDA's AverageValue, the mistake query exists to show,
// printed the Value formula), and a valueType that does not fit it is
// warned of.
func TestQueryDesiredForAnAverageTrigger(t *testing.T) {
	addr := serveScaler(t, &deadlineScaler{}) // 25 against a target of 10
	so := strings.Replace(goodSO, `  - type: external-push
    metadata: {scalerAddress: "x:9090", inferenceSet: llama, metric: waiting, threshold: "10"}`, `  - type: external-push
    metricType: Value
    metadata: {scalerAddress: "x:9090", inferenceSet: llama, metric: waiting, threshold: "10", valueType: average}`, 1)
	if so == goodSO {
		t.Fatal("the fixture's trigger changed")
	}
	averageValue := "(metricType AverageValue: ceil(value / target), before the HPA's tolerance, behaviour and min/max): 3\n"
	for _, c := range []struct {
		name, so, says string
		warned         bool
	}{
		{"valueType average, metricType Value", so, "ceil(ready replicas × 2.5)", false},
		{"valueType total", goodSO, averageValue, false},
		{"valueType average, metricType AverageValue (KEDA's default)", strings.Replace(so, "    metricType: Value\n", "", 1), averageValue, true},
		{"valueType total, metricType Value", strings.Replace(so, ", valueType: average", "", 1), "ceil(ready replicas × 2.5)", true},
	} {
		code, out, errs := run("query", "--scaler", addr, "-f", write(t, c.so))
		if code != 0 || !strings.Contains(out, c.says) || strings.Contains(out, "warning: ") != c.warned {
			t.Errorf("%s: exit %d, want %q, warned %v\n%s%s", c.name, code, c.says, c.warned, out, errs)
		}
	}
}

// TestCheckReadsTriggersAsKEDADoes: a scaleTargetRef with no kind is a
// Deployment, as the aggregator reads it (check called it a problem); a
// trigger is named by its place among all the ScaledObject's (it was
// numbered among the pulse triggers alone); a valueType that does not fit
// the metricType is a problem; --help is no bad usage (exit 0, not 2); and
// --server-name or --tls-client-key alone asks for TLS (plaintext was
// dialled, nothing verified).
func TestCheckReadsTriggersAsKEDADoes(t *testing.T) {
	noKind := strings.Replace(goodSO, "scaleTargetRef: {apiVersion: kaito.sh/v1alpha1, kind: InferenceSet, name: llama}", "scaleTargetRef: {name: llama}", 1)
	noKind = strings.Replace(noKind, "inferenceSet: llama, ", "", 1)
	if code, out, _ := run("check", write(t, noKind)); code != 0 || !strings.Contains(out, ": valid") {
		t.Errorf("a scaleTargetRef with no kind: exit %d\n%s", code, out)
	}
	second := strings.Replace(goodSO, "  triggers:\n", "  triggers:\n  - type: cpu\n    metadata: {value: \"50\"}\n", 1)
	second = strings.Replace(second, `threshold: "10"}`, `threshold: "10", valueType: average}`, 1)
	if code, out, _ := run("check", write(t, second)); code != 1 || !strings.Contains(out, "trigger 2: valueType average needs metricType: Value") {
		t.Errorf("the second trigger, an average at AverageValue: exit %d\n%s", code, out)
	}
	for _, cmd := range []string{"check", "query", "top"} {
		if code, _, _ := run(cmd, "--help"); code != 0 {
			t.Errorf("%s --help: exit %d, want 0", cmd, code)
		}
	}
	for _, flags := range [][]string{{"--server-name", "pulse-aggregator.pulse-system.svc"}, {"--tls-client-key", "k.pem"}} {
		var tf tlsFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		tf.register(fs)
		if err := fs.Parse(flags); err != nil {
			t.Fatal(err)
		}
		creds, err := tf.credentials()
		if err == nil && creds.Info().SecurityProtocol != "tls" {
			t.Errorf("%v: %s credentials, want TLS (or a refusal)", flags, creds.Info().SecurityProtocol)
		}
	}
}

// TestCheckACrossNamespaceTriggerOfNoStatedNamespace: a ScaledObject that
// names no namespace (applied with -n, as most are) whose trigger names
// one is refused by the aggregator wherever it is applied but there (KEDA
// sends the namespace it is applied in): check called it valid.
func TestCheckACrossNamespaceTriggerOfNoStatedNamespace(t *testing.T) {
	so := `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: reader-so}
spec:
  scaleTargetRef: {kind: Deployment, name: mine}
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", deployment: secret-model, namespace: team-b, metric: waiting, threshold: "10"}
`
	if code, out, errs := run("check", write(t, so)); code != 1 || !strings.Contains(out, "names no namespace") {
		t.Errorf("a trigger naming namespace team-b in a ScaledObject of no stated namespace: exit %d, want 1\n%s%s", code, out, errs)
	}
	if code, out, errs := run("check", "--allow-cross-namespace-triggers", write(t, so)); code != 0 {
		t.Errorf("the same with --allow-cross-namespace-triggers: exit %d, want 0\n%s%s", code, out, errs)
	}
	stated := strings.Replace(so, "metadata: {name: reader-so}", "metadata: {name: reader-so, namespace: team-b}", 1)
	if code, out, errs := run("check", write(t, stated)); code != 0 {
		t.Errorf("the same, stated in team-b: exit %d, want 0\n%s%s", code, out, errs)
	}
}

// TestCheckNamesTheValidTriggerBesideABadOne: a ScaledObject of two pulse
// triggers, one bad, printed the problem and then "demo/two: valid" for
// the other, which read as the whole ScaledObject's. Each trigger of such
// a ScaledObject is named.
func TestCheckNamesTheValidTriggerBesideABadOne(t *testing.T) {
	trigger := func(key string) string {
		return `{type: external-push, metadata: {scalerAddress: "x:9090", workspace: llama, ` + key + `: "10"}}`
	}
	two := "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: two, namespace: demo}\nspec: {triggers: [" +
		trigger("treshold") + ", " + trigger("threshold") + "]}\n"
	code, out, _ := run("check", write(t, two))
	if code != 1 || !strings.Contains(out, "ScaledObject demo/two: trigger 1: trigger metadata: unknown key treshold") ||
		!strings.Contains(out, "ScaledObject demo/two: trigger 2: valid") || strings.Contains(out, "demo/two: valid") || !strings.Contains(out, "1 problems") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// TestCheckPrintsATenantsTextAsOneInertLine: check prints ScaledObjects'
// names, namespaces and keys, a tenant's: a namespace of escape sequences
// (an OSC 52 clipboard write) reached the operator's terminal as written,
// as did a key a typo away from a pulse key ending in ESC c (a terminal
// reset, wiping the output above it), and a newline forged a line.
func TestCheckPrintsATenantsTextAsOneInertLine(t *testing.T) {
	evil := `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: "so\nScaledObject demo/forged: valid", namespace: demo}
spec:
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", workspace: llama, namespace: "\e]52;c;cm0gLXJmIH4K\a"}
  - type: external-push
    metadata: {scalerAddress: "x:9090", workspace: llama, "threshold\ec": "10"}
`
	code, out, _ := run("check", write(t, evil))
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("a control character reached the output: %q", out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "ScaledObject demo/forged") {
			t.Fatalf("a name's newline forged a line: %q", out)
		}
	}
	if !strings.Contains(out, `so\nScaledObject demo/forged: valid`) || !strings.Contains(out, "unknown key threshold\uFFFDc (did you mean threshold?)") {
		t.Fatalf("the names and the key not shown, inert:\n%s", out)
	}
}

// typoSO is a ScaledObject whose trigger has a key misspelt.
const typoSO = `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: typo, namespace: demo}
spec:
  triggers:
  - type: external-push
    metadata: {scalerAddress: "x:9090", workspace: llama, treshold: "10"}
`

// TestCheckADocumentThatDoesNotParseLosesNoOther: one document of a file
// that does not parse (a tab in its indentation, a bad merge) is a
// problem, said with its number; the file's other documents are checked
// all the same. readObjects returned nil at the first such document, so
// the documents before it and after it went unchecked and unreported: the
// typo in the ScaledObject before it was never shown, and showed up only
// once the first was fixed.
func TestCheckADocumentThatDoesNotParseLosesNoOther(t *testing.T) {
	body := typoSO + `---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: broken
  annotations: {pulse.io/autoscale: "true"
---
` + goodSO
	checkSays(t, body, "document 2", "ScaledObject demo/typo: trigger 1: trigger metadata: unknown key treshold",
		"ScaledObject demo/llama-so: valid")
}

// checkSays runs check on a file of body, which must exit 1 and say each
// of wants.
func checkSays(t *testing.T, body string, wants ...string) {
	t.Helper()
	code, out, _ := run("check", write(t, body))
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}

// TestQueryAClientCertificateWithoutItsKeyIsSaid: --tls-client-cert
// without --tls-client-key (or the other way) is bad usage, said so;
// it was "open : no such file or directory", naming no file and no flag.
func TestQueryAClientCertificateWithoutItsKeyIsSaid(t *testing.T) {
	so := write(t, goodSO)
	code, _, errOut := run("query", "--scaler", "127.0.0.1:1", "-f", so, "--tls-client-cert", so)
	if code != 2 || strings.Contains(errOut, "open :") || !strings.Contains(errOut, "--tls-client-key") {
		t.Fatalf("exit %d, %q: want 2, saying --tls-client-key is missing", code, errOut)
	}
	code, _, errOut = run("query", "--scaler", "127.0.0.1:1", "-f", so, "--ca-cert", so+".none")
	if code != 2 || !strings.Contains(errOut, "--ca-cert") {
		t.Fatalf("exit %d, %q: want 2, naming --ca-cert", code, errOut)
	}
}

// TestQueryADocumentThatDoesNotParseLosesNoOther: query asks about the
// ScaledObjects of a file one of whose documents does not parse, says
// which, and exits 1 (it asked about none).
func TestQueryADocumentThatDoesNotParseLosesNoOther(t *testing.T) {
	addr, _ := serve(t)
	code, out, errs := run("query", "--scaler", addr, "-f", write(t, "kind: [\n---\n"+goodSO))
	if code != 1 || !strings.Contains(errs, "document 1") || !strings.Contains(out, "GetMetrics: 25") {
		t.Fatalf("exit %d, want 1 with document 1 said and the ScaledObject asked about\n%s%s", code, out, errs)
	}
}

// TestQueryAFileNotReadIsSaidAlone: a file query cannot read is said and
// exits 1 before any credential or call (it went on to them, and said
// too that the file had no ScaledObject).
func TestQueryAFileNotReadIsSaidAlone(t *testing.T) {
	code, out, errs := run("query", "--scaler", "127.0.0.1:1", "-f", filepath.Join(t.TempDir(), "none.yaml"), "--tls-client-cert", "x")
	if code != 1 || out != "" || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "none.yaml") {
		t.Fatalf("exit %d, stdout %q, stderr %q: want 1 and the file said alone", code, out, errs)
	}
}

// TestCheckAManifestOfNoNamespace: most manifests name no namespace (applied
// with -n; KEDA then sends that one, and the provisioner reads a workload
// that always has one). check called a ScaledObject whose trigger names no
// namespace, and an annotated Deployment, a problem: "no namespace given
// and the ScaledObject has none", the Deployment's blamed on
// pulse.io/metric, an annotation it does not have.
func TestCheckAManifestOfNoNamespace(t *testing.T) {
	so := strings.Replace(goodSO, "{name: llama-so, namespace: demo}", "{name: llama-so}", 1)
	dep := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: phi\n  annotations: {pulse.io/autoscale: \"true\"}\n"
	for name, body := range map[string]string{"ScaledObject": so, "Deployment": dep} {
		if code, out, errs := run("check", write(t, body)); code != 0 || !strings.Contains(out, ": valid") {
			t.Errorf("a %s of no namespace: exit %d, want 0 and valid\n%s%s", name, code, out, errs)
		}
	}
	// Still refused: a trigger naming another namespace than the one
	// applied in, and a bad value.
	if code, out, _ := run("check", write(t, strings.Replace(so, `threshold: "10"`, `threshold: "ten"`, 1))); code != 1 || !strings.Contains(out, `"ten"`) {
		t.Errorf("a bad threshold, no namespace: exit %d\n%s", code, out)
	}
}

// TestCheckAKeyFromTheEnvironment: <key>FromEnv reads one of pulse's keys
// from the scale target's environment, as KEDA resolves it
// (docs/scaledobject.md): the aggregator reads the value KEDA forwards. check
// parsed the variable's name as the value: "LLAMA_THRESHOLD" is not a
// finite number.
func TestCheckAKeyFromTheEnvironment(t *testing.T) {
	so := strings.Replace(goodSO, `threshold: "10"`, `thresholdFromEnv: LLAMA_THRESHOLD`, 1)
	code, out, errs := run("check", write(t, so))
	if code != 0 || strings.Contains(out, "LLAMA_THRESHOLD\" is not") || !strings.Contains(out, "thresholdFromEnv") {
		t.Errorf("thresholdFromEnv: exit %d, want 0, valid but for the key not checked\n%s%s", code, out, errs)
	}
	// The rest is checked all the same.
	bad := strings.Replace(so, "metric: waiting", "metric: wating", 1)
	if code, out, _ := run("check", write(t, bad)); code != 1 || !strings.Contains(out, `unknown metric "wating"`) {
		t.Errorf("thresholdFromEnv beside a bad metric: exit %d\n%s", code, out)
	}
}

// TestTopSaysAnAnswerCut: an answer past what top reads (16 MiB; the
// aggregator's table of up to 10,000 triggers of 32 pods each is past it)
// was cut mid-row and printed as the whole, exit 0, nothing said.
func TestTopSaysAnAnswerCut(t *testing.T) {
	row := strings.Repeat("x", 1023) + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "SCALEDOBJECT\n")
		for range 17 << 10 { // 17 MiB
			_, _ = io.WriteString(w, row)
		}
		_, _ = io.WriteString(w, "LAST ROW\n")
	}))
	defer srv.Close()
	_, out, errs := run("top", "--debug", srv.URL, "-n", "1")
	if !strings.Contains(out+errs, "16 MiB") {
		t.Errorf("a 17 MiB answer printed %d bytes, its cut unsaid; stderr %q", len(out), errs)
	}
	if last := out[strings.LastIndexByte(strings.TrimSuffix(out, "\n"), '\n')+1:]; last != "" && !strings.HasSuffix(out, "\n") {
		t.Errorf("the answer was cut mid-row: %q", last[:min(len(last), 40)]+"...")
	}
}

// TestQueryAKeyFromTheEnvironment: KEDA sends thresholdFromEnv's value, not
// the variable's name; query sent the name, and printed the scaler's refusal
// of it as what KEDA would get.
func TestQueryAKeyFromTheEnvironment(t *testing.T) {
	addr, _ := serve(t)
	so := strings.Replace(goodSO, `threshold: "10"`, `thresholdFromEnv: LLAMA_THRESHOLD`, 1)
	code, out, errs := run("query", "--scaler", addr, "-f", write(t, so))
	if code != 1 || strings.Contains(out, `"LLAMA_THRESHOLD" is not a finite number`) || !strings.Contains(out, "set threshold in the file") {
		t.Errorf("exit %d: the variable's name asked as the value\n%s%s", code, out, errs)
	}
}

// TestCheckReadsATypedList: the API server (kubectl get --raw, a client's
// dump) writes ScaledObjectList, DeploymentList: its items went unread,
// and beside a valid document the file was said valid, exit 0.
func TestCheckReadsATypedList(t *testing.T) {
	list := "apiVersion: keda.sh/v1alpha1\nkind: ScaledObjectList\nitems:\n- " + strings.ReplaceAll(strings.TrimSuffix(typoSO, "\n"), "\n", "\n  ") + "\n"
	if code, out, _ := run("check", write(t, goodSO+"---\n"+list)); code != 1 || !strings.Contains(out, "demo/typo: trigger 1") {
		t.Errorf("a ScaledObjectList: exit %d, want 1 naming demo/typo\n%s", code, out)
	}
}

// TestTopShowsNoPassword: a password in --debug's URL (basic auth to a
// proxy in front of the aggregator) was printed in top's header line and
// in its errors.
func TestTopShowsNoPassword(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusForbidden)
	}))
	defer srv.Close()
	withPassword := strings.Replace(srv.URL, "http://", "http://user:s3cret@", 1)
	_, out, errs := run("top", "--debug", withPassword, "-n", "1")
	if strings.Contains(out+errs, "s3cret") || !strings.Contains(out+errs, "403") {
		t.Errorf("the password shown, or the refusal not:\n%s%s", out, errs)
	}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "SCALEDOBJECT\n") })
	_, out, errs = run("top", "--debug", withPassword, "-n", "1")
	if strings.Contains(out+errs, "s3cret") || !strings.Contains(out, "SCALEDOBJECT") || !strings.Contains(out, "user:xxxxx@") {
		t.Errorf("the password shown, or the table not:\n%s%s", out, errs)
	}
}

// envSO is a ScaledObject on a latency (no default threshold) whose
// threshold is read from the scale target's environment.
const envSO = `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: p90, namespace: demo}
spec:
  scaleTargetRef: {kind: Deployment, name: llama}
  triggers:
  - type: external-push
    metricType: Value
    metadata: {scalerAddress: "x:9090", deployment: llama, metric: ttftP90Seconds, valueType: average, thresholdFromEnv: P90_TARGET}
`

// TestCheckAKeyFromTheEnvironmentHidesNoLaterProblem: a threshold from the
// environment on a metric with no default threshold made ParseTrigger stop
// at threshold; that error was dropped, and every key parsed after it
// (activationThreshold, valueType, window, staleAfter, ...) went unchecked:
// a window past --max-window was said valid, and the aggregator refuses it.
func TestCheckAKeyFromTheEnvironmentHidesNoLaterProblem(t *testing.T) {
	for key, bad := range map[string]string{"window": `window: 5m`, "activationThreshold": `activationThreshold: "-1"`, "staleAfter": `staleAfter: 1h`} {
		so := strings.Replace(envSO, "thresholdFromEnv: P90_TARGET}", "thresholdFromEnv: P90_TARGET, "+bad+"}", 1)
		if code, out, _ := run("check", write(t, so)); code != 1 || !strings.Contains(out, `"`+key+`"`) {
			t.Errorf("thresholdFromEnv beside a bad %s: exit %d, want 1 naming it\n%s", key, code, out)
		}
	}
	if code, out, _ := run("check", write(t, envSO)); code != 0 || !strings.Contains(out, "thresholdFromEnv") {
		t.Errorf("thresholdFromEnv alone: exit %d, want 0\n%s", code, out)
	}
}

// TestCheckAMetricFromTheEnvironment: with metric from the environment the
// file's metric-specific keys were checked against the default metric,
// waiting: a saturation trigger's kvCacheTarget was a problem.
func TestCheckAMetricFromTheEnvironment(t *testing.T) {
	so := strings.Replace(envSO, "metric: ttftP90Seconds, valueType: average, thresholdFromEnv: P90_TARGET", `metricFromEnv: METRIC, valueType: average, threshold: "1", kvCacheTarget: "0.5"`, 1)
	if code, out, _ := run("check", write(t, so)); code != 0 || strings.Contains(out, "metric waiting") {
		t.Errorf("metricFromEnv beside kvCacheTarget: exit %d, want 0\n%s", code, out)
	}
}

// TestCheckTheStandInNamespaceIsNoNamespace: a ScaledObject of no stated
// namespace whose trigger names another namespace is a problem; one naming
// the stand-in check uses for the namespace applied in was said valid.
func TestCheckTheStandInNamespaceIsNoNamespace(t *testing.T) {
	so := strings.Replace(strings.Replace(goodSO, "{name: llama-so, namespace: demo}", "{name: llama-so}", 1),
		`threshold: "10"}`, `threshold: "10", namespace: the-namespace-applied-in}`, 1)
	if code, out, _ := run("check", write(t, so)); code != 1 || !strings.Contains(out, "names no namespace") {
		t.Errorf("a trigger naming namespace the-namespace-applied-in: exit %d, want 1\n%s", code, out)
	}
}

// TestCheckReadsATypedListOfBuiltInKinds: the API server writes a
// built-in kind's typed list (kubectl get --raw .../deployments) with its
// items' kind and apiVersion left out: an annotated Deployment in a
// DeploymentList went unread.
func TestCheckReadsATypedListOfBuiltInKinds(t *testing.T) {
	list := "apiVersion: apps/v1\nkind: DeploymentList\nitems:\n- metadata:\n    name: phi\n    namespace: demo\n    annotations: {pulse.io/autoscale: \"yes\"}\n"
	if code, out, _ := run("check", write(t, goodSO+"---\n"+list)); code != 1 || !strings.Contains(out, "demo/phi") {
		t.Errorf("a DeploymentList as the API server writes it: exit %d, want 1 naming demo/phi\n%s", code, out)
	}
}

// TestCheckReadsAListWithinAList: a List item that is itself a List.
func TestCheckReadsAListWithinAList(t *testing.T) {
	inner := "  - " + strings.ReplaceAll(strings.TrimSuffix(typoSO, "\n"), "\n", "\n    ") + "\n"
	list := "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items:\n" + inner
	if code, out, _ := run("check", write(t, goodSO+"---\n"+list)); code != 1 || !strings.Contains(out, "demo/typo") {
		t.Errorf("a List within a List: exit %d, want 1 naming demo/typo\n%s", code, out)
	}
}

// TestTopAnAnswerCutWithNoLine: an answer past 16 MiB with no newline
// within it shows nothing of it, and says so (it said "the rest is not
// shown" of an answer none of which was).
func TestTopAnAnswerCutWithNoLine(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 17<<20))
	}))
	defer srv.Close()
	_, out, errs := run("top", "--debug", srv.URL, "-n", "1")
	if strings.Contains(out, "xxx") || !strings.Contains(errs, "no whole line within it") {
		t.Errorf("stdout %d bytes, stderr %q: want nothing of it shown, and said", len(out), errs)
	}
}

// TestTopShowsNoPasswordOfAURLThatDoesNotParse: a password with a % not
// followed by two hex digits, or with a / or #, makes --debug's URL
// unparsable; redacted then returned it whole, printed in the usage error.
func TestTopShowsNoPasswordOfAURLThatDoesNotParse(t *testing.T) {
	for _, url := range []string{"http://admin:s3cret%zz@127.0.0.1:1", "http://admin:s3cret/x@127.0.0.1:1", "http://admin:s3cret#x@127.0.0.1:1", "http://admin:s3cret@127.0.0.1:1",
		// A password of digits, then a / ? or #: admin:123 parses as a
		// host and port, the rest as a path, a query, a fragment.
		"http://admin:123/s3cret@127.0.0.1:1", "http://admin:123?s3cret@127.0.0.1:1", "http://admin:123#s3cret@127.0.0.1:1"} {
		code, out, errs := run("top", "--debug", url, "-n", "1")
		if strings.Contains(out+errs, "s3cret") || !strings.Contains(out+errs, "@127.0.0.1:1") {
			t.Errorf("--debug %s: exit %d, the password shown or the address not: %s%s", url, code, out, errs)
		}
	}
}

// TestCheckAKeyFromTheEnvironmentRefusedWhateverItsValue: KEDA sends a
// <key>FromEnv's value, or the variable's name when it has none: never
// empty. A key another key rules out (aggregation on a replicas trigger,
// kvCacheTarget off saturation, sloTtft off replicas) is refused whatever
// it is, and was said valid; a workload from the environment beside a
// scaleTargetRef of a kind pulse does not know was refused, and is valid.
func TestCheckAKeyFromTheEnvironmentRefusedWhateverItsValue(t *testing.T) {
	for md, want := range map[string]string{
		`metric: replicas, aggregationFromEnv: AGG`:             `"aggregation"`,
		`metric: replicas, missingPodsFromEnv: MP`:              `"missingPods"`,
		`metric: waiting, kvCacheTargetFromEnv: KV`:             `"kvCacheTarget"`,
		`metric: waiting, sloTtftFromEnv: SLO`:                  `"sloTtft"`,
		`metric: waiting, sloPercentileFromEnv: P`:              `"sloPercentile"`,
		`metricFromEnv: M, sloTtftFromEnv: S, aggregation: max`: `"aggregation"`,
	} {
		so := strings.Replace(goodSO, `metric: waiting, threshold: "10"`, md, 1)
		if code, out, _ := run("check", write(t, so)); code != 1 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, want 1 naming %s\n%s", md, code, want, out)
		}
	}
	for _, md := range []string{`metricFromEnv: M, sloTtftFromEnv: S`, `metricFromEnv: M, kvCacheTargetFromEnv: KV`, `metric: replicas, sloItlFromEnv: S`} {
		so := strings.Replace(goodSO, `metric: waiting, threshold: "10"`, md, 1)
		if code, out, _ := run("check", write(t, so)); code != 0 {
			t.Errorf("%s: exit %d, want 0\n%s", md, code, out)
		}
	}
	so := strings.Replace(strings.Replace(goodSO, `inferenceSet: llama,`, `workloadFromEnv: W,`, 1), "kind: InferenceSet", "kind: Rollout", 1)
	if code, out, _ := run("check", write(t, so)); code != 0 {
		t.Errorf("workloadFromEnv beside a Rollout: exit %d, want 0\n%s", code, out)
	}
}

// TestTopShowsNoPasswordAfterAUserNameWithAnAt: a user name that holds an
// @ (an e-mail address, as proxies' basic auth often has) with a password
// of digits then a / or ?: url.Parse takes "alice" as the user, the
// e-mail's domain and the password's digits as the host and port, and
// the rest of the password as a path or query. u.User is set, so
// redacted took u.Redacted(), which has no password to hide, and showed
// the URL whole, in the header line and net/http's error.
func TestTopShowsNoPasswordAfterAUserNameWithAnAt(t *testing.T) {
	for _, url := range []string{"http://alice@127.0.0.1:1/s3cret@127.0.0.1:1", "http://alice@127.0.0.1:1?s3cret@127.0.0.1:1"} {
		code, out, errs := run("top", "--debug", url, "-n", "1")
		if strings.Contains(out+errs, "s3cret") || !strings.Contains(out+errs, "@127.0.0.1:1") {
			t.Errorf("--debug %s: exit %d, the password shown or the address not: %s%s", url, code, out, errs)
		}
	}
}

// TestRedactedHidesAPasswordOfAURLWithoutScheme: --debug without its
// http:// ("alice:s3cret@host:8082") parses (scheme "alice", the rest
// opaque) with no user; atPastAuthority finds no / ? or # before the @,
// and u.Redacted(), having no password to hide, showed it whole in the
// refusal "--debug ...: want http://HOST:PORT". Before 00f83a4 a parse
// with no user and an @ went to the last-@ redaction.
func TestRedactedHidesAPasswordOfAURLWithoutScheme(t *testing.T) {
	for _, url := range []string{"alice:s3cret@127.0.0.1:8082", "alice:s3cret@127.0.0.1:8082/x"} {
		if got := redacted(url); strings.Contains(got, "s3cret") {
			t.Errorf("redacted(%q) = %q: the password shown", url, got)
		}
		code, out, errs := run("top", "--debug", url, "-n", "1")
		if strings.Contains(out+errs, "s3cret") {
			t.Errorf("--debug %s: exit %d, the password shown: %s%s", url, code, out, errs)
		}
	}
}

// TestCheckRefusesAMetricTypeKEDAWould: a pulse trigger's metricType is
// AverageValue (KEDA's default, when left out) or Value. KEDA refuses an
// external-push trigger of Utilization (GetMetricTargetType), and writes
// any other into the HPA, which the API server refuses (and pulse-sim
// refuses both); check called them valid.
func TestCheckRefusesAMetricTypeKEDAWould(t *testing.T) {
	for _, mt := range []string{"Utilization", "value", "Bogus"} {
		so := strings.Replace(goodSO, "  - type: external-push\n", "  - type: external-push\n    metricType: "+mt+"\n", 1)
		if code, out, _ := run("check", write(t, so)); code != 1 || !strings.Contains(out, "metricType "+mt) {
			t.Errorf("metricType %s: exit %d, want 1 naming it\n%s", mt, code, out)
		}
	}
	for _, mt := range []string{"AverageValue"} {
		so := strings.Replace(goodSO, "  - type: external-push\n", "  - type: external-push\n    metricType: "+mt+"\n", 1)
		if code, out, _ := run("check", write(t, so)); code != 0 {
			t.Errorf("metricType %s: exit %d, want 0\n%s", mt, code, out)
		}
	}
}

// TestCheckRefusesATriggerWithNoScalerAddress: KEDA's external-push
// scaler requires scalerAddress (externalScalerMetadata, not optional; a
// blank one is missing too): without it the trigger never reaches the
// aggregator, and KEDA's ScaledObject is not ready. check called it valid.
func TestCheckRefusesATriggerWithNoScalerAddress(t *testing.T) {
	for _, addr := range []string{``, `scalerAddress: "  ", `} {
		so := strings.Replace(goodSO, `scalerAddress: "x:9090", `, addr, 1)
		if code, out, _ := run("check", write(t, so)); code != 1 || !strings.Contains(out, "scalerAddress") {
			t.Errorf("%q: exit %d, want 1 naming scalerAddress\n%s", addr, code, out)
		}
	}
}

// TestCheckRefusesAnUnquotedValueAsTheAPIServerWould: a trigger's
// metadata and an object's annotations are maps of strings. kubectl sends
// `threshold: 10` as a number, which the API server refuses (KEDA's CRD:
// additionalProperties of type string); yaml.Unmarshal read it into the
// string "10", and check called the trigger valid.
func TestCheckRefusesAnUnquotedValueAsTheAPIServerWould(t *testing.T) {
	for _, c := range []struct{ body, key string }{
		{strings.Replace(goodSO, `threshold: "10"`, `threshold: 10`, 1), "spec.triggers[0].metadata.threshold"},
		{strings.Replace(goodSO, `scalerAddress: "x:9090", `, `scalerAddress: "x:9090", enableTLS: true, `, 1), "spec.triggers[0].metadata.enableTLS"},
		{"apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: big\n    namespace: demo\n    annotations: {pulse.io/autoscale: \"true\", pulse.io/max-replicas: 500}\n",
			"items[0].metadata.annotations.pulse.io/max-replicas"},
	} {
		code, out, _ := run("check", write(t, c.body))
		if code != 1 || !strings.Contains(out, c.key) || strings.Contains(out, ": valid") {
			t.Errorf("%s unquoted: exit %d, want 1 naming it, and nothing valid\n%s", c.key, code, out)
		}
	}
}

// TestCheckRefusesReplicaBoundsKEDAWould: KEDA's CRD refuses a
// minReplicaCount above maxReplicaCount (100 when left out), and its
// webhook an idleReplicaCount not below the HPA's minimum
// (CheckReplicaCountBoundsAreValid); check read neither and called the
// ScaledObject valid.
func TestCheckRefusesReplicaBoundsKEDAWould(t *testing.T) {
	with := func(bounds string) string {
		return strings.Replace(goodSO, "  triggers:\n", "  "+strings.ReplaceAll(bounds, ", ", "\n  ")+"\n  triggers:\n", 1)
	}
	for _, bounds := range []string{"{minReplicaCount: 5, maxReplicaCount: 2}", "{minReplicaCount: 101}", "{minReplicaCount: 3, idleReplicaCount: 3}", "{idleReplicaCount: 0}"} {
		code, out, _ := run("check", write(t, with(strings.Trim(bounds, "{}"))))
		if code != 1 || !strings.Contains(out, "ReplicaCount") || strings.Contains(out, "demo/llama-so: valid") {
			t.Errorf("%s: exit %d, want 1 naming the bounds, and no bare valid\n%s", bounds, code, out)
		}
	}
	for _, bounds := range []string{"{minReplicaCount: 2, maxReplicaCount: 2}", "{minReplicaCount: 1, idleReplicaCount: 0, maxReplicaCount: 8}", "{maxReplicaCount: 200}"} {
		if code, out, _ := run("check", write(t, with(strings.Trim(bounds, "{}")))); code != 0 {
			t.Errorf("%s: exit %d, want 0\n%s", bounds, code, out)
		}
	}
}
