package sim

import (
	"math"
	"sort"
	"time"

	pulseplanner "github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

// Report is pulse-sim's output (report.json).
type Report struct {
	Config    ReportConfig      `json:"config"`
	Pipelines []*PipelineResult `json:"pipelines"`
	// ArrivalsPerSecond is the trace's rate per SampleEvery.
	ArrivalsPerSecond []float64 `json:"arrivalsPerSecond"`
}

// ReportConfig says what was simulated.
type ReportConfig struct {
	Trace           string   `json:"trace"`
	Requests        int      `json:"requests"`
	Profile         string   `json:"profile"`
	ScaledObject    string   `json:"scaledObject"`
	Metric          string   `json:"metric"`
	Threshold       float64  `json:"threshold"`
	Seed            uint64   `json:"seed"`
	TTFTSLOSeconds  float64  `json:"ttftSloSeconds"`
	Balancer        string   `json:"balancer"`
	SampleSeconds   float64  `json:"sampleSeconds"`
	HorizonSeconds  float64  `json:"horizonSeconds"`
	PipelineNames   []string `json:"pipelineNames"`
	ConfigTolerance bool     `json:"configurableTolerance"`
	// WarmupSeconds: what the *AfterWarmup scores leave out.
	WarmupSeconds float64 `json:"warmupSeconds"`
	// WarmStart: the signal pipelines and hindsight started with the fleet
	// the default clairvoyant plan has at 0, and at least their cold
	// start's (Config.WarmStart).
	WarmStart bool `json:"warmStart"`
	// ClientTimeoutSeconds: 0 when clients wait for ever.
	ClientTimeoutSeconds float64 `json:"clientTimeoutSeconds"`
	// Skipped: pipelines left out because they cannot express the
	// trigger (only when none were named), each with why.
	Skipped []string `json:"skipped,omitempty"`
}

// PipelineResult is one pipeline's score and time series.
type PipelineResult struct {
	Pipeline string `json:"pipeline"`
	// Requests offered.
	Requests int `json:"requests"`
	// TTFT percentiles (seconds, from arrival at the gateway) over every
	// request offered: one that got no first token (refused, abandoned,
	// dropped before it, or unserved by the horizon) ranks above every
	// first token, and a percentile that falls on one is null (no first
	// token: unbounded). Before 2026-12-02 they were over the requests
	// that got a first token alone, so a pipeline that lost requests
	// looked faster for it.
	TTFTP50 *float64 `json:"ttftP50"`
	TTFTP90 *float64 `json:"ttftP90"`
	TTFTP99 *float64 `json:"ttftP99"`
	// SLOAttainment: the fraction of requests with TTFT ≤ the SLO (requests
	// dropped, refused or never served count as misses).
	SLOAttainment float64 `json:"sloAttainment"`
	// GPUHours: replica-hours, starting and terminating replicas included,
	// times GPUs per replica, up to the horizon.
	GPUHours float64 `json:"gpuHours"`
	// SLOAfterWarmup: SLOAttainment of the requests arriving at or after
	// the warm-up; GPUHoursAfterWarmup: GPU-hours from the warm-up to the
	// last arrival (the drain after it is not charged).
	SLOAfterWarmup      float64 `json:"sloAfterWarmup"`
	GPUHoursAfterWarmup float64 `json:"gpuHoursAfterWarmup"`
	// GoodputPerGPUHour: requests arriving after the warm-up whose first
	// token came within the SLO, per GPU-hour after the warm-up (NVIDIA
	// Dynamo Planner Gym's score).
	GoodputPerGPUHour float64 `json:"goodputPerGpuHour"`
	MaxReplicas       int     `json:"maxReplicas"`
	// ScaleEvents: changes of the replica count; Reversals: those in the
	// opposite direction within 5 minutes of the previous one.
	ScaleEvents int `json:"scaleEvents"`
	Reversals   int `json:"reversals"`
	// FirstScaleUpSeconds: from the first load rise (the first second at
	// which the true metric asks for more replicas than run) to the first
	// scale-up; null when there was none.
	FirstScaleUpSeconds *float64 `json:"firstScaleUpSeconds"`
	// Dropped: in-flight requests dropped by a scale-down; Refused: over
	// the model's length; Abandoned: given up by their client before a
	// first token (--client-timeout); Unserved: none of those, and no
	// first token by the horizon.
	Dropped   int `json:"dropped"`
	Refused   int `json:"refused"`
	Abandoned int `json:"abandoned"`
	Unserved  int `json:"unserved"`
	// MetricErrors: HPA syncs at which the pipeline answered an error.
	MetricErrors int `json:"metricErrors"`

	Series Series `json:"series"`
}

// Series are sampled every SampleEvery.
type Series struct {
	Replicas []int     `json:"replicas"` // existing: starting, ready, terminating
	Ready    []int     `json:"ready"`
	Waiting  []int     `json:"waiting"` // on replicas and at the gateway
	TTFTP50  []float64 `json:"ttftP50"` // of first tokens in the interval; NaN-free: -1 when none
	TTFTP90  []float64 `json:"ttftP90"`
	// Plans: with Config.Explain, the planner's last plan at each sample
	// (a replicas trigger's explanation, as /debug/triggers shows it;
	// null before its first evaluation and after one that answered an
	// error), for the pulse pipeline when its trigger is the planner's;
	// absent otherwise.
	Plans []*pulseplanner.Plan `json:"plans,omitempty"`
}

// stats gathers one world's numbers.
type stats struct {
	requests     []*replica.Request
	first        []*replica.Request
	dropped      int
	droppedIDs   map[int]bool
	refused      int
	abandoned    int
	metricErrors int
	scaleEvents  int
	reversals    int
	lastDir      int
	lastEventAt  time.Duration
	firstUp      time.Duration
	loadRise     time.Duration
	gpuSeconds   float64
	gpuWarm      float64 // GPU-seconds from the warm-up to the last arrival
	warmup       time.Duration
	scoreEnd     time.Duration // the last arrival
	lastAcct     time.Duration
	gpus         int
	maxReplicas  int
	series       Series
	binStart     int // index into first of the current sample bin
}

func (s *stats) init(cfg *Config) {
	s.firstUp, s.loadRise, s.lastEventAt = -1, -1, -1
	s.gpus = cfg.Profile.GPUs
	s.droppedIDs = map[int]bool{}
	s.warmup = max(cfg.Warmup, 0)
	s.scoreEnd = cfg.Trace[len(cfg.Trace)-1].At
}

// FirstToken and Finished make stats the replicas' observer.
func (s *stats) FirstToken(q *replica.Request) { s.first = append(s.first, q) }
func (s *stats) Finished(*replica.Request)     {}

// account integrates replica-time up to t.
func (s *stats) account(w *world, t time.Duration) {
	if t > s.lastAcct {
		g := float64(len(w.reps) * s.gpus)
		s.gpuSeconds += g * (t - s.lastAcct).Seconds()
		// The drain after the last arrival is charged to no one's scored
		// GPU-hours: a fixed fleet cannot give its replicas back there,
		// and how fast an autoscaler empties an idle fleet at the end of a
		// trace is not what it is judged on.
		if from, to := max(s.lastAcct, s.warmup), min(t, s.scoreEnd); to > from {
			s.gpuWarm += g * (to - from).Seconds()
		}
		s.lastAcct = t
	}
	s.maxReplicas = max(s.maxReplicas, len(w.reps))
}

func (s *stats) scaleEvent(now time.Duration, from, to int32) {
	dir := 1
	if to < from {
		dir = -1
	}
	if dir > 0 && s.firstUp < 0 {
		s.firstUp = now
	}
	if s.lastDir != 0 && dir != s.lastDir && now-s.lastEventAt <= 5*time.Minute {
		s.reversals++
	}
	s.scaleEvents++
	s.lastDir, s.lastEventAt = dir, now
}

func (s *stats) sample(w *world) {
	readyN, waiting := len(w.ready), len(w.gate)
	for _, rp := range w.reps {
		w.touch(rp)
		waiting += rp.r.Waiting()
	}
	s.series.Replicas = append(s.series.Replicas, len(w.reps))
	s.series.Ready = append(s.series.Ready, readyN)
	s.series.Waiting = append(s.series.Waiting, waiting)
	bin := s.first[s.binStart:]
	s.binStart = len(s.first)
	vals := make([]float64, len(bin))
	for i, q := range bin {
		vals[i] = (q.FirstToken - q.Arrival).Seconds()
	}
	sort.Float64s(vals)
	s.series.TTFTP50 = append(s.series.TTFTP50, quantile(vals, 0.5))
	s.series.TTFTP90 = append(s.series.TTFTP90, quantile(vals, 0.9))
	if e, ok := w.pipe.(explainer); ok && w.cfg.Explain {
		if plan, plans := e.lastPlan(); plans {
			s.series.Plans = append(s.series.Plans, plan)
		}
	}
}

// explainer is a pipeline that runs pulse's scaler: lastPlan is the plan
// of its last evaluation (nil before one, and after one that answered an
// error), taken as it was evaluated: sampling it evaluates nothing, so
// the run is the same with Config.Explain as without; plans says whether
// its trigger is the planner's (no plan otherwise).
type explainer interface {
	lastPlan() (plan *pulseplanner.Plan, plans bool)
}

// quantile of sorted values (nearest rank); -1 when empty.
func quantile(sorted []float64, q float64) float64 {
	if v := ttftPercentile(sorted, len(sorted), q); v != nil {
		return *v
	}
	return -1
}

// ttftPercentile is the q-quantile of the TTFTs of offered requests, of
// which sorted are those that got a first token (sorted, or with the value
// at q's rank in place: ttftPercentiles): the others rank above them all,
// and a quantile that falls on one is nil (as is any of none).
func ttftPercentile(sorted []float64, offered int, q float64) *float64 {
	i := rank(q, offered)
	if offered == 0 || i >= len(sorted) {
		return nil
	}
	v := round(sorted[i])
	return &v
}

// rank is the index of the q-quantile of n values (nearest rank).
func rank(q float64, n int) int { return max(int(math.Ceil(q*float64(n)))-1, 0) }

// ttftPercentiles are ttftPercentile's at qs (ascending: a lower q after a
// higher one would read a value not selected) of vals, which
// need not be sorted: each value read is put at its rank by a selection
// (selectRank), where a sort of every TTFT of a run was 7 % of a suite's
// time. vals is reordered.
func ttftPercentiles(vals []float64, offered int, qs ...float64) []*float64 {
	out := make([]*float64, len(qs))
	from := 0
	for n, q := range qs {
		if i := rank(q, offered); i >= from && i < len(vals) {
			selectRank(vals[from:], i-from)
			from = i + 1
		}
		out[n] = ttftPercentile(vals, offered, q)
	}
	return out
}

// selectRank reorders a so that a[k] is the value a sort would put there,
// with none larger before it and none smaller after it (quickselect, the
// pivot the median of three).
func selectRank(a []float64, k int) {
	lo, hi := 0, len(a)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		if a[mid] < a[lo] {
			a[mid], a[lo] = a[lo], a[mid]
		}
		if a[hi] < a[lo] {
			a[hi], a[lo] = a[lo], a[hi]
		}
		if a[hi] < a[mid] {
			a[hi], a[mid] = a[mid], a[hi]
		}
		p, i, j := a[mid], lo, hi
		for i <= j {
			for a[i] < p {
				i++
			}
			for a[j] > p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch { // a[lo..j] ≤ p ≤ a[i..hi], and what lies between is p
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return
		}
	}
}

func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }

func (s *stats) result(w *world) *PipelineResult {
	slo := w.cfg.TTFTSLO
	ttfts := make([]float64, 0, len(s.first))
	met, metWarm := 0, 0
	served := 0
	for _, q := range s.first {
		d := q.FirstToken - q.Arrival
		ttfts = append(ttfts, d.Seconds())
		if s.droppedIDs[q.ID] {
			continue
		}
		served++
		if d <= slo {
			met++
			if q.Arrival >= s.warmup {
				metWarm++
			}
		}
	}
	afterWarm := 0
	for _, q := range s.requests {
		if q.Arrival >= s.warmup {
			afterWarm++
		}
	}
	pct := ttftPercentiles(ttfts, len(s.requests), 0.5, 0.9, 0.99)
	r := &PipelineResult{
		Requests: len(s.requests), TTFTP50: pct[0], TTFTP90: pct[1], TTFTP99: pct[2],
		GPUHours: round(s.gpuSeconds / 3600), MaxReplicas: s.maxReplicas, ScaleEvents: s.scaleEvents, Reversals: s.reversals,
		Dropped: s.dropped, Refused: s.refused, Abandoned: s.abandoned, Unserved: len(s.requests) - served - s.refused - s.dropped - s.abandoned,
		MetricErrors: s.metricErrors, Series: s.series, GPUHoursAfterWarmup: round(s.gpuWarm / 3600),
	}
	if len(s.requests) > 0 {
		r.SLOAttainment = round(float64(met) / float64(len(s.requests)))
	}
	if afterWarm > 0 {
		r.SLOAfterWarmup = round(float64(metWarm) / float64(afterWarm))
	}
	if s.gpuWarm > 0 {
		r.GoodputPerGPUHour = round(float64(metWarm) / (s.gpuWarm / 3600))
	}
	if s.firstUp >= 0 && s.loadRise >= 0 {
		v := round(math.Max(0, (s.firstUp - s.loadRise).Seconds()))
		r.FirstScaleUpSeconds = &v
	}
	return r
}

func newReport(cfg *Config, results []*PipelineResult) *Report {
	r := &Report{Pipelines: results, Config: ReportConfig{
		Trace: cfg.TraceName, Requests: len(cfg.Trace), Profile: cfg.Profile.Name, ScaledObject: cfg.ScaledObject.Metadata.Name,
		Metric: cfg.trigger.Metric, Threshold: cfg.trigger.Threshold, Seed: cfg.Seed, TTFTSLOSeconds: cfg.TTFTSLO.Seconds(),
		Balancer: cfg.Balancer, SampleSeconds: cfg.SampleEvery.Seconds(), HorizonSeconds: cfg.horizon.Seconds(),
		PipelineNames: cfg.Pipelines, ConfigTolerance: cfg.HPA.ConfigurableTolerance,
		WarmupSeconds: max(cfg.Warmup, 0).Seconds(), WarmStart: cfg.WarmStart, ClientTimeoutSeconds: cfg.ClientTimeout.Seconds(), Skipped: cfg.skipped,
	}}
	rates := trace.Rate(cfg.Trace, cfg.SampleEvery)
	for i := range rates {
		rates[i] = round(rates[i])
	}
	r.ArrivalsPerSecond = rates
	return r
}
