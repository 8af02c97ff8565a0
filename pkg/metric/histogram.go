package metric

import (
	"math"
	"slices"
	"sort"
)

// Hist names a latency histogram an agent may forward (agent flag
// --forward-histograms); it equals the wire's pulsev1.Histogram minus one.
type Hist uint8

// The histograms.
const (
	// TTFTHist: time to first token, in seconds.
	TTFTHist Hist = iota
	// ITLHist: inter-token latency (vLLM's time per output token), in seconds.
	ITLHist
	// NumHists bounds the histograms.
	NumHists
)

var histNames = [NumHists]string{TTFTHist: "ttft", ITLHist: "itl"}

// Name is the histogram's name in logs and debug output.
func (h Hist) Name() string {
	if h >= NumHists {
		return "unknown"
	}
	return histNames[h]
}

// MaxBuckets caps the buckets of one histogram (vLLM has 23 for TTFT): a
// page or a batch with more is refused.
const MaxBuckets = 64

// Buckets is a cumulative histogram as Prometheus exposes it: Counts[i]
// observations were at most Bounds[i]. Bounds ascend and the last is +Inf.
// A zero Buckets is absent.
type Buckets struct {
	Bounds []float64
	Counts []float64
}

// Present reports whether the histogram was read.
func (b *Buckets) Present() bool { return len(b.Bounds) > 0 }

// Total is the number of observations (the +Inf bucket).
func (b *Buckets) Total() float64 {
	if len(b.Counts) == 0 {
		return 0
	}
	return b.Counts[len(b.Counts)-1]
}

// Histograms are one pod's histograms at one instant. The slices of a
// sample handed to a store are not modified afterwards: samples of a pod may
// share bounds.
type Histograms [NumHists]Buckets

// Complete returns cur with each histogram it lacks taken from prev: cur
// itself, filled in (prev when cur is nil). An agent sends a histogram
// only when it changed, so a sample's absent ones are its last ones.
func Complete(cur, prev *Histograms) *Histograms {
	if cur == nil {
		return prev
	}
	if prev == nil {
		return cur
	}
	for h := range cur {
		if !cur[h].Present() {
			cur[h] = prev[h]
		}
	}
	return cur
}

// Any reports whether any histogram is present.
func (h *Histograms) Any() bool {
	if h == nil {
		return false
	}
	for i := range h {
		if h[i].Present() {
			return true
		}
	}
	return false
}

// HistogramQuantile is Prometheus' histogram_quantile over cumulative
// buckets (promql/quantile.go, bucketQuantile): the bucket holding the rank
// q·total is found, and the value is interpolated linearly within it, from
// the bucket's lower bound (0 for the first bucket when its bound is
// positive) to its upper bound. A rank in the +Inf bucket answers the
// highest finite bound. ok is false with no observations, fewer than two
// buckets, no +Inf bucket, or a bound before it that is not finite. Counts that decrease (float noise of a merge)
// are raised to stay monotonic, as Prometheus does.
func HistogramQuantile(q float64, bounds, counts []float64) (float64, bool) {
	v, _, ok := QuantileBeyond(q, bounds, counts)
	return v, ok
}

// QuantileBeyond is HistogramQuantile, and whether the rank fell in the
// +Inf bucket: the quantile is then beyond the highest finite bound, which
// is the value answered (what it is beyond that, the histogram cannot
// say).
func QuantileBeyond(q float64, bounds, counts []float64) (v float64, beyond, ok bool) {
	n := len(bounds)
	if n < 2 || len(counts) != n || !math.IsInf(bounds[n-1], 1) || math.IsNaN(q) {
		return 0, false, false
	}
	// The total is the last count raised as the others are (Prometheus's
	// ensureMonotonic, then the last bucket's): the last count as it was,
	// below one before it, placed every rank too low (p90 of [5 10 8] over
	// [1 2 +Inf] read 1.44 where Prometheus reads 1.8).
	total := 0.0
	for _, c := range counts {
		total = max(total, c)
	}
	if total <= 0 {
		return 0, false, false
	}
	switch {
	case q < 0:
		return math.Inf(-1), false, true
	case q > 1:
		return math.Inf(1), false, true
	}
	for _, b := range bounds[:n-1] {
		if math.IsInf(b, 0) || math.IsNaN(b) {
			return 0, false, false // a bound of -Inf (or a second +Inf) leaves no bucket to interpolate in
		}
	}
	rank := q * total
	b, prev := -1, 0.0
	for i := range n {
		c := max(counts[i], prev)
		if c >= rank {
			b = i
			break
		}
		prev = c
	}
	if b < 0 || b == n-1 {
		return bounds[n-2], true, true
	}
	if b == 0 && bounds[0] <= 0 {
		return bounds[0], false, true
	}
	start := 0.0
	if b > 0 {
		start = bounds[b-1]
	}
	count := max(counts[b], prev) - prev
	if count <= 0 {
		return bounds[b], false, true
	}
	return start + (bounds[b]-start)*((rank-prev)/count), false, true
}

// histDelta is the increase of histogram h over a series: between the last
// sample that carries it and the first of the run of samples before it
// with the same bounds (a window does not reach across a change of
// bounds: the counts before it are another histogram's, even where the
// bounds came back). ok is false when no two such samples carry it.
func histDelta(h Hist, series []Sample) (bounds, delta []float64, ok bool) {
	last := -1
	for i := len(series) - 1; i >= 0; i-- {
		if series[i].Hist != nil && series[i].Hist[h].Present() {
			last = i
			break
		}
	}
	if last < 1 {
		return nil, nil, false
	}
	lb := &series[last].Hist[h]
	first := -1
	for i := last - 1; i >= 0; i-- {
		if series[i].Hist == nil || !series[i].Hist[h].Present() {
			continue
		}
		if !slices.Equal(series[i].Hist[h].Bounds, lb.Bounds) {
			break
		}
		first = i
	}
	if first < 0 {
		return nil, nil, false
	}
	fb := &series[first].Hist[h]
	delta = make([]float64, len(lb.Counts))
	for i := range delta {
		delta[i] = max(lb.Counts[i]-fb.Counts[i], 0)
	}
	return lb.Bounds, delta, true
}

// Merge adds up the window increases of a histogram across the pods of a
// workload, bucket by bucket (by upper bound), so that a quantile is the
// workload's, not a mean of the pods' quantiles. Pods whose bounds differ
// (another server version) are merged on the bounds they all have: a
// cumulative count at a shared bound is exact for every pod.
type Merge struct {
	counts map[float64]float64
	pods   map[float64]int
	n      int
}

// Add merges one pod's increase.
func (m *Merge) Add(bounds, delta []float64) {
	if m.counts == nil {
		m.counts, m.pods = map[float64]float64{}, map[float64]int{}
	}
	for i, b := range bounds {
		m.counts[b] += delta[i]
		m.pods[b]++
	}
	m.n++
}

// Pods is the number of pods merged.
func (m *Merge) Pods() int { return m.n }

// Quantile is the merged histogram's q-quantile.
func (m *Merge) Quantile(q float64) (float64, bool) {
	v, _, ok := m.QuantileBeyond(q)
	return v, ok
}

// QuantileBeyond is Quantile, and whether it lies beyond the highest
// finite bound every pod's histogram has (QuantileBeyond): pods of
// servers whose buckets differ are merged on the bounds they share, and a
// quantile past the last of them is answered as that bound.
func (m *Merge) QuantileBeyond(q float64) (v float64, beyond, ok bool) {
	if m.n == 0 {
		return 0, false, false
	}
	bounds := make([]float64, 0, len(m.counts))
	for b, n := range m.pods {
		if n == m.n {
			bounds = append(bounds, b)
		}
	}
	sort.Float64s(bounds)
	counts := make([]float64, len(bounds))
	for i, b := range bounds {
		counts[i] = m.counts[b]
	}
	return QuantileBeyond(q, bounds, counts)
}

// EvalBeyond is Eval of a RuleQuantile metric, and whether its quantile
// lies beyond the histogram's highest finite bound (QuantileBeyond).
func (m Def) EvalBeyond(series []Sample) (v float64, beyond, ok bool) {
	bounds, delta, ok := histDelta(m.Hist, series)
	if !ok {
		return 0, false, false
	}
	return QuantileBeyond(m.Q, bounds, delta)
}

// EvalMerge is Eval of a RuleQuantile metric that also merges the pod's
// bucket increases into mg when its quantile is defined (it had
// observations): one pass gives the pod's own value and its part of the
// workload's.
func (m Def) EvalMerge(mg *Merge, series []Sample) (float64, bool) {
	bounds, delta, ok := histDelta(m.Hist, series)
	if !ok {
		return 0, false
	}
	v, ok := HistogramQuantile(m.Q, bounds, delta)
	if ok {
		mg.Add(bounds, delta)
	}
	return v, ok
}

// latestQuantile is Latest of a RuleQuantile metric: over the shortest tail
// whose first sample (with the same bounds) has fewer observations than the
// last, in one pass.
func (m Def) latestQuantile(series []Sample) (float64, bool) {
	last := -1
	for i := len(series) - 1; i >= 0; i-- {
		if series[i].Hist != nil && series[i].Hist[m.Hist].Present() {
			last = i
			break
		}
	}
	if last < 1 {
		return 0, false
	}
	lb := &series[last].Hist[m.Hist]
	for i := last - 1; i >= 0; i-- {
		if series[i].Hist == nil {
			continue
		}
		b := &series[i].Hist[m.Hist]
		if !slices.Equal(b.Bounds, lb.Bounds) {
			return 0, false
		}
		if b.Total() < lb.Total() {
			return m.Eval([]Sample{series[i], series[last]})
		}
	}
	return 0, false
}

// HasHist reports whether any sample of the series carries m's histogram.
func (m Def) HasHist(series []Sample) bool {
	for i := len(series) - 1; i >= 0; i-- {
		if series[i].Hist != nil && series[i].Hist[m.Hist].Present() {
			return true
		}
	}
	return false
}

// histMono is Monotonic's state for one histogram.
type histMono struct {
	bounds []float64
	last   []float64
	offset []float64
	rebase bool // the next counts come from another agent process
}

// adjust rewrites b's counts (a fresh slice) monotonic across resets.
func (s *histMono) adjust(b *Buckets) {
	rebase := s.rebase
	s.rebase = false
	if !slices.Equal(s.bounds, b.Bounds) {
		// New bounds start a new series: windows do not reach across it.
		s.bounds, s.last, s.offset = b.Bounds, slices.Clone(b.Counts), make([]float64, len(b.Counts))
		return
	}
	reset := false
	for i, c := range b.Counts {
		if c < s.last[i] {
			reset = true
			break
		}
	}
	out := make([]float64, len(b.Counts))
	for i, c := range b.Counts {
		switch {
		case rebase:
			s.offset[i] += s.last[i] - c
		case reset:
			s.offset[i] += s.last[i]
		}
		s.last[i] = c
		out[i] = c + s.offset[i]
	}
	b.Counts = out
}
