package store

import (
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// PodLoad is one replica's load over a window, as a capacity planner reads
// it (pkg/planner): what it served, what waits on it, how fast it answered.
// Rates are per second over the window; gauges are the window's means.
type PodLoad struct {
	Name string
	// State: PodCounted (ready, with a fresh sample), PodStarting,
	// PodTerminating or PodMissing (ready, no fresh sample; Reason says
	// why). PodUndefined is not used.
	State  PodState
	Reason string
	// PromptTokens and GenerationTokens: tokens prefilled and generated per
	// second; Tokens is false when the pod's page has neither counter.
	PromptTokens, GenerationTokens float64
	Tokens                         bool
	// FirstTokens: requests that got their first token, per second; TTFT is
	// their mean time to it (TTFTOK false when none did in the window, or
	// the page has no TTFT histogram). A page with no TTFT histogram but a
	// queue-time one (TGI's) counts the requests that left the queue: each
	// is then prefilled, and its first token follows.
	FirstTokens float64
	TTFT        float64
	TTFTOK      bool
	// QueueTime: the mean time queued of the requests whose queue time the
	// page observed in the window (QueueOK false when none, or the page has
	// no queue-time histogram): the part of TTFT that load adds. vLLM
	// observes it when a request finishes, so it lags the queue by the
	// requests' prefill and decode: the planner reads one above the mean
	// TTFT as not of now.
	QueueTime float64
	QueueOK   bool
	// ITL: the mean time between generated tokens in the window (ITLOK
	// false when none was generated, or the page has no ITL histogram).
	ITL   float64
	ITLOK bool
	// TTFTQuantile: the Snapshot's TTFT quantile over the window, from the
	// pod's TTFT histogram (TTFTQuantileOK false when none was asked for,
	// the histogram is not forwarded, or no request got its first token).
	TTFTQuantile   float64
	TTFTQuantileOK bool
	// TTFTQuantileBeyond: the quantile lies beyond the histogram's highest
	// finite bucket bound, which TTFTQuantile then is (what it is beyond
	// that, the histogram cannot say).
	TTFTQuantileBeyond bool
	// Preemptions per second.
	Preemptions float64
	// Waiting, Running and KVCache: the window's means; WaitingNow the
	// latest; WaitingGrowth the increase of waiting over the window, per
	// second (negative when the queue shrank). NoWaiting, NoRunning and
	// NoKV: the window holds no value of the gauge (the page has none, or
	// every one was refused): the value above is then 0 and says nothing.
	Waiting, Running, KVCache  float64
	WaitingNow, WaitingGrowth  float64
	NoWaiting, NoRunning, NoKV bool
	// Span: the time the rates cover (the window, or less while the pod
	// has fewer samples).
	Span time.Duration
	// Truncated: the window reaches back past the samples kept
	// (MaxSamples), which span SpanMs, Samples of them: its values cover
	// less than the window (a plan over them is refused, never cut short).
	Truncated bool
	SpanMs    int64
	Samples   int
	// Startup: from the pod's creation (its agent's listing says when;
	// else its first listing, starting) to its Ready condition's
	// transition (else its first listing ready); 0 when unknown: its start
	// was not seen and its listing gives no times. Age: since its creation
	// (else its first listing, starting), 0 when unknown.
	Startup, Age time.Duration
	// StartupUnseen: the pod was ready when first listed (this process
	// started after it), so Startup ends at its Ready condition's latest
	// transition: a readiness flap since then lengthened it.
	StartupUnseen bool
	// Unseen: a replica whose agent is lost (its streams closed past the
	// store's Expiry) and that the API still has (Options.Exists): ready
	// with no sample (PodMissing, Reason UnseenReason), or starting.
	Unseen bool
	// Unready: a PodStarting pod that was ready before, since this store
	// first listed it (its readiness lost: a failed probe, a restarted
	// container); Age is still since its creation, UnreadyFor since it was
	// first listed not ready again.
	Unready    bool
	UnreadyFor time.Duration
}

// Snapshot is one workload as a planner reads it, taken under one lock.
type Snapshot struct {
	At time.Time
	// Found is false when the store knows no replica of the workload.
	Found bool
	Pods  []PodLoad
	// Demand is its demand sources' (held at routers).
	Demand DemandValue
	// Lost, when LostOK: its replicas were dropped without their agent
	// removing them (as LostReplicas).
	Lost   Lost
	LostOK bool
	// RefusedAt: a new pod of the workload was refused for room (MaxPods,
	// MaxPodsPerNamespace, a share: roomIn) then, within the last minute: replicas of it
	// wait, unseen, and what is held is not the whole workload.
	RefusedAt time.Time
}

var (
	promptRate   = metric.Def{Rule: metric.RuleRate, Num: metric.PromptTokens}
	genRate      = metric.Def{Rule: metric.RuleRate, Num: metric.GenerationTokens}
	firstRate    = metric.Def{Rule: metric.RuleRate, Num: metric.TTFTCount}
	dequeueRate  = metric.Def{Rule: metric.RuleRate, Num: metric.QueueTimeCount}
	preemptRate  = metric.Def{Rule: metric.RuleRate, Num: metric.Preemptions}
	ttftMean     = metric.Def{Rule: metric.RuleRatio, Num: metric.TTFTSum, Den: metric.TTFTCount}
	queueMean    = metric.Def{Rule: metric.RuleRatio, Num: metric.QueueTimeSum, Den: metric.QueueTimeCount}
	itlMean      = metric.Def{Rule: metric.RuleRatio, Num: metric.ITLSum, Den: metric.ITLCount}
	waitingGauge = metric.Def{Rule: metric.RuleGauge, Num: metric.Waiting}
	runningGauge = metric.Def{Rule: metric.RuleGauge, Num: metric.Running}
	kvGauge      = metric.Def{Rule: metric.RuleGauge, Num: metric.KVCacheUsage}

	rateIDs  = ids(promptRate) | ids(genRate) | ids(firstRate) | ids(dequeueRate) | ids(preemptRate) | ids(ttftMean) | ids(queueMean) | ids(itlMean)
	gaugeIDs = ids(waitingGauge) | ids(runningGauge) | ids(kvGauge)
)

// Snapshot reads workload k's replicas over window, its demand sources and
// whether it lost replicas, in one pass under one lock; pods appended to
// dst (which may be nil). ttftQ, when in (0, 1), is the TTFT quantile read
// of each pod's TTFT histogram (PodLoad.TTFTQuantile).
func (s *Store) Snapshot(dst []PodLoad, k Key, window, freshFor time.Duration, ttftQ float64) Snapshot {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	sc := getScratch()
	defer putScratch(sc)
	at := s.stamp(now)
	snap := Snapshot{At: now, Pods: dst[:0]}
	var expired []*pod
	for _, p := range s.workloads[k] {
		if p.Demand {
			continue
		}
		if s.expired(p, now) {
			expired = s.expiredLost(expired, p)
			continue
		}
		snap.Pods = append(snap.Pods, p.load(sc, now, at, window, freshFor, ttftQ))
	}
	snap.Found = len(snap.Pods) > 0
	if snap.Found {
		for _, u := range s.stillThere(k, expired, now) {
			snap.Pods = append(snap.Pods, u.load(now))
		}
	}
	snap.Demand = s.demand(sc, k, window, freshFor, now)
	if !snap.Found {
		snap.Lost, snap.LostOK = s.lostReplicas(k, now)
	}
	snap.RefusedAt = s.refusedRecently(k, now)
	return snap
}

// load is p's PodLoad; mu must be held.
func (p *pod) load(sc *scratch, now time.Time, at int64, window, freshFor time.Duration, ttftQ float64) PodLoad {
	l := PodLoad{Name: p.Name}
	if p.readyNs > 0 && p.startNs != 0 {
		l.Startup, l.StartupUnseen = time.Duration(p.readyNs-p.startNs), p.readyUnseen
	}
	if p.startNs != 0 {
		l.Age = max(0, now.Sub(time.Unix(0, p.startNs))) // a creation ahead of this clock: the API server's is
	}
	switch {
	case p.Terminating:
		l.State = PodTerminating
		return l
	case !p.Ready:
		l.State, l.Unready = PodStarting, p.readyNs != 0
		if at := p.get().unreadyNs; l.Unready && at != 0 {
			l.UnreadyFor = max(0, now.Sub(time.Unix(0, at)))
		}
		return l
	case p.get().missing != "":
		l.State, l.Reason = PodMissing, p.get().missing
		return l
	case p.seen == 0:
		l.State, l.Reason = PodMissing, "no sample yet"
		return l
	case p.age(at) > freshFor:
		l.State, l.Reason = PodMissing, "stale"
		return l
	}
	l.State = PodCounted
	l.Samples = p.series.len()
	l.SpanMs, l.Truncated = p.cut(sc, window, false)
	rates := p.window(sc, window, metric.RuleRate, rateIDs)
	if n := len(rates); n > 1 {
		// At most the window: over a gap longer (its agent's stream cut,
		// scrapes failing) the rates are the gap's means, and a Span of 5
		// minutes made every other replica's 30 s window look thin to the
		// planner, which learnt from this one alone.
		if l.Span = time.Duration(rates[n-1].TimeMs-rates[0].TimeMs) * time.Millisecond; window > 0 {
			l.Span = min(window, l.Span)
		}
	}
	var okP, okG bool
	l.PromptTokens, okP = promptRate.Eval(rates)
	l.GenerationTokens, okG = genRate.Eval(rates)
	l.Tokens = okP || okG
	var okF bool
	if l.FirstTokens, okF = firstRate.Eval(rates); !okF {
		l.FirstTokens, _ = dequeueRate.Eval(rates)
	}
	l.TTFT, l.TTFTOK = ttftMean.Eval(rates)
	l.QueueTime, l.QueueOK = queueMean.Eval(rates)
	l.ITL, l.ITLOK = itlMean.Eval(rates)
	l.Preemptions, _ = preemptRate.Eval(rates)
	if ttftQ > 0 && ttftQ < 1 {
		q := metric.Def{Rule: metric.RuleQuantile, Hist: metric.TTFTHist, Q: ttftQ}
		l.TTFTQuantile, l.TTFTQuantileBeyond, l.TTFTQuantileOK = q.EvalBeyond(p.window(sc, window, metric.RuleQuantile, ids(q)))
	}
	gauges := p.window(sc, window, metric.RuleGauge, gaugeIDs)
	var okW, okR, okKV bool
	l.Waiting, okW = waitingGauge.Eval(gauges)
	l.Running, okR = runningGauge.Eval(gauges)
	l.KVCache, okKV = kvGauge.Eval(gauges)
	l.NoWaiting, l.NoRunning, l.NoKV = !okW, !okR, !okKV
	l.WaitingNow, _ = waitingGauge.Latest(gauges)
	if n := len(gauges); n > 1 {
		a, okA := gauges[0].Get(metric.Waiting)
		b, okB := gauges[n-1].Get(metric.Waiting)
		if dt := float64(gauges[n-1].TimeMs-gauges[0].TimeMs) / 1000; okA && okB && dt > 0 {
			l.WaitingGrowth = (b - a) / dt
		}
	}
	return l
}
