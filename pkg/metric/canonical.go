package metric

import "sort"

// Rule says how a canonical metric is derived from raw values.
type Rule uint8

const (
	// RuleGauge: the gauge's value; over a window, the mean of its samples.
	RuleGauge Rule = iota + 1
	// RuleRate: a counter's increase per second.
	RuleRate
	// RuleRatio: increase of one counter over increase of another
	// (a hit rate, or a histogram's Δsum/Δcount: the interval mean).
	RuleRatio
	// RuleLoad: a replica's load fraction from its gauges against targets
	// (Def.Load): the largest of KV-cache usage, waiting and running over
	// their targets; over a window, the mean of its samples' loads.
	RuleLoad
	// RuleQuantile: a latency quantile (Def.Q) of a histogram (Def.Hist)
	// over the window's increase of its buckets, interpolated within a
	// bucket as Prometheus' histogram_quantile does; a workload's is taken
	// over its pods' buckets merged (Merge), not from their quantiles.
	RuleQuantile
)

// Gauge reports whether the rule reads instants (a gauge, or a load made
// of gauges), not increases of counters.
func (r Rule) Gauge() bool { return r == RuleGauge || r == RuleLoad }

// LoadTargets are the gauge values at which a replica is fully loaded
// (load 1). A target of 0 leaves its gauge out.
type LoadTargets struct {
	KVCache float64 // KV-cache usage, 0..1
	Waiting float64 // requests queued
	Running float64 // requests in the batch
}

// DefaultLoad are the targets of saturation, from llm-d's
// workload-variant-autoscaler (its capacity-scaling defaults): a replica is
// saturated at KV-cache usage 0.8 or 5 waiting, and capacity is added when
// the spare falls below 0.1 of the KV cache or 3 requests of queue; so a
// replica is full (load 1) at 0.8 − 0.1 = 0.7 and 5 − 3 = 2 waiting. The
// batch size is not used unless a running target is set.
var DefaultLoad = LoadTargets{KVCache: 0.7, Waiting: 2}

// load is a sample's load fraction; ok is false when none of the gauges
// with a target is present.
func (l LoadTargets) load(v *Values) (float64, bool) {
	most, ok := 0.0, false
	for _, c := range [...]struct {
		id     ID
		target float64
	}{{KVCacheUsage, l.KVCache}, {Waiting, l.Waiting}, {Running, l.Running}} {
		if c.target <= 0 {
			continue
		}
		if x, has := v.Get(c.id); has {
			most, ok = max(most, x/c.target), true
		}
	}
	return most, ok
}

// Def is a canonical metric: the names users write in trigger metadata and
// see in the debug endpoint.
type Def struct {
	Name string
	Rule Rule
	Num  ID // the gauge, the counter, or the ratio's numerator
	Den  ID // the ratio's denominator
	// Load are RuleLoad's targets.
	Load LoadTargets
	// Hist and Q are RuleQuantile's histogram and quantile.
	Hist Hist
	Q    float64
}

// IDs is the set of raw values m derives from, as a Values.Present mask
// (histograms aside): a reader that decodes only these derives m exactly.
func (m Def) IDs() uint64 {
	mask := uint64(1)<<m.Num | uint64(1)<<m.Den
	if m.Rule == RuleLoad {
		mask |= 1<<KVCacheUsage | 1<<Waiting | 1<<Running
	}
	return mask &^ 1 // id 0 is no value
}

// Extra is the Def of a gauge the agents forward by its raw name
// (--extra-metric): it has no Rule.
func Extra(name string) Def { return Def{Name: name} }

// WithLoad returns m with other load targets.
func (m Def) WithLoad(l LoadTargets) Def {
	m.Load = l
	return m
}

// Canonical lists every canonical metric, in documentation order.
var Canonical = []Def{
	{Name: "waiting", Rule: RuleGauge, Num: Waiting},
	{Name: "running", Rule: RuleGauge, Num: Running},
	{Name: "swapped", Rule: RuleGauge, Num: Swapped},
	{Name: "kvCacheUsage", Rule: RuleGauge, Num: KVCacheUsage},
	{Name: "prefixCacheHitRate", Rule: RuleRatio, Num: PrefixHits, Den: PrefixQueries},
	{Name: "promptTokensPerSecond", Rule: RuleRate, Num: PromptTokens},
	{Name: "generationTokensPerSecond", Rule: RuleRate, Num: GenerationTokens},
	{Name: "requestsPerSecond", Rule: RuleRate, Num: RequestSuccess},
	{Name: "preemptionsPerSecond", Rule: RuleRate, Num: Preemptions},
	{Name: "ttftSeconds", Rule: RuleRatio, Num: TTFTSum, Den: TTFTCount},
	{Name: "queueTimeSeconds", Rule: RuleRatio, Num: QueueTimeSum, Den: QueueTimeCount},
	{Name: "e2eLatencySeconds", Rule: RuleRatio, Num: E2ELatencySum, Den: E2ELatencyCount},
	{Name: "itlSeconds", Rule: RuleRatio, Num: ITLSum, Den: ITLCount},
	{Name: "gpuUtilization", Rule: RuleGauge, Num: GPUUtilization},
	{Name: "gpuMemoryUsage", Rule: RuleGauge, Num: GPUMemoryUsage},
	{Name: "saturation", Rule: RuleLoad, Load: DefaultLoad},
	{Name: "ttftP50Seconds", Rule: RuleQuantile, Hist: TTFTHist, Q: 0.5},
	{Name: "ttftP90Seconds", Rule: RuleQuantile, Hist: TTFTHist, Q: 0.9},
	{Name: "ttftP99Seconds", Rule: RuleQuantile, Hist: TTFTHist, Q: 0.99},
	{Name: "itlP50Seconds", Rule: RuleQuantile, Hist: ITLHist, Q: 0.5},
	{Name: "itlP90Seconds", Rule: RuleQuantile, Hist: ITLHist, Q: 0.9},
	{Name: "itlP99Seconds", Rule: RuleQuantile, Hist: ITLHist, Q: 0.99},
}

var byName = func() map[string]Def {
	m := make(map[string]Def, len(Canonical))
	for _, c := range Canonical {
		m[c.Name] = c
	}
	return m
}()

// Lookup finds a canonical metric by name.
func Lookup(name string) (Def, bool) {
	m, ok := byName[name]
	return m, ok
}

// Names returns the canonical names, sorted.
func Names() []string {
	out := make([]string, 0, len(Canonical))
	for _, c := range Canonical {
		out = append(out, c.Name)
	}
	sort.Strings(out)
	return out
}

// Sample is a pod's raw values at a time (Unix milliseconds), and its
// histograms when its agent forwards them (nil otherwise). In a series
// handed to Eval, counters must be monotonic (see Monotonic).
type Sample struct {
	TimeMs int64
	Values
	Hist *Histograms
}

// Eval derives m over a time-ordered series of samples: the mean of a gauge's
// samples, or a rate or ratio between the first and the last sample that
// carry the counters. ok is false when the series cannot give a value (the
// metric is absent, a rate has fewer than two samples, a ratio's denominator
// did not grow): an undefined value is never reported as 0.
func (m Def) Eval(series []Sample) (v float64, ok bool) {
	switch m.Rule {
	case RuleGauge, RuleLoad:
		var sum float64
		n := 0
		for i := range series {
			if x, has := m.instant(&series[i].Values); has {
				sum += x
				n++
			}
		}
		if n == 0 {
			return 0, false
		}
		return sum / float64(n), true
	case RuleQuantile:
		bounds, delta, ok := histDelta(m.Hist, series)
		if !ok {
			return 0, false
		}
		return HistogramQuantile(m.Q, bounds, delta)
	case RuleRate, RuleRatio:
		first, last := -1, -1
		for i := range series {
			if m.carries(&series[i]) {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first < 0 || first == last {
			return 0, false
		}
		return m.between(&series[first], &series[last])
	}
	return 0, false
}

// carries says whether s has the counters a rate or ratio reads.
func (m Def) carries(s *Sample) bool {
	return s.Has(m.Num) && (m.Rule == RuleRate || s.Has(m.Den))
}

// between is a rate or ratio from a to b, samples that carry its counters.
func (m Def) between(a, b *Sample) (float64, bool) {
	if m.Rule == RuleRate {
		dt := float64(b.TimeMs-a.TimeMs) / 1000
		if dt <= 0 {
			return 0, false
		}
		return (b.V[m.Num] - a.V[m.Num]) / dt, true
	}
	den := b.V[m.Den] - a.V[m.Den]
	if den <= 0 {
		return 0, false
	}
	return (b.V[m.Num] - a.V[m.Num]) / den, true
}

// instant is a gauge rule's value in one sample.
func (m Def) instant(v *Values) (float64, bool) {
	if m.Rule == RuleLoad {
		return m.Load.load(v)
	}
	return v.Get(m.Num)
}

// Latest derives m from the end of a series: a gauge's last value, or a
// rate or ratio over the last interval in which it is defined.
func (m Def) Latest(series []Sample) (float64, bool) {
	if m.Rule.Gauge() {
		for i := len(series) - 1; i >= 0; i-- {
			if v, ok := m.instant(&series[i].Values); ok {
				return v, true
			}
		}
		return 0, false
	}
	if m.Rule == RuleQuantile {
		return m.latestQuantile(series)
	}
	// The shortest tail whose first and last samples give a value: with a
	// ratio, an interval in which no request finished is skipped. One pass
	// back from the last sample that carries the counters (Eval of every
	// tail was quadratic: 23 ms over an idle pod's 3,600 samples).
	last := len(series) - 1
	for last >= 0 && !m.carries(&series[last]) {
		last--
	}
	for start := last - 1; start >= 0; start-- {
		if !m.carries(&series[start]) {
			continue
		}
		if v, ok := m.between(&series[start], &series[last]); ok {
			return v, true
		}
	}
	return 0, false
}

// Monotonic turns a pod's counters into monotonic series across resets: when
// a counter goes down (the server restarted), the value before the reset is
// added to every later value, as Prometheus' rate() does.
type Monotonic struct {
	// last: each counter's last raw value, by ID.CounterIndex (a store
	// holds one a pod: counters only); bit i of seen is set once counter i
	// has one.
	last [NumCounters]float64
	seen uint16
	// rebase: bit i set until counter i's next value (Rebase); a counter
	// absent from the next sample keeps its bit for the one after.
	rebase uint16
	// more is allocated at the first reset or the first histogram: most
	// pods never need it, and a store holds thousands (one pointer in the
	// pod: two took 8 bytes more a pod).
	more *monoMore
}

// monoMore is the part of a Monotonic that few pods need. The offsets
// are apart, allocated at the first reset: in one allocation with the
// histograms' state, a pod with histograms held 128 bytes more for
// offsets it never needed.
type monoMore struct {
	// offset: each counter's sum of resets, by ID.CounterIndex, added to
	// its raw value from the first reset (nil until then).
	offset *[NumCounters]float64
	hist   [NumHists]histMono
}

// extra is m.more, allocated.
func (m *Monotonic) extra() *monoMore {
	if m.more == nil {
		m.more = new(monoMore)
	}
	return m.more
}

// Rebase says that the next values do not continue the earlier ones (they
// come from another agent process, whose own reset handling started anew):
// the next value continues the series with no increase, so the increase
// over that one interval is lost rather than mistaken for a reset.
func (m *Monotonic) Rebase() {
	m.rebase = 1<<NumCounters - 1
	if m.more != nil {
		for h := range m.more.hist {
			m.more.hist[h].rebase = true
		}
	}
}

// AdjustSample rewrites the counters and histogram buckets of s in place
// (the buckets get slices of their own).
func (m *Monotonic) AdjustSample(s *Sample) {
	m.Adjust(&s.Values)
	if s.Hist == nil {
		return
	}
	more := m.extra()
	for h := range s.Hist {
		if s.Hist[h].Present() {
			more.hist[h].adjust(&s.Hist[h])
		}
	}
}

// Adjust rewrites the counters of v in place.
func (m *Monotonic) Adjust(v *Values) {
	for id := ID(1); id < NumIDs; id++ {
		c := id.CounterIndex()
		if c < 0 || !v.Has(id) {
			continue
		}
		rebase := m.rebase&(1<<c) != 0
		m.rebase &^= 1 << c
		raw := v.V[id]
		last, ok := m.last[c], m.seen&(1<<c) != 0
		var step float64
		switch {
		case ok && rebase:
			step = last - raw
		case ok && raw < last:
			step = last
		}
		if step != 0 && (m.more == nil || m.more.offset == nil) {
			m.extra().offset = new([NumCounters]float64)
		}
		m.last[c], m.seen = raw, m.seen|1<<c
		if more := m.more; more != nil && more.offset != nil {
			more.offset[c] += step
			v.V[id] = raw + more.offset[c]
		}
	}
}
