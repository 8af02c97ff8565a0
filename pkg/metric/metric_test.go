package metric

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// A pod's counters' state past its first histogram or reset: with the
// offsets in one allocation with the histograms' state, a pod with
// histograms and no reset held 288 bytes where it had held 160 (found in
// a review, 2026-12-05).
func TestMonotonicsRarePartIsSmall(t *testing.T) {
	if n := unsafe.Sizeof(monoMore{}); n > 176 {
		t.Fatalf("monoMore is %d bytes, want at most 176", n)
	}
}

func sample(ms int64, set map[ID]float64) Sample {
	s := Sample{TimeMs: ms}
	for id, v := range set {
		s.Set(id, v)
	}
	return s
}

func TestEval(t *testing.T) {
	rate, _ := Lookup("requestsPerSecond")
	ttft, _ := Lookup("ttftSeconds")
	hit, _ := Lookup("prefixCacheHitRate")
	waiting, _ := Lookup("waiting")
	series := []Sample{
		sample(0, map[ID]float64{RequestSuccess: 10, TTFTSum: 1, TTFTCount: 4, PrefixHits: 0, PrefixQueries: 0, Waiting: 2}),
		sample(1000, map[ID]float64{RequestSuccess: 14, TTFTSum: 2, TTFTCount: 6, PrefixHits: 5, PrefixQueries: 20, Waiting: 4}),
		// A lost sample at 2000: the next interval is two seconds long.
		sample(3000, map[ID]float64{RequestSuccess: 22, TTFTSum: 2, TTFTCount: 6, PrefixHits: 5, PrefixQueries: 20, Waiting: 6}),
	}
	tests := map[string]struct {
		m      Def
		series []Sample
		want   float64
		ok     bool
	}{
		"rate over the window":               {rate, series, 4, true},
		"rate across a lost sample":          {rate, series[1:], 4, true},
		"ratio is an interval mean":          {ttft, series, 0.5, true},
		"ratio with no request is undefined": {ttft, series[1:], 0, false},
		"hit rate":                           {hit, series, 0.25, true},
		"gauge mean":                         {waiting, series, 4, true},
		"one sample has no rate":             {rate, series[:1], 0, false},
		"absent metric is absent":            {Def{Name: "x", Rule: RuleGauge, Num: Swapped}, series, 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := tc.m.Eval(tc.series)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	// Latest skips the last interval when no request finished in it.
	if got, ok := ttft.Latest(series); !ok || got != 0.5 {
		t.Fatalf("Latest ttft = %v, %v; want 0.5 from the last interval with requests", got, ok)
	}
	if got, ok := waiting.Latest(series); !ok || got != 6 {
		t.Fatalf("Latest waiting = %v, %v; want 6", got, ok)
	}
}

func TestMonotonicSurvivesAReset(t *testing.T) {
	var m Monotonic
	raw := []float64{100, 150, 20, 50} // the server restarted after 150
	var series []Sample
	for i, v := range raw {
		s := sample(int64(i)*1000, map[ID]float64{PromptTokens: v, Waiting: v})
		m.Adjust(&s.Values)
		series = append(series, s)
	}
	if got := series[3].V[PromptTokens]; got != 200 {
		t.Fatalf("adjusted counter = %v, want 150+50", got)
	}
	if got := series[3].V[Waiting]; got != 50 {
		t.Fatalf("gauge was adjusted: %v", got)
	}
	rate, _ := Lookup("promptTokensPerSecond")
	if got, _ := rate.Eval(series); got != 100.0/3 {
		t.Fatalf("rate across the reset = %v, want 100/3 (50 + 20 + 30 over 3s)", got)
	}
}

// TestCounterIndexNumbersTheCounters: every counter has its own place in
// 0 … NumCounters-1, and nothing else has one.
func TestCounterIndexNumbersTheCounters(t *testing.T) {
	seen := map[int]ID{}
	for id := ID(0); id <= NumIDs; id++ {
		c := id.CounterIndex()
		if !id.Valid() || id.Kind() != Counter {
			if c != -1 {
				t.Errorf("%s (%d) is not a counter but has index %d", id.Name(), id, c)
			}
			continue
		}
		if c < 0 || c >= NumCounters {
			t.Errorf("counter %s has index %d, outside 0 … %d", id.Name(), c, NumCounters-1)
		}
		if other, dup := seen[c]; dup {
			t.Errorf("counters %s and %s share index %d", other.Name(), id.Name(), c)
		}
		seen[c] = id
	}
	if len(seen) != NumCounters {
		t.Errorf("%d counters indexed, want NumCounters = %d", len(seen), NumCounters)
	}
}

// TestMonotonicKeepsEachCounterApart: counters that appear at different
// times, and reset apart, are each continued from their own last value.
func TestMonotonicKeepsEachCounterApart(t *testing.T) {
	var m Monotonic
	steps := []map[ID]float64{
		{PromptTokens: 100},
		{PromptTokens: 150, ArrivedRequests: 7}, // the last counter first appears
		{PromptTokens: 160, ArrivedRequests: 2}, // it resets alone
		{PromptTokens: 10, ArrivedRequests: 5},  // then the first one does
	}
	want := []map[ID]float64{
		{PromptTokens: 100},
		{PromptTokens: 150, ArrivedRequests: 7},
		{PromptTokens: 160, ArrivedRequests: 9},
		{PromptTokens: 170, ArrivedRequests: 12},
	}
	for i, v := range steps {
		s := sample(int64(i)*1000, v)
		m.Adjust(&s.Values)
		for id, w := range want[i] {
			if got := s.V[id]; got != w {
				t.Errorf("step %d: %s = %v, want %v", i, id.Name(), got, w)
			}
		}
	}
}

func TestQuantize(t *testing.T) {
	if got := Quantize(TTFTSum, 1.23456); got != 1.235 {
		t.Fatalf("ttftSum = %v", got)
	}
	if got := Quantize(Waiting, 7); got != 7 {
		t.Fatalf("waiting = %v", got)
	}
	for _, c := range Canonical {
		if _, ok := Lookup(c.Name); !ok || (!c.Num.Valid() && c.Rule != RuleLoad && c.Rule != RuleQuantile) || (c.Rule == RuleQuantile && (c.Hist >= NumHists || c.Q <= 0 || c.Q >= 1)) {
			t.Fatalf("%s does not resolve", c.Name)
		}
	}
}

// TestSaturation: a sample's load is its largest gauge over its target;
// over a window, the mean of the samples' loads; absent gauges are left
// out, and a sample with none has no load.
func TestSaturation(t *testing.T) {
	sat, ok := Lookup("saturation")
	if !ok || sat.Load != DefaultLoad {
		t.Fatalf("%+v", sat)
	}
	sample := func(ms int64, kv, waiting float64) Sample {
		s := Sample{TimeMs: ms}
		s.Set(KVCacheUsage, kv)
		s.Set(Waiting, waiting)
		s.Set(Running, 40)
		return s
	}
	// KV 0.35 of 0.7 → 0.5; 4 waiting of 2 → 2; KV 0.7 and 1 waiting → 1.
	series := []Sample{sample(0, 0.35, 0), sample(1000, 0.35, 4), sample(2000, 0.7, 1)}
	if v, ok := sat.Eval(series); !ok || v != (0.5+2+1)/3 {
		t.Errorf("window = %v %v, want %v", v, ok, (0.5+2+1)/3)
	}
	if v, ok := sat.Latest(series); !ok || v != 1 {
		t.Errorf("latest = %v %v", v, ok)
	}
	// A running target counts the batch too: 40 of 32 → 1.25.
	withRunning := sat.WithLoad(LoadTargets{KVCache: 0.7, Waiting: 2, Running: 32})
	if v, _ := withRunning.Eval(series[:1]); v != 1.25 {
		t.Errorf("with a running target = %v, want 1.25", v)
	}
	// A page without KV-cache usage: waiting alone.
	var noKV Sample
	noKV.Set(Waiting, 1)
	if v, ok := sat.Eval([]Sample{noKV}); !ok || v != 0.5 {
		t.Errorf("waiting alone = %v %v", v, ok)
	}
	var none Sample
	none.Set(PromptTokens, 5)
	if _, ok := sat.Eval([]Sample{none}); ok {
		t.Error("no gauge: defined")
	}
}

// TestIDsCoverWhatEachMetricReads: every canonical metric derived from its
// IDs alone is what it is from every value (a compact store decodes only
// those).
func TestIDsCoverWhatEachMetricReads(t *testing.T) {
	var series, only []Sample
	for i := range 5 {
		var s Sample
		s.TimeMs = int64(i) * 1000
		for id := ID(1); id < NumIDs; id++ {
			s.Set(id, float64(i*int(id)+1)/10)
		}
		series = append(series, s)
	}
	for _, m := range Canonical {
		only = only[:0]
		for _, s := range series {
			s.Present &= m.IDs()
			only = append(only, s)
		}
		want, okW := m.Eval(series)
		got, okG := m.Eval(only)
		if want != got || okW != okG {
			t.Errorf("%s from its IDs alone = %v %v, from every value %v %v", m.Name, got, okG, want, okW)
		}
	}
}

// TestARebaseWaitsForEachCounter: after a Rebase (another agent process)
// each counter's next value continues its series with no increase. The
// rebase was one flag for all, spent by the next sample even for the
// counters it lacked: a counter absent then, and lower after it than the
// old process's (which carried offsets for retired series), was taken
// for a server reset, its whole value an increase.
func TestARebaseWaitsForEachCounter(t *testing.T) {
	var m Monotonic
	for i, v := range []map[ID]float64{{PromptTokens: 100, RequestSuccess: 500}, {PromptTokens: 110, RequestSuccess: 510}} {
		s := sample(int64(i)*1000, v)
		m.Adjust(&s.Values)
	}
	m.Rebase()
	first := sample(2000, map[ID]float64{PromptTokens: 40}) // the new agent's first sample lacks requestSuccess
	m.Adjust(&first.Values)
	later := sample(3000, map[ID]float64{PromptTokens: 50, RequestSuccess: 300})
	m.Adjust(&later.Values)
	if got := first.V[PromptTokens]; got != 110 {
		t.Errorf("promptTokens after the rebase = %v, want 110 (no increase)", got)
	}
	if got := later.V[PromptTokens]; got != 120 {
		t.Errorf("promptTokens next = %v, want 120", got)
	}
	if got := later.V[RequestSuccess]; got != 510 {
		t.Errorf("requestSuccess at its first value after the rebase = %v, want 510 (no increase), not a reset's 810", got)
	}
}

// TestLatestIsTheShortestTailsValue: Latest is, in one pass, the value
// Eval gives over the shortest tail of the series that has one (it was
// that, computed by Eval of every tail: quadratic, 23 ms over an idle
// pod's 3,600 samples of a ratio in which no request finished).
func TestLatestIsTheShortestTailsValue(t *testing.T) {
	byTails := func(m Def, series []Sample) (float64, bool) {
		for start := len(series) - 2; start >= 0; start-- {
			if v, ok := m.Eval(series[start:]); ok {
				return v, true
			}
		}
		return 0, false
	}
	ttft, _ := Lookup("ttftSeconds")
	tokens, _ := Lookup("generationTokensPerSecond")
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n := rng.IntN(12)
		series := make([]Sample, n)
		var sum, count, gen float64
		for i := range series {
			series[i].TimeMs = int64(i)*1000 + int64(rng.IntN(3))*500 // some intervals of 0 s
			if rng.IntN(4) > 0 {
				if rng.IntN(3) == 0 {
					sum, count = sum+rng.Float64(), count+float64(rng.IntN(3))
				}
				series[i].Set(TTFTSum, sum)
				series[i].Set(TTFTCount, count)
			}
			if rng.IntN(3) > 0 {
				gen += float64(rng.IntN(50))
				series[i].Set(GenerationTokens, gen)
			}
		}
		for _, m := range []Def{ttft, tokens} {
			want, wantOK := byTails(m, series)
			if got, ok := m.Latest(series); got != want || ok != wantOK {
				t.Fatalf("trial %d, %s over %d samples: Latest %v %v, the shortest tail's %v %v", trial, m.Name, n, got, ok, want, wantOK)
			}
		}
	}
}

// BenchmarkLatestOfAnIdleRatio: a ratio whose denominator never grew, over
// an hour of samples (/debug/workloads with no window reads five a pod).
func BenchmarkLatestOfAnIdleRatio(b *testing.B) {
	ttft, _ := Lookup("ttftSeconds")
	series := make([]Sample, 3600)
	for i := range series {
		series[i].TimeMs = int64(i) * 1000
		series[i].Set(TTFTSum, 10)
		series[i].Set(TTFTCount, 5)
	}
	for b.Loop() {
		ttft.Latest(series)
	}
}
