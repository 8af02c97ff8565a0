// Package hpa is the Kubernetes HorizontalPodAutoscaler controller's
// decision for External metrics, in virtual time: the replica calculator
// (AverageValue and Value targets, tolerances), the legacy normalization
// (downscale stabilization, scale-up limit) and the behavior normalization
// (stabilization windows over the recommendation history, Pods/Percent
// policies over their periods, selectPolicy), min/max replicas, and the
// defaults the API server fills into a partial behavior.
//
// The rules are those of k8s.io/kubernetes v1.33
// pkg/controller/podautoscaler/horizontal.go and replica_calculator.go and
// pkg/apis/autoscaling/v2/defaults.go; the code is written here (the tests
// carry over the facts of Kubernetes' own test cases).
package hpa

import (
	"errors"
	"fmt"
	"math"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/utils/ptr"
)

// Controller defaults, as kube-controller-manager's.
const (
	DefaultSyncPeriod             = 15 * time.Second
	DefaultTolerance              = 0.1
	DefaultDownscaleStabilization = 5 * time.Minute
	scaleUpLimitFactor            = 2.0
	scaleUpLimitMinimum           = 4.0
)

// Target is an External metric's target.
type Target struct {
	// AverageValue: desired = ceil(usage / target) (the HPA's per-pod
	// target; KEDA's default metricType). Otherwise Value: desired =
	// ceil(usage / target × ready pods).
	AverageValue bool
	// Milli is the target in thousandths, as the HPA keeps it.
	Milli int64
}

// Reading is one External metric as the HPA fetched it.
type Reading struct {
	Target Target
	// Milli is the usage in thousandths (the sum of the values returned).
	Milli int64
	Err   error
}

// State is the scale target as the HPA reads it at a sync.
type State struct {
	// SpecReplicas: /scale spec.replicas (the HPA's currentReplicas).
	SpecReplicas int32
	// StatusReplicas: /scale status.replicas (AverageValue's divisor).
	StatusReplicas int32
	// ReadyPods: Running and Ready pods of the selector (Value's multiplier).
	ReadyPods int32
}

// Spec is the HPA's spec.
type Spec struct {
	MinReplicas, MaxReplicas int32
	// Behavior, as written in the ScaledObject; nil: the legacy path.
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior
}

// Options are kube-controller-manager's HPA settings.
type Options struct {
	Tolerance              float64       // --horizontal-pod-autoscaler-tolerance
	DownscaleStabilization time.Duration // --horizontal-pod-autoscaler-downscale-stabilization
	// ConfigurableTolerance is the HPAConfigurableTolerance feature gate
	// (alpha in 1.33, off by default): only with it does a behavior's
	// per-direction tolerance apply.
	ConfigurableTolerance bool
}

// DefaultOptions are kube-controller-manager's defaults.
func DefaultOptions() Options {
	return Options{Tolerance: DefaultTolerance, DownscaleStabilization: DefaultDownscaleStabilization}
}

type recommendation struct {
	replicas int32
	at       time.Duration
}

type scaleEvent struct {
	change   int32
	at       time.Duration
	outdated bool
}

// Controller is one HPA's controller state: its recommendation history and
// scale events.
type Controller struct {
	spec Spec
	opts Options
	recs []recommendation
	ups  []scaleEvent
	down []scaleEvent
}

// New returns the controller of one HPA. A partial behavior is completed
// with the API server's defaults.
func New(spec Spec, opts Options) *Controller {
	if spec.Behavior != nil {
		b := spec.Behavior.DeepCopy()
		b.ScaleUp = completeRules(b.ScaleUp, defaultScaleUp())
		b.ScaleDown = completeRules(b.ScaleDown, defaultScaleDown())
		if b.ScaleDown.StabilizationWindowSeconds == nil {
			b.ScaleDown.StabilizationWindowSeconds = ptr.To(int32(opts.DownscaleStabilization.Seconds()))
		}
		spec.Behavior = b
	}
	return &Controller{spec: spec, opts: opts}
}

// Spec returns the HPA's spec with the defaults filled in.
func (c *Controller) Spec() Spec { return c.spec }

// defaultScaleUp: stabilization 0, Pods 4 and Percent 100 per 15 s, Max.
func defaultScaleUp() *autoscalingv2.HPAScalingRules {
	return &autoscalingv2.HPAScalingRules{
		StabilizationWindowSeconds: ptr.To(int32(0)),
		SelectPolicy:               ptr.To(autoscalingv2.MaxChangePolicySelect),
		Policies: []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 15},
			{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15},
		},
	}
}

// defaultScaleDown: the controller's stabilization, Percent 100 per 15 s, Max.
func defaultScaleDown() *autoscalingv2.HPAScalingRules {
	return &autoscalingv2.HPAScalingRules{
		SelectPolicy: ptr.To(autoscalingv2.MaxChangePolicySelect),
		Policies:     []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}},
	}
}

func completeRules(from, to *autoscalingv2.HPAScalingRules) *autoscalingv2.HPAScalingRules {
	if from == nil {
		return to
	}
	if from.SelectPolicy != nil {
		to.SelectPolicy = from.SelectPolicy
	}
	if from.StabilizationWindowSeconds != nil {
		to.StabilizationWindowSeconds = from.StabilizationWindowSeconds
	}
	// An empty list is none: Policies is omitempty, so KEDA's HPA reaches
	// the API server without it, and the defaults fill it in.
	if len(from.Policies) > 0 {
		to.Policies = from.Policies
	}
	if from.Tolerance != nil {
		to.Tolerance = from.Tolerance
	}
	return to
}

// Result is one sync's outcome.
type Result struct {
	// Desired is the replica count the HPA sets (or keeps).
	Desired int32
	// Rescale: Desired differs from the current count and /scale is updated.
	Rescale bool
	// Proposal is the metrics' replica count before normalization (-1 when
	// every metric failed).
	Proposal int32
	Err      error
}

// Sync runs one reconcile at now.
func (c *Controller) Sync(now time.Duration, st State, metrics []Reading) Result {
	current := st.SpecReplicas
	if c.recs == nil {
		c.recs = []recommendation{{current, now}} // recordInitialRecommendation
	}
	minR := c.spec.MinReplicas
	res := Result{Desired: current, Proposal: -1}
	switch {
	case current == 0 && minR != 0:
		return res // scaling is disabled since the replica count of the target is zero
	case current > c.spec.MaxReplicas:
		res.Desired = c.spec.MaxReplicas
	case current < minR:
		res.Desired = minR
	default:
		proposal, err := c.proposal(st, metrics)
		res.Proposal, res.Err = proposal, err
		if proposal < 0 {
			return res // no replica count could be computed: nothing changes
		}
		desired := max(proposal, 0)
		if c.spec.Behavior == nil {
			res.Desired = c.normalize(now, current, desired, minR)
		} else {
			res.Desired = c.normalizeWithBehavior(now, current, desired, minR)
		}
	}
	res.Rescale = res.Desired != current
	if res.Rescale {
		c.storeScaleEvent(now, current, res.Desired)
	}
	return res
}

// proposal is computeReplicasForMetrics: the largest proposal of the valid
// metrics; -1 when all are invalid, or some are and it would scale down.
func (c *Controller) proposal(st State, metrics []Reading) (int32, error) {
	var replicas int32
	invalid := 0
	var firstErr error
	for _, m := range metrics {
		p, err := c.metricReplicas(st, m)
		if err != nil {
			if invalid == 0 {
				firstErr = err
			}
			invalid++
			continue
		}
		if replicas == 0 || p > replicas {
			replicas = p
		}
	}
	if invalid > 0 {
		firstErr = fmt.Errorf("invalid metrics (%d invalid out of %d), first error is: %w", invalid, len(metrics), firstErr)
	}
	if invalid >= len(metrics) || (invalid > 0 && replicas < st.SpecReplicas) {
		return -1, firstErr
	}
	return replicas, firstErr
}

func (c *Controller) tolerances() (down, up float64) {
	down, up = c.opts.Tolerance, c.opts.Tolerance
	b := c.spec.Behavior
	if b == nil || !c.opts.ConfigurableTolerance {
		return down, up
	}
	if b.ScaleDown != nil && b.ScaleDown.Tolerance != nil {
		down = b.ScaleDown.Tolerance.AsApproximateFloat64()
	}
	if b.ScaleUp != nil && b.ScaleUp.Tolerance != nil {
		up = b.ScaleUp.Tolerance.AsApproximateFloat64()
	}
	return down, up
}

func (c *Controller) within(ratio float64) bool {
	down, up := c.tolerances()
	return 1.0-down <= ratio && ratio <= 1.0+up
}

// ErrNoPods is the Value path's error when the selector matches no pod.
var ErrNoPods = errors.New("no pods returned by selector while calculating replica count")

// metricReplicas is GetExternalPerPodMetricReplicas (AverageValue) or
// GetExternalMetricReplicas (Value).
func (c *Controller) metricReplicas(st State, m Reading) (int32, error) {
	if m.Err != nil {
		return 0, m.Err
	}
	usage, target := float64(m.Milli), float64(m.Target.Milli)
	if m.Target.AverageValue {
		replicas := st.StatusReplicas
		ratio := usage / (target * float64(replicas))
		if !c.within(ratio) {
			replicas = int32(math.Ceil(usage / target))
		}
		return replicas, nil
	}
	ratio := usage / target
	if st.SpecReplicas == 0 {
		return int32(math.Ceil(ratio)), nil // scale to zero or n pods
	}
	if c.within(ratio) {
		return st.SpecReplicas, nil
	}
	if st.ReadyPods < 0 {
		return 0, ErrNoPods
	}
	return int32(math.Ceil(ratio * float64(st.ReadyPods))), nil
}

// tiedOut: a recommendation or scale event exactly a window (or policy
// period) old is out of it. pulse-sim syncs on an exact 15 s grid, so one
// from n syncs ago sits exactly on the cutoff; in a cluster each sync
// comes 15 s plus the reconcile's own time after the last (the HPA's work
// queue re-adds the key 15 s after reconcileKey returns), so it is always
// strictly older, and horizontal.go's Before(cutoff) drops it
// (stabilizeRecommendation, stabilizeRecommendationWithBehaviors,
// markScaleEventsOutdated). Before 2026-11-30 the sim kept it: a
// downscale stabilization of 315 s rather than 300, and scale-ups one
// longest period apart both counted in a scale-down policy's period
// (deeper scale-downs: the tuned ScaledObject's 7 → 2 where Kubernetes
// goes 7 → 4).

// normalize is the path without a behavior: the highest recommendation of
// the downscale stabilization window, then min, max and the scale-up limit.
func (c *Controller) normalize(now time.Duration, current, desired, minR int32) int32 {
	stabilized := desired
	cutoff := now - c.opts.DownscaleStabilization
	oldIndex := -1
	for i, r := range c.recs {
		if r.at <= cutoff { // tiedOut
			oldIndex = i
		} else if r.replicas > stabilized {
			stabilized = r.replicas
		}
	}
	if oldIndex >= 0 {
		c.recs[oldIndex] = recommendation{desired, now}
	} else {
		c.recs = append(c.recs, recommendation{desired, now})
	}
	return convertWithRules(current, stabilized, minR, c.spec.MaxReplicas)
}

// convertWithRules bounds desired by min, max and max(2 × current, 4).
func convertWithRules(current, desired, minR, maxR int32) int32 {
	maxAllowed := min(maxR, int32(math.Max(scaleUpLimitFactor*float64(current), scaleUpLimitMinimum)))
	switch {
	case desired < minR:
		return minR
	case desired > maxAllowed:
		return maxAllowed
	}
	return desired
}

// normalizeWithBehavior: stabilization windows, then the policies' rate.
func (c *Controller) normalizeWithBehavior(now time.Duration, current, desired, minR int32) int32 {
	b := c.spec.Behavior
	upRec, downRec := desired, desired
	upCutoff := now - time.Duration(*b.ScaleUp.StabilizationWindowSeconds)*time.Second
	downCutoff := now - time.Duration(*b.ScaleDown.StabilizationWindowSeconds)*time.Second
	oldIndex := -1
	for i, r := range c.recs {
		if r.at > upCutoff {
			upRec = min(r.replicas, upRec)
		}
		if r.at > downCutoff {
			downRec = max(r.replicas, downRec)
		}
		if r.at <= upCutoff && r.at <= downCutoff { // tiedOut
			oldIndex = i
		}
	}
	stabilized := current
	if stabilized < upRec {
		stabilized = upRec
	}
	if stabilized > downRec {
		stabilized = downRec
	}
	if oldIndex >= 0 {
		c.recs[oldIndex] = recommendation{desired, now}
	} else {
		c.recs = append(c.recs, recommendation{desired, now})
	}
	return c.withBehaviorRate(now, current, stabilized, minR)
}

// withBehaviorRate is convertDesiredReplicasWithBehaviorRate.
func (c *Controller) withBehaviorRate(now time.Duration, current, desired, minR int32) int32 {
	b := c.spec.Behavior
	switch {
	case desired > current:
		limit := scaleUpLimit(now, current, c.ups, c.down, b.ScaleUp)
		if limit < current {
			limit = current // no scale-up until the events age out
		}
		return min(desired, c.spec.MaxReplicas, limit)
	case desired < current:
		limit := scaleDownLimit(now, current, c.ups, c.down, b.ScaleDown)
		if limit > current {
			limit = current
		}
		return max(desired, minR, limit)
	}
	return desired
}

func changeInPeriod(now time.Duration, period int32, events []scaleEvent) int32 {
	cutoff := now - time.Duration(period)*time.Second
	var n int32
	for _, e := range events {
		if e.at > cutoff {
			n += e.change
		}
	}
	return n
}

// scaleUpLimit is calculateScaleUpLimitWithScalingRules.
func scaleUpLimit(now time.Duration, current int32, ups, downs []scaleEvent, r *autoscalingv2.HPAScalingRules) int32 {
	sel := *r.SelectPolicy
	if sel == autoscalingv2.DisabledPolicySelect {
		return current
	}
	result := int32(math.MinInt32)
	pick := func(a, b int32) int32 { return max(a, b) }
	if sel == autoscalingv2.MinChangePolicySelect {
		result = math.MaxInt32
		pick = func(a, b int32) int32 { return min(a, b) }
	}
	for _, p := range r.Policies {
		start := current - changeInPeriod(now, p.PeriodSeconds, ups) + changeInPeriod(now, p.PeriodSeconds, downs)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start + p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
		}
		result = pick(result, proposed)
	}
	return result
}

// scaleDownLimit is calculateScaleDownLimitWithBehaviors.
func scaleDownLimit(now time.Duration, current int32, ups, downs []scaleEvent, r *autoscalingv2.HPAScalingRules) int32 {
	sel := *r.SelectPolicy
	if sel == autoscalingv2.DisabledPolicySelect {
		return current
	}
	result := int32(math.MaxInt32)
	pick := func(a, b int32) int32 { return min(a, b) }
	if sel == autoscalingv2.MinChangePolicySelect {
		result = math.MinInt32
		pick = func(a, b int32) int32 { return max(a, b) }
	}
	for _, p := range r.Policies {
		start := current - changeInPeriod(now, p.PeriodSeconds, ups) + changeInPeriod(now, p.PeriodSeconds, downs)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start - p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(float64(start) * (1 - float64(p.Value)/100))
		}
		result = pick(result, proposed)
	}
	return result
}

// storeScaleEvent records a rescale, reusing an event older than the
// direction's longest policy period.
func (c *Controller) storeScaleEvent(now time.Duration, prev, next int32) {
	b := c.spec.Behavior
	if b == nil {
		return
	}
	events, rules, change := &c.ups, b.ScaleUp, next-prev
	if next < prev {
		events, rules, change = &c.down, b.ScaleDown, prev-next
	}
	var longest int32
	for _, p := range rules.Policies {
		longest = max(longest, p.PeriodSeconds)
	}
	cutoff := now - time.Duration(longest)*time.Second
	old := -1
	for i := range *events {
		if (*events)[i].at <= cutoff { // tiedOut
			(*events)[i].outdated = true
		}
		if (*events)[i].outdated {
			old = i
		}
	}
	e := scaleEvent{change: change, at: now}
	if old >= 0 {
		(*events)[old] = e
	} else {
		*events = append(*events, e)
	}
}
