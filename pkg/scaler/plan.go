package scaler

import (
	"errors"
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

// maxPlans bounds the workloads whose learned state is kept; the least
// recently planned is forgotten first (and relearned if planned again).
const maxPlans = 10000

// planKey: one learned state per workload and SLOs.
type planKey struct {
	store.Key
	TTFT, ITL  time.Duration
	Percentile float64
}

// plans holds each workload's learned planner state.
type plans struct {
	mu  sync.Mutex
	lru *simplelru.LRU[planKey, planner.State]
}

func newPlans() *plans {
	l, _ := simplelru.NewLRU[planKey, planner.State](maxPlans, nil)
	return &plans{lru: l}
}

// plan evaluates a replicas trigger: one store snapshot, planned with the
// workload's learned state, which the plan then replaces.
func (s *Server) plan(t Trigger) (Decision, error) {
	cfg := planner.Default(t.SLOTTFT)
	cfg.ITL, cfg.Percentile = t.SLOITL, t.SLOPercentile/100
	snap := s.store.Snapshot(nil, t.Workload, t.Window, t.StaleAfter, cfg.Percentile)
	k := planKey{t.Workload, cfg.TTFT, cfg.ITL, cfg.Percentile}
	s.plans.mu.Lock()
	prev, _ := s.plans.lru.Get(k)
	p, next, err := planner.Make(snap, prev, cfg)
	s.plans.lru.Add(k, next)
	s.plans.mu.Unlock()
	switch {
	case errors.Is(err, planner.ErrNotFound):
		return Decision{}, status.Errorf(codes.NotFound, "%s: %v", describe(t), err)
	case err != nil:
		return Decision{}, status.Errorf(codes.Unavailable, "%s: %v", describe(t), err)
	}
	v := float64(p.Replicas)
	d := Decision{Value: v, Active: v > t.ActivationThreshold, Reporting: p.Need, Ready: p.Ready, Counted: p.Ready - p.Missing,
		Pending: snap.Demand.Held, Plan: &p, Direction: "down"}
	if p.Replicas > p.Ready+p.Starting {
		d.Direction = "up"
	}
	return d, nil
}
