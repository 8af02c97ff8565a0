package scaler

import (
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/store"
)

// MetricReplicas is the planner's trigger metric: its value is the replica
// count the workload needs to meet its SLO (pkg/planner), so the HPA is
// told AverageValue 1 (threshold 1, valueType total) and its desired count
// is the plan (docs/planner.md).
const MetricReplicas = "replicas"

// DefaultPlanWindow is the replicas trigger's default window: rates over
// 30 s of samples (a 10 s window's noise would be held as peaks).
const DefaultPlanWindow = 30 * time.Second

// maxPlans bounds the workloads whose learned state is kept. Past it the
// least recently planned of the namespace holding the most is forgotten
// (and relearned if planned again): one tenant's many workloads, or its
// triggers of many SLOs, forget its own state, never another tenant's. A
// state is its ScaledObject's namespace's: with cross-namespace triggers
// allowed, a reader's triggers on another tenant's workload were counted
// in that tenant's namespace and forgot its own state.
const maxPlans = 10000

// planKey: one learned state per asking namespace, workload, SLOs, window
// and staleness: two ScaledObjects of one namespace planning a workload
// over different windows shared one state, and a 10 s window's peaks were
// held in the 30 s one's plan.
type planKey struct {
	store.Key
	TTFT, ITL          time.Duration
	Percentile         float64
	Window, StaleAfter time.Duration
	Owner              string // the ScaledObject's namespace
}

// keyOf is the key of t's state, planned with cfg.
func keyOf(t Trigger, cfg planner.Config) planKey {
	k := planKey{t.Workload, cfg.TTFT, cfg.ITL, cfg.Percentile, t.Window, t.StaleAfter, t.Owner}
	if k.Owner == "" {
		k.Owner = t.Workload.Namespace
	}
	return k
}

// plans holds each workload's learned planner state, by the namespace of
// the ScaledObjects that ask.
type plans struct {
	mu  sync.Mutex // ns and n
	ns  map[string]*simplelru.LRU[planKey, heldPlan]
	n   int // states held, in all namespaces
	max int
	// planning serializes the plans of one key (a state read, planned
	// and written back), by the key's hash: plans of other keys go on
	// meanwhile. One lock held across every plan once made every
	// tenant's plans wait for each other's.
	planning [64]sync.Mutex
	seed     maphash.Seed
}

func newPlans() *plans {
	return &plans{ns: map[string]*simplelru.LRU[planKey, heldPlan]{}, max: maxPlans, seed: maphash.MakeSeed()}
}

// heldPlan is a key's state and when it was last planned (zero: never
// by a trigger's plan).
type heldPlan struct {
	st planner.State
	at time.Time
}

// planForget: a state not planned for this long, whose workload's every
// pod was made since its last plan, is forgotten at its next plan: its
// workload and ScaledObject were deleted together (a helm uninstall) and
// made again, and no plan ran while it had no pod, which alone forgot a
// state. A model installed again under the names inherited the old one's
// capacity, its proof of capacity (the floor of what breaks teach, fading
// over an hour), its lead time and its first plan's time: 2 replicas at
// 40,000 a second, then new ones breaking at 8,000, were planned 1. A
// state whose pods were there before is kept however long no plan ran:
// KEDA's calls stop for as long as its operator is away, and without
// --resolve-scale-targets nothing else plans.
const planForget = decisionTTL

// lockFor is the lock that serializes k's plans.
func (p *plans) lockFor(k planKey) *sync.Mutex {
	return &p.planning[maphash.Comparable(p.seed, k)%uint64(len(p.planning))]
}

// get is k's state (the zero State when none is held).
func (p *plans) get(k planKey) planner.State {
	if l := p.ns[k.Owner]; l != nil {
		h, _ := l.Get(k)
		return h.st
	}
	return planner.State{}
}

// current is k's state to plan pods at now: the zero State when none is
// held, or when it was last planned more than planForget before and every
// one of pods (none, too) was made since (its creation known: Age).
func (p *plans) current(k planKey, now time.Time, pods []store.PodLoad) planner.State {
	l := p.ns[k.Owner]
	if l == nil {
		return planner.State{}
	}
	h, ok := l.Get(k)
	if !ok || h.at.IsZero() {
		return h.st
	}
	since := now.Sub(h.at)
	if since <= planForget {
		return h.st
	}
	// With no pod listed (a workload at zero with its routers reporting,
	// or every replica's agent lost) nothing shows that the workload is
	// the one the state learned: forgotten, as for one made again. Kept,
	// a model installed again behind a router that stayed up planned its
	// first plans from zero on the old one's state, and each of them
	// renewed it past its new pods.
	for _, pod := range pods {
		if pod.Age == 0 || pod.Age >= since {
			return h.st // there before the last plan, or not known not to be
		}
	}
	return planner.State{}
}

// put holds st as k's state; past p.max, the namespace holding the most
// forgets its least recently planned.
func (p *plans) put(k planKey, st planner.State) { p.putAt(k, st, time.Time{}) }

// putAt is put, planned at.
func (p *plans) putAt(k planKey, st planner.State, at time.Time) {
	if l := p.ns[k.Owner]; l == nil || !l.Contains(k) {
		if p.n >= p.max {
			p.forgetOne() // may forget k's namespace's last state, and its list
		}
		p.n++
	}
	l := p.ns[k.Owner]
	if l == nil {
		l, _ = simplelru.NewLRU[planKey, heldPlan](p.max, nil)
		p.ns[k.Owner] = l
	}
	l.Add(k, heldPlan{st: st, at: at})
}

// remove forgets k's state.
func (p *plans) remove(k planKey) {
	l := p.ns[k.Owner]
	if l == nil || !l.Remove(k) {
		return
	}
	p.n--
	if l.Len() == 0 {
		delete(p.ns, k.Owner)
	}
}

// forgetOne drops the least recently planned state of the namespace
// holding the most.
func (p *plans) forgetOne() {
	if forgetOldestOfMost(p.ns) {
		p.n--
	}
}

// forgetOldestOfMost drops the oldest entry of the namespace whose list
// holds the most (and the list, emptied); false when there is none.
func forgetOldestOfMost[K comparable, V any](ns map[string]*simplelru.LRU[K, V]) bool {
	var most *simplelru.LRU[K, V]
	mostNS := ""
	for n, l := range ns {
		if most == nil || l.Len() > most.Len() {
			most, mostNS = l, n
		}
	}
	if most == nil {
		return false
	}
	most.RemoveOldest()
	if most.Len() == 0 {
		delete(ns, mostNS)
	}
	return true
}

// plan evaluates a replicas trigger: one store snapshot, planned with the
// workload's learned state, which the plan then replaces.
// configOf is the planner's configuration for t.
func configOf(t Trigger) planner.Config {
	cfg := planner.Default(t.SLOTTFT)
	cfg.ITL, cfg.Percentile = t.SLOITL, t.SLOPercentile/100
	return cfg
}

func (s *Server) plan(t Trigger) (Decision, error) {
	cfg := configOf(t)
	k := keyOf(t, cfg)
	keyLock := s.plans.lockFor(k)
	keyLock.Lock()
	// The snapshot is taken under the key's lock: one taken before it
	// could be planned after a newer one, over the state that one left.
	snap := s.store.Snapshot(nil, t.Workload, t.Window, t.StaleAfter, cfg.Percentile)
	for _, p := range snap.Pods {
		if p.Truncated { // refused as a metric's window is, never planned over less
			keyLock.Unlock()
			return Decision{}, status.Error(codes.InvalidArgument, truncated(t, p.Name, p.Samples, p.SpanMs))
		}
	}
	now := s.now()
	s.plans.mu.Lock()
	st := s.plans.current(k, now, snap.Pods)
	s.plans.mu.Unlock()
	p, next, err := planner.Make(snap, st, cfg)
	s.plans.mu.Lock()
	if errors.Is(err, planner.ErrNotFound) {
		// A workload with no pod (and no router that holds requests for
		// it) holds nothing learned: a trigger naming one that does not
		// exist holds no state, and one deleted forgets its own (a
		// workload made again under its name, another model, inherited
		// its capacity, its proof of capacity fading over an hour).
		s.plans.remove(k)
	} else {
		s.plans.putAt(k, next, now)
	}
	s.plans.mu.Unlock()
	keyLock.Unlock()
	switch {
	case errors.Is(err, planner.ErrNotFound):
		return Decision{}, status.Errorf(codes.NotFound, "%s: %v", describe(t), err)
	case err != nil:
		return Decision{}, status.Errorf(codes.Unavailable, "%s: %v", describe(t), err)
	}
	v := float64(p.Replicas)
	if v < 0 {
		return Decision{}, status.Errorf(codes.Internal, "%s: planned %d replicas, not a replica count", describe(t), p.Replicas)
	}
	d := Decision{Value: v, Active: v > t.ActivationThreshold, Reporting: p.Need, Ready: p.Ready, Counted: p.Ready - p.Missing,
		Pending: snap.Demand.Held, Plan: &p, Direction: "down"}
	if p.Replicas > p.Ready+p.Starting {
		d.Direction = "up"
	}
	return d, nil
}
