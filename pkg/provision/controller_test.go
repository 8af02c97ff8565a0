package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/test/syncbuf"
)

var (
	infSets     = schema.GroupVersionResource{Group: "kaito.sh", Version: "v1alpha1", Resource: "inferencesets"}
	deployments = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
)

// fixture: fake API clients behind real informers. The cluster serves
// InferenceSets (kaito.sh/v1alpha1) and Deployments, not Workspaces.
type fixture struct {
	t    *testing.T
	meta *metadatafake.FakeMetadataClient
	dyn  *dynamicfake.FakeDynamicClient
	kube *kubefake.Clientset
	reg  *prometheus.Registry
	c    *Controller
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	sch := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(sch); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, meta: metadatafake.NewSimpleMetadataClient(sch, objs...), kube: kubefake.NewClientset(), reg: prometheus.NewRegistry()}
	f.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"})
	f.kube.Resources = []*metav1.APIResourceList{
		{GroupVersion: "kaito.sh/v1alpha1", APIResources: []metav1.APIResource{{Name: "inferencesets", Kind: "InferenceSet", Namespaced: true},
			{Name: "workspaces", Kind: "Workspace", Namespaced: true}}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "deployments", Kind: "Deployment", Namespaced: true},
			{Name: "statefulsets", Kind: "StatefulSet", Namespaced: true}}},
	}
	f.c = New(Options{Metadata: f.meta, Dynamic: f.dyn, Discovery: f.kube.Discovery(), Events: f.kube.CoreV1(),
		Target: Target{ScalerAddress: "pulse-aggregator.pulse-system.svc:9090", TriggerAuth: "pulse-creds"}, MaxWindow: time.Minute}, f.reg)
	return f
}

func (f *fixture) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.c.RunElected(ctx, Election{Identity: "solo"}) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("Run: %v", err)
		}
	})
}

func workload(gvr schema.GroupVersionResource, kind, name string, annotations map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: gvr.GroupVersion().String(), Kind: kind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", UID: types.UID(kind + "-" + name), Annotations: annotations}}
}

func (f *fixture) annotate(gvr schema.GroupVersionResource, kind, name string, annotations map[string]string) {
	f.t.Helper()
	if err := f.meta.Tracker().Update(gvr, workload(gvr, kind, name, annotations), "demo"); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) scaledObject(name string) (*unstructured.Unstructured, error) {
	return f.dyn.Resource(ScaledObjects).Namespace("demo").Get(context.Background(), name, metav1.GetOptions{})
}

func (f *fixture) waitFor(what string, check func() error) {
	f.t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = check(); err == nil {
			return
		}
	}
	f.t.Fatalf("%s: %v", what, err)
}

// event waits for an Event on the workload with the reason, and returns its
// message.
func (f *fixture) event(name, reason string) string {
	f.t.Helper()
	var msg string
	f.waitFor("event "+reason+" on "+name, func() error {
		list, err := f.kube.CoreV1().Events("demo").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason {
				msg = e.Message
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s", len(list.Items), reason)
	})
	return msg
}

// waitState waits for the workload's state, its message saying says.
func (f *fixture) waitState(kind, name, state, says string) {
	f.t.Helper()
	f.waitFor(kind+" "+name+" "+state, func() error {
		if s := f.state(kind, name); s.State != state || !strings.Contains(s.Message, says) {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
}

func (f *fixture) state(kind, name string) Status {
	for _, s := range f.c.Provisioning().Workloads {
		if s.Kind == kind && s.Name == name {
			return s
		}
	}
	return Status{}
}

// maxOf is name's ScaledObject and an error unless its maxReplicaCount is n.
func (f *fixture) maxOf(name string, n int64) (*unstructured.Unstructured, error) {
	so, err := f.scaledObject(name)
	if err != nil {
		return nil, err
	}
	if got, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); got != n {
		return so, fmt.Errorf("maxReplicaCount %d, want %d", got, n)
	}
	return so, nil
}

// otherWriter runs write every 5 ms, another writer of the cluster's, until
// the stop it returns is called (which waits for it).
func (f *fixture) otherWriter(write func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(5 * time.Millisecond):
			}
			write()
		}
	}()
	return func() { close(quit); <-done }
}

func triggerOf(t *testing.T, so *unstructured.Unstructured) map[string]any {
	t.Helper()
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	if len(triggers) != 1 {
		t.Fatalf("triggers %v", triggers)
	}
	return triggers[0].(map[string]any)
}

// TestProvisionFollowsTheAnnotations: an annotated InferenceSet gets its
// ScaledObject; a changed annotation changes it; an edit of the
// ScaledObject is undone; a removed annotation deletes it.
func TestProvisionFollowsTheAnnotations(t *testing.T) {
	f := newFixture(t, workload(infSets, "InferenceSet", "llama", map[string]string{
		KaitoAutoProvision: "true", KaitoThreshold: "10", KaitoMaxReplicas: "5"}))
	f.run()
	f.firstScaledObject(t)

	// The threshold annotation changes: the ScaledObject follows.
	f.annotate(infSets, "InferenceSet", "llama", map[string]string{KaitoAutoProvision: "true", KaitoThreshold: "4", KaitoMaxReplicas: "5"})
	f.waitFor("the new threshold", func() error {
		so, err := f.scaledObject("llama")
		if err != nil {
			return err
		}
		if th := triggerOf(t, so)["metadata"].(map[string]any)["threshold"]; th != "4" {
			return fmt.Errorf("threshold %v", th)
		}
		return nil
	})
	f.event("llama", "ScaledObjectUpdated")

	f.editIsUndone(t)

	// An invalid annotation leaves the ScaledObject as it was, and says why.
	f.annotate(infSets, "InferenceSet", "llama", map[string]string{KaitoAutoProvision: "true", KaitoThreshold: "four", KaitoMaxReplicas: "5"})
	if msg := f.event("llama", "InvalidAnnotation"); !strings.Contains(msg, KaitoThreshold) || !strings.Contains(msg, "left as it was") {
		t.Errorf("event %q", msg)
	}
	if s := f.state("InferenceSet", "llama"); s.State != StateInvalid {
		t.Errorf("status %+v", s)
	}
	so, _ := f.scaledObject("llama")
	if th := triggerOf(t, so)["metadata"].(map[string]any)["threshold"]; th != "4" {
		t.Errorf("an invalid annotation changed the ScaledObject: threshold %v", th)
	}
	if v := testutil.ToFloat64(f.c.m.errors.WithLabelValues("invalid_annotation")); v < 1 {
		t.Errorf("pulse_provisioner_errors_total{reason=invalid_annotation} = %v", v)
	}

	// The annotation is removed: the ScaledObject goes.
	f.annotate(infSets, "InferenceSet", "llama", nil)
	f.waitFor("the ScaledObject deleted", func() error {
		if _, err := f.scaledObject("llama"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	f.event("llama", "ScaledObjectDeleted")
	// The state is forgotten after the Event is made (by the worker, the
	// Event written by the broadcaster's goroutines): waited for.
	f.waitFor("the status after removal", func() error {
		if w := f.c.Provisioning().Workloads; len(w) != 0 {
			return fmt.Errorf("%+v", w)
		}
		return nil
	})
	for action, want := range map[string]float64{"create": 1, "delete": 1} {
		if v := testutil.ToFloat64(f.c.m.changes.WithLabelValues(action)); v != want {
			t.Errorf("changes{%s} = %v, want %v", action, v, want)
		}
	}
	if v := testutil.ToFloat64(f.c.m.changes.WithLabelValues("update")); v < 2 {
		t.Errorf("changes{update} = %v, want at least 2", v)
	}
}

// firstScaledObject: the InferenceSet llama's ScaledObject (threshold 10,
// at most 5 replicas) is pulse's, scales it on waiting, is one pulse's
// scaler accepts, and its creation is an Event and a state.
func (f *fixture) firstScaledObject(t *testing.T) {
	t.Helper()
	var so *unstructured.Unstructured
	f.waitFor("the ScaledObject", func() (err error) { so, err = f.scaledObject("llama"); return err })
	if so.GetLabels()[LabelManagedBy] != ManagedBy || !OwnedBy(so, "InferenceSet-llama") {
		t.Errorf("labels %v owners %v", so.GetLabels(), so.GetOwnerReferences())
	}
	ref, _, _ := unstructured.NestedStringMap(so.Object, "spec", "scaleTargetRef")
	if ref["kind"] != "InferenceSet" || ref["apiVersion"] != "kaito.sh/v1alpha1" || ref["name"] != "llama" {
		t.Errorf("scaleTargetRef %v", ref)
	}
	tr := triggerOf(t, so)
	md := tr["metadata"].(map[string]any)
	if tr["type"] != "external-push" || md["scalerAddress"] != "pulse-aggregator.pulse-system.svc:9090" || md["inferenceSet"] != "llama" ||
		md["metric"] != "waiting" || md["threshold"] != "10" {
		t.Errorf("trigger %v", tr)
	}
	if auth := tr["authenticationRef"].(map[string]any); auth["name"] != "pulse-creds" || auth["kind"] != "ClusterTriggerAuthentication" {
		t.Errorf("authenticationRef %v", auth)
	}
	if n, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); n != 5 {
		t.Errorf("maxReplicaCount %d", n)
	}
	// The trigger is one pulse's scaler accepts, and reads as intended.
	smd := map[string]string{}
	for k, v := range md {
		smd[k] = v.(string)
	}
	if _, err := scaler.ParseTrigger(&externalscaler.ScaledObjectRef{Name: "llama", Namespace: "demo", ScalerMetadata: smd}, time.Minute, nil); err != nil {
		t.Errorf("the scaler refuses the provisioned trigger: %v", err)
	}
	if msg := f.event("llama", "ScaledObjectCreated"); !strings.Contains(msg, "waiting, threshold 10") {
		t.Errorf("event %q", msg)
	}
	// The state is reported after the Event is made: waited for.
	f.waitState("InferenceSet", "llama", StateProvisioned, "")
}

// editIsUndone: someone edits the ScaledObject pulse keeps (llama's,
// at most 5 replicas): pulse puts it back, keeping KEDA's finalizer.
func (f *fixture) editIsUndone(t *testing.T) {
	t.Helper()
	so, _ := f.scaledObject("llama")
	_ = unstructured.SetNestedField(so.Object, int64(50), "spec", "maxReplicaCount")
	so.SetFinalizers([]string{"finalizer.keda.sh"})
	if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), so, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the edit undone", func() error {
		so, err := f.maxOf("llama", 5)
		if err != nil {
			return err
		}
		if len(so.GetFinalizers()) != 1 {
			return fmt.Errorf("KEDA's finalizer was dropped: %v", so.GetFinalizers())
		}
		return nil
	})
}

// TestHandWrittenScaledObjectsAreLeftAlone: a ScaledObject pulse did not
// make, of the workload's name or scaling the workload under another name,
// is never changed: the conflict is reported.
func TestHandWrittenScaledObjectsAreLeftAlone(t *testing.T) {
	f := newFixture(t,
		workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}),
		workload(deployments, "Deployment", "other", map[string]string{AnnotationAutoscale: "true"}))
	hand := func(name, target string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
			"metadata": map[string]any{"name": name, "namespace": "demo"},
			"spec":     map[string]any{"scaleTargetRef": map[string]any{"name": target}, "maxReplicaCount": int64(7)}}}
	}
	for _, so := range []*unstructured.Unstructured{hand("mine", "mine"), hand("by-hand", "other")} {
		if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), so, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.run()
	if msg := f.event("mine", "ScaledObjectConflict"); !strings.Contains(msg, "not pulse's") {
		t.Errorf("event %q", msg)
	}
	if msg := f.event("other", "ScaledObjectConflict"); !strings.Contains(msg, "by-hand already scales Deployment other") {
		t.Errorf("event %q", msg)
	}
	so, err := f.scaledObject("mine")
	if err != nil || Managed(so) {
		t.Fatalf("the hand-written ScaledObject: %v %v", so, err)
	}
	if n, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); n != 7 {
		t.Errorf("the hand-written ScaledObject was changed: %v", so.Object["spec"])
	}
	if _, err := f.scaledObject("other"); !apierrors.IsNotFound(err) {
		t.Errorf("a second ScaledObject for Deployment other: %v", err)
	}
	if s := f.state("Deployment", "mine"); s.State != StateConflict {
		t.Errorf("status %+v", s)
	}

	// The user deletes theirs: pulse provisions.
	if err := f.dyn.Resource(ScaledObjects).Namespace("demo").Delete(context.Background(), "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("pulse's ScaledObject", func() error {
		so, err := f.scaledObject("mine")
		if err != nil {
			return err
		}
		if !Managed(so) {
			return fmt.Errorf("not pulse's: %v", so.GetLabels())
		}
		return nil
	})
	// The state and its gauge are reported after the create returns.
	f.waitState("Deployment", "mine", StateProvisioned, "")
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP pulse_provisioner_workloads Workloads annotated for autoscaling, by state: provisioned, invalid (an annotation), conflict (a ScaledObject not pulse's), error (the API server refused or failed the write; retried). 0 on a replica not leading.
# TYPE pulse_provisioner_workloads gauge
pulse_provisioner_workloads{state="conflict"} 1
pulse_provisioner_workloads{state="error"} 0
pulse_provisioner_workloads{state="invalid"} 0
pulse_provisioner_workloads{state="provisioned"} 1
`), "pulse_provisioner_workloads"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(f.reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestOnlyTheLeaderProvisions: two replicas on one Lease; one provisions,
// and when it stops, the other takes over.
func TestOnlyTheLeaderProvisions(t *testing.T) {
	f := newFixture(t, workload(infSets, "InferenceSet", "llama", map[string]string{AnnotationAutoscale: "true"}))
	second := New(Options{Metadata: f.meta, Dynamic: f.dyn, Discovery: f.kube.Discovery(), Events: f.kube.CoreV1(),
		Target: f.c.o.Target, MaxWindow: time.Minute}, nil)
	// The chart's ClusterRole owns the Lease, so helm uninstall deletes it.
	owner := metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-aggregator", UID: "cr-uid"}
	election := func(id string) Election {
		return Election{Enabled: true, Namespace: "pulse-system", Name: "pulse-aggregator-provisioner", Identity: id,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond, Leases: f.kube.CoordinationV1(),
			Owner: func(context.Context) (metav1.OwnerReference, error) { return owner, nil }}
	}
	var wg sync.WaitGroup
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	wg.Add(2)
	go func() { defer wg.Done(); _ = f.c.RunElected(ctxA, election("a")) }()
	go func() { defer wg.Done(); _ = second.RunElected(ctxB, election("b")) }()
	defer wg.Wait()

	var leader, follower *Controller
	f.waitFor("a leader", func() error {
		a, b := f.c.Provisioning(), second.Provisioning()
		switch {
		case a.Leading && b.Leading:
			t.Fatal("two leaders")
		case a.Leading:
			leader, follower = f.c, second
		case b.Leading:
			leader, follower = second, f.c
		default:
			return fmt.Errorf("none leads: %+v %+v", a, b)
		}
		return nil
	})
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("llama"); return err })
	f.waitFor("the Lease owned by the ClusterRole", func() error {
		lease, err := f.kube.CoordinationV1().Leases("pulse-system").Get(context.Background(), "pulse-aggregator-provisioner", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0] != owner {
			return fmt.Errorf("owner references %v, want [%v]", lease.OwnerReferences, owner)
		}
		return nil
	})
	f.waitFor("the follower knows the leader", func() error {
		if p := follower.Provisioning(); p.Leader != leader.Provisioning().Identity || p.Leading || len(p.Workloads) != 0 {
			return fmt.Errorf("follower %+v", p)
		}
		return nil
	})
	// The leader stops (and releases the Lease): the follower takes over
	// and provisions.
	if leader == f.c {
		stopA()
	} else {
		stopB()
	}
	f.waitFor("the follower leads and provisions", func() error {
		p := follower.Provisioning()
		if !p.Leading || len(p.Workloads) != 1 || p.Workloads[0].State != StateProvisioned {
			return fmt.Errorf("follower %+v", p)
		}
		return nil
	})
	stopA()
	stopB()
}

// TestALeaseIsMadeOnlyForAnOwnerThatStands: the Lease's owner is read at
// each create. Read once at the start, a ClusterRole made again since
// (another UID) left the Lease owned by one gone: the garbage collector
// deleted it, another replica made it again, and so on, two leaders at
// once until the first one's renew deadline. While the owner is gone or
// being deleted (an error) no Lease is made, and none leads; then the
// owner as it is now owns it.
func TestALeaseIsMadeOnlyForAnOwnerThatStands(t *testing.T) {
	f := newFixture(t, workload(infSets, "InferenceSet", "llama", map[string]string{AnnotationAutoscale: "true"}))
	owner := metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-aggregator", UID: "cr-uid-2"}
	var stands atomic.Bool
	var reads atomic.Int64
	e := Election{Enabled: true, Namespace: "pulse-system", Name: "pulse-aggregator-provisioner", Identity: "a",
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond, Leases: f.kube.CoordinationV1(),
		Owner: func(context.Context) (metav1.OwnerReference, error) {
			reads.Add(1)
			if !stands.Load() {
				return metav1.OwnerReference{}, errors.New("ClusterRole pulse-aggregator is being deleted")
			}
			return owner, nil
		}}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.c.RunElected(ctx, e) }()
	defer func() { stop(); <-done }()
	leases := f.kube.CoordinationV1().Leases("pulse-system")
	f.waitFor("three tries to make the Lease", func() error {
		if n := reads.Load(); n < 3 {
			return fmt.Errorf("%d reads of the owner", n)
		}
		return nil
	})
	if l, err := leases.Get(context.Background(), e.Name, metav1.GetOptions{}); err == nil || f.c.Provisioning().Leading {
		t.Fatalf("the owner being deleted: Lease %v (%v), leading %v; want none made, none leading", l.OwnerReferences, err, f.c.Provisioning().Leading)
	}
	stands.Store(true)
	f.waitFor("the Lease owned by the owner as it is now, and a leader", func() error {
		l, err := leases.Get(context.Background(), e.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			return err
		case len(l.OwnerReferences) != 1 || l.OwnerReferences[0] != owner:
			return fmt.Errorf("owner references %v, want [%v]", l.OwnerReferences, owner)
		case !f.c.Provisioning().Leading:
			return errors.New("none leads")
		}
		return nil
	})
}

// TestWorkspaceSaysItScalesZeroToOne: a Workspace's ScaledObject is made,
// and its status and Event say the HPA cannot take it past one replica.
func TestWorkspaceSaysItScalesZeroToOne(t *testing.T) {
	workspaces := schema.GroupVersionResource{Group: "kaito.sh", Version: "v1alpha1", Resource: "workspaces"}
	f := newFixture(t, workload(workspaces, "Workspace", "llama", map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "0"}))
	f.run()
	f.waitState("Workspace", "llama", StateProvisioned, "no selector")
	// The Event says so too (it was the debug endpoint's alone, which
	// listens on the pod's loopback).
	if msg := f.event("llama", "ScaledObjectCreated"); !strings.Contains(msg, "0-10 replicas") || !strings.Contains(msg, "no selector") {
		t.Errorf("event %q", msg)
	}
}

// TestStatusUpdatesConcernNoWorkload: KEDA writes a ScaledObject's status
// on every poll; only a spec (generation), label or owner change, or a
// resync, queues its workloads.
func TestStatusUpdatesConcernNoWorkload(t *testing.T) {
	so := func(rv string, gen int64, labels map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetResourceVersion(rv)
		u.SetGeneration(gen)
		u.SetLabels(labels)
		return u
	}
	mine := map[string]string{LabelManagedBy: ManagedBy}
	for _, c := range []struct {
		old, new *unstructured.Unstructured
		skip     bool
	}{
		{so("1", 1, mine), so("2", 1, mine), true},                                                     // status
		{so("1", 1, mine), so("2", 2, mine), false},                                                    // spec
		{so("1", 1, mine), so("2", 1, map[string]string{"scaledobject.keda.sh/name": "llama"}), false}, // labels
		{so("2", 1, mine), so("2", 1, mine), false},                                                    // resync
	} {
		if got := statusOnly(c.old, c.new); got != c.skip {
			t.Errorf("%v → %v: statusOnly %v, want %v", c.old.Object, c.new.Object, got, c.skip)
		}
	}
}

// TestOrphanedScaledObjectIsAdopted: a workload deleted with
// --cascade=orphan and re-created keeps pulse's ScaledObject, owned by the
// old uid; the new workload (same kind and name) adopts it: its owner
// reference is the new uid and the workload is provisioned, where it once
// stayed in conflict for ever.
func TestOrphanedScaledObjectIsAdopted(t *testing.T) {
	old := Desired(Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "demo", Name: "mine", UID: "Deployment-mine-before"},
		Settings{MinReplicas: 1, MaxReplicas: 3, ScaleUpPodsPerMinute: 2, ScaleDownInterval: time.Minute, ScaleDownDelay: time.Minute,
			Trigger: map[string]string{"deployment": "mine"}}, Target{ScalerAddress: "x:9090"})
	// Owned by the old uid; and with no owner left, as the garbage
	// collector leaves a dependent of an owner deleted with
	// --cascade=orphan: the workload its scaleTargetRef names adopts it.
	orphan := old.DeepCopy()
	orphan.SetOwnerReferences(nil)
	for what, so := range map[string]*unstructured.Unstructured{"owned by the old uid": old, "with no owner": orphan} {
		f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
		if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), so, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.run()
		f.waitFor("the orphan "+what+" adopted", func() error {
			so, err := f.scaledObject("mine")
			if err != nil {
				return err
			}
			if !OwnedBy(so, "Deployment-mine") {
				return fmt.Errorf("owners %v", so.GetOwnerReferences())
			}
			if s := f.state("Deployment", "mine"); s.State != StateProvisioned {
				return fmt.Errorf("state %+v", s)
			}
			return nil
		})
	}
	// Turned off before it was adopted: the orphan is deleted, as the
	// workload's own would be (it kept scaling the workload with its
	// predecessor's settings).
	for what, so := range map[string]*unstructured.Unstructured{"owned by the old uid": old, "with no owner": orphan} {
		f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "false"}))
		if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), so.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.run()
		f.waitFor("the orphan "+what+" deleted with the annotation false", func() error {
			if _, err := f.scaledObject("mine"); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
	}
	// A ScaledObject of pulse's for another workload is still left alone.
	g := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	theirs := Desired(Owner{APIVersion: "apps/v1", Kind: "StatefulSet", Namespace: "demo", Name: "db", UID: "StatefulSet-db"},
		Settings{MinReplicas: 1, MaxReplicas: 3, Trigger: map[string]string{"statefulSet": "db"}}, Target{ScalerAddress: "x:9090"})
	theirs.SetName("mine")
	if _, err := g.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.run()
	g.waitFor("the conflict reported", func() error {
		if s := g.state("Deployment", "mine"); s.State != StateConflict {
			return fmt.Errorf("state %+v", s)
		}
		return nil
	})
}

// TestRefusedWriteIsReportedAndALostLeaseForgets: the API server refusing
// the ScaledObject (KEDA's webhook refusing a second scaler of the
// workload, a ResourceQuota) was only logged in the aggregator and retried:
// the workload's status still said whatever it said before, and no Event
// told its owner. Now its status is error, with the refusal, and a warning
// Event says so. And a replica that stops leading forgets every workload's
// state (it kept them, and its gauges counted them beside the new
// leader's).
func TestRefusedWriteIsReportedAndALostLeaseForgets(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.dyn.PrependReactor("create", "scaledobjects", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "keda.sh", Resource: "scaledobjects"}, "mine",
			errors.New(`admission webhook "vscaledobject.kb.io" denied the request: the workload 'mine' of type 'apps/v1.Deployment' is already managed by the hpa 'mine'`))
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.c.RunElected(ctx, Election{Identity: "solo"}) }()
	f.waitState("Deployment", "mine", StateError, "already managed by the hpa")
	if msg := f.event("mine", "ProvisioningFailed"); !strings.Contains(msg, "already managed by the hpa") {
		t.Fatalf("event %q", msg)
	}
	if n := testutil.ToFloat64(f.c.m.workloads.WithLabelValues(StateError)); n != 1 {
		t.Fatalf("workloads{state=error} %v, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Nor does it name itself the leader (it named itself, standing by,
	// until it saw another: "solo stands by; solo provisions").
	if p := f.c.Provisioning(); len(p.Workloads) != 0 || p.Leading || p.Leader != "" {
		t.Fatalf("after the lease was lost: %+v, want no workload, not leading and no leader known", p)
	}
	if n := testutil.ToFloat64(f.c.m.workloads.WithLabelValues(StateError)); n != 0 {
		t.Fatalf("workloads{state=error} %v after the lease was lost, want 0", n)
	}
}

// TestTheCacheKeepsOnlyWhatPulseReads: every workload of the cluster is
// watched, annotated or not, and the cache held each one's whole metadata:
// one tenant's thousands of Deployments with 256 KiB annotations
// (last-applied-configuration) were held in the process that answers KEDA,
// other tenants' configurations with them. The cache now keeps a
// workload's name, uid and versions and its pulse.io/ and
// scaledobject.kaito.sh/ annotations, a value cut past 257 bytes (refused
// as too long all the same); a ScaledObject without its managedFields.
func TestTheCacheKeepsOnlyWhatPulseReads(t *testing.T) {
	big := strings.Repeat("x", 200<<10)
	w := workload(deployments, "Deployment", "llama", map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": big, "pulse.io/pad-1": big,
		AnnotationAutoscale: " true ", AnnotationThreshold: strings.Repeat("9", 10<<10), KaitoMaxReplicas: "4",
		AnnotationMaxReplicas: "40" + strings.Repeat(" ", 300) + "0"})
	w.Labels = map[string]string{"app": "llama"}
	w.ResourceVersion, w.Generation = "7", 3
	w.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	o, err := trimWorkload(w)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*metav1.PartialObjectMetadata)
	if len(got.Annotations) != 4 || got.Annotations[AnnotationAutoscale] != "true" || got.Annotations[KaitoMaxReplicas] != "4" ||
		len(got.Annotations[AnnotationThreshold]) != maxAnnotationValue+len("…") {
		t.Errorf("annotations kept: %d, want those pulse reads alone (not a pulse.io/ key it does not read), values cut past %d bytes", len(got.Annotations), maxAnnotationValue)
	}
	// A value past the bound is refused from the cache as it is offline,
	// though what is left of it after the cut would trim to a good one.
	spaced, _ := trimWorkload(workload(deployments, "Deployment", "llama", map[string]string{AnnotationAutoscale: "true",
		AnnotationMaxReplicas: "40" + strings.Repeat(" ", 300) + "0"}))
	if _, err := Parse(llama, spaced.(*metav1.PartialObjectMetadata).Annotations, time.Minute); err == nil || !strings.Contains(err.Error(), AnnotationMaxReplicas) {
		t.Errorf("max-replicas of 40, 300 spaces and 0, from the cache: %v; want it refused as offline", err)
	}
	// Every annotation pulse reads is kept: a workload annotated with all of
	// them parses the same from the cache.
	all := map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "kvCacheUsage", AnnotationThreshold: "0.5",
		AnnotationActivationThreshold: "0.01", AnnotationWindow: "30s", AnnotationMinReplicas: "0", AnnotationMaxReplicas: "3",
		AnnotationScaleUpPodsPerMin: "4", AnnotationScaleDownInterval: "5m", AnnotationScaleDownDelay: "0", AnnotationCooldownPeriod: "600",
		kaitoPrefix + "metrics": "x"}
	for k := range annotationsRead {
		if _, ok := all[k]; !ok && !strings.HasPrefix(k, kaitoPrefix) && k != AnnotationSLOTTFT && k != AnnotationSLOITL && k != AnnotationSLOPercentile {
			t.Errorf("%s is read but not in this test's workload", k)
		}
	}
	cached, _ := trimWorkload(workload(deployments, "Deployment", "llama", all))
	want, err1 := Parse(llama, all, time.Minute)
	have, err2 := Parse(llama, cached.(*metav1.PartialObjectMetadata).Annotations, time.Minute)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(want, have) {
		t.Errorf("parsed from the cache: %+v %v, want %+v %v", have, err2, want, err1)
	}
	slo := map[string]string{AnnotationAutoscale: "true", AnnotationSLOTTFT: "1s", AnnotationSLOITL: "50ms", AnnotationSLOPercentile: "90"}
	cached, _ = trimWorkload(workload(deployments, "Deployment", "llama", slo))
	want, err1 = Parse(llama, slo, time.Minute)
	have, err2 = Parse(llama, cached.(*metav1.PartialObjectMetadata).Annotations, time.Minute)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(want, have) {
		t.Errorf("the planner's SLO from the cache: %+v %v, want %+v %v", have, err2, want, err1)
	}
	if got.Labels != nil || got.ManagedFields != nil || got.Name != "llama" || got.Namespace != "demo" || got.UID != w.UID ||
		got.ResourceVersion != "7" || got.Generation != 3 || got.APIVersion != "apps/v1" {
		t.Errorf("kept %+v", got.ObjectMeta)
	}
	if _, err := Parse(Workload{Kind: "Deployment", Namespace: "demo", Name: "llama"}, got.Annotations, time.Minute); err == nil ||
		!strings.Contains(err.Error(), AnnotationThreshold) || !strings.Contains(err.Error(), "longer than 256 bytes") {
		t.Errorf("a value cut in the cache: %v, want it refused as too long", err)
	}
	// A tombstone (its object was trimmed when cached) passes as it is.
	tomb := cache.DeletedFinalStateUnknown{Key: "demo/llama", Obj: got}
	if o, _ := trimWorkload(tomb); o != tomb {
		t.Errorf("a tombstone: %v", o)
	}
	// Through the informers: the workload's refusal names the annotation.
	f := newFixture(t, workload(deployments, "Deployment", "llama", map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": big, AnnotationAutoscale: "true", AnnotationMaxReplicas: strings.Repeat("9", 10<<10)}))
	f.run()
	f.waitState("Deployment", "llama", StateInvalid, AnnotationMaxReplicas+": a value longer than 256 bytes")
}

// TestTheCacheKeepsOfAScaledObjectWhatPulseReads: of pulse's ScaledObject
// the cache keeps what the conflicts read and a hash of its spec; of
// another's, what the conflicts read alone.
func TestTheCacheKeepsOfAScaledObjectWhatPulseReads(t *testing.T) {
	big := strings.Repeat("x", 200<<10)
	// pulse's (its label): what the conflicts read, and a hash of its spec.
	so := Desired(Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "demo", Name: "llama", UID: "w"},
		Settings{MinReplicas: 1, MaxReplicas: 3, Trigger: map[string]string{"deployment": "llama"}}, Target{ScalerAddress: "x:9090"})
	so.SetAnnotations(map[string]string{"keep": "me"})
	so.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "keda"}})
	o, _ := trimScaledObject(so)
	if u := o.(*unstructured.Unstructured); u.GetManagedFields() != nil || u.GetAnnotations() != nil || !OwnedBy(u, "w") || !Managed(u) ||
		u.Object[specHashKey] != specHash(so.Object["spec"]) {
		t.Errorf("pulse's ScaledObject in the cache: %v, want its identity, label, owner and spec's hash", u.Object)
	}
	// Another's (no pulse label, which pulse never writes): what the
	// conflicts read, alone.
	hand := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": "mine", "namespace": "demo", "uid": "h", "resourceVersion": "9", "generation": int64(2),
			"labels": map[string]any{"team": "a"}, "annotations": map[string]any{"kubectl.kubernetes.io/last-applied-configuration": big}},
		"spec": map[string]any{"scaleTargetRef": map[string]any{"kind": "Deployment", "name": "llama"}, "triggers": []any{map[string]any{"type": "cpu"}}}}}
	o, _ = trimScaledObject(hand)
	u := o.(*unstructured.Unstructured)
	if kind, name := targetOf(u); kind != "Deployment" || name != "llama" || u.GetAnnotations() != nil || u.GetLabels() != nil ||
		u.GetUID() != "h" || u.GetResourceVersion() != "9" || u.GetGeneration() != 2 || len(u.Object["spec"].(map[string]any)) != 1 ||
		u.Object[specHashKey] != nil {
		t.Errorf("another's ScaledObject in the cache: %v, want its metadata and scaleTargetRef alone", u.Object)
	}
}

// A workload being deleted (in the foreground, or waiting on a finalizer)
// gets no ScaledObject: the garbage collector deletes its ScaledObject, and
// one made again at each deletion would scale the workload on its way out.
func TestAWorkloadBeingDeletedGetsNone(t *testing.T) {
	going := workload(deployments, "Deployment", "going", map[string]string{AnnotationAutoscale: "true"})
	now := metav1.Now()
	going.DeletionTimestamp = &now
	f := newFixture(t, going, workload(deployments, "Deployment", "staying", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("staying's ScaledObject", func() error { _, err := f.scaledObject("staying"); return err })
	// One worker, in order: once staying's change is made, going's first
	// reconcile was done.
	f.annotate(deployments, "Deployment", "staying", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "5"})
	f.waitFor("staying's change", func() error { _, err := f.maxOf("staying", 5); return err })
	if so, err := f.scaledObject("going"); err == nil {
		t.Fatalf("a workload being deleted got a ScaledObject: %v", so.Object["spec"])
	}
	if st := f.state("Deployment", "going"); st.State != "" {
		t.Errorf("a workload being deleted is listed: %+v", st)
	}
}

// TestAWorkloadThatStartsBeingDeletedIsForgotten: a provisioned workload
// deleted with a finalizer (Kaito's InferenceSet and Workspace hold one
// while they clean up their nodes) or in the foreground gets a
// deletionTimestamp and keeps its annotations. The update filter
// (annotationsChanged) dropped that event, so the workload was not
// reconciled: /debug/provisioning and pulse_provisioner_workloads said it
// was provisioned until the resync, ten minutes on (found in a review).
func TestAWorkloadThatStartsBeingDeletedIsForgotten(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "going", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitState("Deployment", "going", StateProvisioned, "")
	w := workload(deployments, "Deployment", "going", map[string]string{AnnotationAutoscale: "true"})
	now := metav1.Now()
	w.DeletionTimestamp = &now
	w.Finalizers = []string{"workspace.finalizer.kaito.sh"}
	w.ResourceVersion = "2"
	if err := f.meta.Tracker().Update(deployments, w, "demo"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the workload being deleted forgotten", func() error {
		if s := f.state("Deployment", "going"); s.State != "" {
			return fmt.Errorf("still listed: %+v", s)
		}
		return nil
	})
}

// TestALeaderThatCannotListGivesTheLeaseBack: with ScaledObjects not listed
// (KEDA's CRD not installed, or the aggregator not allowed to list them)
// the leader waited for its cache for ever, renewing the Lease and
// provisioning nothing, with no word. Now the wait is bounded: the failure
// is logged and counted, the Lease given back, and the replica stands
// again a lease duration later, provisioning once the list works.
func TestALeaderThatCannotListGivesTheLeaseBack(t *testing.T) {
	f := newFixture(t, workload(infSets, "InferenceSet", "llama", map[string]string{AnnotationAutoscale: "true"}))
	f.c.o.SyncTimeout = 200 * time.Millisecond
	var missing atomic.Bool
	missing.Store(true)
	f.dyn.PrependReactor("list", "scaledobjects", func(k8stesting.Action) (bool, runtime.Object, error) {
		if missing.Load() {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "keda.sh", Resource: "scaledobjects"}, "")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- f.c.RunElected(ctx, Election{Enabled: true, Namespace: "pulse-system", Name: "pulse-aggregator-provisioner", Identity: "a",
			LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond, Leases: f.kube.CoordinationV1()})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunElected: %v", err)
		}
	}()
	f.waitFor("the failure counted and the Lease given back", func() error {
		if n := testutil.ToFloat64(f.c.m.errors.WithLabelValues("sync")); n < 1 {
			return fmt.Errorf("errors{reason=sync} %v", n)
		}
		lease, err := f.kube.CoordinationV1().Leases("pulse-system").Get(context.Background(), "pulse-aggregator-provisioner", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
			return fmt.Errorf("the Lease is held by %q", *h)
		}
		return nil
	})
	missing.Store(false)
	f.waitFor("provisioning once ScaledObjects are listed", func() error { _, err := f.scaledObject("llama"); return err })
}

// TestASpecTheServerPrunesIsProvisioned: a KEDA before 2.18 has no
// behavior tolerance in its CRD, and the API server prunes it from what
// pulse writes: the spec it keeps never equalled pulse's, and every
// reconcile (each resync, each change of the workload) updated it again,
// with an Event. What the server kept of what pulse wrote is as desired.
func TestASpecTheServerPrunesIsProvisioned(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	prune := func(a k8stesting.Action) (bool, runtime.Object, error) {
		var u *unstructured.Unstructured
		if a, ok := a.(interface{ GetObject() runtime.Object }); ok { // a create's or an update's
			u, _ = a.GetObject().(*unstructured.Unstructured)
		}
		for _, dir := range []string{"scaleUp", "scaleDown"} {
			if u != nil {
				unstructured.RemoveNestedField(u.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", dir, "tolerance")
			}
		}
		return false, nil, nil
	}
	f.dyn.PrependReactor("create", "scaledobjects", prune)
	f.dyn.PrependReactor("update", "scaledobjects", prune)
	f.run()
	f.waitState("Deployment", "mine", StateProvisioned, "")
	so, err := f.scaledObject("mine")
	if err != nil {
		t.Fatal(err)
	}
	if _, has, _ := unstructured.NestedFieldNoCopy(so.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleUp", "tolerance"); has {
		t.Fatal("the fixture's server kept the tolerance")
	}
	// A change of the workload that changes nothing of its ScaledObject
	// (a keda-kaito-scaler annotation pulse does not read) reconciles it.
	f.annotate(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true", kaitoPrefix + "metrics": "x"})
	f.waitState("Deployment", "mine", StateProvisioned, "not read")
	if n := testutil.ToFloat64(f.c.m.changes.WithLabelValues("update")); n != 0 {
		t.Fatalf("%v updates of a ScaledObject as the server keeps what pulse wrote", n)
	}
	// A new leader (another replica, or this one after a rollout) does not
	// know what the server kept of what the last wrote: its update is
	// kept as the object was, and is no change (it was an Event and a
	// change counted, once a ScaledObject a term).
	second := New(Options{Metadata: f.meta, Dynamic: f.dyn, Discovery: f.kube.Discovery(), Events: f.kube.CoreV1(),
		Target: f.c.o.Target, MaxWindow: time.Minute}, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.RunElected(ctx, Election{Identity: "next"}) }()
	f.waitFor("provisioned under the new leader", func() error {
		for _, w := range second.Provisioning().Workloads {
			if w.State == StateProvisioned {
				return nil
			}
		}
		return fmt.Errorf("%+v", second.Provisioning())
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(second.m.changes.WithLabelValues("update")); n != 0 {
		t.Fatalf("the new leader counted %v updates of a ScaledObject the server keeps as provisioned", n)
	}
	list, err := f.kube.CoreV1().Events("demo").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason == "ScaledObjectUpdated" {
			t.Fatalf("event %s: %s, for an update the server kept as the object was", e.Reason, e.Message)
		}
	}
}

// TestAnotherWriterIsNotFoughtForEver: a second writer of a provisioned
// ScaledObject (a provisioner of another release, a GitOps tool's
// self-heal) undoing pulse's spec made pulse write it back at once, every
// time, for ever: an Update, an Event and an etcd write a round, at the API
// server's pace. After rewriteLimit updates within rewriteWindow pulse
// reports the conflict and backs off.
func TestAnotherWriterIsNotFoughtForEver(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	stop := f.otherWriter(func() { // its own maxReplicaCount, whenever it differs
		so, err := f.scaledObject("mine")
		if err != nil {
			return
		}
		if v, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); v != 99 {
			_ = unstructured.SetNestedField(so.Object, int64(99), "spec", "maxReplicaCount")
			_, _ = f.dyn.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), so, metav1.UpdateOptions{})
		}
	})
	f.waitState("Deployment", "mine", StateConflict, "something else keeps changing it")
	updates := testutil.ToFloat64(f.c.m.changes.WithLabelValues("update"))
	time.Sleep(500 * time.Millisecond) // the fight goes on: pulse writes no more
	stop()
	if n := testutil.ToFloat64(f.c.m.changes.WithLabelValues("update")); n != updates || n > rewriteLimit {
		t.Fatalf("pulse's updates: %v at the conflict, %v after; want at most %d", updates, n, rewriteLimit)
	}
}

// A workload turned off whose exported copy a GitOps tool keeps making
// again (pulse's label, no owner, so the workload would adopt it): pulse
// deletes it again at most rewriteLimit times a minute, not at the API
// server's pace, and says why.
func TestADeletedCopyMadeAgainIsNotFoughtForEver(t *testing.T) {
	copyOf := Desired(Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "demo", Name: "mine", UID: "Deployment-mine"},
		Settings{MinReplicas: 1, MaxReplicas: 3, Trigger: map[string]string{"deployment": "mine"}}, Target{ScalerAddress: "x:9090"})
	copyOf.SetOwnerReferences(nil)
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "false"}))
	f.run()
	stop := f.otherWriter(func() { // the self-heal: the copy made again whenever it is gone
		if _, err := f.scaledObject("mine"); err != nil {
			_, _ = f.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), copyOf.DeepCopy(), metav1.CreateOptions{})
		}
	})
	f.waitState("Deployment", "mine", StateConflict, "something else keeps making it again")
	stop()
	// The first delete, then rewriteLimit deletes of it again.
	if n := testutil.ToFloat64(f.c.m.changes.WithLabelValues("delete")); n > rewriteLimit+1 {
		t.Fatalf("pulse's deletes: %v, want at most %d within the minute", n, rewriteLimit+1)
	}
}

// TestTheCapIsTheControllers: with --provision-max-replicas, a workload
// asking past it is refused (invalid, naming the annotation), its
// ScaledObject not made; one that asks for nothing, under a cap below the
// default 10, is provisioned at the cap (it was refused, naming an
// annotation it did not carry).
func TestTheCapIsTheControllers(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "big", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "500"}),
		workload(deployments, "Deployment", "plain", map[string]string{AnnotationAutoscale: "true"}))
	f.c.o.MaxReplicas = 4
	f.run()
	f.waitState("Deployment", "big", StateInvalid, AnnotationMaxReplicas+": 500 is past the cluster's cap of 4")
	if _, err := f.scaledObject("big"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ScaledObject past the cap: %v", err)
	}
	f.waitState("Deployment", "plain", StateProvisioned, "1-4 replicas")
	if _, err := f.maxOf("plain", 4); err != nil {
		t.Fatal(err)
	}
}

// TestAFailedRunStopsItsInformer: a run that cannot list ScaledObjects
// (KEDA's CRD not installed, the aggregator not allowed) returns with its
// informers stopped. They ran on the caller's context, and
// --leader-elect=false runs again every minute on that context: a
// reflector more each minute, each listing for ever.
func TestAFailedRunStopsItsInformer(t *testing.T) {
	f := newFixture(t)
	f.c.o.SyncTimeout = 100 * time.Millisecond
	var lists atomic.Int64
	f.dyn.PrependReactor("list", "scaledobjects", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "keda.sh", Resource: "scaledobjects"}, "")
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := goleak.IgnoreCurrent()
	for range 3 {
		if err := f.c.Run(ctx); err == nil {
			t.Fatal("Run succeeded without a list")
		}
	}
	if lists.Load() == 0 {
		t.Fatal("no list of ScaledObjects was tried")
	}
	// Every goroutine a Run started (its informers' reflectors, which
	// list again within about a second and a half) has ended.
	if err := goleak.Find(before); err != nil {
		t.Fatalf("after every Run returned, their informers still run: %v", err)
	}
}

// TestARetargetedScaledObjectUnblocks: a hand-written ScaledObject that
// blocked a workload (KEDA allows one per workload) and is changed to
// scale another unblocks it at once: only the new copy's workloads were
// queued, and the blocked one waited for the next resync (10 minutes).
func TestARetargetedScaledObjectUnblocks(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "other", map[string]string{AnnotationAutoscale: "true"}))
	hand := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": "by-hand", "namespace": "demo", "generation": int64(1)},
		"spec":     map[string]any{"scaleTargetRef": map[string]any{"name": "other"}}}}
	if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Create(context.Background(), hand, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.run()
	f.waitState("Deployment", "other", StateConflict, "by-hand already scales")
	hand.Object["spec"] = map[string]any{"scaleTargetRef": map[string]any{"name": "third"}}
	hand.SetGeneration(2)
	if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), hand, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("other's ScaledObject once by-hand scales third", func() error { _, err := f.scaledObject("other"); return err })
}

// TestADeleterIsNotFoughtForEver: a writer that keeps deleting pulse's
// ScaledObject (a clean-up policy, a release that does not read Kaito's
// alias) is not fought at the API server's pace: a create of the same
// ScaledObject again counts as a write back, as an update and a delete
// do (creates were not counted: 344 in 2 s, an Event each).
func TestADeleterIsNotFoughtForEver(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	stop := f.otherWriter(func() {
		if _, err := f.scaledObject("mine"); err == nil {
			_ = f.dyn.Resource(ScaledObjects).Namespace("demo").Delete(context.Background(), "mine", metav1.DeleteOptions{})
		}
	})
	f.waitState("Deployment", "mine", StateConflict, "something else keeps deleting it")
	stop()
	// The first create, then rewriteLimit creates of it again.
	if n := testutil.ToFloat64(f.c.m.changes.WithLabelValues("create")); n > rewriteLimit+1 {
		t.Fatalf("pulse's creates against a deleter: %v, want at most %d within the minute", n, rewriteLimit+1)
	}
}

// TestTheWorkloadsOwnChangesAreNoFight: changes the workload's annotations
// ask for are written however many come within a minute; only a write of
// what pulse wrote before (something undid it) counts toward the limit.
// Every update counted: the sixth change within a minute was reported as
// "something else keeps changing it" and held back.
func TestTheWorkloadsOwnChangesAreNoFight(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	for n := int64(3); n <= 3+2*rewriteLimit; n++ {
		f.annotate(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: fmt.Sprint(n)})
		f.waitFor(fmt.Sprintf("max-replicas %d", n), func() error {
			if s := f.state("Deployment", "mine"); s.State == StateConflict {
				t.Fatalf("the workload's own change to %d: %s", n, s.Message)
			}
			_, err := f.maxOf("mine", n)
			return err
		})
	}
}

// TestALongNameIsRefusedOnce: a workload named past what KEDA takes as a
// ScaledObject's name is invalid, once, saying why; its neighbours are
// provisioned. It was provisioned, and KEDA's webhook refused the create
// for ever (state error), or, without the webhook, never reconciled it.
func TestALongNameIsRefusedOnce(t *testing.T) {
	long := "llama-3-1-8b-instruct-" + strings.Repeat("a", 42) // 64
	f := newFixture(t, workload(deployments, "Deployment", long, map[string]string{AnnotationAutoscale: "true"}),
		workload(deployments, "Deployment", "short", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("short's ScaledObject", func() error { _, err := f.scaledObject("short"); return err })
	f.waitState("Deployment", long, StateInvalid, "KEDA takes ScaledObject names of at most 63")
	if _, err := f.scaledObject(long); !apierrors.IsNotFound(err) {
		t.Fatalf("a ScaledObject KEDA cannot take: %v", err)
	}
}

// TestATenantsScaledObjectsAreHeldSmall: whatever a tenant writes on its
// own ScaledObjects — pulse's label (anyone's to set) with 200 KiB of
// annotations and 600 KiB of trigger metadata, or 10,000 labels and a
// 400 KiB scaleTargetRef name — the cache holds a few hundred bytes of
// each: they were held whole (800 KiB and 1.3 MiB each) in the process
// that answers KEDA.
func TestATenantsScaledObjectsAreHeldSmall(t *testing.T) {
	big := strings.Repeat("x", 200<<10)
	labels := map[string]any{LabelManagedBy: ManagedBy}
	for i := range 10000 {
		labels[fmt.Sprintf("team.example.com/k%05d", i)] = strings.Repeat("v", 63)
	}
	owners := []any{map[string]any{"apiVersion": big, "kind": big, "name": big, "uid": big, "controller": true},
		map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": big, "uid": "c"}}
	fake := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": "fake", "namespace": "tenant-a", "labels": map[string]any{LabelManagedBy: ManagedBy},
			"annotations": map[string]any{"pad": big}, "ownerReferences": owners},
		"spec": map[string]any{"scaleTargetRef": map[string]any{"name": "nothing"},
			"triggers": []any{map[string]any{"type": "cpu", "metadata": map[string]any{"pad": big + big + big}}}}}}
	hand := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": "hand", "namespace": "tenant-a", "labels": labels},
		"spec":     map[string]any{"scaleTargetRef": map[string]any{"kind": big, "name": big + big}}}}
	for name, so := range map[string]*unstructured.Unstructured{"labelled pulse's": fake, "hand-written": hand} {
		o, _ := trimScaledObject(so)
		b, _ := json.Marshal(o)
		if len(b) > 2<<10 {
			t.Errorf("%s ScaledObject held in the cache: %d bytes", name, len(b))
		}
		if kind, target := targetOf(o.(*unstructured.Unstructured)); len(kind) > 253+3 || len(target) > 253+3 || target == "" {
			t.Errorf("%s ScaledObject's target in the cache: %d and %d bytes", name, len(kind), len(target))
		}
	}
}

// TestAnUpdateKeepsWhatOthersAdded: the cache holds a projection of
// pulse's ScaledObject, so an update is of the object the API server has:
// labels, annotations, finalizers and owners others added are kept.
func TestAnUpdateKeepsWhatOthersAdded(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	so, _ := f.scaledObject("mine")
	so.SetLabels(map[string]string{LabelManagedBy: ManagedBy, "team": "a"})
	so.SetAnnotations(map[string]string{"note": "kept"})
	so.SetFinalizers([]string{"finalizer.keda.sh"})
	so.SetOwnerReferences(append(so.GetOwnerReferences(), metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "c", UID: "c"}))
	if _, err := f.dyn.Resource(ScaledObjects).Namespace("demo").Update(context.Background(), so, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.annotate(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "7"})
	f.waitFor("max-replicas 7", func() error { _, err := f.maxOf("mine", 7); return err })
	so, _ = f.scaledObject("mine")
	if so.GetLabels()["team"] != "a" || so.GetAnnotations()["note"] != "kept" || len(so.GetFinalizers()) != 1 || len(so.GetOwnerReferences()) != 2 {
		t.Fatalf("what others added, after pulse's update: %v", so.Object["metadata"])
	}
}

// handedOver makes the API server's copy of ScaledObject name a tenant's
// (pulse's label taken off), the cache not told.
func (f *fixture) handedOver(name string) {
	f.dyn.PrependReactor("get", "scaledobjects", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != name {
			return false, nil, nil
		}
		so, err := f.dyn.Tracker().Get(ScaledObjects, "demo", name)
		if err != nil {
			return true, nil, err
		}
		u := so.(*unstructured.Unstructured).DeepCopy()
		u.SetLabels(map[string]string{"team": "a"})
		return true, u, nil
	})
}

// TestATakenOverScaledObjectIsNotTakenBack: a tenant takes pulse's
// ScaledObject over by taking pulse's label off (as a conflict's message
// says to), and the workload's annotations change before the cache hears
// of it. The update judged ownership on the cached copy alone: it read the
// object as the API server has it, labelled it pulse's again and
// overwrote the tenant's spec. The live object is judged again: a conflict,
// and nothing written.
func TestATakenOverScaledObjectIsNotTakenBack(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	f.handedOver("mine")
	var updates atomic.Int32
	f.dyn.PrependReactor("update", "scaledobjects", func(k8stesting.Action) (bool, runtime.Object, error) {
		updates.Add(1)
		return false, nil, nil
	})
	f.annotate(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "7"})
	f.waitState("Deployment", "mine", StateConflict, "is not pulse's")
	if n := updates.Load(); n != 0 {
		t.Fatalf("%d updates of a ScaledObject the API server has as another's", n)
	}
	if _, err := f.maxOf("mine", 10); err != nil {
		t.Fatal(err)
	}
}

// turnOff counts the ScaledObject deletes asked from now, turns workload
// name off and waits for it to be forgotten; the deletes asked meanwhile
// are the count's.
func (f *fixture) turnOff(name string) *atomic.Int32 {
	f.t.Helper()
	var deletes atomic.Int32
	f.dyn.PrependReactor("delete", "scaledobjects", func(k8stesting.Action) (bool, runtime.Object, error) {
		deletes.Add(1)
		return false, nil, nil
	})
	f.annotate(deployments, "Deployment", name, map[string]string{AnnotationAutoscale: "false"})
	f.waitFor("the workload turned off", func() error {
		if s := f.state("Deployment", name); s.State != "" {
			return fmt.Errorf("state %+v", s)
		}
		return nil
	})
	return &deletes
}

// TestATakenOverScaledObjectIsNotDeleted: as above, and the workload
// turned off (a GitOps tool applying both) before the cache hears of the
// hand-over. The delete judged ownership on the cached copy alone and
// deleted the tenant's ScaledObject. The live object is judged again,
// and left alone.
func TestATakenOverScaledObjectIsNotDeleted(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitFor("the ScaledObject", func() error { _, err := f.scaledObject("mine"); return err })
	f.handedOver("mine")
	deletes := f.turnOff("mine")
	if n := deletes.Load(); n != 0 {
		t.Fatalf("%d deletes of a ScaledObject the API server has as another's", n)
	}
	if _, err := f.scaledObject("mine"); err != nil {
		t.Fatalf("the tenant's ScaledObject: %v", err)
	}
}

// TestAScaledObjectBeingDeletedIsGone: KEDA's finalizer holds a deleted
// ScaledObject while it restores its target's scale. The cache's copy
// had no deletionTimestamp: pulse's own, being deleted, read as
// provisioned (for as long as KEDA's operator was down), and a workload
// turned off deleted it again (a write back: toggling the annotation
// read as another writer's fight). It is now gone for both.
func TestAScaledObjectBeingDeletedIsGone(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitState("Deployment", "mine", StateProvisioned, "")
	so, err := f.scaledObject("mine")
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	so.SetDeletionTimestamp(&now)
	so.SetFinalizers([]string{"finalizer.keda.sh"})
	so.SetGeneration(so.GetGeneration() + 1)
	if err := f.dyn.Tracker().Update(ScaledObjects, so, "demo"); err != nil {
		t.Fatal(err)
	}
	f.waitState("Deployment", "mine", StateError, "is being deleted")
	deletes := f.turnOff("mine")
	if n := deletes.Load(); n != 0 {
		t.Fatalf("%d deletes of a ScaledObject being deleted", n)
	}
}

// TestATypoReachesTheWorkloadsState: the cache kept only the annotations
// pulse reads, so a misspelt one (pulse.io/max-replica) never reached
// Parse and the workload was provisioned at the default as if it were
// not there. The cache keeps a likely typo (and no other pulse.io/ key),
// and the workload's state names it.
func TestATypoReachesTheWorkloadsState(t *testing.T) {
	typo := AnnotationMaxReplicas[:len(AnnotationMaxReplicas)-1]
	o, err := trimWorkload(workload(deployments, "Deployment", "llama", map[string]string{AnnotationAutoscale: "true", typo: "40", "pulse.io/team": "a"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := o.(*metav1.PartialObjectMetadata).Annotations; len(got) != 2 || got[typo] != "40" {
		t.Fatalf("cached %v: want pulse.io/autoscale and the typo alone", got)
	}
	f := newFixture(t, workload(deployments, "Deployment", "llama", map[string]string{AnnotationAutoscale: "true", typo: "40"}))
	f.run()
	f.waitState("Deployment", "llama", StateInvalid, typo+": not an annotation pulse reads (did you mean "+AnnotationMaxReplicas+"?)")
	if _, err := f.scaledObject("llama"); err == nil {
		t.Fatal("a ScaledObject was made at the default")
	}
}

// TestAKindThatCannotBeListedIsCounted: a workload kind the cluster serves
// and the aggregator may not list (its role lacks it) gave its annotated
// workloads no state, Event or error: client-go's log alone said so. Each
// failure is counted (errors{reason="watch"}), and the kinds that can be
// listed are provisioned as ever.
func TestAKindThatCannotBeListedIsCounted(t *testing.T) {
	f := newFixture(t,
		workload(infSets, "InferenceSet", "llama", map[string]string{AnnotationAutoscale: "true"}),
		workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.meta.PrependReactor("list", "inferencesets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: infSets.Group, Resource: "inferencesets"}, "", errors.New("not in the role"))
	})
	f.run()
	f.waitFor("the failure counted", func() error {
		if n := testutil.ToFloat64(f.c.m.errors.WithLabelValues("watch")); n < 1 {
			return fmt.Errorf("errors{reason=watch} %v", n)
		}
		return nil
	})
	f.waitFor("the Deployment provisioned", func() error { _, err := f.scaledObject("mine"); return err })
}

// TestTyposAreLookedForBoundedAndAlike: the cache looked at every unread
// pulse.io/ annotation of every workload for a typo at each of its events
// (thousands in a Deployment's 256 KiB). The first maxTypoChecks in name
// order are looked at, offline and in the cache alike: a typo among them
// is named from the cache as offline, one past them by neither; and a
// workload not enabled keeps its typo of pulse.io/autoscale behind an
// earlier typo of another annotation.
func TestTyposAreLookedForBoundedAndAlike(t *testing.T) {
	filler := func(n int) map[string]string {
		a := map[string]string{AnnotationAutoscale: "true"}
		for i := range n {
			a[fmt.Sprintf("pulse.io/aaa-%04d-unrelated", i)] = "x"
		}
		return a
	}
	fromCache := func(a map[string]string) error {
		o, _ := trimWorkload(workload(deployments, "Deployment", "llama", a))
		_, err := Parse(llama, o.(*metav1.PartialObjectMetadata).Annotations, time.Minute)
		return err
	}
	typo := AnnotationMaxReplicas[:len(AnnotationMaxReplicas)-1]
	within := filler(maxTypoChecks - 1)
	within[typo] = "40"
	past := filler(maxTypoChecks)
	past[typo] = "40"
	for name, c := range map[string]struct {
		a    map[string]string
		want string
	}{"within the checks": {within, "did you mean " + AnnotationMaxReplicas}, "past them": {past, ""}} {
		for from, err := range map[string]error{"offline": func() error { _, err := Parse(llama, c.a, time.Minute); return err }(), "the cache": fromCache(c.a)} {
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("%s, from %s: %v; want %q", name, from, err, c.want)
			}
		}
	}
	off := map[string]string{"pulse.io/activation-treshold": "1", "pulse.io/auto-scale": "true"}
	if err := fromCache(off); err == nil || !strings.Contains(err.Error(), "did you mean "+AnnotationAutoscale) {
		t.Errorf("a workload not enabled, from the cache: %v; want its typo of pulse.io/autoscale named", err)
	}
}

// retiring is the fixture's discovery, with kaito.sh/v1alpha1 retired for
// v1beta1 once retired is set (a Kaito upgrade).
type retiring struct {
	discovery.DiscoveryInterface
	retired atomic.Bool
}

func (r *retiring) ServerGroups() (*metav1.APIGroupList, error) {
	g, err := r.DiscoveryInterface.ServerGroups()
	if err != nil || !r.retired.Load() {
		return g, err
	}
	beta := metav1.GroupVersionForDiscovery{GroupVersion: "kaito.sh/v1beta1", Version: "v1beta1"}
	for i := range g.Groups {
		if g.Groups[i].Name == "kaito.sh" {
			g.Groups[i].PreferredVersion, g.Groups[i].Versions = beta, []metav1.GroupVersionForDiscovery{beta}
		}
	}
	return g, nil
}

func (r *retiring) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	if !r.retired.Load() {
		return r.DiscoveryInterface.ServerResourcesForGroupVersion(gv)
	}
	switch gv {
	case "kaito.sh/v1alpha1":
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "kaito.sh"}, gv)
	case "kaito.sh/v1beta1":
		l, err := r.DiscoveryInterface.ServerResourcesForGroupVersion("kaito.sh/v1alpha1")
		if err != nil {
			return nil, err
		}
		l = l.DeepCopy()
		l.GroupVersion = gv
		return l, nil
	}
	return r.DiscoveryInterface.ServerResourcesForGroupVersion(gv)
}

// TestAVersionRetiredIsWatchedAtTheOneServed: a kind watched at a version
// the cluster stops serving (a Kaito upgrade retiring v1alpha1) is watched
// at the one served from the next rediscovery: its informer had listed
// nothing for the rest of the leader's term (each list a 404, a warning),
// and no annotated workload of the kind was provisioned, changed or let go.
func TestAVersionRetiredIsWatchedAtTheOneServed(t *testing.T) {
	annotated := map[string]string{KaitoAutoProvision: "true"}
	f := newFixture(t, workload(infSets, "InferenceSet", "first", annotated))
	disc := &retiring{DiscoveryInterface: f.kube.Discovery()}
	f.c.o.Discovery, f.c.o.Rediscover = disc, 50*time.Millisecond
	f.meta.PrependReactor("list", "inferencesets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if disc.retired.Load() && a.GetResource().Version == "v1alpha1" {
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), "")
		}
		return false, nil, nil
	})
	f.meta.PrependWatchReactor("inferencesets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if disc.retired.Load() && a.GetResource().Version == "v1alpha1" {
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), "")
		}
		return false, nil, nil
	})
	f.run()
	f.waitFor("first's ScaledObject", func() error { _, err := f.scaledObject("first"); return err })

	beta := schema.GroupVersionResource{Group: "kaito.sh", Version: "v1beta1", Resource: "inferencesets"}
	disc.retired.Store(true)
	if err := f.meta.Tracker().Create(beta, workload(beta, "InferenceSet", "second", annotated), "demo"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("second's ScaledObject, its owner at v1beta1", func() error {
		so, err := f.scaledObject("second")
		if err != nil {
			return err
		}
		if refs := so.GetOwnerReferences(); len(refs) != 1 || refs[0].APIVersion != "kaito.sh/v1beta1" {
			return fmt.Errorf("owner references %v", refs)
		}
		return nil
	})
}

// TestAScaledObjectWrittenPastTheCapIsHeldAtIt: a workload asking past
// --provision-max-replicas is refused, and its ScaledObject was left as it
// was: one written before the cap was set (or lowered, or by a leader
// without it) kept 500 replicas, and a floor of 10, for as long as the
// tenant left the annotations alone. It is held at the cap, the workload
// still invalid.
func TestAScaledObjectWrittenPastTheCapIsHeldAtIt(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "big",
		map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "10", AnnotationMaxReplicas: "500"}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.c.RunElected(ctx, Election{Identity: "before the cap"}) }()
	f.waitFor("provisioned at 500", func() error { _, err := f.maxOf("big", 500); return err })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	o := f.c.o
	o.MaxReplicas = 4
	f.c = New(o, nil)
	f.run()
	f.waitState("Deployment", "big", StateInvalid, "held at the cap (4)")
	so, err := f.maxOf("big", 4)
	if err != nil {
		t.Fatal(err)
	}
	if floor, _, _ := unstructured.NestedInt64(so.Object, "spec", "minReplicaCount"); floor != 4 {
		t.Fatalf("minReplicaCount %d under a cap of 4", floor)
	}
}

// TestAHeldAtCapUpdateKeptAsItWasIsNoFlicker: a new term's update of a
// ScaledObject held at the cap, kept by the server as it was (a KEDA
// before 2.18 prunes the tolerance written), reported the workload
// provisioned, then invalid again: a flicker of its state (the workloads
// gauge's counts) and a "ScaledObject provisioned" log line for a workload
// that is not, each term (found in a review).
func TestAHeldAtCapUpdateKeptAsItWasIsNoFlicker(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "big",
		map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "500"}))
	var gets atomic.Int32
	prune := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "get" {
			gets.Add(1)
			return false, nil, nil
		}
		if u, ok := a.(interface{ GetObject() runtime.Object }).GetObject().(*unstructured.Unstructured); ok {
			for _, dir := range []string{"scaleUp", "scaleDown"} {
				unstructured.RemoveNestedField(u.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", dir, "tolerance")
			}
		}
		return false, nil, nil
	}
	for _, verb := range []string{"create", "update", "get"} {
		f.dyn.PrependReactor(verb, "scaledobjects", prune)
	}
	term := f.term
	invalid := func() int { return f.events("InvalidAnnotation") }
	stop := term("before the cap")
	f.waitFor("provisioned at 500", func() error { _, err := f.maxOf("big", 500); return err })
	stop()
	f.c.o.MaxReplicas = 4
	logs := new(syncbuf.Buffer)
	f.c.o.Log = slog.New(slog.NewTextHandler(logs, nil))
	stop = term("first")
	f.waitState("Deployment", "big", StateInvalid, "held at the cap (4)")
	f.waitFor("the first term's event", func() error {
		if invalid() == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	stop()
	before, read := invalid(), gets.Load()
	defer term("second")()
	// The second term reads the live object to update it (the spec it
	// writes has the tolerance the server pruned), then the message
	// changes: an event of the term's (a term learns each state anew), and
	// the change's.
	f.waitFor("the second term's update", func() error {
		if gets.Load() == read {
			return errors.New("no read yet")
		}
		return nil
	})
	f.annotate(deployments, "Deployment", "big", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "600"})
	f.waitState("Deployment", "big", StateInvalid, "600")
	f.waitFor("the term's and the change's events", func() error {
		if n := invalid(); n < before+2 {
			return fmt.Errorf("%d InvalidAnnotation events, from %d", n, before)
		}
		return nil
	})
	if n := invalid(); n != before+2 {
		t.Fatalf("%d InvalidAnnotation events over a new term and a change of the message, from %d: want the term's and the change's", n, before)
	}
	if strings.Contains(logs.String(), "ScaledObject provisioned") {
		t.Fatalf("a workload held at the cap logged provisioned:\n%s", logs.String())
	}
}

// term runs a leader's term of f's controller until stop.
func (f *fixture) term(name string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.c.RunElected(ctx, Election{Identity: name}) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Fatal(err)
		}
	}
}

// events counts the Events of reason in demo (each as often as it was
// recorded).
func (f *fixture) events(reason string) int {
	list, err := f.kube.CoreV1().Events("demo").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Reason == reason {
			n += max(1, int(e.Count))
		}
	}
	return n
}

// TestAScaledObjectDeletedUnderAnUpdateIsNoError: a ScaledObject deleted
// after the cache last saw it, as pulse came to update it, was reported an
// error of the API server's (state error, a ProvisioningFailed warning
// Event) until its delete event brought the workload back: it is made
// again, and no error said.
func TestAScaledObjectDeletedUnderAnUpdateIsNoError(t *testing.T) {
	f := newFixture(t, workload(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true"}))
	f.run()
	f.waitState("Deployment", "mine", StateProvisioned, "1-10 replicas")
	var once atomic.Bool
	f.dyn.PrependReactor("get", "scaledobjects", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !once.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		name := a.(k8stesting.GetAction).GetName()
		if err := f.dyn.Tracker().Delete(ScaledObjects, "demo", name); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(ScaledObjects.GroupResource(), name)
	})
	f.annotate(deployments, "Deployment", "mine", map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "3"})
	f.waitState("Deployment", "mine", StateProvisioned, "1-3 replicas")
	if _, err := f.maxOf("mine", 3); err != nil {
		t.Fatal(err)
	}
	list, err := f.kube.CoreV1().Events("demo").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason == "ProvisioningFailed" {
			t.Fatalf("a warning for a ScaledObject deleted under an update: %s", e.Message)
		}
	}
}

// TestOneNamespacesProvisioning: a namespace's debug page copied and
// sorted every namespace's workloads under the lock the reconciles take,
// then kept its own; ProvisioningOf takes that namespace's alone, sorted,
// and "" every namespace's.
func TestOneNamespacesProvisioning(t *testing.T) {
	c := &Controller{identity: "me", status: map[key]Status{}}
	for _, k := range []key{{"Workspace", "team-b", "z"}, {"Workspace", "team-a", "b"}, {"Deployment", "team-a", "a"}, {"Workspace", "team-c", "x"}} {
		c.status[k] = Status{Kind: k.Kind, Namespace: k.Namespace, Name: k.Name}
	}
	var names []string
	for _, s := range c.ProvisioningOf("team-a").Workloads {
		names = append(names, s.Namespace+"/"+s.Name)
	}
	if got := strings.Join(names, " "); got != "team-a/a team-a/b" {
		t.Fatalf("team-a's: %s; want its two, sorted", got)
	}
	if p := c.ProvisioningOf(""); len(p.Workloads) != 4 || p.Identity != "me" || p.Workloads[0].Namespace != "team-a" || p.Workloads[3].Namespace != "team-c" {
		t.Fatalf("every namespace's: %+v", p)
	}
}

// TestAMisspeltMetricIsNotProvisioned: a pulse.io/metric misspelt
// (vllm:num_request_waiting) was provisioned as a gauge to forward, and
// every answer of its trigger then refused. With the scaler's word on
// what the agents forward, a name no agent forwards within a typo of one
// pulse knows is invalid, naming it, and no ScaledObject is made; a
// forwarded gauge is provisioned.
func TestAMisspeltMetricIsNotProvisioned(t *testing.T) {
	st := store.New(store.Options{Retention: time.Minute})
	srv := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	st.Upsert(store.Source{Node: "node-1", ExtraNames: []string{"vllm:cpu_cache_usage_perc"}},
		[]store.PodInfo{{UID: "u1", Namespace: "ns", Name: "x-0", Ready: true}}, true)
	f := newFixture(t,
		workload(deployments, "Deployment", "typo", map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "vllm:num_request_waiting", AnnotationThreshold: "5"}),
		workload(deployments, "Deployment", "gauge", map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "vllm:cpu_cache_usage_perc", AnnotationThreshold: "0.8"}))
	f.c.o.MetricMeant = srv.MetricMeant
	f.run()
	f.waitState("Deployment", "typo", StateInvalid, AnnotationMetric+`: no agent forwards "vllm:num_request_waiting", and it is within a typo of vllm:num_requests_waiting`)
	if _, err := f.scaledObject("typo"); !apierrors.IsNotFound(err) {
		t.Fatalf("a ScaledObject for a misspelt metric: %v", err)
	}
	f.waitState("Deployment", "gauge", StateProvisioned, "")
}

// TestAMisspeltMetricPastTheCapLeavesTheScaledObject: a tenant raising
// max-replicas past the operator's cap and misspelling the metric in one
// edit had the misspelt metric written to the ScaledObject held at the cap
// (the name and metric were checked only within it), in place of the
// trigger that worked. The workload is invalid, naming the metric, and its
// ScaledObject is left as it was.
func TestAMisspeltMetricPastTheCapLeavesTheScaledObject(t *testing.T) {
	st := store.New(store.Options{Retention: time.Minute})
	srv := scaler.New(st, scaler.Options{MaxWindow: time.Minute})
	st.Upsert(store.Source{Node: "node-1"}, []store.PodInfo{{UID: "u1", Namespace: "ns", Name: "x-0", Ready: true}}, true)
	f := newFixture(t, workload(deployments, "Deployment", "big",
		map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "running", AnnotationMaxReplicas: "8"}))
	f.c.o.MaxReplicas = 8
	f.c.o.MetricMeant = srv.MetricMeant
	f.run()
	f.waitState("Deployment", "big", StateProvisioned, "")
	f.annotate(deployments, "Deployment", "big", map[string]string{AnnotationAutoscale: "true",
		AnnotationMetric: "vllm:num_request_waiting", AnnotationThreshold: "5", AnnotationMaxReplicas: "50"})
	f.waitState("Deployment", "big", StateInvalid, AnnotationMetric+`: no agent forwards "vllm:num_request_waiting"`)
	so, err := f.scaledObject("big")
	if err != nil {
		t.Fatal(err)
	}
	if md := triggerOf(t, so)["metadata"].(map[string]any); md["metric"] != "running" || md["metricName"] != nil {
		t.Fatalf("trigger %v: want the one that worked (metric running) left as it was", md)
	}
	if most, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); most != 8 {
		t.Fatalf("maxReplicaCount %d, want 8 as it was", most)
	}
}

// TestAGaugeNotHeardYetDuringTheWarmUpIsProvisioned: during the
// aggregator's warm-up the agents heard may be only those that do not
// forward a gauge, and the misspelt-metric check did not wait for it: a
// replica started (or one without leader election restarted) marked a
// workload whose gauge is a typo from a name pulse knows invalid, with a
// wrong "did you mean", until its resync, where the scaler took the
// trigger. It is provisioned; once warm, the scaler's answers say if no
// agent forwards it.
func TestAGaugeNotHeardYetDuringTheWarmUpIsProvisioned(t *testing.T) {
	st := store.New(store.Options{Retention: time.Minute})
	srv := scaler.New(st, scaler.Options{MaxWindow: time.Minute, Gate: func() error { return errors.New("aggregator warming up") }})
	st.Upsert(store.Source{Node: "node-1"}, []store.PodInfo{{UID: "u1", Namespace: "ns", Name: "x-0", Ready: true}}, true) // forwards no gauge
	f := newFixture(t, workload(deployments, "Deployment", "gauge", map[string]string{
		AnnotationAutoscale: "true", AnnotationMetric: "vllm:cpu_cache_usage_perc", AnnotationThreshold: "0.8"}))
	f.c.o.MetricMeant = srv.MetricMeant
	f.run()
	f.waitState("Deployment", "gauge", StateProvisioned, "")
}

// TestALateReportNamesNoReplicaThatStopped: client-go reports a new leader
// from a goroutine of its own, which may run after the term it reports
// from. A replica that stopped leading was named the leader again, on
// /debug/provisioning, by its own late report.
func TestALateReportNamesNoReplicaThatStopped(t *testing.T) {
	f := newFixture(t)
	f.c.setLeading(true, "me")
	f.c.setLeading(false, "me")
	f.c.setHolder("me", "me") // this replica's report, late
	if p := f.c.Provisioning(); p.Leader != "" || p.Leading {
		t.Fatalf("after a late report of itself: %+v, want no leader known", p)
	}
	f.c.setHolder("other", "me")
	if p := f.c.Provisioning(); p.Leader != "other" {
		t.Fatalf("after another's report: leader %q, want other", p.Leader)
	}
	f.c.setLeading(true, "me")
	f.c.setHolder("me", "me")
	if p := f.c.Provisioning(); p.Leader != "me" || !p.Leading {
		t.Fatalf("leading: %+v, want me", p)
	}
}

// TestALeaseOwnerNotReadIsToldLessOften: while the owner ClusterRole was
// gone (or its read refused), each try to make the Lease failed and
// client-go logged it as an error: every replica, every retry period (2 s)
// for as long as it stayed gone. The tries now wait longer each time, to
// 30 s, and the wait ends once the owner is read.
func TestALeaseOwnerNotReadIsToldLessOften(t *testing.T) {
	ctx := context.Background()
	kube := kubefake.NewClientset()
	owner := metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-aggregator", UID: "cr-uid"}
	stands := false
	var waits []time.Duration
	l := &ownedLease{
		LeaseLock: &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: "pulse-system", Name: "pulse-aggregator-provisioner"},
			Client: kube.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: "a"}},
		owner: func(context.Context) (metav1.OwnerReference, error) {
			if !stands {
				return metav1.OwnerReference{}, errors.New("ClusterRole pulse-aggregator: not found")
			}
			return owner, nil
		},
		retry: 2 * time.Second,
		sleep: func(_ context.Context, d time.Duration) { waits = append(waits, d) },
	}
	rec := resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 15}
	for range 8 {
		if err := l.Create(ctx, rec); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("the owner gone: %v, want its error", err)
		}
	}
	s := time.Second
	if want := []time.Duration{0, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s, 30 * s}; !reflect.DeepEqual(waits, want) {
		t.Errorf("waits before each failed create %v, want %v", waits, want)
	}
	stands = true
	if err := l.Create(ctx, rec); err != nil {
		t.Fatalf("the owner there again: %v", err)
	}
	if err := kube.CoordinationV1().Leases("pulse-system").Delete(ctx, "pulse-aggregator-provisioner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stands, waits = false, nil
	_ = l.Create(ctx, rec)
	if !reflect.DeepEqual(waits, []time.Duration{0}) {
		t.Errorf("the owner gone again: waits %v, want the first told at once", waits)
	}
}
