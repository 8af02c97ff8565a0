// Package planner computes the replica count a workload needs to meet its
// latency SLO: the work offered to its replicas, over the capacity each
// replica has shown it sustains (learned from the workload's own pods),
// held for as long as a new replica takes to start (learned too).
//
// Plan is a pure function of one store snapshot and the state learned so
// far; it returns the next state. The scaler (trigger metric replicas),
// pulse-sim and the tests call the same code (docs/planner.md).
package planner

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
)

// Config is the planner's SLO and its design constants. Only the SLO is a
// user's knob (trigger metadata sloTtft, annotation pulse.io/slo-ttft);
// the rest are documented constants (docs/planner.md, "Constants").
type Config struct {
	// TTFT is the time-to-first-token SLO.
	TTFT time.Duration
	// ITL, when above 0, is an inter-token latency SLO: a replica whose
	// mean time between tokens exceeds it is past its capacity too, once a
	// replica of the workload has met it within itlMemory (State.ITLMetAt).
	ITL time.Duration
	// Percentile, when in (0, 1), makes the TTFT SLO a percentile's (0.9:
	// 90 % of first tokens within TTFT), read of each replica's TTFT
	// histogram (the snapshot's TTFTQuantile); 0 plans on means.
	Percentile float64
	// Utilisation of the learned capacity the plan aims at: the headroom
	// for load that rises faster than a replica starts.
	Utilisation float64
	// KVTarget is the KV-cache usage a replica is planned to hold at most.
	KVTarget float64
	// DecodeCost is a generated token's work in prompt tokens.
	DecodeCost float64
	// LeadTime is the startup time assumed before any is observed.
	LeadTime time.Duration
	// HoldMargin is added to the lead time to hold a peak's capacity.
	HoldMargin time.Duration
	// ObserveEvery is the learning cadence: at most one observation of the
	// pods per interval, whatever the evaluation rate.
	ObserveEvery time.Duration
	// ProbeEvery and ProbeStep: with every replica healthy and no break
	// within the hold, the capacity believed is raised by ProbeStep once per
	// ProbeEvery, so that a capacity proven low at light load can grow.
	ProbeEvery time.Duration
	ProbeStep  float64
	// Tolerance: a need at most this fraction over the replicas listed
	// (ready and starting) adds none while no queue stands (the HPA's own
	// default tolerance, which an integer plan would otherwise defeat).
	Tolerance float64
}

// Defaults (docs/planner.md says why each).
const (
	DefaultTTFT         = 2 * time.Second
	DefaultUtilisation  = 0.8
	DefaultKVTarget     = 0.8
	DefaultDecodeCost   = 4
	DefaultLeadTime     = 5 * time.Minute
	DefaultHoldMargin   = time.Minute
	DefaultObserveEvery = 5 * time.Second
	DefaultProbeEvery   = time.Minute
	DefaultProbeStep    = 1.1
	DefaultTolerance    = 0.1
)

// Default is the planner's configuration for a TTFT SLO (0: DefaultTTFT).
func Default(ttft time.Duration) Config {
	if ttft <= 0 {
		ttft = DefaultTTFT
	}
	return Config{TTFT: ttft, Utilisation: DefaultUtilisation, KVTarget: DefaultKVTarget, DecodeCost: DefaultDecodeCost,
		LeadTime: DefaultLeadTime, HoldMargin: DefaultHoldMargin, ObserveEvery: DefaultObserveEvery,
		ProbeEvery: DefaultProbeEvery, ProbeStep: DefaultProbeStep, Tolerance: DefaultTolerance}
}

// Thresholds of a replica's health, as fractions of the TTFT SLO: a
// replica whose requests queued on average longer than breakQueue × SLO,
// or whose mean TTFT was past breakTTFT × SLO with a queue standing (or
// that preempted), was past its capacity; one whose requests queued no
// longer, with under one waiting, was within it. A mean queue time above
// the mean TTFT is not of now (queueOfNow): the TTFT judges, and proves
// capacity only within breakQueue × SLO.
const (
	breakQueue = 0.25
	// Where the TTFT judges (a page without a queue-time histogram, or a
	// queue time not of now), past breakTTFT × SLO with requests waiting
	// broke; with a queue time of now, past it with a queue standing.
	breakTTFT = 0.5
	// learnRate moves the capacity toward a break's throughput.
	learnRate = 0.3
	// minEvidence: a replica's window says nothing of its capacity unless
	// at least this many requests got their first token in it (a queue
	// time of one or two requests is noise, not saturation).
	minEvidence = 5
	// healthyDecay forgets the most a replica served healthy, per
	// ObserveEvery of time (half in 58 minutes at the default 5 s), so that
	// a changed mix of lengths is relearned: by the time elapsed, whether
	// or not the workload was observed meanwhile (at zero, or stale).
	healthyDecay = 0.999
	// maxHoldExtra bounds the hold's regret extension; regretQuiet halves
	// it.
	maxHoldExtra = 30 * time.Minute
	regretQuiet  = time.Hour
	// maxPeaks bounds the peaks held (one per ObserveEvery).
	maxPeaks = 720
	// surgeHalfLife: the surge and the peak work it may return to fade by
	// half in this long, so that traffic that stopped jumping is followed
	// down again.
	surgeHalfLife = time.Hour
	// drainWithin: the queue standing at a replica when capacity asked for
	// now is ready is planned to be gone this long after (the hold margin's
	// minute: four HPA syncs). A replica's queue drains only through that
	// replica (no engine hands queued requests to another), at what its
	// capacity leaves over from its share of new arrivals.
	drainWithin = time.Minute
	// drainFloor: a queue that would take more than this fraction of a
	// replica's capacity to drain within drainWithin is given that fraction
	// (it then drains more slowly), and the replica keeps the rest for new
	// work: the drain asks at most 1/drainFloor times the replicas the work
	// alone needs.
	drainFloor = 0.5
	// itlMemory: an ITL past its SLO is a break only where a replica of
	// the workload met that SLO within this long (State.ITLMetAt). A
	// time between tokens is the model's step at its batch: more
	// replicas shorten it down to the step of a batch of one, never
	// below. An SLO below that floor counted every window a break, and
	// the plan ran to the maximum for an SLO no count meets.
	itlMemory = 30 * time.Minute
)

// Bounds of what is believed of one replica's window. A page that says
// more (its counters jumped, or it lies) is refused for as long as its
// window holds the values: the replica is planned as one with no fresh
// sample (never below the ready count), and the plan names it.
const (
	// maxTokenRate: tokens a second one replica prefills, or generates:
	// over a thousand times the shipped step models' prefill (about 58,000
	// a second on the 8B, 13,000 on the 70B: docs/simulation.md), room
	// for prefix-cache hits, which vLLM counts as prompt tokens.
	maxTokenRate = 1e8
	// maxRequestRate: requests a second that get their first token at one
	// replica, and requests it preempts.
	maxRequestRate = 1e6
	// maxQueue: requests waiting at one replica.
	maxQueue = 1e6
	// minServed: work a second a replica's window must show to teach
	// capacity: less than a token in 15 minutes is no measure of what a
	// replica serves (a break at 1e-306 tokens a second took the capacity
	// there, the need to +Inf, and a plan no JSON can hold).
	minServed = 1e-3
	// maxRise: one observation moves a request's mean work toward at most
	// this many times the mean (it moves a tenth of the way: a window that
	// lies for its whole 30 s moves it by at most 1.1⁶, not by the lie);
	// maxRequestWork bounds the first observation, taken whole: a
	// request's work past 10⁷ is past any model's context.
	maxRise        = 2
	maxRequestWork = 1e7
	// stuckAfter: a replica starting longer than this, or than
	// stuckLeads lead times learned, is stuck (an image that never pulls, a
	// crash before readiness): it is no capacity coming, does not lengthen
	// the lead time, and a startup this long is not learned.
	stuckAfter = time.Hour
	stuckLeads = 3
	// maxStartup: no replica is taken to start longer than this, however
	// long the startups learned (stuckAfter).
	maxStartup = 24 * time.Hour
	// breakMerge: windows of a break's run this fraction of a span apart
	// or closer are kept as one, the least of them (where every call
	// observes, a run keeps about 18 at most); maxBreakRuns: the most replicas'
	// runs kept at once (a break of another is then bounded by theirs).
	breakMerge   = 16
	maxBreakRuns = 8
)

// State is what the planner has learned of one workload. The zero State is
// a workload not seen yet.
type State struct {
	// Since is the workload's first plan (this aggregator process; not an
	// error's): before Since + hold it never plans below the ready count.
	Since time.Time
	// Capacity: work (prompt tokens + DecodeCost × generated tokens) per
	// second a replica sustains within the SLO; 0 until learned.
	Capacity float64
	// Observations: replica-windows that taught the capacity; Breaks: those
	// past it; LastBreak the latest.
	Observations, Breaks int
	LastBreak            time.Time
	// BreakCapacity: the throughput replicas broke at, smoothed; probes
	// never raise the capacity past it. HealthyMax: the most a replica
	// proved within the SLO (proof: what a window served less its
	// standard error); probes never raise the capacity past it over the
	// utilisation (no replica is planned past what one has shown).
	BreakCapacity, HealthyMax float64
	// HoldExtra lengthens the hold after a regret: capacity released and
	// needed again within a lead time (halved after regretQuiet without
	// one). lastFleet, lowPlan, highPlan, released and releasedAt track
	// the releases (regret).
	HoldExtra  time.Duration
	lastFleet  int
	lowPlan    int
	highPlan   int
	released   int
	releasedAt time.Time
	lastRegret time.Time
	// WorkPerRequest: the mean work of a request (prompt tokens and
	// DecodeCost × generated tokens, per request that got its first
	// token): it prices the queue and its growth in work.
	WorkPerRequest float64
	// LeadTime: observed startup, smoothed (mean + 2 deviations); Startups
	// counts the observations; startupsTo is the newest ready time counted,
	// and counted the pods counted that were ready within lateListing of
	// it, by name and ready time (never written: replaced when it changes,
	// as a State is a value).
	LeadTime, leadDev time.Duration
	Startups          int
	startupsTo        time.Time
	counted           map[countedStartup]struct{}
	lastObserve       time.Time
	// loneSince: since when one healthy window alone has shown more than
	// the capacity or proof known (zero: none does), loneSeen the last
	// observation that saw one, loneLevel the least it showed since, and
	// loneFrom what was known before such a window raised the capacity,
	// or proved since, while its wait runs or the capacity is above it
	// (riseBound).
	loneSince, loneSeen time.Time
	loneLevel, loneFrom float64
	// breakRuns: the runs of windows of the replicas that were past
	// capacity above the capacity or proof known, one a replica, at most
	// maxBreakRuns (breakBound).
	breakRuns []breakRun
	// knees: of each replica whose window was past capacity at the last
	// observation, the most it served in its run of such windows while not
	// swamped, within a hold (kneesOf).
	knees []knee
	// riseFrom: the capacity, or proof, known at riseAt, at most a
	// window's span before: a rise is at most maxRise times it
	// (riseLimit).
	riseFrom     float64
	riseAt       time.Time
	healthyAt    time.Time // HealthyMax's last fade
	lastProbe    time.Time
	healthySince time.Time // every replica healthy and loaded since
	// ITLMetAt: the latest observation where a replica's mean time
	// between tokens met the ITL SLO (with minEvidence first tokens in
	// its window); ITLLeast the least such mean seen (seconds; 0 none).
	// An ITL past the SLO is a break only within itlMemory of ITLMetAt.
	ITLMetAt time.Time
	ITLLeast float64
	// startingFor: the longest a replica now starting has been starting
	// (this snapshot's): the lead time is at least that.
	startingFor time.Duration
	peaks       []peak // need and work at each observation, oldest first
	// Surge: the largest move of the arriving work within one lead time
	// seen (a rise, or a fall from a level held: learnSurge), and PeakWork
	// the most work that arrived; both fade by half in surgeHalfLife (from
	// surgeAt). A workload whose load has jumped or dropped within a lead
	// time is planned to hold the work it may jump back to.
	Surge, PeakWork float64
	surgeAt         time.Time
	// LevelSurge: the largest move of the arriving work's level within
	// one lead time seen (the mean of the last quarter of a lead time
	// against the mean of the older half: learnSurge), fading as Surge
	// does. A window's noise moves it far less than it moves Surge.
	LevelSurge float64
	// Trend: how far the arriving work's level rises within a lead time
	// where it has been rising for the last one — each quarter of it
	// rose on the quarter before (a step rises in one quarter, and noise
	// seldom in all three) — at the slowest quarter's pace; 0 where it
	// has not. Not a memory: each observation sets it anew (learnSurge).
	Trend float64
}

// breakRun is one replica's run (State.breakRuns): since its window was
// past capacity above what was known, each observation of its window
// (obs: the first the latest more than shown old, once the run is that
// old); seen, the last at which its window was above what is known;
// proven, the least of obs once the first is older than shown (0 before).
type breakRun struct {
	pod    string
	obs    []breakObs
	seen   time.Time
	proven float64
}

// knee is one replica's run of windows past capacity at consecutive
// observations (State.knees): the most it served in them while not
// swamped (0: swamped in each, or swamped with its queue not shrinking
// for longer than a hold); at, the last window unswamped or draining;
// seen, the run's last observation.
type knee struct {
	pod      string
	most     float64
	at, seen time.Time
}

// breakObs is one observation of a break's run: when, and the work a
// second the replica's window served (the least of those within
// breakMerge of each other).
type breakObs struct {
	at time.Time
	w  float64
}

type peak struct {
	at   time.Time
	need float64
	work float64
}

// Input is one snapshot of the workload.
type Input = store.Snapshot

// Plan is one planning result and everything it came from.
type Plan struct {
	// Replicas is the count the workload needs now (the trigger's value).
	Replicas int `json:"replicas"`
	// Reason names what set it.
	Reason string `json:"reason"`
	// Rule says how a replica's health was judged: the TTFT percentile
	// (when asked for, and the replicas' TTFT histograms are forwarded),
	// else the means.
	Rule string `json:"rule"`
	// Need: replicas the current load needs (before the hold).
	Need float64 `json:"need"`
	// Work is the work offered per second (served, plus queue growth) at
	// the ready replicas, those without a fresh sample carrying the fresh
	// ones' mean; Backlog the work waiting (queued and held at routers).
	Work    float64 `json:"workPerSecond"`
	Backlog float64 `json:"backlog"`
	// BacklogThen: the backlog projected to when capacity asked for now is
	// ready (projectBacklog); the need drains it over a lead time.
	BacklogThen float64 `json:"backlogThen"`
	// DrainNeed: the replicas among which the arriving work must be
	// spread for the largest queue standing at one ready replica, when
	// capacity asked for now is ready, to be gone a minute after
	// (drainEach); the need is at least this.
	DrainNeed float64 `json:"drainNeed"`
	// Surge: the largest move of the arriving work within one lead time
	// seen (a rise, or a fall from a level held; fading); PeakWork the
	// most that arrived (fading); LevelSurge the largest move of the
	// arriving work's level within one lead time seen (fading); Trend the
	// rise of its level over the next lead time, where it has risen over
	// the last one quarter after quarter (State.Trend); Level the work per
	// second the plan covers (Plan.plan says how).
	Surge      float64 `json:"surgeWorkPerSecond"`
	LevelSurge float64 `json:"levelSurgeWorkPerSecond"`
	Trend      float64 `json:"trendWorkPerSecond"`
	PeakWork   float64 `json:"peakWorkPerSecond"`
	Level      float64 `json:"plannedWorkPerSecond"`
	// WorkPerRequest: a request's mean work (see State).
	WorkPerRequest float64 `json:"workPerRequest"`
	// Capacity per replica learned, its observations and breaks.
	Capacity     float64 `json:"capacityPerReplica"`
	Observations int     `json:"observations"`
	Breaks       int     `json:"breaks"`
	// Proven: the most a replica has proven within the SLO (what a window
	// served less its standard error: proof), fading (the capacity's
	// floor; probes stop at it over the utilisation); Broke:
	// the throughput replicas broke at, smoothed (probes stop at it; 0
	// before a break). Both as State's HealthyMax and BreakCapacity.
	Proven float64 `json:"provenPerReplica"`
	Broke  float64 `json:"brokePerReplica,omitempty"`
	// Confidence grows with the observations (0 to 1).
	Confidence float64 `json:"confidence"`
	// KVNeed: replicas the KV cache in use needs at KVTarget.
	KVNeed float64 `json:"kvNeed"`
	// LeadTime learned (or assumed), and the startups observed.
	LeadTime        time.Duration `json:"-"`
	LeadTimeSeconds float64       `json:"leadTimeSeconds"`
	Startups        int           `json:"startups"`
	// HeldPeak: the largest need within the hold, held until HeldUntil.
	HeldPeak  float64   `json:"heldPeak"`
	HeldUntil time.Time `json:"heldUntil,omitzero"`
	// HoldExtra: the hold's extension after regrets (see State).
	HoldExtra        time.Duration `json:"-"`
	HoldExtraSeconds float64       `json:"holdExtraSeconds,omitempty"`
	// Ready, Missing (ready with no fresh sample) and Starting replicas.
	Ready    int `json:"ready"`
	Missing  int `json:"missing"`
	Starting int `json:"starting"`
	// Refused: ready replicas whose window was past what is believed of
	// one (see maxTokenRate), or held no requests-waiting gauge, counted
	// in Missing; RefusedWhy names the first and why, and the routers'
	// demand when it is refused (implausibleDemand: left out of the
	// plan). Stuck: replicas starting, or ready before and unready since,
	// past stuckAfter, not counted in Starting or Ready (the HPA still
	// counts them among the workload's replicas: the plan does not
	// replace them, as a replacement would most likely be stuck the same
	// way).
	Refused    int    `json:"refusedReplicas,omitempty"`
	RefusedWhy string `json:"refusedWhy,omitempty"`
	Stuck      int    `json:"stuckReplicas,omitempty"`
	// Unseen: replicas whose agent is lost past --pod-expiry that the API
	// still has (store.PodLoad.Unseen), counted in Missing when ready, in
	// Missing and Unready when ready before and not now, and in Starting
	// (or Stuck) when never ready.
	Unseen int `json:"unseenReplicas,omitempty"`
	// Unready: replicas ready before and not now (store.PodLoad.Unready),
	// counted in Ready and Missing: the plan holds them, and an error
	// answers when none has a fresh sample, never a plan of no work.
	Unready int `json:"unreadyReplicas,omitempty"`
	// Terminating: replicas being deleted (draining, their Ready condition
	// perhaps still true): counted nowhere else, no capacity planned on.
	Terminating int `json:"terminatingReplicas,omitempty"`
}

// Errors of Plan: the workload cannot be planned now (the caller returns
// them as Unavailable or NotFound, never a 0).
var (
	ErrNotFound = errors.New("no pod of this workload has been reported")
	ErrStale    = errors.New("stale")
	ErrLost     = errors.New("lost")
	// ErrRefused: with no replica, the routers' demand is past what is
	// believed (implausibleDemand): unknown, which is not none.
	ErrRefused = errors.New("refused")
)

// tolerate keeps the replicas listed (ready and starting) where the need,
// and the peak held, are at most cfg.Tolerance over them and fewer than
// one request waits a ready replica: the HPA's tolerance, which a count
// rounded up before the HPA sees it would defeat (a need of 3.05 is 4
// replicas, a quarter more than the 3 that carry it at 0.82 of their
// capacity). A queue standing is no rounding's noise: it is planned as is.
func (p *Plan) tolerate(cfg Config) {
	listed := p.Ready + p.Starting
	if listed == 0 || p.Replicas <= listed || p.Backlog >= float64(p.Ready)*p.WorkPerRequest {
		return
	}
	if most := math.Max(p.Need, p.HeldPeak); most <= float64(listed)*(1+cfg.Tolerance) {
		p.Replicas = listed
		p.Reason = fmt.Sprintf("keeping the %d replicas listed: a need of %.2f is within the tolerance %.2f over them, and no queue stands", listed, most, cfg.Tolerance)
	}
}

// Make plans the workload from one snapshot and the state learned so far;
// it returns the plan and the next state (prev is not modified).
func Make(in Input, prev State, cfg Config) (Plan, State, error) {
	st := prev
	st.peaks = append([]peak(nil), prev.peaks...)
	st.rebase(in.At)
	if !in.RefusedAt.IsZero() {
		st.endRuns()
		return Plan{}, st, fmt.Errorf("%w: %s", ErrLost, RoomRefused)
	}
	if !in.Found {
		st.endRuns()
		p, st, err := noReplica(in, st, cfg)
		if err == nil {
			p.learned(&st, cfg)
		}
		return p, st, err
	}
	st.learnStartups(in)
	var p Plan
	fresh := p.count(in, &st)
	if err := p.unplannable(len(fresh), in.Demand); err != nil {
		st.endRuns()
		return Plan{}, st, err
	}
	// Since is the first plan's time: not an error's (a workload whose
	// agent was lost for the hold after a restart, then back, would be
	// planned below its ready replicas at its first observation).
	if st.Since.IsZero() {
		st.Since = in.At
	}
	observe := in.At.Sub(st.lastObserve) >= cfg.ObserveEvery
	if observe {
		st.lastObserve = in.At
		st.learnCapacity(fresh, in.At, cfg)
	}
	p.Rule = rule(fresh, &st, in.At, cfg)
	arrived := p.need(fresh, in, &st, cfg, observe)
	if math.IsNaN(p.Need) || math.IsInf(p.Need, 0) {
		// Every value is bounded, so this is a defect; no plan is better
		// than one of no number, held as a peak.
		return Plan{}, prev, fmt.Errorf("%w: the need is not a finite number (work %g, capacity %g, backlog %g)", ErrRefused, p.Work, st.Capacity, p.Backlog)
	}
	hold := st.hold(cfg)
	// A peak is an observation's need. One answered between two
	// observations (the HPA's syncs fall anywhere) is not held: holding
	// it, or answering no more than the newest observation there, were
	// both measured worse (docs/planner.md, rule 7).
	if observe {
		st.peaks = append(st.peaks, peak{in.At, p.Need, arrived})
	}
	p.holdPeaks(&st, in.At, hold, cfg)
	p.tolerate(cfg)
	p.floor(in, &st, fresh, hold)
	switch {
	case p.Refused > 0:
		p.Reason += fmt.Sprintf(" (%d ready replicas refused: %s)", p.Refused, p.RefusedWhy)
	case p.RefusedWhy != "":
		p.Reason += " (" + p.RefusedWhy + ")"
	}
	if in.Demand.Silent > 0 {
		// With replicas ready, what a router whose agent is lost (or
		// whose page fails) holds is read as none, past the hold of the
		// peak its queue asked for: said, where "no queue stands" said
		// otherwise.
		p.Reason += fmt.Sprintf(" (%d of the routers ready have not reported within staleAfter: what they hold is unknown, read as none; a peak their queue asked for is held for the hold)", in.Demand.Silent)
	}
	st.regret(p.Replicas, p.Ready+p.Starting+p.Stuck, in.At, cfg)
	p.learned(&st, cfg)
	return p, st, nil
}

// rebase takes every time st keeps that is ahead of now back to now (st's
// peaks are its own copy; its runs and knees are copied before they change).
// A snapshot stamped ahead of the clock (a clock stepped forward and back,
// a garbled caller) left its marks ahead: nothing was observed until the
// clock caught up with its observation (no capacity, surge or lead time
// learned), and its peak, never past its hold, was held as long.
func (st *State) rebase(now time.Time) {
	scalars := [...]*time.Time{&st.Since, &st.LastBreak, &st.releasedAt, &st.lastRegret, &st.startupsTo, &st.lastObserve,
		&st.loneSince, &st.loneSeen, &st.riseAt, &st.healthyAt, &st.lastProbe, &st.healthySince, &st.ITLMetAt, &st.surgeAt}
	ahead := slices.ContainsFunc(scalars[:], func(t *time.Time) bool { return t.After(now) }) ||
		slices.ContainsFunc(st.peaks, func(p peak) bool { return p.at.After(now) }) ||
		slices.ContainsFunc(st.knees, func(k knee) bool { return k.at.After(now) || k.seen.After(now) }) ||
		slices.ContainsFunc(st.breakRuns, func(r breakRun) bool {
			return r.seen.After(now) || slices.ContainsFunc(r.obs, func(o breakObs) bool { return o.at.After(now) })
		})
	if !ahead {
		return
	}
	back := func(t *time.Time) {
		if t.After(now) {
			*t = now
		}
	}
	for _, t := range scalars {
		back(t)
	}
	for i := range st.peaks {
		back(&st.peaks[i].at)
	}
	st.breakRuns = slices.Clone(st.breakRuns)
	for i := range st.breakRuns {
		r := &st.breakRuns[i]
		back(&r.seen)
		r.obs = slices.Clone(r.obs)
		for j := range r.obs {
			back(&r.obs[j].at)
		}
	}
	st.knees = slices.Clone(st.knees)
	for i := range st.knees {
		back(&st.knees[i].at)
		back(&st.knees[i].seen)
	}
}

// floor keeps p's replicas where the plan may not go below those listed:
// the ready ones while some have no fresh sample, the workload has been
// observed for less than the hold, or no capacity is learned for its
// load; the starting ones too within the first hold, or while none is
// ready and nothing says the load.
func (p *Plan) floor(in Input, st *State, fresh []*store.PodLoad, hold time.Duration) {
	switch {
	case p.Replicas >= p.Ready:
	case p.Missing > 0:
		p.Replicas, p.Reason = p.Ready, fmt.Sprintf("holding the %d ready replicas: %d have no fresh sample", p.Ready, p.Missing)
		if p.Unseen > 0 {
			p.Reason += fmt.Sprintf(" (%d unseen: their agent is lost, and the API still has them)", p.Unseen)
		}
		if p.Unready > 0 {
			p.Reason += fmt.Sprintf(" (%d ready before and not now)", p.Unready)
		}
	case in.At.Sub(st.Since) < hold:
		p.Replicas, p.Reason = p.Ready, fmt.Sprintf("holding the %d ready replicas: observed for %s, less than the hold %s", p.Ready, in.At.Sub(st.Since).Round(time.Second), hold)
	case st.Capacity == 0 && (p.Work > 0 || busy(fresh)):
		p.Replicas, p.Reason = p.Ready, fmt.Sprintf("holding the %d ready replicas: no capacity learned yet", p.Ready)
	}
	if since := in.At.Sub(st.Since); since < hold && p.Replicas < p.Ready+p.Starting {
		// Within the first hold (an aggregator restarted: the peaks
		// that asked for them are not kept), the replicas starting are
		// held with the ready ones: released, a scale-up under way was
		// undone, and asked for again once the peak was seen again.
		p.Replicas, p.Reason = p.Ready+p.Starting, fmt.Sprintf("holding the %d ready and %d starting replicas: observed for %s, less than the hold %s", p.Ready, p.Starting, since.Round(time.Second), hold)
	}
	if p.Ready == 0 && in.Demand.Sources == 0 && p.Replicas < p.Starting {
		// Replicas starting, none ready and no router that reports:
		// nothing says the load. Planned 0, the HPA took back the
		// replicas starting (a node drained and its replicas'
		// replacements loading, the state forgotten with no replica
		// listed), with no sign that they were not needed. (Routers
		// that report nothing held or arriving do say it: a workload
		// let scale to zero goes there.)
		p.Replicas, p.Reason = p.Starting, fmt.Sprintf("keeping the %d replicas starting: none is ready and no demand source reports, so nothing says the load", p.Starting)
	}
}

// learned shows in p what st has learned: the capacity and what it rests
// on, the lead time and the hold's extension (a plan at no replica too).
func (p *Plan) learned(st *State, cfg Config) {
	p.Capacity, p.Observations, p.Breaks = st.Capacity, st.Observations, st.Breaks
	p.Proven, p.Broke = st.HealthyMax, st.BreakCapacity
	p.HoldExtra = st.HoldExtra
	p.Confidence = 1 - 1/(1+float64(st.Observations)/10)
	p.LeadTime, p.Startups = st.lead(cfg), st.Startups
	p.LeadTimeSeconds, p.HoldExtraSeconds = p.LeadTime.Seconds(), p.HoldExtra.Seconds()
}

// holdPeaks drops the peaks past the hold (or past maxPeaks) and sets p's
// replicas: the need, or the largest need held, until its hold ends.
func (p *Plan) holdPeaks(st *State, now time.Time, hold time.Duration, cfg Config) {
	cut := 0
	for cut < len(st.peaks) && (now.Sub(st.peaks[cut].at) > hold || len(st.peaks)-cut > maxPeaks) {
		cut++
	}
	st.peaks = st.peaks[cut:]
	p.HeldPeak = p.Need
	for _, pk := range st.peaks {
		if pk.need >= p.HeldPeak {
			p.HeldPeak, p.HeldUntil = pk.need, pk.at.Add(hold)
		}
	}
	if p.HeldPeak <= p.Need {
		p.HeldUntil = time.Time{} // no peak past the need now is held (this one's own was)
	}
	p.Replicas = ceil(p.Need)
	if held := ceil(p.HeldPeak); held > p.Replicas {
		p.Replicas = held
		p.Reason = fmt.Sprintf("holding a peak of %.2f replicas until %s (a hold of %s: lead time and its deviations %s, margin %s",
			p.HeldPeak, p.HeldUntil.UTC().Format(time.RFC3339), hold.Round(time.Second), (hold - cfg.HoldMargin - st.HoldExtra).Round(time.Second), cfg.HoldMargin)
		if st.HoldExtra > 0 {
			p.Reason += fmt.Sprintf(", after regrets %s", st.HoldExtra.Round(time.Second))
		}
		p.Reason += ")"
	}
}

// count sets p's ready, missing, refused, starting and stuck replicas
// from in's pods, and st's startingFor; it returns the fresh ones (ready,
// with a believable fresh sample).
func (p *Plan) count(in Input, st *State) []*store.PodLoad {
	var fresh []*store.PodLoad
	st.startingFor = 0
	for i := range in.Pods {
		l := &in.Pods[i]
		if l.Unseen {
			p.Unseen++
		}
		switch l.State {
		case store.PodTerminating:
			p.Terminating++
		case store.PodCounted:
			p.Ready++
			if why := implausible(l); why != "" {
				p.Missing++
				if p.Refused++; p.Refused == 1 {
					p.RefusedWhy = l.Name + ": " + why
				}
				continue
			}
			if l.Span <= 0 && l.StartupUnseen {
				// One sample, no rate yet, of a replica ready before this
				// process listed it (its agent back past --pod-expiry, the
				// pod listed anew): it served all along, and counted as
				// no work, four replicas serving were planned 3 for the
				// second until their second samples. It is planned as a
				// ready replica without a fresh sample. (One just ready
				// is no work yet, as before: it is no cascade.)
				p.Missing++
				continue
			}
			fresh = append(fresh, l)
		case store.PodMissing:
			p.Ready++
			p.Missing++
		case store.PodStarting:
			if l.Unready {
				// A replica that served and lost its readiness (a failed
				// probe, a restarted container) is not one starting: its
				// age is not a startup, and it is no capacity coming. It
				// is planned as a ready one without a fresh sample, until
				// it has been unready as long as a stuck start (then it
				// is stuck: one crash-looping for good held every
				// scale-down of its workload).
				if l.UnreadyFor > st.stuckAfter() {
					p.Stuck++
					continue
				}
				p.Ready++
				p.Missing++
				p.Unready++
				continue
			}
			if st.stuck(l) {
				p.Stuck++
				continue
			}
			p.Starting++
			st.startingFor = max(st.startingFor, l.Age)
		}
	}
	return fresh
}

// busy says whether any fresh replica runs or queues a request: load on a
// page without token counters, where the work is 0.
func busy(fresh []*store.PodLoad) bool {
	for _, l := range fresh {
		if l.Running > 0 || l.Waiting > 0 {
			return true
		}
	}
	return false
}

// kvShares is each fresh replica's KV-cache usage, in [0, 1]: a replica
// whose page gives no KV-cache gauge (TGI's, or a gauge refused) carries
// the mean of those that do, or none when none does.
func kvShares(fresh []*store.PodLoad) []float64 {
	out := make([]float64, len(fresh))
	mean, with := 0.0, 0
	for i, l := range fresh {
		if !l.NoKV {
			out[i] = math.Min(math.Max(l.KVCache, 0), 1)
			mean += out[i]
			with++
		}
	}
	if with == 0 {
		return out
	}
	mean /= float64(with)
	for i, l := range fresh {
		if l.NoKV {
			out[i] = mean
		}
	}
	return out
}

// need sets p's offered work, backlog, KV need and Need from the fresh
// pods; with no capacity learned, the load fallback (see below). It returns
// the work that arrived at all the ready replicas (the fresh pods' scaled):
// served, plus the queue's growth or less its shrinking.
func (p *Plan) need(fresh []*store.PodLoad, in Input, st *State, cfg Config, observe bool) float64 {
	var growth, queued, kv, fallback float64
	kvs := kvShares(fresh)
	// Fresh pods whose page has no token counters: a window of samples
	// (a span) with no token rate. One of a single sample (a replica just
	// ready) counts as it did, as no work yet.
	noCounters := 0
	span := longestSpan(fresh)
	for i, l := range fresh {
		if !l.Tokens && l.Span > 0 {
			noCounters++
		} else {
			p.Work += workOf(l, cfg)
		}
		growth += growthOf(l, span)
		queued += l.WaitingNow
		kvl := kvs[i]
		kv += kvl
		// The fallback load: KV cache against its target, the queue
		// against two requests (metric.DefaultLoad's, llm-d's saturation).
		fallback += math.Max(kvl/cfg.KVTarget, l.Waiting/2)
	}
	if observe {
		st.learnWorkPerRequest(requestWork(fresh, cfg))
	}
	p.WorkPerRequest = st.WorkPerRequest
	queued += p.routersQueued(in.Demand)
	served := p.Work // what arrives is it and the queues' growth (scaledWork)
	p.Backlog = queued * st.WorkPerRequest
	p.KVNeed = kv / cfg.KVTarget
	// Pods without a fresh sample carry the fresh pods' mean load.
	scale := 1.0
	if len(fresh) > 0 {
		scale = float64(len(fresh)+p.Missing) / float64(len(fresh))
	}
	p.KVNeed *= scale
	// The work planned (and shown) is the workload's: the fresh pods'
	// scaled to the ready replicas. A page without token counters (a
	// server of another version in a rollout) says nothing of its work:
	// its replica carries the others' mean, as one without a fresh sample
	// does (it counted as no work, and the workload was planned down).
	workScale := scale
	if noCounters > 0 && noCounters < len(fresh) {
		workScale = float64(len(fresh)+p.Missing) / float64(len(fresh)-noCounters)
	}
	var arrived float64
	p.Work, arrived = scaledWork(served, growth*st.WorkPerRequest, scale, workScale)
	work := p.Work
	if observe {
		st.learnSurge(arrived, in.At, st.lead(cfg))
	}
	p.plan(work, st, cfg)
	switch {
	case st.Capacity > 0:
		// The work arrived at the workload's scale, as learnSurge takes
		// it: the drain spread half of it over the replicas with 2 of 4
		// pages without counters.
		p.planLearned(fresh, in, st, cfg, work, arrived, growth, scale)
	case queued > 0 && p.Ready == 0:
		// The replicas starting are kept: they are the capacity coming.
		// (With capacity learned, those the backlog is projected to
		// drain on are; with none, after a restart, every one was taken
		// back to 1.)
		p.Need = math.Max(1, float64(p.Starting))
		p.Reason = fmt.Sprintf("%.0f requests wait and no replica is ready (%d starting)", queued, p.Starting)
	default:
		p.Need = fallback * scale
		p.Reason = "no capacity learned yet: KV cache over its target, queue over 2 per replica"
	}
	if noCounters > 0 && noCounters == len(fresh) && st.Capacity > 0 && p.Need < float64(p.Ready) {
		p.Need = float64(p.Ready)
		p.Reason = "no fresh replica's page has token counters: the work is unknown, and the ready replicas are kept"
	}
	if p.KVNeed > p.Need {
		p.Need = p.KVNeed
		p.Reason = fmt.Sprintf("KV cache in use %.2f replicas' worth over target %.2f", kv*scale, cfg.KVTarget)
	}
	return arrived
}

// scaledWork is the workload's offered work and the work arriving at it
// (less the queues' shrinking: a queue drained is served twice over, not
// offered):
// served (the pages' with token counters) carried over those without
// (workScale), and the queues' growth (every fresh pod's, counters or
// not; work a second) carried over the ready replicas (scale). The growth
// was scaled by workScale too, counted twice over with 2 of 4 pages
// without counters.
func scaledWork(served, growth, scale, workScale float64) (work, arrived float64) {
	if workScale == scale {
		return (served + math.Max(growth, 0)) * scale, math.Max(0, served+growth) * scale
	}
	return served*workScale + math.Max(growth, 0)*scale, math.Max(0, served*workScale+growth*scale)
}

// planLearned sets p's need and reason from the capacity learned: the
// level planned for, and the backlog there will be when capacity asked for
// now is ready, drained over a lead time; then each replica's queue
// (drainEach).
func (p *Plan) planLearned(fresh []*store.PodLoad, in Input, st *State, cfg Config, work, arrived, growth, scale float64) {
	// The backlog is drained by capacity that arrives no sooner than a
	// replica starts: the backlog there will be then (the replicas
	// already starting drain their part of it from when they are
	// ready, so a queue growing while they load is not planned twice),
	// drained over the lead time (at least the SLO: a replica that
	// starts at once drains it within the SLO).
	drain := max(st.lead(cfg), cfg.TTFT).Seconds()
	var counted int
	p.BacklogThen, counted = projectBacklog(p.Backlog, growth*st.WorkPerRequest*scale, st.Capacity, in, st.lead(cfg), st.stuckAfter())
	p.Need = p.Level/st.Capacity + p.BacklogThen/(st.Capacity*drain)
	if p.Ready == 0 && counted > 0 {
		// With no replica ready, the replicas starting that the
		// backlog is projected to drain on are kept: a workload scaled
		// from zero for requests held at its routers planned 0 once
		// its replica was listed, releasing the capacity it counted
		// on, and the requests waited on. (With replicas ready, the
		// plan follows the work they serve; keeping every replica
		// counted on cost 4 % more GPU-hours on the planner's report,
		// at the same attainment.)
		p.Need = max(p.Need, float64(counted))
	}
	p.Reason = fmt.Sprintf("work %.0f/s over %.0f/s per replica at utilisation %.2f, backlog %.0f (%.0f when capacity asked for now is ready)", p.Work, st.Capacity, cfg.Utilisation, p.Backlog, p.BacklogThen)
	if p.Level > work/cfg.Utilisation {
		p.Reason = fmt.Sprintf("work %.0f/s, planned for %.0f/s: it has moved %.0f/s within a lead time (its level %.0f/s, rising %.0f/s a lead time), up to %.0f/s; over %.0f/s per replica, backlog %.0f (%.0f when capacity asked for now is ready)",
			p.Work, p.Level, st.Surge, st.LevelSurge, st.Trend, st.PeakWork, st.Capacity, p.Backlog, p.BacklogThen)
	}
	if p.Ready > 0 {
		p.drainEach(fresh, arrived, growth*st.WorkPerRequest/float64(len(fresh)), in, st, cfg)
	}
}

// plan sets p's surges, trend, peak and the level of work it plans for:
// the work over the utilisation; the work it may return to within a lead
// time, up to its peak (the surge: a window's move, its noise included,
// at full utilisation); the work plus the level's move beyond the
// utilisation's headroom, up to the peak, over the utilisation, as the
// work now is planned (a rise within the headroom is what the headroom is
// for: load that drifts is followed down); and the work plus its trend
// beyond the headroom, over the utilisation: the one part not bounded by
// the peak, since a load that has risen quarter after quarter for a lead
// time is where capacity asked for now, ready a lead time later, meets
// more than the load has had. With no work at all, nothing is held for a
// surge: a workload let scale to zero goes there once the hold ends.
func (p *Plan) plan(work float64, st *State, cfg Config) {
	p.Surge, p.LevelSurge, p.Trend, p.PeakWork = st.Surge, st.LevelSurge, st.Trend, st.PeakWork
	p.Level = work / cfg.Utilisation
	if work > 0 {
		headroom := work * (1/cfg.Utilisation - 1)
		p.Level = max(p.Level, min(work+st.Surge, st.PeakWork))
		p.Level = max(p.Level, min(work+max(0, st.LevelSurge-headroom), st.PeakWork)/cfg.Utilisation)
		p.Level = max(p.Level, (work+max(0, st.Trend-headroom))/cfg.Utilisation)
	}
}

// requestWork is the work the fresh pods served and their first tokens,
// for a request's mean: of pods with token counters whose window does not
// lag (lags). Taken from all, one pod's 100,000 first tokens a second
// against 10,000 tokens drew the mean from 1,000 to 0.4 in 20 minutes,
// and a queue of 200 a replica was planned as none; its work and queue
// are planned as any other's.
func requestWork(fresh []*store.PodLoad, cfg Config) (work, first float64) {
	for _, l := range fresh {
		if (l.Tokens || l.Span <= 0) && !lags(l) {
			work += workOf(l, cfg)
			first += l.FirstTokens
		}
	}
	return work, first
}

// learnWorkPerRequest moves a request's mean work a tenth of the way
// toward this observation's (work served over first tokens, within
// maxRise times the mean either way), or takes it at the first.
func (st *State) learnWorkPerRequest(work, first float64) {
	if first <= 0 || work <= 0 {
		return
	}
	wpr := min(work/first, maxRequestWork)
	if st.WorkPerRequest > 0 {
		// Bounded both ways: a mix that changes moves it within minutes,
		// and one window's count, the fleet's sum, no faster.
		wpr = min(max(wpr, st.WorkPerRequest/maxRise), maxRise*st.WorkPerRequest)
	}
	if st.WorkPerRequest == 0 {
		st.WorkPerRequest = wpr
	} else {
		st.WorkPerRequest += 0.1 * (wpr - st.WorkPerRequest)
	}
}

// drainEach raises the need to drainNeed's for the largest queue standing
// at one ready replica when capacity asked for now is ready
// (replicaBacklog), with the work arriving (arrived, per second) spread
// evenly (a Service's round robin). Requests held at the routers are left
// to the pooled drain: any replica serves them.
func (p *Plan) drainEach(fresh []*store.PodLoad, arrived, growth float64, in Input, st *State, cfg Config) {
	lead := st.lead(cfg)
	joins := joining(in, lead, st.stuckAfter())
	var share float64
	span := longestSpan(fresh)
	for _, l := range fresh {
		if wedged(l, span, cfg) {
			continue
		}
		share = max(share, replicaBacklog(l.WaitingNow*st.WorkPerRequest, growth, arrived, p.Ready, joins, lead))
	}
	p.DrainNeed = drainNeed(arrived, share, st.Capacity)
	if p.DrainNeed <= p.Need {
		return
	}
	p.Need = p.DrainNeed
	gone := time.Duration(share / (st.Capacity - arrived/p.DrainNeed) * float64(time.Second))
	p.Reason = fmt.Sprintf("work arriving %.0f/s over %.0f/s per replica; a replica's queue drains only through it: the largest %.0f work units when capacity asked for now is ready, gone %s after with the work spread over %.2f replicas",
		arrived, st.Capacity, share, gone.Round(time.Second), p.DrainNeed)
}

// workOf is the work l's window served a second: its prompt tokens, and
// its generated tokens at their decode cost.
func workOf(l *store.PodLoad, cfg Config) float64 {
	return l.PromptTokens + cfg.DecodeCost*l.GenerationTokens
}

// growthOf is l's queue's growth over the longest window span of the
// fresh replicas: its window's growth, that of a shorter window (a
// replica just ready, a series restarted) taken as the whole span's, its
// queue before its window none. Its own was taken: a replica ready for a
// second, handed the 40 requests a gateway held, read a queue growing 40
// requests a second, planned as new arrivals (4 replicas to 14 at an
// unchanged load, and the false surge held the plan up for half an
// hour), as 48 requests waiting and then 53 a second apart read 5 a
// second arriving.
func growthOf(l *store.PodLoad, span time.Duration) float64 {
	if l.Span >= span || span <= 0 {
		return l.WaitingGrowth
	}
	return l.WaitingGrowth * max(l.Span, 0).Seconds() / span.Seconds()
}

// longestSpan is the longest any replica's rates cover (the window, or
// less while every one has fewer samples: an aggregator just started).
func longestSpan(fresh []*store.PodLoad) time.Duration {
	var span time.Duration
	for _, l := range fresh {
		span = max(span, l.Span)
	}
	return span
}

// lags says whether l's window has more first tokens a second than
// tokens: each request prefills a token at least and generates one, so
// its counters lag its TTFT histogram (SGLang counts a request's tokens
// when it finishes, its first token at once: a burst's first window,
// answers longer than the window) or contradict it. Such a window
// teaches neither the mean work a request nor the capacity (taken as a
// break at the tokens it had counted, it pulled a capacity of 10,000 to
// 97 in a minute; taken at a restart, 0.5, and a queue of 170 was planned
// as none).
func lags(l *store.PodLoad) bool {
	return l.FirstTokens > l.PromptTokens+l.GenerationTokens
}

// wedged says whether l is a replica whose queue stood through its window
// (at least half span, the longest of its workload's replicas, as a
// window judged) while it ran and served nothing (an engine stuck, its
// page still answering): no count of replicas drains that queue, so the
// drain does not plan for it (the pooled backlog still counts it).
// Planned for, one wedged replica's 500 requests held the plan at 7
// where 4 carried the work, for as long as it stood. Ran nothing: its
// running gauge read 0 at every sample (a mean below 1 was a replica
// just ready behind a long prefill), and a page without the gauge is
// never judged so.
func wedged(l *store.PodLoad, span time.Duration, cfg Config) bool {
	return l.Tokens && 2*l.Span >= span && l.Span > 0 && l.Waiting >= 1 && l.WaitingNow >= 1 &&
		!l.NoRunning && l.Running == 0 && workOf(l, cfg) < minServed
}

// replicaBacklog projects one ready replica's queue (q, work) to lead from
// now: it grows as the ready replicas' queues do on average now (growth,
// work per second; negative while they shrink), less, from when each
// replica starting joins (joins, from now, sorted), what that one takes of
// the arriving work (arrived, per second, spread evenly over the ready
// replicas, ready of them now). A queue never goes below empty.
func replicaBacklog(q, growth, arrived float64, ready int, joins []time.Duration, lead time.Duration) float64 {
	var at time.Duration
	n := float64(ready)
	for _, a := range joins {
		q = math.Max(0, q+growth*(a-at).Seconds())
		growth -= arrived/n - arrived/(n+1)
		at, n = a, n+1
	}
	return math.Max(0, q+growth*(lead-at).Seconds())
}

// joining is when each replica now starting is ready, from now, sorted: a
// lead time after it was listed, at once if it has started for longer. A
// replica that served and lost its readiness is no capacity coming (count
// plans it as ready without a fresh sample): taken as one joining at once,
// it drained a queue that only the replicas serving hold.
func joining(in Input, lead, stuck time.Duration) []time.Duration {
	var joins []time.Duration
	for i := range in.Pods {
		if l := &in.Pods[i]; l.State == store.PodStarting && !l.Unready && l.Age <= stuck {
			// An age below 0 (a garbled snapshot: the store's are never)
			// is a replica just created, not one ready past the lead
			// time, which projected the backlog backwards: more asked
			// for because a replica starts (a cascade).
			joins = append(joins, max(lead-max(l.Age, 0), 0))
		}
	}
	slices.Sort(joins)
	return joins
}

// drainNeed is the replicas among which work (per second) must be spread
// evenly for a replica holding a queue of share (work) to drain it within
// drainWithin, at what its capacity leaves over from its part of the work:
// work/N + share/drainWithin <= capacity. A queue that would need more
// than drainFloor of the capacity to drain within drainWithin is given
// that much, and drains more slowly (at most 1/drainFloor times the
// replicas the work alone needs).
func drainNeed(work, share, capacity float64) float64 {
	if share <= 0 || capacity <= 0 {
		return 0
	}
	room := math.Max(capacity-share/drainWithin.Seconds(), drainFloor*capacity)
	return work / room
}

// projectBacklog is the backlog (work) when capacity asked for now is
// ready, a lead time from now: the backlog now, grown by what arrives
// beyond what the ready replicas serve (excess: the queues' growth in work
// per second; negative while they shrink), less what each replica already
// starting serves (capacity per second) from when it is ready, a lead time
// after it was listed (at once if it has started for longer). A queue never
// goes below empty. counted is how many of the replicas starting it counts
// on to drain the backlog: those that arrive to one.
func projectBacklog(backlog, excess, capacity float64, in Input, lead, stuck time.Duration) (then float64, counted int) {
	var at time.Duration
	for _, a := range joining(in, lead, stuck) {
		backlog = math.Max(0, backlog+excess*(a-at).Seconds())
		if backlog > 0 {
			counted++
		}
		at, excess = a, excess-capacity
	}
	return math.Max(0, backlog+excess*(lead-at).Seconds()), counted
}

// learnSurge fades the surge and the peak work, then takes this
// observation's arrived work into both: the peak is the most that arrived,
// the surge the most it moved within one lead time (the observations held
// in st.peaks), once the workload has been watched for a lead time: how far
// it rose above its lowest, or fell below the level it held half a lead
// time to a lead time ago (their mean: a level, not one low moment). The
// level's surge is the most the level moved: the mean of the last quarter
// of a lead time (this observation's included) against that of the older
// half. A 30 s window's noise moves the surge by up to the work itself on
// steady traffic; it moves the means far less, and a jump moves both.
// Arrivals, not the work served: replicas that come up and drain a backlog
// serve more than arrives, and that is no rise of the load. Capacity that
// arrives a lead time after it is asked for hides a rise only if it was
// there before: a workload whose load has moved by s within a lead time is
// planned to hold the work it had, up to s above the present, until that
// fades. A fall teaches it as a rise does: load that has just dropped by s
// can come back by s, and the capacity released could not.
func (st *State) learnSurge(work float64, now time.Time, lead time.Duration) {
	if !st.surgeAt.IsZero() {
		f := math.Exp2(-now.Sub(st.surgeAt).Seconds() / surgeHalfLife.Seconds())
		st.Surge *= f
		st.PeakWork *= f
		st.LevelSurge *= f
	}
	st.surgeAt = now
	st.PeakWork = max(st.PeakWork, work)
	// A move within a lead time needs a lead time watched: the first
	// minutes are the workload's load arriving (or this process's start),
	// not its load rising. The trend is no memory: none is measured then
	// (a replica starting for longer than the workload was watched
	// lengthens the lead past it, and a trend that had stopped was kept).
	if now.Sub(st.Since) < lead {
		st.Trend = 0
		return
	}
	low := work
	// The sums and counts of the work in each quarter of the lead time,
	// newest first (the work now in the newest).
	q, nq := [4]float64{work}, [4]int{1}
	for _, pk := range st.peaks {
		if age := now.Sub(pk.at); age <= lead {
			low = min(low, pk.work)
			i := 0 // the newest quarter holds its end: age lead/4
			if age > lead/4 {
				i = min(3, int(4*age/lead))
			}
			q[i] += pk.work
			nq[i]++
		}
	}
	st.Surge = max(st.Surge, work-low)
	st.Trend = 0
	if nq[2]+nq[3] > 0 {
		// The older half's level, and the last quarter's.
		held, recent := (q[2]+q[3])/float64(nq[2]+nq[3]), q[0]/float64(nq[0])
		st.Surge = max(st.Surge, held-work)
		st.LevelSurge = max(st.LevelSurge, math.Abs(recent-held))
		if nq[1] > 0 && nq[2] > 0 && nq[3] > 0 {
			rise := math.Inf(1)
			for i := range 3 {
				rise = min(rise, q[i]/float64(nq[i])-q[i+1]/float64(nq[i+1]))
			}
			st.Trend = 4 * max(0, rise)
		}
	}
}

// learnCapacity takes one observation of each fresh replica that served
// work: past its capacity (a standing queue or preemptions) its throughput
// pulls the capacity toward it (a swamped replica's, more preemptions
// than first tokens, or a draining one's while the fleet has room
// (hasRoom), no lower than the most it served in its run past capacity
// while not swamped); within it, a throughput above the
// capacity proves more. With every replica healthy and no break within
// the hold, the capacity is probed upward.
func (st *State) learnCapacity(fresh []*store.PodLoad, now time.Time, cfg Config) {
	healthyAll, served := len(fresh) > 0, 0.0
	switch {
	case cfg.ObserveEvery <= 0: // every call observes: a fade each
		st.HealthyMax *= healthyDecay
	case !st.healthyAt.IsZero():
		st.HealthyMax *= math.Pow(healthyDecay, float64(now.Sub(st.healthyAt))/float64(cfg.ObserveEvery))
	}
	st.healthyAt = now
	span := longestSpan(fresh)
	st.learnITL(fresh, now, cfg)
	itl := st.itlJudges(now, cfg)
	obs := observeWindows(fresh, span, cfg, itl)
	// Shown for longer than its window: by an observation, since a value
	// a window holds is seen at each observation of its span.
	shown := span + max(cfg.ObserveEvery, 0)
	rise, proven := st.riseBound(obs, now, span, shown)
	broken := st.breakBound(obs, now, span, shown)
	st.kneesOf(obs, now, runGap(span, shown), st.hold(cfg))
	room := hasRoom(obs, st.Capacity, cfg.Utilisation)
	shownNow := provenNow(obs, proven, room)
	// The swamped last: what the others show is learned first, in
	// whatever order the replicas come.
	slices.SortStableFunc(obs, func(a, b window) int { return cmp.Compare(btoi(a.thrash), btoi(b.thrash)) })
	for _, o := range obs {
		w := o.w
		served += w
		if o.thin {
			healthyAll = false
			continue
		}
		broke, healthy := o.broke, o.healthy
		if healthy {
			st.HealthyMax = max(st.HealthyMax, proof(min(w, proven), o.n))
			w = min(w, rise)
		}
		healthyAll = healthyAll && healthy
		switch {
		case broke:
			st.learnBroken(o, broken, now, room, shownNow)
		case healthy && w > st.Capacity:
			st.Capacity = w
			st.Observations++
		case healthy:
			st.Observations++
		}
	}
	if st.Capacity == 0 || !healthyAll || served < 0.5*cfg.Utilisation*st.Capacity*float64(len(fresh)) {
		st.healthySince = time.Time{}
		return
	}
	if st.healthySince.IsZero() {
		st.healthySince = now
	}
	// At the planned utilisation no replica is planned past the most one
	// has served within the SLO.
	next := min(st.Capacity*cfg.ProbeStep, st.HealthyMax/cfg.Utilisation)
	if st.BreakCapacity > 0 {
		next = min(next, st.BreakCapacity)
	}
	if next > st.Capacity && now.Sub(st.LastBreak) > st.hold(cfg) && now.Sub(st.healthySince) >= cfg.ProbeEvery && now.Sub(st.lastProbe) >= cfg.ProbeEvery {
		st.Capacity = next
		st.lastProbe = now
	}
}

// learnBroken learns from o, a window past capacity (learnBreak). A
// swamped replica's (o.thrash) redoes work its counters do not show (vLLM
// counts a prompt once, not its recompute after a preemption), so what it
// served is below what it can serve: it is learned as a break at the
// most of what it served and its knee (o.knee: the most the replica
// served in its run past capacity while not swamped), and what it served
// alone sets no breaks' level where none was known. Taken at what it
// served, one replica swamped by a burst pulled the capacity and the
// breaks' level from 66,000 to 44,000 a second, and the probes stopped
// there; and one swamped at its first evidence held the probes at what
// it served. So is a draining replica's (its queue shrank over the
// window) while the fleet has room (hasRoom): its queue time is a
// backlog's, built before the capacity came, and what it served falls
// as the backlog runs out (new work goes to the replicas that came for
// it). Taken at what they served, two replicas draining a burst's
// backlog pulled the capacity from 42,000 to 21,000 a second. Without
// room, a queue shrinking is a fleet still past capacity whose queues
// move (taken at the knee, a run's highest window held the capacity up).
//
// A break below what another replica proved within the SLO at the same
// observation (shown: provenNow), fewer replicas past capacity than
// within it, is the fleet's contradiction, not its capacity: that
// replica is slower (a throttled GPU, a heavier part of the mix), and it
// is learned nothing from. Taken, one replica breaking at 500 a second
// in every window pulled the capacity to what the healthy ones served,
// floored only by that: the plan asked for a quarter more each time,
// their share fell, and a steady 40,000 a second on replicas that break
// at 10,000 was planned at the HPA's maximum of 50 within three hours.
// The slow replica's queue is planned by the drain (rule 4).
func (st *State) learnBroken(o window, broken float64, now time.Time, room bool, shown float64) {
	w, level := o.w, true
	if o.thrash || (o.draining && room) {
		w, level = max(o.w, o.knee), o.knee >= o.w
	}
	if w < shown {
		return
	}
	st.learnBreak(w, broken, now, level)
}

// provenNow is the most a healthy replica's window of obs proved this
// observation: what it served (within proven, riseBound's), less its
// window's error (proof), as the healthy replicas' most (HealthyMax) is
// taken; 0 with none healthy, or with as many windows past capacity as
// healthy: then it is the fleet past its capacity, not one replica
// against it (four of six replicas swamped under a capacity too high,
// their counted work below the two healthy ones' because they redo
// work, kept the capacity there for the hour, and a liar's healthy
// window beside honest breaks froze their level). A window draining a
// backlog while the fleet has room (room: hasRoom) is no fleet past its
// capacity (learnBroken): counted so, three replicas draining a burst's
// queue let one slow replica's breaks pull the capacity from 10,000 to
// 2,618, and the plan went to 15 for 30,000 a second.
func provenNow(obs []window, proven float64, room bool) float64 {
	most, healthy, broke := 0.0, 0, 0
	for _, o := range obs {
		switch {
		case o.thin:
		case o.healthy:
			most = max(most, proof(min(o.w, proven), o.n))
			healthy++
		case o.broke && (!o.draining || !room):
			broke++
		}
	}
	if broke >= healthy {
		return 0
	}
	return most
}

// hasRoom says whether the fleet had room for new work over the windows
// of obs: a replica served within its capacity (a healthy window), and
// the replicas whose windows are judged served, on average, less than
// the planned utilisation of the capacity. The healthy replica is the
// evidence: the
// capacity is what a draining window is learned against, and one known
// too high made a saturated replica's every window room (held at its
// knee while its queue shrank, a capacity twice too high planned one
// replica for 200 requests waiting); a replica just ready, or idle, with
// no window judged, counted room of its own.
func hasRoom(obs []window, capacity, utilisation float64) bool {
	var all float64
	n, healthy := 0, false
	for _, o := range obs {
		if o.thin {
			continue
		}
		all += o.w
		n++
		healthy = healthy || o.healthy
	}
	return healthy && all < utilisation*capacity*float64(n)
}

// learnBreak moves the capacity, and the breaks' level, 30 % of the way
// toward w, what a window past capacity served: up no further than broken
// (breakBound), down as far as w; level: w may set the breaks' level
// where none was known.
func (st *State) learnBreak(w, broken float64, now time.Time, level bool) {
	// A window held at broken served at least that: it moves nothing down
	// (the breaks' level above it), and sets no ceiling for the probes
	// where none was known.
	toward := func(v float64) float64 {
		if w > v {
			return max(v, min(w, broken))
		}
		return w
	}
	if st.Capacity == 0 {
		st.Capacity = min(w, broken)
	} else {
		st.Capacity += learnRate * (toward(st.Capacity) - st.Capacity)
	}
	switch {
	case st.BreakCapacity == 0 && w <= broken && level:
		st.BreakCapacity = w
	case st.BreakCapacity > 0:
		st.BreakCapacity += learnRate * (toward(st.BreakCapacity) - st.BreakCapacity)
	}
	// Never below what a replica has served within the SLO: a break below
	// it was a burst or a long request, not the replica's capacity.
	st.Capacity = max(st.Capacity, st.HealthyMax)
	st.Observations++
	st.Breaks++
	st.LastBreak = now
}

// kneesOf sets each window's knee, and keeps the runs (State.knees): a
// replica's run is its windows past capacity at consecutive observations
// (gap apart at most), and ends at one where its window is not past
// capacity, is thin, or is missing. A replica swamped, its queue not
// shrinking, for longer than a hold since it last served unswamped or
// drained its queue has no knee: the capacity asked for has had time to
// come, and its queue does not drain, so the capacity may be what is too
// high (kept, two replicas swamped at 40,000 under a capacity of 120,000
// that one window of each had shown were planned as 1 an hour later). A
// replica that drains its queue is swamped by a backlog only it can
// drain (no engine hands its queue to another).
func (st *State) kneesOf(obs []window, now time.Time, gap, hold time.Duration) {
	prev := make(map[string]knee, len(st.knees)) // does not escape
	for _, k := range st.knees {
		if now.Sub(k.seen) <= gap {
			prev[k.pod] = k
		}
	}
	var knees []knee // made only where a replica is past capacity
	for i := range obs {
		o := &obs[i]
		if o.thin || !o.broke {
			continue
		}
		k := prev[o.name]
		k.pod, k.seen = o.name, now
		if !o.thrash {
			k.most = max(k.most, o.w)
		}
		if !o.thrash || o.draining {
			k.at = now
		}
		if now.Sub(k.at) > hold {
			k.most = 0
		}
		o.knee = k.most
		knees = append(knees, k)
	}
	st.knees = knees
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// window is one fresh replica's window as learnCapacity reads it: the work
// it served (w), its first tokens (n), and how it held the SLO; thin: too
// little of it to judge (a few seconds, or too few first tokens).
type window struct {
	name                 string
	w, n                 float64
	thin, broke, healthy bool
	// thrash: it preempted more requests a second than it gave a first
	// token (a swamped replica: learnCapacity); knee: the most the replica
	// served in its run of windows past capacity while not swamped
	// (kneesOf).
	thrash bool
	knee   float64
	// draining: its queue shrank over the window.
	draining bool
}

// observeWindows reads the windows of the fresh replicas that served
// work.
func observeWindows(fresh []*store.PodLoad, span time.Duration, cfg Config, itl bool) []window {
	obs := make([]window, 0, len(fresh))
	for _, l := range fresh {
		w := workOf(l, cfg)
		if !l.Tokens || w < minServed {
			continue
		}
		// A window of a few seconds (a replica just ready, a series
		// restarted) is one request's luck, as too few first tokens are.
		o := window{name: l.Name, w: w, n: l.FirstTokens * l.Span.Seconds()}
		// A window whose counters lag its TTFT histogram (lags) judges
		// nothing: what it served is not yet counted.
		if o.thin = o.n < minEvidence || 2*l.Span < span || lags(l); !o.thin {
			o.broke, o.healthy = health(l, cfg, itl)
			o.thrash = l.Preemptions > l.FirstTokens
			o.draining = l.WaitingGrowth < 0
		}
		obs = append(obs, o)
	}
	return obs
}

// riseBound is how far one observation's healthy windows may raise the
// capacity (rise), and what they prove (proven: the floor of what breaks
// teach, HealthyMax, and the probes' ceiling). A rise is at most maxRise
// times the capacity, or the proof, known a window's span before (a
// window is seen at every observation of its span, and a bound of twice
// what was known at each let one through a hundredfold). With two healthy
// windows or more, the second most any of them served (another replica's
// corroboration) is both. A window alone above what is known (a workload
// of one replica, or the others past capacity) raises the capacity so,
// and proves it only once it has shown it for longer than its window and
// an observation (shown: a window it no longer holds, new samples alone),
// no more than the least it showed meanwhile; half a span and an
// observation without it ends the wait (two windows apart are not one
// shown long). The capacity it raised is not what is known meanwhile:
// taken so, a window of up to twice what was known proved itself at the
// next observation. The breaks that follow a window that lied pull the
// capacity back to what was proved. Nothing known yet, the first evidence
// is taken whole, the first hold keeping the ready replicas meanwhile.
// One window set the capacity at once to what it served, and the proof to
// as much, halved only every hour: a replica's window that lies, or a
// burst of prefix-cache hits (vLLM counts them as prompt tokens), made
// the capacity two to a hundred times what replicas serve, and the plan a
// half or less of the need for an hour.
func (st *State) riseBound(obs []window, now time.Time, span, shown time.Duration) (rise, proven float64) {
	first, second := topTwo(obs, func(o window) bool { return o.healthy })
	base := max(st.Capacity, st.HealthyMax)
	if st.riseAt.IsZero() || now.Sub(st.riseAt) > span {
		st.riseFrom, st.riseAt = base, now
	}
	limit := st.riseLimit()
	// What is known: not a rise a window alone raised the capacity to
	// and has not proved (loneFrom, what was known before it, while its
	// wait runs or until the capacity is back at it). Taken as known, a
	// window of up to twice what was known proved itself at the next
	// observation.
	known := base
	if st.loneFrom > 0 {
		known = min(base, st.loneFrom)
	}
	if st.loneSince.IsZero() && st.loneFrom >= base {
		st.loneFrom = 0 // the capacity is back: nothing raised is unproved
	}
	if !st.loneSince.IsZero() && now.Sub(st.loneSeen) > runGap(span, shown) {
		// A gap: two windows apart are not one shown long.
		st.loneSince = time.Time{}
	}
	switch {
	case second > 0:
		st.loneSince = time.Time{}
		b := min(second, limit)
		if st.loneFrom > 0 {
			st.loneFrom = max(st.loneFrom, b)
		}
		return b, b
	case first <= known || known == 0:
		st.loneSince = time.Time{}
		return first, first
	case st.loneSince.IsZero():
		st.loneSince, st.loneSeen, st.loneLevel, st.loneFrom = now, now, first, known
		return min(first, limit), st.HealthyMax
	}
	st.loneLevel, st.loneSeen = min(st.loneLevel, first), now
	if now.Sub(st.loneSince) <= shown {
		return min(first, limit), st.HealthyMax
	}
	proven = min(st.loneLevel, limit)
	// A rise past it waits its own window.
	st.loneSince, st.loneSeen, st.loneLevel, st.loneFrom = now, now, first, max(known, proven)
	return min(first, limit), proven
}

// endRuns ends the waits of windows alone (riseBound's, breakBound's),
// and the runs of the knees (kneesOf), where the replicas' windows are
// not seen: an observation without them is no time shown. Kept, two
// windows that lied either side of a few seconds of a replica missing
// were one shown for longer than its window.
func (st *State) endRuns() {
	st.breakRuns, st.knees, st.loneSince = nil, nil, time.Time{}
}

// riseLimit is the most one observation may raise the capacity or the
// proof to: maxRise times riseFrom, none while nothing was known at its
// span's start (a first observation, a restart: the first span's windows
// are taken as they grow).
func (st *State) riseLimit() float64 {
	if st.riseFrom <= 0 {
		return math.Inf(1)
	}
	return maxRise * st.riseFrom
}

// breakBound is the most a window past capacity may move the capacity
// toward (a break moves it 30 % of the way to what the replica served at
// saturation; below what is known it is not bounded). Above the capacity,
// or the proof, known: what a second replica past capacity served as well
// (the second most of the breaks: corroborated), or what one replica
// proved by showing it for longer than its window (shown): the least of
// its run's windows over that. A replica's run begins at its window past
// capacity above what is known and follows its own windows, whatever they
// were judged (a skewed balancer's busy replica, past capacity in some
// windows and within it in others, shows its throughput in both; a liar's
// true windows between two lies end their run at what it serves); a window
// of it above what is known keeps the run going; an observation without
// its window (none fresh, its page refused, no work), or half a span and
// an observation with none above what is known (a gap of no observation),
// ends it (endRuns too, where no replica is planned). Never more than riseLimit. Nothing known yet, the first evidence is
// taken whole. Unbounded, one window that lied (a replica's page, a burst
// of prefix-cache hits at one replica) while it queued took the capacity
// from 10,000 to 28,000 within its 30 s, past the corroboration healthy
// windows are held to, and the plan to half the need. Two replicas that
// lie at once corroborate each other, up to riseLimit.
func (st *State) breakBound(obs []window, now time.Time, span, shown time.Duration) float64 {
	base := max(st.Capacity, st.HealthyMax)
	if base == 0 {
		return math.Inf(1)
	}
	_, second := topTwo(obs, func(o window) bool { return o.broke })
	runs := make([]breakRun, 0, len(st.breakRuns)+1)
	for _, r := range st.breakRuns {
		if now.Sub(r.seen) <= runGap(span, shown) {
			runs = append(runs, r)
		}
	}
	for _, o := range obs {
		mine := func(r breakRun) bool { return r.pod == o.name }
		if o.broke && !o.thin && o.w > base && len(runs) < maxBreakRuns && !slices.ContainsFunc(runs, mine) {
			runs = append(runs, breakRun{pod: o.name})
		}
	}
	proven := 0.0
	for i := range runs {
		r := &runs[i]
		if k := slices.IndexFunc(obs, func(o window) bool { return o.name == r.pod }); k >= 0 {
			r.obs = runWith(r.obs, breakObs{now, obs[k].w}, span, shown)
			if obs[k].w > base {
				r.seen = now
			}
			if r.proven = 0; now.Sub(r.obs[0].at) > shown {
				r.proven = math.Inf(1)
				for _, b := range r.obs {
					r.proven = min(r.proven, b.w)
				}
			}
		} else {
			r.obs, r.proven = nil, 0 // no window of it: its run starts again
		}
		proven = max(proven, r.proven)
	}
	st.breakRuns = runs
	return max(base, min(max(second, proven), st.riseLimit()))
}

// topTwo is the most, and the second most, any window of obs not thin
// and kept served.
func topTwo(obs []window, keep func(window) bool) (first, second float64) {
	for _, o := range obs {
		if o.thin || !keep(o) {
			continue
		}
		switch {
		case o.w > first:
			first, second = o.w, first
		case o.w > second:
			second = o.w
		}
	}
	return first, second
}

// runGap is how long a wait of a window alone lasts without it (riseBound,
// breakBound), and a knee's run (kneesOf): half a span and an
// observation. Windows further apart are not one shown long.
func runGap(span, shown time.Duration) time.Duration {
	return span/2 + shown - span
}

// runWith is run (not modified) with o: merged into the last where they
// are within span/breakMerge of each other (the least kept), and the
// first kept the latest more than shown before o.
func runWith(run []breakObs, o breakObs, span, shown time.Duration) []breakObs {
	n := len(run)
	if n > 0 && o.at.Sub(run[n-1].at) < span/breakMerge {
		out := slices.Clone(run)
		out[n-1].w = min(out[n-1].w, o.w)
		return out
	}
	out := append(slices.Clone(run), o)
	for len(out) > 1 && o.at.Sub(out[1].at) > shown {
		out = out[1:]
	}
	return out
}

// learnITL notes when a fresh replica's window (of minEvidence first
// tokens at least) met the ITL SLO, and the least mean ITL seen.
func (st *State) learnITL(fresh []*store.PodLoad, now time.Time, cfg Config) {
	if cfg.ITL <= 0 {
		return
	}
	for _, l := range fresh {
		if !l.ITLOK || l.FirstTokens*l.Span.Seconds() < minEvidence {
			continue
		}
		if st.ITLLeast == 0 || l.ITL < st.ITLLeast {
			st.ITLLeast = l.ITL
		}
		if l.ITL <= cfg.ITL.Seconds() {
			st.ITLMetAt = now
		}
	}
}

// itlJudges says whether an ITL past its SLO is a break now: a replica
// met the SLO within itlMemory.
func (st *State) itlJudges(now time.Time, cfg Config) bool {
	return cfg.ITL > 0 && !st.ITLMetAt.IsZero() && now.Sub(st.ITLMetAt) <= itlMemory
}

// proof is what a healthy window of work w a second, n first tokens in it,
// proves a replica sustains: w less one standard error of a window's work.
// Requests arriving at random with sizes of a coefficient of variation of
// 1 (the exponential's; the shipped traces' lognormal lengths are near it)
// make a window's work a compound Poisson sum, whose relative standard
// error is √((1 + 1²)/n). The most of many windows is taken (HealthyMax),
// and a window of few requests, long prompts' or a lightly loaded
// replica's, varies most: its luck, not its capacity, set the most.
func proof(w, n float64) float64 {
	return w * max(0, 1-math.Sqrt(2/n))
}

// rule describes how health judges the fresh replicas: the TTFT's rule,
// and the ITL's where an ITL SLO is set.
func rule(fresh []*store.PodLoad, st *State, now time.Time, cfg Config) string {
	r := ttftRule(fresh, cfg)
	switch {
	case cfg.ITL <= 0:
	case st.itlJudges(now, cfg):
		r += "; mean ITL within " + cfg.ITL.String()
	case st.ITLLeast > 0:
		r += fmt.Sprintf("; the ITL SLO %s judges nothing: no replica met it within %s (the least mean ITL seen %s; more replicas shorten it to a batch of one's step, never below)", cfg.ITL, itlMemory, time.Duration(st.ITLLeast*float64(time.Second)).Round(time.Millisecond))
	default:
		r += fmt.Sprintf("; the ITL SLO %s judges nothing until a replica meets it (none has served enough to measure)", cfg.ITL)
	}
	return r
}

// ttftRule describes how health judges the fresh replicas' TTFT.
func ttftRule(fresh []*store.PodLoad, cfg Config) string {
	means := func() string {
		q, b := time.Duration(breakQueue*float64(cfg.TTFT)), time.Duration(breakTTFT*float64(cfg.TTFT))
		return fmt.Sprintf("means: mean queue time within %s, and mean TTFT within %s while a queue stands; without a queue-time histogram, or with a mean queue time above the mean TTFT (of requests finishing now), the mean TTFT: past %s with requests waiting a break, proof within %s (%s without the histogram)", q, b, b, q, b)
	}
	if cfg.Percentile <= 0 {
		return means()
	}
	pct := "p" + strconv.FormatFloat(100*cfg.Percentile, 'g', -1, 64) + " TTFT within " + cfg.TTFT.String()
	for _, l := range fresh {
		if l.TTFTQuantileOK {
			return pct + ", read of the TTFT histograms (a queue time above the mean TTFT, of requests finishing now: proof only with the mean TTFT within " + time.Duration(breakQueue*float64(cfg.TTFT)).String() + ")"
		}
	}
	return pct + " asked, but no replica's TTFT histogram is forwarded (the agents' --forward-histograms, value forwardHistograms of the deploy/daemonset chart) or none got a first token in the window: " + means()
}

// health says whether a replica's window was past its capacity or within
// it: neither with a queue standing below the break, with a queue time
// not of now and a mean TTFT past its bound (unsure), or when nothing says.
// itl: an ITL past the SLO is a break (State.itlJudges).
func health(l *store.PodLoad, cfg Config, itl bool) (broke, healthy bool) {
	if l.Preemptions > 0 || itl && l.ITLOK && l.ITL > cfg.ITL.Seconds() {
		return true, false
	}
	slo := cfg.TTFT.Seconds()
	standing := l.Waiting >= 1 && l.WaitingGrowth >= 0
	queueNow := queueOfNow(l)
	queuedLong := queueNow && l.QueueTime > breakQueue*slo
	// A queue time not of now, the mean TTFT is the most the queue now
	// can be: past the queue's bound it may be queue or prefill, and the
	// window proves nothing (taken as proof, a window whose queue time
	// was just above its TTFT proved what one just below it broke).
	unsure := l.QueueOK && !queueNow && l.TTFT > breakQueue*slo
	switch {
	case cfg.Percentile > 0 && l.TTFTQuantileOK && !(l.TTFTQuantileBeyond && l.TTFTQuantile < slo):
		// (A quantile beyond the histogram's highest bound, that bound
		// below the SLO — buckets that stop at 10 s, an SLO of 15 s —
		// says nothing of the SLO: the means judge that replica. Beyond a
		// bound at the SLO or past it, it is past the SLO.)
		// Past the percentile's SLO with requests queued: load broke it.
		// Past it with none queued, the prompts alone take longer than the
		// SLO (no replica count changes that): nothing is learned.
		queued := l.Waiting >= 1 || queuedLong
		if l.TTFTQuantile > slo || l.TTFTQuantileBeyond { // beyond a bound at the SLO or past it
			return queued, false
		}
		return false, !queued && !unsure
	case queueNow:
		broke = queuedLong || (standing && l.TTFTOK && l.TTFT > breakTTFT*slo)
	case l.TTFTOK:
		// Without a queue-time histogram (an older server's page), or with
		// a mean queue time that is not of now (queueOfNow), the mean TTFT
		// judges, as the percentile does: past the bound with requests
		// waiting, load broke it; past it with none waiting, the prompts
		// alone take that long (no replica count changes that): nothing is
		// learned. Every window of long prompts broke, the capacity
		// followed each replica's throughput down, and the plan rose by a
		// quarter at every round (4 replicas to 75 at an unchanged load).
		if l.TTFT > breakTTFT*slo {
			return l.Waiting >= 1, false
		}
		if unsure {
			return false, false
		}
	default:
		return false, false
	}
	return broke, !broke && l.Waiting < 1
}

// queueOfNow says whether a window's mean queue time is of the requests
// served now: it has one, and it is at most the mean TTFT. vLLM observes a
// request's queue time when the request finishes (vllm/v1/metrics/
// loggers.py), its TTFT at its first token, and no request queues longer
// than its first token takes: a mean queue time above the mean TTFT is of
// requests that queued long ago and finish now, and the window is judged
// by its mean TTFT, as a page without a queue-time histogram is. After a
// burst that queued for minutes, the windows of a replica serving every
// first token within 15 ms read a queue of 226 s while its long outputs
// finished, and each was taken as past capacity (the capacity learned
// fell from 44,000 to 17,000, held there for the hour by the breaks'
// level, and the plan held 6 to 10 replicas where the capacity the first
// burst taught asks for 4 or 5).
func queueOfNow(l *store.PodLoad) bool {
	return l.QueueOK && !(l.TTFTOK && l.QueueTime > l.TTFT)
}

// learnStartups counts the startups of pods that became ready since the
// last counted: the lead time is their mean plus two mean deviations. The
// startups of pods ready before this process listed them (StartupUnseen:
// after a restart, every pod's) end at their Ready condition's latest
// transition, which a readiness flap moved later: one such pod, flapping
// 45 minutes after its creation, taught a restarted aggregator a lead
// time of 21 minutes for replicas that start in 4. Of those only their
// lower median is counted, once a snapshot: a flap can only lengthen a
// startup, and fewer than half of them flapping move nothing.
//
// A pod listed after one ready later than it (its agent's report a few
// seconds behind another's) is counted too, within lateListing of the
// newest counted: the newest ready time alone was the mark, and such a
// pod's startup was never counted.
func (st *State) learnStartups(in Input) {
	newest := st.startupsTo
	horizon := st.startupsTo.Add(-lateListing)
	var unseen []time.Duration
	var counted map[countedStartup]struct{} // st.counted's copy, once it changes
	for _, l := range in.Pods {
		if l.Startup <= 0 || l.Startup > st.stuckAfter() || l.State == store.PodStarting {
			continue
		}
		readyAt := in.At.Add(-l.Age + l.Startup)
		if !readyAt.After(horizon) {
			continue
		}
		k := countedStartup{l.Name, readyAt.UnixNano()}
		if _, ok := st.counted[k]; ok {
			continue
		}
		if counted == nil {
			counted = maps.Clone(st.counted)
			if counted == nil {
				counted = map[countedStartup]struct{}{}
			}
		}
		counted[k] = struct{}{}
		if readyAt.After(newest) {
			newest = readyAt
		}
		if l.StartupUnseen {
			unseen = append(unseen, l.Startup)
			continue
		}
		st.countStartup(l.Startup)
	}
	if len(unseen) > 0 {
		slices.Sort(unseen)
		st.countStartup(unseen[(len(unseen)-1)/2])
	}
	st.startupsTo = newest
	if counted != nil {
		for k := range counted {
			if k.readyNs <= newest.Add(-lateListing).UnixNano() {
				delete(counted, k)
			}
		}
		st.counted = counted
	}
}

// countedStartup is a pod whose startup was counted: its name and ready
// time (a pod made again under its name is another startup).
type countedStartup struct {
	name    string
	readyNs int64
}

// lateListing bounds how long after a pod's ready time, behind the newest
// counted, its startup is still counted (an agent's report behind
// another's, an agent restarted).
const lateListing = 5 * time.Minute

// countStartup moves the lead time learned toward one startup.
func (st *State) countStartup(d time.Duration) {
	st.Startups++
	if st.Startups == 1 {
		st.LeadTime, st.leadDev = d, 0
		return
	}
	dev := d - st.LeadTime
	st.LeadTime += dev / 4
	st.leadDev += (abs(dev) - st.leadDev) / 4
}

// lead is the lead time learned, or assumed.
func (st *State) lead(cfg Config) time.Duration {
	if st.Startups == 0 {
		return max(cfg.LeadTime, st.startingFor)
	}
	return max(st.LeadTime, st.startingFor)
}

// hold is how long a peak's capacity is held: the lead time (learned, or
// assumed) with two deviations, the margin, and the regret extension.
func (st *State) hold(cfg Config) time.Duration {
	if st.Startups == 0 {
		return st.lead(cfg) + cfg.HoldMargin + st.HoldExtra
	}
	return max(st.LeadTime+2*st.leadDev, st.startingFor) + cfg.HoldMargin + st.HoldExtra
}

// regret records releases and regrets. A release is the replicas listed
// (fleet: ready, starting or stuck) falling after the plan asked for fewer
// than were listed (lowPlan, the lowest plan since the fleet last moved): a
// plan that dips for one evaluation and comes back released nothing unless
// the HPA acted on it, and a replica lost while the plan still wanted it (a
// node drained, a rollout) is no release of the plan's. Nor is a replica
// the plan never asked for: what is released is at most the highest plan
// since the fleet last fell (highPlan), so a rollout's surge pod (the
// fleet one over the plan while it starts) taken back was a release of
// it, and the rise after it a regret, at every step of the rollout. A regret is the
// count released planned again within a lead time of its release, when a
// replica released could not have started again in time. Each regret
// lengthens the hold (to at least a lead time more, doubling, at most
// maxHoldExtra); an hour without one halves the extension.
func (st *State) regret(plan, fleet int, now time.Time, cfg Config) {
	low, high := min(st.lowPlan, plan), max(st.highPlan, plan)
	switch {
	case fleet < st.lastFleet && low < st.lastFleet && min(high, st.lastFleet) > fleet:
		st.released, st.releasedAt = min(high, st.lastFleet), now
	case st.released > 0 && plan >= st.released:
		if now.Sub(st.releasedAt) < st.lead(cfg) {
			st.HoldExtra = min(max(2*st.HoldExtra, st.lead(cfg)), maxHoldExtra)
			st.lastRegret = now
		}
		st.released = 0
	}
	if st.HoldExtra > 0 && now.Sub(st.lastRegret) > regretQuiet {
		st.HoldExtra /= 2
		st.lastRegret = now
	}
	if fleet != st.lastFleet {
		low = plan
	}
	if fleet < st.lastFleet {
		high = plan
	}
	st.lastFleet, st.lowPlan, st.highPlan = fleet, low, high
}

// noReplica plans a workload with no replica listed: the requests its
// routers hold or saw arrive need one replica; lost replicas and a workload
// never seen are errors.
func noReplica(in Input, st State, cfg Config) (Plan, State, error) {
	// No replica is listed, so none is starting: a replica that was (one
	// started past the lead time learned, then deleted) lengthens the
	// lead time and the hold no more.
	st.startingFor = 0
	if in.LostOK {
		return Plan{}, st, fmt.Errorf("%w: its %d replicas that were reporting are gone without their agent removing them (agent lost past --pod-expiry) since %s: no value, rather than 0",
			ErrLost, in.Lost.Pods, in.Lost.At.UTC().Format(time.RFC3339))
	}
	d := in.Demand
	if d.Sources == 0 {
		if d.Stale > 0 {
			return Plan{}, st, fmt.Errorf("%w: no replica, and its %d demand sources have not reported within staleAfter", ErrStale, d.Stale)
		}
		return Plan{}, st, ErrNotFound
	}
	if why := implausibleDemand(d); why != "" {
		return Plan{}, st, fmt.Errorf("%w: no replica, and %s", ErrRefused, why)
	}
	if err := silentRouters(d); err != nil {
		return Plan{}, st, err
	}
	if st.Since.IsZero() {
		st.Since = in.At // a plan: the hold counts from it
	}
	p := Plan{Backlog: d.Held + d.Arrived, Reason: "no replica and no request waits at the routers"}
	if p.Backlog > 0 {
		p.Need, p.Replicas = 1, 1
		p.Reason = fmt.Sprintf("no replica: %.0f requests wait at the routers", p.Backlog)
	}
	if p.Backlog > 0 {
		// Requests wait at the routers and no replica is listed: the
		// peaks held are held as with replicas listed. A node drained of
		// every replica, their replacements pending (listed by no
		// agent), was planned 1 while its load waited, and the HPA took
		// the replacements back. (With nothing waiting, the routers say
		// the load is gone: 0, a workload let scale to zero.)
		p.holdPeaks(&st, in.At, st.hold(cfg), cfg)
	}
	return p, st, nil
}

// RoomRefused says why a workload a new replica of which the store refused
// for room has no value: the replicas held are not all of it (their load
// alone, the routers' demand alone or NotFound would scale it down).
const RoomRefused = "replicas of it wait for room in the aggregator (--max-pods or --max-pods-per-namespace reached, or room freed going first to a namespace holding less): no value, rather than one of the replicas held alone, the routers' demand alone or 0"

// ceil is x rounded up to a replica count: at most math.MaxInt32 (the
// HPA's counts are int32; past it, Go's conversion to int is not defined).
func ceil(x float64) int {
	switch {
	case x <= 0 || math.IsNaN(x):
		return 0
	case x >= math.MaxInt32:
		return math.MaxInt32
	}
	// The 1e-9 absorbs a float's error at a whole count; a need above 0
	// within it is still a replica (it was 0: a capacity learned huge from
	// a believed window planned a replica serving a trickle as none).
	return max(1, int(math.Ceil(x-1e-9)))
}

// stuckAfter is how long a replica starts before it is stuck: an hour, or
// stuckLeads lead times learned, whichever is longer (a workload whose
// replicas take long to start learns that they do), but never past
// maxStartup. It bounds the startups learned too, so the lead time learned
// is at most maxStartup: startups each just within it (an agent's times
// that lie) grew it half again each, and past 34 of them the hold wrapped
// to its margin alone and this to an hour.
func (st *State) stuckAfter() time.Duration {
	if st.Startups == 0 {
		return stuckAfter
	}
	return min(max(stuckAfter, stuckLeads*st.LeadTime), maxStartup)
}

// stuck is whether a starting replica has been starting past stuckAfter.
func (st *State) stuck(l *store.PodLoad) bool { return l.Age > st.stuckAfter() }

// implausible says why a fresh replica's window is past what is believed
// of one replica (maxTokenRate, maxRequestRate, maxQueue, its queue moving
// by more than maxQueue a second), a value of it is not a finite number
// or is below 0 (its queue's growth excepted), or it has no queue gauge;
// "" when it is believable.
func implausible(l *store.PodLoad) string {
	// The queue's growth is the one value that may be below 0.
	if math.IsNaN(l.WaitingGrowth) || math.IsInf(l.WaitingGrowth, 0) {
		return "a value that is not a finite number"
	}
	for _, v := range [...]float64{l.PromptTokens, l.GenerationTokens, l.FirstTokens, l.TTFT, l.QueueTime, l.ITL,
		l.TTFTQuantile, l.Preemptions, l.Waiting, l.Running, l.KVCache, l.WaitingNow} {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return "a value that is not a finite number"
		case v < 0:
			return "a rate, count, mean or gauge below 0"
		}
	}
	switch {
	case max(l.PromptTokens, l.GenerationTokens) > maxTokenRate:
		return fmt.Sprintf("%.3g tokens a second, past the %.0e believed of one replica", max(l.PromptTokens, l.GenerationTokens), maxTokenRate)
	case l.FirstTokens > maxRequestRate:
		return fmt.Sprintf("%.3g first tokens a second, past the %.0e believed of one replica", l.FirstTokens, maxRequestRate)
	case l.Preemptions > maxRequestRate:
		// A preemption rate past the first tokens marks a swamped window
		// (rule 2), so a lie there would hold a break at its knee.
		return fmt.Sprintf("%.3g preemptions a second, past the %.0e believed of one replica", l.Preemptions, maxRequestRate)
	case max(l.Waiting, l.WaitingNow) > maxQueue:
		return fmt.Sprintf("%.3g requests waiting, past the %.0e believed of one replica", max(l.Waiting, l.WaitingNow), maxQueue)
	case math.Abs(l.WaitingGrowth) > maxQueue:
		return fmt.Sprintf("a queue moving by %.3g requests a second, past the %.0e waiting believed of one replica", l.WaitingGrowth, maxQueue)
	case l.NoWaiting:
		// A queue unknown is not an empty one.
		return "no requests-waiting gauge in its window (absent from its page, or every value refused)"
	}
	return ""
}

// unplannable is why a workload with fresh pods counted is not planned:
// ready replicas none of which reported, or none ready and routers not
// reporting (nil when it is planned).
func (p *Plan) unplannable(fresh int, d store.DemandValue) error {
	switch {
	case p.Ready > 0 && fresh == 0 && p.Refused > 0:
		return fmt.Errorf("%w: no ready pod's window is believable (%d refused, %s; %d ready pods without a value, %d starting)", ErrStale, p.Refused, p.RefusedWhy, p.Missing-p.Refused, p.Starting)
	case p.Ready > 0 && fresh == 0 && p.Unready > 0:
		return fmt.Errorf("%w: no ready pod reported within staleAfter (%d replicas without a value, %d of them ready before and not now; %d starting)", ErrStale, p.Missing, p.Unready, p.Starting)
	case p.Ready > 0 && fresh == 0:
		return fmt.Errorf("%w: no ready pod reported within staleAfter (%d ready pods without a value, %d starting)", ErrStale, p.Missing, p.Starting)
	case p.Ready == 0:
		// Replicas starting or stopping alone: the routers' demand is
		// the whole of it, as with none listed (noReplica), refused as
		// there when it is past belief (it was taken as none, and the
		// replicas starting were planned away: 0).
		if why := implausibleDemand(d); why != "" {
			return fmt.Errorf("%w: no replica ready (%d starting), and %s", ErrRefused, p.Starting, why)
		}
		if p.Starting == 0 && (p.Terminating > 0 || p.Stuck > 0) && d.Sources == 0 {
			// Every replica draining (a node drained, a Recreate
			// rollout), their replacements not listed yet, or unready
			// past the stuck bound (each served, then lost its
			// readiness an hour ago), and no router that reports:
			// nothing says the load. Planned 0, the HPA took back the
			// replacements pending, and KEDA deactivated a workload let
			// scale to zero.
			return fmt.Errorf("%w: no replica ready or starting (%d terminating, their replacements not listed yet; %d unready past the stuck bound) and no demand source reports: no value, rather than 0", ErrStale, p.Terminating, p.Stuck)
		}
		return silentRouters(d)
	}
	return nil
}

// silentRouters is the error for a workload with no ready replica whose
// routers' demand is unheard (store.DemandValue.Unheard).
func silentRouters(d store.DemandValue) error {
	if !d.Unheard() {
		return nil
	}
	return fmt.Errorf("%w: no ready replica; its %d demand sources that report hold no request, and %d of ready routers have not reported within staleAfter", ErrStale, d.Sources, d.Silent)
}

// routersQueued is the requests the routers hold, and with no replica
// ready those that arrived at them in the window: 0, and the demand named
// in p.RefusedWhy, when it is past what is believed (implausibleDemand).
func (p *Plan) routersQueued(d store.DemandValue) float64 {
	if why := implausibleDemand(d); why != "" {
		if p.RefusedWhy != "" {
			p.RefusedWhy += "; "
		}
		p.RefusedWhy += why
		return 0
	}
	if p.Ready == 0 {
		return d.Held + d.Arrived
	}
	return d.Held
}

// implausibleDemand says why the routers' demand is not believed — a
// count not a finite number, below 0, or past maxQueue requests —, ""
// when it is. A demand refused is
// left out of the plan, and named in it.
func implausibleDemand(d store.DemandValue) string {
	for _, v := range [...]float64{d.Held, d.Arrived} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxQueue {
			return fmt.Sprintf("the routers' demand (%.3g held, %.3g arrived in the window) is refused: counts within 0 and %.0e are believed", d.Held, d.Arrived, float64(maxQueue))
		}
	}
	return ""
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
