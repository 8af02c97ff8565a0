package discovery

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

func routerPod(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "epp-0", Namespace: "models", UID: "u1", Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{PodIP: "10.0.0.9", Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// TestDemandTargets: a router pod annotated as a demand source becomes one
// target per workload it fronts, whatever the selector; bad annotations
// are named in the error.
func TestDemandTargets(t *testing.T) {
	sel, _ := labels.Parse("kaito.sh/workspace")
	ts, err := TargetsOf(routerPod(map[string]string{
		AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "llama=meta-llama/Llama-3.1-8B-Instruct, phi",
		AnnotationDemandKind: "InferenceSet", AnnotationPort: "9090",
	}), "node-1", sel)
	if err != nil || len(ts) != 2 {
		t.Fatalf("targets %+v, %v", ts, err)
	}
	a := ts[0]
	if a.UID != "u1/demand/llama" || a.URL != "http://10.0.0.9:9090/metrics" || !a.Ready || a.Demand == nil ||
		a.Demand.Match != "meta-llama/Llama-3.1-8B-Instruct" || a.Demand.Label != "target_model_name" || a.Demand.Arrivals ||
		len(a.Workloads) != 1 || a.Workloads[0] != (Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET, Name: "llama"}) {
		t.Fatalf("llama target %+v demand %+v", a, a.Demand)
	}
	if ts[1].Demand.Match != "phi" {
		t.Fatalf("phi matches %q", ts[1].Demand.Match)
	}
	custom, err := TargetsOf(routerPod(map[string]string{AnnotationDemandSource: "custom", AnnotationDemandWorkloads: "w",
		AnnotationDemandMetric: "kubeai_held, kubeai_held_v2", AnnotationDemandLabel: "model", AnnotationDemandType: "arrivals"}), "node-1", sel)
	if err != nil || len(custom) != 1 || !custom[0].Demand.Arrivals || custom[0].Demand.Metrics[1] != "kubeai_held_v2" {
		t.Fatalf("custom %+v, %v", custom, err)
	}
	for name, tc := range map[string]struct {
		ann  map[string]string
		want string
	}{
		"unknown preset":  {map[string]string{AnnotationDemandSource: "envoy", AnnotationDemandWorkloads: "a"}, "want epp, production-stack or custom"},
		"no workloads":    {map[string]string{AnnotationDemandSource: "epp"}, AnnotationDemandWorkloads + " is required"},
		"repeated":        {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a,a"}, "repeated"},
		"custom, no name": {map[string]string{AnnotationDemandSource: "custom", AnnotationDemandWorkloads: "a"}, "no metric"},
		"bad metric":      {map[string]string{AnnotationDemandSource: "custom", AnnotationDemandWorkloads: "a", AnnotationDemandMetric: "a b", AnnotationDemandLabel: "m"}, "not a valid metric name"},
		"bad kind":        {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a", AnnotationDemandKind: "Job"}, "want Workspace"},
		"nine metrics":    {map[string]string{AnnotationDemandSource: "custom", AnnotationDemandWorkloads: "a", AnnotationDemandMetric: "q1,q2,q3,q4,q5,q6,q7,q8,q9", AnnotationDemandLabel: "m"}, "9 metrics; at most 8"},
		"bad type":        {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a", AnnotationDemandType: "queue"}, "want held or arrivals"},
		// An entry's uid is ROUTER_UID/demand/NAME: a name holding
		// /demand/ cut it as another pod's, and the router read as two
		// pods at one address was not scraped at all.
		"a name with a /": {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a, x/demand/y"}, "holds a /"},
		// One router naming 1,100 workloads filled its node's catalogue
		// past the aggregator's limit: the node went silent.
		"too many workloads": {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: manyNames(1100)}, "names 1100 workloads; at most 64"},
	} {
		if _, err := TargetsOf(routerPod(tc.ann), "node-1", sel); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
	// A router opted out of scraping is not read either.
	if ts, err := TargetsOf(routerPod(map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a", AnnotationScrape: "false"}), "node-1", sel); err != nil || ts != nil {
		t.Fatalf("opted out: %v, %v", ts, err)
	}
	// An annotation's value is quoted in the error (logged at every pod
	// event) at most 64 bytes long.
	if _, err := TargetsOf(routerPod(map[string]string{AnnotationDemandSource: strings.Repeat("x", 200<<10), AnnotationDemandWorkloads: "a"}), "node-1", sel); err == nil || len(err.Error()) > 512 {
		t.Fatalf("a 200 KiB preset name: error of %d bytes, want one of a few hundred", len(fmt.Sprint(err)))
	}
	// Another node's router is not this agent's.
	if ts, err := TargetsOf(routerPod(map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a"}), "node-2", sel); err != nil || ts != nil {
		t.Fatalf("other node: %v, %v", ts, err)
	}
}

func manyNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "w" + strconv.Itoa(i)
	}
	return strings.Join(names, ",")
}

// TestPodOfTooManyWorkloadsIsLeftOut: a pod with nine owner references
// (nine workloads) once made the aggregator refuse its node's whole
// catalogue; the agent now leaves that pod alone out, saying why.
func TestPodOfTooManyWorkloadsIsLeftOut(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p", Labels: map[string]string{"pod-template-hash": "h"}},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{PodIP: "10.0.0.7", Phase: corev1.PodRunning},
	}
	p.Annotations = map[string]string{AnnotationScrape: "true", AnnotationPort: "8000"}
	for i := range 9 {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "StatefulSet", Name: "s" + strconv.Itoa(i)})
	}
	if _, ok, err := TargetOf(p, "node-1", sel); ok || err == nil || !strings.Contains(err.Error(), "belongs to 9 workloads (labels and owner references); at most 8") {
		t.Fatalf("ok %v, err %v; want the pod left out, naming the limit", ok, err)
	}
	p.OwnerReferences = p.OwnerReferences[:8]
	if tg, ok, err := TargetOf(p, "node-1", sel); !ok || err != nil || len(tg.Workloads) != 8 {
		t.Fatalf("eight workloads: ok %v, %v, %d workloads", ok, err, len(tg.Workloads))
	}
}

// TestWorkloadNamesNotUTF8AreLeftOut: a workload name from an annotation
// (pulse.io/workload, pulse.io/demand-workloads) that is not UTF-8 made the
// agent's catalogue fail to marshal at every stream, silencing the node;
// one longer than an object's name was sent only to be refused, and one
// with a control or format character was sent to be printed. The pod
// alone is left out, naming why.
func TestWorkloadNamesNotUTF8AreLeftOut(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	pod := func(ann map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p", Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: "node-1"},
			Status:     corev1.PodStatus{PodIP: "10.0.0.7", Phase: corev1.PodRunning},
		}
	}
	long := strings.Repeat("w", 254)
	for name, ann := range map[string]map[string]string{
		"workload not UTF-8": {AnnotationScrape: "true", AnnotationPort: "8000", KeyWorkload: "llama\xff"},
		"workload too long":  {AnnotationScrape: "true", AnnotationPort: "8000", KeyWorkload: long},
		"demand not UTF-8":   {AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a,b\xfe"},
		"demand too long":    {AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a," + long},
		// A newline in a name forged a row of the debug tables; an escape
		// reached the terminal of whoever read them.
		"workload with a newline":       {AnnotationScrape: "true", AnnotationPort: "8000", KeyWorkload: "llama\nx  Workspace victim/y"},
		"demand with an escape":         {AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "a,b\x1b[2J"},
		"workload with a bidi override": {AnnotationScrape: "true", AnnotationPort: "8000", KeyWorkload: "llama\u202e"},
	} {
		if ts, err := TargetsOf(pod(ann), "node-1", sel); err == nil || !strings.Contains(err.Error(), "not UTF-8 of at most 253 bytes, of printable characters alone") || len(ts) != 0 {
			t.Errorf("%s: %d targets, err %v; want the pod left out, naming why", name, len(ts), err)
		}
	}
	ok := pod(map[string]string{AnnotationScrape: "true", AnnotationPort: "8000", KeyWorkload: long[:253]})
	if ts, err := TargetsOf(ok, "node-1", sel); err != nil || len(ts) != 1 {
		t.Fatalf("a 253-byte name: %d targets, %v", len(ts), err)
	}
}

// TestARoutersMetricListIsCountedBeforeItIsSplit: pulse.io/demand-metric
// was split before its bound (8 metrics) was checked, at every listing of
// the node's targets: a router's 250 KiB of commas cost 4 MiB a listing,
// 100 of them 391 MiB and 0.75 s, for every tenant of the node.
func TestARoutersMetricListIsCountedBeforeItIsSplit(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	p := kaitoPod("router", "node-1", true)
	p.Labels = nil
	p.Annotations = map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "llama",
		AnnotationDemandMetric: strings.Repeat(",", 250<<10)}
	// Refused for its size (4 KiB) before it is read at all.
	if _, err := TargetsOf(p, "node-1", sel); err == nil || !strings.Contains(err.Error(), "pulse.io/demand-metric: over 4096 bytes") {
		t.Fatalf("a router naming 256,001 metrics: %v, want refused, naming the bound", err)
	}
	// Within the size, past the count (8 metrics).
	p.Annotations[AnnotationDemandMetric] = strings.Repeat(",", 100)
	if _, err := TargetsOf(p, "node-1", sel); err == nil || !strings.Contains(err.Error(), "101 metrics; at most 8") {
		t.Fatalf("a router naming 101 metrics: %v, want refused, naming the bound", err)
	}
	if n := testing.AllocsPerRun(5, func() { _, _ = TargetsOf(p, "node-1", sel) }); n > 100 {
		t.Fatalf("refusing it took %.0f allocations, want a few", n)
	}
}
