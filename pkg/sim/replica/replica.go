// Package replica models one vLLM replica with continuous batching, in
// virtual time, and derives from its state the values pulse reads from a
// vLLM page.
//
// Each engine step has a token budget (max_num_batched_tokens). The
// scheduler (as vLLM V1's) gives one token to every running sequence that is
// decoding, then prefill chunks to sequences still prefilling, then admits
// waiting requests while the budget, max_num_seqs and the KV cache allow.
// The step lasts beta0 + beta1·(prefill tokens) + beta2·(decoding sequences),
// the linear step model of the BLIS simulator and llm-d's workload variant
// autoscaler, each prefill token dearer by its attention to the context
// before it where the profile prices it (prefillAttentionPerContextToken),
// and at least the time to read the weights and the KV cache in
// use at the GPU's memory bandwidth (the profile's floor, which binds at
// long contexts). When the KV cache cannot hold the next decode tokens, the
// most recently admitted sequence is preempted (recompute): it goes back to
// the front of the queue and is prefilled again, and, as in vLLM V1, no
// waiting request is admitted in that step. The counters are vLLM V1's: a
// prompt counted whole at its first token, a queue time observed when its
// request finishes.
//
// Runs of identical decode-only steps (nothing to prefill or admit) are
// advanced in one go, so a replica costs work per request, not per step.
package replica

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// Request is one inference request.
type Request struct {
	ID      int
	Prompt  int // prompt tokens
	Output  int // tokens to generate (at least 1)
	Arrival time.Duration
	// Set by the replica.
	Dispatched time.Duration // when it reached this replica
	Admitted   time.Duration // first scheduled (-1 before)
	FirstToken time.Duration // -1 before
	Finished   time.Duration // -1 before

	prefilled, generated int
	prefillTarget        int    // tokens to prefill: the prompt, plus what was generated before a preemption
	finishAt             uint64 // decode counter value at which it has generated Output tokens
	index                int    // in the finish heap
	lastToken            time.Duration
	prev, next           *Request // in the running list
}

// NewRequest returns a request not yet dispatched.
func NewRequest(id, prompt, output int, arrival time.Duration) *Request {
	return &Request{ID: id, Prompt: prompt, Output: max(output, 1), Arrival: arrival, Admitted: -1, FirstToken: -1, Finished: -1}
}

// held is the KV tokens the request holds: what it prefilled (after a
// preemption, its prompt and the tokens it had generated, recomputed), and
// what it generated since.
func (q *Request) held() int {
	recomputed := max(q.prefillTarget-q.Prompt, 0)
	return q.prefilled + q.generated - recomputed
}

// Observer hears about requests' progress.
type Observer interface {
	FirstToken(r *Request)
	Finished(r *Request)
}

// Counters are a replica's cumulative vLLM counters and histogram sums.
type Counters struct {
	PromptTokens, GenerationTokens, Success, Preemptions float64
	// Steps: engine steps run (vLLM's iteration_tokens_total _count).
	Steps                                    float64
	TTFTSum, TTFTCount, QueueSum, QueueCount float64
	E2ESum, E2ECount, ITLSum, ITLCount       float64
}

// vLLM's TTFT and inter-token latency bucket bounds
// (vllm/v1/metrics/loggers.py), with +Inf.
var (
	TTFTBounds = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.Inf(1)}
	ITLBounds = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0, math.Inf(1)}
)

// observe adds n observations of v to the bucket of bounds that holds it.
func observe(buckets *[]float64, bounds []float64, v, n float64) {
	if *buckets == nil {
		*buckets = make([]float64, len(bounds))
	}
	(*buckets)[sort.SearchFloat64s(bounds, v)] += n
}

// Replica is one vLLM server. It is not safe for concurrent use.
type Replica struct {
	p   *Profile
	obs Observer

	waiting []*Request // FIFO
	// preempted go before waiting, the last preempted first (vLLM puts a
	// preempted request back at the front of its queue).
	preempted []*Request
	// running, in admission order (a list: the newest is preempted first).
	head, tail *Request
	nRunning   int
	// prefilling: running sequences with prompt left to prefill, in
	// admission order, and the tokens they have left.
	prefilling     []*Request
	pendingPrefill int
	// decoding: running sequences whose prefill is done, by finishAt.
	decoding finishHeap
	usage    int // KV tokens in use
	decodeN  uint64
	// lastDecodeEnd: when the last decode step ended (applyDecode)
	lastDecodeEnd time.Duration

	// The current run: steps of identical composition from runStart, each
	// dt long; runSteps of them are planned, done of them applied.
	active   bool
	runStart time.Duration
	dt       time.Duration
	runSteps uint64
	done     uint64
	// The composition of a step that prefills (runSteps == 1).
	chunks []chunk
	nDec   int

	c Counters

	// Histograms: keep the TTFT and ITL histograms (Hist); off, the
	// replica saves their cost.
	Histograms bool
	// Observations per bucket of TTFTBounds and ITLBounds (not cumulative).
	ttftB, itlB []float64
}

type chunk struct {
	r      *Request
	tokens int
}

// New returns an idle replica.
func New(p *Profile, obs Observer) *Replica { return &Replica{p: p, obs: obs} }

// Enqueue hands a request to the replica at now (the replica has been
// advanced to now). It is scheduled from the next step on.
func (r *Replica) Enqueue(now time.Duration, req *Request) {
	req.Dispatched = now
	req.prefillTarget = req.Prompt
	r.waiting = append(r.waiting, req)
	if !r.active {
		r.plan(now)
		return
	}
	// The step in progress ends the run: the next one schedules the request.
	r.runSteps = min(r.runSteps, r.done+1)
}

// Outstanding is the number of requests waiting or running.
func (r *Replica) Outstanding() int { return r.Waiting() + r.nRunning }

// Waiting and Running are vLLM's num_requests_waiting and _running.
func (r *Replica) Waiting() int { return len(r.waiting) + len(r.preempted) }
func (r *Replica) Running() int { return r.nRunning }

// KVUsage is vLLM's kv_cache_usage_perc (0..1).
func (r *Replica) KVUsage() float64 { return float64(r.usage) / float64(r.p.KVCacheTokens) }

// Counters returns the cumulative counters.
func (r *Replica) Counters() Counters { return r.c }

// NextEvent is when the replica next changes state by itself; false when
// it is idle.
func (r *Replica) NextEvent() (time.Duration, bool) {
	if !r.active {
		return 0, false
	}
	return r.runStart + time.Duration(r.runSteps)*r.dt, true
}

// AdvanceTo applies every step that ends at or before t, planning new
// steps as runs end.
func (r *Replica) AdvanceTo(t time.Duration) {
	for r.active {
		end := r.runStart + time.Duration(r.runSteps)*r.dt
		if end > t {
			// Apply the whole steps of the run that end by t.
			if k := uint64((t - r.runStart) / r.dt); k > r.done {
				r.applyDecode(k-r.done, r.runStart+time.Duration(k)*r.dt)
				r.done = k
			}
			return
		}
		if r.chunks != nil {
			r.applyPrefillStep(end)
		} else if r.runSteps > r.done {
			r.applyDecode(r.runSteps-r.done, end)
		}
		r.active = false
		r.plan(end)
	}
}

// Abandon takes off the replica a request whose client gave up before its
// first token (the replica has been advanced to now): waiting, preempted or
// prefilling, its KV blocks freed; false when it is not here or already
// past its prefill. A step in progress keeps its planned length (the GPU is
// already computing it) without the request's chunk.
func (r *Replica) Abandon(q *Request) bool {
	if q.FirstToken >= 0 || q.Finished >= 0 {
		return false
	}
	if i := slices.Index(r.waiting, q); i >= 0 {
		r.waiting = slices.Delete(r.waiting, i, i+1)
		return true
	}
	if i := slices.Index(r.preempted, q); i >= 0 {
		r.preempted = slices.Delete(r.preempted, i, i+1)
		return true
	}
	if !slices.Contains(r.prefilling, q) {
		return false
	}
	r.dropPrefilling(q)
	r.unlinkRunning(q)
	r.usage -= q.prefilled
	if i := slices.IndexFunc(r.chunks, func(c chunk) bool { return c.r == q }); i >= 0 {
		r.chunks = slices.Delete(r.chunks, i, i+1)
	}
	return true
}

// Drain takes every request off the replica (it is being removed and drops
// its work), returning those not finished.
func (r *Replica) Drain() []*Request {
	var out []*Request
	for q := r.head; q != nil; q = q.next {
		out = append(out, q)
	}
	out = append(append(out, r.preempted...), r.waiting...)
	r.head, r.tail, r.nRunning, r.prefilling, r.pendingPrefill = nil, nil, 0, nil, 0
	r.preempted, r.waiting, r.decoding, r.usage, r.active = nil, nil, nil, 0, false
	return out
}

// plan starts the next step at now, or goes idle.
func (r *Replica) plan(now time.Duration) {
	r.chunks, r.nDec, r.done = nil, 0, 0
	if r.nRunning == 0 && r.Waiting() == 0 {
		r.active = false
		return
	}
	// vLLM V1 admits no waiting request in a step that preempted
	// (vllm/v1/core/sched/scheduler.py: "if not preempted_reqs"): the
	// victim waits a step at least, rather than being prefilled again at
	// once and preempted again at the next.
	preempted := r.preemptForDecode()
	nDec := r.decoding.Len()
	budget := r.p.MaxNumBatchedTokens - nDec
	var chunks []chunk
	prefill := 0.0 // in PrefillUnits
	for _, q := range r.prefilling {
		if budget <= 0 {
			break
		}
		n := min(q.prefillTarget-q.prefilled, budget)
		chunks = append(chunks, chunk{q, n})
		budget -= n
		prefill += r.p.PrefillUnits(n, q.prefilled)
	}
	for !preempted && budget > 0 && r.Waiting() > 0 && r.nRunning < r.p.MaxNumSeqs {
		q := r.nextWaiting()
		// The whole prompt must fit in the KV cache at admission.
		if r.usage+r.pendingPrefill+q.prefillTarget > r.p.KVCacheTokens {
			break
		}
		r.popHead()
		if q.Admitted < 0 {
			q.Admitted = now // its queue time is observed when it finishes
		}
		r.pushRunning(q)
		r.prefilling = append(r.prefilling, q)
		r.pendingPrefill += q.prefillTarget
		n := min(q.prefillTarget, budget)
		chunks = append(chunks, chunk{q, n})
		budget -= n
		prefill += r.p.PrefillUnits(n, 0)
	}
	r.active, r.runStart = true, now
	if len(chunks) > 0 {
		r.chunks, r.nDec = chunks, nDec
		r.dt = r.p.stepTime(prefill, nDec, r.usage)
		r.runSteps = 1
		return
	}
	if nDec == 0 {
		// Requests wait for KV space held by no running sequence: nothing
		// can free it. (A prompt larger than the cache never runs.)
		r.active = false
		return
	}
	// Decode only: identical steps until the first sequence finishes, the
	// KV cache is full, or a request arrives. Each step reads nDec tokens
	// more of KV cache than the one before, and all are priced at the
	// first's: where the bandwidth floor binds, a run is cut where the
	// cache has grown by 1/maxRunGrowth (unbounded, a 30,000-token decode
	// was 6 % short; priced at the run's middle step instead, a run that
	// an arrival cuts short was overpriced).
	first := r.decoding[0].at - r.decodeN
	free := r.p.KVCacheTokens - r.usage
	fits := uint64(free / nDec)
	r.runSteps = max(1, min(first, fits))
	r.dt = r.p.stepTime(0, nDec, r.usage)
	if r.p.ReadSeconds(float64(r.usage+nDec*int(r.runSteps))) > r.p.Beta0Seconds+r.p.Beta2Seconds*float64(nDec) {
		r.runSteps = max(1, min(r.runSteps, uint64(r.usage/(maxRunGrowth*nDec))))
	}
}

// maxRunGrowth: a decode-only run under the bandwidth floor lasts while
// the KV cache grows by at most 1/maxRunGrowth of itself (its steps, priced
// at the first's, are at most that short).
const maxRunGrowth = 256

func (r *Replica) pushRunning(q *Request) {
	q.prev, q.next = r.tail, nil
	if r.tail != nil {
		r.tail.next = q
	} else {
		r.head = q
	}
	r.tail = q
	r.nRunning++
}

func (r *Replica) unlinkRunning(q *Request) {
	if q.prev != nil {
		q.prev.next = q.next
	} else {
		r.head = q.next
	}
	if q.next != nil {
		q.next.prev = q.prev
	} else {
		r.tail = q.prev
	}
	q.prev, q.next = nil, nil
	r.nRunning--
}

// dropPrefilling takes q off the prefilling list.
func (r *Replica) dropPrefilling(q *Request) {
	for i, x := range r.prefilling {
		if x == q {
			r.prefilling = append(r.prefilling[:i], r.prefilling[i+1:]...)
			r.pendingPrefill -= q.prefillTarget - q.prefilled
			return
		}
	}
}

// next is the next request to admit.
func (r *Replica) nextWaiting() *Request {
	if n := len(r.preempted); n > 0 {
		return r.preempted[n-1]
	}
	return r.waiting[0]
}

func (r *Replica) popHead() {
	if n := len(r.preempted); n > 0 {
		r.preempted = r.preempted[:n-1]
		return
	}
	r.waiting[0] = nil
	r.waiting = r.waiting[1:]
}

// preemptForDecode preempts the most recently admitted sequences until the
// KV cache holds one more token for every decoding sequence, and reports
// whether it preempted any.
func (r *Replica) preemptForDecode() (preempted bool) {
	for r.decoding.Len() > 0 && r.usage+r.decoding.Len() > r.p.KVCacheTokens {
		q := r.tail
		r.unlinkRunning(q)
		if q.index >= 0 && q.index < r.decoding.Len() && r.decoding[q.index].q == q {
			r.decoding.remove(q.index)
			// Decode steps since it joined the heap generated tokens its
			// count does not hold yet: it finishes at finishAt.
			q.generated = q.Output - int(q.finishAt-r.decodeN)
			// Its last token came at the last decode step (decode steps
			// keep no per-request time): the gap to its next token, after
			// the recompute, is from there, not from its last prefill's.
			q.lastToken = max(q.lastToken, r.lastDecodeEnd)
		} else {
			r.dropPrefilling(q)
		}
		r.usage -= q.held()
		// Recompute: prefill the prompt and what it generated again.
		q.prefillTarget = q.Prompt + q.generated
		q.prefilled = 0
		r.preempted = append(r.preempted, q)
		r.c.Preemptions++
		preempted = true
	}
	return preempted
}

// applyDecode applies k decode steps ending at end (the last one).
func (r *Replica) applyDecode(k uint64, end time.Duration) {
	n := r.decoding.Len()
	if n == 0 || k == 0 {
		return
	}
	r.decodeN += k
	r.c.Steps += float64(k)
	r.lastDecodeEnd = end
	tokens := float64(k) * float64(n)
	r.usage += int(k) * n
	r.c.GenerationTokens += tokens
	r.c.ITLSum += tokens * r.dt.Seconds()
	r.c.ITLCount += tokens
	if r.Histograms {
		observe(&r.itlB, ITLBounds, r.dt.Seconds(), tokens)
	}
	for r.decoding.Len() > 0 && r.decoding[0].at <= r.decodeN {
		q := r.decoding.pop()
		// It finished at the end of the step that brought decodeN to finishAt.
		q.generated = q.Output
		r.finish(q, end-time.Duration(r.decodeN-q.finishAt)*r.dt)
	}
}

// applyPrefillStep applies a step that prefills (and decodes) ending at end.
func (r *Replica) applyPrefillStep(end time.Duration) {
	if r.decoding.Len() == 0 {
		r.c.Steps++ // (applyDecode counts the steps that decode)
	}
	r.applyDecode(1, end)
	done := false
	for _, ch := range r.chunks {
		q := ch.r
		q.prefilled += ch.tokens
		r.pendingPrefill -= ch.tokens
		r.usage += ch.tokens
		if q.prefilled < q.prefillTarget {
			continue
		}
		done = true
		// Prefill done: the step produced the next token.
		if q.FirstToken < 0 {
			// vLLM V1 counts a request's whole prompt at its first token
			// (vllm/v1/metrics/stats.py, update_from_output), once: not
			// chunk by chunk, nor its recompute after a preemption (a
			// replica preempting often counted 5.6 times its prompts),
			// nor a prompt abandoned before it.
			r.c.PromptTokens += float64(q.Prompt)
			q.FirstToken = end
			r.c.TTFTSum += (end - q.Dispatched).Seconds()
			r.c.TTFTCount++
			if r.Histograms {
				observe(&r.ttftB, TTFTBounds, (end - q.Dispatched).Seconds(), 1)
			}
			if r.obs != nil {
				r.obs.FirstToken(q)
			}
		} else {
			r.c.ITLSum += (end - q.lastToken).Seconds()
			r.c.ITLCount++
			if r.Histograms {
				observe(&r.itlB, ITLBounds, (end - q.lastToken).Seconds(), 1)
			}
		}
		q.lastToken = end
		q.generated++
		r.usage++
		r.c.GenerationTokens++
		if q.generated >= q.Output {
			r.finish(q, end)
			continue
		}
		q.finishAt = r.decodeN + uint64(q.Output-q.generated)
		r.decoding.push(q)
	}
	if done {
		// Keep only those still prefilling (at the front, in order).
		keep := r.prefilling[:0]
		for _, q := range r.prefilling {
			if q.prefilled < q.prefillTarget {
				keep = append(keep, q)
			}
		}
		clear(r.prefilling[len(keep):])
		r.prefilling = keep
	}
	r.chunks = nil
}

func (r *Replica) finish(q *Request, at time.Duration) {
	q.Finished = at
	r.usage -= q.held()
	r.unlinkRunning(q)
	r.c.Success++
	r.c.E2ESum += (at - q.Dispatched).Seconds()
	r.c.E2ECount++
	// vLLM observes request_queue_time_seconds (first scheduled less
	// queued) when the request finishes (vllm/v1/metrics/loggers.py,
	// finished_requests), not when it is scheduled.
	r.c.QueueSum += (q.Admitted - q.Dispatched).Seconds()
	r.c.QueueCount++
	if r.obs != nil {
		r.obs.Finished(q)
	}
}

// Values are the replica's vLLM values as pulse's agent reads them from
// its page (counters cumulative).
// Hist returns the replica's TTFT and ITL histograms as vLLM exposes them
// (cumulative counts over TTFTBounds and ITLBounds): nil unless Histograms
// is set; a histogram with no observation yet is absent.
func (r *Replica) Hist() *metric.Histograms {
	if !r.Histograms {
		return nil
	}
	h := new(metric.Histograms)
	for _, x := range [...]struct {
		id     metric.Hist
		bounds []float64
		counts []float64
	}{{metric.TTFTHist, TTFTBounds, r.ttftB}, {metric.ITLHist, ITLBounds, r.itlB}} {
		if x.counts == nil {
			continue
		}
		cum := make([]float64, len(x.counts))
		run := 0.0
		for i, c := range x.counts {
			run += c
			cum[i] = run
		}
		h[x.id] = metric.Buckets{Bounds: x.bounds, Counts: cum}
	}
	return h
}

func (r *Replica) Values() metric.Values {
	var v metric.Values
	v.Set(metric.Waiting, float64(r.Waiting()))
	v.Set(metric.Running, float64(r.nRunning))
	v.Set(metric.KVCacheUsage, math.Min(1, r.KVUsage()))
	c := r.c
	v.Set(metric.PromptTokens, c.PromptTokens)
	v.Set(metric.GenerationTokens, c.GenerationTokens)
	v.Set(metric.RequestSuccess, c.Success)
	v.Set(metric.Preemptions, c.Preemptions)
	v.Set(metric.TTFTSum, c.TTFTSum)
	v.Set(metric.TTFTCount, c.TTFTCount)
	v.Set(metric.QueueTimeSum, c.QueueSum)
	v.Set(metric.QueueTimeCount, c.QueueCount)
	v.Set(metric.E2ELatencySum, c.E2ESum)
	v.Set(metric.E2ELatencyCount, c.E2ECount)
	v.Set(metric.ITLSum, c.ITLSum)
	v.Set(metric.ITLCount, c.ITLCount)
	return v
}

// finishHeap orders decoding sequences by the decode step they finish at;
// the keys are kept in the entries so that comparisons touch no request.
// It is container/heap's algorithm on the entries themselves: through
// heap.Interface every comparison and swap of a push or pop was an
// interface call.
type finishHeap []finishEntry

type finishEntry struct {
	at uint64
	id int
	q  *Request
}

func (h finishHeap) Len() int { return len(h) }
func (h finishHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].id < h[j].id
}
func (h finishHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].q.index, h[j].q.index = i, j
}

func (h *finishHeap) push(q *Request) {
	q.index = len(*h)
	*h = append(*h, finishEntry{q.finishAt, q.ID, q})
	h.up(len(*h) - 1)
}

// pop takes the sequence finishing first; h must not be empty.
func (h *finishHeap) pop() *Request {
	n := len(*h) - 1
	h.swap(0, n)
	h.down(0, n)
	return h.cut()
}

// remove takes the sequence at i.
func (h *finishHeap) remove(i int) *Request {
	n := len(*h) - 1
	if n != i {
		h.swap(i, n)
		if !h.down(i, n) {
			h.up(i)
		}
	}
	return h.cut()
}

// cut takes the last entry off.
func (h *finishHeap) cut() *Request {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = finishEntry{}
	e.q.index = -1
	*h = old[:len(old)-1]
	return e.q
}

func (h finishHeap) up(j int) {
	for {
		i := (j - 1) / 2 // parent
		if i == j || !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h finishHeap) down(i0, n int) bool {
	i := i0
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 { // j1 < 0 after int overflow
			break
		}
		j := j1 // left child
		if j2 := j1 + 1; j2 < n && h.less(j2, j1) {
			j = j2 // = 2*i + 2  // right child
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
