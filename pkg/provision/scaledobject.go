package provision

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// ScaledObjects is KEDA's ScaledObject resource.
var ScaledObjects = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}

// The label that marks a ScaledObject as pulse's: pulse changes and deletes
// only ScaledObjects that carry it.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "pulse"
)

// Target is where provisioned triggers point.
type Target struct {
	// ScalerAddress is the aggregator's scaler Service, host:port.
	ScalerAddress string
	// TriggerAuth names the ClusterTriggerAuthentication KEDA uses for the
	// scaler port's TLS; "" for none.
	TriggerAuth string
}

// Owner is the workload a ScaledObject is made for.
type Owner struct {
	APIVersion, Kind, Namespace, Name string
	UID                               types.UID
}

// Desired is the ScaledObject pulse keeps for the workload: named after it,
// in its namespace, owned by it (so that deleting the workload deletes it),
// labelled as pulse's.
func Desired(o Owner, s Settings, t Target) *unstructured.Unstructured {
	md := map[string]any{"scalerAddress": t.ScalerAddress}
	for k, v := range s.Trigger {
		md[k] = v
	}
	trigger := map[string]any{"type": "external-push", "name": "pulse", "metadata": md}
	if s.Trigger["valueType"] == "average" {
		// A per-replica value: the HPA multiplies it by the pod count only
		// for metricType Value. Under KEDA's default, AverageValue, a p90
		// of 1.85 s against 1 asked for 2 replicas of 10.
		trigger["metricType"] = "Value"
	}
	if t.TriggerAuth != "" {
		trigger["authenticationRef"] = map[string]any{"name": t.TriggerAuth, "kind": "ClusterTriggerAuthentication"}
	}
	hpa := map[string]any{"behavior": behavior(s)}
	if name := hpaName(o.Name); name != "" {
		hpa["name"] = name
	}
	spec := map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": o.APIVersion, "kind": o.Kind, "name": o.Name},
		"minReplicaCount": s.MinReplicas,
		"maxReplicaCount": s.MaxReplicas,
		"triggers":        []any{trigger},
		"advanced":        map[string]any{"horizontalPodAutoscalerConfig": hpa},
	}
	if s.CooldownSet {
		spec["cooldownPeriod"] = int64(s.CooldownPeriod.Seconds())
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ScaledObjects.GroupVersion().String(),
		"kind":       "ScaledObject",
		"metadata": map[string]any{
			"name":      o.Name,
			"namespace": o.Namespace,
			"labels":    map[string]any{LabelManagedBy: ManagedBy},
			"ownerReferences": []any{map[string]any{
				"apiVersion": o.APIVersion, "kind": o.Kind, "name": o.Name, "uid": string(o.UID), "controller": true,
			}},
		},
		"spec": spec,
	}}
}

// KEDA (its admission webhook, v2.21) takes a ScaledObject whose name is at
// most maxName long, and whose HPA's name, keda-hpa-<name> unless
// horizontalPodAutoscalerConfig.name says otherwise, is too: both are label
// values. The ScaledObject is named after its workload.
const (
	maxName       = 63
	kedaHPAPrefix = "keda-hpa-"
)

// CheckName refuses a workload whose name KEDA cannot take as a
// ScaledObject's: pulse's would be refused by KEDA's webhook, or, without
// it, never reconciled.
func CheckName(name string) error {
	if len(name) > maxName {
		return fmt.Errorf("the workload's name is %d characters: KEDA takes ScaledObject names of at most %d (a label value), and pulse names the ScaledObject after the workload; write a ScaledObject of a shorter name by hand (docs/scaledobject.md)", len(name), maxName)
	}
	return nil
}

// hpaName is the HPA's name for a ScaledObject named name when KEDA's own
// (keda-hpa-<name>) would be too long: the name cut, and a hash of it whole
// so that two names cut alike differ; "" when KEDA's fits.
func hpaName(name string) string {
	if len(kedaHPAPrefix+name) <= maxName {
		return ""
	}
	sum := fnv.New32a()
	_, _ = sum.Write([]byte(name)) // a hash.Hash never fails to write
	suffix := fmt.Sprintf("-%08x", sum.Sum32())
	cut := strings.TrimRight(name[:maxName-len(kedaHPAPrefix)-len(suffix)], "-.")
	return kedaHPAPrefix + cut + suffix
}

// behavior is the HPA behaviour: scale up by ScaleUpPodsPerMinute pods a
// minute once the load has held 30 s, down by one pod per
// ScaleDownInterval once it has stayed lower for ScaleDownDelay. The
// tolerances (10 % up, 50 % down) apply where the cluster enables the
// HPAConfigurableTolerance feature gate; elsewhere the HPA's 10 % does.
func behavior(s Settings) map[string]any {
	if s.Planner {
		return plannerBehavior
	}
	return map[string]any{
		"scaleUp": map[string]any{
			"stabilizationWindowSeconds": int64(DefaultScaleUpDelay.Seconds()),
			"tolerance":                  "0.1",
			"selectPolicy":               "Max",
			"policies": []any{map[string]any{
				"type": "Pods", "value": s.ScaleUpPodsPerMinute, "periodSeconds": int64(60),
			}},
		},
		"scaleDown": map[string]any{
			"stabilizationWindowSeconds": int64(s.ScaleDownDelay.Seconds()),
			"tolerance":                  "0.5",
			"selectPolicy":               "Max",
			"policies": []any{map[string]any{
				"type": "Pods", "value": int64(1), "periodSeconds": int64(s.ScaleDownInterval.Seconds()),
			}},
		},
	}
}

// plannerBehavior lets the planner's plan through: no stabilization (the
// planner holds a peak's capacity for its learned lead time itself), any
// step up or down within one HPA sync, and no tolerance (a plan of 11 at 10
// replicas is within the HPA's default 10 %; the tolerance applies where the
// cluster enables HPAConfigurableTolerance, elsewhere the HPA's 10 % does).
var plannerBehavior = map[string]any{
	"scaleUp": map[string]any{
		"stabilizationWindowSeconds": int64(0),
		"tolerance":                  "0",
		"selectPolicy":               "Max",
		"policies":                   []any{map[string]any{"type": "Percent", "value": int64(1000), "periodSeconds": int64(15)}},
	},
	"scaleDown": map[string]any{
		"stabilizationWindowSeconds": int64(0),
		"tolerance":                  "0",
		"selectPolicy":               "Max",
		"policies":                   []any{map[string]any{"type": "Percent", "value": int64(100), "periodSeconds": int64(15)}},
	},
}

// Managed reports whether so carries pulse's label.
func Managed(so metav1.Object) bool { return so.GetLabels()[LabelManagedBy] == ManagedBy }

// OwnedBy reports whether so's controller is the workload with uid.
func OwnedBy(so metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(so)
	return ref != nil && ref.UID == uid
}

// ownedAs says whether so's controller is want: its uid, and its
// apiVersion, kind and name, so that a reference to a version the cluster
// no longer serves is brought up to date (the garbage collector cannot
// resolve an owner at a retired version, and never deleted the
// ScaledObject of a workload deleted after such an upgrade).
func ownedAs(so metav1.Object, want metav1.OwnerReference) bool {
	ref := metav1.GetControllerOf(so)
	return ref != nil && ref.UID == want.UID && ref.APIVersion == want.APIVersion && ref.Kind == want.Kind && ref.Name == want.Name
}

// Apply returns existing with desired's spec, pulse's label and owner (the
// workload as controller, the owners others added kept), and
// everything else of existing (other labels, annotations, finalizers, the
// status KEDA writes) kept; changed is false when nothing differs.
func Apply(existing, desired *unstructured.Unstructured) (*unstructured.Unstructured, bool) {
	out := existing.DeepCopy()
	changed := false
	if !equalJSON(canonical(existing.Object["spec"]), canonical(desired.Object["spec"])) {
		out.Object["spec"] = desired.Object["spec"]
		changed = true
	}
	labels := out.GetLabels()
	if labels[LabelManagedBy] != ManagedBy {
		labels = maps.Clone(labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelManagedBy] = ManagedBy
		out.SetLabels(labels)
		changed = true
	}
	if want := desired.GetOwnerReferences(); !ownedAs(existing, want[0]) {
		// The workload as controller; the owners others added (not
		// controllers: one object has one) kept.
		refs := slices.DeleteFunc(slices.Clone(existing.GetOwnerReferences()), func(r metav1.OwnerReference) bool {
			return r.Controller != nil && *r.Controller || r.UID == want[0].UID
		})
		out.SetOwnerReferences(append(want, refs...))
		changed = true
	}
	return out, changed
}

// canonical is a spec as written by anyone: KEDA's operator updates the
// ScaledObject through its Go types (adding its label and finalizer), which
// writes tolerance "0.1" as "100m" and adds an empty scalingModifiers;
// neither is a change.
func canonical(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			e = canonical(e)
			if m, ok := e.(map[string]any); ok && len(m) == 0 {
				continue
			}
			if k == "tolerance" {
				if v := fmt.Sprint(e); quantityCheap(v) {
					if q, err := resource.ParseQuantity(v); err == nil {
						e = q.String()
					}
				}
			}
			out[k] = e
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = canonical(e)
		}
		return out
	}
	return v
}

// quantityCheap says whether v is read as a Quantity by canonical: short,
// and with no exponent (pulse writes "0", "0.1" and "0.5", KEDA's Go types
// write them back as "0", "100m" and "500m"). Any tenant may put pulse's
// label on its own ScaledObject, and a Quantity of a long mantissa and a
// large exponent ("12345678901234567890e999999999") is rounded by
// big-number arithmetic in 10^exponent: minutes to hours of a core in the
// informer's transform, every tenant's provisioning stopped behind it.
// Another value is compared as written.
func quantityCheap(v string) bool {
	return len(v) <= 32 && !strings.ContainsAny(v, "eE")
}

// equalJSON compares two values as their JSON: the API's ints and pulse's
// int64s, maps in any order.
func equalJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
