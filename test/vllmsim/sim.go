// Package vllmsim is a simulated vLLM server: it serves a realistic vLLM
// /metrics page (V1 naming with model_name and engine labels on every series,
// vLLM's histogram families and buckets; optionally V0 naming), and its load
// is either set directly or driven by a simple queueing model. Tests, the
// local demo and the benchmarks use it.
package vllmsim

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// DefaultModel is the model_name of a simulated server.
const DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"

// Options shape a simulated server.
type Options struct {
	// Models served (model_name label); default one, DefaultModel.
	Models []string
	// Engines is the number of data-parallel engine ranks per model (V1); default 1.
	Engines int
	// V0 switches to vLLM V0 naming: model_name only, gpu_cache_usage_perc,
	// num_requests_swapped, time_per_output_token_seconds.
	V0 bool
	// Seed makes the queueing model and the histogram shapes repeatable.
	Seed uint64
	// LoadTime is the simulated model load: until it has passed since New,
	// /health and /metrics answer 503, as a vLLM server that has not
	// finished loading its weights serves nothing.
	LoadTime time.Duration
}

// series is the state of one (model, engine) pair.
type series struct {
	model, engine string

	waiting, running, swapped, kv float64

	preemptions, promptTokens, genTokens, prefixQueries, prefixHits float64
	success                                                         [3]float64 // stop, length, abort

	ttft, tpot, itl, e2e, queue, inference, prefill, decode histogram
	promptLen, genLen, iteration, maxGen, paramsN           histogram

	// The queueing model's requests: arrival times of waiting requests and
	// (arrival, start) of running ones, in simulated seconds.
	queued  []float64
	serving [][2]float64
}

var finishedReasons = [3]string{"stop", "length", "abort"}

func newSeries(model string, engine int) *series {
	return &series{
		model: model, engine: strconv.Itoa(engine),
		ttft: newHistogram(ttftBuckets), tpot: newHistogram(itlBuckets), itl: newHistogram(itlBuckets),
		e2e: newHistogram(latencyBuckets), queue: newHistogram(latencyBuckets),
		inference: newHistogram(latencyBuckets), prefill: newHistogram(latencyBuckets),
		decode: newHistogram(latencyBuckets), promptLen: newHistogram(tokenBuckets),
		genLen: newHistogram(tokenBuckets), iteration: newHistogram(iterationBuckets),
		maxGen: newHistogram(tokenBuckets), paramsN: newHistogram(paramsNBuckets),
	}
}

// Server is one simulated vLLM server. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	readyAt time.Time // the end of the simulated model load
	created float64

	mu        sync.Mutex
	series    []*series
	rng       *rand.Rand
	hangUntil time.Time  // /metrics requests before it wait until then
	pin       Load       // gauges set by SetLoad, held until ReleaseLoad
	model     QueueModel // the queueing model in force
	held      bool       // model was set by SetModel: Drive leaves it alone
	driven    QueueModel // the driver's model, in force again after ReleaseModel
	clock     float64    // simulated seconds of the queueing model
}

// New returns a server with no load.
func New(opts Options) *Server {
	if len(opts.Models) == 0 {
		opts.Models = []string{DefaultModel}
	}
	if opts.Engines <= 0 || opts.V0 {
		opts.Engines = 1
	}
	now := time.Now()
	s := &Server{
		opts:    opts,
		readyAt: now.Add(opts.LoadTime),
		created: float64(now.Unix()),
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
	}
	for _, m := range opts.Models {
		for e := range opts.Engines {
			s.series = append(s.series, newSeries(m, e))
		}
	}
	return s
}

// Load is the directly set load. Totals are split over the series as evenly
// as whole requests allow; KVCacheUsage is set on every series.
type Load struct {
	Waiting      *float64 `json:"waiting,omitempty"`
	Running      *float64 `json:"running,omitempty"`
	Swapped      *float64 `json:"swapped,omitempty"`
	KVCacheUsage *float64 `json:"kvCacheUsage,omitempty"`
}

// State is what the page currently says, summed (requests) or averaged
// (KV-cache usage) over the series exactly as vLLM's consumers should.
type State struct {
	Waiting      float64    `json:"waiting"`
	Running      float64    `json:"running"`
	Swapped      float64    `json:"swapped"`
	KVCacheUsage float64    `json:"kvCacheUsage"`
	Series       []SeriesOf `json:"series"`
	Model        QueueModel `json:"model"`
	// Pinned are the gauges SetLoad holds (the model does not move them).
	Pinned Load `json:"pinned"`
	// ModelHeld: the model was set by SetModel and holds until changed or
	// released; false: the driver (the demo's swing) sets it.
	ModelHeld bool `json:"modelHeld"`
	// HangingFor is how long /metrics requests still hang.
	HangingFor string `json:"hangingFor,omitempty"`
}

// SeriesOf is one series' gauges.
type SeriesOf struct {
	Model        string  `json:"model"`
	Engine       string  `json:"engine"`
	Waiting      float64 `json:"waiting"`
	Running      float64 `json:"running"`
	KVCacheUsage float64 `json:"kvCacheUsage"`
}

// F is a convenience for building a Load.
func F(v float64) *float64 { return &v }

// SetLoad sets the given gauges and holds them: the queueing model no longer
// moves them until ReleaseLoad. Gauges it leaves nil keep their state.
func (s *Server) SetLoad(l Load) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.Waiting != nil {
		s.pin.Waiting = F(*l.Waiting)
	}
	if l.Running != nil {
		s.pin.Running = F(*l.Running)
	}
	if l.Swapped != nil {
		s.pin.Swapped = F(*l.Swapped)
	}
	if l.KVCacheUsage != nil {
		s.pin.KVCacheUsage = F(*l.KVCacheUsage)
	}
	s.applyLoad(l)
}

// ReleaseLoad lets the queueing model move every gauge again.
func (s *Server) ReleaseLoad() {
	s.mu.Lock()
	s.pin = Load{}
	s.mu.Unlock()
}

// applyLoad writes l's gauges into the series (s.mu held).
func (s *Server) applyLoad(l Load) {
	split := func(total float64, set func(*series, float64)) {
		n := float64(len(s.series))
		base := math.Floor(total / n)
		rest := total - base*n
		for _, sr := range s.series {
			v := base
			if rest >= 1 {
				v++
				rest--
			} else if rest > 0 { // a fractional total lands on one series
				v += rest
				rest = 0
			}
			set(sr, v)
		}
	}
	if l.Waiting != nil {
		split(*l.Waiting, func(sr *series, v float64) { sr.waiting = v })
	}
	if l.Running != nil {
		split(*l.Running, func(sr *series, v float64) { sr.running = v })
	}
	if l.Swapped != nil {
		split(*l.Swapped, func(sr *series, v float64) { sr.swapped = v })
	}
	if l.KVCacheUsage != nil {
		for _, sr := range s.series {
			sr.kv = *l.KVCacheUsage
		}
	}
}

// SetSeries sets the gauges of series i (models × engines, engine fastest).
func (s *Server) SetSeries(i int, waiting, running, kv float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.series[i]
	sr.waiting, sr.running, sr.kv = waiting, running, kv
}

// State returns the current gauges.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{Model: s.model, Pinned: s.pin, ModelHeld: s.held}
	if left := time.Until(s.hangUntil); left > 0 {
		st.HangingFor = left.Round(100 * time.Millisecond).String()
	}
	for _, sr := range s.series {
		st.Waiting += sr.waiting
		st.Running += sr.running
		st.Swapped += sr.swapped
		st.KVCacheUsage += sr.kv
		st.Series = append(st.Series, SeriesOf{sr.model, sr.engine, sr.waiting, sr.running, sr.kv})
	}
	st.KVCacheUsage /= float64(len(s.series))
	return st
}

// SetHang makes /metrics hang for the next d: a request in that time waits
// until d has passed (or until its client gives up); 0 ends it at once.
func (s *Server) SetHang(d time.Duration) {
	s.mu.Lock()
	s.hangUntil = time.Now().Add(d)
	s.mu.Unlock()
}

// Complete records n finished requests on every series, each with the given
// end-to-end latency split evenly into queue, prefill and decode time, 100
// prompt and 50 generated tokens. Counters and histograms move exactly so.
func (s *Server) Complete(n int, latency float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sr := range s.series {
		for range n {
			sr.finish(latency/3, latency/3, latency/3, 100, 50, 0)
		}
	}
}

// Restart resets every counter and histogram, as a restarted vLLM does.
func (s *Server) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sr := range s.series {
		n := newSeries(sr.model, i%s.opts.Engines)
		n.waiting, n.running, n.kv = sr.waiting, sr.running, sr.kv
		s.series[i] = n
	}
	s.created = float64(time.Now().Unix())
}

// finish records one finished request.
func (sr *series) finish(queue, prefill, decode float64, prompt, gen int, reason int) {
	e2e := queue + prefill + decode
	sr.queue.observe(queue)
	sr.prefill.observe(prefill)
	sr.decode.observe(decode)
	sr.inference.observe(prefill + decode)
	sr.e2e.observe(e2e)
	sr.ttft.observe(queue + prefill)
	if gen > 1 {
		per := decode / float64(gen-1)
		sr.tpot.observe(per)
		for range gen - 1 {
			sr.itl.observe(per)
		}
	}
	sr.promptLen.observe(float64(prompt))
	sr.genLen.observe(float64(gen))
	sr.maxGen.observe(float64(gen))
	sr.paramsN.observe(1)
	sr.iteration.observe(float64(prompt))
	sr.promptTokens += float64(prompt)
	sr.genTokens += float64(gen)
	sr.prefixQueries += float64(prompt)
	sr.prefixHits += float64(prompt / 4)
	sr.success[reason]++
}
