package scaler

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/common/model"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// Trigger is a ScaledObject trigger's parsed metadata.
type Trigger struct {
	Workload            store.Key
	Metric              string
	Threshold           float64
	ActivationThreshold float64
	ValueType           string // total or average
	Aggregation         string // avg or max
	MissingPods         string // hold, seed or ignore
	Window              time.Duration
	StaleAfter          time.Duration
}

// Defaults of the trigger metadata (docs/scaledobject.md).
const (
	DefaultMetric     = "waiting"
	DefaultThreshold  = 10
	DefaultWindow     = 10 * time.Second
	DefaultStaleAfter = 5 * time.Second
	// MinThreshold is the smallest threshold KEDA can hand to the HPA.
	MinThreshold = 0.001
)

// workloadKeys map metadata keys to workload kinds; workspaceName is the
// seed design's alias of workspace.
var workloadKeys = []struct{ key, kind string }{
	{"workspace", store.KindWorkspace},
	{"workspaceName", store.KindWorkspace},
	{"inferenceSet", store.KindInferenceSet},
	{"deployment", store.KindDeployment},
	{"workload", store.KindWorkload},
}

// vllmNames are the vLLM sample names metricName accepts, as in the seed design.
var vllmNames = map[string]string{
	"vllm:num_requests_waiting": "waiting",
	"vllm:num_requests_running": "running",
	"vllm:num_requests_swapped": "swapped",
	"vllm:kv_cache_usage_perc":  "kvCacheUsage",
	"vllm:gpu_cache_usage_perc": "kvCacheUsage",
}

// MetadataError names the key at fault.
type MetadataError struct {
	Key, Msg string
	Err      error // the cause, if any
}

func (e *MetadataError) Error() string { return fmt.Sprintf("trigger metadata %q: %s", e.Key, e.Msg) }
func (e *MetadataError) Unwrap() error { return e.Err }

// ParseTrigger reads a ScaledObjectRef's metadata. maxWindow bounds window.
// When the metadata names no workload, resolver (if not nil) finds it from
// the ScaledObject's scaleTargetRef. Unknown keys are ignored.
func ParseTrigger(ref *externalscaler.ScaledObjectRef, maxWindow time.Duration, resolver TargetResolver) (Trigger, error) {
	md := ref.GetScalerMetadata()
	t := Trigger{Metric: DefaultMetric, Threshold: DefaultThreshold, ValueType: "total", Aggregation: "avg",
		MissingPods: MissingHold, Window: DefaultWindow, StaleAfter: DefaultStaleAfter}

	named := 0
	for _, wk := range workloadKeys {
		if v := md[wk.key]; v != "" {
			if named > 0 && t.Workload.Name != v || named > 0 && t.Workload.Kind != wk.kind {
				return t, &MetadataError{Key: wk.key, Msg: "name exactly one workload: workspace, inferenceSet, deployment or workload"}
			}
			t.Workload = store.Key{Kind: wk.kind, Name: v}
			named++
		}
	}
	if named == 0 {
		if resolver == nil {
			return t, &MetadataError{Key: "workspace", Msg: "no workload named: set one of workspace, inferenceSet, deployment or workload"}
		}
		kind, name, err := resolver.Resolve(ref.GetNamespace(), ref.GetName())
		if err != nil {
			return t, &MetadataError{Key: "workspace", Msg: fmt.Sprintf("no workload named, and the ScaledObject's scaleTargetRef could not be read: %v", err), Err: err}
		}
		k, ok := workloadKinds[kind]
		if !ok {
			return t, &MetadataError{Key: "workspace", Msg: fmt.Sprintf("no workload named, and scaleTargetRef kind %q is not one pulse knows: name the workload", kind)}
		}
		t.Workload = store.Key{Kind: k, Name: name}
	}
	t.Workload.Namespace = first(md["namespace"], md["workspaceNamespace"], ref.GetNamespace())
	if t.Workload.Namespace == "" {
		return t, &MetadataError{Key: "namespace", Msg: "no namespace given and the ScaledObject has none"}
	}

	if m := md["metric"]; m != "" {
		if _, ok := metric.Lookup(m); !ok {
			return t, &MetadataError{Key: "metric", Msg: fmt.Sprintf("unknown metric %q; one of %s", m, strings.Join(metric.Names(), ", "))}
		}
		t.Metric = m
	} else if m := md["metricName"]; m != "" {
		switch {
		case vllmNames[m] != "":
			t.Metric = vllmNames[m]
		default:
			if _, ok := metric.Lookup(m); !ok && !model.LegacyValidation.IsValidMetricName(m) {
				return t, &MetadataError{Key: "metricName", Msg: fmt.Sprintf("%q is neither a canonical metric nor a metric name", m)}
			}
			t.Metric = m // canonical, or a gauge forwarded with the agent's --extra-metric
		}
	}

	var err error
	if t.Threshold, err = number(md, "threshold", t.Threshold); err != nil {
		return t, err
	}
	if t.Threshold < MinThreshold {
		// KEDA renders the HPA's target in milli-units: a smaller one
		// becomes 0, which the API server rejects.
		return t, &MetadataError{Key: "threshold", Msg: fmt.Sprintf("must be at least %g (KEDA's resolution: the HPA's target is kept in thousandths)", MinThreshold)}
	}
	if t.ActivationThreshold, err = number(md, "activationThreshold", 0); err != nil {
		return t, err
	}
	if t.ActivationThreshold < 0 {
		return t, &MetadataError{Key: "activationThreshold", Msg: "must not be negative"}
	}
	if t.ValueType, err = oneOf(md, "valueType", t.ValueType, "total", "average"); err != nil {
		return t, err
	}
	if t.Aggregation, err = oneOf(md, "aggregation", t.Aggregation, "avg", "max"); err != nil {
		return t, err
	}
	if t.MissingPods, err = oneOf(md, "missingPods", t.MissingPods, MissingHold, MissingSeed, MissingIgnore, "conservative"); err != nil {
		return t, err
	}
	if t.MissingPods == "conservative" { // the name seed's rule had before hold existed
		t.MissingPods = MissingSeed
	}
	if t.Window, err = duration(md, "window", t.Window); err != nil {
		return t, err
	}
	if t.Window <= 0 || t.Window > maxWindow {
		return t, &MetadataError{Key: "window", Msg: fmt.Sprintf("must be above 0 and at most %s (the aggregator's --max-window)", maxWindow)}
	}
	if t.StaleAfter, err = duration(md, "staleAfter", t.StaleAfter); err != nil {
		return t, err
	}
	if t.StaleAfter <= 0 {
		return t, &MetadataError{Key: "staleAfter", Msg: "must be above 0"}
	}
	return t, nil
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func number(md map[string]string, key string, def float64) (float64, error) {
	s, ok := md[key]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not a finite number", s)}
	}
	return v, nil
}

func oneOf(md map[string]string, key, def string, allowed ...string) (string, error) {
	s, ok := md[key]
	if !ok || s == "" {
		return def, nil
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not one of %s", s, strings.Join(allowed, ", "))}
}

func duration(md map[string]string, key string, def time.Duration) (time.Duration, error) {
	s, ok := md[key]
	if !ok || s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not a duration such as 10s", s)}
	}
	return d, nil
}
