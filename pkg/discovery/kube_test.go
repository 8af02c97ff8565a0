package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/fakenode"
	"github.com/pulse-io/pulse/test/syncbuf"
)

func kaitoPod(name, node string, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Labels: map[string]string{LabelWorkspace: "llama"}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"},
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	return p
}

// targetCase is a pod (kaitoPod's, changed by mutate) and what TargetOf
// makes of it.
type targetCase struct {
	mutate func(*corev1.Pod)
	ok     bool
	bad    bool
	want   Target
}

// targetCases: what TargetOf makes of kaitoPod's pod, changed.
var targetCases = map[string]targetCase{
	"kaito pod on Kaito's port": {
		ok: true, want: Target{UID: "uid-p", Namespace: "ns", Pod: "p", Ready: true, URL: "http://10.0.0.7:5000/metrics",
			Workloads: []Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}},
	},
	"annotations place the page": {
		mutate: func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationPort: "8443", AnnotationPath: "/vllm/metrics", AnnotationScheme: "https"}
		},
		ok: true, want: Target{Ready: true, URL: "https://10.0.0.7:8443/vllm/metrics"},
	},
	// Empty is unset, as for every annotation pulse reads (a Helm
	// template rendering nothing): an empty pulse.io/port left the pod out
	// ("not a port number"), an empty pulse.io/demand-source made it a
	// demand source refused ("want epp, production-stack or custom").
	"an empty annotation is unset": {
		mutate: func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationPort: "", AnnotationPath: "", AnnotationScheme: "", AnnotationDemandSource: ""}
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9400}}
		},
		ok: true, want: Target{Ready: true, URL: "http://10.0.0.7:9400/metrics"},
	},
	"container port named metrics wins over http": {
		mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 80}, {Name: "metrics", ContainerPort: 9400}}
		},
		ok: true, want: Target{Ready: true, URL: "http://10.0.0.7:9400/metrics"},
	},
	"container port named http": {
		mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}
		},
		ok: true, want: Target{Ready: true, URL: "http://10.0.0.7:8000/metrics"},
	},
	// Its pod IP is the node's address; 127.0.0.1 was the agent's own
	// loopback (the agent does not run in the host's network).
	"hostNetwork is scraped at its node's address": {
		mutate: func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Status.PodIP = "192.0.2.10"
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 5000, HostPort: 5000}}
		},
		ok: true, want: Target{Ready: true, URL: "http://192.0.2.10:5000/metrics"},
	},
	// A hostNetwork pod's address is its node's: on a port it does not
	// declare, another tenant's hostNetwork server could answer, and
	// its values be read as this pod's.
	"hostNetwork on a port it does not declare": {
		mutate: func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Status.PodIP = "192.0.2.10"
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 5000, HostPort: 5000}}
			p.Annotations = map[string]string{AnnotationPort: "8000"}
		},
		bad: true,
	},
	"hostNetwork declaring the port for UDP": {
		mutate: func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Status.PodIP = "192.0.2.10"
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 5000, Protocol: corev1.ProtocolUDP}}
		},
		bad: true,
	},
	"hostNetwork declaring no port": {
		mutate: func(p *corev1.Pod) { p.Spec.HostNetwork = true; p.Status.PodIP = "192.0.2.10" },
		bad:    true,
	},
	"IPv6 pod": {
		mutate: func(p *corev1.Pod) { p.Status.PodIP = "fd00::7" },
		ok:     true, want: Target{Ready: true, URL: "http://[fd00::7]:5000/metrics"},
	},
	"not selected": {mutate: func(p *corev1.Pod) { p.Labels = map[string]string{"app": "x"} }},
	"opted out":    {mutate: func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationScrape: "false"} }},
	"other node":   {mutate: func(p *corev1.Pod) { p.Spec.NodeName = "node-2" }},
	"finished":     {mutate: func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }},
	"bad port":     {mutate: func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationPort: "http"} }, bad: true},
	"bad scheme":   {mutate: func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationScheme: "ftp"} }, bad: true},
	"opted in, no workload": {
		mutate: func(p *corev1.Pod) { p.Labels = nil; p.Annotations = map[string]string{AnnotationScrape: "true"} }, bad: true,
	},
	"not ready is listed, not scraped": {
		mutate: func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse },
		ok:     true, want: Target{Ready: false, URL: "http://10.0.0.7:5000/metrics"},
	},
	"no IP yet": {
		mutate: func(p *corev1.Pod) { p.Status.PodIP = "" },
		ok:     true, want: Target{Ready: false, URL: ""},
	},
	// Terminating pods were listed as merely not ready, which scalers
	// then filled as missing: flapping after every scale-down. Their
	// Ready condition is kept: the HPA counts a draining pod still
	// Ready for metricType Value.
	"terminating is listed as terminating, its Ready kept": {
		mutate: func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now },
		ok:     true, want: Target{Ready: true, Terminating: true, URL: "http://10.0.0.7:5000/metrics"},
	},
}

func TestTargetOf(t *testing.T) {
	for name, tc := range targetCases {
		t.Run(name, func(t *testing.T) { tc.check(t) })
	}
}

// check is TargetOf of the case's pod, whole and as the informer's cache
// holds it (slim): both as the case wants.
func (tc targetCase) check(t *testing.T) {
	t.Helper()
	sel, _ := ParseSelector(DefaultSelector)
	p := kaitoPod("p", "node-1", true)
	if tc.mutate != nil {
		tc.mutate(p)
	}
	got, ok, err := TargetOf(p, "node-1", sel)
	if (err != nil) != tc.bad || ok != tc.ok {
		t.Fatalf("ok %v err %v; want ok %v bad %v", ok, err, tc.ok, tc.bad)
	}
	if sg, sok, serr := TargetOf(slim(p, sel), "node-1", sel); sok != ok || fmt.Sprint(serr) != fmt.Sprint(err) || ok && !sg.Equal(got) {
		t.Fatalf("slim: %+v, %v, %v; the pod whole: %+v, %v, %v", sg, sok, serr, got, ok, err)
	}
	// Under negative selectors too (a shard's "the rest": a pod they
	// exclude, slimmed of every label, matched them, and was warned of
	// at each change as asking to be scraped with no workload).
	for _, other := range []string{"!pulse.io/shard", "pulse.io/shard notin (a)", "pulse.io/shard!=a,kaito.sh/workspace"} {
		osel, perr := ParseSelector(other)
		if perr != nil {
			t.Fatal(perr)
		}
		for _, shard := range []string{"", "a"} {
			q := p.DeepCopy()
			if shard != "" {
				q.Labels = map[string]string{"pulse.io/shard": shard}
				maps.Copy(q.Labels, p.Labels)
			}
			wg, wok, werr := TargetOf(q, "node-1", osel)
			if sg, sok, serr := TargetOf(slim(q, osel), "node-1", osel); sok != wok || fmt.Sprint(serr) != fmt.Sprint(werr) || wok && !sg.Equal(wg) {
				t.Fatalf("%s, shard %q: slim: %+v, %v, %v; the pod whole: %+v, %v, %v", other, shard, sg, sok, serr, wg, wok, werr)
			}
		}
	}
	if !ok {
		return
	}
	if got.URL != tc.want.URL || got.Ready != tc.want.Ready || got.Terminating != tc.want.Terminating {
		t.Fatalf("got %+v, want URL %q ready %v terminating %v", got, tc.want.URL, tc.want.Ready, tc.want.Terminating)
	}
	if tc.want.UID != "" && !got.Equal(tc.want) {
		t.Fatalf("got %+v, want %+v", got, tc.want)
	}
}

// TestATargetSaysWhenItsPodStarted: a pod's creation and, while Ready,
// its Ready condition's transition are listed with it (the planner's lead
// time is a replica's startup from them); a pod not Ready has no ready
// time, whatever its condition's transition.
func TestATargetSaysWhenItsPodStarted(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	created, ready := time.Unix(1_700_000_000, 0), time.Unix(1_700_000_215, 0)
	p := kaitoPod("p", "node-1", true)
	p.CreationTimestamp = metav1.NewTime(created)
	p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(ready)
	got, ok, err := TargetOf(p, "node-1", sel)
	if err != nil || !ok || !got.Created.Equal(created) || !got.ReadySince.Equal(ready) {
		t.Fatalf("got %+v (%v, %v): want created %s, ready since %s", got, ok, err, created, ready)
	}
	// The Ready condition's time is the node's clock, the creation the API
	// server's: on a node behind by 2 s, a pod ready within a second was
	// ready before it was created, an entry the aggregator refuses. It is
	// ready since its creation.
	p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(created.Add(-2 * time.Second))
	if got, _, _ = TargetOf(p, "node-1", sel); !got.ReadySince.Equal(created) {
		t.Fatalf("ready 2 s before created: ready since %s, want its creation %s", got.ReadySince, created)
	}
	p.Status.Conditions[0].Status = corev1.ConditionFalse
	if got, _, _ = TargetOf(p, "node-1", sel); got.Ready || !got.ReadySince.IsZero() || !got.Created.Equal(created) {
		t.Fatalf("not ready: %+v, want its creation and no ready time", got)
	}
}

// TestTheCacheHoldsOnlyWhatDiscoveryReads: the pod informer held every pod
// of the node whole: a tenant's pods that pulse never looks at, or that
// have finished, with 250 KiB of annotations and a 1 MiB variable each,
// held 125 MiB of an agent limited to 128 Mi. It holds what discovery
// reads: of such pods their identity, node, phase and times.
func TestTheCacheHoldsOnlyWhatDiscoveryReads(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	heavy := func(p *corev1.Pod) *corev1.Pod {
		p.Annotations = map[string]string{"big": strings.Repeat("x", 250<<10), AnnotationPort: "8000"}
		p.Labels["other"] = "x"
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("y", 1<<20)}}
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8000}}
		return p
	}
	unselected := heavy(kaitoPod("u", "node-1", true))
	delete(unselected.Labels, LabelWorkspace)
	finished := heavy(kaitoPod("f", "node-1", false))
	finished.Status.Phase = corev1.PodFailed
	for _, p := range []*corev1.Pod{unselected, finished} {
		s := slim(p, sel)
		if s.Labels != nil || s.Annotations != nil || s.Spec.Containers != nil || s.Name != p.Name || s.UID != p.UID || s.Status.Phase != p.Status.Phase || s.Spec.NodeName != "node-1" {
			t.Fatalf("%s: slim kept %+v", p.Name, s)
		}
	}
	served := heavy(kaitoPod("s", "node-1", true))
	s := slim(served, sel)
	if len(s.Annotations) != 1 || s.Annotations[AnnotationPort] != "8000" || len(s.Labels) != 1 || s.Labels[LabelWorkspace] != "llama" ||
		len(s.Spec.Containers) != 1 || s.Spec.Containers[0].Env != nil || s.Spec.Containers[0].Ports[0].ContainerPort != 8000 {
		t.Fatalf("a pod pulse scrapes: slim kept %+v", s)
	}
}

func TestWorkloads(t *testing.T) {
	ctrl := true
	owner := func(kind, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &ctrl}}
	}
	tests := map[string]struct {
		labels      map[string]string
		annotations map[string]string
		owners      []metav1.OwnerReference
		want        []Workload
	}{
		"workspace and its inference set": {
			labels: map[string]string{LabelWorkspace: "llama-0", LabelInferenceSet: "llama"},
			want:   []Workload{{pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, "llama-0"}, {pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET, "llama"}},
		},
		"deployment from its replica set": {
			labels: map[string]string{labelTemplateHash: "7d9f8c6b5"},
			owners: owner("ReplicaSet", "phi-serving-7d9f8c6b5"),
			want:   []Workload{{pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, "phi-serving"}},
		},
		"bare replica set": {owners: owner("ReplicaSet", "rs-abc")},
		"statefulset":      {owners: owner("StatefulSet", "llama"), want: []Workload{{pulsev1.WorkloadKind_WORKLOAD_KIND_STATEFUL_SET, "llama"}}},
		"leader worker set": {
			labels: map[string]string{LabelLWSName: "big"}, owners: owner("StatefulSet", "big-0"),
			want: []Workload{{pulsev1.WorkloadKind_WORKLOAD_KIND_LEADER_WORKER_SET, "big"}},
		},
		"override by annotation": {
			labels: map[string]string{LabelWorkspace: "llama"}, annotations: map[string]string{KeyWorkload: "gateway"},
			want: []Workload{{pulsev1.WorkloadKind_WORKLOAD_KIND_CUSTOM, "gateway"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels, Annotations: tc.annotations, OwnerReferences: tc.owners}}
			got := Workloads(p)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// recorder keeps the last target set a Kube reported.
type recorder struct {
	mu   sync.Mutex
	last []Target
	n    int
}

func (r *recorder) set(ts []Target) { r.mu.Lock(); r.last, r.n = ts, r.n+1; r.mu.Unlock() }
func (r *recorder) get() []Target   { r.mu.Lock(); defer r.mu.Unlock(); return r.last }

func waitFor(t *testing.T, what string, r *recorder, check func([]Target) error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = check(r.get()); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

func TestKubeFollowsThePodsOfItsNode(t *testing.T) {
	client := fake.NewClientset(kaitoPod("a", "node-1", false), kaitoPod("other", "node-2", true))
	sel, _ := ParseSelector(DefaultSelector)
	rec := &recorder{}
	k := NewKube(KubeOptions{Pods: fakenode.NodePods(client, "node-1"), Node: "node-1", Selector: sel, OnChange: rec.set,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	pods := client.CoreV1().Pods("ns")
	names := func(ts []Target) string {
		s := ""
		for _, t := range ts {
			s += fmt.Sprintf("%s:%v,", t.Pod, t.Ready)
		}
		return s
	}
	expect := func(what, want string) {
		t.Helper()
		waitFor(t, what, rec, func(ts []Target) error {
			if got := names(ts); got != want {
				return fmt.Errorf("targets %q, want %q", got, want)
			}
			return nil
		})
	}
	expect("initial: a listed, not ready; the other node's pod never", "a:false,")

	a := kaitoPod("a", "node-1", true)
	if _, err := pods.UpdateStatus(context.Background(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a made ready", "a:true,")

	nb := kaitoPod("b", "node-1", true)
	nb.Status.PodIP = "10.0.0.8"
	if _, err := pods.Create(context.Background(), nb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("b added", "a:true,b:true,")

	a.Labels = map[string]string{LabelWorkspace: "phi"}
	if _, err := pods.Update(context.Background(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a relabelled", rec, func(ts []Target) error {
		if len(ts) == 0 || ts[0].Workloads[0].Name != "phi" {
			return fmt.Errorf("targets %+v", ts)
		}
		return nil
	})

	b := kaitoPod("b", "node-2", true) // b moves to another node
	if _, err := pods.Update(context.Background(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("b moved away", "a:true,")

	if err := pods.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a deleted", "")
}

// listedKube is node-1's discovery over the pods of idx (no informer),
// logging to logs.
func listedKube() (*Kube, cache.Indexer, *syncbuf.Buffer) {
	logs := new(syncbuf.Buffer)
	sel, _ := ParseSelector(DefaultSelector)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	k := NewKube(KubeOptions{Node: "node-1", Selector: sel, Log: slog.New(slog.NewTextHandler(logs, nil))})
	k.lister = listersv1.NewPodLister(idx)
	return k, idx, logs
}

// TestABadPodIsLoggedOnceAState: the targets are listed again at every pod
// event of the node, and a pod not scraped was logged at each (a
// crash-looping neighbour flooded the log): it is logged when its error is
// new or changes.
func TestABadPodIsLoggedOnceAState(t *testing.T) {
	k, idx, logs := listedKube()
	bad := kaitoPod("bad", "node-1", true)
	bad.Annotations, bad.Status.PodIP = map[string]string{AnnotationPort: "http"}, "10.0.0.8"
	for _, p := range []*corev1.Pod{kaitoPod("good", "node-1", true), bad} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if ts := k.Targets(); len(ts) != 1 {
			t.Fatalf("targets %+v, want the good pod", ts)
		}
	}
	if n := strings.Count(logs.String(), "pod not scraped"); n != 1 {
		t.Fatalf("the bad pod logged %d times over five listings, want once:\n%s", n, logs.String())
	}
	bad = bad.DeepCopy()
	bad.Annotations[AnnotationPort] = "99999"
	if err := idx.Update(bad); err != nil {
		t.Fatal(err)
	}
	k.Targets()
	k.Targets()
	if n := strings.Count(logs.String(), "pod not scraped"); n != 2 {
		t.Fatalf("the bad pod with another error logged %d times in all, want twice", n)
	}
}

// TestTheCacheBoundsAScrapedPod: slim kept a scraped pod's every port,
// owner and pulse.io/ annotation, though discovery reads a few: a tenant's
// pod annotated pulse.io/scrape with 60,000 ports and 200 KiB of
// pulse.io/pad-N annotations kept 1.18 MiB, and 40 of them held 138 MiB of
// an agent limited to 128 Mi. It keeps the ports portOf and declares read,
// the owners that give a workload, the annotations discovery reads, and
// the Ready condition; the pod's target is the same.
func TestTheCacheBoundsAScrapedPod(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	p := kaitoPod("heavy", "node-1", true)
	p.Spec.HostNetwork = true
	p.Labels[labelTemplateHash] = "abc"
	p.Annotations = map[string]string{AnnotationScrape: "true", AnnotationPort: "9000"}
	for j := range 200 {
		p.Annotations[fmt.Sprintf("pulse.io/pad-%d", j)] = strings.Repeat("x", 1<<10)
	}
	for port := int32(1); port <= 60000; port++ {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	for i := range 1000 {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "ReplicaSet", Name: fmt.Sprint("old-", i)})
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodConditionType(fmt.Sprint("gate-", i)), Status: corev1.ConditionTrue})
	}
	p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "ReplicaSet", Name: "llama-abc"})
	// 5,000 containers running, each a status (the cache kept one a
	// container); not ready since after the last started.
	for i := range 5000 {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: fmt.Sprint("c-", i), Image: strings.Repeat("i", 100),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Unix(1_700_000_000+int64(i), 0))}}})
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].Status, p.Status.Conditions[i].LastTransitionTime = corev1.ConditionFalse, metav1.NewTime(time.Unix(1_700_010_000, 0))
		}
	}
	want, ok, err := TargetOf(p, "node-1", sel)
	if !ok || err != nil || want.UnreadySince.IsZero() {
		t.Fatalf("the pod's target: %v, %v, unready since %s", ok, err, want.UnreadySince)
	}
	s := slim(p, sel)
	if size := s.Size(); size > 2<<10 {
		t.Errorf("slim kept %d bytes of a pod discovery reads a port, a workload and a condition of (%d ports, %d annotations, %d owners, %d conditions)",
			size, len(s.Spec.Containers[0].Ports), len(s.Annotations), len(s.OwnerReferences), len(s.Status.Conditions))
	}
	if got, ok, err := TargetOf(s, "node-1", sel); !ok || err != nil || !got.Equal(want) {
		t.Fatalf("the slimmed pod's target %+v (%v, %v), want %+v", got, ok, err, want)
	}
	if fmt.Sprint(Workloads(s)) != fmt.Sprint(Workloads(p)) {
		t.Fatalf("the slimmed pod's workloads %v, want %v", Workloads(s), Workloads(p))
	}
}

// TestClaimsMetaClaimsWhatThePodClaims: ClaimsMeta kept a pod's first 16
// owner references of the kinds Workloads reads, many of which give no
// workload (a ReplicaSet not of the pod's template hash), so a workload
// the 17th gave was missing from the cached claims, and each listing of
// the pod cost an API lookup from the budget every stream shares.
func TestClaimsMetaClaimsWhatThePodClaims(t *testing.T) {
	p := kaitoPod("p", "node-1", true)
	p.Labels = map[string]string{labelTemplateHash: "abc"}
	for i := range 16 {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "ReplicaSet", Name: fmt.Sprintf("old-%d", i)})
	}
	p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "StatefulSet", Name: "llama"})
	want := Claims(p)
	if got := Claims(&corev1.Pod{ObjectMeta: ClaimsMeta(p)}); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
		t.Fatalf("Claims of ClaimsMeta = %v, of the pod %v", got, want)
	}
}

// TestSlimBoundsWhatATenantWrites: the values of the annotations pulse
// reads and the owners' names are unbounded in the API (an owner's name
// is only required to be there): the cache kept them whole, 1.3 MB for a
// pod of 16 owners of 80 KiB, and a 256 KiB path escaped to a URL of
// 768 KB, scraped every second. slim keeps each past its bound by a byte
// at most, and the pod is refused naming it, as the whole pod is.
func TestSlimBoundsWhatATenantWrites(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	for name, mutate := range map[string]func(p *corev1.Pod){
		"a path of 256 KiB": func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationPath: "/" + strings.Repeat(" ", 256<<10)}
		},
		"16 owners of 80 KiB": func(p *corev1.Pod) {
			for i := range 16 {
				p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: "LeaderWorkerSet", APIVersion: "x.example/v1",
					Name: fmt.Sprint(i, "-", strings.Repeat("n", 80<<10))})
			}
		},
		"a router's label value of 64 KiB": func(p *corev1.Pod) {
			p.Labels = nil
			p.Annotations = map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "llama=" + strings.Repeat("v", 64<<10)}
		},
	} {
		p := kaitoPod("p", "node-1", true)
		mutate(p)
		_, full := TargetsOf(p, "node-1", sel)
		s := slim(p, sel)
		if size := s.Size(); size > 40<<10 {
			t.Errorf("%s: slim kept %d bytes", name, size)
		}
		_, err := TargetsOf(s, "node-1", sel)
		if full == nil || err == nil || fmt.Sprint(err) != fmt.Sprint(full) {
			t.Errorf("%s: the pod %v, slimmed %v; want it refused, the same either way", name, full, err)
		}
	}
}

// TestATargetSaysWhenItsPodLostItsReadiness: a pod not Ready is listed
// with when it lost its readiness when it was Ready since its containers
// last started (its Ready condition went false after every container had
// started: a failed probe), and with none when it is starting (the
// kubelet writes the condition false before it starts the containers) or
// a container is not running (restarting: loading its model again). The
// aggregator, restarted, had only "not ready" and took a replica failing
// its probe for one starting: capacity coming. What the informer's cache
// keeps of a pod (slim) is enough to tell.
func TestATargetSaysWhenItsPodLostItsReadiness(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	created := time.Unix(1_700_000_000, 0)
	at := func(s int) metav1.Time { return metav1.NewTime(created.Add(time.Duration(s) * time.Second)) }
	running := func(s int) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "vllm", Image: "vllm", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(s)}}}
	}
	for _, c := range []struct {
		name       string
		ready      bool
		transition int
		containers []corev1.ContainerStatus
		want       int // seconds after creation; -1: none
	}{
		{"starting: the condition false before the container started", false, 2, []corev1.ContainerStatus{running(30)}, -1},
		{"starting: both within one second", false, 30, []corev1.ContainerStatus{running(30)}, -1},
		{"served, then failed its probe", false, 3600, []corev1.ContainerStatus{running(30)}, 3600},
		{"a sidecar started after the condition went false", false, 3600, []corev1.ContainerStatus{running(30), running(3700)}, -1},
		{"its container restarting", false, 3600, []corev1.ContainerStatus{{Name: "vllm", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}, -1},
		{"no container status yet", false, 3600, nil, -1},
		{"ready", true, 300, []corev1.ContainerStatus{running(30)}, -1},
	} {
		p := kaitoPod("p", "node-1", c.ready)
		p.CreationTimestamp = metav1.NewTime(created)
		p.Status.Conditions[0].LastTransitionTime = at(c.transition)
		p.Status.ContainerStatuses = c.containers
		got, ok, err := TargetOf(slim(p, sel), "node-1", sel)
		if err != nil || !ok {
			t.Fatalf("%s: %v, %v", c.name, ok, err)
		}
		want := time.Time{}
		if c.want >= 0 {
			want = at(c.want).Time
		}
		if !got.UnreadySince.Equal(want) {
			t.Errorf("%s: unready since %s, want %s", c.name, got.UnreadySince, want)
		}
	}
}

// TestTheCachesKeepCopiesOfWhatTheyCut: slim (the agent's cache of its
// node's pods) and ClaimsMeta (the aggregator's of every pod) cut a
// tenant's annotations to their bounds, and kept the cut as a part of the
// value, which kept the whole value alive: a 240 KiB pulse.io/path cut to
// 1 KiB held 256 KB a pod (a tenant's 250 pods, 64 MiB of the agent's
// 128Mi), and a 240 KiB pulse.io/workload, or a demand list of one name
// padded to 240 KiB, as much in every aggregator replica. What they keep
// shares no memory with the pod they read.
func TestTheCachesKeepCopiesOfWhatTheyCut(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	big := func(s string) string { return strings.Repeat(s, 240<<10) }
	// within: kept lies in orig's bytes.
	within := func(kept, orig string) bool {
		if kept == "" || orig == "" {
			return false
		}
		k, o := uintptr(unsafe.Pointer(unsafe.StringData(kept))), uintptr(unsafe.Pointer(unsafe.StringData(orig))) //nolint:gosec // G103: the strings' addresses, compared, never written
		return k >= o && k < o+uintptr(len(orig))
	}
	for name, c := range map[string]struct {
		ann  map[string]string
		keep func(*corev1.Pod) map[string]string
	}{
		"slim, a path": {map[string]string{AnnotationScrape: "true", AnnotationPath: "/" + big("x")},
			func(p *corev1.Pod) map[string]string { return slim(p, sel).Annotations }},
		"slim, a workload": {map[string]string{KeyWorkload: big("w")},
			func(p *corev1.Pod) map[string]string { return slim(p, sel).Annotations }},
		"ClaimsMeta, a workload": {map[string]string{KeyWorkload: big("w")},
			func(p *corev1.Pod) map[string]string { return ClaimsMeta(p).Annotations }},
		"ClaimsMeta, a demand kind": {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "llama", AnnotationDemandKind: big("k")},
			func(p *corev1.Pod) map[string]string { return ClaimsMeta(p).Annotations }},
		"ClaimsMeta, one demand workload padded": {map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: big(" ") + "llama"},
			func(p *corev1.Pod) map[string]string { return ClaimsMeta(p).Annotations }},
	} {
		p := kaitoPod("p", "node-1", true)
		p.Annotations = c.ann
		kept := c.keep(p)
		if len(kept) == 0 {
			t.Errorf("%s: nothing kept", name)
		}
		for k, v := range kept {
			for ok, ov := range c.ann {
				if within(v, ov) {
					t.Errorf("%s: %s (%d bytes) is a part of %s's value (%d bytes), which it keeps whole", name, k, len(v), ok, len(ov))
				}
			}
		}
	}
}

// TestTwoPodsReadyAtOneAddressAreNotScraped: a pod whose status still
// showed an address the network had given since to another namespace's
// new pod was scraped at it, as that pod was: one server's page read as
// both, each attributed to the other's workload too. Pods ready at one
// address (host and port) are listed, not ready, until one is gone; a
// hostNetwork pair on the node's address at two ports is scraped.
func TestTwoPodsReadyAtOneAddressAreNotScraped(t *testing.T) {
	k, idx, logs := listedKube()
	a, b := kaitoPod("a", "node-1", true), kaitoPod("b", "node-1", true)
	b.Namespace, b.UID = "tenant-b", "uid-b"
	h1, h2 := kaitoPod("h1", "node-1", true), kaitoPod("h2", "node-1", true)
	for i, h := range []*corev1.Pod{h1, h2} {
		h.Spec.HostNetwork, h.Status.PodIP = true, "192.168.1.5"
		h.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: int32(5000 + i), Protocol: corev1.ProtocolTCP}}
		h.Annotations = map[string]string{AnnotationPort: strconv.Itoa(5000 + i)}
	}
	for _, p := range []*corev1.Pod{a, b, h1, h2} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	ready := func() string {
		var s []string
		for _, tg := range k.Targets() {
			s = append(s, fmt.Sprintf("%s:%v", tg.Pod, tg.Ready))
		}
		return strings.Join(s, ",")
	}
	if got := ready(); got != "a:false,b:false,h1:true,h2:true" {
		t.Fatalf("two namespaces' pods at 10.0.0.7:5000: %s; want both listed not ready, the host network's two ports scraped", got)
	}
	ready()
	if n := strings.Count(logs.String(), "are at one address"); n != 2 {
		t.Fatalf("logged %d times over two listings, want once a pod:\n%s", n, logs.String())
	}
	if err := idx.Delete(b); err != nil {
		t.Fatal(err)
	}
	if got := ready(); got != "a:true,h1:true,h2:true" {
		t.Fatalf("b gone: %s; want a scraped again", got)
	}
}

// TestAPodIPAnotherPodHasIsNotScrapedAtAnyPort: the check of pods ready
// at one address compared host and port, so another tenant's new pod
// given a's IP before a's status caught up escaped it by naming another
// port (pulse.io/port), or by not being scraped at all (its IP was not
// kept): a's target then read b's network. A target on its pod's own
// network is not scraped while a live pod of another namespace on the
// node has its IP.
func TestAPodIPAnotherPodHasIsNotScrapedAtAnyPort(t *testing.T) {
	sel, _ := ParseSelector(DefaultSelector)
	for _, c := range []struct {
		name string
		b    func(*corev1.Pod)
		want string
	}{
		{"another port", func(b *corev1.Pod) { b.Annotations = map[string]string{AnnotationPort: "5001"} }, "a:false,b:false"},
		{"not scraped", func(b *corev1.Pod) { b.Labels = map[string]string{"app": "web"} }, "a:false"},
		{"finished", func(b *corev1.Pod) { b.Labels, b.Status.Phase = map[string]string{"app": "web"}, corev1.PodSucceeded }, "a:true"},
		{"another node's", func(b *corev1.Pod) { b.Labels, b.Spec.NodeName = map[string]string{"app": "web"}, "node-2" }, "a:true"},
		// One tenant's pods at one IP are held to host and port (the
		// tests' pods share the loopback).
		{"the same namespace's, at another port", func(b *corev1.Pod) {
			b.Namespace, b.Annotations = "ns", map[string]string{AnnotationPort: "5001"}
		}, "a:true,b:true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			k, idx, _ := listedKube()
			a, b := kaitoPod("a", "node-1", true), kaitoPod("b", "node-1", true)
			b.Namespace, b.UID = "tenant-b", "uid-b"
			c.b(b)
			for _, p := range []*corev1.Pod{a, b} {
				if err := idx.Add(slim(p, sel)); err != nil { // as the informer keeps it
					t.Fatal(err)
				}
			}
			var got []string
			for _, tg := range k.Targets() {
				got = append(got, fmt.Sprintf("%s:%v", tg.Pod, tg.Ready))
			}
			if strings.Join(got, ",") != c.want {
				t.Fatalf("a at 10.0.0.7, tenant-b's b there too (%s): %v; want %s", c.name, got, c.want)
			}
		})
	}
}

// TestOnlyChangedPodsAreMadeAgain: every pod event of the node made every
// pod's targets again (a router's every workload's entries), so a tenant
// patching its pod in a loop kept the agent's core busy. A pod's targets
// are made again only when its resourceVersion moves, and forgotten with
// it.
func TestOnlyChangedPodsAreMadeAgain(t *testing.T) {
	k, idx, _ := listedKube()
	for i := range 50 {
		p := kaitoPod(fmt.Sprintf("p%d", i), "node-1", true)
		p.ResourceVersion, p.Status.PodIP = "1", fmt.Sprintf("10.0.1.%d", i)
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if ts := k.Targets(); len(ts) != 50 || k.computed != 50 {
		t.Fatalf("%d targets, %d made; want 50 and 50", len(ts), k.computed)
	}
	p := kaitoPod("p7", "node-1", true)
	p.ResourceVersion, p.Status.PodIP, p.Labels[LabelWorkspace] = "2", "10.0.1.7", "phi"
	if err := idx.Update(p); err != nil {
		t.Fatal(err)
	}
	ts := k.Targets()
	if k.computed != 51 {
		t.Fatalf("one pod changed: %d made in all, want 51", k.computed)
	}
	for _, tg := range ts {
		if tg.Pod == "p7" && tg.Workloads[0].Name != "phi" {
			t.Fatalf("p7's target after its change: %+v", tg)
		}
	}
	if err := idx.Delete(p); err != nil {
		t.Fatal(err)
	}
	if ts := k.Targets(); len(ts) != 49 || len(k.made) != 49 || k.computed != 51 {
		t.Fatalf("p7 gone: %d targets, %d kept, %d made; want 49, 49, 51", len(ts), len(k.made), k.computed)
	}
}

// BenchmarkTargetsAtAPodEvent: what the agent does at each pod event of
// its node (Kube.Run lists the targets again): 110 pods (the kubelet's
// default --max-pods), each at its own IP, one of them changed.
func BenchmarkTargetsAtAPodEvent(b *testing.B) {
	k, idx, _ := listedKube()
	pods := make([]*corev1.Pod, 110)
	for i := range pods {
		p := kaitoPod(fmt.Sprintf("p%d", i), "node-1", true)
		p.ResourceVersion, p.Status.PodIP = "1", fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		if err := idx.Add(p); err != nil {
			b.Fatal(err)
		}
		pods[i] = p
	}
	if ts := k.Targets(); len(ts) != len(pods) {
		b.Fatalf("%d targets, want %d", len(ts), len(pods))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p := pods[i%len(pods)].DeepCopy()
		p.ResourceVersion = strconv.Itoa(i + 2)
		if err := idx.Update(p); err != nil {
			b.Fatal(err)
		}
		if ts := k.Targets(); len(ts) != len(pods) {
			b.Fatalf("%d targets, want %d", len(ts), len(pods))
		}
	}
}

// routersOnNode adds n routers of 64 workloads each, each at its own IP,
// to idx (as the informer keeps them), and returns them.
func routersOnNode(t testing.TB, idx interface{ Add(any) error }, n int) []*corev1.Pod {
	t.Helper()
	names := make([]string, MaxDemandWorkloads)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	sel, _ := ParseSelector(DefaultSelector)
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		p := routerPod(map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: strings.Join(names, ",")})
		p.Name, p.UID = fmt.Sprintf("r%d", i), types.UID(fmt.Sprintf("u%d", i))
		p.ResourceVersion, p.Status.PodIP = "1", fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		if err := idx.Add(slim(p, sel)); err != nil {
			t.Fatal(err)
		}
		pods[i] = p
	}
	return pods
}

// TestAPodEventDoesNoWorkAnEntry: the targets of a pod are made again only
// when it changes (TestOnlyChangedPodsAreMadeAgain), since a tenant
// patching its pod in a loop kept a core busy on a node of 110 routers of
// 64 workloads. What each event still did once an entry of every pod of
// the node (7,040 here): the list grown from room for one a pod, copied a
// dozen times, and each entry's URL parsed again and looked up, though a
// router's 64 share one.
func TestAPodEventDoesNoWorkAnEntry(t *testing.T) {
	k, idx, _ := listedKube()
	pods := routersOnNode(t, idx, 110)
	want := len(pods) * MaxDemandWorkloads
	if ts := k.Targets(); len(ts) != want {
		t.Fatalf("%d targets, want %d", len(ts), want)
	}
	sel, _ := ParseSelector(DefaultSelector)
	i := 0
	allocs := testing.AllocsPerRun(20, func() {
		i++
		p := pods[i%len(pods)].DeepCopy()
		p.ResourceVersion = strconv.Itoa(i + 1)
		if err := idx.Update(slim(p, sel)); err != nil {
			t.Fatal(err)
		}
		if ts := k.Targets(); len(ts) != want {
			t.Fatalf("%d targets, want %d", len(ts), want)
		}
	})
	if allocs > 1000 {
		t.Fatalf("%.0f allocations an event of one router, on a node of %d routers' %d entries; want some a pod, not one an entry", allocs, len(pods), want)
	}
}

// TestARouterAtASharedAddressIsLoggedOnce: a pod at an address another
// namespace's pod has is warned of once
// (TestTwoPodsReadyAtOneAddressAreNotScraped); a router was warned of once
// for each workload it names, 64 lines at each change.
func TestARouterAtASharedAddressIsLoggedOnce(t *testing.T) {
	k, idx, logs := listedKube()
	names := make([]string, MaxDemandWorkloads)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	r := routerPod(map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: strings.Join(names, ",")})
	b := kaitoPod("b", "node-1", true)
	b.Namespace, b.UID, b.Status.PodIP = "tenant-b", "uid-b", r.Status.PodIP
	for _, p := range []*corev1.Pod{r, b} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tg := range k.Targets() {
		if tg.Ready {
			t.Fatalf("%s ready at a shared address", tg.UID)
		}
	}
	if n := strings.Count(logs.String(), "are at one address"); n != 2 {
		t.Fatalf("logged %d times for a router and a pod at one address, want once each", n)
	}
}

// TestAnEmptyDemandSourceIsUnset: an empty pulse.io/demand-source is unset,
// as every annotation pulse reads (a Helm template rendering nothing): a
// model server so annotated was a demand source refused ("want epp,
// production-stack or custom"), its page not read. Its claims are its
// own, on the cached metadata too; a router's stay a router's.
func TestAnEmptyDemandSourceIsUnset(t *testing.T) {
	k, idx, logs := listedKube()
	p := kaitoPod("p", "node-1", true)
	p.Annotations = map[string]string{AnnotationDemandSource: ""}
	if err := idx.Add(p); err != nil {
		t.Fatal(err)
	}
	ts := k.Targets()
	if len(ts) != 1 || !ts[0].Ready || fmt.Sprint(ts[0].Workloads) != fmt.Sprint(Claims(p)["uid-p"]) || len(ts[0].Workloads) == 0 {
		t.Fatalf("targets %+v, log %q; want the pod's own page, its workload", ts, logs.String())
	}
	router := routerPod(map[string]string{AnnotationDemandSource: "epp", AnnotationDemandWorkloads: "llama"})
	for _, pod := range []*corev1.Pod{p, router} {
		want := Claims(pod)
		if got := Claims(&corev1.Pod{ObjectMeta: ClaimsMeta(pod)}); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
			t.Errorf("%s: Claims of ClaimsMeta = %v, of the pod %v", pod.Name, got, want)
		}
	}
}
