package provision

import (
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDefaultIsTheSimulatedOne: with no annotation but pulse.io/autoscale,
// an 8B Workspace gets exactly docs/simulation/default-scaledobject.yaml,
// the ScaledObject pulse-sim's benchmark scores (docs/planner.md), so that
// the default cannot drift from what was measured.
func TestDefaultIsTheSimulatedOne(t *testing.T) {
	want := readYAML(t, "../../docs/simulation/default-scaledobject.yaml")
	s, err := Parse(Workload{Kind: "Workspace", Namespace: "kaito-workloads", Name: "llama"}, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := Desired(Owner{APIVersion: "kaito.sh/v1beta1", Kind: "Workspace", Namespace: "kaito-workloads", Name: "llama", UID: "u"}, s,
		Target{ScalerAddress: "pulse-aggregator.pulse-system.svc:9090"})
	if !equalJSON(canonical(want["spec"]), canonical(got.Object["spec"])) {
		w, _ := yaml.Marshal(want["spec"])
		g, _ := yaml.Marshal(got.Object["spec"])
		t.Fatalf("provisioned spec:\n%s\ndocs/simulation/default-scaledobject.yaml:\n%s", g, w)
	}
	md := want["metadata"].(map[string]any)
	if got.GetName() != md["name"] || got.GetNamespace() != md["namespace"] || got.GetKind() != want["kind"] || got.GetAPIVersion() != want["apiVersion"] {
		t.Fatalf("provisioned %s %s/%s, the file %v %v", got.GetKind(), got.GetNamespace(), got.GetName(), want["kind"], md)
	}
}

// TestThresholdMetricBehaviourIsTheTunedOne: a threshold metric's
// behaviour is that of the ScaledObject pulse-sim's tune chose.
func TestThresholdMetricBehaviourIsTheTunedOne(t *testing.T) {
	tuned := readYAML(t, "../../docs/simulation/tuned-scaledobject.yaml")
	s, err := Parse(Workload{Kind: "Workspace", Namespace: "kaito-workloads", Name: "llama"}, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "running"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := Desired(Owner{APIVersion: "kaito.sh/v1beta1", Kind: "Workspace", Namespace: "kaito-workloads", Name: "llama", UID: "u"}, s,
		Target{ScalerAddress: "pulse-aggregator.pulse-system.svc:9090"})
	path := []string{"spec", "advanced", "horizontalPodAutoscalerConfig", "behavior"}
	want, _, _ := unstructured.NestedFieldNoCopy(tuned, path...)
	have, _, _ := unstructured.NestedFieldNoCopy(got.Object, path...)
	if !equalJSON(want, have) {
		t.Errorf("%v: provisioned %v, tuned %v", path, have, want)
	}
}

func TestCooldownOnlyWhenSet(t *testing.T) {
	o := Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "demo", Name: "d", UID: "u"}
	s, _ := Parse(Workload{Kind: "Deployment", Namespace: "demo", Name: "d"}, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
	if _, ok := Desired(o, s, Target{}).Object["spec"].(map[string]any)["cooldownPeriod"]; ok {
		t.Error("cooldownPeriod set without the annotation (KEDA's default applies)")
	}
	s, _ = Parse(Workload{Kind: "Deployment", Namespace: "demo", Name: "d"},
		map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "0", AnnotationCooldownPeriod: "10m"}, time.Minute)
	so := Desired(o, s, Target{})
	if n, _, _ := unstructured.NestedInt64(so.Object, "spec", "cooldownPeriod"); n != 600 {
		t.Errorf("cooldownPeriod %d", n)
	}
	if _, ok := triggerOf(t, so)["authenticationRef"]; ok {
		t.Error("authenticationRef without a TriggerAuth")
	}
	// "0" is KEDA's 0 (to zero at once), not its default: it was accepted
	// and then left out, so KEDA waited its 300 s.
	s, _ = Parse(Workload{Kind: "Deployment", Namespace: "demo", Name: "d"},
		map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "0", AnnotationCooldownPeriod: "0"}, time.Minute)
	if n, ok, _ := unstructured.NestedInt64(Desired(o, s, Target{}).Object, "spec", "cooldownPeriod"); !ok || n != 0 {
		t.Errorf("cooldown-period 0: cooldownPeriod %d (set %v), want 0 set", n, ok)
	}
}

// TestKEDAsRewriteIsNoChange: KEDA's operator updates the ScaledObject
// through its Go types, which writes tolerance "0.1" as "100m" and adds an
// empty scalingModifiers. That is not a change to undo (it would be a
// tug of war with the operator); a changed value is.
func TestKEDAsRewriteIsNoChange(t *testing.T) {
	s, _ := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "running"}, time.Minute)
	desired := Desired(Owner{APIVersion: "kaito.sh/v1alpha1", Kind: "InferenceSet", Namespace: "demo", Name: "llama", UID: "u"}, s, Target{})
	rewritten := desired.DeepCopy()
	adv := rewritten.Object["spec"].(map[string]any)["advanced"].(map[string]any)
	adv["scalingModifiers"] = map[string]any{}
	b := adv["horizontalPodAutoscalerConfig"].(map[string]any)["behavior"].(map[string]any)
	b["scaleUp"].(map[string]any)["tolerance"] = "100m"
	b["scaleDown"].(map[string]any)["tolerance"] = "500m"
	rewritten.SetLabels(map[string]string{LabelManagedBy: ManagedBy, "scaledobject.keda.sh/name": "llama"})
	rewritten.SetFinalizers([]string{"finalizer.keda.sh"})
	if _, changed := Apply(rewritten, desired); changed {
		t.Error("KEDA's rewrite is taken for a change")
	}
	b["scaleDown"].(map[string]any)["tolerance"] = "200m"
	out, changed := Apply(rewritten, desired)
	if !changed || len(out.GetFinalizers()) != 1 || out.GetLabels()["scaledobject.keda.sh/name"] != "llama" {
		t.Errorf("a changed tolerance: changed %v, finalizers %v, labels %v", changed, out.GetFinalizers(), out.GetLabels())
	}
}

// Adopting a ScaledObject (an orphan of pulse's) makes the workload its
// controller and keeps the owners others added (a GitOps application's),
// as it keeps their labels, annotations and finalizers.
func TestAdoptionKeepsOtherOwners(t *testing.T) {
	s, _ := Parse(llama, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
	desired := Desired(Owner{APIVersion: "kaito.sh/v1alpha1", Kind: "InferenceSet", Namespace: "demo", Name: "llama", UID: "u"}, s, Target{})
	orphan := desired.DeepCopy()
	yes := true
	orphan.SetOwnerReferences([]metav1.OwnerReference{
		{APIVersion: "argoproj.io/v1alpha1", Kind: "Application", Name: "app", UID: "argo"},
		{APIVersion: "kaito.sh/v1alpha1", Kind: "InferenceSet", Name: "llama", UID: "old", Controller: &yes},
	})
	out, changed := Apply(orphan, desired)
	refs := out.GetOwnerReferences()
	if !changed || !OwnedBy(out, "u") || len(refs) != 2 || refs[1].UID != "argo" {
		t.Errorf("adopted: changed %v, owners %+v; want the workload as controller and the Application kept", changed, refs)
	}
}

// TestAnOwnerAtARetiredVersionIsBroughtUpToDate: the owner reference was
// compared by uid alone, so one written at a version the cluster later
// stopped serving (an InferenceSet's v1alpha1, after an upgrade to v1beta1)
// stood: the garbage collector cannot resolve an owner at a retired
// version, and the ScaledObject, and KEDA's HPA, outlived the workload.
func TestAnOwnerAtARetiredVersionIsBroughtUpToDate(t *testing.T) {
	s, _ := Parse(llama, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
	desired := Desired(Owner{APIVersion: "kaito.sh/v1beta1", Kind: "InferenceSet", Namespace: "demo", Name: "llama", UID: "u"}, s, Target{})
	old := desired.DeepCopy()
	refs := old.GetOwnerReferences()
	refs[0].APIVersion = "kaito.sh/v1alpha1"
	old.SetOwnerReferences(refs)
	out, changed := Apply(old, desired)
	if got := out.GetOwnerReferences(); !changed || len(got) != 1 || got[0].APIVersion != "kaito.sh/v1beta1" || !OwnedBy(out, "u") {
		t.Fatalf("owner at a retired version: changed %v, owners %+v; want it at kaito.sh/v1beta1", changed, got)
	}
	if _, changed := Apply(out, desired); changed {
		t.Fatal("brought up to date, and still taken for a change")
	}
}

// TestNamesKEDATakes: KEDA's webhook refuses a ScaledObject named past 63
// characters, or whose HPA's name (keda-hpa-<name>) is: pulse names the
// HPA itself past 54 (the name cut, and a hash of it whole), and refuses a
// workload named past 63. A 60-character name was provisioned, and KEDA
// refused it (with its webhook; without, never reconciled it).
func TestNamesKEDATakes(t *testing.T) {
	short := strings.Repeat("a", 54)
	if hpaName(short) != "" {
		t.Errorf("%d characters: HPA named %q, want KEDA's own", len(short), hpaName(short))
	}
	seen := map[string]string{}
	for _, name := range []string{"llama-3-1-8b-instruct-" + strings.Repeat("a", 38), strings.Repeat("b", 55), strings.Repeat("c", 63),
		strings.Repeat("d", 40) + "-" + strings.Repeat("e", 22), strings.Repeat("d", 40) + "-" + strings.Repeat("f", 22),
		strings.Repeat("g", 44) + ".h" + strings.Repeat("i", 16)} {
		h := hpaName(name)
		if len(h) > maxName || !strings.HasPrefix(h, kedaHPAPrefix) || len(validation.IsDNS1123Subdomain(h)) > 0 || len(validation.IsValidLabelValue(h)) > 0 {
			t.Errorf("%q: HPA named %q (%d characters)", name, h, len(h))
		}
		if other, ok := seen[h]; ok {
			t.Errorf("%q and %q: the same HPA name %q", name, other, h)
		}
		seen[h] = name
		if err := CheckName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
		so := Desired(Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "demo", Name: name, UID: "u"},
			Settings{MinReplicas: 1, MaxReplicas: 3, Trigger: map[string]string{"deployment": name}}, Target{ScalerAddress: "x:9090"})
		if got, _, _ := unstructured.NestedString(so.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "name"); got != h {
			t.Errorf("%q: ScaledObject's HPA name %q, want %q", name, got, h)
		}
	}
	if err := CheckName(strings.Repeat("x", 64)); err == nil || !strings.Contains(err.Error(), "at most 63") {
		t.Errorf("a 64-character name: %v", err)
	}
}

// TestATenantsToleranceIsNotExpanded: canonical read every "tolerance" key
// of a spec, at any depth, as a resource.Quantity, and the cache does so
// (specHash, in the informer's transform) of every ScaledObject carrying
// pulse's label, which any tenant may set on its own. A Quantity with a
// long mantissa and a large exponent is rounded to nano-units by big-number
// arithmetic in 10^exponent: "12345678901234567890e100000" costs 1.6 s,
// e1000000 2m44s, e999999999 more than ten minutes of a core (measured),
// on the one goroutine that feeds the provisioner's ScaledObject cache: one
// tenant's ScaledObject with trigger metadata tolerance: "...e999999999"
// (any string: KEDA's webhook and operator never parse it) stops every
// tenant's provisioning for as long as it exists. The test's value is the
// smallest of those, so that the current code finishes (and fails); a value
// the HPA could never take is left as written, and compared as written.
func TestATenantsToleranceIsNotExpanded(t *testing.T) {
	const huge = "12345678901234567890e100000"
	so := Desired(Owner{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "team-b", Name: "evil", UID: "e"},
		Settings{MinReplicas: 1, MaxReplicas: 3, Trigger: map[string]string{"deployment": "evil"}}, Target{ScalerAddress: "x:9090"})
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	triggers[0].(map[string]any)["metadata"].(map[string]any)["tolerance"] = huge
	_ = unstructured.SetNestedSlice(so.Object, triggers, "spec", "triggers")
	behavior := so.Object["spec"].(map[string]any)["advanced"].(map[string]any)["horizontalPodAutoscalerConfig"].(map[string]any)["behavior"].(map[string]any)
	behavior["scaleUp"] = map[string]any{"tolerance": huge}

	c := canonical(so.Object["spec"]).(map[string]any)
	md := c["triggers"].([]any)[0].(map[string]any)["metadata"].(map[string]any)
	if got := md["tolerance"]; got != huge {
		t.Errorf("trigger metadata tolerance %q read as a Quantity: %q (big-number work in its exponent)", huge, got)
	}
	up := c["advanced"].(map[string]any)["horizontalPodAutoscalerConfig"].(map[string]any)["behavior"].(map[string]any)["scaleUp"].(map[string]any)
	if got := up["tolerance"]; got != huge {
		t.Errorf("behavior tolerance %q expanded: %q", huge, got)
	}
	if _, err := trimScaledObject(so); err != nil {
		t.Fatal(err)
	}
}
