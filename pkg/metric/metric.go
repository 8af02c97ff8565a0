// Package metric defines pulse's metrics: the raw values an agent
// reads (gauges and cumulative counters, one fixed id each, as on the wire)
// and the canonical metrics that triggers scale on, derived from them.
package metric

import (
	"math"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// ID is a raw value's id; it equals the wire's pulsev1.Metric.
type ID uint8

// The raw ids.
const (
	Waiting          = ID(pulsev1.Metric_METRIC_WAITING)
	Running          = ID(pulsev1.Metric_METRIC_RUNNING)
	Swapped          = ID(pulsev1.Metric_METRIC_SWAPPED)
	KVCacheUsage     = ID(pulsev1.Metric_METRIC_KV_CACHE_USAGE)
	PrefixHits       = ID(pulsev1.Metric_METRIC_PREFIX_CACHE_HITS)
	PrefixQueries    = ID(pulsev1.Metric_METRIC_PREFIX_CACHE_QUERIES)
	PromptTokens     = ID(pulsev1.Metric_METRIC_PROMPT_TOKENS)
	GenerationTokens = ID(pulsev1.Metric_METRIC_GENERATION_TOKENS)
	RequestSuccess   = ID(pulsev1.Metric_METRIC_REQUEST_SUCCESS)
	Preemptions      = ID(pulsev1.Metric_METRIC_PREEMPTIONS)
	TTFTSum          = ID(pulsev1.Metric_METRIC_TTFT_SUM)
	TTFTCount        = ID(pulsev1.Metric_METRIC_TTFT_COUNT)
	QueueTimeSum     = ID(pulsev1.Metric_METRIC_QUEUE_TIME_SUM)
	QueueTimeCount   = ID(pulsev1.Metric_METRIC_QUEUE_TIME_COUNT)
	E2ELatencySum    = ID(pulsev1.Metric_METRIC_E2E_LATENCY_SUM)
	E2ELatencyCount  = ID(pulsev1.Metric_METRIC_E2E_LATENCY_COUNT)
	ITLSum           = ID(pulsev1.Metric_METRIC_ITL_SUM)
	ITLCount         = ID(pulsev1.Metric_METRIC_ITL_COUNT)
	GPUUtilization   = ID(pulsev1.Metric_METRIC_GPU_UTILIZATION)
	GPUMemoryUsage   = ID(pulsev1.Metric_METRIC_GPU_MEMORY_USAGE)
	PendingRequests  = ID(pulsev1.Metric_METRIC_PENDING_REQUESTS)
	ArrivedRequests  = ID(pulsev1.Metric_METRIC_ARRIVED_REQUESTS)

	// NumIDs bounds the ids: every ID is < NumIDs.
	NumIDs = 23
)

// Kind says how a raw value behaves over time.
type Kind uint8

const (
	// Gauge values go up and down; a window averages them.
	Gauge Kind = iota + 1
	// Counter values only grow, except when the server restarts (a reset).
	Counter
)

type rawInfo struct {
	name  string
	kind  Kind
	scale int // decimal digits carried on the wire
}

var raws = [NumIDs]rawInfo{
	Waiting:          {"waiting", Gauge, 0},
	Running:          {"running", Gauge, 0},
	Swapped:          {"swapped", Gauge, 0},
	KVCacheUsage:     {"kvCacheUsage", Gauge, 4},
	PrefixHits:       {"prefixCacheHits", Counter, 0},
	PrefixQueries:    {"prefixCacheQueries", Counter, 0},
	PromptTokens:     {"promptTokens", Counter, 0},
	GenerationTokens: {"generationTokens", Counter, 0},
	RequestSuccess:   {"requestSuccess", Counter, 0},
	Preemptions:      {"preemptions", Counter, 0},
	TTFTSum:          {"ttftSum", Counter, 3},
	TTFTCount:        {"ttftCount", Counter, 0},
	QueueTimeSum:     {"queueTimeSum", Counter, 3},
	QueueTimeCount:   {"queueTimeCount", Counter, 0},
	E2ELatencySum:    {"e2eLatencySum", Counter, 3},
	E2ELatencyCount:  {"e2eLatencyCount", Counter, 0},
	ITLSum:           {"itlSum", Counter, 3},
	ITLCount:         {"itlCount", Counter, 0},
	GPUUtilization:   {"gpuUtilization", Gauge, 4},
	GPUMemoryUsage:   {"gpuMemoryUsage", Gauge, 4},
	PendingRequests:  {"pendingRequests", Gauge, 0},
	ArrivedRequests:  {"arrivedRequests", Counter, 0},
}

// NumCounters is how many raw values are counters (Kind Counter).
const NumCounters = 15

// counterIndex numbers the counters 0 … NumCounters-1 in id order, so that
// state kept for counters only is an array of NumCounters; -1 for the rest.
var counterIndex = func() (ix [NumIDs]int8) {
	n := int8(0)
	for id := range ix {
		ix[id] = -1
		if raws[id].kind == Counter {
			ix[id], n = n, n+1
		}
	}
	if n != NumCounters {
		panic("metric: NumCounters is not the number of counters")
	}
	return ix
}()

// CounterIndex is id's place among the counters (0 … NumCounters-1), or -1
// when id is not a counter.
func (id ID) CounterIndex() int {
	if id >= NumIDs {
		return -1
	}
	return int(counterIndex[id])
}

// Valid reports whether id names a raw value.
func (id ID) Valid() bool { return id > 0 && id < NumIDs }

// Name is the raw value's name in logs and debug output.
func (id ID) Name() string {
	if !id.Valid() {
		return "unknown"
	}
	return raws[id].name
}

// Kind is the raw value's kind.
func (id ID) Kind() Kind { return raws[id].kind }

// Ratio says whether id is a fraction, 0 to 1 (the KV cache's usage, the
// GPUs' utilization and memory used): a value above 1 is past belief.
func (id ID) Ratio() bool {
	return id == KVCacheUsage || id == GPUUtilization || id == GPUMemoryUsage
}

// Scale is the number of decimal digits the wire carries for id: values are
// sent as round(v·10^Scale). Counts are exact; ratios keep 4 digits
// (0.01%); seconds are carried in milliseconds.
func (id ID) Scale() int { return raws[id].scale }

// Values is one pod's raw values at one instant. Present has bit id set for
// each value that was read; an absent value is absent, never 0.
type Values struct {
	Present uint64
	V       [NumIDs]float64
}

// Set records v for id.
func (v *Values) Set(id ID, x float64) {
	v.Present |= 1 << id
	v.V[id] = x
}

// Has reports whether id is present.
func (v *Values) Has(id ID) bool { return v.Present&(1<<id) != 0 }

// Get returns id's value and whether it is present: 0 when it is not.
// An absent value's slot is not cleared (the store decodes a pod's samples
// into a pooled buffer, clearing only the present bits), so it may hold
// what another pod, of any tenant, had there: read whole, an absent
// waiting gauge beside running 0 read another's waiting, and an idle pod
// read busy.
func (v *Values) Get(id ID) (float64, bool) {
	if !v.Has(id) {
		return 0, false
	}
	return v.V[id], true
}

// Quantize rounds x to id's wire resolution, as the receiver will see it.
func Quantize(id ID, x float64) float64 {
	p := pow10[id.Scale()]
	return math.RoundToEven(x*p) / p
}

var pow10 = [...]float64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// Pow10 returns 10^scale for a scale returned by Scale.
func Pow10(scale int) float64 { return pow10[scale] }
