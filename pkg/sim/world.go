package sim

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/sim/hpa"
	"github.com/pulse-io/pulse/pkg/sim/replica"
)

// A world is one pipeline's copy of the cluster: the same trace and profile,
// its own replicas, load balancer, KEDA and HPA. Worlds share nothing, so
// they run in parallel and each is deterministic for a seed.
type world struct {
	cfg  *Config
	pipe Pipeline
	now  time.Duration
	ev   eventHeap
	seq  uint64
	// acts[i] is what the event in slot i does; free is the slots
	// whose action has been taken (take).
	acts []action
	free []int32
	rng  *rand.Rand

	reps   []*rep // existing: starting, ready, terminating; by id
	ready  []*rep // ready, by id
	nextID int
	rr     int
	spec   int32 // /scale spec.replicas
	gate   []*replica.Request

	// startups drawn ahead of their replicas (a planner's foresight), in
	// the order replicas will take them.
	startups []time.Duration
	order    []*rep // removalOrder's, reused
	warm     bool   // warmFleet is creating the fleet at 0

	hpa      *hpa.Controller
	target   hpa.Target
	lastAct  time.Duration // KEDA's lastActiveTime; -1: never
	failures int32
	// hpaActive is the HPA's ScalingActive condition after its last sync:
	// it computed a replica count from the metric (KEDA's fallback
	// included). False before the first sync, at 0 replicas (scaling
	// disabled) and after a sync whose metric failed; above the maximum or
	// below the minimum the HPA asks for no metric and leaves it.
	// hpaFallback: that sync's metric was KEDA's fallback.
	hpaActive, hpaFallback bool

	st stats
}

type repState uint8

const (
	starting repState = iota
	ready
	terminating
)

type rep struct {
	hist    []metric.Sample // 1 s samples over the trigger's window, for rate metrics' true value
	id      int
	uid     string
	name    string
	r       *replica.Replica
	state   repState
	created time.Duration
	due     time.Duration // created + its startup: Ready then, if still starting
	readyAt time.Duration
	gen     uint64
	pending bool
	at      time.Duration
}

// event is the action in slot run at at, the seq-th scheduled. It holds
// no pointer, so the heap moves it with no write barrier (while the GC
// marked, the barriers on moving events with their closures were a tenth
// of a suite's time).
type event struct {
	at   time.Duration
	seq  uint64
	slot int32
}

// action is fn, or, with rp set, rp's next step (step): a replica's
// steps, the most frequent event, make no closure each.
type action struct {
	fn  func()
	rp  *rep
	gen uint64
}

// eventHeap is the events in order of time, then of scheduling: a binary
// heap of the values themselves (container/heap boxed each one pushed and
// popped into an interface, an allocation an event, a quarter of the
// simulator's time with the GC's share).
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	for i := len(s) - 1; i > 0; {
		up := (i - 1) / 2
		if !s.less(i, up) {
			break
		}
		s[i], s[up] = s[up], s[i]
		i = up
	}
}

// pop takes the first event; h must not be empty.
func (h *eventHeap) pop() event {
	s := *h
	e, n := s[0], len(s)-1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && s.less(r, j) {
			j = r
		}
		if !s.less(j, i) {
			break
		}
		s[i], s[j] = s[j], s[i]
		i = j
	}
	*h = s
	return e
}

// at runs fn at t (after anything already scheduled for t).
func (w *world) at(t time.Duration, fn func()) { w.post(t, action{fn: fn}) }

// post schedules a at t (after anything already scheduled for t).
func (w *world) post(t time.Duration, a action) {
	w.seq++
	var i int32
	if n := len(w.free); n > 0 {
		i, w.free = w.free[n-1], w.free[:n-1]
		w.acts[i] = a
	} else {
		i = int32(len(w.acts))
		w.acts = append(w.acts, a)
	}
	w.ev.push(event{at: max(t, w.now), seq: w.seq, slot: i})
}

// take is e's action, its slot freed.
func (w *world) take(e event) action {
	a := w.acts[e.slot]
	w.acts[e.slot] = action{}
	w.free = append(w.free, e.slot)
	return a
}

// every runs fn at phase, phase + period, ... until the end.
func (w *world) every(phase, period time.Duration, fn func()) {
	var tick func()
	next := phase
	tick = func() {
		fn()
		next += period
		if next <= w.cfg.horizon {
			w.at(next, tick)
		}
	}
	w.at(next, tick)
}

// phase is a stable offset within period for a name, as Prometheus and
// pulse's agent spread their targets' scrapes.
func phase(name string, period time.Duration) time.Duration {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return time.Duration(h.Sum64() % uint64(period))
}

func newWorld(cfg *Config, pipe Pipeline) *world {
	w := &world{cfg: cfg, pipe: pipe, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), lastAct: -1}
	w.st.init(cfg)
	so := cfg.ScaledObject
	w.hpa = hpa.New(hpa.Spec{MinReplicas: so.HPAMinReplicas(), MaxReplicas: so.MaxReplicas(), Behavior: so.Behavior()}, cfg.HPA)
	w.target = hpa.Target{AverageValue: so.PulseTrigger().MetricType != "Value", Milli: scaler.KEDAMilli(cfg.trigger.Threshold)}
	return w
}

// planner is a pipeline that sets the replica count itself (/scale
// spec.replicas), with neither KEDA nor the HPA: the references static:N,
// clairvoyant and hindsight.
type planner interface {
	Pipeline
	// Initial is the warm fleet at 0.
	Initial(w *world) int32
}

// run simulates from 0 to the horizon.
func (w *world) run() *PipelineResult {
	cfg := w.cfg
	w.pipe.Attach(w)
	pl, planned := w.pipe.(planner)
	initial := cfg.initialReplicas
	_, hind := w.pipe.(*hindsight)
	switch {
	case cfg.WarmStart && hind:
		initial = w.warmStart(pl.Initial(w))
	case cfg.WarmStart && !planned: // the signal pipelines
		initial = w.warmStart(cfg.initialReplicas)
		// A service already serving was active a moment ago: with
		// minReplicaCount 0 and no lastActiveTime, KEDA's first inactive
		// poll took the warm fleet to zero (its initial cooldown, 0 by
		// default, passed).
		w.lastAct = 0
	case planned:
		initial = pl.Initial(w)
	}
	w.warmFleet(initial)
	w.scheduleArrivals()
	if !planned {
		w.every(cfg.hpaPhase, cfg.HPASyncPeriod, w.hpaSync)
		w.every(cfg.kedaPhase, cfg.ScaledObject.PollingInterval(), w.kedaPoll)
	}
	w.every(0, cfg.SampleEvery, w.sample)
	if _, gauge := gaugeOf(cfg.trigger.Metric); !gauge {
		w.every(0, time.Second, w.recordHistory)
	}
	w.every(cfg.SampleEvery/2, time.Second, w.watchLoadRise)
	for len(w.ev) > 0 {
		e := w.ev.pop()
		if e.at > cfg.horizon {
			break
		}
		w.st.account(w, e.at)
		w.now = e.at
		w.fire(w.take(e))
	}
	w.st.account(w, cfg.horizon)
	w.now = cfg.horizon
	return w.st.result(w)
}

// warmStart is the fleet a warm start has at 0: what the clairvoyant's
// default plan has (Config.WarmStart), and at least what the pipeline's
// cold start has (floor: the HPA's minimum, hindsight's minReplicaCount).
func (w *world) warmStart(floor int32) int32 {
	c, _, _ := newPlan("clairvoyant", "", w.cfg) // no argument to refuse
	c.needs(w)
	return max(c.Initial(w), floor)
}

func (w *world) scheduleArrivals() {
	reqs := w.cfg.Trace
	i := 0
	var next func()
	next = func() {
		for i < len(reqs) && reqs[i].At <= w.now {
			tr := reqs[i]
			q := replica.NewRequest(i, tr.Prompt, tr.Output, tr.At)
			w.st.requests = append(w.st.requests, q)
			if tr.Prompt+q.Output > w.cfg.Profile.MaxModelLen {
				w.st.refused++ // vLLM answers 400: never served
			} else {
				w.dispatch(q)
				if d := w.cfg.ClientTimeout; d > 0 {
					w.at(q.Arrival+d, func() { w.abandon(q) })
				}
			}
			i++
		}
		if i < len(reqs) {
			w.at(reqs[i].At, next)
		}
	}
	if len(reqs) > 0 {
		w.at(reqs[0].At, next)
	}
}

// abandon is a client giving up on a request with no first token yet: it
// leaves the gateway or its replica, and counts a miss.
func (w *world) abandon(q *replica.Request) {
	if q.FirstToken >= 0 || w.st.droppedIDs[q.ID] {
		return
	}
	if i := slices.Index(w.gate, q); i >= 0 {
		w.gate = slices.Delete(w.gate, i, i+1)
		w.st.abandoned++
		return
	}
	for _, rp := range w.reps {
		w.touch(rp)
		if q.FirstToken >= 0 {
			return // its first token came in the step that just ended
		}
		if rp.r.Abandon(q) {
			w.st.abandoned++
			if rp.state == terminating && rp.r.Outstanding() == 0 {
				w.remove(rp)
				return
			}
			w.schedule(rp)
			w.flushGate()
			return
		}
	}
}

// room: a replica the gateway would send a request to now.
func room(rp *rep) bool {
	return rp.r.Waiting() < GatewayQueueDepth && rp.r.KVUsage() < GatewayKVCache
}

// flushGate sends requests held by a flow-controlled gateway to replicas
// with room, oldest first.
func (w *world) flushGate() {
	if w.cfg.Balancer != BalanceGateway || len(w.gate) == 0 {
		return
	}
	for len(w.gate) > 0 {
		rp := w.pickRoom()
		if rp == nil {
			return
		}
		q := w.gate[0]
		w.gate = w.gate[1:]
		rp.r.Enqueue(w.now, q)
		w.schedule(rp)
	}
}

// pickRoom is the ready replica with room and the fewest requests in
// flight; nil when none has room.
func (w *world) pickRoom() *rep {
	var best *rep
	for _, c := range w.ready {
		w.touch(c)
		if room(c) && (best == nil || c.r.Outstanding() < best.r.Outstanding()) {
			best = c
		}
	}
	return best
}

// dispatch sends a request to a ready replica, or holds it at the gateway.
func (w *world) dispatch(q *replica.Request) {
	if len(w.ready) == 0 {
		w.gate = append(w.gate, q)
		w.pipe.Demand(w)
		return
	}
	var rp *rep
	switch w.cfg.Balancer {
	case BalanceGateway:
		if len(w.gate) == 0 {
			rp = w.pickRoom()
		}
		if rp == nil {
			w.gate = append(w.gate, q)
			return
		}
	case BalanceLeastOutstanding:
		for _, c := range w.ready {
			if rp == nil || c.r.Outstanding() < rp.r.Outstanding() {
				rp = c
			}
		}
	default: // round-robin
		w.rr = (w.rr + 1) % len(w.ready)
		rp = w.ready[w.rr]
	}
	rp.r.AdvanceTo(w.now)
	rp.r.Enqueue(w.now, q)
	w.schedule(rp)
}

// schedule keeps one pending event for the replica's next state change.
func (w *world) schedule(rp *rep) {
	t, ok := rp.r.NextEvent()
	if !ok || (rp.pending && rp.at == t) {
		rp.pending = rp.pending && ok
		return
	}
	rp.gen++
	rp.pending, rp.at = true, t
	w.post(t, action{rp: rp, gen: rp.gen})
}

// fire runs a.
func (w *world) fire(a action) {
	if a.rp != nil {
		w.step(a.rp, a.gen)
		return
	}
	a.fn()
}

// step is rp's next event, scheduled as generation gen: unless
// rescheduled since, it advances rp to now and schedules the next.
func (w *world) step(rp *rep, gen uint64) {
	if rp.gen != gen {
		return
	}
	rp.pending = false
	rp.r.AdvanceTo(w.now)
	if rp.state == terminating && rp.r.Outstanding() == 0 {
		w.remove(rp)
		return
	}
	w.schedule(rp)
	w.flushGate()
}

// Touch advances a replica to now (before its values are read).
func (w *world) touch(rp *rep) {
	rp.r.AdvanceTo(w.now)
	w.schedule(rp)
}

// setSpec is an update of /scale spec.replicas: the workload's controller
// adds replicas (starting) or removes them, not-ready ones first, then the
// most recently ready (a ReplicaSet's choice without LogarithmicScaleDown,
// which ties ready times within a power of two and breaks the tie by uid:
// docs/simulation.md, "The model").
func (w *world) setSpec(n int32, record bool) {
	if n == w.spec && record {
		return
	}
	if record {
		w.st.scaleEvent(w.now, w.spec, n)
	}
	w.spec = n
	live := int32(0)
	for _, rp := range w.reps {
		if rp.state != terminating {
			live++
		}
	}
	for ; live < n; live++ {
		w.addReplica()
	}
	if live <= n {
		return
	}
	// Only a scale-down needs the order (retire's hooks may ask for it
	// again: a copy).
	a := slices.Clone(w.removalOrder())
	for i := 0; int32(len(a)-i) > n; i++ {
		w.retire(a[i])
	}
}

// removalOrder is the replicas not terminating, in the order a scale-down
// removes them: the starting ones first, the newest first, then the most
// recently ready (of two created, or Ready, at once, the later created).
// The slice is the world's, overwritten by the next call.
func (w *world) removalOrder() []*rep {
	a := w.order[:0]
	for _, rp := range w.reps {
		if rp.state != terminating {
			a = append(a, rp)
		}
	}
	slices.SortFunc(a, func(x, y *rep) int {
		if (x.state == starting) != (y.state == starting) {
			if x.state == starting {
				return -1
			}
			return 1
		}
		at := func(r *rep) time.Duration {
			if r.state == starting {
				return r.created
			}
			return r.readyAt
		}
		if c := cmp.Compare(at(y), at(x)); c != 0 {
			return c
		}
		return cmp.Compare(y.id, x.id)
	})
	w.order = a
	return a
}

// warmFleet creates n replicas Ready at 0 (a warm fleet). They draw no
// startup: the first replica any pipeline creates after 0 draws the
// first.
func (w *world) warmFleet(n int32) {
	w.warm = true
	w.setSpec(n, false)
	w.warm = false
	for _, rp := range append([]*rep(nil), w.reps...) {
		w.becomeReady(rp)
	}
}

func (w *world) addReplica() {
	w.nextID++
	rp := &rep{id: w.nextID, created: w.now}
	rp.name = fmt.Sprintf("%s-%d", w.cfg.ScaledObject.Spec.ScaleTargetRef.Name, rp.id)
	// Real UIDs are random, so a pod's scrape phases (pulse's agent's and
	// Prometheus') fall anywhere relative to the traffic: vary them by seed.
	rp.uid = fmt.Sprintf("uid-%d-%d", w.cfg.Seed, rp.id)
	rp.r = replica.New(w.cfg.Profile, &w.st)
	// The agents forward histograms where the trigger reads them: a
	// quantile metric, or the planner with a percentile SLO.
	rp.r.Histograms = w.cfg.trigger.Def().Rule == metric.RuleQuantile || w.cfg.trigger.SLOPercentile > 0
	w.reps = append(w.reps, rp)
	w.pipe.ReplicaAdded(w, rp)
	if w.warm {
		return // warmFleet makes it Ready
	}
	startup := w.peekStartup(0)
	w.startups = w.startups[1:]
	rp.due = w.now + startup
	w.at(w.now+startup, func() {
		if rp.state == starting && w.exists(rp) {
			w.becomeReady(rp)
		}
	})
}

// peekStartup is the startup time the replica created i-th from now will
// take (0: the next). The draws are made in the order replicas take them,
// whoever looks ahead, so every pipeline's k-th replica starts as slowly.
func (w *world) peekStartup(i int) time.Duration {
	for len(w.startups) <= i {
		w.startups = append(w.startups, w.cfg.Profile.StartupTime(w.rng.NormFloat64()))
	}
	return w.startups[i]
}

func (w *world) exists(rp *rep) bool { return slices.Contains(w.reps, rp) }

func (w *world) becomeReady(rp *rep) {
	rp.state, rp.readyAt = ready, w.now
	w.ready = append(w.ready, rp)
	sort.Slice(w.ready, func(i, j int) bool { return w.ready[i].id < w.ready[j].id })
	w.pipe.ReplicaReady(w, rp)
	if w.cfg.Balancer == BalanceGateway {
		w.flushGate()
		return
	}
	held := w.gate
	w.gate = nil
	for _, q := range held {
		w.dispatch(q)
	}
}

// retire removes a replica: a starting one at once; a ready one stops
// taking requests and finishes (or, with DropOnScaleDown, drops) its own,
// those not finished within TerminationGrace dropped then.
func (w *world) retire(rp *rep) {
	if rp.state == starting {
		w.remove(rp)
		return
	}
	rp.state = terminating
	if i := slices.Index(w.ready, rp); i >= 0 {
		w.ready = slices.Delete(w.ready, i, i+1)
	}
	w.pipe.ReplicaTerminating(w, rp)
	rp.r.AdvanceTo(w.now)
	if w.cfg.DropOnScaleDown {
		w.drop(rp)
	}
	if rp.r.Outstanding() == 0 {
		w.remove(rp)
		return
	}
	if g := w.cfg.TerminationGrace; g > 0 {
		w.at(w.now+g, func() {
			if !slices.Contains(w.reps, rp) {
				return // it finished them first
			}
			rp.r.AdvanceTo(w.now)
			w.drop(rp)
			w.remove(rp)
		})
	}
}

// drop drops every request rp holds, running or queued.
func (w *world) drop(rp *rep) {
	for _, q := range rp.r.Drain() {
		w.st.dropped++
		w.st.droppedIDs[q.ID] = true
	}
}

func (w *world) remove(rp *rep) {
	if i := slices.Index(w.reps, rp); i >= 0 {
		w.reps = slices.Delete(w.reps, i, i+1)
	}
	rp.gen++ // cancels its pending event
	w.pipe.ReplicaRemoved(w, rp)
}

// hpaSync is one HPA reconcile, with KEDA's metric path (and fallback).
func (w *world) hpaSync() {
	readyPods := int32(len(w.ready))
	status := readyPods
	if w.cfg.StatusReplicas == StatusAll {
		for _, rp := range w.reps {
			if rp.state == starting {
				status++
			}
		}
	}
	so := w.cfg.ScaledObject
	if w.spec < so.HPAMinReplicas() || w.spec > so.MaxReplicas() {
		// At 0 replicas scaling is disabled (the HPA's minimum is at
		// least 1), and below the minimum or above the maximum the HPA
		// goes to it: it asks KEDA for no metric, so no failure is
		// counted (the metric was asked for, and an error counted).
		if w.spec == 0 {
			w.hpaActive, w.hpaFallback = false, false
		}
		if res := w.hpa.Sync(w.now, hpa.State{SpecReplicas: w.spec, StatusReplicas: status, ReadyPods: readyPods}, nil); res.Rescale {
			w.setSpec(res.Desired, true)
		}
		return
	}
	reading := hpa.Reading{Target: w.target}
	v, err := w.pipe.Metric(w)
	switch {
	case err == nil:
		w.failures = 0
		reading.Milli = scaler.KEDAMilli(v)
	case so.Spec.Fallback != nil:
		// KEDA's fallback (pkg/fallback, doFallback): after
		// failureThreshold failures the metric is the fallback's
		// replicas × target (a Value target's over the ready pods: with
		// none ready, no fallback, and the HPA gets the error).
		reading.Err = err
		if w.fallbackFails() {
			n := float64(so.Spec.Fallback.FallbackReplicas(w.spec))
			if w.target.AverageValue {
				reading.Milli, reading.Err = int64(n*float64(w.target.Milli)), nil
			} else {
				reading.Milli, reading.Err = int64(n/float64(readyPods)*float64(w.target.Milli)), nil
			}
		}
	default:
		reading.Err = err
	}
	if err != nil {
		w.st.metricErrors++
	}
	w.hpaActive, w.hpaFallback = reading.Err == nil, reading.Err == nil && err != nil
	res := w.hpa.Sync(w.now, hpa.State{SpecReplicas: w.spec, StatusReplicas: status, ReadyPods: readyPods}, []hpa.Reading{reading})
	if res.Rescale {
		w.setSpec(res.Desired, true)
	}
}

// kedaPoll is KEDA's scale loop (GetMetrics and IsActive) every
// pollingInterval. With a fallback, a poll that queries the scaler counts
// toward it as the HPA's queries do, and past failureThreshold it is an
// active answer, no error (KEDA v2.21 scale_handler's getScalerState →
// observeMetric → fallback.GetMetricsWithFallback, and its
// isActiveOrFallback): a workload at 0 is scaled from zero, and the
// cooldown restarts. The poll queries the scaler unless the HPA's last
// observation may stand in for it: minReplicaCount at least 1 and the HPA's
// ScalingActive true (UsesHPAObservations, hpaActivelyQuerying): then a
// fallback the HPA's last sync took is an active answer (the observation's
// FallbackActive), and otherwise the pipeline's answer stands for the
// observation's. Only the HPA's syncs counted, and a workload at 0 with
// its scaler failing stayed there.
func (w *world) kedaPoll() {
	active, err := w.pipe.Active(w)
	so := w.cfg.ScaledObject
	if so.MinReplicas() >= 1 && w.hpaActive && w.hpaFallback {
		active, err = true, nil
	}
	if so.Spec.Fallback != nil && (so.MinReplicas() == 0 || !w.hpaActive) {
		if err == nil {
			w.failures = 0
		} else if w.fallbackFails() {
			active, err = true, nil
		}
	}
	w.kedaScale(active, err != nil)
}

// fallbackFails counts a failed query of the scaler toward the fallback
// and says whether KEDA's doFallback answers in its place: past
// failureThreshold, and for a Value target only with pods ready (its
// fallback is over them: with none there is none). The HPA's syncs and
// KEDA's poll count the same failures.
func (w *world) fallbackFails() bool {
	w.failures++
	return w.failures > w.cfg.ScaledObject.Spec.Fallback.FailureThreshold && (w.target.AverageValue || len(w.ready) > 0)
}

// Push is KEDA's reaction to StreamIsActive sending true.
func (w *world) Push() { w.kedaScale(true, false) }

// kedaScale is KEDA's RequestScale: activation from 0, deactivation to 0
// after cooldownPeriod, minReplicaCount.
func (w *world) kedaScale(active, isErr bool) {
	so := w.cfg.ScaledObject
	minR := so.MinReplicas()
	if active {
		if w.spec == 0 {
			w.setSpec(max(minR, 1), true)
		}
		w.lastAct = w.now
		return
	}
	switch {
	case isErr && (so.Spec.Fallback == nil || so.Spec.Fallback.Replicas != 0):
		// an error keeps the replica count (or leads to the fallback);
		// with a fallback of 0 replicas KEDA goes on to scale to zero
		// (pkg/scaling/executor's RequestScale)
	case w.spec > 0 && minR == 0:
		expired := (w.lastAct < 0 && w.now >= so.InitialCooldown()) || (w.lastAct >= 0 && w.now-w.lastAct >= so.Cooldown())
		if expired {
			w.setSpec(0, true)
		}
	case w.spec < minR:
		w.setSpec(minR, true)
	}
}

// sample records the report's time series.
func (w *world) sample() { w.st.sample(w) }

// watchLoadRise finds the first instant at which the true value of the
// trigger's metric asks for more replicas than there are (the load rise
// the first scale-up answers).
func (w *world) watchLoadRise() {
	if w.st.loadRise >= 0 || w.st.firstUp >= 0 {
		return
	}
	ratio := float64(scaler.KEDAMilli(trueValue(w))) / float64(w.target.Milli)
	if !w.target.AverageValue && w.spec > 0 {
		// metricType Value: the HPA asks for ratio × its ready pods
		// (GetExternalMetricReplicas); ceil(ratio) is AverageValue's.
		ratio *= float64(len(w.ready))
	}
	if want := int32(math.Ceil(ratio)); want > w.spec {
		w.st.loadRise = w.now
	}
}

// recordHistory keeps each ready replica's values every second over the
// trigger's window, for the true value of rate and ratio metrics.
func (w *world) recordHistory() {
	keep := w.cfg.trigger.Window + 2*time.Second
	for _, rp := range w.ready {
		w.touch(rp)
		rp.hist = append(rp.hist, metric.Sample{TimeMs: w.now.Milliseconds(), Values: rp.r.Values(), Hist: rp.r.Hist()})
		for len(rp.hist) > 0 && w.now-time.Duration(rp.hist[0].TimeMs)*time.Millisecond > keep {
			rp.hist = rp.hist[1:]
		}
	}
}

func (w *world) history(rp *rep) []metric.Sample { return rp.hist }
