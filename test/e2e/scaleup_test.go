//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// fakeInferenceSet plays Kaito's InferenceSet controller (and the kubelet)
// for one InferenceSet: it keeps one simulated vLLM pod per replica on
// gpu-node-1, each Running at once but Ready only after loadFor (its model
// load), and reports status.replicas and status.selector, which the HPA reads
// through /scale.
type fakeInferenceSet struct {
	e       *env
	name    string
	loadFor time.Duration

	// model, when set, is every pod's queueing model, run from its
	// creation (its own load, not pinned gauges), with model.ArrivalRate
	// the whole set's: split evenly over the Ready pods, as a Service
	// spreads requests (set it with setArrival).
	model *vllmsim.QueueModel

	mu      sync.Mutex
	sims    map[int]*countingSim // by replica index
	readyAt map[int]time.Time
}

// setArrival sets the whole set's arrival rate (requests a second).
func (f *fakeInferenceSet) setArrival(rate float64) {
	f.mu.Lock()
	f.model.ArrivalRate = rate
	f.mu.Unlock()
}

// spread gives each Ready pod its share of the arrivals; mu held.
func (f *fakeInferenceSet) spread() {
	if f.model == nil {
		return
	}
	ready := 0
	for i := range f.sims {
		if !time.Now().Before(f.readyAt[i]) {
			ready++
		}
	}
	for i, sim := range f.sims {
		m := *f.model
		m.ArrivalRate = 0
		if ready > 0 && !time.Now().Before(f.readyAt[i]) {
			m.ArrivalRate = f.model.ArrivalRate / float64(ready)
		}
		sim.SetModel(m)
	}
}

func (f *fakeInferenceSet) podName(i int) string { return fmt.Sprintf("%s-%d", f.name, i) }

// run reconciles until ctx ends.
func (f *fakeInferenceSet) run(ctx context.Context, t *testing.T) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := f.reconcile(ctx, t); err != nil && ctx.Err() == nil {
			t.Logf("fake InferenceSet controller: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (f *fakeInferenceSet) reconcile(ctx context.Context, t *testing.T) error {
	u, err := f.e.dyn.Resource(infSetGVR).Namespace(appNS).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range int(want) {
		if _, ok := f.sims[i]; !ok {
			sim := newSim(t)
			if f.model != nil {
				go sim.RunModel(ctx, 100*time.Millisecond)
			} else {
				sim.setWaiting(0)
			}
			if err := f.createPod(ctx, i, sim); err != nil {
				return err
			}
			f.sims[i] = sim
			if f.readyAt == nil {
				f.readyAt = map[int]time.Time{}
			}
			f.readyAt[i] = time.Now()
			if i > 0 {
				f.readyAt[i] = f.readyAt[i].Add(f.loadFor)
			}
		}
	}
	for i := range f.sims {
		if i >= int(want) {
			err := f.e.kube.CoreV1().Pods(appNS).Delete(ctx, f.podName(i), metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			delete(f.sims, i)
			delete(f.readyAt, i)
		}
	}
	f.spread()
	if err := unstructured.SetNestedField(u.Object, int64(len(f.sims)), "status", "replicas"); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(u.Object, "inferenceset.kaito.sh/created-by="+f.name, "status", "selector"); err != nil {
		return err
	}
	_, err = f.e.dyn.Resource(infSetGVR).Namespace(appNS).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// createPod makes replica i's pod: Running at 127.0.0.1 on the sim's port,
// Ready at once for the first replica and after loadFor for later ones.
func (f *fakeInferenceSet) createPod(ctx context.Context, i int, sim *countingSim) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: f.podName(i), Namespace: appNS,
			// As Kaito labels them: each InferenceSet replica is a Workspace.
			Labels:      map[string]string{"kaito.sh/workspace": f.podName(i), "inferenceset.kaito.sh/created-by": f.name},
			Annotations: map[string]string{"pulse.io/port": sim.port}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	created, err := f.e.kube.CoreV1().Pods(appNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	ready := corev1.ConditionFalse
	if i == 0 {
		ready = corev1.ConditionTrue
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}}
	if _, err := f.e.kube.CoreV1().Pods(appNS).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if ready == corev1.ConditionFalse {
		go func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(f.loadFor):
			}
			p, err := f.e.kube.CoreV1().Pods(appNS).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return
			}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
			_, _ = f.e.kube.CoreV1().Pods(appNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		}()
	}
	return nil
}

// startFakeSet creates InferenceSet name at 1 replica, runs its fake
// controller until ctx ends, and waits for its first pod to report.
func (e *env) startFakeSet(ctx context.Context, t *testing.T, name string, loadFor time.Duration, model *vllmsim.QueueModel) *fakeInferenceSet {
	e.createWorkload(infSetGVR, name, map[string]any{"replicas": int64(1)})
	f := &fakeInferenceSet{e: e, name: name, loadFor: loadFor, model: model, sims: map[int]*countingSim{}}
	go f.run(ctx, t)
	waitFor(t, 30*time.Second, "the first pod reports", func() error {
		if f.first() == nil {
			return fmt.Errorf("no pod yet")
		}
		return e.expectPods(name+"-0", 1)
	})
	return f
}

// first is replica 0's sim: the pod Ready from the start.
func (f *fakeInferenceSet) first() *countingSim {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sims[0]
}

// hpaDesired reads the desired replica count KEDA's HPA reports.
func (e *env) hpaDesired(so string) (int32, error) {
	h, err := e.kube.AutoscalingV2().HorizontalPodAutoscalers(appNS).Get(e.ctx, "keda-hpa-"+so, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	return h.Status.DesiredReplicas, nil
}

// triggerPods reads, from /debug/triggers, how each pod entered the last
// answer for a ScaledObject.
func (e *env) triggerPods(so string) (map[string]string, error) {
	resp, err := http.Get("http://" + e.aggHTTP + "/debug/triggers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc debug.TriggersDocument
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	for _, tr := range doc.Triggers {
		if tr.ScaledObject != so {
			continue
		}
		if tr.Decision == nil {
			return nil, fmt.Errorf("last answer was an error: %s", tr.Error)
		}
		out := map[string]string{}
		for _, p := range tr.Decision.Pods {
			out[p.Name] = strings.TrimSpace(p.Use + " " + p.Why)
		}
		return out, nil
	}
	return nil, fmt.Errorf("no answer for %s yet", so)
}

// scaleUpWhileLoading: an InferenceSet at 1 replica gets 25 waiting
// (threshold 10): the HPA asks for 3. The two new pods stay not Ready for
// their model load while the first pod's queue drains to 9. The desired
// count KEDA's HPA reports must stay at 3 until they report: before the
// missing-pod rule each starting pod counted 1.5 × threshold (9 + 15 + 15 =
// 39: 4 replicas, then 6, 9, ... up to maxReplicaCount).
func (e *env) scaleUpWhileLoading(t *testing.T) {
	if !e.cp.local() {
		t.Skip("1 → N needs KEDA's metrics adapter, which runs here only beside the test's own control plane")
	}
	const loadFor = 40 * time.Second
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	f := e.startFakeSet(ctx, t, "burst", loadFor, nil)

	e.createScaledObjectSpec("burst-so", map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet", "name": "burst"},
		"minReplicaCount": int64(1), "maxReplicaCount": int64(10), "pollingInterval": int64(5),
		"triggers": []any{map[string]any{"type": "external-push",
			"metadata":          map[string]any{"scalerAddress": e.scaler, "inferenceSet": "burst", "threshold": "10", "window": "2s"},
			"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}},
		"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
			"scaleUp": map[string]any{"stabilizationWindowSeconds": int64(0),
				"policies": []any{map[string]any{"type": "Pods", "value": int64(10), "periodSeconds": int64(15)}}}}}},
	})
	defer func() {
		_ = e.dyn.Resource(soGVR).Namespace(appNS).Delete(e.ctx, "burst-so", metav1.DeleteOptions{})
	}()

	f.first().setWaiting(25)
	waitFor(t, 90*time.Second, "the HPA asks for 3 and the InferenceSet has 3", func() error {
		d, err := e.hpaDesired("burst-so")
		r, rerr := e.replicas(infSetGVR, "burst")
		if err != nil || rerr != nil || d != 3 || r != 3 {
			return fmt.Errorf("HPA desired %d (%v), /scale %d (%v)", d, err, r, rerr)
		}
		return nil
	})
	start := time.Now()
	// The queue drains on the serving pod while the new ones load.
	f.first().setWaiting(9)
	seen := map[int32]bool{}
	sawStarting := false
	for time.Since(start) < loadFor-5*time.Second {
		d, err := e.hpaDesired("burst-so")
		must(t, err)
		r, err := e.replicas(infSetGVR, "burst")
		must(t, err)
		seen[d] = true
		if d > 3 || r > 3 {
			t.Fatalf("%s after the scale-up, while the new pods load: HPA desired %d, /scale %d; want at most 3",
				time.Since(start).Round(time.Second), d, r)
		}
		if pods, err := e.triggerPods("burst-so"); err == nil && pods["burst-1"] == "left out starting" && pods["burst-2"] == "left out starting" {
			sawStarting = true
		}
		time.Sleep(time.Second)
	}
	if !sawStarting {
		pods, err := e.triggerPods("burst-so")
		t.Fatalf("/debug/triggers never showed the loading pods as left out (starting): %v %v", pods, err)
	}
	// The new pods become Ready and report an empty queue: still 3, held
	// by the scale-down stabilization.
	waitFor(t, 60*time.Second, "the new pods report", func() error {
		pods, err := e.triggerPods("burst-so")
		if err != nil || pods["burst-1"] != "counted" || pods["burst-2"] != "counted" {
			return fmt.Errorf("%v %v", pods, err)
		}
		return nil
	})
	d, err := e.hpaDesired("burst-so")
	must(t, err)
	if d > 3 {
		t.Fatalf("HPA desired %d once the new pods report", d)
	}
	var ds []string
	for v := range seen {
		ds = append(ds, strconv.Itoa(int(v)))
	}
	sort.Strings(ds)
	t.Logf("HPA desired replicas seen while the new pods loaded: %s", strings.Join(ds, ", "))
	cancel()
}

// createScaledObjectSpec creates a ScaledObject with the given spec.
func (e *env) createScaledObjectSpec(name string, spec map[string]any) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": name, "namespace": appNS}, "spec": spec}}
	_, err := e.dyn.Resource(soGVR).Namespace(appNS).Create(e.ctx, u, metav1.CreateOptions{})
	must(e.t, err)
}
