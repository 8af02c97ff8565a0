package scaler

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func scaledObject(name, kind, target string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": name, "namespace": "demo"},
		"spec": map[string]any{"scaleTargetRef": map[string]any{"apiVersion": "kaito.sh/v1beta1", "kind": kind, "name": target},
			"triggers": []any{map[string]any{"type": "external-push", "metadata": map[string]any{"scalerAddress": "pulse-aggregator.pulse-system:9090"}}}},
	}}
	return u
}

// TestAScaledJobOfAScaledObjectsNameReadsNothing: KEDA's ref names neither
// a ScaledObject nor a ScaledJob, and a ScaledJob whose pulse trigger named
// no workload, beside a ScaledObject of its name, was answered that
// ScaledObject's workload's values (the docs promise Unavailable: only
// ScaledObjects are read). A ScaledObject with no external-push trigger is
// not the caller: Unavailable, saying what a ScaledJob's trigger must do.
func TestAScaledJobOfAScaledObjectsNameReadsNothing(t *testing.T) {
	cpu := scaledObject("llama-so", "Workspace", "llama")
	_ = unstructured.SetNestedSlice(cpu.Object, []any{map[string]any{"type": "cpu", "metadata": map[string]any{"value": "50"}}}, "spec", "triggers")
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"}, cpu)
	r := NewInformerResolver(client)
	runSynced(t, r)
	f := newFixtureWith(t, r)
	f.pods("a", "b")
	f.report(map[string]float64{"a": 2, "b": 3})
	_, err := f.metric(t, map[string]string{"threshold": "5"}) // ref(): demo/llama-so, as KEDA names ScaledJob llama-so
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "A ScaledJob's trigger must name its workload") {
		t.Fatalf("GetMetrics for a ScaledJob of ScaledObject llama-so's name: %v; want Unavailable saying what to do", err)
	}
}

// runSynced runs r's informer for the test's life, and waits for its
// cache to sync.
func runSynced(t *testing.T, r *InformerResolver) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.Run(ctx)
	for deadline := time.Now().Add(10 * time.Second); !r.informer.HasSynced(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("informer never synced")
		}
	}
}

// TestWorkloadFromScaleTargetRef: a trigger that names no workload scales
// the one its ScaledObject targets, read from a real informer's cache.
func TestWorkloadFromScaleTargetRef(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"},
		scaledObject("llama-so", "Workspace", "llama"), scaledObject("odd-so", "CronJob", "x"))
	r := NewInformerResolver(client)
	if _, _, err := r.Resolve("demo", "llama-so"); !errors.Is(err, errNotSynced) {
		t.Fatalf("before sync: %v", err)
	}
	runSynced(t, r)
	f := newFixtureWith(t, r)
	f.pods("a", "b")
	f.report(map[string]float64{"a": 2, "b": 3})
	got, err := f.metric(t, map[string]string{"threshold": "5"}) // ref(): ScaledObject demo/llama-so
	if err != nil || got != 5 {
		t.Fatalf("GetMetrics = %v, %v; want 5 for Workspace llama", got, err)
	}
	_, err = f.client.GetMetricSpec(context.Background(), &externalscaler.ScaledObjectRef{Name: "odd-so", Namespace: "demo"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "CronJob") {
		t.Fatalf("unknown kind: %v", err)
	}
	_, err = f.client.GetMetricSpec(context.Background(), &externalscaler.ScaledObjectRef{Name: "nope", Namespace: "demo"})
	// KEDA asks only about ScaledObjects it has read: one the cache lacks
	// was made a moment ago. Unavailable (KEDA retries), not the tenant's
	// error. A ScaledJob's trigger comes the same way, and the answer says
	// what it must do.
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not in the aggregator's ScaledObject cache yet") || !strings.Contains(err.Error(), "A ScaledJob's trigger must name its workload") {
		t.Fatalf("missing ScaledObject: %v", err)
	}

	retargetedStreamsEnd(t, f, client)
	retargetedSpecsFollow(t, f, client)
}

// retargetedSpecsFollow: a StreamMetricSpec resolved from the old
// scaleTargetRef kept the old workload's metric name for its life, where
// GetMetricSpec gave the new one. It sends the new spec once the cache
// resolves the trigger otherwise.
func retargetedSpecsFollow(t *testing.T, f *fixture, client *dynamicfake.FakeDynamicClient) {
	t.Helper()
	defer func(d time.Duration) { streamRecheck = d }(streamRecheck)
	streamRecheck = 20 * time.Millisecond
	retarget := func(name string) {
		if _, err := client.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), scaledObject("llama-so", "Workspace", name), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // the cache has it
			s, err := f.client.GetMetricSpec(context.Background(), ref(map[string]string{"threshold": "5"}))
			if err == nil && strings.HasSuffix(s.MetricSpecs[0].MetricName, "-"+name+"-waiting") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GetMetricSpec never resolved Workspace %s: %v, %v", name, s, err)
			}
		}
	}
	retarget("llama")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := f.client.StreamMetricSpec(ctx, ref(map[string]string{"threshold": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	names := func() string {
		s, err := stream.Recv()
		if err != nil {
			t.Fatalf("the spec stream: %v", err)
		}
		return s.MetricSpecs[0].MetricName
	}
	if got := names(); !strings.HasSuffix(got, "-llama-waiting") {
		t.Fatalf("the first spec: %s, want Workspace llama's", got)
	}
	retarget("llama-v2")
	if got := names(); !strings.HasSuffix(got, "-llama-v2-waiting") {
		t.Fatalf("after the retarget: %s, want Workspace llama-v2's", got)
	}
}

// retargetedStreamsEnd: a stream resolved from the old scaleTargetRef ends
// once the cache resolves it otherwise (KEDA then opens it again); it
// followed the old workload for its whole life.
func retargetedStreamsEnd(t *testing.T, f *fixture, client *dynamicfake.FakeDynamicClient) {
	t.Helper()
	defer func(d time.Duration) { streamRecheck = d }(streamRecheck)
	streamRecheck = 20 * time.Millisecond
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	stream, err := f.client.StreamIsActive(sctx, ref(map[string]string{"threshold": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the stream's first state: %v", err)
	}
	if _, err := client.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), scaledObject("llama-so", "Workspace", "llama-v2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	recvUntilEnd := func(stream grpc.ServerStreamingClient[externalscaler.IsActiveResponse]) error {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if _, err := stream.Recv(); err != nil {
				return err
			}
		}
		t.Fatal("the stream of a retargeted ScaledObject did not end")
		return nil
	}
	if err := recvUntilEnd(stream); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream of a retargeted ScaledObject: %v, want EOF", err)
	}
	// Retargeted to a kind pulse does not scale: the stream ends with the
	// refusal KEDA's polls get (it followed the old workload, pushing its
	// state, until KEDA opened it again).
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	stream, err = f.client.StreamIsActive(ctx2, ref(map[string]string{"threshold": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); f.server.OpenStreams() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) { // the stream is open on llama-v2 (which has no pod: no state pushed)
			t.Fatalf("the reopened stream never opened: %d open", f.server.OpenStreams())
		}
	}
	if _, err := client.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), scaledObject("llama-so", "CronJob", "x"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := recvUntilEnd(stream); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "CronJob") {
		t.Fatalf("the stream of a ScaledObject retargeted to a CronJob: %v, want its InvalidArgument", err)
	}
}

// TestAStreamKeepsOnlyTheKeysItReadsAgain: a stream whose workload comes
// from its ScaledObject's scaleTargetRef parses its ref again at each
// recheck, and keeps of it only its names and the keys pulse and KEDA
// read (and their FromEnv forms), which resolve as the whole did. Kept
// whole, 61 unknown keys of 1 KiB and their values held 130 KB more a
// stream for its life.
func TestAStreamKeepsOnlyTheKeysItReadsAgain(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"}, scaledObject("llama-so", "Workspace", "llama"))
	r := NewInformerResolver(client)
	runSynced(t, r)
	f := newFixtureWith(t, r)
	md := map[string]string{"threshold": "5", "metricFromEnv": "running", "scalerAddress": "pulse:9090"}
	for i := range 61 {
		md[strings.Repeat("x", 1000)+strconv.Itoa(i)] = strings.Repeat("v", 1024)
	}
	whole := ref(md)
	w, _, err := f.server.openStream(whole, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if len(w.ref.ScalerMetadata) != 3 || w.ref.ScalerMetadata["metricFromEnv"] != "running" || w.ref.Name != whole.Name || w.ref.Namespace != whole.Namespace {
		t.Fatalf("the stream kept %d keys (%v, %s/%s); want its names and the 3 pulse and KEDA read", len(w.ref.ScalerMetadata), w.ref.ScalerMetadata["metricFromEnv"], w.ref.Namespace, w.ref.Name)
	}
	a, errA := f.server.parse(whole)
	b, errB := f.server.parse(w.ref)
	if errA != nil || errB != nil || MetricName(a) != MetricName(b) || a.Threshold != b.Threshold {
		t.Fatalf("the kept ref parses as %s (%v), the whole as %s (%v)", MetricName(b), errB, MetricName(a), errA)
	}
}
