package provision

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var llama = Workload{Kind: "InferenceSet", Namespace: "demo", Name: "llama"}

func TestDefaultIsThePlanner(t *testing.T) {
	s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
	if err != nil || !s.Enabled || s.ViaKaito || !s.Planner {
		t.Fatalf("%+v %v", s, err)
	}
	want := map[string]string{"inferenceSet": "llama", "metric": "replicas", "threshold": "1", "window": "30s"}
	if !equalMaps(s.Trigger, want) {
		t.Errorf("trigger %v, want %v", s.Trigger, want)
	}
	if s.MinReplicas != 1 || s.MaxReplicas != 10 || s.CooldownSet {
		t.Errorf("%+v", s)
	}
	s, err = Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationSLOTTFT: "1500ms", AnnotationSLOITL: "80ms", AnnotationSLOPercentile: "90"}, time.Minute)
	if err != nil || s.Trigger["sloTtft"] != "1500ms" || s.Parsed.SLOTTFT != 1500*time.Millisecond || s.Trigger["sloItl"] != "80ms" ||
		s.Trigger["sloPercentile"] != "90" || s.Parsed.SLOPercentile != 90 || !strings.Contains(Summary(s), "p90 TTFT SLO of 1.5s and an ITL SLO of 80ms") {
		t.Fatalf("pulse.io/slo-ttft: trigger %v, summary %q, %v", s.Trigger, Summary(s), err)
	}
	// A bad percentile is refused naming its annotation.
	if _, err = Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationSLOPercentile: "150"}, time.Minute); err == nil || !strings.Contains(err.Error(), AnnotationSLOPercentile) {
		t.Fatalf("pulse.io/slo-percentile 150: %v, want an error naming it", err)
	}
}

// TestThresholdMetricDefaults: a threshold metric keeps the tuned
// behaviour's defaults.
func TestThresholdMetricDefaults(t *testing.T) {
	s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "running"}, time.Minute)
	if err != nil || s.Planner {
		t.Fatalf("%+v %v", s, err)
	}
	want := map[string]string{"inferenceSet": "llama", "metric": "running", "threshold": "64", "window": "10s"}
	if !equalMaps(s.Trigger, want) {
		t.Errorf("trigger %v, want %v", s.Trigger, want)
	}
	if s.ScaleUpPodsPerMinute != 2 || s.ScaleDownInterval != 10*time.Minute || s.ScaleDownDelay != 5*time.Minute {
		t.Errorf("%+v", s)
	}
}

func TestNotEnabled(t *testing.T) {
	for _, a := range []map[string]string{
		nil,
		{AnnotationAutoscale: "false", AnnotationThreshold: "nonsense"},
		// pulse's own "false" wins over keda-kaito-scaler's "true": the
		// workload is left to keda-kaito-scaler.
		{AnnotationAutoscale: "false", KaitoAutoProvision: "true"},
		{KaitoAutoProvision: "false"},
	} {
		s, err := Parse(llama, a, time.Minute)
		if err != nil || s.Enabled {
			t.Errorf("%v: %+v %v", a, s, err)
		}
	}
}

func TestKaitoAliases(t *testing.T) {
	s, err := Parse(llama, map[string]string{KaitoAutoProvision: "true", KaitoThreshold: "5", KaitoMinReplicas: "2", KaitoMaxReplicas: "4",
		KaitoMetricName: "vllm:num_requests_waiting", "scaledobject.kaito.sh/scaleupcooldown": "300"}, time.Minute)
	if err != nil || !s.Enabled || !s.ViaKaito {
		t.Fatalf("%+v %v", s, err)
	}
	if s.Trigger["metricName"] != "vllm:num_requests_waiting" || s.Parsed.Metric != "waiting" || s.Trigger["threshold"] != "5" ||
		s.MinReplicas != 2 || s.MaxReplicas != 4 {
		t.Errorf("%+v", s)
	}
	if len(s.Ignored) != 1 || s.Ignored[0] != "scaledobject.kaito.sh/scaleupcooldown" {
		t.Errorf("ignored %v", s.Ignored)
	}
	// Enabled through keda-kaito-scaler's annotation alone, the metric is
	// its own (waiting), so that its threshold keeps its meaning.
	s, err = Parse(llama, map[string]string{KaitoAutoProvision: "true", KaitoThreshold: "10"}, time.Minute)
	if err != nil || s.Parsed.Metric != "waiting" || s.Parsed.Threshold != 10 {
		t.Errorf("%+v %v", s, err)
	}
}

// TestKaitoKeysNotReadAreNamed: keda-kaito-scaler's composite metrics
// (metricName/0, upthreshold/0, ...) were neither read nor named, and the
// provisioner's cache dropped them: an InferenceSet written for them was
// provisioned on pulse's own trigger with no word of the metrics its user
// wrote. Every scaledobject.kaito.sh/ key pulse does not read is named, the
// first 16 in order, and the cache keeps their names.
func TestKaitoKeysNotReadAreNamed(t *testing.T) {
	a := map[string]string{KaitoAutoProvision: "true", KaitoMaxReplicas: "5",
		"scaledobject.kaito.sh/metricName/0": "inference_pool_per_pod_queue_size", "scaledobject.kaito.sh/upthreshold/0": "10",
		"scaledobject.kaito.sh/downthreshold/0": "2", "scaledobject.kaito.sh/combinepolicy": "and", "pulse.io/team": "a"}
	want := []string{"scaledobject.kaito.sh/combinepolicy", "scaledobject.kaito.sh/downthreshold/0", "scaledobject.kaito.sh/metricName/0", "scaledobject.kaito.sh/upthreshold/0"}
	s, err := Parse(llama, a, time.Minute)
	if err != nil || !s.Enabled || !slices.Equal(s.Ignored, want) {
		t.Fatalf("ignored %v, %v; want %v", s.Ignored, err, want)
	}
	cached, err := trimWorkload(workload(infSets, "InferenceSet", "llama", a))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Parse(llama, cached.(*metav1.PartialObjectMetadata).Annotations, time.Minute); err != nil || !slices.Equal(s.Ignored, want) {
		t.Fatalf("from the cache: ignored %v, %v; want %v", s.Ignored, err, want)
	}
	for i := range 20 {
		a[fmt.Sprintf("scaledobject.kaito.sh/quantile/%02d", i)] = "0.9"
	}
	s, _ = Parse(llama, a, time.Minute)
	if len(s.Ignored) != maxIgnored || s.Ignored[0] != want[0] || s.Ignored[maxIgnored-1] != "scaledobject.kaito.sh/quantile/12" {
		t.Fatalf("ignored %v: want the first %d in order", s.Ignored, maxIgnored)
	}
	cached, _ = trimWorkload(workload(infSets, "InferenceSet", "llama", a))
	if n := len(cached.(*metav1.PartialObjectMetadata).Annotations); n != 2+maxIgnored {
		t.Fatalf("the cache keeps %d annotations, want the two read and %d names", n, maxIgnored)
	}
}

func TestPulseMetricNames(t *testing.T) {
	for v, metric := range map[string]string{"kvCacheUsage": "kvCacheUsage", "vllm:num_requests_running": "running"} {
		s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: v}, time.Minute)
		if err != nil || s.Parsed.Metric != metric {
			t.Errorf("%s: %+v %v", v, s.Parsed, err)
		}
	}
	s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: "kvCacheUsage", AnnotationThreshold: "0.5",
		AnnotationActivationThreshold: "0.01", AnnotationWindow: "30s", AnnotationMinReplicas: "0", AnnotationMaxReplicas: "3",
		AnnotationScaleUpPodsPerMin: "4", AnnotationScaleDownInterval: "5m", AnnotationScaleDownDelay: "0", AnnotationCooldownPeriod: "600"},
		time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"inferenceSet": "llama", "metric": "kvCacheUsage", "threshold": "0.5", "activationThreshold": "0.01", "window": "30s"}
	if !equalMaps(s.Trigger, want) || s.MinReplicas != 0 || s.MaxReplicas != 3 || s.ScaleUpPodsPerMinute != 4 ||
		s.ScaleDownInterval != 5*time.Minute || s.ScaleDownDelay != 0 || s.CooldownPeriod != 10*time.Minute || !s.CooldownSet {
		t.Errorf("%+v", s)
	}
}

// TestInvalidAnnotationsNameTheAnnotation: each bad value is refused with
// the annotation it came from.
func TestInvalidAnnotationsNameTheAnnotation(t *testing.T) {
	on := func(kv ...string) map[string]string {
		m := map[string]string{AnnotationAutoscale: "true"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		annotations map[string]string
		annotation  string
		says        string
	}{
		{map[string]string{AnnotationAutoscale: "yes"}, AnnotationAutoscale, `want "true" or "false"`},
		{map[string]string{KaitoAutoProvision: "on"}, KaitoAutoProvision, `want "true" or "false"`},
		{on(AnnotationThreshold, "ten"), AnnotationThreshold, "not a finite number"},
		{on(AnnotationThreshold, "0"), AnnotationThreshold, "at least"},
		{on(KaitoAutoProvision, "true", KaitoThreshold, "-1"), KaitoThreshold, "at least"},
		{on(AnnotationThreshold, "5", KaitoThreshold, "6"), AnnotationThreshold, "disagrees"},
		{on(AnnotationMetric, "num requests"), AnnotationMetric, "neither"},
		// A name no agent may forward (--extra-metric) has no default.
		{on(AnnotationMetric, "queue"), AnnotationThreshold, "no default threshold"},
		{on(AnnotationMetric, "ttftSeconds"), AnnotationThreshold, "no default threshold"},
		{on(AnnotationWindow, "2m"), AnnotationWindow, "--max-window"},
		{on(AnnotationActivationThreshold, "-1"), AnnotationActivationThreshold, "negative"},
		{on(AnnotationActivationThreshold, "1e308"), AnnotationActivationThreshold, "at most"},
		{on(AnnotationMinReplicas, "-1"), AnnotationMinReplicas, "whole number"},
		{on(AnnotationMaxReplicas, "0"), AnnotationMaxReplicas, "whole number"},
		{on(AnnotationMaxReplicas, "2.5"), AnnotationMaxReplicas, "whole number"},
		{on(AnnotationMinReplicas, "4", AnnotationMaxReplicas, "3"), AnnotationMaxReplicas, "below min-replicas"},
		{on(KaitoMinReplicas, "4", KaitoMaxReplicas, "3"), KaitoMaxReplicas, "below min-replicas"},
		// The minimum alone above the default maximum names the minimum
		// (it named max-replicas, which the user had not written).
		{on(AnnotationMinReplicas, "12"), AnnotationMinReplicas, "above the default max-replicas (10): set pulse.io/max-replicas too"},
		{on(KaitoAutoProvision, "true", KaitoMinReplicas, "12"), KaitoMinReplicas, "above the default max-replicas (10)"},
		{on(AnnotationMetric, "waiting", AnnotationScaleUpPodsPerMin, "0"), AnnotationScaleUpPodsPerMin, "whole number"},
		{on(AnnotationMetric, "waiting", AnnotationScaleDownInterval, "1h"), AnnotationScaleDownInterval, "whole seconds"},
		{on(AnnotationMetric, "waiting", AnnotationScaleDownInterval, "1.5s"), AnnotationScaleDownInterval, "whole seconds"},
		{on(AnnotationMetric, "waiting", AnnotationScaleDownDelay, "soon"), AnnotationScaleDownDelay, "duration"},
		{on(AnnotationCooldownPeriod, "-5s"), AnnotationCooldownPeriod, "whole seconds"},
		// Seconds so negative that they wrapped, in nanoseconds, to 300 s.
		{on(AnnotationCooldownPeriod, "-36028797018963668"), AnnotationCooldownPeriod, "duration"},
		// A value is bounded before it is read or quoted.
		{on(AnnotationMinReplicas, strings.Repeat("9", 200<<10)), AnnotationMinReplicas, "longer than 256 bytes"},
		{on(KaitoAutoProvision, "true", KaitoThreshold, strings.Repeat("1", 300)), KaitoThreshold, "longer than 256 bytes"},
		// The planner holds capacity itself: no behaviour on top.
		{on(AnnotationScaleDownDelay, "10m"), AnnotationScaleDownDelay, "applies to threshold metrics"},
		{on(AnnotationScaleUpPodsPerMin, "4"), AnnotationScaleUpPodsPerMin, "applies to threshold metrics"},
		{on(AnnotationSLOTTFT, "fast"), AnnotationSLOTTFT, "duration"},
		{on(AnnotationSLOTTFT, "2s", AnnotationMetric, "waiting"), AnnotationSLOTTFT, "metric replicas only"},
		{on(AnnotationMetric, "replicas", AnnotationThreshold, "2"), AnnotationThreshold, "must be 1"},
		// A likely typo of an annotation pulse reads is named, not ignored.
		{on(AnnotationMaxReplicas[:len(AnnotationMaxReplicas)-1], "40"), AnnotationMaxReplicas[:len(AnnotationMaxReplicas)-1], "did you mean " + AnnotationMaxReplicas},
		{on("pulse.io/SLO-TTFT", "1s"), "pulse.io/SLO-TTFT", "did you mean " + AnnotationSLOTTFT},
		{map[string]string{"pulse.io/auto-scale": "true"}, "pulse.io/auto-scale", "did you mean " + AnnotationAutoscale},
	} {
		_, err := Parse(llama, c.annotations, time.Minute)
		var ae *AnnotationError
		if !errors.As(err, &ae) || ae.Annotation != c.annotation || !strings.Contains(err.Error(), c.says) || len(err.Error()) > 1024 {
			t.Errorf("%.300v: %.300v; want an error on %s saying %q, of at most 1 KiB", c.annotations, err, c.annotation, c.says)
		}
	}
}

// TestWhatIsNoTypoIsLeftAlone: a pulse.io/ annotation of a pod's (written
// on its workload too), one far from every annotation pulse reads, and a
// typo on a workload not enabled (but of pulse.io/autoscale) are no
// refusal; the cooldown and activation are taken with a minimum of 0.
func TestWhatIsNoTypoIsLeftAlone(t *testing.T) {
	// Read by KEDA only between 0 and 1 replicas: with a minimum of one
	// they are written, and said to have no effect (not refused: that
	// froze a ScaledObject provisioned with one before); the activation's
	// default, 0, is no news.
	for _, c := range []struct {
		annotations map[string]string
		says        string
	}{
		{map[string]string{AnnotationAutoscale: "true", AnnotationCooldownPeriod: "30m"}, "pulse.io/cooldown-period has no effect with pulse.io/min-replicas 1 (KEDA waits it only before scaling to zero)"},
		{map[string]string{AnnotationAutoscale: "true", AnnotationActivationThreshold: "0.5", AnnotationMinReplicas: "2", AnnotationMaxReplicas: "4"}, "pulse.io/activation-threshold has no effect with pulse.io/min-replicas 2"},
		{map[string]string{AnnotationAutoscale: "true", AnnotationActivationThreshold: "0"}, ""},
	} {
		s, err := Parse(llama, c.annotations, time.Minute)
		if err != nil || (c.says == "") != (len(s.Unused) == 0) || c.says != "" && !strings.Contains(strings.Join(s.Unused, "; "), c.says) {
			t.Errorf("%v: %v, unused %q; want %q", c.annotations, err, s.Unused, c.says)
		}
	}
	for _, a := range []map[string]string{
		{AnnotationAutoscale: "true", "pulse.io/scrape": "true", "pulse.io/port": "8000", "pulse.io/workload": "llama", "pulse.io/demand-source": "epp"},
		{AnnotationAutoscale: "true", "pulse.io/team": "inference", "pulse.io/owner-contact": "a@b.c"},
		{"pulse.io/max-replica": "40"},
		{AnnotationAutoscale: "false", "pulse.io/windows": "30s"},
		{AnnotationAutoscale: "true", AnnotationMinReplicas: "0", AnnotationCooldownPeriod: "30m", AnnotationActivationThreshold: "0.5"},
	} {
		if _, err := Parse(llama, a, time.Minute); err != nil {
			t.Errorf("%v: %v", a, err)
		}
	}
}

func TestEveryKindIsNamedInTheTrigger(t *testing.T) {
	for _, k := range Kinds {
		s, err := Parse(Workload{Kind: k.Kind, Namespace: "demo", Name: "w"}, map[string]string{AnnotationAutoscale: "true"}, time.Minute)
		if err != nil || s.Parsed.Workload.Kind != k.Kind || s.Parsed.Workload.Name != "w" {
			t.Errorf("%s: %+v %v", k.Kind, s.Parsed.Workload, err)
		}
	}
	if _, err := Parse(Workload{Kind: "CronJob", Namespace: "demo", Name: "w"}, map[string]string{AnnotationAutoscale: "true"}, time.Minute); err == nil {
		t.Error("a CronJob: no error")
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestLatencyTriggersAreAverages: a provisioned latency (or ratio) trigger
// is per replica: valueType average. Summed over replicas (the default,
// total), a p90 of 1.85 s against 1 s asked for 2 of 10 replicas and scaled
// a slow workload down.
func TestLatencyTriggersAreAverages(t *testing.T) {
	for m, want := range map[string]string{"ttftP90Seconds": "average", "ttftSeconds": "average", "itlP99Seconds": "average",
		"prefixCacheHitRate": "average", "waiting": "", "running": "", "promptTokensPerSecond": ""} {
		s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMetric: m, AnnotationThreshold: "1"}, time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		parsed := want
		if parsed == "" {
			parsed = "total"
		}
		if s.Trigger["valueType"] != want || s.Parsed.ValueType != parsed {
			t.Errorf("%s: valueType %q (parsed %q), want %q", m, s.Trigger["valueType"], s.Parsed.ValueType, want)
		}
		// The ScaledObject written: an average is read by the HPA as a
		// per-pod value only with metricType Value (KEDA's default is
		// AverageValue, a total).
		so := Desired(Owner{APIVersion: "kaito.sh/v1alpha1", Kind: "InferenceSet", Namespace: "demo", Name: "llama", UID: "u"}, s, Target{ScalerAddress: "pulse:9090"})
		triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
		got, _ := triggers[0].(map[string]any)["metricType"].(string)
		if wantType := map[string]string{"average": "Value"}[want]; got != wantType {
			t.Errorf("%s: the trigger's metricType %q, want %q", m, got, wantType)
		}
	}
}

// TestKaitoThresholdKeepsItsMetric: a workload enabled by pulse.io/autoscale
// that also carries keda-kaito-scaler's threshold annotation: that threshold
// is one of keda-kaito-scaler's metric (waiting); it was applied to pulse's
// default, running. pulse's own threshold with no metric keeps the meaning
// it was written with: running's (the default before the planner).
func TestKaitoThresholdKeepsItsMetric(t *testing.T) {
	s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", KaitoThreshold: "5"}, time.Minute)
	if err != nil || s.Trigger["metric"] != KaitoDefaultMetric || s.Trigger["threshold"] != "5" {
		t.Fatalf("trigger %v, %v; want waiting at 5", s.Trigger, err)
	}
	s, err = Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationThreshold: "48"}, time.Minute)
	if err != nil || s.Trigger["metric"] != ThresholdDefaultMetric {
		t.Fatalf("pulse's own threshold: trigger %v, %v; want %s", s.Trigger, err, ThresholdDefaultMetric)
	}
	s, err = Parse(llama, map[string]string{AnnotationAutoscale: "true", KaitoThreshold: "0.5", AnnotationMetric: "kvCacheUsage"}, time.Minute)
	if err != nil || s.Trigger["metric"] != "kvCacheUsage" {
		t.Fatalf("a named metric: trigger %v, %v", s.Trigger, err)
	}
}

// TestTheOperatorsCap: in a shared cluster with no quota one tenant's
// annotation asking for thousands of replicas made that many pods. The
// aggregator's --provision-max-replicas refuses bounds an annotation asks
// for past it, naming that annotation (Kaito's alias too); the default
// max-replicas is lowered to it (a workload that asked for nothing was
// refused under a cap below 10, naming an annotation it did not carry); 0
// leaves only the 10,000 of every workload.
func TestTheOperatorsCap(t *testing.T) {
	w := Workload{Kind: "Deployment", Namespace: "team-a", Name: "llama"}
	for _, c := range []struct {
		annotations map[string]string
		cap         int64
		refused     string
		max         int64 // the max-replicas provisioned, when not refused
	}{
		{map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "500"}, 0, "", 500},
		{map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "500"}, 64, AnnotationMaxReplicas, 0},
		{map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "100", AnnotationMaxReplicas: "200"}, 64, AnnotationMinReplicas, 0},
		{map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: "64"}, 64, "", 64},
		{map[string]string{AnnotationAutoscale: "true"}, 5, "", 5},   // the default 10 lowered to a cap of 5
		{map[string]string{AnnotationAutoscale: "true"}, 64, "", 10}, // the default under the cap
		{map[string]string{AnnotationAutoscale: "true", AnnotationMaxReplicas: " "}, 5, "", 5},
		{map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "6"}, 5, AnnotationMinReplicas, 0},
		{map[string]string{KaitoAutoProvision: "true", aliases[AnnotationMaxReplicas]: "9"}, 5, aliases[AnnotationMaxReplicas], 0},
		{map[string]string{AnnotationAutoscale: "false", AnnotationMaxReplicas: "500"}, 64, "", 0},
	} {
		s, err := Parse(w, c.annotations, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		err = ApplyCap(&s, c.cap)
		var ae *AnnotationError
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%v with a cap of %d: %v", c.annotations, c.cap, err)
		case c.refused == "" && s.Enabled && s.MaxReplicas != c.max:
			t.Errorf("%v with a cap of %d: max-replicas %d, want %d", c.annotations, c.cap, s.MaxReplicas, c.max)
		case c.refused != "" && (!errors.As(err, &ae) || ae.Annotation != c.refused || !strings.Contains(err.Error(), "--provision-max-replicas")):
			t.Errorf("%v with a cap of %d: %v, want %s refused", c.annotations, c.cap, err, c.refused)
		}
	}
}

// TestAnEmptyAnnotationIsUnset: an empty value is unset everywhere else
// (its default applies), but pulse's own annotation, empty (a Helm template
// rendering nothing), hid keda-kaito-scaler's alias and counted as set:
// "pulse.io/autoscale: \"\"" beside auto-provision "true" disabled the
// workload (its ScaledObject deleted), and an empty threshold moved the
// default metric from the planner to running.
func TestAnEmptyAnnotationIsUnset(t *testing.T) {
	s, err := Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationThreshold: " "}, time.Minute)
	if err != nil || s.Parsed.Metric != DefaultMetric {
		t.Fatalf("an empty threshold: metric %q (%v), want the default %q", s.Parsed.Metric, err, DefaultMetric)
	}
	s, err = Parse(llama, map[string]string{AnnotationAutoscale: "", KaitoAutoProvision: "true", AnnotationMinReplicas: "", KaitoMinReplicas: "2", KaitoMaxReplicas: "4"}, time.Minute)
	if err != nil || !s.Enabled || s.MinReplicas != 2 {
		t.Fatalf("pulse's annotations empty beside keda-kaito-scaler's: enabled %v, min %d (%v); want enabled by the alias, min 2", s.Enabled, s.MinReplicas, err)
	}
}

// TestKaitosMinReplicasBelowOneIsOne: keda-kaito-scaler takes a minimum
// below 1 as 1; pulse read its alias from 0, and an InferenceSet moved over
// unchanged with min-replicas "0" scaled to zero under pulse. pulse's own
// annotation still scales to zero.
func TestKaitosMinReplicasBelowOneIsOne(t *testing.T) {
	s, err := Parse(llama, map[string]string{KaitoAutoProvision: "true", KaitoMinReplicas: "0", KaitoMaxReplicas: "3"}, time.Minute)
	if err != nil || s.MinReplicas != 1 {
		t.Fatalf("keda-kaito-scaler's min-replicas 0: min %d (%v), want 1 as keda-kaito-scaler takes it", s.MinReplicas, err)
	}
	s, err = Parse(llama, map[string]string{AnnotationAutoscale: "true", AnnotationMinReplicas: "0", AnnotationMaxReplicas: "3"}, time.Minute)
	if err != nil || s.MinReplicas != 0 {
		t.Fatalf("pulse.io/min-replicas 0: min %d (%v), want 0", s.MinReplicas, err)
	}
	// A negative one is refused, naming the annotation and the bounds (as
	// docs/scaledobject.md says).
	_, err = Parse(llama, map[string]string{KaitoAutoProvision: "true", KaitoMinReplicas: "-1", KaitoMaxReplicas: "3"}, time.Minute)
	if err == nil || !strings.Contains(err.Error(), KaitoMinReplicas) || !strings.Contains(err.Error(), "from 0 to 10000") {
		t.Fatalf("keda-kaito-scaler's min-replicas -1: %v, want a refusal naming it and its bounds", err)
	}
}

// TestAliasesAgreeingInMeaningAreNoConflict: keda-kaito-scaler's
// min-replicas "0" is 1 (docs/scaledobject.md), so an InferenceSet moved
// over with it, and given pulse.io/min-replicas "1" to say so, asks for the
// same minimum under both names; the values were compared as strings and
// the workload refused ("disagrees"), its ScaledObject left as it was or
// never made. So were "5" and "05", and thresholds "10" and "10.0".
func TestAliasesAgreeingInMeaningAreNoConflict(t *testing.T) {
	w := Workload{Kind: "InferenceSet", Namespace: "demo", Name: "llama"}
	for _, a := range []map[string]string{
		{KaitoAutoProvision: "true", KaitoMinReplicas: "0", AnnotationMinReplicas: "1"},
		{KaitoAutoProvision: "true", KaitoMaxReplicas: "05", AnnotationMaxReplicas: "5"},
		{KaitoAutoProvision: "true", KaitoThreshold: "10", AnnotationThreshold: "10.0"},
	} {
		s, err := Parse(w, a, time.Minute)
		if err != nil || !s.Enabled {
			t.Errorf("%v: %v (enabled %v), want the values taken as the one setting they are", a, err, s.Enabled)
		}
	}
	// Values that differ in meaning are still refused: pulse's "0" (to
	// zero) and keda-kaito-scaler's "0" (1).
	if _, err := Parse(w, map[string]string{KaitoAutoProvision: "true", KaitoMinReplicas: "0", AnnotationMinReplicas: "0"}, time.Minute); err == nil || !strings.Contains(err.Error(), "as keda-kaito-scaler takes it") {
		t.Errorf("pulse.io/min-replicas 0 (zero) beside keda-kaito-scaler's 0 (one): %v, want refused, saying why", err)
	}
}
