package sim

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-io/pulse/pkg/sim/replica"
)

// The references: pipelines that set the replica count themselves, with
// neither a signal nor KEDA nor the HPA in the way. static:N is what an
// operator compares with first; clairvoyant is what perfect knowledge of
// the future reaches; hindsight what perfect measurement without
// foresight reaches. None is a thing to deploy: the first two bound the
// rest, and hindsight is a reference, not a bound.

// Reference reports whether a pipeline name is a reference's (static:N,
// switch:…, clairvoyant[:…] or hindsight[:…]) rather than a signal
// pipeline's, and which.
func Reference(name string) (kind string, ok bool) {
	base, _, _ := strings.Cut(name, ":")
	if base == "static" || base == "switch" || base == "clairvoyant" || base == "hindsight" {
		return base, true
	}
	return "", false
}

// planOnly is the part of Pipeline a planner does not use: KEDA and the
// HPA never ask it.
type planOnly struct{ noHooks }

var errPlanned = errors.New("a planned pipeline has no metric: it sets the replica count itself")

func (planOnly) Metric(*world) (float64, error) { return 0, errPlanned }
func (planOnly) Active(*world) (bool, error)    { return false, errPlanned }

// ---- static:N ---------------------------------------------------------------

// staticPipe is a fixed fleet: N replicas, warm at 0, all run long.
type staticPipe struct {
	planOnly
	n int32
}

// maxStatic bounds N (a typo such as static:1000000 would only burn memory).
const maxStatic = 10_000

func newStatic(name, args string, _ *Config) (Pipeline, error) {
	n, err := strconv.ParseInt(args, 10, 32)
	if err != nil || n < 1 || n > maxStatic {
		return nil, fmt.Errorf("pipeline %q: want static:N with N a whole number from 1 to %d", name, maxStatic)
	}
	return &staticPipe{n: int32(n)}, nil
}

func (s *staticPipe) Attach(*world)        {}
func (s *staticPipe) Initial(*world) int32 { return s.n }

// ---- switch:from=N,to=M,at=F ---------------------------------------------------

// switchPipe is a fixed fleet that changes once: N replicas, warm at 0,
// and M from the time a fraction F of the way through the scored window
// (from the end of the warm-up to the last arrival); a replica added then
// starts then, one removed drains. A plan with foresight may pick it, as
// it may pick a fixed fleet: between two fleet sizes, the clairvoyant's
// plans, which size the fleet for the peak of a coming startup time, are
// often one size or the next for the whole window, and a pipeline that
// moves from one to the other within it lies between them (docs/
// simulation.md, "The benchmark").
type switchPipe struct {
	planOnly
	from, to int32
	at       float64
}

func newSwitch(name, args string, _ *Config) (Pipeline, error) {
	s, err := parseSwitch(name, args)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// parseSwitch reads from=N,to=M,at=F: N and M from 1 to maxStatic and
// different, F strictly between 0 and 1; every key is required.
func parseSwitch(name, args string) (switchPipe, error) {
	var s switchPipe
	seen := map[string]bool{}
	var errs []error
	for _, kv := range strings.Split(args, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if seen[k] {
			errs = append(errs, fmt.Errorf("%s given twice", k))
		}
		seen[k] = true
		switch k {
		case "from", "to":
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 1 || n > maxStatic {
				errs = append(errs, fmt.Errorf("%s %q: want a whole number from 1 to %d", k, v, maxStatic))
			}
			if k == "from" {
				s.from = int32(n)
			} else {
				s.to = int32(n)
			}
		case "at":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0 && f < 1) {
				errs = append(errs, fmt.Errorf("at %q: want a fraction of the scored window above 0 and below 1", v))
			}
			s.at = f
		default:
			errs = append(errs, fmt.Errorf("unknown key %q (from, to, at)", k))
		}
	}
	for _, k := range []string{"from", "to", "at"} {
		if !seen[k] {
			errs = append(errs, fmt.Errorf("%s is required", k))
		}
	}
	if len(errs) == 0 && s.from == s.to {
		errs = append(errs, fmt.Errorf("from and to are both %d: that is static:%d", s.from, s.from))
	}
	if len(errs) > 0 {
		return s, fmt.Errorf("pipeline %q: want switch:from=N,to=M,at=F: %w", name, errors.Join(errs...))
	}
	return s, nil
}

// SwitchName names the plan of from replicas, then to from a fraction at
// of the scored window.
func SwitchName(from, to int32, at float64) string {
	return fmt.Sprintf("switch:from=%d,to=%d,at=%s", from, to, strconv.FormatFloat(at, 'g', -1, 64))
}

// Attach sets the fleet to s.to at its time.
func (s *switchPipe) Attach(w *world) {
	last := w.cfg.Trace[len(w.cfg.Trace)-1].At
	start := max(w.cfg.Warmup, 0) // as the scores count it (-1: none)
	t := start + time.Duration(s.at*float64(last-start))
	w.at(t, func() { w.setSpec(s.to, true) })
}

func (s *switchPipe) Initial(*world) int32 { return s.from }

// ---- clairvoyant --------------------------------------------------------------

// Clairvoyant's defaults (docs/simulation.md says why).
const (
	DefaultClairvoyantWindow      = 30 * time.Second
	DefaultClairvoyantUtilisation = 0.7
)

// clairvoyant knows every arrival and every request's lengths in advance,
// and the startup time of each replica it will create. Every second it sets
// the replica count to what the coming horizon needs: for each second τ of
// [now, now+horizon], the work arriving in [τ, τ+window) spread over the
// window, in replicas at the target utilisation; the count is the largest
// of those. The horizon is a fixed look-ahead, or each replica's own
// startup (a replica started now serves from then on; fewest says how): a
// replica is added a whole startup time of its own before it is needed,
// and released only once no peak within the startup that would bring it
// back needs it. With a hold, the
// count is also at least what each second of the last hold needed: the
// same foresight, capacity kept after a peak rather than released and
// started again (a replica started again costs its startup's GPU time, and
// a queue left at a peak's end drains sooner), so that plans which keep
// capacity, as a reactive one must, are in the family too.
//
// A request's work is counted in the replica's two resources, from the
// profile's step model: compute (replica-seconds: β1 per prompt token, and
// per generated token β2 plus β0 shared over the batch at which a step
// costs twice β0, b* = β0/β2 capped at maxNumSeqs) and KV cache
// (token-seconds over the cache: its prompt and half its output held while
// it decodes at that batch's step time). A replica's capacity is one of
// each per second; the need is the larger.
type clairvoyant struct {
	planOnly
	window, horizon time.Duration // horizon 0: each place's own startup (fewest)
	hold            time.Duration // 0: none
	util            float64
	lo, hi          int32
	need            []float64 // per second: replicas needed (before utilisation)
	needMax         maxTable  // need's most over any range of seconds
	top             int32     // the most any second needs, in replicas
	run             []float64 // ahead's running maximum
}

func newClairvoyant(name, args string, cfg *Config) (Pipeline, error) {
	c, d, err := newPlan(name, args, cfg, planDurations["clairvoyant"]...)
	if err != nil {
		return nil, err
	}
	c.horizon, c.hold = d["horizon"], d["hold"]
	return &c, nil
}

// newPlan is the part clairvoyant and hindsight share: the defaults, the
// window and utilisation parsed, the ScaledObject's bounds; it returns the
// other durations parsed for the caller to place.
func newPlan(name, args string, cfg *Config, durations ...string) (clairvoyant, map[string]time.Duration, error) {
	c := clairvoyant{window: DefaultClairvoyantWindow, util: DefaultClairvoyantUtilisation}
	d, err := planArgs(name, args, &c.util, durations...)
	if err != nil {
		return c, nil, err
	}
	if w, ok := d["window"]; ok {
		c.window = w
	}
	so := cfg.ScaledObject
	c.lo, c.hi = so.MinReplicas(), so.MaxReplicas()
	return c, d, nil
}

// planDurations are the duration keys each planned kind takes, in the
// order PlanKey writes them.
var planDurations = map[string][]string{"clairvoyant": {"window", "horizon", "hold"}, "hindsight": {"window", "hold"}}

// PlanKey is a clairvoyant, hindsight or switch plan's name written one
// way (a switch: SwitchName's); for the first two: its
// kind, the utilisation and window with their defaults filled in, then any
// other duration given, each value as Go writes it. Two names that plan
// alike (keys in another order, 1m against 1m0s, a default written out)
// have the same key. ok is false for any other pipeline, or a name that
// does not parse.
func PlanKey(name string) (key string, ok bool) {
	kind, args, _ := strings.Cut(name, ":")
	if kind == "switch" {
		s, err := parseSwitch(name, args)
		if err != nil {
			return "", false
		}
		return SwitchName(s.from, s.to, s.at), true
	}
	durs, planned := planDurations[kind]
	if !planned {
		return "", false
	}
	util := DefaultClairvoyantUtilisation
	d, err := planArgs(name, args, &util, durs...)
	if err != nil {
		return "", false
	}
	if _, ok := d["window"]; !ok {
		d["window"] = DefaultClairvoyantWindow
	}
	key = kind + ":utilisation=" + strconv.FormatFloat(util, 'g', -1, 64)
	for _, k := range durs {
		if v, ok := d[k]; ok {
			key += "," + k + "=" + v.String()
		}
	}
	return key, true
}

// planArgs parses a planned pipeline's key=value list: the durations named
// (1s to 24h) and utilisation (above 0, at most 4; left as it is unless
// given). A key not named is refused with the keys that are.
func planArgs(name, args string, util *float64, durations ...string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	keys := append(append([]string(nil), durations...), "utilisation")
	var errs []error
	seen := map[string]bool{}
	for _, kv := range strings.Split(args, ",") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		if seen[k] {
			errs = append(errs, fmt.Errorf("%s given twice", k))
		}
		seen[k] = true
		switch {
		case k == "utilisation":
			u, err := strconv.ParseFloat(v, 64)
			if err != nil || !(u > 0 && u <= 4) {
				errs = append(errs, fmt.Errorf("utilisation %q: want a number above 0 and at most 4", v))
			}
			*util = u
		case slices.Contains(durations, k):
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > 24*time.Hour {
				errs = append(errs, fmt.Errorf("%s %q: want a duration from 1s to 24h", k, v))
			}
			out[k] = d
		default:
			errs = append(errs, fmt.Errorf("unknown key %q (%s)", k, strings.Join(keys, ", ")))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("pipeline %q: %w", name, errors.Join(errs...))
	}
	return out, nil
}

// Work is one request's demand on a replica of profile p: replica-seconds
// of compute and KV-cache token-seconds (the clairvoyant's model). Its
// decode is a share of a step of batch sequences like it: batch is where
// the step's fixed cost is its sequences' (beta0/beta2), at most
// max_num_seqs and what the KV cache holds of its context, and the step
// lasts at least the time to read the weights and those contexts (the
// profile's bandwidth floor). Its prefill attends to its prompt as it goes
// (PrefillUnits).
func Work(p *replica.Profile, prompt, output int) (compute, kv float64) {
	ctx := float64(prompt) + float64(output)/2
	batch := math.Min(p.Beta0Seconds/math.Max(p.Beta2Seconds, 1e-12), float64(p.MaxNumSeqs))
	batch = math.Max(math.Min(batch, float64(p.KVCacheTokens)/math.Max(ctx, 1)), 1)
	step := math.Max(p.Beta0Seconds+p.Beta2Seconds*batch, p.ReadSeconds(batch*ctx))
	perToken := step / batch
	prefill := p.Beta1Seconds * p.PrefillUnits(prompt, 0)
	decode := perToken * float64(output)
	compute = prefill + decode
	kv = ctx * (prefill + step*float64(output))
	return compute, kv
}

// Attach turns the trace into the replicas each second needs.
func (c *clairvoyant) Attach(w *world) {
	c.needs(w)
	w.every(time.Second, time.Second, func() { w.setSpec(c.plan(w), true) })
}

// needs sets c.need: for each second t, the work arriving in
// [t, t+window), spread over the window, in replicas.
func (c *clairvoyant) needs(w *world) {
	p := w.cfg.Profile
	n := int(w.cfg.horizon/time.Second) + 2
	compute, kv := make([]float64, n+1), make([]float64, n+1) // prefix sums by arrival second
	for _, r := range w.cfg.Trace {
		if r.Prompt+max(r.Output, 1) > p.MaxModelLen {
			continue // refused: no work
		}
		i := min(int(r.At/time.Second), n-1)
		cw, kw := Work(p, r.Prompt, max(r.Output, 1))
		compute[i+1] += cw
		kv[i+1] += kw
	}
	for i := 1; i <= n; i++ {
		compute[i] += compute[i-1]
		kv[i] += kv[i-1]
	}
	win := max(int(c.window/time.Second), 1)
	need := make([]float64, n)
	for t := range n {
		e := min(t+win, n)
		cw := (compute[e] - compute[t]) / float64(win)
		kw := (kv[e] - kv[t]) / float64(win) / float64(p.KVCacheTokens)
		need[t] = math.Max(cw, kw)
	}
	c.setNeed(need)
}

// setNeed sets what each second needs, and the most of them.
func (c *clairvoyant) setNeed(need []float64) {
	c.need, c.needMax = need, newMaxTable(need)
	c.top = c.replicas(slices.Max(append([]float64{0}, need...)))
}

// plan is the replica count for now.
func (c *clairvoyant) plan(w *world) int32 {
	if c.horizon > 0 {
		return c.fixed(w.now)
	}
	have := w.removalOrder()
	return c.bound(c.fewest(w, c.held(w.now), have, int32(len(have))))
}

// fixed is the count with a fixed horizon: the most any second of the
// hold and the horizon around now needs.
func (c *clairvoyant) fixed(now time.Duration) int32 {
	return c.bound(c.replicas(c.most(now-c.hold, now+c.horizon)))
}

// held is the count the hold keeps: the most any second of the hold
// before now needed.
func (c *clairvoyant) held(now time.Duration) int32 { return c.replicas(c.most(now-c.hold, now)) }

// fewest is the fewest replicas, at least from, that leave no place above
// them needed: place k (the k-th a scale-down spares; those beyond the
// replicas it has, the ones it would add, in the order it would create
// them) is needed when some second within its lead needs k replicas or
// more. A place left empty now is filled later by a replica created then,
// so its lead is the startup that replica would draw: with n kept of the
// replicas it has (or all of them and n-len(have) added), place k's
// replica is the (k-min(n, have))-th created from now. A starting
// replica's place leads by the longer of that and the rest of its own
// startup (released, it would not be Ready sooner). So capacity is added a
// whole startup time of its own before it is needed, and a replica is
// released only once no peak within the startup that would bring it back
// needs it.
//
// have is the replicas it has in removal order, and held how many places
// it holds (len(have); at 0, a warm fleet of any size, which draws no
// startup: Initial).
func (c *clairvoyant) fewest(w *world, from int32, have []*rep, held int32) int32 {
	now := int(w.now / time.Second)
	c.run = c.run[:0] // ahead's running maximum, from this second
	most := min(c.hi, c.top)
	n := max(from, 0)
	for ; n < most; n++ {
		needed := false
		for k := n + 1; k <= most && !needed; k++ {
			lead := w.peekStartup(int(k - min(n, held) - 1))
			if i := len(have) - int(k); i >= 0 && have[i].state == starting {
				lead = max(lead, have[i].due-w.now)
			}
			needed = c.replicas(c.ahead(now, lead)) >= k
		}
		if !needed {
			break
		}
	}
	return n
}

// most is the most any second of [from, to] needs.
func (c *clairvoyant) most(from, to time.Duration) float64 {
	return c.needMax.most(int(from/time.Second), int(to/time.Second))
}

// maxTable answers the most of any range of a series in constant time: a
// sparse table, its level j the most of each run of 2^j values from each
// index (so a range is the most of two runs that cover it). The plans ask
// every second for the most of their hold, up to an hour of seconds: a walk
// over the range was a seventh of a suite's time.
type maxTable [][]float64

func newMaxTable(v []float64) maxTable {
	t := maxTable{v}
	for w := 1; 2*w <= len(v); w *= 2 {
		prev := t[len(t)-1]
		next := make([]float64, len(prev)-w)
		for i := range next {
			next[i] = math.Max(prev[i], prev[i+w])
		}
		t = append(t, next)
	}
	return t
}

// most is the most of the values from index from to index to, both within
// the series (clipped to it), and at least 0 (0 for a range outside it).
func (t maxTable) most(from, to int) float64 {
	if len(t) == 0 {
		return 0
	}
	from, to = max(from, 0), min(to, len(t[0])-1)
	if from > to {
		return 0
	}
	j := bits.Len(uint(to-from+1)) - 1
	return math.Max(0, math.Max(t[j][from], t[j][to-(1<<j)+1]))
}

// ahead is the most any second of [from, from+d] needs (from in whole
// seconds), read off the running maximum in c.run (c.run[i]: the most of
// seconds from … from+i), which it extends as far as d asks; fewest
// empties it for each second it plans.
func (c *clairvoyant) ahead(from int, d time.Duration) float64 {
	// Up to the second a replica started a second later would miss.
	to := min(from+int((d+time.Second-1)/time.Second), len(c.need)-1)
	for t := from + len(c.run); t <= to; t++ {
		v := c.need[t]
		if n := len(c.run); n > 0 {
			v = math.Max(v, c.run[n-1])
		}
		c.run = append(c.run, v)
	}
	if i := min(to-from, len(c.run)-1); i >= 0 {
		return c.run[i]
	}
	return 0
}

// replicas is the count a need takes at the target utilisation (at most
// maxStatic: past any ScaledObject's maxReplicaCount the plan keeps).
func (c *clairvoyant) replicas(need float64) int32 {
	return int32(math.Min(math.Ceil(need/c.util-1e-9), maxStatic))
}

// bound is n within the ScaledObject's bounds.
func (c *clairvoyant) bound(n int32) int32 { return min(max(n, c.lo), c.hi) }

// Initial: the fleet warm at 0 (it knew: its replicas need no lead, and
// draw no startup). With a fixed horizon, what the hold and the horizon
// ask for; else the fewest that leave no place above them needed (fewest,
// every place up to them warm): the fleet its plan keeps a second later.
func (c *clairvoyant) Initial(w *world) int32 {
	if c.horizon > 0 {
		return c.fixed(w.now)
	}
	return c.bound(c.fewest(w, c.held(w.now), nil, math.MaxInt32))
}

// ---- hindsight --------------------------------------------------------------

// hindsight knows every arrival and its lengths once it has arrived, and
// nothing before: perfect measurement, no foresight. Every second it sets
// the replica count to what the last hold needed: for each second τ of
// [now-hold, now], the work that arrived in [τ-window, τ), spread over the
// window, in replicas at the target utilisation (the clairvoyant's model of
// a request's work); the count is the largest of those. The hold is the
// startup time of the next replica it would create, or fixed. It starts at
// minReplicaCount, knowing nothing (with a warm start, with the signal
// pipelines' fleet). It is no bound — a reactive plan could
// hold other capacity — but the best of a plain family that needs neither
// a signal nor learning: what a reactive plan with perfect measurement and
// a known capacity reaches, and so how much of a loss no measurement
// could have saved, and only foresight (or capacity held for a jump not yet
// seen) would.
type hindsight struct{ clairvoyant }

func newHindsight(name, args string, cfg *Config) (Pipeline, error) {
	c, d, err := newPlan(name, args, cfg, planDurations["hindsight"]...)
	if err != nil {
		return nil, err
	}
	c.horizon = d["hold"] // its hold looks back as the clairvoyant's horizon looks ahead
	return &hindsight{c}, nil
}

// Attach turns the trace into the replicas each second needed.
func (h *hindsight) Attach(w *world) {
	h.needs(w)
	w.every(time.Second, time.Second, func() { w.setSpec(h.plan(w), true) })
}

// plan is the replica count for now, from the work that arrived in the
// hold and the window before it.
func (h *hindsight) plan(w *world) int32 {
	hold := h.horizon
	if hold == 0 {
		hold = w.peekStartup(0)
	}
	win := max(int(h.window/time.Second), 1)
	to := int(w.now/time.Second) - win // the last window wholly arrived
	if to < 0 {
		return w.spec // none has: it keeps the fleet it started with
	}
	most := h.needMax.most(to-int(hold/time.Second), to)
	n := int32(math.Ceil(most/h.util - 1e-9))
	return min(max(n, h.lo), h.hi)
}

// Initial: minReplicaCount (it has seen nothing), or a warm start's fleet
// as the signal pipelines have it (world.run).
func (h *hindsight) Initial(*world) int32 { return h.lo }
