package vllm

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// TestFastPathAgreesWithFullParse compares the fast path with a full expfmt
// parse of every family over many simulated pages (random load, engines,
// models, V0 and V1, counters moved by the queueing model) and the real pages.
func TestFastPathAgreesWithFullParse(t *testing.T) {
	e := newExtractor(t, "vllm:cpu_cache_usage_perc:mean", "process_open_fds")
	rng := rand.New(rand.NewPCG(1, 2))
	pages := goldenPages(t)
	for i := range 200 {
		opts := vllmsim.Options{Engines: 1 + rng.IntN(4), V0: rng.IntN(4) == 0, Seed: uint64(i)}
		if rng.IntN(3) == 0 {
			opts.Models = []string{"a", "b"}
		}
		s := vllmsim.New(opts)
		s.SetModel(vllmsim.QueueModel{ArrivalRate: rng.Float64() * 50, BatchCapacity: 1 + rng.IntN(32), ServiceRate: 0.2 + rng.Float64()})
		for range rng.IntN(50) {
			s.Step(0.1)
		}
		pages[fmt.Sprintf("random-%d", i)] = s.Page(false)
	}
	for name, page := range pages {
		if name == "sim-v1-engine0-engine1-openmetrics" {
			continue // the full text parser does not read OpenMetrics; the golden test covers it
		}
		fast, err := e.Extract(page)
		if err != nil {
			t.Fatalf("%s: fast: %v", name, err)
		}
		full, err := e.FullParse(page)
		if err != nil {
			t.Fatalf("%s: full: %v", name, err)
		}
		if fast.Values != full.Values || !reflect.DeepEqual(fast.Hist, full.Hist) {
			t.Errorf("%s: fast %v\nfull %v", name, named(fast, nil), named(full, nil))
		}
		for i := range fast.Extra {
			if a, b := fast.Extra[i], full.Extra[i]; a != b && !(math.IsNaN(a) && math.IsNaN(b)) {
				t.Errorf("%s: extra %d: fast %v full %v", name, i, a, b)
			}
		}
	}
}

// FuzzExtract: no input panics the extractor, and when both the fast path and
// the full parse accept a page they agree on every value: which are
// present, what each is, and the extra metric's (only the values were
// compared: a value present as 0 on one side and absent on the other, and
// the extra metric, passed).
func FuzzExtract(f *testing.F) {
	// Small seeds keep the fuzzer fast; the full pages are in the tests above.
	v1 := simPage(vllmsim.Options{Engines: 2}, func(s *vllmsim.Server) { s.Complete(2, 1) }, false)
	for _, p := range [][]byte{
		v1[bytes.Index(v1, []byte("# HELP vllm:num_requests_running")):bytes.Index(v1, []byte("# HELP vllm:request_prompt_tokens "))],
		mustRead(f, "testdata/vllm-project-aibrix__v0-0.6-qwen2.5-coder-PARTIAL.txt"),
		[]byte("vllm:num_requests_waiting{engine=\"0\"} 3\n"),
		[]byte("vllm:num_requests_waiting{a=\"\\\"}\"} 3 123\n# EOF"),
	} {
		f.Add(p)
	}
	e, err := NewExtractor([]ExtraMetric{{Name: "x", Combine: "max"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		fast, ferr := e.Extract(page)
		if ferr != nil {
			return
		}
		full, err := e.FullParse(page)
		if err != nil {
			return // the fast path skips families it does not read, errors included
		}
		for id := range fast.V {
			a, b := fast.V[id], full.V[id]
			if lossyCount(metric.ID(id), a) {
				continue
			}
			if fast.Has(metric.ID(id)) != full.Has(metric.ID(id)) {
				t.Fatalf("value %d: present in fast %v, in full %v", id, fast.Has(metric.ID(id)), full.Has(metric.ID(id)))
			}
			if a != b && !(math.IsNaN(a) && math.IsNaN(b)) {
				t.Fatalf("value %d: fast %v full %v", id, a, b)
			}
		}
		if len(fast.Extra) != len(full.Extra) {
			t.Fatalf("extra: fast %v full %v", fast.Extra, full.Extra)
		}
		for i := range fast.Extra {
			if a, b := fast.Extra[i], full.Extra[i]; a != b && !(math.IsNaN(a) && math.IsNaN(b)) {
				t.Fatalf("extra %d: fast %v full %v", i, a, b)
			}
		}
	})
}

// lossyCount: expfmt's full parse stores a histogram count as an unsigned
// integer, so a _count line that is negative, fractional or huge differs
// there; pulse keeps the float the page says.
func lossyCount(id metric.ID, a float64) bool {
	switch id {
	case metric.TTFTCount, metric.QueueTimeCount, metric.E2ELatencyCount, metric.ITLCount:
		return !(a >= 0 && a < 1<<53 && math.Trunc(a) == a)
	}
	return false
}

var sink Page

func BenchmarkExtract(b *testing.B) {
	for _, engines := range []int{1, 4} {
		s := vllmsim.New(vllmsim.Options{Engines: engines, Seed: 7})
		s.SetModel(vllmsim.QueueModel{ArrivalRate: 40, BatchCapacity: 16, ServiceRate: 1})
		for range 100 {
			s.Step(0.1)
		}
		page := s.Page(false)
		e, err := NewExtractor(nil)
		if err != nil {
			b.Fatal(err)
		}
		eh, err := NewExtractor(nil, WithHistograms())
		if err != nil {
			b.Fatal(err)
		}
		for name, read := range map[string]func([]byte) (Page, error){
			"full-expfmt": e.FullParse, "pulse": e.Extract, "pulse+histograms": eh.Extract,
		} {
			b.Run(fmt.Sprintf("engines=%d/%s", engines, name), func(b *testing.B) {
				b.SetBytes(int64(len(page)))
				b.ReportAllocs()
				for b.Loop() {
					sink, _ = read(page)
				}
			})
		}
	}
}

// TestBothPathsKeepTheFirstOfASeriesAndSkipANegativeBucket: a series given
// twice (its labels in another order) holds its first line on the full
// parse as on the fast path (the full parse added both, so the fuzzer's
// comparison flagged the right answer), and a negative bucket count says
// nothing without counter state either, as a negative gauge says nothing
// (Extract summed it: -10 and 7 made -3). (The full parse reads a
// histogram's counts as unsigned: a page with a negative one fails it.)
func TestBothPathsKeepTheFirstOfASeriesAndSkipANegativeBucket(t *testing.T) {
	e := newExtractor(t)
	dup := []byte(`vllm:num_requests_waiting{a="1",b="2"} 3
vllm:num_requests_waiting{b="2",a="1"} 3
`)
	neg := []byte(`vllm:num_requests_waiting 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} -10
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} -10
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1"} 7
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 9
`)
	paths := map[string]func([]byte) (Page, error){"Extract": e.Extract, "FullParse": e.FullParse,
		"ExtractWith": func(b []byte) (Page, error) { return e.ExtractWith(b, NewCounters()) }}
	for name, parse := range paths {
		p, err := parse(dup)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := p.Get(metric.Waiting); v != 3 {
			t.Errorf("%s: waiting %v, want 3 (the series' first line)", name, v)
		}
		if name == "FullParse" {
			continue
		}
		if p, err = parse(neg); err != nil {
			t.Fatal(err)
		}
		got := named(p, nil)
		lo, okLo := got["hist:ttft{le=0.1}"]
		inf, okInf := got["hist:ttft{le=+Inf}"]
		if !okLo || !okInf || lo != 7 || inf != 9 {
			t.Errorf("%s: TTFT buckets %v (%v) and %v (%v), want 7 and 9 (engine 0's negative counts skipped): %v", name, lo, okLo, inf, okInf, got)
		}
	}
}

// TestALatencyBucketAtOrBelowZeroIsSkippedAlone: no bucket of a latency
// histogram holds a duration of 0 or less, so such a bucket is skipped
// alone on every path, the histogram's others kept. Sent, one pod's
// bucket at -100 left its workload's pods, merged on the bounds they
// share, only the +Inf bucket, and the quantile Unavailable.
func TestALatencyBucketAtOrBelowZeroIsSkippedAlone(t *testing.T) {
	e := newExtractor(t)
	page := []byte(`# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="-100"} 5
vllm:time_to_first_token_seconds_bucket{le="0"} 5
vllm:time_to_first_token_seconds_bucket{le="0.5"} 7
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 9
vllm:time_to_first_token_seconds_sum 3
vllm:time_to_first_token_seconds_count 9
`)
	paths := map[string]func([]byte) (Page, error){"Extract": e.Extract, "FullParse": e.FullParse,
		"ExtractWith": func(b []byte) (Page, error) { return e.ExtractWith(b, NewCounters()) }}
	for name, parse := range paths {
		p, err := parse(page)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Hist == nil {
			t.Fatalf("%s: no histogram; want the buckets at 0.5 and +Inf", name)
		}
		h := p.Hist[metric.TTFTHist]
		if !slices.Equal(h.Bounds, []float64{0.5, math.Inf(1)}) || !slices.Equal(h.Counts, []float64{7, 9}) {
			t.Errorf("%s: TTFT bounds %v counts %v; want [0.5 +Inf] and [7 9]", name, h.Bounds, h.Counts)
		}
	}
}
