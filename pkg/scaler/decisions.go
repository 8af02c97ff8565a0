package scaler

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/slots"
	"github.com/pulse-io/pulse/pkg/store"
)

// Bounds of the decision records: a trigger not evaluated for decisionTTL
// (its ScaledObject is gone; the HPA asks every 15 s) is forgotten, and at
// most maxDecisions are kept (past it, the namespace holding the most loses
// its oldest).
const (
	decisionTTL  = 10 * time.Minute
	maxDecisions = 10000
)

// TriggerID names one trigger of one ScaledObject.
type TriggerID struct {
	Namespace    string `json:"namespace"`
	ScaledObject string `json:"scaledObject"`
	// MetricName is the trigger's metric name (MetricName), which folds
	// the workload's name (llama.v1 and llama-v1 are one metric name).
	MetricName string `json:"metricName"`
	// workload and metric tell apart the triggers of one ScaledObject
	// whose metric names fold to one: keyed by the name alone, two
	// triggers on Deployments llama.v1 and llama-v1 had one record, the
	// last evaluated's.
	workload store.Key
	metric   string
}

// idOf is the record's key of ScaledObject ref's trigger t.
func idOf(ref *externalscaler.ScaledObjectRef, t Trigger) TriggerID {
	return TriggerID{Namespace: ref.GetNamespace(), ScaledObject: ref.GetName(), MetricName: MetricName(t), workload: t.Workload, metric: t.Metric}
}

// Evaluation is the last answer pulse gave for one trigger.
type Evaluation struct {
	TriggerID
	Trigger Trigger
	At      time.Time
	// Decision is set when Err is empty.
	Decision Decision
	Err      string
	// Refused: the request was refused for the ScaledObject's metadata
	// (InvalidArgument); Trigger holds what of it parsed.
	Refused bool
}

// Desired is the replica count the HPA derives from the evaluation, or -1
// when it failed.
func (e Evaluation) Desired() int {
	if e.Err != "" {
		return -1
	}
	return e.Decision.DesiredReplicas(e.Trigger)
}

// recorder keeps each trigger's last evaluation, by namespace, each
// namespace's in the order they were last recorded.
type recorder struct {
	now     func() time.Time
	mu      sync.Mutex
	ns      map[string]*simplelru.LRU[TriggerID, *Evaluation]
	n       int       // records held, in all namespaces
	swept   time.Time // when records past decisionTTL were last dropped
	refused refusals
}

func newRecorder(now func() time.Time) *recorder {
	return &recorder{now: now, ns: map[string]*simplelru.LRU[TriggerID, *Evaluation]{},
		refused: refusals{counts: map[string]float64{}, logged: map[string]map[TriggerID]time.Time{}}}
}

func (r *recorder) record(ref *externalscaler.ScaledObjectRef, t Trigger, d Decision, err error) {
	id := idOf(ref, t)
	e := &Evaluation{TriggerID: id, Trigger: t, At: r.now(), Decision: d}
	if err != nil {
		e.Err = err.Error()
		if st, ok := status.FromError(err); ok {
			e.Err = st.Code().String() + ": " + st.Message()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.putLocked(e)
}

// putLocked holds e as its trigger's record. Full (maxDecisions), the
// records past decisionTTL are dropped (a walk of all, at most once a
// decisionSweep), then, if still full, the oldest of the namespace holding
// the most: one tenant's many ScaledObjects push out their own records
// (and gauges), never another tenant's. Each record once walked every
// record twice when full.
func (r *recorder) putLocked(e *Evaluation) {
	l := r.ns[e.Namespace]
	if l == nil || !l.Contains(e.TriggerID) {
		if r.n >= maxDecisions {
			if now := r.now(); now.Sub(r.swept) >= decisionSweep {
				r.expireLocked()
			}
			if r.n >= maxDecisions {
				r.forgetOneLocked()
			}
		}
		r.n++
		if l = r.ns[e.Namespace]; l == nil {
			l, _ = simplelru.NewLRU[TriggerID, *Evaluation](maxDecisions, nil)
			r.ns[e.Namespace] = l
		}
	}
	l.Add(e.TriggerID, e)
}

// decisionSweep: how often a full recorder may walk its records for those
// past decisionTTL.
const decisionSweep = 10 * time.Second

// expireLocked drops records older than decisionTTL.
func (r *recorder) expireLocked() {
	now := r.now()
	r.swept = now
	for ns, l := range r.ns {
		for {
			_, e, ok := l.GetOldest()
			if !ok || now.Sub(e.At) <= decisionTTL {
				break
			}
			l.RemoveOldest()
			r.n--
		}
		if l.Len() == 0 {
			delete(r.ns, ns)
		}
	}
}

// forgetOneLocked drops the oldest record of the namespace holding the
// most.
func (r *recorder) forgetOneLocked() {
	if forgetOldestOfMost(r.ns) {
		r.n--
	}
}

// Evaluations returns every trigger's last evaluation, sorted by namespace,
// ScaledObject and metric name.
func (s *Server) Evaluations() []Evaluation { return s.EvaluationsOf("") }

// EvaluationsOf is Evaluations of the ScaledObjects of namespace ns alone
// ("": every namespace's). One namespace's debug page copied every
// namespace's records, under the lock KEDA's answers take, to keep its own.
// Under the lock only the records' pointers are taken (a record is never
// changed once held: each evaluation makes a new one); they are copied
// after it. Copied under it, a scrape of 10,000 records held the lock
// every KEDA answer's record takes for 1.8–3.3 ms (measured in a review,
// 2026-12-07).
func (s *Server) EvaluationsOf(ns string) []Evaluation {
	r := s.decisions
	r.mu.Lock()
	r.expireLocked()
	var held []*Evaluation
	if ns == "" {
		held = make([]*Evaluation, 0, r.n)
		for _, l := range r.ns {
			held = append(held, l.Values()...)
		}
	} else if l := r.ns[ns]; l != nil {
		held = l.Values()
	}
	r.mu.Unlock()
	var out []Evaluation // nil for a namespace of none, as before
	if held != nil {
		out = make([]Evaluation, len(held))
	}
	for i, e := range held {
		out[i] = *e
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].TriggerID, out[j].TriggerID
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.ScaledObject != b.ScaledObject {
			return a.ScaledObject < b.ScaledObject
		}
		if a.MetricName != b.MetricName {
			return a.MetricName < b.MetricName
		}
		// Two workloads of one metric name (llama.v1, llama-v1): in one
		// order at every read.
		return a.workload.String() < b.workload.String()
	})
	return out
}

// Collector exports each trigger's last evaluation as gauges labelled by
// namespace, ScaledObject, workload and metric.
func (s *Server) Collector() prometheus.Collector { return decisionCollector{s} }

var (
	triggerLabels = []string{"namespace", "scaledobject", "workload", "metric"}
	descValue     = prometheus.NewDesc("pulse_aggregator_trigger_value",
		"The value pulse last answered for a ScaledObject trigger.", triggerLabels, nil)
	descThreshold = prometheus.NewDesc("pulse_aggregator_trigger_threshold",
		"The trigger's threshold (the HPA's per-pod target).", triggerLabels, nil)
	descDesired = prometheus.NewDesc("pulse_aggregator_trigger_desired_replicas",
		"The replica count the HPA derives from the last value, before its tolerance, behaviour and min/max.", triggerLabels, nil)
	descPods = prometheus.NewDesc("pulse_aggregator_trigger_pods",
		"Pods in the trigger's last evaluation, by use: counted, filled (missing-pod rule) or left_out.",
		append(triggerLabels[:len(triggerLabels):len(triggerLabels)], "use"), nil)
	descFailed = prometheus.NewDesc("pulse_aggregator_trigger_failed",
		"1 when the trigger's last evaluation answered an error (stale, warming up, not found).", triggerLabels, nil)

	// The planner's (metric replicas) parts of its last plan, in the order
	// Collect gives their values.
	planDescs = []*prometheus.Desc{
		planDesc("work_per_second", "Work offered to the workload's replicas (prompt tokens + 4 × generated tokens per second, with the queue's growth), in the planner's last plan."),
		planDesc("capacity_per_replica", "Work per second one replica sustains within the SLO, as the planner has learned it (0 before it has)."),
		planDesc("capacity_confidence", "The planner's confidence in the capacity learned (0 to 1, growing with its observations)."),
		planDesc("capacity_observations", "Replica windows the capacity was learned from."),
		planDesc("lead_time_seconds", "A replica's startup (created to Ready) as the planner has learned it, or assumed before it has seen one."),
		planDesc("need_replicas", "Replicas the current load needs, before the hold."),
		planDesc("held_peak_replicas", "The largest need within the hold (the lead time and its deviations, a margin, and the extension regrets add), which the plan keeps."),
		planDesc("held_until_timestamp_seconds", "When the held peak is released (Unix seconds; 0 when no peak past the need now is held)."),
		planDesc("backlog", "Work waiting: queued on the replicas and held at the routers."),
		planDesc("backlog_then", "The backlog projected to when capacity asked for now is ready, a lead time from now (the need drains it over a lead time)."),
		planDesc("drain_need_replicas", "Replicas among which the arriving work must be spread for the largest queue at one ready replica, when capacity asked for now is ready, to be gone a minute after (a replica's queue drains only through it); the need is at least this."),
		planDesc("starting_replicas", "Replicas starting (not Ready), counted as capacity coming."),
		planDesc("surge_work_per_second", "The largest move of the work arriving within one lead time the planner has seen: a rise, or a fall from a level held (fading by half in an hour)."),
		planDesc("level_surge_work_per_second", "The largest move of the level of the work arriving within one lead time the planner has seen (the last quarter of a lead time's mean against the older half's; fading by half in an hour): a move of the level, not of one window."),
		planDesc("trend_work_per_second", "How far the level of the work arriving rises within the next lead time, where it rose in each quarter of the last one (four times the slowest quarter's rise; 0 where it did not): not a memory, each observation sets it."),
		planDesc("planned_work_per_second", "The work per second the plan covers: the work over the utilisation, the work plus the surge up to its recent peak, the work plus the level's surge beyond the utilisation's headroom, up to the peak, over the utilisation, or the work plus its trend beyond that headroom over the utilisation, whichever is most."),
		planDesc("refused_replicas", "Ready replicas whose window was past what is believed of one replica (planned as replicas without a fresh sample)."),
		planDesc("stuck_replicas", "Replicas starting, or ready before and unready since, longer than an hour (or three lead times learned, never past 24 hours): no capacity coming."),
		planDesc("unseen_replicas", "Replicas whose agent is lost past --pod-expiry that the API still has (planned as replicas without a fresh sample, or starting)."),
		planDesc("unready_replicas", "Replicas ready before and not now (a failed probe, a restarted container), planned as replicas without a fresh sample until unready as long as a stuck start."),
	}
)

// heldUntil is when p's held peak is released, in Unix seconds (0: none).
func heldUntil(p *planner.Plan) float64 {
	if p.HeldUntil.IsZero() {
		return 0
	}
	return float64(p.HeldUntil.UnixNano()) / 1e9
}

func planDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("pulse_aggregator_plan_"+name, help, triggerLabels, nil)
}

type decisionCollector struct{ s *Server }

func (c decisionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append([]*prometheus.Desc{descValue, descThreshold, descDesired, descPods, descFailed, descRefused, descStreams, descStreamsRefused, descStreamsReclaimed, descSeriesLeftOut}, planDescs...) {
		ch <- d
	}
}

func (c decisionCollector) Collect(ch chan<- prometheus.Metric) {
	c.collectRefused(ch)
	c.collectStreams(ch)
	evals := c.s.Evaluations()
	all := len(evals)
	if limit := c.s.maxTriggerSeries; limit > 0 && len(evals) > limit {
		evals = slots.Share(evals, limit, func(e Evaluation) string { return e.Namespace }, func(a, b Evaluation) int {
			return cmp.Or(strings.Compare(a.ScaledObject, b.ScaledObject), strings.Compare(a.MetricName, b.MetricName))
		})
	}
	ch <- prometheus.MustNewConstMetric(descSeriesLeftOut, prometheus.GaugeValue, float64(all-len(evals)))
	for _, e := range evals {
		collectTrigger(ch, e)
	}
}

// collectTrigger sends e's series, which share its labels' pairs
// (triggerGauge).
func collectTrigger(ch chan<- prometheus.Metric, e Evaluation) {
	lv := []string{e.Namespace, e.ScaledObject, e.Trigger.Workload.String(), e.Trigger.Metric}
	if e.Refused {
		// Its metadata did not parse: what was read of it may name the
		// same workload and metric as a trigger answered beside it, and
		// two series with the same labels are one too many.
		lv[3] = RefusedMetricLabel
	}
	for i := range lv {
		lv[i] = strings.ToValidUTF8(lv[i], "\uFFFD") // a label value must be UTF-8 (it is: a proto3 string each)
	}
	pairs := prometheus.MakeLabelPairs(descValue, lv) // every trigger series' labels but the pods'
	gauge := func(d *prometheus.Desc, v float64) { ch <- &triggerGauge{desc: d, pairs: pairs, v: v} }
	gauge(descThreshold, e.Trigger.Threshold)
	failed := 0.0
	if e.Err != "" {
		failed = 1
	}
	gauge(descFailed, failed)
	if e.Err != "" {
		return
	}
	d := e.Decision
	gauge(descValue, d.Value)
	gauge(descDesired, float64(e.Desired()))
	for i, n := range []int{d.Counted, d.Filled, d.LeftOut} {
		ch <- &triggerGauge{desc: descPods, pairs: withPair(pairs, podUses[i]), v: float64(n)}
	}
	if p := d.Plan; p != nil {
		for i, v := range []float64{p.Work, p.Capacity, p.Confidence, float64(p.Observations), p.LeadTime.Seconds(),
			p.Need, p.HeldPeak, heldUntil(p), p.Backlog, p.BacklogThen, p.DrainNeed, float64(p.Starting), p.Surge, p.LevelSurge, p.Trend, p.Level, float64(p.Refused), float64(p.Stuck), float64(p.Unseen), float64(p.Unready)} {
			gauge(planDescs[i], v)
		}
	}
}

// podUses are the pods series' use label, in the order collectTrigger
// gives their values: shared by every scrape (read, never written).
var podUses = []*dto.LabelPair{
	{Name: proto.String("use"), Value: proto.String("counted")},
	{Name: proto.String("use"), Value: proto.String("filled")},
	{Name: proto.String("use"), Value: proto.String("left_out")},
}

// withPair is pairs, sorted by name, with p in its place: a new slice of
// the same pairs.
func withPair(pairs []*dto.LabelPair, p *dto.LabelPair) []*dto.LabelPair {
	i, _ := slices.BinarySearchFunc(pairs, p.GetName(), func(x *dto.LabelPair, name string) int { return strings.Compare(x.GetName(), name) })
	return slices.Insert(slices.Clip(pairs), i, p)
}

// triggerGauge is one series of a trigger, its label pairs shared with the
// trigger's other series (the planner's 27, others' 7; a trigger's labels
// are the same in each but the pods' use). A const metric each
// (prometheus.MustNewConstMetric) made every series its own pairs: a
// scrape at 1,000 ScaledObjects, half of them planner triggers, allocated
// 14.6 MB, all garbage once the page was written and counted live by a GC
// that marked meanwhile (BenchmarkTriggerSeriesScrape). The pairs are
// read, never written, by the registry and the encoder.
type triggerGauge struct {
	desc  *prometheus.Desc
	pairs []*dto.LabelPair
	v     float64
}

func (g *triggerGauge) Desc() *prometheus.Desc { return g.desc }

func (g *triggerGauge) Write(m *dto.Metric) error {
	m.Label, m.Gauge = g.pairs, &dto.Gauge{Value: &g.v}
	return nil
}
