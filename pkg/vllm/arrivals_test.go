package vllm

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/metric"
)

// TestARoutersArrivalsAreMonotonicPerSeries: a router's arrival counter of
// one model in several series (one per endpoint) is made monotonic per
// series before the sum: a series that goes away keeps its count (one gone
// dropped the sum, which the aggregator read as a reset of the whole
// counter: 1,002 arrivals counted for 2), one that restarts alone counts on
// from where it was, one retired that comes back continues, and a router
// restarted (the metric gone from its page, then counting from 0) adds only
// its new arrivals.
func TestARoutersArrivalsAreMonotonicPerSeries(t *testing.T) {
	e := newExtractor(t)
	d := DemandPresets["production-stack"]
	d.Match = "llama"
	arr := NewArrivals()
	var mono metric.Monotonic
	page := func(series ...string) []byte {
		var b strings.Builder
		b.WriteString("vllm:num_incoming_requests_total{model=\"phi\",server=\"a\"} 70\n")
		for i := 0; i+1 < len(series); i += 2 {
			fmt.Fprintf(&b, "vllm:num_incoming_requests_total{model=\"llama\",server=%q} %s\n", series[i], series[i+1])
		}
		return []byte(b.String())
	}
	var prev float64
	step := func(p []byte, want float64, what string) {
		t.Helper()
		got, err := e.ExtractDemand(p, &d, arr)
		if err != nil {
			t.Fatal(err)
		}
		v := metric.Values{}
		v.Set(metric.ArrivedRequests, got.V[metric.ArrivedRequests])
		mono.Adjust(&v)
		if inc := v.V[metric.ArrivedRequests] - prev; inc != want {
			t.Fatalf("%s: %v arrivals counted (the page's sum %v), want %v", what, inc, got.V[metric.ArrivedRequests], want)
		}
		prev = v.V[metric.ArrivedRequests]
	}
	step(page("a", "5", "b", "1000"), 1005, "the first page")
	step(page("b", "1002"), 2, "a gone")
	for range retireAfter + 1 {
		step(page("b", "1002"), 0, "a gone for longer")
	}
	step(page("a", "5", "b", "1003"), 1, "a back where it was")
	step(page("a", "1", "b", "1003"), 1, "a restarted alone")
	step([]byte("process_open_fds 9\n"), 0, "the router restarted: no series yet")
	step(page("a", "0", "b", "3"), 3, "the router counting again from 0")
	// Without the state the sum is the page's, as before.
	got, _ := e.ExtractDemand(page("b", "3"), &d, nil)
	if got.V[metric.ArrivedRequests] != 3 {
		t.Fatalf("no state: %v, want the page's 3", got.V[metric.ArrivedRequests])
	}
}

// TestArrivalsAreBounded: past maxArrivalSeries a new series is summed as
// the page has it, and at most maxArrivalsAsleep retired ones are
// remembered: a router of ever new series grows no state.
func TestArrivalsAreBounded(t *testing.T) {
	arr := NewArrivals()
	for scrape := range 3 * retireAfter {
		arr.scrape++
		for i := range 2 * maxArrivalSeries {
			arr.observe(uint64(scrape*10000+i), 1)
		}
		arr.finish()
	}
	if len(arr.series) > maxArrivalSeries || len(arr.asleep) > maxArrivalsAsleep {
		t.Fatalf("%d series followed, %d asleep: want at most %d and %d", len(arr.series), len(arr.asleep), maxArrivalSeries, maxArrivalsAsleep)
	}
}

// TestARetiredArrivalSeriesBackWithoutRoomIsCountedOnce: a retired series
// back while 256 others are followed was summed as the page has it beside
// its last value in the retired sum (200 for 100), and fell by as much
// once woken: a reset to the aggregator, every series' count new arrivals.
// It stays retired, at its value, until there is room.
func TestARetiredArrivalSeriesBackWithoutRoomIsCountedOnce(t *testing.T) {
	a := NewArrivals()
	step := func(vals map[uint64]float64) float64 {
		a.scrape++
		sum := 0.0
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			sum += a.observe(k, vals[k])
		}
		return sum + a.finish()
	}
	step(map[uint64]float64{0: 100})
	for range retireAfter {
		step(nil)
	}
	full := map[uint64]float64{}
	for k := range maxArrivalSeries {
		full[uint64(k+1)] = 0
	}
	if got := step(full); got != 100 {
		t.Fatalf("before it is back: %v, want 100", got)
	}
	full[0] = 100 // back, unchanged, with no room
	if got := step(full); got != 100 {
		t.Fatalf("back with no room: %v, want 100", got)
	}
	delete(full, 1) // room: it is woken
	for range retireAfter + 1 {
		if got := step(full); got != 100 {
			t.Fatalf("woken: %v, want 100", got)
		}
	}
}
