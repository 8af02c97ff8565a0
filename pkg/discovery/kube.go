package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Labels and annotations pulse reads from pods.
const (
	// AnnotationScrape "true" adds a pod the selector does not match;
	// "false" leaves out a pod it does.
	AnnotationScrape = "pulse.io/scrape"
	// AnnotationPort, AnnotationPath and AnnotationScheme place the page.
	AnnotationPort   = "pulse.io/port"
	AnnotationPath   = "pulse.io/path"
	AnnotationScheme = "pulse.io/scheme"
	// KeyWorkload, as a label or an annotation, names the one workload the
	// pod is reported under, instead of the ones found from its labels and
	// owners.
	KeyWorkload = "pulse.io/workload"

	LabelWorkspace    = "kaito.sh/workspace"
	LabelInferenceSet = "inferenceset.kaito.sh/created-by"
	LabelLWSName      = "leaderworkerset.sigs.k8s.io/name"
	labelTemplateHash = "pod-template-hash"

	// DefaultPort is Kaito's vLLM port, used when a pod names none.
	DefaultPort = 5000
	// DefaultSelector picks Kaito's inference pods.
	DefaultSelector = LabelWorkspace
)

// KubeOptions configure node-local discovery.
type KubeOptions struct {
	// Pods lists and watches the node's pods (see NodePods).
	Pods     cache.ListerWatcher
	Node     string
	Selector labels.Selector
	// OnChange receives the full set of targets whenever it changes.
	OnChange func([]Target)
	Log      *slog.Logger
}

// Kube watches the pods of one node through an informer whose list and
// watch carry a field selector (NodePods): the API server sends this agent
// only its own node's pods that have not finished.
type Kube struct {
	opts    KubeOptions
	lister  listersv1.PodLister
	changed chan struct{}

	mu     sync.Mutex
	warned map[string]string // the error each pod not scraped was last logged with, by uid
	// made: each pod's targets (or why it has none) as of its
	// resourceVersion, by uid: a pod event made every pod's again (a
	// router's every workload's entries, before --max-pods cut them), so a
	// tenant patching its pod in a loop kept a core busy (110 routers of
	// 64 workloads: 10.6 ms and 12.6 MB an event). computed counts the
	// pods whose targets were made (tests read it).
	made     map[string]madeTargets
	computed int
	// listed: the pod informer has synced; listErr: the last error of its
	// list or watch (a string), for Listed.
	listed  atomic.Bool
	listErr atomic.Value
}

// Listed says whether the node's pods have been listed, and if not, the
// last error of the list (""; none yet): an agent whose ServiceAccount may
// not list pods, or whose egress to the API server is blocked, said only
// that no aggregator was connected (no stream opens before the first
// list), and the operator looked at the aggregator.
func (k *Kube) Listed() (bool, string) {
	if k.listed.Load() {
		return true, ""
	}
	why, _ := k.listErr.Load().(string)
	return false, why
}

// madeTargets are a pod's targets, or its error, at a resourceVersion.
type madeTargets struct {
	rv  string
	ts  []Target
	err error
}

// NewKube returns node-local discovery.
func NewKube(o KubeOptions) *Kube {
	return &Kube{opts: o, changed: make(chan struct{}, 1)}
}

// Run watches until ctx ends.
func (k *Kube) Run(ctx context.Context) error {
	inf := cache.NewSharedIndexInformer(k.opts.Pods, &corev1.Pod{}, 0, cache.Indexers{})
	if err := inf.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return slim(p, k.opts.Selector), nil
		}
		return obj, nil
	}); err != nil {
		return fmt.Errorf("set pod transform: %w", err)
	}
	poke := func(any) {
		select {
		case k.changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke,
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		k.listErr.Store(err.Error())
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	k.lister = listersv1.NewPodLister(inf.GetIndexer())
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	k.listed.Store(true)
	k.opts.Log.Info("pod informer synced", logging.KeyNode, k.opts.Node, logging.KeySelector, k.opts.Selector.String())
	var last []Target
	for first := true; ; first = false {
		ts := k.Targets()
		if first || !equalTargets(ts, last) {
			k.opts.OnChange(ts)
			last = ts
		}
		select {
		case <-ctx.Done():
			return nil
		case <-k.changed:
		}
	}
}

// Targets returns the targets of the pods in the cache, sorted by uid.
func (k *Kube) Targets() []Target {
	pods, err := k.lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	bad := make(map[string]string)
	made := make(map[string]madeTargets, len(pods))
	n := 0
	for _, p := range pods {
		m, ok := k.made[string(p.UID)]
		if !ok || m.rv != p.ResourceVersion || p.ResourceVersion == "" {
			m.rv = p.ResourceVersion
			m.ts, m.err = TargetsOf(p, k.opts.Node, k.opts.Selector)
			k.computed++
		}
		made[string(p.UID)] = m
		n += len(m.ts)
	}
	// Sized once: a router's entries are up to 64 a pod, and growing the
	// list to a node of them copied it a dozen times at every pod event.
	out := make([]Target, 0, n)
	for _, p := range pods {
		m := made[string(p.UID)]
		ts, err := m.ts, m.err
		if err != nil {
			// Logged when it is new or changes: Targets runs at every pod
			// event of the node, and a bad pod was logged at each.
			uid := string(p.UID)
			if bad[uid] = err.Error(); k.warned[uid] != bad[uid] {
				k.opts.Log.Warn("pod not scraped", logging.KeyPod, p.Namespace+"/"+p.Name, logging.KeyErr, err)
			}
			continue
		}
		out = append(out, ts...)
	}
	for i, owners := range sharedAddresses(out, ipOwners(pods, k.opts.Node)) {
		t := &out[i]
		t.Ready = false
		uid := t.PodUID()
		msg := "pods " + strings.Join(owners, ", ") + " are at one address, " + hostOf(t.URL) + " (a pod IP two live pods have, or a host and port two ready host-network pods have: an address reused before a pod's status caught up): not scraped until one is gone"
		if bad[uid] == msg {
			continue // a router's other entries: its pod is warned of once
		}
		if bad[uid] = msg; k.warned[uid] != msg {
			k.opts.Log.Warn("pod not scraped", logging.KeyPod, t.Namespace+"/"+t.Pod, logging.KeyErr, msg)
		}
	}
	k.warned, k.made = bad, made
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.UID, b.UID) })
	return out
}

// sharedAddresses are the ready targets whose address is also another
// pod's, each with the pods that share it: a target whose IP a live pod
// of another namespace has too, at any port (ips, ipOwners'), and a
// target at the host and port of another ready target. (Pods of one
// namespace at one IP, a tenant's own, are held to host and port: the
// tests' pods share the loopback.) Two pods at one address
// are one server's page read as both: an address reused (another
// namespace's new pod) before a pod's status caught up had each pod's page
// attributed to the other's workload too. Neither is scraped (listed, not
// ready) until one is gone. A pod IP was checked at its port too, so a
// tenant's new pod naming another port (pulse.io/port), or one not
// scraped at all, left the old pod's target reading its network.
func sharedAddresses(ts []Target, ips map[string]map[string]string) map[int][]string {
	// addr is a ready target's address: its IP where another tenant's pod
	// has it too, or its host and port.
	type addr struct {
		ip   bool
		host string
	}
	keys := make([]addr, len(ts))
	first := map[addr]int{}                // each address's first target
	shared := map[addr]map[string]string{} // pod uid → namespace/name, where two pods or more
	for i, t := range ts {
		if !t.Ready || t.Terminating || t.URL == "" {
			continue
		}
		// A router's entries are one after another, of one pod at one
		// URL: the first one's address is theirs (parsed and looked up
		// once a pod, not once an entry: 64 a router, at every pod event).
		if i > 0 && keys[i-1].host != "" && ts[i-1].URL == t.URL && ts[i-1].PodUID() == t.PodUID() {
			keys[i] = keys[i-1]
			continue
		}
		host := hostOf(t.URL)
		if h, _, err := net.SplitHostPort(host); err == nil && namespaces(ips[h]) > 1 {
			keys[i] = addr{ip: true, host: h} // another tenant's pod has its IP: at any port
			continue
		}
		keys[i] = addr{host: host}
		j, seen := first[keys[i]]
		switch {
		case !seen:
			first[keys[i]] = i
		case ts[j].PodUID() == t.PodUID():
		default:
			if shared[keys[i]] == nil {
				shared[keys[i]] = map[string]string{ts[j].PodUID(): ts[j].Namespace + "/" + ts[j].Pod}
			}
			shared[keys[i]][t.PodUID()] = t.Namespace + "/" + t.Pod
		}
	}
	var out map[int][]string
	for i, key := range keys {
		owners := shared[key]
		if key.ip {
			owners = ips[key.host]
		}
		if key.host == "" || len(owners) < 2 {
			continue
		}
		if out == nil {
			out = map[int][]string{}
		}
		out[i] = slices.Sorted(maps.Values(owners))
	}
	return out
}

// ipOwners is, of node's pods on their own network (not the host's), not
// finished nor being deleted, each pod IP: the pods that have it (uid →
// namespace/name) where two or more do, nil where one does. It runs at
// each pod event of the node: names are made for the shared alone.
func ipOwners(pods []*corev1.Pod, node string) map[string]map[string]string {
	live := func(p *corev1.Pod) bool {
		return p.Spec.NodeName == node && !p.Spec.HostNetwork && p.Status.PodIP != "" && p.DeletionTimestamp == nil && !finished(p)
	}
	first := make(map[string]*corev1.Pod, len(pods)) // each IP's first pod
	out := map[string]map[string]string{}
	for _, p := range pods {
		if !live(p) {
			continue
		}
		ip := p.Status.PodIP
		f, seen := first[ip]
		switch {
		case !seen:
			first[ip], out[ip] = p, nil
		case f.UID == p.UID:
		default:
			if out[ip] == nil {
				out[ip] = map[string]string{string(f.UID): f.Namespace + "/" + f.Name}
			}
			out[ip][string(p.UID)] = p.Namespace + "/" + p.Name
		}
	}
	return out
}

// namespaces is how many namespaces the pods of owners (uid →
// namespace/name) are of.
func namespaces(owners map[string]string) int {
	seen := map[string]bool{}
	for _, name := range owners {
		ns, _, _ := strings.Cut(name, "/")
		seen[ns] = true
	}
	return len(seen)
}

// finished says pod has ended: Succeeded or Failed.
func finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// hostOf is a target URL's host and port.
func hostOf(u string) string {
	if pu, err := url.Parse(u); err == nil {
		return pu.Host
	}
	return u
}

func equalTargets(a, b []Target) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// MaxWorkloadsPerPod is the most workloads one pod may belong to (the
// aggregator's limit per catalogue entry); MaxDemandWorkloads the most a
// router's pulse.io/demand-workloads may name (each is an entry of the
// node's catalogue, whose size the aggregator bounds per agent).
const (
	MaxWorkloadsPerPod = 8
	MaxDemandWorkloads = 64
)

// maxWorkloadName bounds a workload's name as Kubernetes bounds an
// object's (a DNS subdomain).
const maxWorkloadName = wire.MaxName

// checkWorkloadNames refuses a workload name an annotation gave that is not
// UTF-8, is longer than an object's name may be, or has a control or
// format character: proto3 refuses to marshal a string that is not UTF-8,
// and the catalogue that carried it would fail at every stream, silencing
// the node; a newline in a name forged a row of the debug tables under
// another namespace's name (the aggregator refuses such an entry too).
func checkWorkloadNames(ws []Workload) error {
	for _, w := range ws {
		if !wire.IsName(w.Name) || len(w.Name) > maxWorkloadName {
			return fmt.Errorf("workload name %q is not UTF-8 of at most %d bytes, of printable characters alone", wire.CleanText(w.Name, 64), maxWorkloadName)
		}
	}
	return nil
}

// slim is what discovery reads of pod, and no more: its identity, node,
// phase and times always; its IP unless it has finished (every pod's, so
// that a target whose status still shows an IP given since to another pod
// is not scraped: sharedAddresses); and only for a pod pulse looks at (the
// selector matches it, pulse.io/scrape is "true", or it is a demand
// source) and that has not finished, the labels the selector and
// Workloads read, the pulse.io/ annotations discovery reads, the owners
// Workloads reads (readOwners), the container ports portOf and declares
// read (readPorts), and its Ready condition. The cache held every pod of the node whole
// (only managed fields were dropped): a tenant's pods, finished or never
// selected, with 250 KiB of annotations and a 1 MiB variable each, held
// 125 MiB of an agent limited to 128 Mi, and every tenant of the node lost
// its signal; then a scraped pod's every port, owner and pulse.io/ key:
// 40 pods of 60,000 ports each held 138 MiB.
func slim(pod *corev1.Pod, sel labels.Selector) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName, HostNetwork: pod.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	if finished(pod) {
		return out
	}
	var ann map[string]string
	for _, k := range annotationsRead {
		if v, ok := pod.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			// Past its bound by one byte at most: still refused (placeOf),
			// and not kept whole (a 256 KiB path was kept, and escaped to
			// a URL of 768 KB scraped every second); a copy, as a cut of
			// it would keep the whole value.
			ann[k] = cut(v, annotationBound(k)+1)
		}
	}
	// The selector's labels, of a pod not looked at too: TargetOf asks the
	// selector again of what is kept, and a negative one (!key, notin)
	// matched a pod slimmed of every label, which was then warned of at
	// each change as a pod that asks to be scraped with no workload.
	keep := func(keys []string) {
		for _, k := range keys {
			if v, ok := pod.Labels[k]; ok {
				if out.Labels == nil {
					out.Labels = map[string]string{}
				}
				out.Labels[k] = v
			}
		}
	}
	var selected []string
	if reqs, ok := sel.Requirements(); ok {
		for _, r := range reqs {
			selected = append(selected, r.Key())
		}
	}
	keep(selected)
	out.Status.PodIP = pod.Status.PodIP // every pod's: sharedAddresses
	if ann[AnnotationScrape] != "true" && !IsDemandSource(ann) && !sel.Matches(labels.Set(pod.Labels)) {
		return out
	}
	keep([]string{KeyWorkload, LabelWorkspace, LabelInferenceSet, LabelLWSName, labelTemplateHash})
	out.Annotations, out.OwnerReferences = ann, readOwners(pod)
	if ports := readPorts(pod); len(ports) > 0 {
		out.Spec.Containers = []corev1.Container{{Ports: ports}}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
			break
		}
	}
	// Of its containers, what unreadySince reads: whether every one runs,
	// and the latest start; one status, however many containers (one a
	// container held a tenant's pod of thousands whole).
	if len(pod.Status.ContainerStatuses) > 0 {
		var kept corev1.ContainerStatus
		kept.State.Running = &corev1.ContainerStateRunning{}
		for _, cs := range pod.Status.ContainerStatuses {
			r := cs.State.Running
			if r == nil || r.StartedAt.IsZero() {
				kept.State.Running = nil
				break
			}
			if r.StartedAt.After(kept.State.Running.StartedAt.Time) {
				kept.State.Running.StartedAt = r.StartedAt
			}
		}
		out.Status.ContainerStatuses = []corev1.ContainerStatus{kept}
	}
	return out
}

// annotationsRead are the pulse.io/ annotations discovery reads of a pod.
var annotationsRead = []string{AnnotationScrape, AnnotationPort, AnnotationPath, AnnotationScheme, KeyWorkload,
	AnnotationDemandSource, AnnotationDemandWorkloads, AnnotationDemandKind, AnnotationDemandMetric, AnnotationDemandLabel, AnnotationDemandType}

// annotationBound is the most bytes annotation k may hold: a pod past it
// is left out, naming it.
func annotationBound(k string) int {
	switch k {
	case AnnotationDemandWorkloads:
		return MaxDemandWorkloads * (maxWorkloadName + maxDemandValue + 2)
	case AnnotationDemandMetric:
		return 4096
	}
	return 1024
}

// checkAnnotationSizes refuses a pod one of whose annotations pulse reads
// is past its bound.
func checkAnnotationSizes(ann map[string]string) error {
	for _, k := range annotationsRead {
		if v := ann[k]; len(v) > annotationBound(k) {
			return fmt.Errorf("annotation %s: over %d bytes", k, annotationBound(k))
		}
	}
	return nil
}

// PodAnnotations are the pulse.io/ annotations read of a pod (a copy).
func PodAnnotations() []string { return slices.Clone(annotationsRead) }

// readPorts are the container ports of pod that portOf and declares read,
// in the order portOf reads them: the first named metrics, the first named
// http, and the first that declares the port in use.
func readPorts(pod *corev1.Pod) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, name := range []string{"metrics", "http"} {
		if cp, ok := firstPort(pod, func(cp corev1.ContainerPort) bool { return cp.Name == name }); ok {
			out = append(out, cp)
		}
	}
	if port, err := portOf(pod); err == nil {
		if cp, ok := firstPort(pod, func(cp corev1.ContainerPort) bool { return declaresPort(cp, port) }); ok {
			out = append(out, cp)
		}
	}
	return out
}

// firstPort is the first of pod's container ports that is.
func firstPort(pod *corev1.Pod, is func(corev1.ContainerPort) bool) (corev1.ContainerPort, bool) {
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if is(cp) {
				return corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol, HostIP: cp.HostIP}, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// TargetsOf is TargetOf for any pod: a model server's one target, or a
// demand source's (pulse.io/demand-source) one per workload it fronts.
func TargetsOf(pod *corev1.Pod, node string, sel labels.Selector) ([]Target, error) {
	if IsDemandSource(pod.Annotations) {
		if pod.Spec.NodeName != node || pod.Annotations[AnnotationScrape] == "false" || finished(pod) {
			return nil, nil
		}
		base, err := placeOf(pod, Target{UID: string(pod.UID), Namespace: pod.Namespace, Pod: pod.Name})
		if err != nil {
			return nil, err
		}
		return DemandTargets(base, pod.Annotations)
	}
	t, ok, err := TargetOf(pod, node, sel)
	if !ok || err != nil {
		return nil, err
	}
	return []Target{t}, nil
}

// TargetOf decides whether pod is scraped and where. ok is false for a pod
// pulse does not look at; an error explains a pod that asks to be scraped
// but cannot be (a bad annotation).
func TargetOf(pod *corev1.Pod, node string, sel labels.Selector) (t Target, ok bool, err error) {
	// The field selector already scopes the watch; this keeps the rule
	// true whatever the cache holds.
	if pod.Spec.NodeName != node {
		return t, false, nil
	}
	switch pod.Annotations[AnnotationScrape] {
	case "false":
		return t, false, nil
	case "true":
	default:
		if !sel.Matches(labels.Set(pod.Labels)) {
			return t, false, nil
		}
	}
	if finished(pod) {
		return t, false, nil
	}
	t = Target{UID: string(pod.UID), Namespace: pod.Namespace, Pod: pod.Name}
	if t.Workloads, err = podWorkloads(pod); err != nil {
		return t, false, err
	}
	t, err = placeOf(pod, t)
	if err != nil {
		return t, false, err
	}
	return t, true, nil
}

// podWorkloads is Workloads checked as an entry of them is: at least one,
// at most MaxWorkloadsPerPod, their names valid; else why the pod alone is
// left out.
func podWorkloads(pod *corev1.Pod) ([]Workload, error) {
	ws := Workloads(pod)
	if len(ws) == 0 {
		return nil, fmt.Errorf("no workload: label it %s or %s, or give it %s", LabelWorkspace, LabelInferenceSet, KeyWorkload)
	}
	if len(ws) > MaxWorkloadsPerPod {
		// The aggregator refuses such an entry; sending it only costs the
		// stream's budget. This pod alone is left out.
		return nil, fmt.Errorf("belongs to %d workloads (labels and owner references); at most %d", len(ws), MaxWorkloadsPerPod)
	}
	if err := checkWorkloadNames(ws); err != nil {
		return nil, err
	}
	return ws, nil
}

// placeOf sets where t's page is (URL) and whether it is scraped now
// (Ready, Terminating), from the pod's annotations, ports and status.
func placeOf(pod *corev1.Pod, t Target) (Target, error) {
	if err := checkAnnotationSizes(pod.Annotations); err != nil {
		return t, err
	}
	port, err := portOf(pod)
	if err != nil {
		return t, err
	}
	// A hostNetwork pod's address is its node's, whose ports are other
	// pods' too (other tenants' hostNetwork servers): it is read only on a
	// TCP port it declares on all the node's addresses, which the
	// scheduler keeps to one pod a node (a listener no pod declares, a
	// host daemon's, is not so kept).
	if pod.Spec.HostNetwork && !declares(pod, port) {
		return t, fmt.Errorf("a hostNetwork pod is read only on a TCP port it declares (a containerPort, no hostIP); port %d is not one (its node's ports are other pods' too)", port)
	}
	scheme := pod.Annotations[AnnotationScheme]
	if scheme == "" {
		scheme = "http"
	}
	if scheme != "http" && scheme != "https" {
		return t, fmt.Errorf("annotation %s=%q: want http or https", AnnotationScheme, wire.CleanText(scheme, 64))
	}
	path := pod.Annotations[AnnotationPath]
	if path == "" {
		path = "/metrics"
	}
	if !strings.HasPrefix(path, "/") {
		return t, fmt.Errorf("annotation %s=%q: want an absolute path", AnnotationPath, wire.CleanText(path, 64))
	}
	// A hostNetwork pod's IP is its node's, which reaches its server from
	// the agent's pod; 127.0.0.1 (once used for them) is the agent's own
	// loopback, not theirs.
	host := pod.Status.PodIP
	// A terminating pod is listed as terminating, and no longer scraped.
	// Ready stays its Ready condition: a pod draining in its grace period
	// is often still Ready, and the HPA counts it so for metricType Value.
	t.Terminating = pod.DeletionTimestamp != nil
	since, ready := readySince(pod)
	t.Ready = host != "" && ready
	t.Created = pod.CreationTimestamp.Time
	if t.Ready {
		// The Ready condition's time is the node's clock, the creation
		// the API server's: on a node whose clock runs behind, a pod that
		// started fast was ready before it was created, an entry the
		// aggregator refuses, and the pod went unreported until it changed.
		t.ReadySince = since
		if !since.IsZero() && since.Before(t.Created) {
			t.ReadySince = t.Created
		}
	} else if !t.Terminating {
		// On a node whose clock runs behind, as for ReadySince: not
		// told rather than refused.
		if t.UnreadySince = unreadySince(pod); t.UnreadySince.Before(t.Created) {
			t.UnreadySince = time.Time{}
		}
	}
	if host != "" {
		t.URL = (&url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: path}).String()
	}
	return t, nil
}

// Ready is whether pod's Ready condition is true.
func Ready(pod *corev1.Pod) bool {
	_, ok := readySince(pod)
	return ok
}

// readySince is whether pod's Ready condition is true, and since when
// (its lastTransitionTime).
func readySince(pod *corev1.Pod) (time.Time, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.LastTransitionTime.Time, c.Status == corev1.ConditionTrue
		}
	}
	return time.Time{}, false
}

// unreadySince is when pod, not Ready, lost its readiness: its Ready
// condition's lastTransitionTime, when every container runs and started
// before it; zero otherwise. A pod starting (or one whose container
// restarted: loading its model again) went not ready before its
// containers started, since the kubelet writes the pod's first status, the
// Ready condition false, before it starts them; one that served became
// ready after they started, and lost it later still.
func unreadySince(pod *corev1.Pod) time.Time {
	lost, ready := readySince(pod)
	if ready || lost.IsZero() || len(pod.Status.ContainerStatuses) == 0 {
		return time.Time{}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if r := cs.State.Running; r == nil || r.StartedAt.IsZero() || !r.StartedAt.Time.Before(lost) {
			return time.Time{}
		}
	}
	return lost
}

// declares is whether one of pod's containers declares port, TCP, on all
// the node's addresses: the scheduler keeps a host's (IP, protocol, port)
// to one pod, so a UDP port or one on another address claims nothing of
// the TCP listener the page is read from.
func declares(pod *corev1.Pod, port int) bool {
	_, ok := firstPort(pod, func(cp corev1.ContainerPort) bool { return declaresPort(cp, port) })
	return ok
}

// declaresPort is whether cp declares port, TCP, on all the node's
// addresses.
func declaresPort(cp corev1.ContainerPort, port int) bool {
	return int(cp.ContainerPort) == port && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) && (cp.HostIP == "" || cp.HostIP == "0.0.0.0")
}

// portOf: annotation, else the container port named metrics, else http,
// else Kaito's 5000.
func portOf(pod *corev1.Pod) (int, error) {
	// Empty is unset, as pulse.io/path and pulse.io/scheme are (a Helm
	// template rendering nothing).
	if s := pod.Annotations[AnnotationPort]; s != "" {
		p, err := strconv.Atoi(s)
		if err != nil || p < 1 || p > 65535 {
			return 0, fmt.Errorf("annotation %s=%q: not a port number", AnnotationPort, wire.CleanText(s, 64))
		}
		return p, nil
	}
	for _, name := range []string{"metrics", "http"} {
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == name {
					return int(cp.ContainerPort), nil
				}
			}
		}
	}
	return DefaultPort, nil
}

// Workloads are the workloads a pod belongs to, all of them: its Kaito
// Workspace and InferenceSet (labels), its Deployment (its ReplicaSet owner
// less the pod-template-hash suffix, so no ReplicaSet watch is needed), its
// StatefulSet or LeaderWorkerSet (owners and LWS label). A pulse.io/workload
// label or annotation replaces them all with one named workload.
func Workloads(pod *corev1.Pod) []Workload {
	if w := firstNonEmpty(pod.Labels[KeyWorkload], pod.Annotations[KeyWorkload]); w != "" {
		return []Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_CUSTOM, Name: w}}
	}
	var out []Workload
	add := func(kind pulsev1.WorkloadKind, name string) {
		for _, w := range out {
			if w.Kind == kind && w.Name == name {
				return
			}
		}
		out = append(out, Workload{Kind: kind, Name: name})
	}
	if v := pod.Labels[LabelWorkspace]; v != "" {
		add(pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, v)
	}
	if v := pod.Labels[LabelInferenceSet]; v != "" {
		add(pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET, v)
	}
	if v := pod.Labels[LabelLWSName]; v != "" {
		add(pulsev1.WorkloadKind_WORKLOAD_KIND_LEADER_WORKER_SET, v)
	}
	for _, o := range pod.OwnerReferences {
		if w, ok := ownerWorkload(pod, o); ok {
			add(w.Kind, w.Name)
		}
	}
	return out
}

// ownerWorkload is the workload owner reference o gives pod, if any.
func ownerWorkload(pod *corev1.Pod, o metav1.OwnerReference) (Workload, bool) {
	switch o.Kind {
	case "ReplicaSet":
		if h := pod.Labels[labelTemplateHash]; h != "" && strings.HasSuffix(o.Name, "-"+h) {
			return Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, Name: strings.TrimSuffix(o.Name, "-"+h)}, true
		}
	case "StatefulSet":
		if pod.Labels[LabelLWSName] == "" { // an LWS's own StatefulSets are the LWS
			return Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_STATEFUL_SET, Name: o.Name}, true
		}
	case "LeaderWorkerSet":
		return Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_LEADER_WORKER_SET, Name: o.Name}, true
	}
	return Workload{}, false
}

// readOwners are the owner references of pod that give it a workload
// (ownerWorkload), one for each workload, the first maxOwnerRefs: the
// cache of the agent's node and the aggregator's of every pod keep these
// alone. Past a pod's MaxWorkloadsPerPod workloads its entry is refused.
func readOwners(pod *corev1.Pod) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	seen := map[Workload]bool{}
	for _, o := range pod.OwnerReferences {
		w, ok := ownerWorkload(pod, o)
		if !ok || seen[w] {
			continue
		}
		if seen[w] = true; len(out) == maxOwnerRefs {
			break
		}
		out = append(out, metav1.OwnerReference{Kind: o.Kind, Name: cutOwnerName(o.Name)})
	}
	return out
}

// cut is v's first n bytes at most, a copy: a part of v (v[:n]) would
// keep all of v alive, and the caches that keep what they cut keep pods of
// every tenant (an annotation of 256 KiB cut to 1 KiB kept 256 KiB).
func cut(v string, n int) string { return strings.Clone(v[:min(len(v), n)]) }

// cutOwnerName is name, or, past a workload's bound and a ReplicaSet's
// suffix ("-" and a pod-template-hash, a label value: at most 64 bytes),
// its first 254 bytes and its last 64: still past the bound (the pod is
// refused, naming it), its suffix kept. The API server bounds no owner's
// name: 16 of 80 KiB each were kept whole, 1.3 MB for one pod.
func cutOwnerName(name string) string {
	const suffix = 64
	if len(name) <= maxWorkloadName+1+suffix {
		return name
	}
	return name[:maxWorkloadName+1] + name[len(name)-suffix:]
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// ParseSelector parses --pod-selector.
func ParseSelector(s string) (labels.Selector, error) {
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--pod-selector %q: %w", s, err)
	}
	return sel, nil
}
