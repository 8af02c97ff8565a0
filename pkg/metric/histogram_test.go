package metric

import (
	"math"
	"testing"
)

var inf = math.Inf(1)

// The expected values follow Prometheus' histogram_quantile on the same
// buckets (promql/quantile.go and its test data, testdata/histograms.test).
func TestHistogramQuantile(t *testing.T) {
	bounds := []float64{0.1, 0.2, 0.4, 1, inf}
	counts := []float64{10, 20, 30, 40, 40} // ten observations per finite bucket
	tests := []struct {
		q    float64
		want float64
		ok   bool
	}{
		{0.5, 0.2, true},           // rank 20: the top of the second bucket
		{0.25, 0.1, true},          // rank 10: the top of the first
		{0.3, 0.12, true},          // rank 12: 2 of 10 into (0.1, 0.2]
		{0.9, 0.4 + 0.6*0.6, true}, // rank 36: 6 of 10 into (0.4, 1]
		{0, 0, true},               // rank 0: the first bucket's lower end
		{1, 1, true},               // the last finite bucket's top
		{-1, math.Inf(-1), true},   // as Prometheus
		{2, inf, true},
	}
	for _, tc := range tests {
		got, ok := HistogramQuantile(tc.q, bounds, counts)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 && !(math.IsInf(got, 0) && got == tc.want) {
			t.Errorf("q=%v: got %v, %v; want %v, %v", tc.q, got, ok, tc.want, tc.ok)
		}
	}
	// A rank in the +Inf bucket answers the highest finite bound.
	if got, _ := HistogramQuantile(0.99, []float64{0.1, 1, inf}, []float64{0, 50, 100}); got != 1 {
		t.Errorf("+Inf bucket: got %v, want 1", got)
	}
	// No observations, no +Inf bucket, one bucket: undefined.
	for _, c := range []struct{ b, c []float64 }{
		{[]float64{0.1, inf}, []float64{0, 0}},
		{[]float64{0.1, 0.2}, []float64{1, 2}},
		{[]float64{inf}, []float64{3}},
		{[]float64{math.Inf(-1), 1, inf}, []float64{1, 2, 3}}, // a -Inf bound: -Inf + Inf·f is NaN
		{[]float64{math.Inf(-1), inf}, []float64{1, 2}},
	} {
		if v, ok := HistogramQuantile(0.5, c.b, c.c); ok {
			t.Errorf("%v %v: got %v, want undefined", c.b, c.c, v)
		}
	}
	// Decreasing counts are made monotonic, not trusted.
	if got, _ := HistogramQuantile(0.5, []float64{1, 2, 3, inf}, []float64{2, 1, 8, 8}); math.Abs(got-(2+1.0/3)) > 1e-12 {
		t.Errorf("non-monotonic: got %v, want 2⅓ (the second bucket raised to 2: rank 4 is 2 of 6 into (2, 3])", got)
	}
}

func hsample(ms int64, bounds, counts []float64) Sample {
	s := Sample{TimeMs: ms, Hist: &Histograms{}}
	s.Hist[TTFTHist] = Buckets{Bounds: bounds, Counts: counts}
	return s
}

func TestQuantileOverAWindow(t *testing.T) {
	p90, _ := Lookup("ttftP90Seconds")
	b := []float64{0.1, 0.5, 1, inf}
	series := []Sample{
		hsample(0, b, []float64{100, 100, 100, 100}), // history before the window
		hsample(1000, b, []float64{100, 105, 110, 110}),
		hsample(2000, b, []float64{100, 110, 120, 120}),
	}
	// Over the window: 10 in (0.1, 0.5], 10 in (0.5, 1]: p90 is rank 18, 8 of 10 into (0.5, 1].
	got, ok := p90.Eval(series)
	if want := 0.5 + 0.5*0.8; !ok || math.Abs(got-want) > 1e-12 {
		t.Fatalf("p90 = %v, %v; want %v", got, ok, want)
	}
	// No request in the window: undefined, never 0.
	flat := []Sample{series[2], hsample(3000, b, []float64{100, 110, 120, 120})}
	if v, ok := p90.Eval(flat); ok {
		t.Fatalf("no observations: got %v, want undefined", v)
	}
	// The other histogram is absent.
	itl, _ := Lookup("itlP90Seconds")
	if v, ok := itl.Eval(series); ok {
		t.Fatalf("absent histogram: got %v", v)
	}
	// Bounds that change (another server version) start a new series.
	b2 := []float64{0.2, 1, inf}
	changed := []Sample{series[0], hsample(1000, b2, []float64{0, 10, 10}), hsample(2000, b2, []float64{0, 20, 20})}
	if got, ok := p90.Eval(changed); !ok || math.Abs(got-(0.2+0.8*0.9)) > 1e-12 {
		t.Fatalf("after a bounds change: got %v, %v", got, ok)
	}
	// Bounds that change and come back: the window starts where they came
	// back (it reached back to the first sample with these bounds, whose
	// counts were higher: every bucket's increase clamped to 0, the
	// quantile undefined).
	back := []Sample{hsample(0, b, []float64{100, 110, 120, 120}), hsample(1000, b2, []float64{0, 10, 10}),
		hsample(2000, b, []float64{0, 0, 0, 0}), hsample(3000, b, []float64{0, 0, 10, 10})}
	if got, ok := p90.Eval(back); !ok || math.Abs(got-(0.5+0.5*0.9)) > 1e-12 {
		t.Fatalf("bounds that came back: got %v, %v; want the p90 of the run since they came back", got, ok)
	}
}

func TestMergeIsTheWorkloadsQuantile(t *testing.T) {
	b := []float64{0.1, 1, 10, inf}
	// Pod a: 90 fast requests. Pod b: 10 slow ones. The workload's p90 is at
	// the top of the fast bucket; a mean of the pods' p90s would be ~4.6.
	var m Merge
	m.Add(b, []float64{90, 90, 90, 90})
	m.Add(b, []float64{0, 0, 10, 10})
	got, ok := m.Quantile(0.9)
	if !ok || math.Abs(got-0.1) > 1e-12 {
		t.Fatalf("merged p90 = %v, %v; want 0.1", got, ok)
	}
	// A pod with other bounds merges on the shared ones only.
	m.Add([]float64{1, 5, inf}, []float64{0, 0, 100})
	got, _ = m.Quantile(0.5)
	if want := 1.0; got != want { // shared bounds 1 and +Inf: 90 of 200 ≤ 1, the rest in +Inf → highest finite bound
		t.Fatalf("merged on shared bounds: got %v, want %v", got, want)
	}
	var empty Merge
	if _, ok := empty.Quantile(0.5); ok {
		t.Fatal("an empty merge has no quantile")
	}
}

func TestMonotonicHistogramsAcrossResetsAndRebase(t *testing.T) {
	var m Monotonic
	b := []float64{1, inf}
	in := [][]float64{{5, 10}, {6, 12}, {1, 1}, {2, 3}} // the server restarted before the third
	var out [][]float64
	for i, c := range in {
		s := hsample(int64(i), b, append([]float64(nil), c...))
		m.AdjustSample(&s)
		out = append(out, s.Hist[TTFTHist].Counts)
	}
	want := [][]float64{{5, 10}, {6, 12}, {7, 13}, {8, 15}}
	for i := range want {
		for j := range want[i] {
			if out[i][j] != want[i][j] {
				t.Fatalf("step %d: got %v, want %v", i, out[i], want[i])
			}
		}
	}
	// Another agent process: no increase across the change.
	m.Rebase()
	s := hsample(9, b, []float64{100, 200})
	m.AdjustSample(&s)
	if c := s.Hist[TTFTHist].Counts; c[0] != 8 || c[1] != 15 {
		t.Fatalf("after rebase: got %v, want [8 15]", c)
	}
}

// TestLatestQuantile: the latest value is over the last interval with
// observations (an interval with none is skipped, as for ratios), and a
// series with no histogram, or only one sample, has none.
func TestLatestQuantile(t *testing.T) {
	p90, _ := Lookup("ttftP90Seconds")
	b := []float64{0.1, 1, inf}
	series := []Sample{
		hsample(0, b, []float64{0, 0, 0}),
		hsample(1000, b, []float64{10, 10, 10}), // 10 fast
		hsample(2000, b, []float64{10, 10, 10}), // none
		{TimeMs: 3000},                          // a sample without histograms
	}
	if v, ok := p90.Latest(series); !ok || math.Abs(v-0.09) > 1e-12 {
		t.Fatalf("Latest = %v, %v; want 0.09 over the last interval with requests", v, ok)
	}
	if v, ok := p90.Latest(series[:1]); ok {
		t.Fatalf("one sample: %v", v)
	}
	if v, ok := p90.Latest([]Sample{{TimeMs: 0}, {TimeMs: 1}}); ok {
		t.Fatalf("no histogram: %v", v)
	}
}

// TestQuantileBeyondTheHighestBound: a rank in the +Inf bucket answers the
// highest finite bound, as Prometheus does, and says that the quantile is
// beyond it; a rank within the finite buckets, or at the top of the last
// one, is not.
func TestQuantileBeyondTheHighestBound(t *testing.T) {
	bounds := []float64{1, 10, inf}
	counts := []float64{50, 80, 100} // 20 observations past 10
	for _, c := range []struct {
		q      float64
		v      float64
		beyond bool
	}{{0.5, 1, false}, {0.8, 10, false}, {0.9, 10, true}, {0.99, 10, true}} {
		v, beyond, ok := QuantileBeyond(c.q, bounds, counts)
		if !ok || v != c.v || beyond != c.beyond {
			t.Errorf("q %g: %g beyond %v (ok %v), want %g beyond %v", c.q, v, beyond, ok, c.v, c.beyond)
		}
		if hv, hok := HistogramQuantile(c.q, bounds, counts); hv != v || hok != ok {
			t.Errorf("q %g: HistogramQuantile %g %v, QuantileBeyond %g %v", c.q, hv, hok, v, ok)
		}
	}
}

// TestDecreasingCountsRaiseTheTotalToo: counts that decrease are raised to
// stay monotonic, as Prometheus's ensureMonotonic does, and the total with
// them (the last count, raised): the last count as it was, below one
// before it, placed every rank too low (p90 of [5 10 8] over [1 2 +Inf]
// read 1.44 where Prometheus reads 1.8).
func TestDecreasingCountsRaiseTheTotalToo(t *testing.T) {
	bounds := []float64{1, 2, inf}
	for _, c := range []struct {
		counts []float64
		q      float64
		want   float64
	}{
		{[]float64{5, 10, 8}, 0.9, 1.8},
		{[]float64{5, 10, 10}, 0.9, 1.8},
		{[]float64{10, 4, 10}, 0.5, 0.5},
	} {
		if got, ok := HistogramQuantile(c.q, bounds, c.counts); !ok || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q %v of %v: %v, %v; want %v", c.q, c.counts, got, ok, c.want)
		}
	}
}
