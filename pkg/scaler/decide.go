package scaler

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/store"
)

// Missing-pod rules (trigger key missingPods; docs/scaledobject.md).
const (
	// MissingHold: a ready pod with no value counts 0 when the reporting
	// pods are above the threshold (it cannot inflate a scale-up) and
	// exactly the threshold when they are at or below it (it cannot cause a
	// scale-down): the HPA's own rule for pods without metrics.
	MissingHold = "hold"
	// MissingSeed: as hold, but 1.5 × threshold in the scale-down direction
	// (capped at the threshold with aggregation max): pulse's first rule.
	MissingSeed = "seed"
	// MissingIgnore: a ready pod with no value is left out.
	MissingIgnore = "ignore"
)

// How a pod entered a decision.
const (
	UseCounted = "counted"
	UseFilled  = "filled"
	UseLeftOut = "left out"
)

// PodDecision is how one pod entered a trigger's value.
type PodDecision struct {
	Name string `json:"name"`
	// Use is counted (its own value), filled (a value given by the
	// missing-pod rule) or left out.
	Use string `json:"use"`
	// Value is what the pod contributed: its own value, or the fill.
	Value float64 `json:"value"`
	// Why: for a filled pod, the rule and why it has no value (e.g. "hold:
	// stale"); for a pod left out, the reason (starting, terminating, idle,
	// undefined, ignored: timeout).
	Why string `json:"why,omitempty"`
}

// Decision is one evaluation of a trigger.
type Decision struct {
	// Value is what GetMetrics returns.
	Value  float64 `json:"value"`
	Active bool    `json:"active"`
	// Direction compares the counted pods' value with the threshold: "up"
	// (above it) or "down"; it picks the fill of pods with no value.
	Direction string `json:"direction"`
	// Reporting is the aggregate of the counted pods alone.
	Reporting float64 `json:"reporting"`
	// Counted, Filled and LeftOut count the pods by use.
	Counted int `json:"counted"`
	Filled  int `json:"filled"`
	LeftOut int `json:"leftOut"`
	// Ready is the number of ready pods (counted, filled, or left out as
	// idle, undefined or ignored), and for valueType average the
	// terminating pods still Ready too: the HPA's pod count for metricType
	// Value.
	Ready int `json:"ready"`
	// Pending is the demand that the workload's routers (demand sources)
	// added to a waiting trigger: requests they hold, and with no ready
	// replica the requests that arrived at them over the window.
	Pending float64 `json:"pending,omitempty"`
	// Pods lists the pods, when asked for: at most maxPodDetail, those
	// filled or left out first (the counts above cover them all);
	// PodsNotListed is how many more there were. Each trigger's last
	// decision is kept, so its size is bounded whatever the workload's.
	Pods          []PodDecision `json:"pods,omitempty"`
	PodsNotListed int           `json:"podsNotListed,omitempty"`
	// Plan explains a replicas trigger's value (pkg/planner).
	Plan *planner.Plan `json:"plan,omitempty"`
}

// DesiredReplicas is the replica count the HPA derives from the decision:
// ceil(value / threshold) for valueType total (metricType AverageValue),
// ceil(value / threshold × ready pods) for average (metricType Value), before
// its tolerance, behaviour and min/max apply.
// It is at most maxDesired: a value of 1e15 over a threshold of 0.001
// times 10 ready pods is past an int's range, which Go's conversion
// leaves undefined (-9.2e18 on amd64, in the gauge and the debug page).
//
// It is made as the HPA makes it, in the thousandths KEDA prints the value
// and the target to: over the floats, three pods at a threshold of 0.4
// read 1.2000000000000002 / 0.4, 4 replicas, where the HPA's 1200m over
// 400m is 3.
func (d Decision) DesiredReplicas(t Trigger) int {
	x := HPARatio(d.Value, t.Threshold)
	if t.ValueType == "average" {
		x *= float64(d.Ready)
	}
	return int(min(math.Ceil(x), maxDesired))
}

// KEDAMilli is KEDA's rendering of a value for the HPA, in thousandths:
// the value printed "%.3f" and parsed as a quantity (KEDA 2.21,
// pkg/scalers/scaler.go, quantityFromFloat64), so a value half way between
// two thousandths goes to the even one of its decimal expansion as KEDA's
// does (2.0625 is 2.062), not away from zero (math.Round(v×1000) made
// 2.0625 2063, and 1.0005 1001 where KEDA gives 1000); NaN, ±Inf and
// values below 0 are 0. Past what an int64 of thousandths holds it is that
// bound. pulse-sim's HPA reads the same.
func KEDAMilli(v float64) int64 {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	s := strconv.FormatFloat(v, 'f', 3, 64) // fmt's "%.3f"
	n, err := strconv.ParseInt(strings.Replace(s, ".", "", 1), 10, 64)
	if err != nil {
		return math.MaxInt64
	}
	return n
}

// HPARatio is value over target as the HPA divides them: in the
// thousandths KEDA gives it (KEDAMilli). pulsectl query prints the same.
func HPARatio(value, target float64) float64 {
	return float64(KEDAMilli(value)) / float64(max(KEDAMilli(target), 1))
}

// maxDesired bounds DesiredReplicas: the HPA's replica counts are int32.
const maxDesired = math.MaxInt32

// Evaluate computes a trigger's value.
func (s *Server) Evaluate(t Trigger) (Decision, error) { return s.evaluate(t, false) }

// evaluate computes a trigger's value; with detail it lists every pod.
//
// The rule (docs/scaledobject.md, "Pods that start, stop, idle and fail"),
// after the HPA's for pods without metrics
// (k8s.io/kubernetes pkg/controller/podautoscaler/replica_calculator.go):
//   - terminating pods are left out entirely;
//   - starting (not ready) pods are left out: they add no demand;
//   - reporting pods whose metric is undefined over the window (idle, or
//     absent from the page) are left out;
//   - ready pods with no value (failed or stale scrape) are filled by the
//     missingPods rule, in the direction the counted pods give.
func (s *Server) evaluate(t Trigger, detail bool) (Decision, error) {
	s.windows.note(t.Window, s.now()) // before the gate: the warm-up fills what the triggers will read
	if s.gate != nil {
		if err := s.gate(); err != nil {
			return Decision{}, status.Errorf(codes.Unavailable, "%s: %v", describe(t), err)
		}
	}
	if t.Metric == MetricReplicas {
		return s.plan(t)
	}
	var podBuf [16]store.PodValue
	var valBuf [16]float64
	def := t.Def()
	// One read of the store. Every counted pod of a quantile metric stands
	// for the workload's quantile, taken over the counted pods' buckets
	// merged: the missing-pod rule, valueType and aggregation then apply as
	// to any per-pod value. Demand sources count toward a queue: their held
	// requests are waiting nowhere else (docs/scaledobject.md, "Demand
	// before the first pod").
	r := s.store.Read(podBuf[:0], t.Workload, def, t.Window, t.StaleAfter, def.Rule == metric.RuleGauge && def.Num == metric.Waiting)
	if !r.RefusedAt.IsZero() {
		return Decision{}, status.Errorf(codes.Unavailable, "%s: %s", describe(t), planner.RoomRefused)
	}
	if !r.Found {
		return noReplica(t, r)
	}
	c, err := tallyPods(t, def, &r, valBuf[:0])
	if err != nil {
		return Decision{}, err
	}
	if len(c.vals) == 0 {
		if d, done, err := unreported(t, def, &r, &c, detail); done {
			return d, err
		}
	}
	return s.decide(t, &r, &c, detail)
}

// tally is how a trigger's pods entered it: the counted pods' values, and
// the others by state.
type tally struct {
	vals                                                    []float64
	missing, starting, terminating, undefined, busy, noHist int
	// drainingReady: terminating pods whose Ready condition still holds,
	// which the HPA counts among the ready pods for metricType Value.
	drainingReady int
}

// tallyPods sorts the read's pods by state, appending the counted pods'
// values to vals.
func tallyPods(t Trigger, def metric.Def, r *store.Reading, vals []float64) (tally, error) {
	c := tally{vals: vals}
	for i := range r.Pods {
		p := &r.Pods[i]
		switch p.State {
		case store.PodCounted:
			if p.Truncated {
				return c, status.Error(codes.InvalidArgument, truncated(t, p.Name, p.Samples, p.SpanMs))
			}
			if def.Rule != metric.RuleQuantile {
				c.vals = append(c.vals, p.Value)
				continue
			}
			if !r.MergedOK {
				return c, status.Errorf(codes.Unavailable, "%s: the pods' %s histograms share no finite bucket bound: their servers' versions differ", describe(t), def.Hist.Name())
			}
			if r.MergedBeyond && r.Merged < t.Threshold {
				// Answered as the bound, below the threshold, the trigger
				// never scaled up (an older server's buckets stop at 10 s,
				// a newer's p90 past 20).
				return c, status.Errorf(codes.Unavailable, "%s: the %s quantile lies past %g s, the highest bucket bound the pods' histograms share, which is below the threshold %g: how far past it they cannot say (servers whose buckets differ, or requests slower than every bucket)",
					describe(t), def.Hist.Name(), r.Merged, t.Threshold)
			}
			c.vals = append(c.vals, r.Merged)
		case store.PodMissing:
			c.missing++
		case store.PodStarting:
			c.starting++
		case store.PodTerminating:
			c.terminating++
			if p.Ready {
				c.drainingReady++
			}
		case store.PodUndefined:
			if p.Truncated && p.Reason != store.NoHistograms {
				// Not "none finished": what finished may lie in the part
				// of the window the samples kept do not reach. A pod with
				// no histogram needs --forward-histograms, not more.
				return c, status.Error(codes.InvalidArgument, truncated(t, p.Name, p.Samples, p.SpanMs))
			}
			c.undefined++
			if p.Reason == store.NoHistograms {
				c.noHist++
			}
			if !p.Idle {
				c.busy++
			}
		}
	}
	return c, nil
}

// unreported answers a trigger no pod gives a value for: the routers'
// demand when no replica is ready, or an error — never a silent 0; done is
// false when only idle pods report (the workload has no load: decide
// answers it).
func unreported(t Trigger, def metric.Def, r *store.Reading, c *tally, detail bool) (Decision, bool, error) {
	if c.noHist > 0 && c.noHist == c.undefined {
		return Decision{}, true, status.Errorf(codes.Unavailable, "%s: metric %q needs the %s histogram, which no agent forwards for this workload's pods: start the agents with --forward-histograms (value forwardHistograms of the deploy/daemonset chart)", describe(t), t.Metric, def.Hist.Name())
	}
	if c.undefined == 0 {
		if c.missing == 0 && r.Demand.Sources > 0 {
			// No replica is ready (all start or stop): the routers' demand
			// is the whole of it.
			if err := staleDemand(t, r.Demand); err != nil {
				return Decision{}, true, err
			}
			d, err := demandOnly(t, r.Demand, c.drainingReady)
			if err != nil {
				return Decision{}, true, err
			}
			d.LeftOut = len(r.Pods)
			if detail {
				d.list(podDecisions(r.Pods, -1, "", false))
			}
			return d, true, nil
		}
		// An error, so that KEDA applies its fallback and the HPA holds:
		// never a silent 0.
		if c.missing > 0 {
			return Decision{}, true, status.Errorf(codes.Unavailable, "%s: stale: no ready pod reported within staleAfter %s (%d ready pods without a value, %d starting)",
				describe(t), t.StaleAfter, c.missing, c.starting)
		}
		return Decision{}, true, status.Errorf(codes.Unavailable, "%s: no pod is ready yet (%d starting, %d terminating)", describe(t), c.starting, c.terminating)
	}
	if c.busy > 0 {
		return Decision{}, true, status.Errorf(codes.Unavailable, "%s: metric %q is not defined on any reporting pod (absent from the pages, or requests waiting or running but none finished in the window)", describe(t), t.Metric)
	}
	return Decision{}, false, nil
}

// decide computes the value from the counted pods, the missing-pod rule's
// fill and the routers' held demand. Only idle pods reporting (no request
// waiting or running, none finished) is a workload with no load: its value
// is 0 before the fill.
func (s *Server) decide(t Trigger, r *store.Reading, c *tally, detail bool) (Decision, error) {
	var d Decision
	vals, dv := c.vals, r.Demand
	if len(vals) > 0 {
		d.Reporting = aggregate(vals, t.Aggregation)
	}
	// The direction the missing pods are filled in is the HPA's: from the
	// counted pods' value with the requests the routers hold spread over
	// them (held demand ignored here once gave 5 replicas where the HPA's
	// rule gives at most 4).
	perPod := d.Reporting
	if dv.Held > 0 {
		perPod += dv.Held / float64(max(len(vals), 1))
	}
	up := perPod > t.Threshold
	d.Direction = "down"
	if up {
		d.Direction = "up"
	}
	fill, fillWhy := s.fill(t, up)
	n := len(vals)
	if fill >= 0 && c.missing > 0 {
		for range c.missing {
			vals = append(vals, fill)
		}
		if t.Aggregation == "avg" || fill > 0 {
			// A pod counted 0 adds nothing to a max × pods total.
			n += c.missing
		}
	}
	// The workload's total: the pods counted and filled (an ignored pod,
	// an idle one, and a failing one counted 0 under max are not), as
	// total answers it; average answers its share of each pod the HPA
	// multiplies by (forTheHPA).
	v := 0.0
	if len(vals) > 0 {
		v = aggregate(vals, t.Aggregation)
	}
	if t.Aggregation == "avg" {
		v = sum(vals)
	} else {
		v *= float64(n)
	}
	pods := r.Pods
	ready := len(pods) - c.starting - c.terminating
	hpaReady := ready + c.drainingReady
	// For activation, over the pods the total holds (not those ignored).
	perPodActive := (v + dv.Held) / float64(max(n, 1))
	v = forTheHPA(t, v, hpaReady, dv.Held)
	if up && fill == 0 && c.missing > 0 {
		v = heldUp(t, v, len(c.vals)+c.missing, hpaReady)
		perPodActive = max(perPodActive, t.Threshold)
	}
	d.Pending = dv.Held
	if err := valid(t, v); err != nil {
		return Decision{}, err
	}
	d.Value, d.Active = v, v > t.ActivationThreshold
	if t.ValueType == "average" {
		// Activation is the serving pods' average: a pod draining in its
		// grace period, in the HPA's count, lowered the value below the
		// activation threshold of a workload still serving.
		d.Active = perPodActive > t.ActivationThreshold
	}
	d.Counted = len(pods) - c.missing - c.starting - c.terminating - c.undefined
	if fill >= 0 {
		d.Filled = c.missing
	}
	d.LeftOut = len(pods) - d.Counted - d.Filled
	d.Ready = ready
	if t.ValueType == "average" {
		d.Ready = hpaReady
	}
	if detail {
		d.list(podDecisions(pods, fill, fillWhy, t.Def().Rule == metric.RuleQuantile))
	}
	return d, nil
}

// heldUp is v (as the HPA gets it, the routers' held requests in), in
// the scale-up direction with pods failing (counted 0), at least what
// keeps the pods counted and filled: the HPA's rule, whose fill is undone
// when it flips the direction (replica_calculator.go: a new usage ratio on
// the other side of 1 keeps the current count). Two pods at 12 (threshold
// 10) beside two failing answered 24, and the HPA took an overloaded
// workload from 4 replicas to 3. With valueType average the HPA's product
// (v × its ready pods, hpaReady) is held the same.
func heldUp(t Trigger, v float64, pods, hpaReady int) float64 {
	least := t.Threshold * float64(pods)
	if t.ValueType == "average" {
		least /= float64(max(hpaReady, 1))
	}
	return max(v, least)
}

// forTheHPA is the workload's total v, with the requests held at the
// routers added, as the HPA should get it: whole for valueType total
// (metricType AverageValue: the HPA divides by the threshold); for
// average (metricType Value) divided by the HPA's count of Ready pods,
// hpaReady, which it multiplies by (replica_calculator.go,
// getReadyPodsCount: every pod Running and Ready, those draining in their
// grace period, idle and failing ones included), so that either asks for
// the same replicas. The average of the counted pods had been scaled by
// the serving pods' share alone: a failing pod under max, or an idle one
// (left out of total's count), was in the HPA's product all the same (one
// pod at 3 s beside two idle asked total for 3 replicas, average for 9).
func forTheHPA(t Trigger, v float64, hpaReady int, held float64) float64 {
	if t.ValueType != "average" {
		return v + held
	}
	return (v + held) / float64(max(hpaReady, 1))
}

// noReplica answers for a workload with no replica listed: the routers'
// demand, or an error, never a silent 0 for replicas that were reporting.
func noReplica(t Trigger, r store.Reading) (Decision, error) {
	// Replicas that were reporting and are gone without their agent
	// removing them (the agent lost past --pod-expiry) are no
	// workload without load: an error, so that KEDA's fallback applies and
	// the HPA holds, never a 0 that scales a serving workload down or to
	// zero.
	if l := r.Lost; r.LostOK {
		return Decision{}, status.Errorf(codes.Unavailable, "%s: its %d replicas that were reporting are gone without their agent removing them (agent lost past --pod-expiry) since %s: no value, rather than 0",
			describe(t), l.Pods, l.At.UTC().Format(time.RFC3339))
	}
	dv := r.Demand
	if dv.Sources > 0 {
		if err := staleDemand(t, dv); err != nil {
			return Decision{}, err
		}
		return demandOnly(t, dv, 0)
	}
	if dv.Stale > 0 {
		return Decision{}, status.Errorf(codes.Unavailable, "%s: no replica, and its %d demand sources have not reported within staleAfter %s", describe(t), dv.Stale, t.StaleAfter)
	}
	return Decision{}, status.Errorf(codes.NotFound, "%s: no pod of this workload has been reported", describe(t))
}

// staleDemand is the error for a workload with no ready replica whose
// routers' demand is unheard (store.DemandValue.Unheard). Demand the fresh
// ones report is answered (a scale-up the stale ones can only add to).
func staleDemand(t Trigger, dv store.DemandValue) error {
	if !dv.Unheard() {
		return nil
	}
	return status.Errorf(codes.Unavailable, "%s: no replica ready; its %d demand sources that report hold no request, and %d of ready routers have not reported within staleAfter %s: no value, rather than 0",
		describe(t), dv.Sources, dv.Silent, t.StaleAfter)
}

// demandOnly is the decision of a waiting trigger whose workload has no
// ready replica: the requests its routers hold, and those that arrived at
// them over the window (a router that holds nothing refuses them: each is
// demand no replica has seen). With valueType average they are spread
// over the HPA's count of Ready pods, hpaReady (pods draining in their
// grace period; at least one), as forTheHPA spreads them: the HPA
// multiplied the whole by its count (20 requests held beside 2 draining
// pods, threshold 10: 4 replicas, not 2).
//
// Its value is bounded as every answer is (valid): a router's page of
// huge values (1e308, summed to +Inf) was answered as it was, and KEDA's
// thousandths of it wrapped.
func demandOnly(t Trigger, dv store.DemandValue, hpaReady int) (Decision, error) {
	v := forTheHPA(t, 0, hpaReady, dv.Held+dv.Arrived)
	if err := valid(t, v); err != nil {
		return Decision{}, err
	}
	// Active on the whole demand whatever the valueType: no pod serves, as
	// in decide with none (spread over the draining pods, 20 requests held
	// beside 2 read 10, below an activation of 15, until they were gone).
	d := Decision{Value: v, Active: dv.Held+dv.Arrived > t.ActivationThreshold, Direction: "down", Reporting: v, Pending: v}
	if t.ValueType == "average" {
		d.Ready = hpaReady // what the HPA multiplies by: the desired count shown is its
	}
	if v > t.Threshold {
		d.Direction = "up"
	}
	return d, nil
}

// valid refuses an answer's value that is no metric value KEDA can carry:
// negative, not a number, infinite, or past MaxValue (KEDA keeps a value
// in thousandths in an int64: past about 9.2e15 it wraps negative, and the
// HPA scales to its minimum).
func valid(t Trigger, v float64) error {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return status.Errorf(codes.Internal, "%s: computed value %v is not a valid metric value", describe(t), v)
	}
	if v > MaxValue {
		return status.Errorf(codes.Internal, "%s: computed value %g is past %g, more than KEDA can carry", describe(t), v, MaxValue)
	}
	return nil
}

// fill is the value given to ready pods with no value, and the rule's name;
// a negative fill leaves them out.
func (s *Server) fill(t Trigger, up bool) (float64, string) {
	switch {
	case t.MissingPods == MissingIgnore:
		return -1, "ignored"
	case up:
		return 0, "scale-up: 0"
	case t.MissingPods == MissingSeed && t.Aggregation == "avg":
		return 1.5 * t.Threshold, "seed: 1.5 × threshold"
	case t.MissingPods == MissingSeed:
		return t.Threshold, "seed: threshold (max)"
	}
	return t.Threshold, "hold: threshold"
}

// maxPodDetail bounds the pods a decision lists.
const maxPodDetail = 32

// list sets the pods d lists: at most maxPodDetail, filled and left out
// first.
func (d *Decision) list(pods []PodDecision) {
	d.Pods, d.PodsNotListed = pods, 0
	if n := len(pods); n > maxPodDetail {
		slices.SortStableFunc(pods, func(a, b PodDecision) int { return cmp.Compare(useRank(a.Use), useRank(b.Use)) })
		d.Pods, d.PodsNotListed = slices.Clip(pods[:maxPodDetail]), n-maxPodDetail
	}
}

// useRank orders the pods a decision lists: filled, then left out, then
// counted.
func useRank(use string) int {
	switch use {
	case UseFilled:
		return 0
	case UseLeftOut:
		return 1
	}
	return 2
}

func podDecisions(pods []store.PodValue, fill float64, fillWhy string, quantile bool) []PodDecision {
	out := make([]PodDecision, 0, len(pods))
	for _, p := range pods {
		pd := PodDecision{Name: p.Name, Use: UseLeftOut}
		switch p.State {
		case store.PodCounted:
			pd.Use, pd.Value = UseCounted, p.Value
			if quantile {
				pd.Why = "its own quantile; its buckets are merged into the workload's"
			}
		case store.PodMissing:
			if fill >= 0 {
				pd.Use, pd.Value = UseFilled, fill
			}
			pd.Why = fillWhy + " (" + p.Reason + ")"
		case store.PodUndefined:
			pd.Why = "undefined"
			switch {
			case p.Idle:
				pd.Why = "idle"
			case p.Reason != "":
				pd.Why = "undefined: " + p.Reason
			}
		default:
			pd.Why = p.State.String()
		}
		out = append(out, pd)
	}
	return out
}

// truncated says why t's window is refused: pod's samples kept span only
// spanMs.
func truncated(t Trigger, pod string, samples int, spanMs int64) string {
	interval := time.Duration(0)
	if samples > 1 {
		interval = time.Duration(spanMs/int64(samples-1)) * time.Millisecond
	}
	need := samples
	if interval > 0 {
		need = int(t.Window/interval) + 2
	}
	return fmt.Sprintf("%s: trigger metadata \"window\": %s reaches past the samples kept: pod %s is sampled every %s and the aggregator keeps %d samples per pod (%s); shorten the window or raise the aggregator's --max-samples-per-pod to at least %d",
		describe(t), t.Window, pod, interval, samples, time.Duration(spanMs)*time.Millisecond, need)
}

func aggregate(vals []float64, how string) float64 {
	if how == "max" {
		m := vals[0]
		for _, v := range vals[1:] {
			m = math.Max(m, v)
		}
		return m
	}
	return sum(vals) / float64(len(vals))
}

func sum(vals []float64) float64 {
	var s float64
	for _, v := range vals {
		s += v
	}
	return s
}

func describe(t Trigger) string {
	return t.Workload.String()
}
