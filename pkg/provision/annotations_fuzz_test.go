package provision

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pulse-io/pulse/pkg/scaler"
)

// fuzzAnnotations are the annotations FuzzParse sets, pulse's and
// keda-kaito-scaler's, and one of neither.
var fuzzAnnotations = []string{
	AnnotationMetric, AnnotationThreshold, AnnotationActivationThreshold, AnnotationWindow,
	AnnotationMinReplicas, AnnotationMaxReplicas, AnnotationScaleUpPodsPerMin, AnnotationScaleDownInterval,
	AnnotationScaleDownDelay, AnnotationCooldownPeriod, AnnotationSLOTTFT, AnnotationSLOITL, AnnotationSLOPercentile,
	KaitoAutoProvision, KaitoThreshold, KaitoMetricName, KaitoMinReplicas, KaitoMaxReplicas, kaitoPrefix + "metrics",
	"example.com/other",
}

// FuzzParse gives a workload any values of up to four of the annotations
// pulse reads, beside pulse.io/autoscale (or keda-kaito-scaler's
// auto-provision). It asserts:
//   - a refusal is an AnnotationError naming one of the annotations set,
//     its text bounded;
//   - what is accepted makes a ScaledObject whose trigger metadata, as
//     written, the scaler parses to the same trigger the provisioner read
//     (a tenant's annotation never makes a ScaledObject that KEDA's calls
//     then fail on), with 0 ≤ min ≤ max replicas and an HPA behaviour
//     within the API's bounds (policies of 1 to 1,800 s with a value of
//     at least 1, stabilization windows of 0 to 3,600 s).
//
// `make fuzz` runs it; its seed corpus runs in `make test`.
func FuzzParse(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, "running", "64", "", "1m")
	f.Add([]byte{0, 10, 11, 12}, "1500ms", "80ms", "90", "")
	f.Add([]byte{1, 4, 5, 14}, "3", "2", "true", "")
	f.Add([]byte{0, 0, 1, 7}, "vllm:num_requests_waiting", "1e21", "90s", "")
	f.Add([]byte{0, 0, 1, 2}, "kvCacheUsage", "0.123456789", "0.3333", "")
	f.Add([]byte{0, 6, 7, 8}, "4", "30m", "3600", "")
	f.Fuzz(func(t *testing.T, sel []byte, v1, v2, v3, v4 string) {
		a := map[string]string{AnnotationAutoscale: "true"}
		if len(sel) > 0 && sel[0]%2 == 1 {
			a = map[string]string{KaitoAutoProvision: "true"}
		}
		set := map[string]bool{AnnotationAutoscale: true, KaitoAutoProvision: true}
		for i, v := range []string{v1, v2, v3, v4} {
			if i+1 < len(sel) {
				k := fuzzAnnotations[int(sel[i+1])%len(fuzzAnnotations)]
				a[k], set[k] = v, true
			}
		}
		s, err := Parse(llama, a, 10*time.Minute)
		if err != nil {
			var ae *AnnotationError
			if !errors.As(err, &ae) || !set[ae.Annotation] && aliases[ae.Annotation] == "" {
				t.Fatalf("%v (%T): want an AnnotationError naming one of %v", err, err, a)
			}
			if len(err.Error()) > 2048 {
				t.Fatalf("the refusal is %d bytes long", len(err.Error()))
			}
			return
		}
		if !s.Enabled {
			if a[AnnotationAutoscale] == "true" {
				t.Fatalf("%v: not enabled", a)
			}
			return // the fuzzer set keda-kaito-scaler's switch off
		}
		so := Desired(Owner{APIVersion: "kaito.sh/v1alpha1", Kind: "InferenceSet", Namespace: "demo", Name: "llama", UID: "u"},
			s, Target{ScalerAddress: "pulse:9090"})
		checkScaledObject(t, so, s)
	})
}

// checkScaledObject checks what Desired made of s: its trigger as the
// scaler reads it, its replica bounds and its HPA behaviour.
func checkScaledObject(t *testing.T, so *unstructured.Unstructured, s Settings) {
	t.Helper()
	if _, err := json.Marshal(so.Object); err != nil {
		t.Fatalf("the ScaledObject does not marshal: %v", err)
	}
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	raw, _, _ := unstructured.NestedStringMap(triggers[0].(map[string]any), "metadata")
	tr, err := scaler.ParseTrigger(&externalscaler.ScaledObjectRef{Name: "llama", Namespace: "demo", ScalerMetadata: raw}, 10*time.Minute, nil)
	if err != nil {
		t.Fatalf("the scaler refuses the trigger written %v: %v", raw, err)
	}
	if !reflect.DeepEqual(tr, s.Parsed) {
		t.Fatalf("the trigger written %v reads as\n%+v\nnot as the annotations did\n%+v", raw, tr, s.Parsed)
	}
	minR, _, _ := unstructured.NestedInt64(so.Object, "spec", "minReplicaCount")
	maxR, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount")
	if minR < 0 || maxR < 1 || maxR < minR {
		t.Fatalf("replicas %d to %d", minR, maxR)
	}
	b, _, _ := unstructured.NestedMap(so.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior")
	for _, dir := range []string{"scaleUp", "scaleDown"} {
		if err := hpaRules(b[dir].(map[string]any)); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
	}
}

// hpaRules checks an HPA scaling rule against the autoscaling/v2 API's
// validation.
func hpaRules(r map[string]any) error {
	if w := r["stabilizationWindowSeconds"].(int64); w < 0 || w > 3600 {
		return fmt.Errorf("stabilizationWindowSeconds %d", w)
	}
	for _, p := range r["policies"].([]any) {
		p := p.(map[string]any)
		if ps := p["periodSeconds"].(int64); ps < 1 || ps > 1800 {
			return fmt.Errorf("periodSeconds %d", ps)
		}
		if v := p["value"].(int64); v < 1 {
			return fmt.Errorf("value %d", v)
		}
		if ty := p["type"].(string); !strings.Contains("Pods Percent", ty) || ty == "" {
			return fmt.Errorf("type %q", ty)
		}
	}
	return nil
}
