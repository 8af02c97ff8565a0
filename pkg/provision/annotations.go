package provision

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/scaler"
)

// The annotations a workload carries to be autoscaled through pulse
// (docs/scaledobject.md, "One annotation instead of a ScaledObject").
const (
	AnnotationAutoscale           = "pulse.io/autoscale"
	AnnotationMetric              = "pulse.io/metric"
	AnnotationThreshold           = "pulse.io/threshold"
	AnnotationActivationThreshold = "pulse.io/activation-threshold"
	AnnotationWindow              = "pulse.io/window"
	AnnotationMinReplicas         = "pulse.io/min-replicas"
	AnnotationMaxReplicas         = "pulse.io/max-replicas"
	AnnotationScaleUpPodsPerMin   = "pulse.io/scale-up-pods-per-minute"
	AnnotationScaleDownInterval   = "pulse.io/scale-down-interval"
	AnnotationScaleDownDelay      = "pulse.io/scale-down-delay"
	AnnotationCooldownPeriod      = "pulse.io/cooldown-period"
	// AnnotationSLOTTFT is the planner's time-to-first-token SLO (trigger
	// key sloTtft; metric replicas only).
	AnnotationSLOTTFT = "pulse.io/slo-ttft"
	// AnnotationSLOITL is its optional inter-token latency SLO (sloItl).
	AnnotationSLOITL = "pulse.io/slo-itl"
	// AnnotationSLOPercentile makes the TTFT SLO a percentile's
	// (sloPercentile, e.g. 90).
	AnnotationSLOPercentile = "pulse.io/slo-percentile"
)

// keda-kaito-scaler's annotations, read as aliases of pulse's.
const (
	KaitoAutoProvision = "scaledobject.kaito.sh/auto-provision"
	KaitoThreshold     = "scaledobject.kaito.sh/threshold"
	KaitoMetricName    = "scaledobject.kaito.sh/metricName"
	KaitoMinReplicas   = "scaledobject.kaito.sh/min-replicas"
	KaitoMaxReplicas   = "scaledobject.kaito.sh/max-replicas"
	kaitoPrefix        = "scaledobject.kaito.sh/"
)

// aliases: pulse's annotation → keda-kaito-scaler's.
var aliases = map[string]string{
	AnnotationAutoscale:   KaitoAutoProvision,
	AnnotationThreshold:   KaitoThreshold,
	AnnotationMetric:      KaitoMetricName,
	AnnotationMinReplicas: KaitoMinReplicas,
	AnnotationMaxReplicas: KaitoMaxReplicas,
}

// kaitoUnread says k is one of keda-kaito-scaler's annotations
// (scaledobject.kaito.sh/) that pulse does not read: its composite
// metrics (`metricName/0`, `upthreshold/0`, `downthreshold/0`,
// `metricstype/0`, `quantile/0`, ...), `combinepolicy`, `evaluationwindow`,
// its cooldowns, or any it adds. Named in Settings.Ignored, at most
// maxIgnored of them: a user who wrote them for keda-kaito-scaler is told
// that pulse scales on its own trigger instead (only a fixed list was
// named, and the indexed keys were dropped unsaid).
func kaitoUnread(k string) bool { return strings.HasPrefix(k, kaitoPrefix) && !annotationsRead[k] }

// maxIgnored bounds the keda-kaito-scaler annotations not read that a
// workload's state names (the first in order), and that the provisioner's
// cache keeps the names of.
const maxIgnored = 16

// ignoredKaito is the first maxIgnored of annotations' keys kaitoUnread
// names, in order (nil: none).
func ignoredKaito(annotations map[string]string) []string {
	return firstKeys(annotations, kaitoUnread, maxIgnored)
}

// firstKeys is the first n of annotations' keys that match says, in order
// (nil: none).
func firstKeys(annotations map[string]string, match func(string) bool, n int) []string {
	var ks []string
	for k := range annotations {
		if match(k) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks[:min(len(ks), n)]
}

// annotationsRead is every annotation Parse reads: the provisioner's cache
// keeps these alone of a workload's annotations, with the names of those
// kaitoUnread names.
var annotationsRead = func() map[string]bool {
	m := map[string]bool{}
	for _, a := range provisionerAnnotations {
		m[a] = true
	}
	for _, k := range aliases {
		m[k] = true
	}
	return m
}()

// Defaults of a provisioned ScaledObject. The metric is the planner's
// (metric replicas, docs/planner.md), with an HPA behaviour that lets its
// plan through (plannerBehavior). The scale-up and scale-down defaults are
// those of a threshold metric (pulse.io/metric set to one): pulse-sim
// tune's choice on the shipped Azure trace for Llama-3.1-8B on one H100
// (docs/simulation.md, "What tune finds"): 2 pods a minute up, 1 pod per 10
// minutes down after 5 minutes of lower load.
const (
	DefaultMetric            = scaler.MetricReplicas
	DefaultMinReplicas       = 1
	DefaultMaxReplicas       = 10
	DefaultScaleUpPodsPerMin = 2
	DefaultScaleUpDelay      = 30 * time.Second
	DefaultScaleDownInterval = 10 * time.Minute
	DefaultScaleDownDelay    = 5 * time.Minute
	// KaitoDefaultMetric is keda-kaito-scaler's metric: a workload enabled
	// through its annotation keeps its meaning for the threshold it sets.
	KaitoDefaultMetric = "waiting"
	// ThresholdDefaultMetric is the metric of a pulse.io/threshold set with
	// no pulse.io/metric: pulse's default before the planner, so that the
	// threshold keeps the meaning it was written with.
	ThresholdDefaultMetric = "running"
)

// maxReplicasCap bounds min- and max-replicas.
const maxReplicasCap = 10000

// ApplyCap applies the operator's cap on replica bounds (the aggregator's
// --provision-max-replicas; 0: none but 10,000): in a shared cluster with
// no quota, one tenant's annotation asking for thousands of replicas made
// that many pods, pending ones driving the cluster autoscaler. A bound an
// annotation asks for past the cap is refused, naming the annotation it
// came from (the ScaledObject is then left as it was); the default
// max-replicas is lowered to the cap (a workload that asked for nothing
// was refused, under a cap below 10, naming an annotation it did not
// have).
func ApplyCap(s *Settings, maxReplicas int64) error {
	if maxReplicas <= 0 || !s.Enabled {
		return nil
	}
	refuse := func(via, name string, n int64) error {
		return &AnnotationError{cmp.Or(via, name), fmt.Sprintf("%d is past the cluster's cap of %d replicas (the aggregator's --provision-max-replicas)", n, maxReplicas)}
	}
	switch {
	case s.MinReplicas > maxReplicas:
		return refuse(s.MinVia, AnnotationMinReplicas, s.MinReplicas)
	case s.MaxReplicas > maxReplicas && s.MaxVia != "":
		return refuse(s.MaxVia, AnnotationMaxReplicas, s.MaxReplicas)
	case s.MaxReplicas > maxReplicas:
		s.MaxReplicas = maxReplicas
	}
	return nil
}

// Settings are a workload's parsed annotations.
type Settings struct {
	// Enabled: pulse.io/autoscale (or keda-kaito-scaler's auto-provision)
	// is "true".
	Enabled bool
	// ViaKaito: enabled through keda-kaito-scaler's annotation alone.
	ViaKaito bool
	// Trigger is the pulse trigger's metadata, less scalerAddress: the
	// workload, metric, threshold and window, as ParseTrigger accepts it.
	Trigger map[string]string
	// Parsed is Trigger as the scaler reads it.
	Parsed scaler.Trigger
	// Planner: the trigger is the planner's (metric replicas); the HPA
	// behaviour lets its plan through, and the scale-up and scale-down
	// settings below are unused.
	Planner                  bool
	MinReplicas, MaxReplicas int64
	// MinVia and MaxVia name the annotation each bound came from ("": the
	// default).
	MinVia, MaxVia       string
	ScaleUpPodsPerMinute int64
	ScaleDownInterval    time.Duration
	ScaleDownDelay       time.Duration
	// CooldownPeriod is KEDA's cooldownPeriod when CooldownSet (0 is
	// written: KEDA then scales to zero at once); not set, the ScaledObject
	// leaves KEDA's default (300 s).
	CooldownPeriod time.Duration
	CooldownSet    bool
	// Ignored are keda-kaito-scaler annotations pulse does not read.
	Ignored []string
	// Unused says which annotations are written but have no effect
	// (pulse.io/cooldown-period with a minimum above 0).
	Unused []string
}

// provisionerAnnotations are pulse's own annotations Parse reads.
var provisionerAnnotations = []string{AnnotationAutoscale, AnnotationMetric, AnnotationThreshold, AnnotationActivationThreshold,
	AnnotationWindow, AnnotationMinReplicas, AnnotationMaxReplicas, AnnotationScaleUpPodsPerMin, AnnotationScaleDownInterval,
	AnnotationScaleDownDelay, AnnotationCooldownPeriod, AnnotationSLOTTFT, AnnotationSLOITL, AnnotationSLOPercentile}

// podAnnotations are the pulse.io/ annotations read of pods: no typo of
// the provisioner's.
var podAnnotations = discovery.PodAnnotations()

// The typos looked for: of the provisioner's annotations, or of
// pulse.io/autoscale alone (a workload not enabled).
var (
	provisionerTypos = scaler.NewMatcher(provisionerAnnotations)
	autoscaleTypos   = scaler.NewMatcher([]string{AnnotationAutoscale})
)

// maxTypoChecks: the unread pulse.io/ annotations of a workload looked at
// for a typo, the first in name order. Each is a few microseconds, and the
// cache looked at every one of a workload's annotations at every event of
// it (a Deployment's 256 KiB of them hold thousands).
const maxTypoChecks = 64

// firstTypo is the first annotation (in name order, of the first
// maxTypoChecks) under pulse.io/ that neither Parse nor the agents read
// and that is a likely typo of one of m's names, and that name; "" when
// none is.
func firstTypo(annotations map[string]string, m *scaler.Matcher) (key, meant string) {
	for _, k := range firstKeys(annotations, unread, maxTypoChecks) {
		if meant := m.Nearest(k); meant != "" {
			return k, meant
		}
	}
	return "", ""
}

// misspelt is an error naming firstTypo's annotation, or nil. Any other
// pulse.io/ annotation is left alone: a pod's, written on its workload too.
func misspelt(annotations map[string]string, m *scaler.Matcher) error {
	if k, meant := firstTypo(annotations, m); k != "" {
		return &AnnotationError{k, fmt.Sprintf("not an annotation pulse reads (did you mean %s?)", meant)}
	}
	return nil
}

// unread: k is a pulse.io/ annotation that neither Parse nor the agents
// read.
func unread(k string) bool {
	return strings.HasPrefix(k, "pulse.io/") && !annotationsRead[k] && !slices.Contains(podAnnotations, k)
}

// AnnotationError names the annotation at fault.
type AnnotationError struct{ Annotation, Msg string }

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s: %s", e.Annotation, e.Msg)
}

// Workload identifies what the annotations are on.
type Workload struct {
	Kind      string // a store kind: Workspace, InferenceSet, Deployment, StatefulSet, LeaderWorkerSet
	Namespace string
	Name      string
}

// Parse reads a workload's annotations. A workload without
// pulse.io/autoscale: "true" (or keda-kaito-scaler's auto-provision: "true")
// is not enabled, and nothing else is read. maxWindow is the aggregator's
// --max-window, which bounds pulse.io/window.
func Parse(w Workload, annotations map[string]string, maxWindow time.Duration) (Settings, error) {
	var s Settings
	r := reader{annotations: annotations}
	on, via, err := r.get(AnnotationAutoscale)
	if err != nil {
		return s, err
	}
	switch on {
	case "", "false":
		// Not enabled: an annotation that was meant to enable it is named.
		return s, misspelt(annotations, autoscaleTypos)
	case "true":
	default:
		return s, &AnnotationError{via, fmt.Sprintf("%q: want \"true\" or \"false\"", on)}
	}
	if err := misspelt(annotations, provisionerTypos); err != nil {
		return s, err
	}
	s.Enabled, s.ViaKaito = true, via == KaitoAutoProvision
	s.Ignored = ignoredKaito(annotations)

	if err := s.trigger(w, &r, maxWindow); err != nil {
		return s, err
	}
	if err := s.replicas(&r); err != nil {
		return s, err
	}
	return s, s.behaviour(&r)
}

// replicas reads the replica bounds and KEDA's cooldown, and notes the
// annotations KEDA reads only between 0 and 1 replicas when the minimum
// is above 0.
func (s *Settings) replicas(r *reader) error {
	var err error
	if s.MinReplicas, err = r.integer(AnnotationMinReplicas, DefaultMinReplicas, 0); err != nil {
		return err
	}
	if s.MaxReplicas, err = r.integer(AnnotationMaxReplicas, DefaultMaxReplicas, 1); err != nil {
		return err
	}
	s.MinVia, s.MaxVia = r.via(AnnotationMinReplicas), r.via(AnnotationMaxReplicas)
	if s.MinVia == KaitoMinReplicas && s.MinReplicas < 1 {
		// keda-kaito-scaler takes a minimum below 1 as 1
		// (resolveMinReplicas): an InferenceSet moved over unchanged with
		// min-replicas "0" went to zero replicas under pulse, its GPU
		// nodes with them, and cold-started at its next request.
		// pulse.io/min-replicas "0" scales to zero.
		s.MinReplicas = 1
	}
	if s.MaxReplicas < s.MinReplicas {
		if s.MaxVia == "" {
			// The minimum alone, above the default maximum: the refusal
			// named max-replicas, an annotation the user had not written.
			return &AnnotationError{cmp.Or(s.MinVia, AnnotationMinReplicas), fmt.Sprintf("%d is above the default max-replicas (%d): set %s too", s.MinReplicas, s.MaxReplicas, AnnotationMaxReplicas)}
		}
		return &AnnotationError{s.MaxVia, fmt.Sprintf("%d is below min-replicas %d", s.MaxReplicas, s.MinReplicas)}
	}
	if v, _, _ := r.get(AnnotationCooldownPeriod); v != "" {
		s.CooldownSet = true
	}
	if s.CooldownPeriod, err = r.seconds(AnnotationCooldownPeriod, 0, 0, 24*time.Hour); err != nil {
		return err
	}
	// KEDA reads both only between 0 and 1 replicas: set with a minimum
	// of one or more, they are written and have no effect, which the
	// state and Events say (a refusal froze a ScaledObject provisioned
	// with one before, every later annotation change left unread).
	for _, a := range []struct{ annotation, what string }{
		{AnnotationCooldownPeriod, "KEDA waits it only before scaling to zero"},
		{AnnotationActivationThreshold, "KEDA reads it only to scale from zero, or to it"},
	} {
		if v, _, _ := r.get(a.annotation); v != "" && v != "0" && s.MinReplicas > 0 {
			s.Unused = append(s.Unused, fmt.Sprintf("%s has no effect with %s %d (%s)", a.annotation, AnnotationMinReplicas, s.MinReplicas, a.what))
		}
	}
	return nil
}

// behaviour reads the HPA behaviour of a threshold metric's trigger; the
// planner's (metric replicas) takes none.
func (s *Settings) behaviour(r *reader) error {
	if s.Parsed.Metric == scaler.MetricReplicas {
		// The planner holds capacity itself: an HPA behaviour on top
		// delays its plan (docs/scaledobject.md, "The planner: what pulse provisions, written by hand").
		for _, a := range []string{AnnotationScaleUpPodsPerMin, AnnotationScaleDownInterval, AnnotationScaleDownDelay} {
			if v, _, _ := r.get(a); v != "" {
				return &AnnotationError{a, "applies to threshold metrics: metric replicas (the planner, the default) holds capacity for the lead time it learns and lets its plan through the HPA at once; set pulse.io/metric to scale on a threshold"}
			}
		}
		s.Planner = true
		return nil
	}
	var err error
	if s.ScaleUpPodsPerMinute, err = r.integer(AnnotationScaleUpPodsPerMin, DefaultScaleUpPodsPerMin, 1); err != nil {
		return err
	}
	// The HPA's policy period is at most 30 minutes; its stabilization
	// window at most an hour.
	if s.ScaleDownInterval, err = r.seconds(AnnotationScaleDownInterval, DefaultScaleDownInterval, time.Second, 30*time.Minute); err != nil {
		return err
	}
	s.ScaleDownDelay, err = r.seconds(AnnotationScaleDownDelay, DefaultScaleDownDelay, 0, time.Hour)
	return err
}

// trigger builds the trigger metadata and checks it as the scaler will.
func (s *Settings) trigger(w Workload, r *reader, maxWindow time.Duration) error {
	key := scaler.WorkloadKey(w.Kind)
	if key == "" {
		return &AnnotationError{AnnotationAutoscale, fmt.Sprintf("pulse cannot scale a %s", w.Kind)}
	}
	md := map[string]string{key: w.Name}
	m, metricVia, err := r.get(AnnotationMetric)
	if err != nil {
		return err
	}
	// A threshold written for keda-kaito-scaler (its annotation, not
	// pulse's) is a threshold of its metric, waiting: with no metric named,
	// it keeps that meaning even when pulse.io/autoscale enables the
	// workload (it was once applied to running).
	_, thresholdVia, _ := r.get(AnnotationThreshold)
	switch {
	case m == "" && (s.ViaKaito || thresholdVia == KaitoThreshold):
		md["metric"] = KaitoDefaultMetric
	case m == "" && thresholdVia == AnnotationThreshold:
		md["metric"] = ThresholdDefaultMetric
	case m == "":
		md["metric"] = DefaultMetric
	default:
		if _, ok := metric.Lookup(m); ok || m == scaler.MetricReplicas {
			md["metric"] = m
		} else {
			md["metricName"] = m // a vLLM name, or an --extra-metric
		}
	}
	annotationOf := map[string]string{"metric": metricVia, "metricName": metricVia}
	for _, a := range []struct{ annotation, key string }{
		{AnnotationThreshold, "threshold"}, {AnnotationActivationThreshold, "activationThreshold"}, {AnnotationWindow, "window"},
		{AnnotationSLOTTFT, "sloTtft"}, {AnnotationSLOITL, "sloItl"}, {AnnotationSLOPercentile, "sloPercentile"},
	} {
		v, via, err := r.get(a.annotation)
		if err != nil {
			return err
		}
		if v != "" {
			md[a.key] = v
		}
		annotationOf[a.key] = via
		if via == "" {
			annotationOf[a.key] = a.annotation
		}
	}
	t, err := scaler.ParseTrigger(&externalscaler.ScaledObjectRef{Namespace: w.Namespace, ScalerMetadata: md}, maxWindow, nil)
	if err != nil {
		var me *scaler.MetadataError
		if errors.As(err, &me) && annotationOf[me.Key] != "" {
			return &AnnotationError{annotationOf[me.Key], me.Msg}
		}
		return &AnnotationError{AnnotationMetric, err.Error()}
	}
	// A latency or a ratio is a per-replica quantity: summed over the
	// replicas (the default valueType, total) a p90 of 1.85 s against 1 s
	// asked for 2 of 10 replicas, scaling a slow workload down. Its
	// threshold is meant per replica: average.
	if r := t.Def().Rule; r == metric.RuleQuantile || r == metric.RuleRatio {
		md["valueType"] = "average"
		t.ValueType = "average"
	}
	// Written out, so that the ScaledObject says what it scales on.
	md["threshold"] = strconv.FormatFloat(t.Threshold, 'g', -1, 64)
	md["window"] = t.Window.String()
	s.Trigger, s.Parsed = md, t
	return nil
}

// reader reads annotations, each under pulse's name or its
// keda-kaito-scaler alias.
type reader struct{ annotations map[string]string }

// maxAnnotationValue bounds the value of an annotation pulse reads.
const maxAnnotationValue = 256

// get returns the value and the annotation it came from ("" if unset). A
// value under both names must agree. An empty value is unset, under
// either name, as everywhere else its default applies: pulse's empty
// annotation (a Helm template rendering nothing) hid keda-kaito-scaler's,
// and "pulse.io/autoscale: \"\"" beside its auto-provision "true"
// disabled the workload (its ScaledObject deleted), an empty threshold
// moved the default metric from the planner to running.
func (r *reader) get(name string) (string, string, error) {
	v, ok := r.annotations[name]
	alias := aliases[name]
	av, aok := r.annotations[alias]
	v, av = strings.TrimSpace(v), strings.TrimSpace(av)
	ok, aok = ok && v != "", aok && av != ""
	// Bounded before it is read or quoted (in the status, an Event and
	// the log): every value pulse reads is a name, a number or a duration.
	// (The cache keeps at most maxAnnotationValue + 1 bytes of a value.)
	if len(v) > maxAnnotationValue {
		return "", name, &AnnotationError{name, fmt.Sprintf("a value longer than %d bytes", maxAnnotationValue)}
	}
	if aok && alias != "" && len(av) > maxAnnotationValue {
		return "", alias, &AnnotationError{alias, fmt.Sprintf("a value longer than %d bytes", maxAnnotationValue)}
	}
	switch {
	case ok && aok && alias != "" && !sameValue(name, v, av) && name != AnnotationAutoscale:
		if v == av { // min-replicas "0" under both names
			return "", name, &AnnotationError{name, fmt.Sprintf("%q (to zero) disagrees with %s %q (1, as keda-kaito-scaler takes it): set one", v, alias, av)}
		}
		return "", name, &AnnotationError{name, fmt.Sprintf("%q disagrees with %s %q: set one", v, alias, av)}
	case ok:
		return v, name, nil
	case aok && alias != "":
		return av, alias, nil
	}
	return "", "", nil
}

// sameValue says whether pulse's annotation name's value v and its
// keda-kaito-scaler alias's av ask for the same: as numbers for the
// replica bounds and the threshold (keda-kaito-scaler's min-replicas "0"
// is 1, as replicas reads it), else as written. Compared as written,
// min-replicas "1" beside keda-kaito-scaler's "0" (both 1) was refused,
// and "0" beside "0" (zero and one) taken.
func sameValue(name, v, av string) bool {
	switch name {
	case AnnotationMinReplicas, AnnotationMaxReplicas:
		a, errA := strconv.ParseInt(v, 10, 64)
		b, errB := strconv.ParseInt(av, 10, 64)
		if errA != nil || errB != nil {
			return v == av
		}
		if name == AnnotationMinReplicas && b == 0 {
			b = 1
		}
		return a == b
	case AnnotationThreshold:
		a, errA := strconv.ParseFloat(v, 64)
		b, errB := strconv.ParseFloat(av, 64)
		if errA != nil || errB != nil || math.IsNaN(a) || math.IsNaN(b) {
			return v == av
		}
		return a == b
	}
	return v == av
}

// via is the annotation name's value came from: "" when it is unset or
// empty (its default applies).
func (r *reader) via(name string) string {
	if v, via, err := r.get(name); err == nil && v != "" {
		return via
	}
	return ""
}

// integer reads a whole number of at least lowest.
func (r *reader) integer(name string, def, lowest int64) (int64, error) {
	v, via, err := r.get(name)
	if err != nil || v == "" {
		return def, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lowest || n > maxReplicasCap {
		return def, &AnnotationError{via, fmt.Sprintf("%q: want a whole number from %d to %d", v, lowest, maxReplicasCap)}
	}
	return n, nil
}

// seconds reads a duration ("10m", "90s", or a number of seconds) of whole
// seconds within [lowest, highest].
func (r *reader) seconds(name string, def, lowest, highest time.Duration) (time.Duration, error) {
	v, via, err := r.get(name)
	if err != nil || v == "" {
		return def, err
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseInt(v, 10, 64)
		if nerr != nil || n > math.MaxInt32 || n < math.MinInt32 {
			return def, &AnnotationError{via, fmt.Sprintf("%q: want a duration such as 90s or 10m", v)}
		}
		d = time.Duration(n) * time.Second
	}
	if d%time.Second != 0 || d < lowest || d > highest {
		return def, &AnnotationError{via, fmt.Sprintf("%q: want whole seconds from %s to %s", v, lowest, highest)}
	}
	return d, nil
}
