package store

import (
	"cmp"
	"iter"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// PodView is one pod as readers see it.
type PodView struct {
	UID         string
	Name        string
	Ready       bool
	Terminating bool
	// Demand: a router's entry for the workload (Values has
	// pendingRequests or arrivedRequests), not a replica.
	Demand bool
	// Fresh: a successful sample arrived within the freshness bound.
	Fresh bool
	// Age since the last successful sample; negative when there was none.
	Age time.Duration
	// Missing is the reason of the last failed scrape, if the pod has not
	// reported successfully since.
	Missing string
	Error   string
	// Rejected names the values refused from the pod's last sample (bad
	// input, left out: the values shown for them are older); empty when none
	// was.
	Rejected string
	// Values holds every canonical metric (and extra gauge) the pod defines.
	Values map[string]float64
}

// WorkloadView is one workload and its pods.
type WorkloadView struct {
	Key
	Pods []PodView
	// Averages: per metric, the mean over the fresh pods that define it.
	Averages map[string]float64
}

// ViewOptions select what a view derives.
type ViewOptions struct {
	// Window: 0 gives each pod's latest values (gauges as last read, rates
	// over the last interval); otherwise gauges are averaged and rates taken
	// over the window.
	Window time.Duration
	// FreshFor is how recent a pod's last successful sample must be.
	FreshFor time.Duration
	// Match, when set, picks the workloads to view.
	Match func(Key) bool
}

// View derives the workloads, sorted by namespace, name and kind: Views,
// collected.
func (s *Store) View(o ViewOptions) []WorkloadView {
	return slices.Collect(s.Views(o))
}

// Views derives the workloads one at a time as they are read, sorted by
// namespace, name and kind, each as it is when it is read (a workload gone
// by then is left out). It holds the store's lock for one workload at a
// time, not for the whole view: a view of thousands of workloads (a debug
// page) decodes every series it shows, and the ingest's writers, and the
// scaler's readers queued behind them, wait only for one workload's. A
// reader that writes each workload out as it comes (the debug page) holds
// one, not the store's every pod.
func (s *Store) Views(o ViewOptions) iter.Seq[WorkloadView] {
	return func(yield func(WorkloadView) bool) {
		s.mu.RLock()
		keys := make([]Key, 0, len(s.workloads))
		for k := range s.workloads {
			keys = append(keys, k)
		}
		s.mu.RUnlock()
		if o.Match != nil {
			keys = slices.DeleteFunc(keys, func(k Key) bool { return !o.Match(k) })
		}
		slices.SortFunc(keys, func(a, b Key) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Kind, b.Kind))
		})
		sc := getScratch()
		defer putScratch(sc)
		for _, k := range keys {
			if w, ok := s.viewWorkload(sc, k, s.now(), o); ok && !yield(w) {
				return
			}
		}
	}
}

// viewWorkload derives k's view under the store's read lock; false when k
// has no pod (gone since the keys were listed, or every pod expired).
func (s *Store) viewWorkload(sc *scratch, k Key, now time.Time, o ViewOptions) (WorkloadView, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	// What sc decoded was read under an earlier hold of the lock: a pod of
	// two workloads has been written since, and is decoded again.
	sc.of = nil
	w := WorkloadView{Key: k, Averages: map[string]float64{}}
	sums := map[string]float64{}
	counts := map[string]int{}
	at := s.stamp(now)
	for _, p := range s.workloads[k] {
		if s.expired(p, now) {
			continue
		}
		pv := p.view(sc, at, o)
		w.Pods = append(w.Pods, pv)
		if !pv.Fresh || pv.Demand {
			continue // a router's values are no replica's
		}
		for name, v := range pv.Values {
			sums[name] += v
			counts[name]++
		}
	}
	for name, sum := range sums {
		w.Averages[name] = sum / float64(counts[name])
	}
	if len(w.Pods) == 0 {
		return w, false
	}
	sort.Slice(w.Pods, func(i, j int) bool { return w.Pods[i].Name < w.Pods[j].Name })
	return w, true
}

func (p *pod) view(sc *scratch, at int64, o ViewOptions) PodView {
	pv := PodView{UID: p.UID, Name: p.Name, Ready: p.Ready, Terminating: p.Terminating, Demand: p.Demand, Age: -1, Missing: p.get().missing, Error: p.get().errText,
		Rejected: p.get().rejected, Values: map[string]float64{}}
	if p.seen != 0 {
		// A sample taken after the view's now (a workload is read apart
		// from the others, writers running between) is no sample's
		// negative Age.
		pv.Age = max(0, p.age(at))
		pv.Fresh = pv.Age <= o.FreshFor && p.get().missing == ""
	}
	if p.Demand {
		// A router's row: its age and freshness as a pod's (they were
		// left unset, and every router read stale, never reported).
		for _, id := range []metric.ID{metric.PendingRequests, metric.ArrivedRequests} {
			if v, ok := (metric.Def{Rule: metric.RuleGauge, Num: id}).Latest(sc.samples(p, 1<<id)); ok {
				pv.Values[id.Name()] = v
			}
		}
		return pv
	}
	for _, m := range metric.Canonical {
		if v, ok := p.value(sc, m, o.Window); ok {
			pv.Values[m.Name] = v
		}
	}
	for i, name := range p.get().extraNames {
		if _, builtin := metric.Lookup(name); builtin {
			// An extra gauge named as a metric of pulse's own (an agent
			// without the check its --extra-metric now has) replaced
			// that metric's value in the pod's row and its workload's
			// average; triggers read pulse's own, so it is shown
			// nowhere.
			continue
		}
		if v, ok := p.extra(sc, i, o.Window); ok {
			pv.Values[name] = v
		}
	}
	return pv
}

// value derives m for the pod over window (0: latest).
func (p *pod) value(sc *scratch, m metric.Def, window time.Duration) (float64, bool) {
	if window <= 0 {
		return m.Latest(sc.samples(p, ids(m)))
	}
	return m.Eval(p.window(sc, window, m.Rule, ids(m)))
}

// extra is the latest value, or the window's mean, of the i-th extra gauge.
func (p *pod) extra(sc *scratch, i int, window time.Duration) (float64, bool) {
	n := p.series.len()
	from := 0
	if window > 0 && n > 0 {
		from = n - len(p.window(sc, window, metric.RuleGauge, 0))
	} else {
		from = n - 1
	}
	var sum float64
	cnt := 0
	extras := p.get().extras
	for j := max(from, 0); j < n && j < len(extras); j++ {
		if i < len(extras[j]) && !math.IsNaN(extras[j][i]) {
			sum += extras[j][i]
			cnt++
		}
	}
	if cnt == 0 {
		return 0, false
	}
	return sum / float64(cnt), true
}

// PodState is how a scaler may use a pod's value.
type PodState uint8

const (
	// PodCounted: ready, reporting, and its value is defined.
	PodCounted PodState = iota + 1
	// PodStarting: not ready (loading its model); it has no demand of its own.
	PodStarting
	// PodTerminating: being deleted; left out of the value. The HPA still
	// counts one whose Ready condition holds among the ready pods it
	// multiplies a metricType Value by (PodValue.Ready).
	PodTerminating
	// PodMissing: ready, but no successful sample within the freshness
	// bound (the scrape fails, the agent is gone, or none arrived yet).
	PodMissing
	// PodUndefined: reporting, but the metric has no value over the window
	// (absent from its page, or a ratio with no request finished).
	PodUndefined
)

var podStateNames = [...]string{PodCounted: "counted", PodStarting: "starting", PodTerminating: "terminating",
	PodMissing: "missing", PodUndefined: "undefined"}

func (s PodState) String() string {
	if int(s) < len(podStateNames) && podStateNames[s] != "" {
		return podStateNames[s]
	}
	return "unknown"
}

// PodValue is one pod's value of one metric, for a scaler.
type PodValue struct {
	Name  string
	State PodState
	// Value is defined when State is PodCounted.
	Value float64
	// Reason says why a PodMissing pod has no value (a scrape failure
	// (timeout, connect, ...), "stale", or "no sample yet".
	Reason string
	// Idle (PodUndefined): no request is waiting or running on the pod, so
	// an undefined rate or ratio means no load, not an unknown one.
	Idle bool
	// Truncated (PodCounted, PodUndefined): the window reaches back past
	// the samples kept (MaxSamples), so the value covers only SpanMs of it.
	Truncated bool
	SpanMs    int64
	// Samples is the number of samples held for the pod.
	Samples int
	// Ready (PodTerminating): its Ready condition still holds (draining in
	// its grace period).
	Ready bool
}

// Query appends to dst one metric over window for every pod of workload k:
// a canonical metric (with its parameters, such as saturation's targets),
// or an extra gauge (metric.Extra: its raw name). found is false when the
// store knows no pod of k.
func (s *Store) Query(dst []PodValue, k Key, m metric.Def, window, freshFor time.Duration) (pods []PodValue, found bool) {
	return s.query(dst, k, m.Name, m, m.Rule != 0, window, freshFor, nil)
}

// QueryQuantile is Query for a quantile metric (metric.RuleQuantile): each
// pod's value is its own quantile, and merged is the workload's: over the
// buckets of the counted pods, merged (metric.Merge).
func (s *Store) QueryQuantile(dst []PodValue, k Key, m metric.Def, window, freshFor time.Duration) (pods []PodValue, merged float64, mergedOK, found bool) {
	var mg metric.Merge
	pods, found = s.query(dst, k, m.Name, m, true, window, freshFor, &mg)
	merged, mergedOK = mg.Quantile(m.Q)
	return pods, merged, mergedOK, found
}

// NoHistograms is the Reason of a PodUndefined pod whose agent forwards no
// histogram a quantile metric needs.
const NoHistograms = "no histograms"

func (s *Store) query(dst []PodValue, k Key, name string, canon metric.Def, isCanon bool, window, freshFor time.Duration, mg *metric.Merge) (pods []PodValue, found bool) {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	sc := getScratch()
	defer putScratch(sc)
	return s.queryLocked(sc, dst, k, name, canon, isCanon, window, freshFor, mg, now)
}

// Reading is one trigger's read of a workload, taken under one lock: its
// replicas' values of one metric, the merged quantile of a quantile metric,
// the demand its routers hold, and whether it lost replicas.
type Reading struct {
	Pods  []PodValue
	Found bool
	// Merged and MergedOK: a quantile metric's workload quantile (as
	// QueryQuantile).
	Merged   float64
	MergedOK bool
	// MergedBeyond: Merged is the highest finite bound the pods'
	// histograms share, and the quantile lies past it (how far, they
	// cannot say).
	MergedBeyond bool
	// Demand: the demand sources' (as Demand), when asked for.
	Demand DemandValue
	// Lost and LostOK: as LostReplicas, when no replica is found.
	Lost   Lost
	LostOK bool
	// RefusedAt: as Snapshot's.
	RefusedAt time.Time
}

// Read reads metric m of workload k over window for a trigger, in one
// pass under one lock (Query or QueryQuantile, Demand when demand is set,
// and LostReplicas when no replica is listed); pods are appended to dst.
func (s *Store) Read(dst []PodValue, k Key, m metric.Def, window, freshFor time.Duration, demand bool) Reading {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var r Reading
	var mg *metric.Merge
	if m.Rule == metric.RuleQuantile {
		mg = new(metric.Merge)
	}
	sc := getScratch()
	defer putScratch(sc)
	r.Pods, r.Found = s.queryLocked(sc, dst, k, m.Name, m, m.Rule != 0, window, freshFor, mg, now)
	if mg != nil {
		r.Merged, r.MergedBeyond, r.MergedOK = mg.QuantileBeyond(m.Q)
	}
	if demand {
		r.Demand = s.demand(sc, k, window, freshFor, now)
	}
	if !r.Found {
		r.Lost, r.LostOK = s.lostReplicas(k, now)
	}
	r.RefusedAt = s.refusedRecently(k, now)
	return r
}

// queryLocked is query with mu held.
func (s *Store) queryLocked(sc *scratch, dst []PodValue, k Key, name string, canon metric.Def, isCanon bool, window, freshFor time.Duration, mg *metric.Merge, now time.Time) (pods []PodValue, found bool) {
	pods = dst
	var expired []*pod
	at := s.stamp(now)
	for _, p := range s.workloads[k] {
		if p.Demand {
			continue // a router's entry is no replica
		}
		if s.expired(p, now) {
			expired = s.expiredLost(expired, p) // an expired agent's pod Sweep will drop
			continue
		}
		pv := PodValue{Name: p.Name, Samples: p.series.len()}
		switch {
		case p.Terminating:
			pv.State, pv.Ready = PodTerminating, p.Ready
		case !p.Ready:
			pv.State = PodStarting
		case p.get().missing != "":
			pv.State, pv.Reason = PodMissing, p.get().missing
		case p.seen == 0:
			pv.State, pv.Reason = PodMissing, "no sample yet"
		case p.age(at) > freshFor:
			pv.State, pv.Reason = PodMissing, "stale"
		default:
			defined := false
			switch {
			case mg != nil:
				pv.Value, defined = canon.EvalMerge(mg, p.window(sc, window, canon.Rule, histBit))
			case isCanon:
				pv.Value, defined = p.value(sc, canon, window)
			default:
				if i := indexOf(p.get().extraNames, name); i >= 0 {
					pv.Value, defined = p.extra(sc, i, window)
				}
			}
			pv.State = PodUndefined
			// Marked whether defined or not: a window whose values were
			// all in the part MaxSamples cut is no idle pod's.
			p.checkSpan(sc, &pv, window, canon.Rule.Gauge() || !isCanon && mg == nil)
			switch {
			case defined:
				pv.State = PodCounted
			case canon.Rule == metric.RuleQuantile && !canon.HasHist(sc.samples(p, histBit)):
				pv.Reason = NoHistograms
			case isCanon && !canon.Rule.Gauge() && !pv.Truncated:
				pv.Idle = p.idle(sc)
			}
		}
		pods = append(pods, pv)
	}
	if len(pods) == len(dst) {
		return pods, false
	}
	// Some replica is listed: those its agents lost that the API still
	// has are replicas too (stillThere).
	for _, u := range s.stillThere(k, expired, now) {
		pods = append(pods, u.value())
	}
	return pods, true
}

// DemandValue is what the demand sources of a workload report.
type DemandValue struct {
	// Sources is the number of demand entries with a fresh sample.
	Sources int
	// Held: requests the routers hold now (their latest samples).
	Held float64
	// Arrived: requests that arrived at the routers over the window.
	Arrived float64
	// Stale is the number of demand entries with no fresh sample; Silent,
	// of those, the entries of routers ready and not terminating (which
	// their agents scrape: not one starting or stopping, whose agent
	// lists it unscraped).
	Stale, Silent int
}

// Unheard reports whether what the routers hold is unknown: those that
// report hold and saw nothing while some ready ones have not reported
// (their agent lost). A 0 then is no answer: it would keep a workload at
// zero while a router on a lost node held its requests. A router starting
// or stopping (listed, not scraped) holds none, and is not counted. A sum
// that is not above 0 is nothing heard (NaN too; the store keeps counters
// monotonic, so arrivals are never negative).
func (d DemandValue) Unheard() bool { return d.Silent > 0 && !(d.Held+d.Arrived > 0) }

// Demand reads the demand sources of workload k: held requests from each
// fresh entry's latest sample, arrivals over window.
func (s *Store) Demand(k Key, window, freshFor time.Duration) DemandValue {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	sc := getScratch()
	defer putScratch(sc)
	return s.demand(sc, k, window, freshFor, now)
}

// demand is Demand with mu held.
func (s *Store) demand(sc *scratch, k Key, window, freshFor time.Duration, now time.Time) DemandValue {
	var d DemandValue
	held := metric.Def{Rule: metric.RuleGauge, Num: metric.PendingRequests}
	at := s.stamp(now)
	for _, p := range s.workloads[k] {
		if !p.Demand || s.expired(p, now) {
			continue
		}
		if p.seen == 0 || p.get().missing != "" || p.age(at) > freshFor {
			d.Stale++
			if p.Ready && !p.Terminating {
				d.Silent++
			}
			continue
		}
		d.Sources++
		if v, ok := held.Latest(sc.samples(p, 1<<metric.PendingRequests)); ok {
			d.Held += v
		}
		if w := p.window(sc, window, metric.RuleRate, 1<<metric.ArrivedRequests); len(w) > 1 {
			a, okA := w[0].Get(metric.ArrivedRequests)
			b, okB := w[len(w)-1].Get(metric.ArrivedRequests)
			if okA && okB {
				// Over a gap longer than the window (a router's scrape
				// failing, its agent's stream cut) the increase is the
				// gap's: the window's share of it, at the gap's mean rate.
				// Every request of a 5-minute gap was counted as arrived in
				// a 30 s window.
				inc := b - a
				if span := w[len(w)-1].TimeMs - w[0].TimeMs; window > 0 && span > window.Milliseconds() {
					inc *= float64(window.Milliseconds()) / float64(span)
				}
				d.Arrived += inc
			}
		}
	}
	return d
}

// checkSpan marks pv truncated when samples its window needs were dropped
// by the MaxSamples bound: one within the window, or,
// for a rule over increases (gauge false), the one at or before its start
// (until 2026-11-30 a rate that lost only that sample was answered over a
// shorter span, unmarked).
func (p *pod) checkSpan(sc *scratch, pv *PodValue, window time.Duration, gauge bool) {
	pv.SpanMs, pv.Truncated = p.cut(sc, window, gauge)
}

// cut reports whether samples p's window needs were dropped by the
// MaxSamples bound (checkSpan), and what the samples kept span.
func (p *pod) cut(sc *scratch, window time.Duration, gauge bool) (spanMs int64, cut bool) {
	capCutMs := p.get().capCutMs
	if window <= 0 || capCutMs == 0 || p.series.len() == 0 {
		return 0, false
	}
	from := p.series.lastMs() - window.Milliseconds()
	first := sc.samples(p, 0)[0].TimeMs
	if capCutMs > from || !gauge && first > from {
		return p.series.lastMs() - first, true
	}
	return 0, false
}

// idle reports whether the pod's latest sample shows no request waiting or
// running: one of the two gauges present, each present at 0 (an absent
// one reads 0).
func (p *pod) idle(sc *scratch) bool {
	if p.series.len() == 0 {
		return false
	}
	all := sc.samples(p, 1<<metric.Waiting|1<<metric.Running)
	v := &all[len(all)-1].Values
	w, okW := v.Get(metric.Waiting)
	r, okR := v.Get(metric.Running)
	return (okW || okR) && w == 0 && r == 0
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}
