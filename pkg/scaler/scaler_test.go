package scaler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	store    *store.Store
	clock    *clock
	server   *Server
	grpc     *grpc.Server
	client   externalscaler.ExternalScalerClient
	ms       int64 // the agents' clock, Unix ms
	close    func()
	resolver TargetResolver
}

// newFixture serves a scaler over bufconn to a client built from KEDA's
// generated stubs, exactly as KEDA's external-push scaler calls it.
func newFixture(t *testing.T) *fixture { t.Helper(); return newFixtureWith(t, nil) }

func newFixtureWith(t *testing.T, resolver TargetResolver, opts ...grpc.ServerOption) *fixture {
	t.Helper()
	f := &fixture{clock: &clock{t: time.Unix(1_700_000_000, 0)}, ms: 1_700_000_000_000, resolver: resolver}
	f.store = store.New(store.Options{Retention: time.Minute, Now: f.clock.Now})
	f.server = New(f.store, Options{MaxWindow: time.Minute, Resolver: f.resolver, Now: f.clock.Now})
	f.server.recheck = 20 * time.Millisecond
	lis := bufconn.Listen(1 << 20)
	f.grpc = grpc.NewServer(opts...)
	externalscaler.RegisterExternalScalerServer(f.grpc, f.server)
	go func() { _ = f.grpc.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f.close = func() {
		conn.Close()
		f.server.Shutdown()
		f.grpc.Stop()
	}
	t.Cleanup(f.close)
	f.client = externalscaler.NewExternalScalerClient(conn)
	return f
}

var llama = store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: "llama"}

// pods adds ready pods of llama.
func (f *fixture) pods(names ...string) {
	var infos []store.PodInfo
	for _, n := range names {
		infos = append(infos, store.PodInfo{UID: "uid-" + n, Namespace: "demo", Name: n, Ready: true, Workloads: []store.Key{llama}})
	}
	f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
}

// report stores waiting values per pod name, one second after the last report.
func (f *fixture) report(waiting map[string]float64) {
	f.ms += 1000
	var rs []store.Report
	for n, w := range waiting {
		r := store.Report{UID: "uid-" + n}
		r.TimeMs = f.ms
		r.Values.Set(metric.Waiting, w)
		rs = append(rs, r)
	}
	f.store.Add(rs)
}

func ref(md map[string]string) *externalscaler.ScaledObjectRef {
	return &externalscaler.ScaledObjectRef{Name: "llama-so", Namespace: "demo", ScalerMetadata: md}
}

func (f *fixture) metric(t *testing.T, md map[string]string) (float64, error) {
	t.Helper()
	resp, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "pulse-workspace-demo-llama-waiting"})
	if err != nil {
		return 0, err
	}
	if len(resp.MetricValues) != 1 {
		t.Fatalf("%d metric values, want exactly 1 (the HPA sums them)", len(resp.MetricValues))
	}
	mv := resp.MetricValues[0]
	if mv.MetricValue != int64(math.Round(mv.MetricValueFloat)) {
		t.Fatalf("metricValue %d and metricValueFloat %v disagree", mv.MetricValue, mv.MetricValueFloat)
	}
	return mv.MetricValueFloat, nil
}

func TestHPAArithmetic(t *testing.T) {
	f := newFixture(t)
	f.pods("a", "b", "c")
	f.report(map[string]float64{"a": 12, "b": 9, "c": 15})
	tests := map[string]struct {
		md   map[string]string
		want float64
	}{
		// AverageValue: the HPA wants ceil(36/10) = 4 replicas.
		"total (default)": {md: map[string]string{"workspace": "llama", "threshold": "10"}, want: 36},
		// Value: the HPA multiplies 12/10 by the pod count itself.
		"average":       {md: map[string]string{"workspace": "llama", "valueType": "average"}, want: 12},
		"max":           {md: map[string]string{"workspace": "llama", "aggregation": "max", "valueType": "average"}, want: 15},
		"max total":     {md: map[string]string{"workspace": "llama", "aggregation": "max"}, want: 45},
		"seed aliases":  {md: map[string]string{"workspaceName": "llama", "workspaceNamespace": "demo", "metricName": "vllm:num_requests_waiting"}, want: 36},
		"explicit ns":   {md: map[string]string{"workspace": "llama", "namespace": "demo", "metric": "waiting"}, want: 36},
		"window of one": {md: map[string]string{"workspace": "llama", "window": "1s"}, want: 36},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := f.metric(t, tc.md)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("GetMetrics = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWindowAveragesGauges(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	for _, w := range []float64{2, 4, 6, 8} {
		f.report(map[string]float64{"a": w})
	}
	got, err := f.metric(t, map[string]string{"workspace": "llama", "window": "10s"})
	if err != nil || got != 5 {
		t.Fatalf("10s window = %v, %v; want the mean 5", got, err)
	}
	got, err = f.metric(t, map[string]string{"workspace": "llama", "window": "1500ms"})
	if err != nil || got != 7 {
		t.Fatalf("1.5s window = %v, %v; want the mean of the last two, 7", got, err)
	}
}

func TestStaleWorkloadIsAnErrorNeverZero(t *testing.T) {
	f := newFixture(t)
	f.pods("a", "b")
	f.report(map[string]float64{"a": 3, "b": 4})
	f.clock.Add(6 * time.Second)
	md := map[string]string{"workspace": "llama"}
	if _, err := f.metric(t, md); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetMetrics error = %v, want Unavailable", err)
	}
	if _, err := f.client.IsActive(context.Background(), ref(md)); status.Code(err) != codes.Unavailable {
		t.Fatalf("IsActive error = %v, want Unavailable", err)
	}
	// A longer staleAfter accepts the same data.
	md["staleAfter"] = "10s"
	if got, err := f.metric(t, md); err != nil || got != 7 {
		t.Fatalf("with staleAfter 10s: %v, %v", got, err)
	}
	// A workload nobody reported is an error too.
	if _, err := f.metric(t, map[string]string{"workspace": "nobody"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown workload: %v, want NotFound", err)
	}
}

// TestAValueKEDACannotCarryIsAnError: KEDA keeps a value in thousandths in
// an int64: a workload's total past about 9.2e15 (a replica's page
// claiming 5e15 waiting requests) wrapped negative there, and the HPA
// scaled to its minimum. Past MaxValue the answer is an error (KEDA keeps
// the count, or its fallback), never the value.
func TestAValueKEDACannotCarryIsAnError(t *testing.T) {
	f := newFixture(t)
	f.pods("a", "b")
	f.report(map[string]float64{"a": 5e15, "b": 5e15})
	md := map[string]string{"workspace": "llama"}
	if v, err := f.metric(t, md); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "more than KEDA can carry") {
		t.Fatalf("GetMetrics of 1e16: %v, %v; want Internal", v, err)
	}
	if _, err := f.client.IsActive(context.Background(), ref(md)); status.Code(err) != codes.Internal {
		t.Fatalf("IsActive of 1e16: %v, want Internal", err)
	}
	f.clock.Add(time.Minute) // past the window
	f.ms += 60_000
	f.report(map[string]float64{"a": 3, "b": 4})
	if v, err := f.metric(t, md); err != nil || v != 7 {
		t.Fatalf("once the values are plausible again: %v, %v", v, err)
	}
}

func TestInvalidMetadata(t *testing.T) {
	f := newFixture(t)
	tests := map[string]struct {
		md  map[string]string
		key string
	}{
		"no workload":         {md: map[string]string{}, key: "no workload named"},
		"two workloads":       {md: map[string]string{"workspace": "a", "deployment": "b"}, key: "deployment"},
		"unknown metric":      {md: map[string]string{"workspace": "a", "metric": "queue"}, key: "metric"},
		"bad metricName":      {md: map[string]string{"workspace": "a", "metricName": "a b"}, key: "metricName"},
		"zero threshold":      {md: map[string]string{"workspace": "a", "threshold": "0"}, key: "threshold"},
		"text threshold":      {md: map[string]string{"workspace": "a", "threshold": "ten"}, key: "threshold"},
		"NaN threshold":       {md: map[string]string{"workspace": "a", "threshold": "NaN"}, key: "threshold"},
		"negative activate":   {md: map[string]string{"workspace": "a", "activationThreshold": "-1"}, key: "activationThreshold"},
		"bad valueType":       {md: map[string]string{"workspace": "a", "valueType": "sum"}, key: "valueType"},
		"bad aggregation":     {md: map[string]string{"workspace": "a", "aggregation": "p99"}, key: "aggregation"},
		"bad missingPods":     {md: map[string]string{"workspace": "a", "missingPods": "zero"}, key: "missingPods"},
		"window over max":     {md: map[string]string{"workspace": "a", "window": "2m"}, key: "window"},
		"bad window":          {md: map[string]string{"workspace": "a", "window": "10"}, key: "window"},
		"negative staleness":  {md: map[string]string{"workspace": "a", "staleAfter": "-1s"}, key: "staleAfter"},
		"staleness of 1ns":    {md: map[string]string{"workspace": "a", "staleAfter": "1ns"}, key: "staleAfter"},
		"window of 999ms":     {md: map[string]string{"workspace": "a", "window": "999ms"}, key: "window"},
		"staleness past 10m":  {md: map[string]string{"workspace": "a", "staleAfter": "11m"}, key: "staleAfter"},
		"threshold past 1e12": {md: map[string]string{"workspace": "a", "threshold": "2e12"}, key: "threshold"},
		// A target that measures nothing (the load about 0 for ever), or
		// divides to infinity.
		"waitingTarget past 1e12": {md: map[string]string{"workspace": "a", "metric": "saturation", "waitingTarget": "1e308"}, key: "waitingTarget"},
		"runningTarget too small": {md: map[string]string{"workspace": "a", "metric": "saturation", "runningTarget": "1e-320"}, key: "runningTarget"},
		"kvCacheTarget too small": {md: map[string]string{"workspace": "a", "metric": "saturation", "kvCacheTarget": "1e-9"}, key: "kvCacheTarget"},
		// Keys that were checked, then ignored.
		"kvCacheTarget on waiting":  {md: map[string]string{"workspace": "a", "kvCacheTarget": "0.5"}, key: "kvCacheTarget"},
		"runningTarget on running":  {md: map[string]string{"workspace": "a", "metric": "running", "runningTarget": "32"}, key: "runningTarget"},
		"waitingTarget on an extra": {md: map[string]string{"workspace": "a", "metricName": "vllm:extra", "threshold": "5", "waitingTarget": "3"}, key: "waitingTarget"},
		// Two names of one key that disagree: one was ignored.
		"two namespaces":         {md: map[string]string{"workspace": "a", "namespace": "default", "workspaceNamespace": "other"}, key: "workspaceNamespace"},
		"metric and metricName":  {md: map[string]string{"workspace": "a", "metric": "waiting", "metricName": "vllm:kv_cache_usage_perc"}, key: "metricName"},
		"metric and a raw gauge": {md: map[string]string{"workspace": "a", "metric": "running", "metricName": "vllm:extra"}, key: "metricName"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for rpc, call := range map[string]func() error{
				"GetMetricSpec": func() error { _, err := f.client.GetMetricSpec(context.Background(), ref(tc.md)); return err },
				"GetMetrics":    func() error { _, err := f.metric(t, tc.md); return err },
				"IsActive":      func() error { _, err := f.client.IsActive(context.Background(), ref(tc.md)); return err },
			} {
				err := call()
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.key) {
					t.Errorf("%s: %v, want InvalidArgument naming %q", rpc, err, tc.key)
				}
			}
		})
	}
}

// TestValidMetadata: what TestInvalidMetadata's keys look like when they
// are not refused.
func TestValidMetadata(t *testing.T) {
	f := newFixture(t)
	// The two names of a key agreeing are one key given twice.
	for _, md := range []map[string]string{
		{"workspace": "a", "namespace": "demo", "workspaceNamespace": "demo"},
		{"workspace": "a", "metric": "waiting", "metricName": "vllm:num_requests_waiting"},
		{"workspace": "a", "metric": "kvCacheUsage", "metricName": "kvCacheUsage"},
		{"workspace": "a", "metric": "saturation", "kvCacheTarget": "0.5", "waitingTarget": "3"},
		// Spaces around a duration, as around a number.
		{"workspace": "a", "window": " 30s ", "threshold": " 5"},
	} {
		if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
			t.Errorf("%v: %v", md, err)
		}
	}
	// A missing workload is not blamed on workspace.
	if _, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{})); err == nil || strings.Contains(err.Error(), `"workspace"`) {
		t.Errorf("no workload: %v", err)
	}
	// Keys that are neither pulse's nor KEDA's, and no typo of pulse's, are
	// ignored: KEDA forwards every key of the trigger.
	for _, md := range []map[string]string{
		{"workspace": "a", "colour": "blue", "description": "the llama fleet"},
		{"workspace": "a", "scalerAddress": "x:9090", "enableTLS": "true", "unsafeSsl": "false", "caCert": "...", "tlsClientCert": "...", "tlsClientKey": "..."},
	} {
		if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
			t.Errorf("%v: %v", md, err)
		}
	}
}

// TestTyposAreCaught: a key one or two edits from one of pulse's (or of
// another case) is almost surely a typo: InvalidArgument naming the key
// meant, where it used to be ignored and the default to apply.
func TestTyposAreCaught(t *testing.T) {
	f := newFixture(t)
	for key, meant := range map[string]string{
		"treshold": "threshold", "Threshold": "threshold", "windows": "window", "metirc": "metric",
		"workpace": "workspace", "missingpods": "missingPods", "valuetype": "valueType", "treshholdFromEnv": "thresholdFromEnv",
		"inferenceset": "inferenceSet", "staleafter": "staleAfter",
	} {
		_, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", key: "2"}))
		want := fmt.Sprintf("unknown key %s (did you mean %s?)", key, meant)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want InvalidArgument %q", key, err, want)
		}
	}
}

// TestATyposRefusalIsTheSameEachTime: with several typos the refusal
// named whichever the map's order gave first, so the same metadata was
// refused with a new message at each call (the trigger's record, the log
// and KEDA's condition changing for nothing). The first key by name is
// named.
func TestATyposRefusalIsTheSameEachTime(t *testing.T) {
	md := map[string]string{"workspace": "a", "windw": "30s", "treshold": "2", "metrc": "waiting"}
	for range 50 {
		_, err := ParseTrigger(&externalscaler.ScaledObjectRef{Namespace: "ns", ScalerMetadata: md}, time.Hour, nil)
		if err == nil || !strings.Contains(err.Error(), "unknown key metrc (did you mean metric?)") {
			t.Fatalf("%v; want the first typo by name, metrc, each time", err)
		}
	}
}

// TestAMetricNameNoAgentForwardsNamesTheOneMeant: a misspelt vLLM name
// (vllm:num_request_waiting) read as a gauge an agent forwards, and its
// refusal listed what the agents forward alone. A name no agent forwards,
// within a typo of one pulse knows, is refused naming it; a real gauge
// near one of them (vllm:cpu_cache_usage_perc), forwarded, is taken.
func TestAMetricNameNoAgentForwardsNamesTheOneMeant(t *testing.T) {
	f := newFixture(t)
	f.store.Upsert(store.Source{Node: "node-1", ExtraNames: []string{"vllm:cpu_cache_usage_perc", "my_queue_depth"}},
		[]store.PodInfo{{UID: "u1", Namespace: "ns", Name: "a-0", Ready: true, Workloads: []store.Key{{Namespace: "ns", Kind: store.KindWorkspace, Name: "a"}}}}, true)
	for name, meant := range map[string]string{
		"vllm:num_request_waiting": "vllm:num_requests_waiting", "Waiting": "waiting", "kvcacheusage": "kvCacheUsage", "my_queue_dept": "my_queue_depth",
	} {
		_, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", "metricName": name, "threshold": "1"}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "(did you mean "+meant+"?)") {
			t.Errorf("metricName %s: %v; want refused, naming %s", name, err, meant)
		}
	}
	for _, name := range []string{"vllm:num_requests_waiting", "waiting", "replicas", "vllm:cpu_cache_usage_perc", "my_queue_depth"} {
		md := map[string]string{"workspace": "a", "metricName": name, "threshold": "1"}
		if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
			t.Errorf("metricName %s: %v; want it taken", name, err)
		}
	}
}

// TestActivationThresholdIsBounded: activationThreshold had no upper
// bound: at 1e308 no value ever activated the workload, and at zero it
// never scaled up, with no error to say why. It is bounded as threshold is.
func TestActivationThresholdIsBounded(t *testing.T) {
	for v, ok := range map[string]bool{"1e308": false, "1e13": false, "-1": false, "1e12": true, "0": true, "0.5": true} {
		_, err := ParseTrigger(&externalscaler.ScaledObjectRef{Namespace: "ns", ScalerMetadata: map[string]string{"workspace": "a", "activationThreshold": v}}, time.Hour, nil)
		var me *MetadataError
		if ok != (err == nil) || !ok && (!errors.As(err, &me) || me.Key != "activationThreshold") {
			t.Errorf("activationThreshold %s: %v; want taken %v", v, err, ok)
		}
	}
}

// TestFromEnvKeys: KEDA resolves <key>FromEnv from the target's container
// environment and forwards the value under that name; pulse reads it as the
// key (the key itself, when set, wins).
func TestFromEnvKeys(t *testing.T) {
	f := newFixture(t)
	resp, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", "thresholdFromEnv": "7"}))
	if err != nil || resp.MetricSpecs[0].TargetSizeFloat != 7 {
		t.Fatalf("thresholdFromEnv: %v %v", resp, err)
	}
	resp, err = f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", "threshold": "3", "thresholdFromEnv": "7"}))
	if err != nil || resp.MetricSpecs[0].TargetSizeFloat != 3 {
		t.Fatalf("threshold beside thresholdFromEnv: %v %v", resp, err)
	}
}

// TestDefaultThresholdsFitTheMetric: each metric with a sensible starting
// value gets its own (kvCacheUsage used to get 10 on a 0-1 value and never
// scale); the others need threshold set.
func TestDefaultThresholdsFitTheMetric(t *testing.T) {
	f := newFixture(t)
	for m, want := range map[string]float64{"waiting": 10, "running": 64, "swapped": 1, "kvCacheUsage": 0.4} {
		resp, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", "metric": m}))
		if err != nil || resp.MetricSpecs[0].TargetSizeFloat != want {
			t.Errorf("%s: %v %v, want target %v", m, resp, err, want)
		}
	}
	for _, m := range metric.Names() {
		if _, ok := DefaultThresholds[m]; ok {
			continue
		}
		_, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", "metric": m}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "has no default threshold") {
			t.Errorf("%s without threshold: %v", m, err)
		}
	}
}

func TestMetricSpec(t *testing.T) {
	f := newFixture(t)
	f.server.crossNS = true // the name of a workload in another namespace
	md := map[string]string{"workspace": "Llama.Big_1", "namespace": "team-x", "threshold": "2.5", "metric": "kvCacheUsage"}
	resp, err := f.client.GetMetricSpec(context.Background(), ref(md))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.MetricSpecs) != 1 {
		t.Fatalf("%d specs, want 1", len(resp.MetricSpecs))
	}
	s := resp.MetricSpecs[0]
	if s.MetricName != "pulse-workspace-team-x-llama-big-1-kvcacheusage" || s.TargetSizeFloat != 2.5 || s.TargetSize != 3 {
		t.Fatalf("spec = %+v", s)
	}
	// StreamMetricSpec sends the same spec at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.client.StreamMetricSpec(ctx, ref(md))
	if err != nil {
		t.Fatal(err)
	}
	got, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if g := got.MetricSpecs[0]; g.MetricName != s.MetricName || g.TargetSizeFloat != s.TargetSizeFloat || g.TargetSize != s.TargetSize {
		t.Fatalf("streamed spec %+v differs from GetMetricSpec %+v", g, s)
	}
}

func TestIsActiveAgreesWithGetMetrics(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	md := map[string]string{"workspace": "llama", "activationThreshold": "2"}
	for _, w := range []float64{0, 2, 3} {
		f.report(map[string]float64{"a": w})
		v, err := f.metric(t, md)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.client.IsActive(context.Background(), ref(md))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Result != (v > 2) {
			t.Fatalf("waiting %v: IsActive %v but GetMetrics %v", w, resp.Result, v)
		}
	}
}

func TestStreamIsActive(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.report(map[string]float64{"a": 0})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.client.StreamIsActive(ctx, ref(map[string]string{"workspace": "llama", "activationThreshold": "1", "window": "1s"}))
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.Result {
		t.Fatalf("first message = %v, %v; want false at once", first, err)
	}
	// The queue rises above activationThreshold: true is pushed.
	f.report(map[string]float64{"a": 5})
	if msg, err := stream.Recv(); err != nil || !msg.Result {
		t.Fatalf("after the queue rose: %v, %v; want true", msg, err)
	}
	// And back.
	f.report(map[string]float64{"a": 0})
	if msg, err := stream.Recv(); err != nil || msg.Result {
		t.Fatalf("after the queue fell: %v, %v; want false", msg, err)
	}
	// Shutdown ends the stream with EOF (handler returned nil), so KEDA
	// reconnects in 2s instead of backing off.
	f.server.Shutdown()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after shutdown: %v, want EOF", err)
	}
}

func TestThousandStreamsLeaveNothingBehind(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := newFixture(t)
	f.pods("a")
	f.report(map[string]float64{"a": 3})
	ctx, cancel := context.WithCancel(context.Background())
	streams := make([]grpc.ServerStreamingClient[externalscaler.IsActiveResponse], 1000)
	for i := range streams {
		s, err := f.client.StreamIsActive(ctx, ref(map[string]string{"workspace": "llama"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	if n := f.server.OpenStreams(); n != 1000 {
		t.Fatalf("%d handlers running, want 1000", n)
	}
	// The thousand streams of one trigger share its evaluation: one
	// shared, held by all of them.
	triggers, holders := 0, 0
	for _, sh := range f.server.push.shards {
		sh.mu.Lock()
		for _, sr := range heldTriggers(sh) {
			triggers, holders = triggers+1, holders+sr.streams
		}
		sh.mu.Unlock()
	}
	if triggers != 1 || holders != 1000 {
		t.Fatalf("%d triggers held by %d streams, want 1 held by 1000", triggers, holders)
	}
	cancel()
	for _, s := range streams {
		if _, err := s.Recv(); status.Code(err) != codes.Canceled {
			t.Fatalf("after cancel: %v", err)
		}
	}
	// KEDA's cancel alone releases every handler, before any shutdown.
	for deadline := time.Now().Add(10 * time.Second); f.server.OpenStreams() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers still running after cancel", f.server.OpenStreams())
		}
	}
	// And the pusher holds none of them (a handler's deferred remove ran;
	// a stream still in its namespace's queue is dropped by the pass its
	// remove signals).
	for i, sh := range f.server.push.shards {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			sh.mu.Lock()
			all, subs, dirty, watched, trigs := len(sh.all), len(sh.subs), len(sh.dirty), len(sh.watched), len(sh.triggers)
			waiters, queues := sh.waiters, len(sh.queues)
			sh.mu.Unlock()
			if all+subs+dirty+watched+trigs > 0 {
				t.Fatalf("shard %d after every stream ended: %d streams, %d workloads, %d changed, %d watched, %d triggers", i, all, subs, dirty, watched, trigs)
			}
			if waiters+queues == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("shard %d: %d streams waiting in %d queues 10 s after every stream ended", i, waiters, queues)
			}
		}
	}
	f.close()
}

// TestStreamsAfterShutdownEndAtOnce: a stream that opens while the server
// shuts down ends with EOF instead of racing the shutdown's wait.
func TestStreamsAfterShutdownEndAtOnce(t *testing.T) {
	f := newFixture(t)
	f.server.Shutdown()
	md := map[string]string{"workspace": "llama"}
	active, err := f.client.StreamIsActive(context.Background(), ref(md))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := active.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("StreamIsActive after shutdown: %v, want EOF", err)
	}
	specs, err := f.client.StreamMetricSpec(context.Background(), ref(md))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := specs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("StreamMetricSpec after shutdown: %v, want EOF", err)
	}
}

// TestMetricNameNobodyForwards: a metricName that is neither a metric pulse
// knows nor a gauge any agent forwards is said in every answer (GetMetricSpec,
// GetMetrics, IsActive alike),
// with what the agents do forward; one they forward passes; with no pod
// held at all (no agent heard yet) there is no telling, and it passes.
func TestMetricNameNobodyForwards(t *testing.T) {
	f := newFixture(t)
	md := map[string]string{"workspace": "a", "metricName": "vllm:lora_requests_waiting", "threshold": "5"}
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
		t.Fatalf("no pod held yet: %v", err)
	}
	f.store.Upsert(store.Source{Node: "node-1", ExtraNames: []string{"process_open_fds"}},
		[]store.PodInfo{{UID: "u1", Namespace: "ns", Name: "a-0", Ready: true, Workloads: []store.Key{{Namespace: "ns", Kind: store.KindWorkspace, Name: "a"}}}}, true)
	_, err := f.client.GetMetricSpec(context.Background(), ref(md))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "vllm:lora_requests_waiting") ||
		!strings.Contains(err.Error(), "they forward: process_open_fds") || !strings.Contains(err.Error(), "--extra-metric") {
		t.Fatalf("unforwarded metricName: %v", err)
	}
	// One error for one problem: GetMetrics (once Unavailable) and IsActive
	// say the same.
	if _, err2 := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "x"}); status.Code(err2) != codes.InvalidArgument || status.Convert(err2).Message() != status.Convert(err).Message() {
		t.Fatalf("GetMetrics: %v, want %v", err2, err)
	}
	if _, err2 := f.client.IsActive(context.Background(), ref(md)); status.Code(err2) != codes.InvalidArgument {
		t.Fatalf("IsActive: %v, want InvalidArgument", err2)
	}
	md["metricName"] = "process_open_fds"
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
		t.Fatalf("forwarded metricName: %v", err)
	}
	// The names are read from the store (a walk of every pod) at most
	// once a second: a gauge another agent starts forwarding is known
	// within a second.
	f.store.Upsert(store.Source{Node: "node-2", ExtraNames: []string{"vllm:lora_requests_waiting"}},
		[]store.PodInfo{{UID: "u2", Namespace: "ns", Name: "a-1", Ready: true, Workloads: []store.Key{{Namespace: "ns", Kind: store.KindWorkspace, Name: "a"}}}}, true)
	md["metricName"] = "vllm:lora_requests_waiting"
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a name forwarded since the last read, within the second: %v, want the names read then", err)
	}
	f.clock.Add(time.Second)
	if _, err := f.client.GetMetricSpec(context.Background(), ref(md)); err != nil {
		t.Fatalf("a name forwarded since the last read, a second later: %v", err)
	}
}

// TestEveryWorkloadKindHasAKey: each kind the agents attribute pods to can
// be named in a trigger, by the key WorkloadKey gives.
func TestEveryWorkloadKindHasAKey(t *testing.T) {
	for _, kind := range []string{store.KindWorkspace, store.KindInferenceSet, store.KindDeployment, store.KindStatefulSet,
		store.KindLeaderWorkerSet, store.KindWorkload} {
		key := WorkloadKey(kind)
		if key == "" {
			t.Errorf("%s: no key", kind)
			continue
		}
		tr, err := ParseTrigger(ref(map[string]string{key: "llama"}), time.Minute, nil)
		if err != nil || tr.Workload.Kind != kind || tr.Workload.Name != "llama" {
			t.Errorf("%s: %+v, %v", key, tr.Workload, err)
		}
	}
	if _, err := ParseTrigger(ref(map[string]string{"statefulSet": "a", "deployment": "b"}), time.Minute, nil); err == nil {
		t.Error("two workloads named: no error")
	}
}

// TestSaturationGivesTheReplicasNeeded: with threshold 1 (its default) the
// HPA's ceil(total / threshold) is the number of replicas that would each
// be fully loaded: the sum of the pods' load fractions.
func TestSaturationGivesTheReplicasNeeded(t *testing.T) {
	f := newFixture(t)
	f.pods("a", "b", "c")
	report := func(kv, waiting map[string]float64) {
		f.ms += 1000
		var rs []store.Report
		for n := range kv {
			r := store.Report{UID: "uid-" + n}
			r.TimeMs = f.ms
			r.Values.Set(metric.KVCacheUsage, kv[n])
			r.Values.Set(metric.Waiting, waiting[n])
			r.Values.Set(metric.Running, 48)
			rs = append(rs, r)
		}
		f.store.Add(rs)
	}
	md := map[string]string{"workspace": "llama", "metric": "saturation", "window": "1s"}
	// KV 0.35/0.7 = 0.5 each, no queue: 1.5 replicas' worth → the HPA asks 2.
	report(map[string]float64{"a": 0.35, "b": 0.35, "c": 0.35}, map[string]float64{})
	if v, err := f.metric(t, md); err != nil || math.Abs(v-1.5) > 1e-9 {
		t.Fatalf("saturation = %v, %v; want 1.5", v, err)
	}
	// A queue on one: 6 waiting of 2 → 3; the others 0.5: 4 replicas.
	report(map[string]float64{"a": 0.35, "b": 0.35, "c": 0.5}, map[string]float64{"c": 6})
	if v, err := f.metric(t, md); err != nil || math.Abs(v-4) > 1e-9 {
		t.Fatalf("saturation = %v, %v; want 4", v, err)
	}
	// Own targets: the batch counts, 48 of 32 = 1.5 per pod.
	md["runningTarget"], md["kvCacheTarget"], md["waitingTarget"] = "32", "0", "0"
	if v, err := f.metric(t, md); err != nil || math.Abs(v-4.5) > 1e-9 {
		t.Fatalf("saturation with runningTarget = %v, %v; want 4.5", v, err)
	}
	spec, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "llama", "metric": "saturation"}))
	if err != nil || spec.MetricSpecs[0].TargetSizeFloat != 1 {
		t.Errorf("default threshold: %v %v", spec, err)
	}
	for md, key := range map[string]string{"kvCacheTarget": "kvCacheTarget", "waitingTarget": "waitingTarget"} {
		bad := map[string]string{"workspace": "llama", "metric": "saturation", md: "-1"}
		if _, err := f.client.GetMetricSpec(context.Background(), ref(bad)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), key) {
			t.Errorf("%s -1: %v", md, err)
		}
	}
	none := map[string]string{"workspace": "llama", "metric": "saturation", "kvCacheTarget": "0", "waitingTarget": "0"}
	if _, err := f.client.GetMetricSpec(context.Background(), ref(none)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no target: %v", err)
	}
}

// TestTypoHintsAreBounded: an unknown metadata key of 1 MiB (any
// ScaledObject's author can write one) once took 5–8 s of CPU and 2.7 GB of
// allocations a call, for its typo hint. It is refused now, before any
// work, at the cost of a short key; an unknown key that is not a typo is
// ignored, and a typo still named.
func TestTypoHintsAreBounded(t *testing.T) {
	md := map[string]string{"workspace": "a", strings.Repeat("x", 1<<20): "1", strings.Repeat("é", 9): "2"}
	if _, err := metadata(md); err == nil || !strings.Contains(err.Error(), "over 1024 bytes") {
		t.Fatalf("a 1 MiB key: %v, want it refused", err)
	}
	allocs := testing.AllocsPerRun(3, func() { _, _ = metadata(md) })
	short := testing.AllocsPerRun(3, func() {
		_, _ = metadata(map[string]string{"workspace": "a", "xxxxxxxxx": "1", "éééééééééé": "2"})
	})
	if allocs > short+8 {
		t.Fatalf("a 1 MiB key: %.0f allocations a call, a short unknown key %.0f", allocs, short)
	}
	if _, err := metadata(map[string]string{"workspace": "a", "xxxxxxxxx": "1", strings.Repeat("é", 9): "2"}); err != nil {
		t.Fatalf("short unknown keys: %v", err)
	}
	if meant := nearestKey("treshold"); meant != "threshold" {
		t.Fatalf("the hint is gone: %q", meant)
	}
	// 63 unknown keys within the bounds, each measured against every key
	// of pulse's: a matrix each made 2,899 allocations and 0.5 ms a parse,
	// on every call KEDA makes.
	within := map[string]string{"workspace": "llama"}
	for i := range 63 {
		within[fmt.Sprintf("zzzzzzzzzzzzzzzzz%03d", i)] = "1"
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = metadata(within) }); n > 0 {
		t.Fatalf("63 unknown keys: %.0f allocations a parse, want none", n)
	}
	if maxPulseKey+2 > maxEdited {
		t.Fatalf("pulse's longest key (%d) and its two edits are past what editDistance reads (%d)", maxPulseKey, maxEdited)
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"threshold", "treshold", 1}, {"sloTtft", "SLOTTFT", 0}, {"windwo", "window", 1}, {"abc", "", 3}, {"é", "e", 1},
		{"ab", "ba", 1}, {"abcdef", "badcfe", 3}, {"zzzzzzzzzz", "threshold", 10}, {"kitten", "sitting", 3}} {
		for limit := 0; limit <= 10; limit++ {
			var a, b [maxEdited]rune
			if d := editDistance(a[:folded(&a, tc.a)], b[:folded(&b, tc.b)], limit); d != min(tc.d, limit+1) {
				t.Errorf("editDistance(%q, %q, %d) = %d, want %d", tc.a, tc.b, limit, d, min(tc.d, limit+1))
			}
		}
	}
}

// TestMetadataIsBoundedBeforeWork: every request parses its ScaledObject's
// metadata, and a record keeps what parsed. A hundred thousand unknown keys
// each had their typo hint computed (about a second of CPU a call), and a
// workload's name of 1 MiB was kept in records and a gauge's label. Too
// many keys, a key or value over 1 KiB, a workload's name longer than an
// object's or a namespace longer than a namespace's are refused, naming
// the bound; and a name with a control or format character, which no
// object's has (written raw into a refusal, a newline in a namespace
// forged a line of KEDA's events and the HPA's condition), quoted.
func TestMetadataIsBoundedBeforeWork(t *testing.T) {
	many := map[string]string{"workspace": "a"}
	for i := range 100000 {
		many[fmt.Sprintf("k%09d", i)] = "1"
	}
	for name, tc := range map[string]struct {
		md   map[string]string
		want string
	}{
		"100,000 keys":      {many, "100001 metadata keys; at most 64"},
		"a value of 1 KiB+": {map[string]string{"workspace": "a", "metricName": strings.Repeat("m", 1025)}, "over 1024 bytes"},
		"a long workload":   {map[string]string{"workspace": strings.Repeat("w", 254)}, "over 253 bytes"},
		"a long namespace":  {map[string]string{"workspace": "a", "namespace": strings.Repeat("n", 64)}, "over 63 bytes"},
		"a namespace with a newline": {map[string]string{"workspace": "a", "namespace": "x\n\x1b[2J forged line"},
			`"namespace": "x\n\x1b[2J forged line" is not UTF-8 of graphic characters alone`},
		"a workload with a format character": {map[string]string{"workspace": "a\u202eb"}, `the workload's name "a\u202eb" is not UTF-8 of graphic characters alone`},
	} {
		tr, err := ParseTrigger(ref(tc.md), time.Minute, nil)
		var me *MetadataError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a metadata error naming %q", name, err, tc.want)
		}
		// Nor is it kept raw, for a refusal's record to show.
		if !wire.IsName(tr.Workload.Namespace) || !wire.IsName(tr.Workload.Name) {
			t.Errorf("%s: the trigger keeps %q in %q", name, tr.Workload.Name, tr.Workload.Namespace)
		}
	}
	if _, err := ParseTrigger(ref(map[string]string{"workspace": strings.Repeat("w", 253)}), time.Minute, nil); err != nil {
		t.Fatalf("a 253-byte workload: %v", err)
	}
}

// TestTriggersReadOnlyTheirNamespace: a ScaledObject's trigger could name
// any namespace (namespace, workspaceNamespace) and read another tenant's
// workload; by default it reads only its own, and the refusal names the
// flag that allows more.
func TestTriggersReadOnlyTheirNamespace(t *testing.T) {
	f := newFixture(t)
	f.pods("llama-0")
	f.report(map[string]float64{"llama-0": 3})
	for _, md := range []map[string]string{
		{"workspace": "llama", "namespace": "other"},
		{"workspaceName": "llama", "workspaceNamespace": "other"},
	} {
		_, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "x"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--allow-cross-namespace-triggers") ||
			!strings.Contains(err.Error(), "demo/llama-so") {
			t.Errorf("%v: %v, want InvalidArgument naming the ScaledObject and the flag", md, err)
		}
		if _, err := f.client.IsActive(context.Background(), ref(md)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: IsActive %v", md, err)
		}
	}
	if _, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{
		ScaledObjectRef: ref(map[string]string{"workspace": "llama", "namespace": "demo"}), MetricName: "x"}); err != nil {
		t.Fatalf("its own namespace, named: %v", err)
	}
	// A ref with no namespace (KEDA always sends one) is refused: it was
	// checked against no namespace, and its streams counted against none.
	anon := &externalscaler.ScaledObjectRef{Name: "x", ScalerMetadata: map[string]string{"workspace": "llama", "namespace": "demo"}}
	if _, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: anon, MetricName: "x"}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no namespace") {
		t.Errorf("a ref with no namespace: %v, want InvalidArgument", err)
	}
	if stream, err := f.client.StreamIsActive(context.Background(), anon); err == nil {
		if _, err = stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("a stream for a ref with no namespace: %v, want InvalidArgument", err)
		}
	}
	// Nor one whose namespace or name the API server would not have:
	// kept whole in the refusals' records, 1,000 refused calls of 200 KiB
	// names held 204 MB (found in a review, 2026-12-07).
	before := len(f.server.Evaluations())
	for _, bad := range []*externalscaler.ScaledObjectRef{
		{Namespace: "demo", Name: strings.Repeat("n", 200<<10), ScalerMetadata: map[string]string{"workspace": "llama", "threshold": "x"}},
		{Namespace: strings.Repeat("d", 64), Name: "x", ScalerMetadata: map[string]string{"workspace": "llama", "threshold": "x"}},
		{Namespace: "Demo", Name: "x", ScalerMetadata: map[string]string{"workspace": "llama"}},
	} {
		_, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: bad, MetricName: "x"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "scaledObjectRef:") || len(err.Error()) > 1024 {
			t.Errorf("a ref of namespace %.10q, name %.10q: %.200v; want InvalidArgument, quoting it short", bad.Namespace, bad.Name, err)
		}
	}
	if n := len(f.server.Evaluations()); n != before {
		t.Errorf("refused refs of names no object has: %d records, want %d (none kept)", n, before)
	}
	f.server.crossNS = true
	_, err := f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{
		ScaledObjectRef: ref(map[string]string{"workspace": "llama", "namespace": "other"}), MetricName: "x"})
	if status.Code(err) == codes.InvalidArgument {
		t.Fatalf("with --allow-cross-namespace-triggers: %v", err)
	}
}

// TestARefusalQuotesAValueShort: a refusal quoted the value whole, up to
// the metadata's 1 KiB and four times that escaped, to KEDA, the log and
// each of the refusals kept. It quotes at most 64 bytes of it.
func TestARefusalQuotesAValueShort(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("\x01", 1000) // each byte quoted as \x01
	for _, key := range []string{"threshold", "valueType", "window", "metric", "metricName"} {
		_, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "a", key: long}))
		if n := strings.Count(err.Error(), `\x01`) + strings.Count(err.Error(), "\x01"); status.Code(err) != codes.InvalidArgument || n > 64 {
			t.Errorf("%s of 1,000 bytes: %d of them in the error, %v; want InvalidArgument quoting at most 64", key, n, status.Code(err))
		}
	}
}

// TestARefusalQuotesALegalMetricNameShort: a metricName may be any legal
// Prometheus name up to the metadata's bound, and three refusals of one
// (no default threshold, a saturation-only key beside it, a gauge no agent
// forwards) quoted it whole to KEDA, the log and each refusal kept. They
// quote at most 64 bytes of it too.
func TestARefusalQuotesALegalMetricNameShort(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("a", 1000)
	check := func(what string, md map[string]string) {
		t.Helper()
		_, err := f.client.GetMetricSpec(context.Background(), ref(md))
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want InvalidArgument", what, err)
		}
		if strings.Contains(err.Error(), long[:65]) {
			t.Errorf("%s: the error quotes more than 64 bytes of the name: %.200s…", what, err)
		}
	}
	check("no default threshold", map[string]string{"workspace": "w", "metricName": long})
	check("a saturation-only key", map[string]string{"workspace": "w", "metricName": long, "threshold": "1", "kvCacheTarget": "0.5"})
	f.store.Upsert(store.Source{Node: "node-1"},
		[]store.PodInfo{{UID: "u1", Namespace: "ns", Name: "w-0", Ready: true, Workloads: []store.Key{{Namespace: "ns", Kind: store.KindWorkspace, Name: "w"}}}}, true)
	check("not forwarded", map[string]string{"workspace": "w", "metricName": long, "threshold": "1"})
}

// TestARefusalKeepsTheWorkloadCutAndNamesTheNamespace: a trigger naming
// two workloads, one of 1,000 bytes, was refused before the name was cut,
// and its record (and its series' labels) held the whole name; and one
// naming another namespace's workload on a gauge not forwarded was refused
// as that gauge, naming no flag (after a walk of the store).
func TestARefusalKeepsTheWorkloadCutAndNamesTheNamespace(t *testing.T) {
	f := newFixture(t)
	if _, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": strings.Repeat("x", 1000), "deployment": "y"})); err == nil {
		t.Fatal("two workloads named: accepted")
	}
	if _, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": strings.Repeat("x", 1000), "namespace": "a", "workspaceNamespace": "b"})); err == nil {
		t.Fatal("two namespaces named: accepted")
	}
	evs := f.server.Evaluations()
	if len(evs) == 0 {
		t.Fatal("no refusal recorded")
	}
	for _, e := range evs {
		if n := len(e.Trigger.Workload.Name); n > maxWorkloadName+3 {
			t.Errorf("a refusal's record holds a workload name of %d bytes (%s)", n, e.Err)
		}
	}
	f.pods("a")
	f.report(map[string]float64{"a": 1})
	_, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"workspace": "llama", "namespace": "other", "metricName": "my_gauge", "threshold": "1"}))
	if err == nil || !strings.Contains(err.Error(), "allow-cross-namespace-triggers") {
		t.Errorf("another namespace's gauge: %v; want the namespace's refusal, naming the flag", err)
	}
}

// TestMetricMeantNamesAMisspeltMetric: the provisioner asks which name a
// metric no agent forwards is within a typo of: none while no agent is
// heard, none for a canonical metric, replicas, a vLLM name pulse maps or
// a forwarded gauge, none for a name near nothing; else the name meant.
func TestMetricMeantNamesAMisspeltMetric(t *testing.T) {
	f := newFixture(t)
	if m := f.server.MetricMeant("vllm:num_request_waiting"); m != "" {
		t.Fatalf("no agent heard: %q, want none (no telling)", m)
	}
	f.store.Upsert(store.Source{Node: "node-1", ExtraNames: []string{"vllm:cpu_cache_usage_perc", "my_queue_depth"}},
		[]store.PodInfo{{UID: "u1", Namespace: "ns", Name: "a-0", Ready: true, Workloads: []store.Key{{Namespace: "ns", Kind: store.KindWorkspace, Name: "a"}}}}, true)
	for name, want := range map[string]string{
		"vllm:num_request_waiting": "vllm:num_requests_waiting", "my_queue_dept": "my_queue_depth",
		"waiting": "", "replicas": "", "vllm:num_requests_waiting": "", "vllm:cpu_cache_usage_perc": "", "something_else_entirely": "",
	} {
		if got := f.server.MetricMeant(name); got != want {
			t.Errorf("MetricMeant(%q) = %q, want %q", name, got, want)
		}
	}
	// During the warm-up there is no telling: the agents that forward a
	// gauge may not have been heard yet.
	f.server.gate = func() error { return errors.New("aggregator warming up") }
	if m := f.server.MetricMeant("vllm:num_request_waiting"); m != "" {
		t.Fatalf("during the warm-up: %q, want none (no telling)", m)
	}
}

// TestACrossNamespaceTriggerCannotBreakTheScrape: with
// --allow-cross-namespace-triggers, a trigger's namespace was checked as
// printable text alone, not as a namespace's name. Two triggers of one
// ScaledObject splitting "x./.y/z" at either slash (namespace "x.",
// workload ".y/z"; namespace "x./.y", workload "z") have two metric names
// (x---y-z, x-y-z) and so two records, but the same series labels
// (workload "Workspace x./.y/z"): the registry refused the duplicate at
// every scrape (the aggregator serves with ContinueOnError: one trigger's
// series dropped, an error counted in promhttp_metric_handler_errors_total
// each scrape). A namespace that no namespace can have is refused, as the
// ScaledObject's own is.
func TestACrossNamespaceTriggerCannotBreakTheScrape(t *testing.T) {
	f := newFixture(t)
	f.server.crossNS = true
	for _, md := range []map[string]string{
		{"workspace": ".y/z", "namespace": "x."},
		{"workspace": "z", "namespace": "x./.y"},
	} {
		_, _ = f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "x"})
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.server.Collector())
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gathering /metrics: %v", err)
	}
}

// TestTwoWorkloadsOfOneMetricNameKeepTwoRecords: a trigger's record was
// keyed by its metric name, which folds every run of characters other
// than letters, digits and dashes into a dash. Two triggers of one
// ScaledObject on two workloads (Deployments llama.v1 and llama-v1, both
// valid and distinct) had one record between them: /debug/triggers and
// the trigger series showed whichever was evaluated last, the other's
// value, failure or refusal nowhere.
func TestTwoWorkloadsOfOneMetricNameKeepTwoRecords(t *testing.T) {
	f := newFixture(t)
	for _, md := range []map[string]string{{"deployment": "llama.v1"}, {"deployment": "llama-v1"}} {
		_, _ = f.client.GetMetrics(context.Background(), &externalscaler.GetMetricsRequest{ScaledObjectRef: ref(md), MetricName: "x"})
	}
	evs := f.server.Evaluations()
	if len(evs) != 2 {
		var got []string
		for _, e := range evs {
			got = append(got, e.MetricName+" "+e.Trigger.Workload.String())
		}
		t.Fatalf("%d records %q; want one for each of the two triggers", len(evs), got)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.server.Collector())
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gathering /metrics: %v", err)
	}
}
