package store

import (
	"math"
	"sort"
	"time"

	"github.com/pulse-io/pulse/pkg/signal"
)

// PodView is one pod as readers see it.
type PodView struct {
	UID   string
	Name  string
	Ready bool
	// Fresh: a successful sample arrived within the freshness bound.
	Fresh bool
	// Age since the last successful sample; negative when there was none.
	Age time.Duration
	// Missing is the reason of the last failed scrape, if the pod has not
	// reported successfully since.
	Missing string
	Error   string
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

// View derives the workloads, sorted by namespace, name and kind.
func (s *Store) View(o ViewOptions) []WorkloadView {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]WorkloadView, 0, len(s.workloads))
	for k, pods := range s.workloads {
		if o.Match != nil && !o.Match(k) {
			continue
		}
		w := WorkloadView{Key: k, Averages: map[string]float64{}}
		sums := map[string]float64{}
		counts := map[string]int{}
		for _, p := range pods {
			pv := p.view(now, o)
			w.Pods = append(w.Pods, pv)
			if !pv.Fresh {
				continue
			}
			for name, v := range pv.Values {
				sums[name] += v
				counts[name]++
			}
		}
		for name, sum := range sums {
			w.Averages[name] = sum / float64(counts[name])
		}
		sort.Slice(w.Pods, func(i, j int) bool { return w.Pods[i].Name < w.Pods[j].Name })
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Key, out[j].Key
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.Kind < b.Kind
	})
	return out
}

func (p *pod) view(now time.Time, o ViewOptions) PodView {
	pv := PodView{UID: p.UID, Name: p.Name, Ready: p.Ready, Age: -1, Missing: p.missing, Error: p.errText,
		Values: map[string]float64{}}
	if !p.lastSeen.IsZero() {
		pv.Age = now.Sub(p.lastSeen)
		pv.Fresh = pv.Age <= o.FreshFor && p.missing == ""
	}
	for _, m := range signal.Canonical {
		if v, ok := p.value(m, o.Window); ok {
			pv.Values[m.Name] = v
		}
	}
	for i, name := range p.extraNames {
		if v, ok := p.extra(i, o.Window); ok {
			pv.Values[name] = v
		}
	}
	return pv
}

// value derives m for the pod over window (0: latest).
func (p *pod) value(m signal.Metric, window time.Duration) (float64, bool) {
	if window <= 0 {
		return m.Latest(p.series)
	}
	return m.Eval(p.window(window, m.Rule))
}

// extra is the latest value, or the window's mean, of the i-th extra gauge.
func (p *pod) extra(i int, window time.Duration) (float64, bool) {
	n := len(p.series)
	from := 0
	if window > 0 && n > 0 {
		from = n - len(p.window(window, signal.RuleGauge))
	} else {
		from = n - 1
	}
	var sum float64
	cnt := 0
	for j := max(from, 0); j < n && j < len(p.extras); j++ {
		if i < len(p.extras[j]) && !math.IsNaN(p.extras[j][i]) {
			sum += p.extras[j][i]
			cnt++
		}
	}
	if cnt == 0 {
		return 0, false
	}
	return sum / float64(cnt), true
}

// PodValue is one pod's value of one metric, for a scaler.
type PodValue struct {
	// Reporting: ready, and a successful sample within the freshness bound.
	Reporting bool
	// Defined: the pod's value is known (it is reporting and the metric
	// is defined over the window).
	Defined bool
	Value   float64
}

// Query appends to dst one metric over window for every pod of workload k.
// The metric is a canonical name or an extra gauge's raw name. found is false
// when the store knows no pod of k.
func (s *Store) Query(dst []PodValue, k Key, metric string, window, freshFor time.Duration) (pods []PodValue, found bool) {
	canon, isCanon := signal.Lookup(metric)
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	members := s.workloads[k]
	if len(members) == 0 {
		return dst, false
	}
	pods = dst
	for _, p := range members {
		var pv PodValue
		pv.Reporting = p.Ready && p.missing == "" && !p.lastSeen.IsZero() && now.Sub(p.lastSeen) <= freshFor
		if pv.Reporting {
			if isCanon {
				pv.Value, pv.Defined = p.value(canon, window)
			} else if i := indexOf(p.extraNames, metric); i >= 0 {
				pv.Value, pv.Defined = p.extra(i, window)
			}
		}
		pods = append(pods, pv)
	}
	return pods, true
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}
