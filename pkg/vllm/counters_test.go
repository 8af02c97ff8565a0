package vllm

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// dpPage is a data-parallel vLLM page: one generation-token counter per
// engine, and a finished-reason counter per engine.
func dpPage(engines map[string]float64, reversed bool) []byte {
	page := "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n# TYPE vllm:generation_tokens_total counter\n"
	order := []string{"0", "1", "2"}
	if reversed {
		order = []string{"2", "1", "0"}
	}
	for _, e := range order {
		if v, ok := engines[e]; ok {
			// Label order changes with reversed: the series is the same.
			if reversed {
				page += fmt.Sprintf("vllm:generation_tokens_total{model_name=\"m\",engine=\"%s\"} %g\n", e, v)
			} else {
				page += fmt.Sprintf("vllm:generation_tokens_total{engine=\"%s\",model_name=\"m\"} %g\n", e, v)
			}
		}
	}
	page += "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n"
	return []byte(page)
}

// TestOneEngineRestartIsNotASpike: engine 1 of a data-parallel server
// restarts. Summed without per-series state, the counter drops from 2,000
// to 1,015, which the aggregator (rightly, for a whole-server restart)
// treats as a reset: the next interval's increase becomes 1,015 tokens
// instead of 15. Per series, the drop is engine 1's alone.
func TestOneEngineRestartIsNotASpike(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	pages := [][]byte{
		dpPage(map[string]float64{"0": 1000, "1": 1000}, false),
		dpPage(map[string]float64{"0": 1010, "1": 5}, true), // engine 1 restarted, and counted 5
		dpPage(map[string]float64{"0": 1020, "1": 15}, false),
	}
	c := NewCounters()
	var mono metric.Monotonic
	var series []metric.Sample
	for i, p := range pages {
		pg, err := e.ExtractWith(p, c)
		if err != nil {
			t.Fatal(err)
		}
		s := metric.Sample{TimeMs: int64(i) * 1000, Values: pg.Values}
		mono.Adjust(&s.Values)
		series = append(series, s)
	}
	rate, _ := metric.Canonical[6].Eval(series) // generationTokensPerSecond
	if metric.Canonical[6].Name != "generationTokensPerSecond" || rate != 17.5 {
		t.Fatalf("generationTokensPerSecond = %v over 2 s, want (15 + 20) / 2 = 17.5", rate)
	}
	// Without the per-series state, the same pages give the spike.
	var plain metric.Monotonic
	series = series[:0]
	for i, p := range pages {
		pg, _ := e.Extract(p)
		s := metric.Sample{TimeMs: int64(i) * 1000, Values: pg.Values}
		plain.Adjust(&s.Values)
		series = append(series, s)
	}
	if spike, _ := metric.Canonical[6].Eval(series[:2]); spike < 1000 {
		t.Fatalf("stateless sum over the restart = %v/s; the test no longer shows the defect it guards", spike)
	}
}

// TestSeriesThatComeAndGo: a series absent from one page keeps its last
// value in the sum; one absent for good is retired at its last value; a new
// series counts from zero.
func TestSeriesThatComeAndGo(t *testing.T) {
	e, _ := NewExtractor(nil)
	c := NewCounters()
	get := func(engines map[string]float64) float64 { t.Helper(); return generationTokens(t, e, c, engines) }
	steps := []struct {
		engines map[string]float64
		want    float64
	}{
		{map[string]float64{"0": 100, "1": 50}, 150},
		{map[string]float64{"0": 110}, 160},                  // engine 1 missing once: held at 50
		{map[string]float64{"0": 120, "1": 60}, 180},         // back
		{map[string]float64{"0": 130, "1": 60, "2": 7}, 197}, // engine 2 appears: counted from 0
		{map[string]float64{"0": 140, "1": 60, "2": 3}, 210}, // engine 2 restarts and counts 3: 7 + 3
		{map[string]float64{"0": 150, "1": 60, "2": 3}, 220},
	}
	for i, s := range steps {
		if got := get(s.engines); got != s.want {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
	}
	// Engine 1 gone for good: after retireAfter scrapes it is forgotten,
	// its 60 kept.
	for i := range retireAfter + 2 {
		if got := get(map[string]float64{"0": 150 + float64(i), "2": 3}); got != 220+float64(i) {
			t.Fatalf("after engine 1 left, scrape %d: %v, want %v", i, got, 220+float64(i))
		}
	}
	if n := len(c.series); n != 2 {
		t.Fatalf("%d series tracked, want 2", n)
	}
	if pg, _ := e.ExtractWith(dpPage(map[string]float64{}, false), c); !math.IsNaN(nan(pg)) {
		t.Fatalf("a page without the counter reports it: %+v", pg)
	}
}

// TestARetiredSeriesThatComesBackContinues: a series away past
// retireAfter scrapes is forgotten, its value kept in the sum; when it came
// back it counted from zero, its whole value again (60 tokens in one
// interval: a spike of the rate). It continues from its last value now,
// and one that restarted while away counts from its new start.
func TestARetiredSeriesThatComesBackContinues(t *testing.T) {
	e, _ := NewExtractor(nil)
	c := NewCounters()
	get := func(engines map[string]float64) float64 { t.Helper(); return generationTokens(t, e, c, engines) }
	get(map[string]float64{"0": 100, "1": 60})
	for range retireAfter + 1 {
		get(map[string]float64{"0": 100})
	}
	if len(c.asleep) != 1 || len(c.series) != 1 {
		t.Fatalf("engine 1 not retired: %d series, asleep %v", len(c.series), c.asleep)
	}
	for _, step := range []struct {
		engine1, want float64
	}{{60, 160}, {65, 165}, {5, 170}} { // back as it was; counting on; restarted: 65 + 5
		if got := get(map[string]float64{"0": 100, "1": step.engine1}); got != step.want {
			t.Fatalf("engine 1 back at %v: %v, want %v", step.engine1, got, step.want)
		}
	}
	if c.retired[metric.GenerationTokens] != 0 || len(c.asleep) != 0 {
		t.Fatalf("retired %v, asleep %v: want the series' part taken back", c.retired[metric.GenerationTokens], c.asleep)
	}
}

// generationTokens is the generation tokens e reads, with c, of dpPage of
// engines.
func generationTokens(t *testing.T, e *Extractor, c *Counters, engines map[string]float64) float64 {
	t.Helper()
	pg, err := e.ExtractWith(dpPage(engines, false), c)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := pg.Get(metric.GenerationTokens)
	return v
}

func nan(pg Page) float64 {
	if v, ok := pg.Get(metric.GenerationTokens); ok {
		return v
	}
	return math.NaN()
}

// TestHistogramBucketsPerEngine: the TTFT buckets of a data-parallel page are
// summed by bound across engines, made monotonic per engine, and a bucket
// series briefly absent keeps its last count; the workload quantile over the
// restart of one engine is that of the requests actually served.
func TestHistogramBucketsPerEngine(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	page := func(fast0, all0, fast1, all1 float64) []byte {
		var b strings.Builder
		for eng, c := range map[string][2]float64{"0": {fast0, all0}, "1": {fast1, all1}} {
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"0.1\"} %g\n", eng, c[0])
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"1.0\"} %g\n", eng, c[1])
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"+Inf\"} %g\n", eng, c[1])
		}
		return []byte(b.String())
	}
	c := NewCounters()
	var series []metric.Sample
	var mono metric.Monotonic
	for i, p := range [][]byte{
		page(100, 100, 100, 100),
		page(110, 110, 0, 10), // engine 1 restarted: 10 slow requests since
		page(120, 120, 0, 20),
	} {
		pg, err := e.ExtractWith(p, c)
		if err != nil {
			t.Fatal(err)
		}
		s := metric.Sample{TimeMs: int64(i) * 1000, Values: pg.Values, Hist: pg.Hist}
		mono.AdjustSample(&s)
		series = append(series, s)
	}
	// Over the window: 20 fast (engine 0) and 20 slow (engine 1): p50 is the
	// top of the fast bucket, p75 halfway into (0.1, 1].
	p50 := metric.Def{Rule: metric.RuleQuantile, Hist: metric.TTFTHist, Q: 0.5}
	if v, ok := p50.Eval(series); !ok || v != 0.1 {
		t.Fatalf("p50 = %v, %v; want 0.1", v, ok)
	}
	p75 := p50
	p75.Q = 0.75
	if v, _ := p75.Eval(series); math.Abs(v-0.55) > 1e-12 {
		t.Fatalf("p75 = %v; want 0.55", v)
	}
	// Without WithHistograms the buckets are not read.
	plain, _ := NewExtractor(nil)
	if pg, _ := plain.Extract(page(1, 1, 1, 1)); pg.Hist != nil {
		t.Fatalf("histograms read without the option: %+v", pg.Hist)
	}
	// A histogram with no +Inf bucket is not forwarded.
	if pg, _ := e.Extract([]byte("vllm:num_requests_waiting 1\nvllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 3\n")); pg.Hist != nil {
		t.Fatalf("histogram without +Inf forwarded: %+v", pg.Hist)
	}
}

// pageOfBounds is a page whose TTFT histogram has n distinct bounds, beside
// a queue gauge.
func pageOfBounds(n int) []byte {
	var b strings.Builder
	b.WriteString("vllm:num_requests_waiting 7\n")
	for i := range n {
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"%d\"} %d\n", i+1, i)
	}
	b.WriteString("vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 1e6\n")
	return []byte(b.String())
}

// TestTooManyBoundsAreCappedFirst: a page's histogram of thousands of
// bounds is left out, and the rest of the page kept. Each new bound was
// searched among all before (quadratic: a 4.4 MiB page cost seconds of CPU
// the scrape timeout cannot stop); the search now stops at
// metric.MaxBuckets (BenchmarkExtractManyBounds).
func TestTooManyBoundsAreCappedFirst(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	for n, keep := range map[int]bool{metric.MaxBuckets - 1: true, 16000: false} {
		pg, err := e.ExtractWith(pageOfBounds(n), NewCounters())
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := pg.Get(metric.Waiting); v != 7 {
			t.Fatalf("%d bounds: waiting %v, want 7", n, v)
		}
		got := pg.Hist != nil && pg.Hist[metric.TTFTHist].Bounds != nil
		if got != keep {
			t.Fatalf("%d bounds: histogram kept %v, want %v", n, got, keep)
		}
	}
}

func BenchmarkExtractManyBounds(b *testing.B) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		b.Fatal(err)
	}
	page := pageOfBounds(16000)
	b.SetBytes(int64(len(page)))
	b.ResetTimer()
	for range b.N {
		if _, err := e.ExtractWith(page, NewCounters()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHistogramsTheWireRefusesAreLeftOut: a histogram of one bucket (only
// +Inf) was sent, the aggregator refused the batch as malformed and ended
// the stream, and the next stream's first batch sent it again: one pod's
// page silenced its node. Such a histogram is left out now, the rest of the
// page kept; two buckets are kept. A bucket line whose bound or count is
// NaN is dropped as the page is read, which leaves one bucket here.
func TestHistogramsTheWireRefusesAreLeftOut(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	for page, keep := range map[string]bool{
		`vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5`:                                                          false,
		"vllm:time_to_first_token_seconds_bucket{le=\"NaN\"} 1\nvllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5": false,
		"vllm:time_to_first_token_seconds_bucket{le=\"1\"} NaN\nvllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5": false,
		// A -Inf bound is left out alone (no bucket holds what lies below
		// it): what is left is one bucket.
		"vllm:time_to_first_token_seconds_bucket{le=\"-Inf\"} 1\nvllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5":                                                      false,
		"vllm:time_to_first_token_seconds_bucket{le=\"-Inf\"} 1\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 2\nvllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5": true,
		"vllm:time_to_first_token_seconds_bucket{le=\"1\"} 2\nvllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5":                                                         true,
	} {
		pg, err := e.ExtractWith([]byte("vllm:num_requests_waiting 7\n"+page+"\n"), NewCounters())
		if err != nil {
			t.Fatalf("%q: %v", page, err)
		}
		if v, _ := pg.Get(metric.Waiting); v != 7 {
			t.Fatalf("%q: waiting %v, want 7", page, v)
		}
		if got := pg.Hist != nil && pg.Hist[metric.TTFTHist].Present(); got != keep {
			t.Fatalf("%q: histogram kept %v, want %v", page, got, keep)
		}
	}
}

// TestCountersOfNewSeriesAtEveryScrapeAreBounded: a pod whose page names
// new series at every scrape (new labels on a counter, new bucket bounds)
// once grew its Counters without bound: each series was followed, and each
// retired bucket's offset kept for ever. Now at most maxSeries are followed
// and the retired offsets of bounds the page no longer has are dropped past
// maxRetiredBuckets, while the page's values are still read.
func TestCountersOfNewSeriesAtEveryScrapeAreBounded(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounters()
	for scrape := range 40 {
		var b strings.Builder
		b.WriteString("vllm:num_requests_waiting 7\n")
		for i := range 800 {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{req=\"%d-%d\"} 1\n", scrape, i)
		}
		for i := range 50 {
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"%d.%d\"} %d\n", scrape, i, i)
		}
		b.WriteString("vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 100\n")
		pg, err := e.ExtractWith([]byte(b.String()), c)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := pg.Get(metric.Waiting); v != 7 {
			t.Fatalf("scrape %d: waiting %v, want 7", scrape, v)
		}
		if pg.Hist == nil || !pg.Hist[metric.TTFTHist].Present() {
			t.Fatalf("scrape %d: the page's histogram was not read", scrape)
		}
		if len(c.series) > maxSeries || len(c.retiredHist) > maxRetiredBuckets+51 {
			t.Fatalf("scrape %d: %d series followed (at most %d), %d retired buckets (at most %d and the page's)",
				scrape, len(c.series), maxSeries, len(c.retiredHist), maxRetiredBuckets)
		}
	}
	if len(c.series) < maxSeries {
		t.Fatalf("%d series followed: the cap was never reached, so the test tests nothing", len(c.series))
	}
}

// TestASeriesTwiceOnAPageCountsOnce: a page that gives one series twice
// (the same name and labels) is read as Prometheus reads it, the first line
// holding. The second line was read as a reset of the series at every
// scrape: a page that never changed counted up by the first line's value
// each second (prompt tokens 250, 450, ... 1050), and repeated bucket
// lines added observations to the TTFT histogram.
func TestASeriesTwiceOnAPageCountsOnce(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounters()
	page := []byte("vllm:prompt_tokens_total{engine=\"0\"} 100\nvllm:prompt_tokens_total{engine=\"0\"} 50\n" +
		"vllm:time_to_first_token_seconds_bucket{le=\"1\"} 4\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 2\n" +
		"vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 9\n")
	for i := range 5 {
		p, err := e.ExtractWith(page, c)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := p.Get(metric.PromptTokens); v != 100 {
			t.Errorf("scrape %d of the same page: prompt tokens %v, want 100", i, v)
		}
		if h := p.Hist[metric.TTFTHist]; h.Total() != 9 || h.Counts[0] != 4 {
			t.Errorf("scrape %d of the same page: TTFT buckets %v, want [4 9]", i, h.Counts)
		}
	}
	// With no room to follow the series (the budget another pod holds), it
	// is summed as the page has it, and once: it was summed twice (200),
	// then, room given back, 100 (a drop: a reset to the aggregator).
	b := NewBudget(2, 2)
	other := NewCountersIn(b, "ns")
	if _, err := e.ExtractWith([]byte("vllm:prompt_tokens_total{engine=\"7\"} 1\nvllm:generation_tokens_total{engine=\"7\"} 1\n"), other); err != nil {
		t.Fatal(err)
	}
	full := NewCountersIn(b, "ns")
	for i := range 3 {
		if i == 2 {
			other.Release()
		}
		p, err := e.ExtractWith(page, full)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := p.Get(metric.PromptTokens); v != 100 {
			t.Errorf("scrape %d of the same page, no room to follow the series (room given back at 2): prompt tokens %v, want 100", i, v)
		}
	}
}

// TestANegativeCountIsNoReset: no counter is below zero; one sample of -1
// was read as a reset of its series, so the pod's counter went 1000 -> 999
// and the aggregator, taking that for a restart, counted the whole 1000
// again. The sample says nothing; the series is held at its last value.
func TestANegativeCountIsNoReset(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounters()
	var mono metric.Monotonic
	var out []float64
	for _, v := range []string{"1000", "-1", "1001"} {
		page := "vllm:generation_tokens_total{engine=\"0\"} " + v + "\nvllm:generation_tokens_total{engine=\"1\"} 5\n"
		p, err := e.ExtractWith([]byte(page), c)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Has(metric.GenerationTokens) {
			t.Fatalf("after %s: no generation tokens", v)
		}
		mono.Adjust(&p.Values)
		out = append(out, p.V[metric.GenerationTokens])
	}
	if !slices.Equal(out, []float64{1005, 1005, 1006}) {
		t.Fatalf("the aggregator's series %v for a counter that went 1000, -1, 1001 (and another at 5); want [1005 1005 1006]", out)
	}
}

// TestSeriesAPageLacksAreSummedInOneOrder: the series of a counter a page
// lacks are added at their last values in one order: in the map's order
// their float sum differed from scrape to scrape of the same pages (here
// 1e16 and seven 1s: 1e16 or 1e16+8), which, on a rounding edge of the
// wire's resolution, made a counter drop and the aggregator count a reset.
func TestSeriesAPageLacksAreSummedInOneOrder(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	var full, lacking strings.Builder
	for i := range 8 {
		v := 1.0
		if i == 0 {
			v = 1e16
		}
		fmt.Fprintf(&full, "vllm:prompt_tokens_total{engine=\"%d\"} %g\n", i, v)
	}
	full.WriteString("vllm:prompt_tokens_total{engine=\"8\"} 0\n")
	lacking.WriteString("vllm:prompt_tokens_total{engine=\"8\"} 0\n")
	seen := map[float64]bool{}
	for range 50 {
		c := NewCounters()
		if _, err := e.ExtractWith([]byte(full.String()), c); err != nil {
			t.Fatal(err)
		}
		p, err := e.ExtractWith([]byte(lacking.String()), c)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := p.Get(metric.PromptTokens)
		seen[v] = true
	}
	if len(seen) != 1 {
		t.Fatalf("the same two pages summed to %v", seen)
	}
}

// TestABudgetBoundsEveryPodsSeries: each pod follows at most maxSeries,
// but a node's pods each holding their most took 37 MiB of an agent
// limited to 128 Mi (110 pods). A Budget shared by every pod's Counters
// bounds them all, and one namespace's; past it a new series is summed as
// the page has it (the page's values still read); a series retired, and a
// pod's Counters released, give their room back.
func TestABudgetBoundsEveryPodsSeries(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := func(prefix string, n int) []byte {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{req=\"%s-%d\"} 1\n", prefix, i)
		}
		return []byte(b.String())
	}
	b := NewBudget(100, 60)
	hostile := []*Counters{NewCountersIn(b, "hostile"), NewCountersIn(b, "hostile")}
	for i, c := range hostile {
		pg, err := e.ExtractWith(page(fmt.Sprint(i), 50), c)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := pg.Get(metric.PromptTokens); v != 50 {
			t.Fatalf("a hostile pod's page: prompt tokens %v, want 50 (read past the budget too)", v)
		}
	}
	if all, of := b.Held("hostile"); all != 60 || of != 60 {
		t.Fatalf("held %d in all, %d of the hostile namespace: want 60, its share", all, of)
	}
	victim := NewCountersIn(b, "victim")
	if _, err := e.ExtractWith(page("v", 30), victim); err != nil {
		t.Fatal(err)
	}
	if all, of := b.Held("victim"); all != 90 || of != 30 || len(victim.series) != 30 {
		t.Fatalf("held %d in all, %d of the victim (%d followed): want 90, 30 and 30", all, of, len(victim.series))
	}
	// The first hostile pod's series are retired (its page names others),
	// then the second is released: their room is given back.
	for range retireAfter {
		if _, err := e.ExtractWith([]byte("vllm:num_requests_waiting 1\n"), hostile[0]); err != nil {
			t.Fatal(err)
		}
	}
	hostile[1].Release()
	if all, of := b.Held("hostile"); all != 30 || of != 0 {
		t.Fatalf("after retiring and releasing: held %d in all, %d of the hostile namespace; want 30 and 0", all, of)
	}
}

// TestABudgetsOverShareIsOnlyWhenFull: a namespace past a share set lower
// since it took its room is over it only while the budget is full (with
// room left the others take that); the share bounds what it takes next.
func TestABudgetsOverShareIsOnlyWhenFull(t *testing.T) {
	b := NewBudget(10, 10)
	for range 6 {
		if !b.take("a") {
			t.Fatal("a: no room within its share")
		}
	}
	b.SetShare(5)
	if b.take("a") {
		t.Fatal("a took room past its share")
	}
	if over := b.Over(); over != nil {
		t.Fatalf("over %v with room left, want none", over)
	}
	for range 4 {
		if !b.take("b") {
			t.Fatal("b: no room within its share")
		}
	}
	if over := b.Over(); len(over) != 1 || !over["a"] {
		t.Fatalf("over %v with the budget full, want a alone (6 of a share of 5; b 4)", over)
	}
}

// TestADeprecatedNameGoneIsNotCountedTwice: vLLM 0.10 emits the prefix
// cache's queries under the new name and the deprecated one, the same
// number under each; the new name wins the value. Upgraded in place to a
// version without the deprecated name (its counters starting again), the
// deprecated series was carried over at its last value into the sum, and
// kept so once retired: 2Q + v, for good, where the page said Q + v.
func TestADeprecatedNameGoneIsNotCountedTwice(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := func(deprecated bool, v float64) []byte {
		p := fmt.Sprintf("# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"m\"} %g\n", v)
		if deprecated {
			p += fmt.Sprintf("# TYPE vllm:gpu_prefix_cache_queries counter\nvllm:gpu_prefix_cache_queries_total{model_name=\"m\"} %g\n", v)
		}
		return []byte(p)
	}
	c := NewCounters()
	if pg, err := e.ExtractWith(page(true, 100), c); err != nil || pg.V[metric.PrefixQueries] != 100 {
		t.Fatalf("both names at 100: %v, %v", pg.V[metric.PrefixQueries], err)
	}
	// The upgrade: the new name starts again (a reset, 100 + 30 after it);
	// the deprecated one is gone, then retired.
	for i := range retireAfter + 2 {
		pg, err := e.ExtractWith(page(false, float64(30+i)), c)
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(100 + 30 + i); pg.V[metric.PrefixQueries] != want {
			t.Fatalf("scrape %d after the upgrade: %v, want %v (the deprecated name's 100 counted once)", i, pg.V[metric.PrefixQueries], want)
		}
	}
}

// TestEverySeriesOfADataParallelPageCounts: a series' key was the sum of
// its labels' FNV hashes, and two labels whose values differ in their last
// byte cancelled out: {model_name="a", engine="1"} and {model_name="b",
// engine="0"} were one key, so with per-series counters the second was
// dropped as the first given twice (a data-parallel server's buckets, of
// le="0.01" and "0.02" on two engines, alike). Every series of such pages
// counts now, as a full parse sums them.
func TestEverySeriesOfADataParallelPageCounts(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		s := vllmsim.New(vllmsim.Options{Engines: 2 + i%3, Models: []string{"a", "b"}, Seed: uint64(i)})
		s.SetModel(vllmsim.QueueModel{ArrivalRate: 30, BatchCapacity: 8, ServiceRate: 0.5})
		for range 40 {
			s.Step(0.1)
		}
		page := s.Page(false)
		counted, err := e.ExtractWith(page, NewCounters())
		if err != nil {
			t.Fatal(err)
		}
		full, err := e.FullParse(page)
		if err != nil {
			t.Fatal(err)
		}
		if counted.Values != full.Values || !reflect.DeepEqual(counted.Hist, full.Hist) {
			t.Fatalf("seed %d: with per-series counters %v\nsummed whole %v", i, named(counted, nil), named(full, nil))
		}
	}
	seen := map[uint64]string{}
	for _, m := range []string{"a", "b", "c"} {
		for eng := range 8 {
			for _, le := range []string{"0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "1", "2", "+Inf"} {
				labels := []*dto.LabelPair{{Name: proto.String("model_name"), Value: proto.String(m)},
					{Name: proto.String("engine"), Value: proto.String(fmt.Sprint(eng))}, {Name: proto.String("le"), Value: proto.String(le)}}
				k, id := seriesKey("vllm:time_to_first_token_seconds_bucket", labels), fmt.Sprint(m, eng, le)
				if other, ok := seen[k]; ok {
					t.Fatalf("series %s and %s have one key", other, id)
				}
				seen[k] = id
			}
		}
	}
}

// TestAGaugeTwiceOnAPageCountsOnce: a gauge's series given twice was
// summed (waiting read twice the page's), where a counter's is taken at
// its first line, as Prometheus takes it; every kind is so now.
func TestAGaugeTwiceOnAPageCountsOnce(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := []byte("vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 2\n")
	for _, p := range bothWays(t, e, page) {
		if v, _ := p.Get(metric.Waiting); v != 5 {
			t.Errorf("waiting %v, want 5 (3 given twice, and 2)", v)
		}
	}
}

// bothWays is page extracted by e without counters and with new ones.
func bothWays(t *testing.T, e *Extractor, page []byte) []Page {
	t.Helper()
	var out []Page
	for _, c := range []*Counters{nil, NewCounters()} {
		p, err := e.ExtractWith(page, c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestARetiredSeriesBackWithoutRoomIsNotCountedTwice: a retired series
// keeps its last value in the pod's retired sum; back on the page while the
// budget had no room to follow it, its value was summed as the page has
// it as well, the counter up by the whole series (a spike), and down by as
// much once room freed and it was woken (read by the aggregator as a
// reset: the pod's whole counter counted again). Until there is room it
// now stays retired, at its last value; woken, it counts on from there.
func TestARetiredSeriesBackWithoutRoomIsNotCountedTwice(t *testing.T) {
	b := NewBudget(2, 2)
	e, _ := NewExtractor(nil)
	c := NewCountersIn(b, "ns")
	get := func(engines map[string]float64) float64 { t.Helper(); return generationTokens(t, e, c, engines) }
	get(map[string]float64{"0": 100, "1": 60})
	for range retireAfter + 1 {
		get(map[string]float64{"0": 100})
	}
	if len(c.asleep) != 1 {
		t.Fatalf("engine 1 not retired: asleep %v", c.asleep)
	}
	// Another pod of the namespace takes the room engine 1 gave back.
	other := NewCountersIn(b, "ns")
	if _, err := e.ExtractWith(dpPage(map[string]float64{"0": 1}, false), other); err != nil {
		t.Fatal(err)
	}
	last := 0.0
	for _, step := range []struct {
		engine1, want float64
		free          bool
	}{{60, 160, false}, {63, 160, false}, {64, 164, true}, {66, 166, false}} {
		if step.free {
			other.Release()
		}
		got := get(map[string]float64{"0": 100, "1": step.engine1})
		if got != step.want || got < last {
			t.Fatalf("engine 1 back at %v (room freed: %v): %v, want %v (and never below %v)", step.engine1, step.free, got, step.want, last)
		}
		last = got
	}
}

// TestALosingNamesSeriesGoneWithTheOthersIsNoPartOfIt: a page without a
// counter's value judged every name's series the winner, so a deprecated
// name's (SGLang's time_per_output_token beside inter_token_latency), gone
// with the other's while an engine restarted idle (its histograms empty
// until a request), was retired into the sum beside the winner's: counted
// twice, then taken back when the name came back, a drop the aggregator
// reads as a reset. A page without the value judges by the name that last
// made it.
func TestALosingNamesSeriesGoneWithTheOthersIsNoPartOfIt(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := func(itl, tpot float64) []byte {
		p := "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 0\n"
		if itl >= 0 {
			p += fmt.Sprintf("sglang:inter_token_latency_seconds_sum{model_name=\"m\"} %g\n", itl)
		}
		if tpot >= 0 {
			p += fmt.Sprintf("sglang:time_per_output_token_seconds_sum{model_name=\"m\"} %g\n", tpot)
		}
		return []byte(p)
	}
	c := NewCounters()
	var got []float64
	read := func(itl, tpot float64) {
		pg, err := e.ExtractWith(page(itl, tpot), c)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, pg.V[metric.ITLSum])
	}
	read(100, 40)
	for range retireAfter + 1 { // restarted, idle
		if _, err := e.ExtractWith(page(-1, -1), c); err != nil {
			t.Fatal(err)
		}
	}
	read(5, -1)
	read(6, 2)
	if want := []float64{100, 105, 106}; !slices.Equal(got, want) {
		t.Fatalf("itlSum %v, want %v (the losing name's 40 is no part of it)", got, want)
	}
}

// TestSeriesPastTheBudgetKeepNoRoom: a pod past its room (the node's
// budget, or its namespace's share, full) sums its new series as the page
// has them, and remembers each one's key for the scrape alone, to sum it
// once. The map of those keys was cleared at the next scrape but kept its
// room: a page of 16,000 such series held some 580 KB a pod for the pod's
// life, outside the budget that bounds the node's series state.
func TestSeriesPastTheBudgetKeepNoRoom(t *testing.T) {
	e, _ := NewExtractor(nil)
	c := NewCountersIn(NewBudget(1, 1), "ns")
	var page strings.Builder
	page.WriteString("# TYPE vllm:generation_tokens_total counter\n")
	for i := range 4000 {
		fmt.Fprintf(&page, "vllm:generation_tokens_total{engine=\"%d\",model_name=\"m\"} 1\n", i)
	}
	if _, err := e.ExtractWith([]byte(page.String()), c); err != nil {
		t.Fatal(err)
	}
	if len(c.raw) < 3000 {
		t.Fatalf("%d series summed past the budget, want the page's 3,999", len(c.raw))
	}
	if _, err := e.ExtractWith(dpPage(map[string]float64{"0": 1}, false), c); err != nil {
		t.Fatal(err)
	}
	if c.raw != nil {
		t.Fatalf("after a page of one series, the keys' map of the page before kept (%d now): its room is held", len(c.raw))
	}
}

// TestANegativeSeriesIsSkippedAlone: a gauge's series are summed (or, for
// KV cache usage, averaged) across engines, and a negative one was added
// in: an engine's −10 beside another's 7 made the pod's queue −3, which
// the aggregator refused, the 7 with it, and a KV usage of −0.9 beside
// 0.9 read as 0. A negative series is bad input, skipped alone, as a
// counter's is.
func TestANegativeSeriesIsSkippedAlone(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := []byte("vllm:num_requests_waiting{engine=\"0\"} 7\nvllm:num_requests_waiting{engine=\"1\"} -10\n" +
		"vllm:kv_cache_usage_perc{engine=\"0\"} 0.9\nvllm:kv_cache_usage_perc{engine=\"1\"} -0.9\n")
	for _, p := range bothWays(t, e, page) {
		if v, _ := p.Get(metric.Waiting); v != 7 {
			t.Errorf("waiting %v, want 7 (engine 1's −10 skipped)", v)
		}
		if v, _ := p.Get(metric.KVCacheUsage); v != 0.9 {
			t.Errorf("KV cache usage %v, want 0.9 (engine 1's −0.9 skipped)", v)
		}
	}
}

// TestACounterPastFloatsRangeHoldsItsLastValue: a series whose value after
// a restart, plus its offset, passed float64's range was skipped while
// marked seen, so neither summed nor added at its last value: the pod's
// counter fell by all of it, a reset to the aggregator, and the series
// was never counted again. Its last value stands. Two bucket series of
// 1e308 summed to +Inf counts: that histogram is left out.
func TestACounterPastFloatsRangeHoldsItsLastValue(t *testing.T) {
	e, err := NewExtractor(nil, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounters()
	prev := 0.0
	for i, v0 := range []string{"1e308", "0", "1e308", "1e308"} {
		page := []byte(fmt.Sprintf("vllm:generation_tokens_total{engine=\"0\"} %s\nvllm:generation_tokens_total{engine=\"1\"} %d\n", v0, 100+i))
		p, err := e.ExtractWith(page, c)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p.Get(metric.GenerationTokens)
		if !ok || math.IsInf(v, 0) || v < prev {
			t.Fatalf("scrape %d: generation tokens %v (%v) after %v: want it finite and never falling", i, v, ok, prev)
		}
		prev = v
	}
	hist := []byte("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\"} 1e308\nvllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"+Inf\"} 1e308\n" +
		"vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1\"} 1\nvllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"1\"} 1\n")
	p, err := e.Extract(hist)
	if err != nil {
		t.Fatal(err)
	}
	if p.Hist != nil && p.Hist[metric.TTFTHist].Bounds != nil {
		t.Fatalf("TTFT buckets %v: want the histogram summed past float64's range left out", p.Hist[metric.TTFTHist])
	}
}

// TestARestartSeenByItsStartTime: a server restarts, and within the scrape
// its TTFT count, small, is back past what it was (5 requests at 0.2 s
// before; 7 since, at 0.6 s), while its sum is too (1 s before; 4.2 since).
// Seen only as values not falling, each went on: the interval read 2 first
// tokens in 3.2 s, a mean of 1.6 s where 0.6 s was true. The page's
// process_start_time_seconds moved: every series counts again from zero.
// A start time that stays, or a page without one, changes nothing.
func TestARestartSeenByItsStartTime(t *testing.T) {
	e, _ := NewExtractor(nil)
	page := func(start string, count, sum float64) []byte {
		p := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n" +
			fmt.Sprintf("vllm:time_to_first_token_seconds_count{model_name=\"m\"} %g\nvllm:time_to_first_token_seconds_sum{model_name=\"m\"} %g\n", count, sum)
		if start != "" {
			p += "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " + start + "\n"
		}
		return []byte(p)
	}
	for _, tc := range []struct {
		name          string
		before, after string
		count, sum    float64 // what the interval adds
	}{
		{"restarted", "1.7e+09", "1.7000006e+09", 7, 4.2},
		{"the same server", "1.7e+09", "1.7e+09", 2, 3.2},
		{"no start time", "", "", 2, 3.2},
	} {
		c := NewCounters()
		first, err1 := e.ExtractWith(page(tc.before, 5, 1), c)
		second, err2 := e.ExtractWith(page(tc.after, 7, 4.2), c)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		get := func(pg Page, id metric.ID) float64 { v, _ := pg.Get(id); return v }
		count := get(second, metric.TTFTCount) - get(first, metric.TTFTCount)
		sum := get(second, metric.TTFTSum) - get(first, metric.TTFTSum)
		if math.Abs(count-tc.count) > 1e-9 || math.Abs(sum-tc.sum) > 1e-9 {
			t.Errorf("%s: the interval added %v first tokens in %v s, want %v in %v", tc.name, count, sum, tc.count, tc.sum)
		}
	}
}

// TestNothingAfterEOFIsRead: an OpenMetrics page ends at "# EOF"; a line
// after it is no part of the page (Prometheus refuses such a page). It was
// read: a second page's values summed with the first's (found in a
// review, 2026-12-07). The same for the full parse and a router's page.
func TestNothingAfterEOFIsRead(t *testing.T) {
	ex, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := "# TYPE vllm:num_requests_waiting gauge\n" +
		"vllm:num_requests_waiting{model_name=\"a\"} 3\n" +
		"# EOF \r\n" +
		"vllm:num_requests_waiting{model_name=\"b\"} 4\n"
	for _, c := range []*Counters{nil, NewCounters()} {
		p, err := ex.ExtractWith([]byte(page), c)
		if w, _ := p.Get(metric.Waiting); err != nil || w != 3 {
			t.Fatalf("waiting = %v (%v), want 3 (the line after # EOF read)", w, err)
		}
	}
	if p, err := ex.FullParse([]byte(page)); err != nil {
		t.Fatal(err)
	} else if w, _ := p.Get(metric.Waiting); w != 3 {
		t.Fatalf("full parse: waiting = %v, want 3", w)
	}
}

// startPage is a vLLM page with a TTFT count, and the server's start time
// when start is not "".
func startPage(start string, count float64) []byte {
	p := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n" +
		fmt.Sprintf("vllm:time_to_first_token_seconds_count{model_name=\"m\"} %g\n", count)
	if start != "" {
		p += "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " + start + "\n"
	}
	return []byte(p)
}

// TestAStartTimeThatWobblesIsNoRestart: a start time that moves by a
// rounding, or by the boot time's second (a client that derives it at
// each scrape), is the same process: taken as a restart, every count of
// the pod was added again (found in a review, 2026-12-07).
func TestAStartTimeThatWobblesIsNoRestart(t *testing.T) {
	e, _ := NewExtractor(nil)
	c := NewCounters()
	var got []float64
	for i, start := range []string{"1700000000.01", "1700000000.0100002", "1700000001.01"} {
		pg, err := e.ExtractWith(startPage(start, float64(1000+i)), c)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := pg.Get(metric.TTFTCount)
		got = append(got, v)
	}
	if got[1]-got[0] != 1 || got[2]-got[1] != 1 {
		t.Fatalf("the same process, one request a scrape: counts %v, want one more each", got)
	}
}

// TestAPageThatLacksItsStartTimeOnceCountsARestartOnce: a restart seen by
// its falls on a page without the start time was counted again when the
// start time came back moved (112 where 107 is true; found in a review).
func TestAPageThatLacksItsStartTimeOnceCountsARestartOnce(t *testing.T) {
	e, _ := NewExtractor(nil)
	c := NewCounters()
	var got []float64
	for _, p := range []struct {
		start string
		count float64
	}{{"1.7e+09", 100}, {"", 5}, {"1.7000006e+09", 7}} {
		pg, err := e.ExtractWith(startPage(p.start, p.count), c)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := pg.Get(metric.TTFTCount)
		got = append(got, v)
	}
	if !slices.Equal(got, []float64{100, 105, 107}) {
		t.Fatalf("monotonic counts %v, want [100 105 107] (the restart counted once)", got)
	}
}

// TestABadStartTimeLineHidesNothing: the start time is read apart from the
// page; a bad line of it (no number, past a line's labels) made the whole
// page a parse error, hiding the values pulse reads (found in a review).
// One with labels, or given twice, is not read.
func TestABadStartTimeLineHidesNothing(t *testing.T) {
	e, _ := NewExtractor(nil)
	for _, bad := range []string{
		"process_start_time_seconds 1.7e+09x\n",
		"process_start_time_seconds{a=\"1\",b=\"2\",c=\"3\",d=\"4\",e=\"5\",f=\"6\",g=\"7\",h=\"8\",i=\"9\",j=\"10\",k=\"11\",l=\"12\",m=\"13\",n=\"14\",o=\"15\",p=\"16\",q=\"17\"} 1.7e+09\n",
		"process_start_time_seconds 1.7e+09\nprocess_start_time_seconds 1.8e+09\n",
	} {
		page := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\n" + bad
		for _, c := range []*Counters{nil, NewCounters()} {
			p, err := e.ExtractWith([]byte(page), c)
			if w, _ := p.Get(metric.Waiting); err != nil || w != 3 {
				t.Fatalf("%q: waiting %v, %v; want 3 (the page's value, its start time left out)", bad, w, err)
			}
			if c != nil && c.start != 0 {
				t.Fatalf("%q: start time %v taken", bad, c.start)
			}
		}
	}
}
