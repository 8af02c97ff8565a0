//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pulse-io/pulse/pkg/debug"
)

// holdFinalizer keeps a deleted pod in the API, terminating, as a pod in
// its grace period is.
const holdFinalizer = "pulse.io/e2e-hold"

// drainingPod: with metricType Value (valueType average) the HPA multiplies
// the value by its count of Ready pods, and a pod draining in its grace
// period (deleted, still Ready) is in that count (replica_calculator.go,
// getReadyPodsCount), while pulse's average is over the serving pods: 4
// pods at 14 waiting (threshold 10) and one draining asked the real HPA for
// ceil(1.4 × 5) = 7 where 6 serve the load. pulse now scales its average by
// the serving pods' share of the HPA's count: the HPA asks for 6, and
// agrees with pulse's own desired count.
func (e *env) drainingPod(t *testing.T) {
	if !e.cp.local() {
		t.Skip("1 → N needs KEDA's metrics adapter, which runs here only beside the test's own control plane")
	}
	const so = "drain-so"
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	f := e.startFakeSet(ctx, t, "drain", 10*time.Minute, nil)
	defer func() { _ = e.dyn.Resource(infSetGVR).Namespace(appNS).Delete(e.ctx, "drain", metav1.DeleteOptions{}) }()

	// Four serving pods at 14 waiting: the fake set's replicas 1-3 are
	// made Ready here (their model load is 10 minutes, so that the
	// replicas the HPA adds stay starting).
	e.scaleTo(infSetGVR, "drain", 4)
	waitFor(t, 30*time.Second, "four pods", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.sims) != 4 {
			return fmt.Errorf("%d pods", len(f.sims))
		}
		return nil
	})
	f.mu.Lock()
	for i, sim := range f.sims {
		sim.setWaiting(14)
		if i > 0 {
			e.setPodReady(t, f.podName(i))
		}
	}
	f.mu.Unlock()

	// A fifth pod of the set, deleted and draining: still Running and Ready.
	draining := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "drain-old", Namespace: appNS, Finalizers: []string{holdFinalizer},
			Labels:      map[string]string{"kaito.sh/workspace": "drain-old", "inferenceset.kaito.sh/created-by": "drain"},
			Annotations: map[string]string{"pulse.io/port": f.first().port}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	created, err := e.kube.CoreV1().Pods(appNS).Create(ctx, draining, metav1.CreateOptions{})
	must(t, err)
	defer func() {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		_, _ = e.kube.CoreV1().Pods(appNS).Patch(e.ctx, "drain-old", types.MergePatchType, patch, metav1.PatchOptions{})
	}()
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
	_, err = e.kube.CoreV1().Pods(appNS).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	must(t, err)
	must(t, e.kube.CoreV1().Pods(appNS).Delete(ctx, "drain-old", metav1.DeleteOptions{}))

	e.createScaledObjectSpec(so, map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet", "name": "drain"},
		"minReplicaCount": int64(4), "maxReplicaCount": int64(10), "pollingInterval": int64(5),
		"triggers": []any{map[string]any{"type": "external-push", "metricType": "Value",
			"metadata": map[string]any{"scalerAddress": e.scaler, "inferenceSet": "drain", "threshold": "10", "window": "2s",
				"valueType": "average"},
			"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}},
		"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
			"scaleUp": map[string]any{"stabilizationWindowSeconds": int64(0),
				"policies": []any{map[string]any{"type": "Pods", "value": int64(10), "periodSeconds": int64(15)}}}}}},
	})
	defer func() { _ = e.dyn.Resource(soGVR).Namespace(appNS).Delete(e.ctx, so, metav1.DeleteOptions{}) }()

	waitFor(t, 90*time.Second, "pulse sees the draining pod, and the HPA asks for what pulse does", func() error {
		pods, err := e.triggerPods(so)
		if err != nil || pods["drain-old"] != "left out terminating" {
			return fmt.Errorf("pods %v (%v)", pods, err)
		}
		want, err := e.pulseDesired(so)
		if err != nil {
			return err
		}
		d, err := e.hpaDesired(so)
		if err != nil || d != int32(want) || want != 6 {
			return fmt.Errorf("HPA desired %d (%v), pulse's desired %d; want both 6: 4 serving pods at 1.4 × the threshold", d, err, want)
		}
		return nil
	})
	// Two more HPA syncs: it stays at 6 (the pods it added are starting:
	// in neither count).
	for range 30 {
		d, err := e.hpaDesired(so)
		must(t, err)
		if d != 6 {
			t.Fatalf("HPA desired %d beside a draining pod, want 6", d)
		}
		time.Sleep(time.Second)
	}
	cancel()
}

// setPodReady sets a pod's Ready condition, as the kubelet would.
func (e *env) setPodReady(t *testing.T, name string) {
	for {
		p, err := e.kube.CoreV1().Pods(appNS).Get(e.ctx, name, metav1.GetOptions{})
		must(t, err)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		_, err = e.kube.CoreV1().Pods(appNS).UpdateStatus(e.ctx, p, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			must(t, err)
			return
		}
	}
}

// pulseDesired reads, from /debug/triggers, the desired replica count
// pulse derives for a ScaledObject (the HPA's rule, before its tolerance).
func (e *env) pulseDesired(so string) (int, error) {
	resp, err := http.Get("http://" + e.aggHTTP + "/debug/triggers")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var doc debug.TriggersDocument
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return 0, err
	}
	for _, tr := range doc.Triggers {
		if tr.ScaledObject == so && tr.DesiredReplicas != nil {
			return *tr.DesiredReplicas, nil
		}
	}
	return 0, fmt.Errorf("no answer for %s yet", so)
}
