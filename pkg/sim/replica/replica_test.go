package replica

import (
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

type recorder struct {
	first, done []*Request
}

func (r *recorder) FirstToken(q *Request) { r.first = append(r.first, q) }
func (r *recorder) Finished(q *Request)   { r.done = append(r.done, q) }

func profile(t *testing.T) *Profile { return load(t, "llama-3.1-8b-h100") }

// load is a profile by name or path.
func load(t *testing.T, nameOrPath string) *Profile {
	t.Helper()
	p, err := Load(nameOrPath)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run offers requests of fixed size at rate per second for d, sampling the
// queue every second, and returns what finished and the queue samples.
func run(t *testing.T, p *Profile, rate float64, prompt, output int, d time.Duration) (*recorder, *Replica, []int) {
	t.Helper()
	rec := &recorder{}
	r := New(p, rec)
	gap := time.Duration(float64(time.Second) / rate)
	next, id := time.Duration(0), 0
	var queue []int
	for s := time.Second; s <= d; s += time.Second {
		for ; next < s; next += gap {
			r.AdvanceTo(next)
			r.Enqueue(next, NewRequest(id, prompt, output, next))
			id++
		}
		r.AdvanceTo(s)
		queue = append(queue, r.Waiting())
	}
	return rec, r, queue
}

// capacity is the replica's saturated throughput (requests/s): offered far
// more than it serves, what finishes over [200 s, 600 s].
func capacity(t *testing.T, p *Profile, prompt, output int) float64 {
	t.Helper()
	rec, _, _ := run(t, p, 100, prompt, output, 600*time.Second)
	return float64(finishedIn(rec, 200*time.Second, 600*time.Second)) / 400
}

func finishedIn(rec *recorder, from, to time.Duration) int {
	n := 0
	for _, q := range rec.done {
		if q.Finished > from && q.Finished <= to {
			n++
		}
	}
	return n
}

func TestBelowCapacityNoQueueAndThroughputIsArrivals(t *testing.T) {
	p := profile(t)
	mu := capacity(t, p, 1000, 200)
	rate := 0.5 * mu
	rec, r, queue := run(t, p, rate, 1000, 200, 300*time.Second)
	r.AdvanceTo(400 * time.Second)
	if n := len(rec.done); math.Abs(float64(n)-rate*300) > 2 {
		t.Fatalf("%d finished of %.0f offered below capacity (%.1f/s of %.1f/s)", n, rate*300, rate, mu)
	}
	// A request that arrives during a step waits for the next one (vLLM
	// counts it as waiting too): the queue is empty but for those.
	sum, most := 0, 0
	for _, w := range queue {
		sum += w
		most = max(most, w)
	}
	if mean := float64(sum) / float64(len(queue)); mean > 1 || most > 4 {
		t.Fatalf("queue mean %.2f, max %d at half capacity", mean, most)
	}
}

// TestAboveCapacityTheQueueGrowsAtTheExcess: offered 1.5 times its
// saturated capacity, the replica serves about its capacity (within 10 %:
// how much recomputation preemptions cost settles slowly) and the queue
// grows at arrivals minus what it serves.
func TestAboveCapacityTheQueueGrowsAtTheExcess(t *testing.T) {
	p := profile(t)
	mu := capacity(t, p, 1000, 200)
	rate := 1.5 * mu
	rec, _, queue := run(t, p, rate, 1000, 200, 600*time.Second)
	served := float64(finishedIn(rec, 200*time.Second, 600*time.Second)) / 400
	if math.Abs(served-mu)/mu > 0.1 {
		t.Fatalf("serves %.2f/s offered %.2f/s; saturated capacity %.2f/s", served, rate, mu)
	}
	growth := float64(queue[599]-queue[199]) / 400
	if want := rate - served; math.Abs(growth-want)/want > 0.05 {
		t.Fatalf("queue grows %.2f/s, want arrivals - served = %.2f - %.2f = %.2f", growth, rate, served, want)
	}
	t.Logf("saturated capacity %.2f requests/s (1000 in, 200 out); at 1.5x it serves %.2f/s and the queue grows %.2f/s", mu, served, growth)
}

// TestLittlesLaw: the mean number of requests in the replica equals the
// throughput times the mean time in it, on the simulated numbers.
func TestLittlesLaw(t *testing.T) {
	p := profile(t)
	rate := 0.8 * capacity(t, p, 1000, 200)
	rec, r, _ := run(t, p, rate, 1000, 200, 600*time.Second)
	// Sample the number in system every 100 ms over [100 s, 500 s].
	rec2 := &recorder{}
	r2 := New(p, rec2)
	gap := time.Duration(float64(time.Second) / rate)
	var inSystem, samples float64
	next, id := time.Duration(0), 0
	for s := 100 * time.Millisecond; s <= 600*time.Second; s += 100 * time.Millisecond {
		for ; next < s; next += gap {
			r2.AdvanceTo(next)
			r2.Enqueue(next, NewRequest(id, 1000, 200, next))
			id++
		}
		r2.AdvanceTo(s)
		if s >= 100*time.Second && s <= 500*time.Second {
			inSystem += float64(r2.Outstanding())
			samples++
		}
	}
	L := inSystem / samples
	var wSum float64
	n := 0
	for _, q := range rec2.done {
		if q.Dispatched >= 100*time.Second && q.Dispatched <= 500*time.Second {
			wSum += (q.Finished - q.Dispatched).Seconds()
			n++
		}
	}
	W := wSum / float64(n)
	if lw := rate * W; math.Abs(L-lw)/lw > 0.05 {
		t.Fatalf("L = %.2f in system, lambda W = %.2f x %.3f s = %.2f", L, rate, W, lw)
	}
	_ = rec
	_ = r
}

// TestValuesAreConsistent: the counters the pipelines read agree with the
// requests' own times.
func TestValuesAreConsistent(t *testing.T) {
	p := profile(t)
	rec, r, _ := run(t, p, 5, 500, 50, 60*time.Second)
	r.AdvanceTo(120 * time.Second)
	v := r.Values()
	get := func(id metric.ID) float64 { x, _ := v.Get(id); return x }
	if get(metric.RequestSuccess) != float64(len(rec.done)) || get(metric.TTFTCount) != float64(len(rec.first)) {
		t.Fatalf("success %v ttft count %v; %d finished, %d first tokens", get(metric.RequestSuccess), get(metric.TTFTCount), len(rec.done), len(rec.first))
	}
	var ttft float64
	for _, q := range rec.first {
		ttft += (q.FirstToken - q.Dispatched).Seconds()
	}
	if math.Abs(get(metric.TTFTSum)-ttft) > 1e-6 {
		t.Fatalf("TTFT sum %v, requests say %v", get(metric.TTFTSum), ttft)
	}
	if want := float64(len(rec.done) * 50); get(metric.GenerationTokens) != want {
		t.Fatalf("generation tokens %v, want %v", get(metric.GenerationTokens), want)
	}
	if get(metric.Waiting) != 0 || get(metric.Running) != 0 || get(metric.KVCacheUsage) != 0 {
		t.Fatalf("an idle replica shows %v waiting, %v running, %v KV", get(metric.Waiting), get(metric.Running), get(metric.KVCacheUsage))
	}
}

// TestPreemptionWhenTheKVCacheRunsOut: a small cache preempts and recomputes,
// and every request still finishes with its full output.
func TestPreemptionWhenTheKVCacheRunsOut(t *testing.T) {
	p := *profile(t)
	p.KVCacheTokens, p.MaxModelLen = 20000, 8000
	rec, r, _ := run(t, &p, 20, 1000, 400, 30*time.Second)
	r.AdvanceTo(time.Hour)
	c := r.Counters()
	if c.Preemptions == 0 {
		t.Fatal("no preemption with 20,000 KV tokens for 1,400-token requests at 20/s")
	}
	if len(rec.done) != 600 || c.GenerationTokens < 600*400 {
		t.Fatalf("%d finished, %v tokens generated (recomputation regenerates none)", len(rec.done), c.GenerationTokens)
	}
	for _, q := range rec.done {
		if q.generated != q.Output {
			t.Fatalf("request %d generated %d of %d", q.ID, q.generated, q.Output)
		}
	}
	// Every token taken was given back: a preempted request's tokens are
	// what it prefilled and generated so far (its generated count once
	// lagged the decode steps, and the idle replica's usage went negative).
	if r.usage != 0 {
		t.Fatalf("idle after every request finished: %d KV tokens in use", r.usage)
	}
}

// TestStepTimeIsTheLinearModel: one request alone: its TTFT is one prefill
// step (its 1,000 tokens, each with its attention to those before it), its
// inter-token latency the one-sequence decode step.
func TestStepTimeIsTheLinearModel(t *testing.T) {
	p := profile(t)
	rec := &recorder{}
	r := New(p, rec)
	r.Enqueue(0, NewRequest(1, 1000, 11, 0))
	r.AdvanceTo(time.Minute)
	q := rec.done[0]
	prefill := p.stepTime(p.PrefillUnits(1000, 0), 0, 0)
	decode := p.stepTime(0, 1, 0)
	if q.FirstToken != prefill || q.Finished != prefill+10*decode {
		t.Fatalf("first token %v finished %v; want %v and %v", q.FirstToken, q.Finished, prefill, prefill+10*decode)
	}
}

// TestStepsCountEachEngineStepOnce: vLLM observes iteration_tokens_total
// once an engine step. A request alone takes a prefill step and one decode
// step a token after its first; a second request prefilled while the first
// decodes shares that step, and a run of decode steps advanced in one go
// counts each.
func TestStepsCountEachEngineStepOnce(t *testing.T) {
	p := profile(t)
	r := New(p, nil)
	r.Enqueue(0, NewRequest(1, 100, 10, 0))
	decode := p.stepTime(0, 1, 0)
	// Past the prefill step and two decode steps, within the third.
	at := p.stepTime(p.PrefillUnits(100, 0), 0, 0) + 2*decode + decode/2
	r.AdvanceTo(at)
	if got := r.Counters().Steps; got != 3 {
		t.Fatalf("after a prefill and two decode steps: %v steps", got)
	}
	r.Enqueue(at, NewRequest(2, 100, 1, at))
	r.AdvanceTo(time.Minute)
	// The first: 1 prefill step and 9 decode steps, one of which also
	// prefilled the second (which finished at its first token).
	if c := r.Counters(); c.Steps != 10 || c.Success != 2 {
		t.Fatalf("%v steps, %v requests finished; want 10 and 2", c.Steps, c.Success)
	}
}

func TestShippedProfilesLoad(t *testing.T) {
	if len(Shipped()) < 2 {
		t.Fatalf("shipped profiles: %v", Shipped())
	}
	for _, n := range Shipped() {
		if _, err := Load(n); err != nil {
			t.Error(err)
		}
	}
	if _, err := Load("no-such-profile"); err == nil {
		t.Error("an unknown profile loaded")
	}
}

// TestHistogramsMatchTheRequests: with Histograms set, the TTFT histogram
// holds every first token in its vLLM bucket, and the ITL histogram every
// token after the first; without it there are none.
func TestHistogramsMatchTheRequests(t *testing.T) {
	p := profile(t)
	rec := &recorder{}
	r := New(p, rec)
	r.Histograms = true
	for i := range 40 {
		at := time.Duration(i) * 100 * time.Millisecond
		r.AdvanceTo(at)
		r.Enqueue(at, NewRequest(i, 800, 40, at))
	}
	r.AdvanceTo(2 * time.Minute)
	h := r.Hist()
	v := r.Values()
	ttft, itl := h[metric.TTFTHist], h[metric.ITLHist]
	if n, _ := v.Get(metric.TTFTCount); ttft.Total() != n || n != 40 {
		t.Fatalf("TTFT histogram holds %v, count %v, want 40", ttft.Total(), n)
	}
	if n, _ := v.Get(metric.ITLCount); itl.Total() != n || n != 40*39 {
		t.Fatalf("ITL histogram holds %v, count %v, want %d", itl.Total(), n, 40*39)
	}
	want := make([]float64, len(TTFTBounds))
	for _, q := range rec.first {
		x := (q.FirstToken - q.Dispatched).Seconds()
		for i, b := range TTFTBounds {
			if x <= b {
				want[i]++
			}
		}
	}
	if !slices.Equal(ttft.Counts, want) || !slices.Equal(ttft.Bounds, TTFTBounds) {
		t.Fatalf("TTFT buckets %v, want %v", ttft.Counts, want)
	}
	plain := New(p, nil)
	plain.Enqueue(0, NewRequest(0, 10, 2, 0))
	plain.AdvanceTo(time.Minute)
	if plain.Hist() != nil {
		t.Fatal("histograms kept without Histograms set")
	}
}

// TestAbandon: a client gives up on a waiting request and on one being
// prefilled: each leaves the replica, its KV blocks freed, and is never
// served; a request past its prefill cannot be abandoned; the others are
// served as if the abandoned had never come.
func TestAbandon(t *testing.T) {
	p := profile(t)
	rec := &recorder{}
	r := New(p, rec)
	// One long prompt (prefilled over several steps), then two more.
	long := NewRequest(1, 40000, 10, 0)
	a, b := NewRequest(2, 100, 10, 0), NewRequest(3, 100, 10, 0)
	r.Enqueue(0, long)
	r.Enqueue(0, a)
	r.Enqueue(0, b)
	// After the first step the long prompt is mid-prefill.
	first, _ := r.NextEvent()
	r.AdvanceTo(first)
	if long.FirstToken >= 0 || r.KVUsage() == 0 {
		t.Fatalf("the long prompt is not mid-prefill: first token %v, KV %.4f", long.FirstToken, r.KVUsage())
	}
	if !r.Abandon(long) || r.Running() != 0 && r.KVUsage() > float64(200)/float64(p.KVCacheTokens) {
		t.Fatalf("abandoning the prefilling request: running %d, KV %.5f", r.Running(), r.KVUsage())
	}
	if r.Abandon(long) {
		t.Fatal("a request abandoned twice")
	}
	for t0 := first; ; {
		next, ok := r.NextEvent()
		if !ok {
			break
		}
		r.AdvanceTo(next)
		if next == t0 {
			break
		}
		t0 = next
	}
	if long.FirstToken >= 0 || long.Finished >= 0 || a.Finished < 0 || b.Finished < 0 {
		t.Fatalf("long first token %v finished %v; a finished %v, b %v", long.FirstToken, long.Finished, a.Finished, b.Finished)
	}
	if r.KVUsage() != 0 || r.Outstanding() != 0 {
		t.Fatalf("KV %.5f, %d outstanding after all finished", r.KVUsage(), r.Outstanding())
	}
	if r.Abandon(a) {
		t.Fatal("a finished request was abandoned")
	}
	// A waiting request: the queue is full of others.
	r2 := New(p, nil)
	var qs []*Request
	for i := range 50 {
		q := NewRequest(i, 30000, 10, 0)
		qs = append(qs, q)
		r2.Enqueue(0, q)
	}
	last := qs[len(qs)-1]
	if w := r2.Waiting(); w == 0 || !r2.Abandon(last) || r2.Waiting() != w-1 {
		t.Fatalf("abandoning a waiting request: waiting %d", r2.Waiting())
	}
}

// TestCountersUnderPreemption: a replica preempting often counts what vLLM
// counts. Each request's prompt once (the recompute after a preemption was
// counted as prompt tokens: 1,089,764 for 600 prompts of 1,000), and the
// inter-token times add up to each request's first-to-last token time (the
// token after a recompute was timed from the request's last prefill, its
// decode time counted twice).
func TestCountersUnderPreemption(t *testing.T) {
	p := *profile(t)
	p.KVCacheTokens, p.MaxModelLen = 20000, 8000
	rec, r, _ := run(t, &p, 20, 1000, 400, 30*time.Second)
	r.AdvanceTo(time.Hour)
	c := r.Counters()
	if c.Preemptions == 0 {
		t.Fatal("no preemption")
	}
	prompts := 0
	for _, q := range rec.first {
		prompts += q.Prompt
	}
	if c.PromptTokens != float64(prompts) {
		t.Errorf("prompt_tokens %.0f over %.0f preemptions; the %d requests' prompts add up to %d", c.PromptTokens, c.Preemptions, len(rec.first), prompts)
	}
	gaps := 0.0
	for _, q := range rec.done {
		gaps += (q.Finished - q.FirstToken).Seconds()
	}
	if math.Abs(c.ITLSum-gaps) > 1e-6*gaps+1e-3 {
		t.Errorf("ITL sum %.1fs over %.0f preemptions; the requests' first-to-last token times add up to %.1fs", c.ITLSum, c.Preemptions, gaps)
	}
}

// TestTheStartupVariantsDifferOnlyInTheirStartup: the held-out suites'
// profiles (docs/simulation/profiles) are the shipped ones with only the
// startup changed. They were written by hand before the bandwidth floor,
// and kept the replica of before it until 2026-11-30: every other number
// is now held to the shipped profile's.
func TestTheStartupVariantsDifferOnlyInTheirStartup(t *testing.T) {
	files, err := filepath.Glob("../../../docs/simulation/profiles/*-start-*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("variants: %v, %v", files, err)
	}
	rest := func(p *Profile) Profile {
		q := *p
		q.Name, q.Description, q.Startup, q.StartupStddev = "", "", Duration{}, Duration{}
		q.Sources = slices.DeleteFunc(slices.Clone(q.Sources), func(s string) bool { return strings.HasPrefix(s, "Startup:") })
		return q
	}
	for _, f := range files {
		v, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		base, _, _ := strings.Cut(filepath.Base(f), "-start-")
		b, err := Load(base)
		if err != nil {
			t.Fatalf("%s: its shipped profile: %v", f, err)
		}
		if got, want := rest(v), rest(b); !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs from %s in more than its startup:\n%+v\n%+v", f, base, got, want)
		}
		if v.Startup == b.Startup {
			t.Errorf("%s: the startup is the shipped one's", f)
		}
	}
}
