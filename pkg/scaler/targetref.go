package scaler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// TargetResolver finds the workload a ScaledObject scales, for triggers whose
// metadata names none.
type TargetResolver interface {
	// Resolve returns the kind and name of the ScaledObject's
	// spec.scaleTargetRef.
	Resolve(namespace, name string) (kind, target string, err error)
}

// ScaledObjects is KEDA's ScaledObject resource.
var ScaledObjects = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}

// InformerResolver answers from an informer's cache of ScaledObjects, so a
// KEDA call never waits on the API server.
type InformerResolver struct {
	informer cache.SharedIndexInformer
	lister   cache.GenericLister
}

var _ TargetResolver = (*InformerResolver)(nil)

// NewInformerResolver watches ScaledObjects in every namespace; its cache
// keeps of each only what Resolve and PlannerRefs read (trimScaledObject).
func NewInformerResolver(client dynamic.Interface) *InformerResolver {
	f := dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
	gi := f.ForResource(ScaledObjects)
	inf := gi.Informer()
	if err := inf.SetTransform(trimScaledObject); err != nil {
		panic(err) // only once the informer runs: it has not
	}
	return &InformerResolver{informer: inf, lister: gi.Lister()}
}

// maxPlannerTriggers bounds the planner triggers the cache keeps of one
// ScaledObject (KEDA takes any number; a workload needs one).
const maxPlannerTriggers = 8

// trimScaledObject is what the cache keeps of a ScaledObject: its name,
// spec.scaleTargetRef's kind and name, and of its planner triggers
// (external-push, metric replicas) pulse's own metadata keys,
// each trigger whose metadata a KEDA call would be refused for left out.
// Every tenant's ScaledObjects were held whole (a last-applied annotation,
// managed fields, every trigger of every scaler): a tenant's few hundred
// of 1 MB each took the aggregator past its memory limit, and its every
// replica with it; and PlannerRefs copied every trigger of every one, every
// few seconds, before any bound.
func trimScaledObject(o any) (any, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return o, nil // a tombstone: its object was trimmed when cached
	}
	out := TrimmedScaledObject(u)
	var kept []any
	push := false
	triggers, _, _ := unstructured.NestedSlice(u.Object, "spec", "triggers")
	for _, tr := range triggers {
		m, _ := tr.(map[string]any)
		if typ, _, _ := unstructured.NestedString(m, "type"); typ == "external-push" {
			push = true
		}
		if md := plannerMetadata(tr); md != nil && len(kept) < maxPlannerTriggers {
			kept = append(kept, map[string]any{"type": "external-push", "metadata": md})
		}
	}
	if push && len(kept) == 0 {
		// That it has one (Resolve): a trigger with no metadata, which
		// PlannerRefs passes over.
		kept = append(kept, map[string]any{"type": "external-push"})
	}
	if len(kept) > 0 {
		_ = unstructured.SetNestedSlice(out.Object, kept, "spec", "triggers")
	}
	return out, nil
}

// TrimmedScaledObject is what every cache of pulse keeps of a ScaledObject
// u: its identity and versions, and its scaleTargetRef's kind and name,
// each cut past 253 bytes and marked (a name no object Kubernetes serves
// has, so it matches none).
func TrimmedScaledObject(u *unstructured.Unstructured) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetName(u.GetName())
	out.SetNamespace(u.GetNamespace())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	out.SetGeneration(u.GetGeneration())
	ref := map[string]any{}
	for _, f := range []string{"kind", "name"} {
		if v, ok, _ := unstructured.NestedString(u.Object, "spec", "scaleTargetRef", f); ok {
			ref[f] = CutName(v)
		}
	}
	if len(ref) > 0 {
		_ = unstructured.SetNestedMap(out.Object, ref, "spec", "scaleTargetRef")
	}
	return out
}

// CutName is v, or, past 253 bytes (a Kubernetes name's most), v cut at
// a character's start and marked: it matches no name, and is valid UTF-8
// (a label value must be).
func CutName(v string) string {
	if len(v) <= maxWorkloadName {
		return v
	}
	return wire.CleanText(v, maxWorkloadName) + "..."
}

// plannerMetadata is the metadata of tr, a ScaledObject's trigger, as the
// cache keeps it when tr is a planner trigger KEDA's call would parse:
// pulse's own keys (learning reads no other); nil otherwise, and nil when
// one of them is longer than any value pulse takes (a name's 253 bytes, a
// number's or a duration's 64). Each of the 31 keys pulse and KEDA know was
// kept at up to the metadata's 1 KiB, eight triggers an object: a
// tenant's 1,000 ScaledObjects of junk values within the bounds held about
// 250 MB in every replica.
//
// A trigger with one of pulse's keys from the environment (<key>FromEnv)
// is nil too: KEDA reads the variable from the scale target's containers
// and forwards its value, but the ScaledObject holds only the variable's
// name, so what the aggregator would learn from it (its SLO, its window,
// its workload) need not be what KEDA's call plans: it learned under
// another key, one KEDA never asks for, and a failover kept nothing.
// Such a trigger is planned at KEDA's calls alone, and a replica that
// takes over relearns it (docs/planner.md, "What is kept, and what is
// relearned").
func plannerMetadata(tr any) map[string]any {
	m, _ := tr.(map[string]any)
	if typ, _, _ := unstructured.NestedString(m, "type"); typ != "external-push" {
		return nil
	}
	raw, _ := m["metadata"].(map[string]any)
	if len(raw) == 0 || len(raw) > maxMetadataKeys {
		return nil
	}
	md := make(map[string]string, len(raw))
	for k, v := range raw {
		s, ok := v.(string)
		if !ok {
			return nil
		}
		md[k] = s
	}
	if !isPlanner(md) || fromEnv(md) {
		return nil
	}
	if _, err := metadata(md); err != nil {
		return nil // bounded, then checked: KEDA's call is refused it
	}
	out := map[string]any{}
	for k, v := range md {
		if !slices.Contains(pulseKeys, k) {
			continue
		}
		if len(v) > maxKeptValue(k) {
			return nil // not learned (KEDA's own calls plan it as ever)
		}
		out[k] = v
	}
	return out
}

// maxKeptValue is the longest value of pulse's key k the cache keeps: a
// workload's name (or namespace, or metric name) is at most an object's
// name, a number or a duration far shorter.
func maxKeptValue(k string) int {
	switch k {
	case "namespace", "workspaceNamespace", "metricName":
		return maxWorkloadName
	}
	if slices.ContainsFunc(workloadKeys, func(wk struct{ key, kind string }) bool { return wk.key == k }) {
		return maxWorkloadName
	}
	return 64
}

// fromEnv reports whether md takes one of pulse's keys from the
// environment.
func fromEnv(md map[string]string) bool {
	for k := range md {
		if base, ok := strings.CutSuffix(k, "FromEnv"); ok && slices.Contains(pulseKeys, base) {
			return true
		}
	}
	return false
}

// isPlanner reports whether md names the planner, as parseMetric reads it
// (metric, else metricName).
func isPlanner(md map[string]string) bool {
	if m := md["metric"]; m != "" {
		return m == MetricReplicas
	}
	return md["metricName"] == MetricReplicas
}

// Run runs the informer until ctx ends.
func (r *InformerResolver) Run(ctx context.Context) { r.informer.Run(ctx.Done()) }

// Ready returns nil once the cache has synced.
func (r *InformerResolver) Ready() error {
	if !r.informer.HasSynced() {
		return errNotSynced
	}
	return nil
}

// errNotSynced: the cache is still filling; errNotCached: it has not seen
// the ScaledObject yet. Both pass (Unavailable: KEDA retries), neither is
// the tenant's error.
var (
	errNotSynced = errors.New("the ScaledObject cache is not synced yet")
	errNotCached = errors.New("not in the aggregator's ScaledObject cache yet (made a moment ago? A ScaledJob's trigger must name its workload: only a ScaledObject's scaleTargetRef is read)")
	// errNotCaller: the ScaledObject of the caller's name has no
	// external-push trigger, so the caller is not it: a ScaledJob of the
	// same name (KEDA's ref names neither kind) read the ScaledObject's
	// workload. Unavailable, as for a ScaledJob with no ScaledObject of
	// its name (and as for one just given its trigger: the cache lags).
	errNotCaller = errors.New("has no external-push trigger, so the caller is not it (a ScaledJob of its name? A ScaledJob's trigger must name its workload: only a ScaledObject's scaleTargetRef is read)")
)

// Resolve reads spec.scaleTargetRef from the cache.
func (r *InformerResolver) Resolve(namespace, name string) (string, string, error) {
	if !r.informer.HasSynced() {
		return "", "", errNotSynced
	}
	obj, err := r.lister.ByNamespace(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		// KEDA asks about a ScaledObject it has read: the cache has not
		// seen it yet (made a moment ago). KEDA retries.
		return "", "", fmt.Errorf("ScaledObject %s/%s: %w", namespace, name, errNotCached)
	}
	if err != nil {
		return "", "", err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", "", fmt.Errorf("ScaledObject %s/%s: unexpected %T", namespace, name, obj)
	}
	triggers, _, _ := unstructured.NestedSlice(u.Object, "spec", "triggers")
	if !slices.ContainsFunc(triggers, func(tr any) bool {
		m, _ := tr.(map[string]any)
		typ, _, _ := unstructured.NestedString(m, "type")
		return typ == "external-push"
	}) {
		return "", "", fmt.Errorf("ScaledObject %s/%s %w", namespace, name, errNotCaller)
	}
	kind, _, _ := unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "kind")
	target, _, _ := unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "name")
	if kind == "" {
		kind = "Deployment" // KEDA's default scaleTargetRef kind
	}
	if target == "" {
		return "", "", fmt.Errorf("ScaledObject %s/%s has no spec.scaleTargetRef.name", namespace, name)
	}
	return kind, target, nil
}

// workloadKinds maps scaleTargetRef kinds to the store's.
var workloadKinds = map[string]string{
	"Workspace":       store.KindWorkspace,
	"InferenceSet":    store.KindInferenceSet,
	"Deployment":      store.KindDeployment,
	"StatefulSet":     store.KindStatefulSet,
	"LeaderWorkerSet": store.KindLeaderWorkerSet,
}
