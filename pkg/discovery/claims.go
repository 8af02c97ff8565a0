package discovery

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Claims are the catalogue entries an agent may list a pod under, by entry
// uid, each with the workloads it may name: a model server's uid with its
// workloads (Workloads), or a demand source's entry per workload its
// pulse.io/demand-workloads names. The aggregator holds an agent's
// catalogue to them, read from its own pod cache, so that an agent cannot
// attach its node's pods to workloads their owners did not give them. A
// demand source whose annotations are not valid claims nothing (its agent
// lists none of its entries), nor does a static pod's mirror (Mirror).
func Claims(pod *corev1.Pod) map[string][]Workload {
	if Mirror(pod.Annotations) {
		return nil
	}
	if !IsDemandSource(pod.Annotations) {
		ws, err := podWorkloads(pod)
		if err != nil {
			return nil
		}
		return map[string][]Workload{string(pod.UID): ws}
	}
	kind, err := demandKind(pod.Annotations)
	if err != nil {
		return nil
	}
	items, err := demandItems(pod.Annotations[AnnotationDemandWorkloads])
	if err != nil {
		return nil
	}
	out := make(map[string][]Workload, len(items))
	for _, it := range items {
		out[store.DemandUID(string(pod.UID), it.name)] = []Workload{{Kind: kind, Name: it.name}}
	}
	return out
}

// Allows reports whether claims let an entry of uid name workloads.
func Allows(claims map[string][]Workload, uid string, workloads []Workload) bool {
	mine, ok := claims[uid]
	if !ok {
		return false
	}
	for _, w := range workloads {
		if !slices.Contains(mine, w) {
			return false
		}
	}
	return true
}

// maxOwnerRefs bounds the owner references a cache keeps of a pod (each
// one workload's: readOwners); an entry of more than MaxWorkloadsPerPod
// workloads is refused.
const maxOwnerRefs = 2 * MaxWorkloadsPerPod

// ClaimsMeta is the part of a pod's metadata that Claims reads, bounded:
// what a cache of every pod of the cluster keeps (Claims of it is Claims of
// the pod). Labels are at most 63 bytes; the pulse.io/workload annotation
// is cut past what a valid name may be (still not valid); the
// demand-workloads list is kept as its names (its NAME=VALUE values are
// not claims), or dropped when it is not valid.
func ClaimsMeta(pod *corev1.Pod) metav1.ObjectMeta {
	// demandMarker: a demand source's pulse.io/demand-source, which Claims
	// reads only as set (IsDemandSource), kept as one constant.
	const demandMarker = "1"
	m := metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion}
	for _, k := range []string{KeyWorkload, LabelWorkspace, LabelInferenceSet, LabelLWSName, labelTemplateHash} {
		if v, ok := pod.Labels[k]; ok {
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[k] = v
		}
	}
	keep := func(k, v string) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[k] = v
	}
	if v, ok := pod.Annotations[KeyWorkload]; ok {
		keep(KeyWorkload, cut(v, maxWorkloadName+1))
	}
	if IsDemandSource(pod.Annotations) {
		keep(AnnotationDemandSource, demandMarker)
		if v, ok := pod.Annotations[AnnotationDemandKind]; ok {
			keep(AnnotationDemandKind, cut(v, 64))
		}
		if items, err := demandItems(pod.Annotations[AnnotationDemandWorkloads]); err == nil {
			names := make([]string, len(items))
			for i, it := range items {
				names[i] = it.name
			}
			// A copy: the join of one name is that name, a part of the
			// annotation, which it would keep whole.
			keep(AnnotationDemandWorkloads, strings.Clone(strings.Join(names, ",")))
		}
	}
	if Mirror(pod.Annotations) {
		keep(corev1.MirrorPodAnnotationKey, "")
	}
	m.OwnerReferences = readOwners(pod)
	return m
}

// Mirror says whether a pod's annotations are a static pod's mirror's
// (kubernetes.io/config.mirror). A node's kubelet credentials may create
// such a pod bound to the node in any namespace, with any labels and
// annotations (NodeRestriction forbids only service accounts, secrets and
// owners other than the node): a node a tenant controls made one in
// another's namespace, labelled with that tenant's workspace, and its
// agent's invented samples were that workload's replica. It claims no
// workload.
func Mirror(annotations map[string]string) bool {
	_, ok := annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// maxDemandValue bounds a router's label value for a workload
// (pulse.io/demand-workloads' NAME=VALUE).
const maxDemandValue = 256

// demandItem is one workload of pulse.io/demand-workloads: its name and the
// router's label value for it.
type demandItem struct{ name, value string }

// demandItems parses pulse.io/demand-workloads: NAME or NAME=VALUE,
// comma-separated, at most MaxDemandWorkloads, no name empty or repeated.
func demandItems(list string) ([]demandItem, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, fmt.Errorf("annotation %s is required: the workloads the router fronts, NAME or NAME=LABEL_VALUE, comma-separated", AnnotationDemandWorkloads)
	}
	if n := strings.Count(list, ",") + 1; n > MaxDemandWorkloads {
		// One router must not fill its node's catalogue: this router is
		// left out, the node's other pods are not.
		return nil, fmt.Errorf("annotation %s names %d workloads; at most %d", AnnotationDemandWorkloads, n, MaxDemandWorkloads)
	}
	var out []demandItem
	seen := map[string]bool{}
	for item := range strings.SplitSeq(list, ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(item), "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if value == "" {
			value = name
		}
		if len(value) > maxDemandValue {
			return nil, fmt.Errorf("annotation %s: the label value of %q is over %d bytes", AnnotationDemandWorkloads, wire.CleanText(name, 64), maxDemandValue)
		}
		if name == "" || seen[name] {
			return nil, fmt.Errorf("annotation %s=%q: an empty or repeated workload name", AnnotationDemandWorkloads, wire.CleanText(list, 64))
		}
		seen[name] = true
		if strings.Contains(name, "/") {
			// An entry's uid is ROUTER_UID/demand/NAME, cut at its last
			// /demand/: a name x/demand/y cut it elsewhere, the router
			// read as two pods at one address, and none of its entries
			// was scraped.
			return nil, fmt.Errorf("annotation %s: workload name %q holds a /, which no object's name does", AnnotationDemandWorkloads, wire.CleanText(name, 64))
		}
		if err := checkWorkloadNames([]Workload{{Name: name}}); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", AnnotationDemandWorkloads, err)
		}
		out = append(out, demandItem{name, value})
	}
	return out, nil
}
