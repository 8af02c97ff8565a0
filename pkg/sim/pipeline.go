package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
	pulseplanner "github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
)

// Pipeline is one autoscaling signal path: how the HPA (through KEDA) and
// KEDA's activation learn the trigger's metric.
type Pipeline interface {
	// Attach schedules the pipeline's own periodic work.
	Attach(w *world)
	// Metric is the value KEDA's metrics adapter hands the HPA at a sync.
	Metric(w *world) (float64, error)
	// Active is what KEDA's poll (IsActive) gets.
	Active(w *world) (bool, error)
	// The workload's replicas as the pipeline's discovery sees them.
	ReplicaAdded(w *world, rp *rep)
	ReplicaReady(w *world, rp *rep)
	ReplicaTerminating(w *world, rp *rep)
	ReplicaRemoved(w *world, rp *rep)
	// Demand: a request is held at the gateway (no replica is ready).
	Demand(w *world)
}

// pipelines are the signal pipelines pulse-sim knows, by name.
var pipelines = map[string]func(*Config) Pipeline{
	"pulse":          newPulse,
	"prometheus":     func(c *Config) Pipeline { return newPrometheus(c, false) },
	"prometheus-avg": func(c *Config) Pipeline { return newPrometheus(c, true) },
	"kaito":          newKaito,
	"oracle":         func(*Config) Pipeline { return &oracle{} },
}

// Pipelines lists the signal pipelines' names, in report order. Besides
// them, static:N and clairvoyant[:key=value,...] name references that set
// the replica count themselves (planned.go).
func Pipelines() []string {
	return []string{"pulse", "prometheus", "prometheus-avg", "kaito", "oracle"}
}

// newPipeline makes the pipeline a name says for cfg (whose trigger is
// parsed), or says why it cannot: an unknown name, bad parameters, or a
// pipeline that cannot express the trigger's metric (never another
// trigger under its name).
func newPipeline(name string, cfg *Config) (Pipeline, error) {
	base, args, hasArgs := strings.Cut(name, ":")
	switch base {
	case "static":
		return newStatic(name, args, cfg)
	case "switch":
		return newSwitch(name, args, cfg)
	case "clairvoyant":
		return newClairvoyant(name, args, cfg)
	case "hindsight":
		return newHindsight(name, args, cfg)
	}
	f, ok := pipelines[name]
	if !ok || hasArgs {
		return nil, fmt.Errorf("pipeline %q: one of %s, static:N, switch:from=N,to=M,at=F, clairvoyant[:window=D,horizon=D,hold=D,utilisation=U] or hindsight[:window=D,hold=D,utilisation=U]", name, strings.Join(Pipelines(), ", "))
	}
	if base == "oracle" && cfg.trigger.Metric == scaler.MetricReplicas {
		return nil, fmt.Errorf("pipeline oracle cannot express metric %s: it is a threshold metric's true value from the replicas' state, and the planner's value is a count it plans from what it learned (its bound is clairvoyant)", scaler.MetricReplicas)
	}
	if _, gauge := gaugeOf(cfg.trigger.Metric); !gauge && (base == "prometheus" || base == "prometheus-avg" || base == "kaito") {
		what := "KEDA's prometheus trigger over one vLLM gauge"
		if base == "kaito" {
			what = "keda-kaito-scaler, which sums one vLLM gauge"
		}
		return nil, fmt.Errorf("pipeline %s cannot express metric %s: it is %s, and %s is not one (use waiting, running or kvCacheUsage, or leave %s out)",
			base, cfg.trigger.Metric, what, cfg.trigger.Metric, base)
	}
	return f(cfg), nil
}

// gaugeOf is the raw gauge a canonical gauge metric reads; false for
// metrics that are not plain gauges (rates, ratios, quantiles, saturation),
// which only pulse and the oracle express (through pulse's evaluation
// model); the Prometheus and Kaito pipelines refuse them.
func gaugeOf(name string) (metric.ID, bool) {
	m, ok := metric.Lookup(name)
	if !ok || m.Rule != metric.RuleGauge { // saturation (RuleLoad) is not one gauge
		return 0, false
	}
	return m.Num, true
}

// noHooks are empty replica hooks.
type noHooks struct{}

func (noHooks) ReplicaAdded(*world, *rep)       {}
func (noHooks) ReplicaReady(*world, *rep)       {}
func (noHooks) ReplicaTerminating(*world, *rep) {}
func (noHooks) ReplicaRemoved(*world, *rep)     {}
func (noHooks) Demand(*world)                   {}

// ---- pulse ----------------------------------------------------------------

// Delays of pulse's path, as the agent and aggregator run: the pod
// informer's watch and the next catalogue (catalogueDelay), and a
// sample's batch delay and network hop (sampleDelay).
const (
	catalogueDelay = time.Second
	sampleDelay    = 25 * time.Millisecond
)

// pulsePipe runs pulse's own pkg/store and pkg/scaler under the virtual
// clock: every ready pod is scraped every ScrapeInterval at its own stable
// phase, its values quantized as the wire carries them, and stored after
// the agent's batch delay; the HPA's query is the scaler's Evaluate.
type pulsePipe struct {
	noHooks
	cfg     *Config
	st      *store.Store
	srv     *scaler.Server
	base    time.Time
	scraped map[*rep]bool
	// pushed: what KEDA's StreamIsActive stream last sent (pushed), if
	// it sent anything (sent).
	pushed, sent bool
	// last: the plan of the last evaluation (explainer).
	last *pulseplanner.Plan
}

func newPulse(cfg *Config) Pipeline {
	return &pulsePipe{cfg: cfg, scraped: map[*rep]bool{}}
}

func (p *pulsePipe) Attach(w *world) {
	p.base = time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return p.base.Add(w.now) }
	win := max(p.cfg.trigger.Window*2, time.Minute)
	p.st = store.New(store.Options{Retention: win, MaxSamples: int(win/p.cfg.ScrapeInterval) + 4, Now: clock, MaxPods: 100000})
	p.srv = scaler.New(p.st, scaler.Options{MaxWindow: win, Now: clock})
	if p.cfg.DemandSource {
		p.scrapeGateway(w)
	}
	// KEDA's open StreamIsActive stream has the trigger evaluated at each
	// batch of samples, about once a second, besides the HPA's syncs and
	// KEDA's polls (the planner learns at each evaluation: at most an
	// observation every 5 s, peaks at every one), and sends each change of
	// its state, true or false. KEDA takes a turn to active at once as a
	// poll's answer (RequestScale: from zero, and its lastActiveTime
	// refreshed), and ignores a turn to inactive: "inactivation events are
	// ignored and inactivation happens through the standard metric scaling
	// logic" (KEDA v2.21 pkg/scaling/scale_handler.go, startPushScalers),
	// so a workload goes to zero only at a poll. Until 2026-11-30 (first
	// session) only a turn to active at zero replicas was modelled; then,
	// until the second, a turn to inactive checked the cooldown at once.
	w.every(sampleDelay+time.Second/2, time.Second, func() { p.push(w) })
}

// push is one evaluation of KEDA's stream: its state sent if it changed,
// and taken by KEDA if it is active.
func (p *pulsePipe) push(w *world) {
	d, err := p.evaluate()
	if err != nil || p.sent && d.Active == p.pushed {
		return // pulse sends nothing on an error, nor the same state again
	}
	p.pushed, p.sent = d.Active, true
	if d.Active {
		w.kedaScale(true, false)
	}
}

// scrapeGateway is the agent scraping the gateway as a demand source: every
// ScrapeInterval it reports the requests held (no replica ready) as the
// workload's pendingRequests; KEDA's push stream then sends true the
// moment the scaler's answer turns active at zero replicas.
func (p *pulsePipe) scrapeGateway(w *world) {
	const node = "gateway-node"
	uid := store.DemandUID("gateway", p.cfg.trigger.Workload.Name)
	p.st.Upsert(store.Source{Node: node, Instance: "agent"}, []store.PodInfo{{UID: uid, Namespace: p.cfg.trigger.Workload.Namespace,
		Name: "gateway", Workloads: []store.Key{p.cfg.trigger.Workload}, Ready: true, Demand: true}}, false)
	iv := p.cfg.ScrapeInterval
	var scrape func()
	scrape = func() {
		rep := store.Report{UID: uid}
		rep.TimeMs = p.base.Add(w.now).UnixMilli()
		rep.Values.Set(metric.PendingRequests, float64(len(w.gate)))
		w.at(w.now+sampleDelay, func() {
			p.st.Add([]store.Report{rep})
			if w.spec == 0 {
				p.push(w) // the batch that carries demand at zero: evaluated at once
			}
		})
		if next := w.now + iv; next <= w.cfg.horizon {
			w.at(next, scrape)
		}
	}
	w.at(phase("gateway", iv), scrape)
}

func (p *pulsePipe) info(rp *rep) store.PodInfo {
	return store.PodInfo{UID: rp.uid, Namespace: p.cfg.trigger.Workload.Namespace, Name: rp.name,
		Workloads: []store.Key{p.cfg.trigger.Workload}, Ready: rp.state == ready, Terminating: rp.state == terminating}
}

// list upserts the pod as the agent's catalogue would, after the
// informer's and the stream's delay.
func (p *pulsePipe) list(w *world, rp *rep) {
	info := p.info(rp)
	w.at(w.now+catalogueDelay, func() { p.st.Upsert(store.Source{Node: rp.uid, Instance: "agent"}, []store.PodInfo{info}, false) })
}

func (p *pulsePipe) ReplicaAdded(w *world, rp *rep)       { p.list(w, rp) }
func (p *pulsePipe) ReplicaTerminating(w *world, rp *rep) { p.list(w, rp); delete(p.scraped, rp) }
func (p *pulsePipe) ReplicaRemoved(w *world, rp *rep) {
	delete(p.scraped, rp)
	w.at(w.now+catalogueDelay, func() { p.st.Remove(rp.uid, rp.uid) })
}

func (p *pulsePipe) ReplicaReady(w *world, rp *rep) {
	p.list(w, rp)
	p.scraped[rp] = true
	// Scrapes at its node's stable phase of the interval (the agent scrapes
	// a node's pods together; each replica is on a node of its own here),
	// from when the agent sees it Ready.
	iv := p.cfg.ScrapeInterval
	ph := phase(rp.uid, iv)
	first := (w.now+catalogueDelay)/iv*iv + ph
	for first < w.now+catalogueDelay {
		first += iv
	}
	var scrape func()
	scrape = func() {
		if !p.scraped[rp] {
			return
		}
		w.touch(rp)
		vals := rp.r.Values()
		for id := metric.ID(1); id < metric.NumIDs; id++ {
			if v, ok := vals.Get(id); ok {
				vals.V[id] = metric.Quantize(id, v)
			}
		}
		rep := store.Report{UID: rp.uid}
		rep.TimeMs = p.base.Add(w.now).UnixMilli()
		rep.Values, rep.Hist = vals, rp.r.Hist()
		w.at(w.now+sampleDelay, func() { p.st.Add([]store.Report{rep}) })
		if next := w.now + iv; next <= w.cfg.horizon {
			w.at(next, scrape)
		}
	}
	w.at(first, scrape)
}

func (p *pulsePipe) Metric(*world) (float64, error) {
	d, err := p.evaluate()
	return d.Value, err
}

func (p *pulsePipe) Active(*world) (bool, error) {
	d, err := p.evaluate()
	return d.Active, err
}

// evaluate is the scaler's answer, its plan kept for lastPlan (none after
// an error: the planner answered nothing then).
func (p *pulsePipe) evaluate() (scaler.Decision, error) {
	d, err := p.srv.Evaluate(p.cfg.trigger)
	p.last = d.Plan
	if err != nil {
		p.last = nil
	}
	return d, err
}

func (p *pulsePipe) lastPlan() (*pulseplanner.Plan, bool) {
	return p.last, p.cfg.trigger.Metric == scaler.MetricReplicas
}

// ---- Prometheus -----------------------------------------------------------

// promPipe is KEDA's prometheus trigger over a PodMonitor: Prometheus scrapes
// every pod every PrometheusInterval at its own phase (a pod not ready has
// no vLLM server listening yet: its scrape fails, it has no series); an
// instant query takes each series' latest sample within the 5-minute
// lookback, a removed pod's series going stale at once. KEDA queries at each
// HPA sync and at each poll (pollingInterval) for activation.
//
// The query follows the pulse trigger's semantics (sum for a total, the
// mean for valueType average, max × count for aggregation max), or, for
// prometheus-avg, is the Kaito proposal's avg(vllm:num_requests_waiting)
// under KEDA's default AverageValue, as the proposal writes it.
type promPipe struct {
	noHooks
	cfg     *Config
	avgForm bool
	gauge   metric.ID
	last    map[*rep]promSample
}

type promSample struct {
	at    time.Duration
	value float64
}

const promLookback = 5 * time.Minute

func newPrometheus(cfg *Config, avgForm bool) Pipeline {
	return &promPipe{cfg: cfg, avgForm: avgForm, last: map[*rep]promSample{}}
}

func (p *promPipe) Attach(*world) {
	p.gauge, _ = gaugeOf(p.cfg.trigger.Metric) // a gauge: newPipeline refuses any other
}

func (p *promPipe) ReplicaAdded(w *world, rp *rep) {
	iv := p.cfg.PrometheusInterval
	first := w.now/iv*iv + phase(rp.uid, iv)
	for first <= w.now {
		first += iv
	}
	var scrape func()
	scrape = func() {
		if !w.exists(rp) {
			return
		}
		if rp.state != starting {
			w.touch(rp)
			v := rp.r.Values()
			x, _ := v.Get(p.gauge)
			p.last[rp] = promSample{w.now, x}
		}
		if next := w.now + iv; next <= w.cfg.horizon {
			w.at(next, scrape)
		}
	}
	w.at(first, scrape)
}

func (p *promPipe) ReplicaRemoved(_ *world, rp *rep) { delete(p.last, rp) }

// query evaluates the instant query at now.
func (p *promPipe) query(w *world) float64 {
	var vals []float64
	for _, rp := range w.reps {
		if s, ok := p.last[rp]; ok && w.now-s.at <= promLookback {
			vals = append(vals, s.value)
		}
	}
	if len(vals) == 0 {
		return 0 // KEDA's prometheus scaler: an empty result is 0 (ignoreNullValues)
	}
	if p.avgForm {
		return mean(vals)
	}
	return aggregate(vals, p.cfg.trigger)
}

func (p *promPipe) Metric(w *world) (float64, error) { return p.query(w), nil }
func (p *promPipe) Active(w *world) (bool, error) {
	return p.query(w) > p.cfg.trigger.ActivationThreshold, nil
}

// ---- keda-kaito-scaler ----------------------------------------------------

// kaitoPipe is keda-kaito-scaler (v0.6): a background cache refreshed every
// 15 s by scraping the workload's Service; for an InferenceSet, each replica
// is a Workspace with its own Service (every ready replica is scraped), for
// any other target one Service spreads over the replicas, so one ready
// replica answers each scrape. Series of a page are summed; the workload's
// value is the sum over the Services scraped, a failed one counted as the
// threshold when the others average below it. A cached value older than
// 45 s is an error (Unavailable); IsActive is "some replica is ready"; no
// push.
type kaitoPipe struct {
	noHooks
	cfg   *Config
	gauge metric.ID
	value float64
	at    time.Duration
	err   error
	have  bool
	// rng picks the replica a Service's one scrape reaches: its own, so
	// that every pipeline's i-th replica starts as slowly (w.rng draws the
	// startup times).
	rng *rand.Rand
}

const (
	kaitoPoll       = 15 * time.Second
	kaitoStaleAfter = 45 * time.Second
)

func newKaito(cfg *Config) Pipeline { return &kaitoPipe{cfg: cfg} }

func (k *kaitoPipe) Attach(w *world) {
	k.gauge, _ = gaugeOf(k.cfg.trigger.Metric) // a gauge: newPipeline refuses any other
	k.at = -1
	k.rng = rand.New(rand.NewPCG(w.cfg.Seed, 0x6a17))
	// The scaler's poll phase relative to the traffic varies by seed.
	w.every(phase(fmt.Sprintf("keda-kaito-scaler-%d", w.cfg.Seed), kaitoPoll), kaitoPoll, func() { k.refresh(w) })
}

func (k *kaitoPipe) refresh(w *world) {
	thr := k.cfg.trigger.Threshold
	read := func(rp *rep) float64 {
		w.touch(rp)
		v := rp.r.Values()
		x, _ := v.Get(k.gauge)
		return x
	}
	var sum float64
	ok, failed := 0, 0
	// An InferenceSet's replicas are Workspaces, a Service each: every
	// ready replica is read. So is a Workspace's, which pulse-sim scales
	// past one as the HPA would an InferenceSet (a cluster's cannot pass
	// one, where its one Service is its one replica): read through one
	// Service spread over replicas that cannot exist, one replica's value
	// answered for the whole, keda-kaito-scaler was modelled in a regime
	// of its own making, and lost to pulse by it.
	if kind := k.cfg.ScaledObject.Spec.ScaleTargetRef.Kind; kind == "InferenceSet" || kind == "Workspace" {
		for _, rp := range w.reps {
			switch rp.state {
			case ready:
				sum += read(rp)
				ok++
			case starting:
				failed++ // its Service has no ready endpoint
			}
		}
	} else if len(w.ready) > 0 {
		sum, ok = read(w.ready[k.rng.IntN(len(w.ready))]), 1
	} else {
		failed = 1
	}
	if ok > 0 && sum/float64(ok) < thr {
		sum += thr * float64(failed)
	}
	k.value, k.at, k.have = sum, w.now, true
	k.err = nil
	if ok == 0 {
		k.err = errors.New("no Service of the workload answered")
	}
}

func (k *kaitoPipe) Metric(w *world) (float64, error) {
	if !k.have {
		k.refresh(w) // the first request seeds the cache with a scrape
	}
	if k.err != nil {
		return 0, k.err
	}
	if w.now-k.at > kaitoStaleAfter {
		return 0, errors.New("metrics are not available yet (scrape failing or cold)")
	}
	return k.value, nil
}

// Active is "some replica is ready", after the metric: KEDA's poll asks
// an external scaler GetMetrics, then IsActive, and fails with either
// (external_scaler.go's GetMetricsAndActivity). A poll while the cache
// answered an error was inactive, no error: it reset KEDA's fallback
// count and let a workload with replicas starting go to zero.
func (k *kaitoPipe) Active(w *world) (bool, error) {
	if _, err := k.Metric(w); err != nil {
		return false, err
	}
	return len(w.ready) > 0, nil
}

// ---- oracle ---------------------------------------------------------------

// oracle knows the true current value at every HPA sync: each ready
// replica's metric now, plus the requests held at the gateway for a queue
// metric, aggregated as the trigger says. It pushes activation the moment
// a request is held with no replica. The bound for any reactive signal.
type oracle struct{ noHooks }

func (*oracle) Attach(*world) {}
func (*oracle) Metric(w *world) (float64, error) {
	return trueValue(w), nil
}
func (*oracle) Active(w *world) (bool, error) {
	return trueValue(w) > w.cfg.trigger.ActivationThreshold, nil
}
func (*oracle) Demand(w *world) {
	if w.spec == 0 {
		w.Push()
	}
}

// trueValue is the trigger's value from the replicas' state now: gauges as
// they are, rates and ratios over the trigger's window as pulse derives them
// from exact samples (every 100 ms, no delay).
func trueValue(w *world) float64 {
	t := w.cfg.trigger
	if m := t.Def(); m.Rule == metric.RuleQuantile {
		return trueQuantile(w, m, t)
	}
	g, isGauge := gaugeOf(t.Metric)
	var vals []float64
	for _, rp := range w.ready {
		w.touch(rp)
		v := rp.r.Values()
		if isGauge {
			x, _ := v.Get(g)
			vals = append(vals, x)
		} else if x, ok := exactRate(w, rp, t); ok {
			vals = append(vals, x)
		}
	}
	if g == metric.Waiting && isGauge && len(w.gate) > 0 {
		if len(vals) == 0 {
			vals = append(vals, 0)
		}
		vals[0] += float64(len(w.gate))
	}
	if len(vals) == 0 {
		return 0
	}
	return aggregate(vals, t)
}

// aggregate is the trigger's value from per-pod values, as pulse's scaler
// combines them: the total (sum), or the mean with valueType average, and
// with aggregation max the largest (times the pods for a total).
func aggregate(vals []float64, t scaler.Trigger) float64 {
	most := slices.Max(vals)
	switch {
	case t.ValueType == "average" && t.Aggregation == "max":
		return most
	case t.ValueType == "average":
		return mean(vals)
	case t.Aggregation == "max":
		return most * float64(len(vals))
	}
	return sum(vals)
}

func sum(vals []float64) float64 {
	s := 0.0
	for _, v := range vals {
		s += v
	}
	return s
}

func mean(vals []float64) float64 { return sum(vals) / float64(len(vals)) }

// trueQuantile is a quantile metric's value as pulse's scaler derives it
// from exact samples: the workload's quantile over the buckets of the
// replicas with requests in the window, merged, standing for each of them.
func trueQuantile(w *world, m metric.Def, t scaler.Trigger) float64 {
	var mg metric.Merge
	n := 0
	for _, rp := range w.ready {
		w.touch(rp)
		if _, ok := m.EvalMerge(&mg, windowSeries(w, rp, t)); ok {
			n++
		}
	}
	q, ok := mg.Quantile(m.Q)
	if !ok {
		return 0
	}
	vals := make([]float64, n)
	for i := range vals {
		vals[i] = q
	}
	return aggregate(vals, t)
}

// exactRate is a rate or ratio metric over the trigger's window from the
// replica's counters now and at the window's start (kept by the world).
func exactRate(w *world, rp *rep, t scaler.Trigger) (float64, bool) {
	m := t.Def()
	if m.Rule == 0 {
		return 0, false // an extra gauge: not modelled
	}
	if m.Rule.Gauge() {
		cur := metric.Sample{TimeMs: w.now.Milliseconds(), Values: rp.r.Values()}
		return m.Eval([]metric.Sample{cur}) // saturation: the load now
	}
	return m.Eval(windowSeries(w, rp, t))
}

// windowSeries is a replica's exact sample at the start of the trigger's
// window (kept by the world) and now.
func windowSeries(w *world, rp *rep, t scaler.Trigger) []metric.Sample {
	cur := metric.Sample{TimeMs: w.now.Milliseconds(), Values: rp.r.Values(), Hist: rp.r.Hist()}
	hist := w.history(rp)
	from := w.now - t.Window
	series := []metric.Sample{}
	for _, s := range hist {
		if time.Duration(s.TimeMs)*time.Millisecond >= from {
			series = append(series, s)
			break
		}
	}
	return append(series, cur)
}
