package vllm

import (
	"math"
	"testing"
)

// TestARatioSeriesAboveOneIsSkippedAlone: KV-cache usage is a fraction. One
// engine's series past 1 was averaged with the others: 1.5 beside 0.3 made
// the pod's usage 0.9, passed on as real; 50000 beside 0.3 made it 25000,
// which the aggregator refuses whole, the good engine's 0.3 with it. The
// series is skipped alone, as a negative one is.
func TestARatioSeriesAboveOneIsSkippedAlone(t *testing.T) {
	e := newExtractor(t)
	for name, page := range map[string]string{
		"a little past 1": "vllm:kv_cache_usage_perc{engine=\"0\"} 1.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.3\n",
		"far past 1":      "vllm:kv_cache_usage_perc{engine=\"0\"} 50000\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.3\n",
		"sglang":          "sglang:token_usage{dp=\"0\"} 7\nsglang:token_usage{dp=\"1\"} 0.3\n",
	} {
		t.Run(name, func(t *testing.T) {
			for _, c := range []*Counters{nil, NewCounters()} {
				p, err := e.ExtractWith([]byte(page), c)
				if err != nil {
					t.Fatal(err)
				}
				if got := named(p, nil)["kvCacheUsage"]; math.Abs(got-0.3) > 1e-12 {
					t.Errorf("kvCacheUsage = %v, want 0.3 (the series past 1 skipped alone)", got)
				}
			}
		})
	}
}

// TestASeriesGivenAgainUnderAnotherSpellingIsReadOnce: a series given
// twice is read once, its first line holding; two spellings of one series
// were read as two and summed. le="0.1" and le="0.10" are one bucket
// (Prometheus reads le as a number): its count was 10, not 5, and the
// +Inf bucket raised to it, a histogram of 10 requests where the page has
// 7. A label of no value is none (Prometheus drops it): {engine="0",x=""}
// is {engine="0"} again, and the queue was counted twice.
func TestASeriesGivenAgainUnderAnotherSpellingIsReadOnce(t *testing.T) {
	e := newExtractor(t)
	for page, want := range map[string]map[string]float64{
		"vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\"} 5\n" +
			"vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.10\"} 5\n" +
			"vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\"} 7\n": {"hist:ttft{le=0.1}": 5, "hist:ttft{le=+Inf}": 7},
		"vllm:num_requests_waiting{engine=\"0\"} 5\n" +
			"vllm:num_requests_waiting{engine=\"0\",x=\"\"} 5\n" +
			"vllm:generation_tokens_total{engine=\"0\"} 100\n" +
			"vllm:generation_tokens_total{x=\"\",engine=\"0\"} 100\n": {"waiting": 5, "generationTokens": 100},
	} {
		for _, c := range []*Counters{nil, NewCounters()} {
			p, err := e.ExtractWith([]byte(page), c)
			if err != nil {
				t.Fatal(err)
			}
			got := named(p, nil)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("counters %v: %s %v, want %v (the first line holds)\n%s", c != nil, k, got[k], v, page)
				}
			}
		}
	}
}

// TestADemandLabelWithBlanksAroundItsEqualsIsRead: the text format allows
// blanks around a label's '=' (expfmt reads `model = "llama"`); such a
// router's line was passed over unread, and the workload's demand read 0
// (no error: a workload with 3 requests waiting read as idle).
func TestADemandLabelWithBlanksAroundItsEqualsIsRead(t *testing.T) {
	e := newExtractor(t)
	d := &Demand{Metrics: []string{"q"}, Label: "model", Match: "llama"}
	for _, page := range []string{"q{model =\"llama\"} 3\n", "q{model= \"llama\"} 3\n", "q{a=\"b\", model\t=\t\"llama\"} 3\n"} {
		p, err := e.ExtractDemand([]byte(page), d, nil)
		if got := named(p, nil)["pendingRequests"]; err != nil || got != 3 {
			t.Errorf("%q: pendingRequests %v (%v), want 3", page, got, err)
		}
	}
}

// TestADemandLabelOfAQuotedNameIsRead: the text format allows any label
// name written quoted ({"model"="llama"}: Prometheus 3's UTF-8 names,
// written so by a client asked for them), and expfmt, which reads the
// kept lines, reads it as the label model. Such a router's line was
// passed over unread, as one with a blank beside its '=' was: the
// workload's demand read 0, no error.
func TestADemandLabelOfAQuotedNameIsRead(t *testing.T) {
	e := newExtractor(t)
	d := &Demand{Metrics: []string{"q"}, Label: "model", Match: "llama"}
	for _, page := range []string{"q{\"model\"=\"llama\"} 3\n", "q{a=\"b\",\"model\" = \"llama\"} 3\n"} {
		p, err := e.ExtractDemand([]byte(page), d, nil)
		if got := named(p, nil)["pendingRequests"]; err != nil || got != 3 {
			t.Errorf("%q: pendingRequests %v (%v), want 3", page, got, err)
		}
	}
	// Not a quoted name within another label's value (its quotes escaped).
	p, err := e.ExtractDemand([]byte("q{x=\"a,\\\"model\\\"=\\\"llama\\\"\"} 3\n"), d, nil)
	if got := named(p, nil)["pendingRequests"]; err != nil || got != 0 {
		t.Errorf("a quoted name in a value: pendingRequests %v (%v), want 0", got, err)
	}
}
