//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// provisionArgs are the chart's provisioning flags, with a short Lease so
// that a take-over fits in the test.
func provisionArgs(scaler string) []string {
	return []string{"--provision-scaledobjects", "--provision-scaler-address=" + scaler,
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}
}

// provisioning: annotate a Kaito-shaped InferenceSet as keda-kaito-scaler
// users do → its ScaledObject appears → KEDA makes the HPA → load scales
// it; a changed annotation changes the ScaledObject; a hand-written one is
// left alone and reported; of two aggregator replicas one provisions, and
// when it is killed the other takes over; a removed annotation deletes the
// ScaledObject, and deleting the workload deletes it too.
func (e *env) provisioning(t *testing.T) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	agg2, agg2HTTP := e.secondAggregator(t)
	defer agg2.stop()
	e.docsScaledObjectsAreValid(t)

	e.createWorkload(infSetGVR, "auto", map[string]any{"replicas": int64(1)})
	f := &fakeInferenceSet{e: e, name: "auto", loadFor: 2 * time.Second, sims: map[int]*countingSim{}}
	go f.run(ctx, t)
	waitFor(t, 30*time.Second, "the first pod of auto reports", func() error {
		if f.first() == nil {
			return fmt.Errorf("no pod yet")
		}
		return e.expectPods("auto-0", 1)
	})

	// As an InferenceSet written for keda-kaito-scaler carries them.
	e.annotate(t, infSetGVR, "auto", map[string]string{"scaledobject.kaito.sh/auto-provision": "true",
		"scaledobject.kaito.sh/threshold": "4", "scaledobject.kaito.sh/metricName": "vllm:num_requests_waiting",
		"scaledobject.kaito.sh/max-replicas": "4"})
	is, err := e.dyn.Resource(infSetGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{})
	must(t, err)
	var so *unstructured.Unstructured
	waitFor(t, 30*time.Second, "the provisioned ScaledObject", func() (err error) {
		so, err = e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{})
		return err
	})
	md := e.triggerMetadata(t, so)
	owners := so.GetOwnerReferences()
	if so.GetLabels()["app.kubernetes.io/managed-by"] != "pulse" || len(owners) != 1 || owners[0].UID != is.GetUID() ||
		md["inferenceSet"] != "auto" || md["metricName"] != "vllm:num_requests_waiting" || md["threshold"] != "4" || md["scalerAddress"] != e.scaler {
		t.Fatalf("ScaledObject: labels %v owners %v trigger %v", so.GetLabels(), owners, md)
	}
	e.expectEvent(t, "auto", "ScaledObjectCreated")

	if e.cp.local() {
		// KEDA makes the HPA, which scales on the queue: 20 waiting at 4
		// per replica wants 5, capped at 4, 2 pods a minute.
		f.first().setWaiting(20)
		waitFor(t, 120*time.Second, "the HPA scales auto up", func() error {
			r, err := e.replicas(infSetGVR, "auto")
			if err != nil || r < 2 {
				return fmt.Errorf("replicas %d (%v)", r, err)
			}
			return nil
		})
		f.first().setWaiting(0)
	}

	e.annotate(t, infSetGVR, "auto", map[string]string{"scaledobject.kaito.sh/auto-provision": "true",
		"scaledobject.kaito.sh/threshold": "8", "scaledobject.kaito.sh/metricName": "vllm:num_requests_waiting",
		"scaledobject.kaito.sh/max-replicas": "4"})
	waitFor(t, 30*time.Second, "the ScaledObject follows the threshold", func() error {
		so, err := e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if th := e.triggerMetadata(t, so)["threshold"]; th != "8" {
			return fmt.Errorf("threshold %v", th)
		}
		return nil
	})

	e.handWrittenIsLeftAlone(t)

	// Kill the leader outright: the other replica takes the Lease when it
	// expires, and provisions from then on.
	var leader *proc
	var followerHTTP string
	switch p1, p2 := provisioningOf(e.aggHTTP), provisioningOf(agg2HTTP); {
	case p1.Leading && !p2.Leading:
		leader, followerHTTP = e.agg, agg2HTTP
	case p2.Leading && !p1.Leading:
		leader, followerHTTP = agg2, e.aggHTTP
	default:
		t.Fatalf("want one leader: %+v %+v", p1, p2)
	}
	killed := time.Now()
	leader.kill()
	waitFor(t, 30*time.Second, "the other replica leads", func() error {
		if p := provisioningOf(followerHTTP); !p.Leading {
			return fmt.Errorf("%+v", p)
		}
		return nil
	})
	t.Logf("leader killed: the other replica led %s later (Lease 4s)", time.Since(killed).Round(100*time.Millisecond))

	// The new leader deletes the ScaledObject when the annotation goes...
	e.annotate(t, infSetGVR, "auto", nil)
	waitFor(t, 30*time.Second, "the ScaledObject deleted", func() error {
		if _, err := e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	e.expectEvent(t, "auto", "ScaledObjectDeleted")
	// ... makes it again when it comes back, and the garbage collector
	// deletes it with its InferenceSet.
	e.annotate(t, infSetGVR, "auto", map[string]string{"pulse.io/autoscale": "true"})
	waitFor(t, 30*time.Second, "the ScaledObject again", func() error {
		_, err := e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{})
		return err
	})
	cancel()
	must(t, e.dyn.Resource(infSetGVR).Namespace(appNS).Delete(e.ctx, "auto", metav1.DeleteOptions{}))
	waitFor(t, 60*time.Second, "the ScaledObject deleted with its InferenceSet", func() error {
		if _, err := e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "auto", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	for i := range 4 {
		_ = e.kube.CoreV1().Pods(appNS).Delete(e.ctx, fmt.Sprintf("auto-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	}
	if leader == e.agg {
		e.startAggregator()
		waitFor(t, 60*time.Second, "the agent feeds the restarted aggregator", func() error { return e.expectPods("llama", 2) })
	}
}

// secondAggregator starts another replica beside e.agg, as the chart's
// two: same flags, its own ports.
func (e *env) secondAggregator(t *testing.T) (*proc, string) {
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var args []string
	for _, a := range e.aggArgs {
		switch {
		case strings.HasPrefix(a, "--scaler-addr="):
			a = fmt.Sprintf("--scaler-addr=127.0.0.1:%d", freePort(t))
		case strings.HasPrefix(a, "--ingest-addr="):
			a = fmt.Sprintf("--ingest-addr=127.0.0.1:%d", freePort(t))
		case strings.HasPrefix(a, "--http-addr="):
			a = "--http-addr=" + httpAddr
		}
		args = append(args, a)
	}
	p := start(t, e.dir, "pulse-aggregator-2", nil, filepath.Join(e.bins, "pulse-aggregator"), args...)
	e.extra = append(e.extra, p)
	waitFor(t, 30*time.Second, "the second aggregator stands for the Lease", func() error {
		if p := provisioningOf(httpAddr); p.Identity == "" {
			return fmt.Errorf("no identity yet")
		}
		return nil
	})
	return p, httpAddr
}

// provisioningOf reads a replica's /debug/provisioning (empty if it does
// not answer).
func provisioningOf(httpAddr string) (p struct {
	Identity string `json:"identity"`
	Leading  bool   `json:"leading"`
	Leader   string `json:"leader"`
}) {
	resp, err := http.Get("http://" + httpAddr + "/debug/provisioning")
	if err != nil {
		return p
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&p)
	return p
}

// handWrittenIsLeftAlone: a ScaledObject pulse did not make, of an
// annotated workload's name, is reported and never changed.
func (e *env) handWrittenIsLeftAlone(t *testing.T) {
	e.createWorkload(infSetGVR, "manual", map[string]any{"replicas": int64(0)})
	e.createScaledObjectSpec("manual", map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet", "name": "manual"},
		"minReplicaCount": int64(0), "maxReplicaCount": int64(2),
		"triggers": []any{map[string]any{"type": "external-push",
			"metadata":          map[string]any{"scalerAddress": e.scaler, "inferenceSet": "manual"},
			"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}},
	})
	defer func() {
		_ = e.dyn.Resource(soGVR).Namespace(appNS).Delete(e.ctx, "manual", metav1.DeleteOptions{})
		_ = e.dyn.Resource(infSetGVR).Namespace(appNS).Delete(e.ctx, "manual", metav1.DeleteOptions{})
	}()
	e.annotate(t, infSetGVR, "manual", map[string]string{"pulse.io/autoscale": "true"})
	if msg := e.expectEvent(t, "manual", "ScaledObjectConflict"); !strings.Contains(msg, "not pulse's") {
		t.Errorf("conflict event: %q", msg)
	}
	so, err := e.dyn.Resource(soGVR).Namespace(appNS).Get(e.ctx, "manual", metav1.GetOptions{})
	must(t, err)
	if n, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount"); so.GetLabels()["app.kubernetes.io/managed-by"] != "" || n != 2 {
		t.Errorf("the hand-written ScaledObject was changed: %v %v", so.GetLabels(), so.Object["spec"])
	}
}

// docsScaledObjectsAreValid: the ScaledObjects the docs ship pass KEDA's
// CRD schema (a server-side dry run).
func (e *env) docsScaledObjectsAreValid(t *testing.T) {
	root := repoRoot(t)
	for _, f := range []string{"docs/simulation/tuned-scaledobject.yaml", "docs/simulation/step-scaledobject.yaml",
		"docs/simulation/p90-scaledobject.yaml", "pkg/sim/testdata/baseline-scaledobject.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		must(t, err)
		u := &unstructured.Unstructured{}
		must(t, yaml.Unmarshal(b, &u.Object))
		u.SetNamespace(appNS)
		if _, err := e.dyn.Resource(soGVR).Namespace(appNS).Create(e.ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// annotate sets a workload's annotations (nil: none).
func (e *env) annotate(t *testing.T, gvr schema.GroupVersionResource, name string, annotations map[string]string) {
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := e.dyn.Resource(gvr).Namespace(appNS).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		u.SetAnnotations(annotations)
		_, err = e.dyn.Resource(gvr).Namespace(appNS).Update(e.ctx, u, metav1.UpdateOptions{})
		return err
	}))
}

// expectEvent waits for an Event with the reason on the named object, and
// returns its message.
func (e *env) expectEvent(t *testing.T, name, reason string) string {
	var msg string
	waitFor(t, 30*time.Second, "Event "+reason+" on "+name, func() error {
		list, err := e.kube.CoreV1().Events(appNS).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Reason == reason {
				msg = ev.Message
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s", len(list.Items), reason)
	})
	return msg
}

func (e *env) triggerMetadata(t *testing.T, so *unstructured.Unstructured) map[string]any {
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	if len(triggers) != 1 {
		t.Fatalf("triggers %v", triggers)
	}
	md, _ := triggers[0].(map[string]any)["metadata"].(map[string]any)
	return md
}
