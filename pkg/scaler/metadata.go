package scaler

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
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
	// Load are saturation's targets (kvCacheTarget, waitingTarget,
	// runningTarget).
	Load metric.LoadTargets
	// SLOTTFT is the replicas trigger's time-to-first-token SLO (sloTtft);
	// SLOITL its optional inter-token latency SLO (sloItl). 0: the default,
	// and none.
	SLOTTFT, SLOITL time.Duration
	// SLOPercentile (sloPercentile, e.g. 90) makes the TTFT SLO a
	// percentile's; 0: the planner plans on means.
	SLOPercentile float64
	def           metric.Def // Def(), resolved by ParseTrigger
	// fromTarget: the workload was read from the ScaledObject's
	// scaleTargetRef (no workload key in the metadata).
	fromTarget bool
	// Owner is the ScaledObject's namespace (ParseTrigger; the workload's
	// when empty): the tenant whose room the planner's state takes.
	Owner string
}

// Def is the metric the trigger scales on, with its parameters: a
// canonical metric, or an extra gauge (metric.Extra). ParseTrigger
// resolves it once; a Trigger built by hand resolves it here.
func (t Trigger) Def() metric.Def {
	if t.def.Name == t.Metric && t.def.Name != "" {
		return t.def
	}
	d, ok := metric.Lookup(t.Metric)
	if !ok {
		return metric.Extra(t.Metric)
	}
	if d.Rule == metric.RuleLoad {
		d = d.WithLoad(t.Load)
	}
	return d
}

// Defaults of the trigger metadata (docs/scaledobject.md).
const (
	DefaultMetric     = "waiting"
	DefaultWindow     = 10 * time.Second
	DefaultStaleAfter = 5 * time.Second
	// MaxStaleAfter bounds staleAfter (the aggregator's default
	// --pod-expiry).
	MaxStaleAfter = 10 * time.Minute
	// MinDuration is the shortest window or staleAfter: a second, the
	// agent's default scrape interval (1ns had every pod stale, or a
	// window of one sample or none, on every call).
	MinDuration = time.Second
	// MinThreshold is the smallest threshold KEDA can hand to the HPA.
	MinThreshold = 0.001
	// MaxThreshold is the largest: KEDA's milli-units of it, and
	// targetSize, stay far within an int64.
	MaxThreshold = 1e12
	// MaxValue is the largest value answered (past it an error): KEDA
	// keeps a value in thousandths in an int64, which past about 9.2e15
	// wraps negative.
	MaxValue = 1e15
	// DefaultMaxWindow is the aggregator's --max-window: the longest window
	// a trigger may ask for (pulse-sim checks triggers against the same).
	DefaultMaxWindow = time.Minute
)

// DefaultThresholds are the per-replica thresholds of the metrics that have a
// sensible starting value when the trigger sets none (docs/scaledobject.md,
// "Choosing a threshold", says why each). Every other metric needs threshold
// set: a default that fits one metric's scale (10 for waiting) scales another
// (a 0-1 ratio, a rate) never or always.
var DefaultThresholds = map[string]float64{
	// Requests queued per replica: vLLM admits up to its batch at once, so
	// 10 waiting is a queue that costs seconds of TTFT.
	"waiting": 10,
	// Requests in the batch per replica: pulse-sim's tune on the shipped
	// trace found 64 for Llama-3.1-8B on one H100 (docs/simulation.md).
	"running": 64,
	// vLLM V0 swaps out only under KV-cache pressure: any is a shortage.
	"swapped": 1,
	// A fraction of the KV cache: pulse-sim's tune found 0.4 kept 94 % of
	// requests under 2 s where 0.6 kept 74 % (docs/simulation.md).
	"kvCacheUsage": 0.4,
	// Each replica's load fraction: at 1 the HPA asks for the replicas
	// that would each be fully loaded.
	"saturation": 1,
	// The planner's value is a replica count: the HPA's target is 1.
	MetricReplicas: 1,
}

// workloadKeys map metadata keys to workload kinds; workspaceName is the key
// keda-kaito-scaler's proposal uses for workspace.
var workloadKeys = []struct{ key, kind string }{
	{"workspace", store.KindWorkspace},
	{"workspaceName", store.KindWorkspace},
	{"inferenceSet", store.KindInferenceSet},
	{"deployment", store.KindDeployment},
	{"statefulSet", store.KindStatefulSet},
	{"leaderWorkerSet", store.KindLeaderWorkerSet},
	{"workload", store.KindWorkload},
}

// WorkloadKey is the trigger metadata key that names a workload of kind (a
// store kind), or "" if none does.
func WorkloadKey(kind string) string {
	for _, wk := range workloadKeys {
		if wk.kind == kind {
			return wk.key
		}
	}
	return ""
}

// WorkloadKeys are the trigger metadata keys that name a workload, in
// the order they are read.
func WorkloadKeys() []string {
	keys := make([]string, len(workloadKeys))
	for i, wk := range workloadKeys {
		keys[i] = wk.key
	}
	return keys
}

// workloadKeyList names the keys for messages (the aliases left out).
var workloadKeyList = func() string {
	var names []string
	for _, wk := range workloadKeys {
		if wk.key != "workspaceName" {
			names = append(names, wk.key)
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}()

// vllmNames are the vLLM sample names metricName accepts, as
// keda-kaito-scaler's proposal writes them.
var vllmNames = map[string]string{
	"vllm:num_requests_waiting": "waiting",
	"vllm:num_requests_running": "running",
	"vllm:num_requests_swapped": "swapped",
	"vllm:kv_cache_usage_perc":  "kvCacheUsage",
	"vllm:gpu_cache_usage_perc": "kvCacheUsage",
}

// metricNames matches a metricName no agent forwards to the names pulse
// knows: its canonical metrics, replicas and the vLLM names metricName
// accepts (Server.forwarded's hint; a name near one of them can be a real
// gauge, vllm:cpu_cache_usage_perc, forwarded as it is named).
var metricNames = NewMatcher(append(append(metric.Names(), MetricReplicas), slices.Sorted(maps.Keys(vllmNames))...))

// MetadataError names the key at fault.
type MetadataError struct {
	Key, Msg string
	Err      error // the cause, if any
}

func (e *MetadataError) Error() string {
	if e.Key == "" {
		return "trigger metadata: " + e.Msg
	}
	return fmt.Sprintf("trigger metadata %q: %s", e.Key, e.Msg)
}
func (e *MetadataError) Unwrap() error { return e.Err }

// ParseTrigger reads a ScaledObjectRef's metadata. maxWindow bounds window.
// When the metadata names no workload, resolver (if not nil) finds it from
// the ScaledObject's scaleTargetRef. A key that is neither pulse's nor
// KEDA's is ignored, unless it is one edit or two from one of pulse's: that
// is a typo, and an error that names the key meant.
func ParseTrigger(ref *externalscaler.ScaledObjectRef, maxWindow time.Duration, resolver TargetResolver) (Trigger, error) {
	t := Trigger{Metric: DefaultMetric, ValueType: "total", Aggregation: "avg",
		MissingPods: MissingHold, Window: DefaultWindow, StaleAfter: DefaultStaleAfter, Load: metric.DefaultLoad}
	md, err := metadata(ref.GetScalerMetadata())
	if err != nil {
		return t, err
	}
	t.Owner = ref.GetNamespace()
	if err := parseWorkload(ref, md, resolver, &t); err != nil {
		return t, err
	}
	if err := parseMetric(md, &t); err != nil {
		return t, err
	}
	def, hasDefault := DefaultThresholds[t.Metric]
	if md["threshold"] == "" && !hasDefault {
		return t, &MetadataError{Key: "threshold", Msg: fmt.Sprintf("metric %s has no default threshold (its scale depends on the model and the hardware): set one; docs/scaledobject.md, \"Choosing a threshold\"", wire.CleanText(t.Metric, 64))}
	}
	if t.Threshold, err = number(md, "threshold", def); err != nil {
		return t, err
	}
	if t.Threshold < MinThreshold || t.Threshold > MaxThreshold {
		// KEDA renders the HPA's target in milli-units: a smaller one
		// becomes 0, which the API server rejects; a larger one than
		// MaxThreshold overflows them (and targetSize's int64).
		return t, &MetadataError{Key: "threshold", Msg: fmt.Sprintf("must be at least %g (KEDA's resolution: the HPA's target is kept in thousandths) and at most %g", MinThreshold, MaxThreshold)}
	}
	if float64(KEDAMilli(t.Threshold))/1000 != t.Threshold { // exact: the quotient, as the parse of "%.3f", is correctly rounded
		// KEDA prints the target to thousandths for the HPA: 0.0015
		// became 0.002 there, while pulse filled a missing pod against
		// 0.0015, so a pod failing could ask the HPA for fewer.
		return t, &MetadataError{Key: "threshold", Msg: fmt.Sprintf("%g is not a whole number of thousandths: KEDA gives the HPA its target in thousandths, where it would be %.3f; write that or another multiple of 0.001", t.Threshold, t.Threshold)}
	}
	if t.ActivationThreshold, err = number(md, "activationThreshold", 0); err != nil {
		return t, err
	}
	if t.ActivationThreshold < 0 || t.ActivationThreshold > MaxThreshold {
		// Bounded as threshold is: past it no value ever activates, and
		// a workload at zero never scales up, with no error to say why.
		return t, &MetadataError{Key: "activationThreshold", Msg: fmt.Sprintf("must not be negative, and at most %g", MaxThreshold)}
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
	if t.MissingPods == "conservative" { // seed's former name
		t.MissingPods = MissingSeed
	}
	if t.Metric == MetricReplicas {
		t.Window = DefaultPlanWindow
	}
	if t.Window, err = duration(md, "window", t.Window); err != nil {
		return t, err
	}
	if t.Window < MinDuration || t.Window > maxWindow {
		return t, &MetadataError{Key: "window", Msg: fmt.Sprintf("must be at least %s and at most %s (the aggregator's --max-window)", MinDuration, maxWindow)}
	}
	if t.StaleAfter, err = duration(md, "staleAfter", t.StaleAfter); err != nil {
		return t, err
	}
	if t.StaleAfter < MinDuration || t.StaleAfter > MaxStaleAfter {
		// Past it a pod whose agent is gone would count as fresh for
		// ever, rather than answer the error that KEDA's fallback takes.
		return t, &MetadataError{Key: "staleAfter", Msg: fmt.Sprintf("must be at least %s and at most %s", MinDuration, MaxStaleAfter)}
	}
	if err := loadTargets(md, &t); err != nil {
		return t, err
	}
	if err := planKeys(md, &t); err != nil {
		return t, err
	}
	t.def = t.Def()
	return t, nil
}

// parseWorkload reads the workload a trigger names (or its ScaledObject's
// scaleTargetRef, through resolver) and its namespace.
func parseWorkload(ref *externalscaler.ScaledObjectRef, md map[string]string, resolver TargetResolver, t *Trigger) error {
	// Too long, each is kept cut, whatever else refuses the trigger: the
	// refusal's record (and its series' labels) held up to a kilobyte of
	// it (and did still where two keys named two workloads, or two
	// namespaces, the refusal returned before the cut).
	// A name with a control or format character is kept quoted, so that
	// no record shows it raw.
	defer func() {
		if !wire.IsName(t.Workload.Name) {
			t.Workload.Name = strconv.Quote(t.Workload.Name)
		}
		if len(t.Workload.Name) > maxWorkloadName {
			t.Workload.Name = CutName(t.Workload.Name)
		}
		if !wire.IsName(t.Workload.Namespace) {
			t.Workload.Namespace = strconv.Quote(t.Workload.Namespace)
		}
		if len(t.Workload.Namespace) > maxNamespace {
			t.Workload.Namespace = wire.CleanText(t.Workload.Namespace, maxNamespace)
		}
	}()
	named := 0
	for _, wk := range workloadKeys {
		if v := md[wk.key]; v != "" {
			if named > 0 && t.Workload.Name != v || named > 0 && t.Workload.Kind != wk.kind {
				return &MetadataError{Key: wk.key, Msg: "name exactly one workload: " + workloadKeyList}
			}
			t.Workload = store.Key{Kind: wk.kind, Name: v}
			named++
		}
	}
	if named == 0 {
		if resolver == nil {
			return &MetadataError{Msg: "no workload named: set one of " + workloadKeyList + " (or run the aggregator with --resolve-scale-targets to take it from scaleTargetRef)"}
		}
		kind, name, err := resolver.Resolve(ref.GetNamespace(), ref.GetName())
		if err != nil {
			return &MetadataError{Msg: fmt.Sprintf("no workload named, and the ScaledObject's scaleTargetRef could not be read: %v", err), Err: err}
		}
		k, ok := workloadKinds[kind]
		if !ok {
			return &MetadataError{Msg: fmt.Sprintf("no workload named, and scaleTargetRef kind %q is not one pulse knows: name the workload with %s", kind, workloadKeyList)}
		}
		t.Workload = store.Key{Kind: k, Name: name}
		t.fromTarget = true
	}
	if a, b := md["namespace"], md["workspaceNamespace"]; a != "" && b != "" && a != b {
		// One of the two was silently ignored.
		return &MetadataError{Key: "workspaceNamespace", Msg: fmt.Sprintf("names namespace %q where namespace names %q: give one (workspaceNamespace is namespace's other name)", wire.CleanText(b, 64), wire.CleanText(a, 64))}
	}
	t.Workload.Namespace = first(md["namespace"], md["workspaceNamespace"], ref.GetNamespace())
	if t.Workload.Namespace == "" {
		return &MetadataError{Key: "namespace", Msg: "no namespace given and the ScaledObject has none"}
	}
	if len(t.Workload.Name) > maxWorkloadName {
		return &MetadataError{Msg: fmt.Sprintf("the workload's name is over %d bytes (an object's name)", maxWorkloadName)}
	}
	if len(t.Workload.Namespace) > maxNamespace {
		return &MetadataError{Key: "namespace", Msg: fmt.Sprintf("over %d bytes (a namespace's name)", maxNamespace)}
	}
	// As the agents' catalogue entries are (no pod's workload could match
	// one): written raw into a refusal, a newline in a namespace forged a
	// line of KEDA's events and the HPA's condition.
	if !wire.IsName(t.Workload.Name) {
		return &MetadataError{Msg: fmt.Sprintf("the workload's name %s is not UTF-8 of graphic characters alone (no object's name has a control or format character)", strconv.Quote(wire.CleanText(t.Workload.Name, 64)))}
	}
	if !wire.IsName(t.Workload.Namespace) {
		return &MetadataError{Key: "namespace", Msg: fmt.Sprintf("%s is not UTF-8 of graphic characters alone (no namespace's name has a control or format character)", strconv.Quote(wire.CleanText(t.Workload.Namespace, 64)))}
	}
	// A namespace is a DNS label, as the ScaledObject's own is checked:
	// with --allow-cross-namespace-triggers one holding a slash or a dot
	// (x./.y beside workload z, x. beside .y/z) made two triggers of one
	// ScaledObject two records of the same series' labels, which the
	// registry refused at every scrape.
	if msgs := validation.IsDNS1123Label(t.Workload.Namespace); len(msgs) > 0 {
		return &MetadataError{Key: "namespace", Msg: fmt.Sprintf("%s is no namespace's name: %s", strconv.Quote(wire.CleanText(t.Workload.Namespace, 64)), strings.Join(msgs, "; "))}
	}
	return nil
}

// parseMetric reads metric or metricName; both, naming different metrics,
// are refused (metricName was ignored).
func parseMetric(md map[string]string, t *Trigger) error {
	if m := md["metric"]; m != "" {
		if _, ok := metric.Lookup(m); !ok && m != MetricReplicas {
			return &MetadataError{Key: "metric", Msg: fmt.Sprintf("unknown metric %q; one of %s or %s", wire.CleanText(m, 64), MetricReplicas, strings.Join(metric.Names(), ", "))}
		}
		t.Metric = m
		if n := md["metricName"]; n != "" && n != m && vllmNames[n] != m {
			return &MetadataError{Key: "metricName", Msg: fmt.Sprintf("names %q where metric names %q: give one (metricName is metric's other name)", wire.CleanText(n, 64), m)}
		}
	} else if m := md["metricName"]; m != "" {
		switch {
		case vllmNames[m] != "":
			t.Metric = vllmNames[m]
		default:
			if _, ok := metric.Lookup(m); !ok && !model.LegacyValidation.IsValidMetricName(m) {
				return &MetadataError{Key: "metricName", Msg: fmt.Sprintf("%q is neither a canonical metric nor a metric name", wire.CleanText(m, 64))}
			}
			t.Metric = m // canonical, or a gauge forwarded with the agent's --extra-metric
		}
	}
	return nil
}

// MinSLOTTFT is the least sloTtft the planner takes. A replica whose mean
// queue time is past a quarter of the SLO is past its capacity
// (planner.breakQueue); a request waits for the engine's next scheduling
// step however few arrive (half a step on average, tens of milliseconds),
// and under an SLO of 1 ms every window of requests queued 0.5 ms broke:
// the capacity followed each replica's share down and the plan rose by a
// quarter at every round (4 replicas to 269 at an unchanged load). A
// slower engine's step can still be past a quarter of 100 ms: its plan's
// breaks (/debug/triggers) then show a queue time at every load.
const MinSLOTTFT = 100 * time.Millisecond

// planKeys checks a replicas trigger: its value is a replica count, so the
// HPA's target must be 1 per replica (threshold 1, valueType total); and
// reads its SLOs. sloTtft, sloItl or sloPercentile on another metric is an
// error (it would be ignored).
func planKeys(md map[string]string, t *Trigger) error {
	for _, k := range []struct {
		key string
		v   *time.Duration
	}{{"sloTtft", &t.SLOTTFT}, {"sloItl", &t.SLOITL}} {
		if md[k.key] == "" {
			continue
		}
		if t.Metric != MetricReplicas {
			return &MetadataError{Key: k.key, Msg: "applies to metric replicas only (the planner); other metrics scale on their threshold"}
		}
		var err error
		if *k.v, err = duration(md, k.key, 0); err != nil {
			return err
		}
		if *k.v <= 0 || *k.v > 10*time.Minute {
			return &MetadataError{Key: k.key, Msg: "must be above 0 and at most 10m"}
		}
	}
	if t.SLOTTFT != 0 && t.SLOTTFT < MinSLOTTFT {
		return &MetadataError{Key: "sloTtft", Msg: fmt.Sprintf("must be at least %s: a request's queue time is judged against a quarter of it, and below %s that is the engine's own scheduling step, which no replica count shortens", MinSLOTTFT, MinSLOTTFT/4)}
	}
	if md["sloPercentile"] != "" {
		if t.Metric != MetricReplicas {
			return &MetadataError{Key: "sloPercentile", Msg: "applies to metric replicas only (the planner); other metrics scale on their threshold"}
		}
		var err error
		if t.SLOPercentile, err = number(md, "sloPercentile", 0); err != nil {
			return err
		}
		if !(t.SLOPercentile >= 50 && t.SLOPercentile < 100) {
			return &MetadataError{Key: "sloPercentile", Msg: "must be at least 50 and below 100 (90: 90 % of first tokens within sloTtft)"}
		}
	}
	if t.Metric != MetricReplicas {
		return nil
	}
	switch {
	case t.Threshold != 1:
		return &MetadataError{Key: "threshold", Msg: fmt.Sprintf("metric replicas is a replica count: its threshold must be 1 (the HPA's target per replica), not %g", t.Threshold)}
	case t.ValueType != "total":
		return &MetadataError{Key: "valueType", Msg: "metric replicas is the workload's replica count: valueType must be total (metricType AverageValue)"}
	case md["aggregation"] != "":
		// Checked, then ignored: the planner aggregates no replica's value.
		return &MetadataError{Key: "aggregation", Msg: "does not apply to metric replicas: the planner plans from every replica's work, and aggregates no value of theirs"}
	case md["missingPods"] != "":
		return &MetadataError{Key: "missingPods", Msg: "does not apply to metric replicas: the planner holds a replica with no fresh sample by its own rule (docs/planner.md, \"Safety\")"}
	}
	return nil
}

// loadTargets reads saturation's targets: each at least 0 (0 leaves its
// gauge out), at least one above 0, the KV cache's at most 1. One on
// another metric is an error: it was checked, then ignored.
func loadTargets(md map[string]string, t *Trigger) error {
	d, ok := metric.Lookup(t.Metric)
	load := ok && d.Rule == metric.RuleLoad
	var err error
	for _, c := range []struct {
		key string
		v   *float64
	}{{"kvCacheTarget", &t.Load.KVCache}, {"waitingTarget", &t.Load.Waiting}, {"runningTarget", &t.Load.Running}} {
		if md[c.key] != "" && !load {
			return &MetadataError{Key: c.key, Msg: fmt.Sprintf("applies to metric saturation only; metric %s scales on its threshold", wire.CleanText(t.Metric, 64))}
		}
		if *c.v, err = number(md, c.key, *c.v); err != nil {
			return err
		}
		if *c.v < 0 {
			return &MetadataError{Key: c.key, Msg: "must not be negative (0 leaves its gauge out of saturation)"}
		}
		// As threshold's bounds: a target of 1e308 measured nothing (the
		// load about 0 for ever, never scaling up), one of 1e-320 divided
		// to infinity at the first evaluation.
		if *c.v != 0 && (*c.v < MinThreshold || *c.v > MaxThreshold) {
			return &MetadataError{Key: c.key, Msg: fmt.Sprintf("must be 0 (leaving its gauge out) or from %g to %g", MinThreshold, MaxThreshold)}
		}
	}
	if t.Load.KVCache > 1 {
		return &MetadataError{Key: "kvCacheTarget", Msg: "is a fraction of the KV cache: at most 1"}
	}
	if t.Load == (metric.LoadTargets{}) {
		return &MetadataError{Key: "kvCacheTarget", Msg: "kvCacheTarget, waitingTarget and runningTarget are all 0: saturation has nothing to measure"}
	}
	return nil
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
		return 0, &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not a finite number", wire.CleanText(s, 64))}
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
	return "", &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not one of %s", wire.CleanText(s, 64), strings.Join(allowed, ", "))}
}

func duration(md map[string]string, key string, def time.Duration) (time.Duration, error) {
	s, ok := md[key]
	if !ok || s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s)) // as number's: " 30s" was refused where " 5" was read
	if err != nil {
		return 0, &MetadataError{Key: key, Msg: fmt.Sprintf("%q is not a duration such as 10s", wire.CleanText(s, 64))}
	}
	return d, nil
}

// pulseKeys are the trigger metadata keys pulse reads: the workload keys
// and these.
var pulseKeys = func() []string {
	keys := []string{}
	for _, wk := range workloadKeys {
		keys = append(keys, wk.key)
	}
	return append(keys, "namespace", "workspaceNamespace", "metric", "metricName", "threshold", "activationThreshold",
		"valueType", "aggregation", "missingPods", "window", "staleAfter", "kvCacheTarget", "waitingTarget", "runningTarget", "sloTtft", "sloItl", "sloPercentile")
}()

// FromEnvKeys are the keys of pulse's that md takes from the scale
// target's environment (<key>FromEnv, the key itself unset), sorted: KEDA
// resolves each and forwards its value, which a manifest does not hold.
func FromEnvKeys(md map[string]string) []string {
	var keys []string
	for k := range md {
		if base, ok := fromEnvOf(md, k); ok {
			keys = append(keys, base)
		}
	}
	slices.Sort(keys)
	return keys
}

// fromEnvOf is the key of pulse's that k, a key of md, sets from the
// scale target's environment (<key>FromEnv, the key itself unset in md;
// set, it wins).
func fromEnvOf(md map[string]string, k string) (string, bool) {
	base, ok := strings.CutSuffix(k, "FromEnv")
	return base, ok && slices.Contains(pulseKeys, base) && md[base] == ""
}

// kedaKeys are KEDA's own keys of an external-push trigger (and of its
// TriggerAuthentication), which KEDA forwards too.
var kedaKeys = []string{"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey", "tlsCertFile"}

// The metadata is bounded before any work is done on it: at most
// maxMetadataKeys keys (pulse and KEDA know fewer than 40), each key and
// value at most maxMetadataBytes; a workload's name at most
// maxWorkloadName bytes (an object's name) and its namespace at most
// maxNamespace (a DNS label), as the agents' catalogue cannot list longer.
// Every request parses the metadata, and a record keeps what parsed.
const (
	maxMetadataKeys  = 64
	maxMetadataBytes = 1024
	maxWorkloadName  = wire.MaxName
	maxNamespace     = 63
)

// known holds pulseKeys and kedaKeys, for the lookup every call makes.
var known = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range append(slices.Clone(pulseKeys), kedaKeys...) {
		m[k] = true
	}
	return m
}()

// metadata returns the trigger's metadata with each "<key>FromEnv" of one of
// pulse's keys read as that key (KEDA resolves the variable and forwards the
// value under the FromEnv name), after checking that no key is a typo of
// one of pulse's. It copies the map only when a FromEnv key applies.
func metadata(in map[string]string) (map[string]string, error) {
	if len(in) > maxMetadataKeys {
		return nil, &MetadataError{Msg: fmt.Sprintf("%d metadata keys; at most %d", len(in), maxMetadataKeys)}
	}
	for k, v := range in {
		if len(k) > maxMetadataBytes || len(v) > maxMetadataBytes {
			return nil, &MetadataError{Msg: fmt.Sprintf("key %q or its value is over %d bytes", wire.CleanText(k, 64), maxMetadataBytes)}
		}
	}
	out, copied := in, false
	typo, meantBy := "", "" // the first typo by key: the map's order is random
	for k, v := range in {
		if known[k] {
			continue
		}
		base, fromEnv := strings.CutSuffix(k, "FromEnv")
		if fromEnv && known[base] {
			if _, ok := fromEnvOf(in, k); ok {
				if !copied {
					out, copied = maps.Clone(in), true
				}
				out[base] = v
			}
			continue
		}
		if meant := nearestKey(base); meant != "" && (typo == "" || k < typo) {
			if fromEnv {
				meant += "FromEnv"
			}
			typo, meantBy = k, meant
		}
	}
	if typo != "" {
		return nil, &MetadataError{Msg: fmt.Sprintf("unknown key %s (did you mean %s?)", wire.OneLine(typo), meantBy)}
	}
	return out, nil
}

// nearestKey is the key of pulse's that k is a likely typo of (the same but
// for case, or within one edit, two for keys over five letters); "" when
// none is.
//
// The work is bounded before it is done: a key that cannot be within two
// edits of any of pulse's (longer than the longest by more than two) gets no
// hint, and each candidate is skipped unless their lengths are within its
// limit, so an unknown key of any length costs no more than a short one
// (a 1 MiB key once cost seconds of CPU and gigabytes of allocation).
func nearestKey(k string) string { return nearestIn(k, pulseKeys, foldedPulseKeys, maxPulseKey) }

// Nearest is the name of names that k is a likely typo of, as nearestKey
// judges one (the same but for case, or within one edit, two for names
// over five letters; each at most 30 runes); "" when none is.
func Nearest(k string, names []string) string { return NewMatcher(names).Nearest(k) }

// Matcher is Nearest over one list of names, their folded forms made once
// (Nearest makes them at each call).
type Matcher struct {
	names   []string
	fnames  [][]rune
	longest int
}

// NewMatcher returns the Matcher of names.
func NewMatcher(names []string) *Matcher {
	m := &Matcher{names: names, fnames: make([][]rune, len(names))}
	for i, p := range names {
		var r [maxEdited]rune
		m.fnames[i] = slices.Clone(r[:folded(&r, p)])
		m.longest = max(m.longest, len(p))
	}
	return m
}

// Nearest is Nearest(k, the Matcher's names).
func (m *Matcher) Nearest(k string) string { return nearestIn(k, m.names, m.fnames, m.longest) }

// nearestIn is nearestKey over names, whose folded forms are fnames and
// whose longest is longest bytes.
func nearestIn(k string, names []string, fnames [][]rune, longest int) string {
	if len(k) > longest+2 {
		return ""
	}
	var kr [maxEdited]rune
	n := folded(&kr, k)
	best, bestD := "", 3
	for i, p := range names {
		fp := fnames[i]
		if slices.Equal(kr[:n], fp) {
			return p
		}
		limit := 1
		if len(p) > 5 {
			limit = 2
		}
		if n > len(fp)+limit || n < len(fp)-limit {
			continue // more edits apart than the limit
		}
		if d := editDistance(kr[:n], fp, limit); d <= limit && d < bestD {
			best, bestD = p, d
		}
	}
	return best
}

// foldedPulseKeys are pulseKeys lower-cased, as runes.
var foldedPulseKeys = func() [][]rune {
	out := make([][]rune, len(pulseKeys))
	for i, p := range pulseKeys {
		var r [maxEdited]rune
		out[i] = slices.Clone(r[:folded(&r, p)])
	}
	return out
}()

// maxPulseKey is the length of pulse's longest metadata key.
var maxPulseKey = func() int {
	n := 0
	for _, p := range pulseKeys {
		n = max(n, len(p))
	}
	return n
}()

// editDistance is the optimal string alignment distance of a and b (each
// at most maxEdited runes, case folded: folded): insertions, deletions,
// substitutions and swaps of adjacent letters; past limit, limit+1 (it
// stops at the first row all past it). It allocates nothing: every unknown
// key of every call's metadata is measured against every key of pulse's,
// and a matrix each, to the end, had made 63 unknown keys cost 2,899
// allocations and 0.5 ms a parse, on every call KEDA makes.
func editDistance(ra, rb []rune, limit int) int {
	ra, rb = ra[:min(len(ra), maxEdited)], rb[:min(len(rb), maxEdited)]
	na, nb := len(ra), len(rb)
	var rows [3][maxEdited + 1]int
	prev2, prev, cur := &rows[0], &rows[1], &rows[2]
	for j := 0; j <= nb; j++ {
		prev[j] = j
	}
	leastPrev := 0 // the least of row 0
	for i := 1; i <= na; i++ {
		cur[0] = i
		least := i
		for j := 1; j <= nb; j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] { //nolint:gosec // G602: i, j > 1
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
			least = min(least, cur[j])
		}
		// A cell of the next row is at least this row's least, or the
		// row before's plus one (a swap): past the limit, so is the end.
		if least > limit && leastPrev+1 > limit {
			return limit + 1
		}
		leastPrev = least
		prev2, prev, cur = prev, cur, prev2
	}
	return min(prev[nb], limit+1)
}

// maxEdited is the most runes editDistance reads of a string: above
// pulse's longest key by more than nearestKey's limit.
const maxEdited = 32

// folded writes s's first maxEdited runes, lower-cased, into dst and
// returns how many.
func folded(dst *[maxEdited]rune, s string) int {
	n := 0
	for _, r := range s {
		if n == maxEdited {
			break
		}
		dst[n] = unicode.ToLower(r)
		n++
	}
	return n
}
