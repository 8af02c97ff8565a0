package scaler

import (
	"context"
	"strings"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/slots"
)

// LearnEvery is how often every replica learns its planner triggers
// (Learn): the planner's observation cadence, so that a replica KEDA does
// not ask observes as often as the one it asks.
const LearnEvery = planner.DefaultObserveEvery

// PlannerRefs lists the planner triggers (type external-push, metric
// replicas) of the ScaledObjects in the cache, as KEDA would send them:
// at most limit, shared fairly among the namespaces (slots.Share), so that
// one tenant's many ScaledObjects do not crowd out another's. Nil before
// the cache has synced.
func (r *InformerResolver) PlannerRefs(limit int) []*externalscaler.ScaledObjectRef {
	if !r.informer.HasSynced() {
		return nil
	}
	var refs []*externalscaler.ScaledObjectRef
	for _, obj := range r.informer.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		triggers, _, _ := unstructured.NestedSlice(u.Object, "spec", "triggers")
		for _, tr := range triggers {
			m, _ := tr.(map[string]any)
			if typ, _, _ := unstructured.NestedString(m, "type"); typ != "external-push" {
				continue
			}
			md, ok, _ := unstructured.NestedStringMap(m, "metadata")
			if !ok || !isPlanner(md) {
				continue
			}
			refs = append(refs, &externalscaler.ScaledObjectRef{Name: u.GetName(), Namespace: u.GetNamespace(), ScalerMetadata: md})
		}
	}
	return slots.Share(refs, limit, (*externalscaler.ScaledObjectRef).GetNamespace,
		func(a, b *externalscaler.ScaledObjectRef) int { return strings.Compare(a.Name, b.Name) })
}

// Learn plans each of refs as KEDA's call would, for what the planner
// learns (its capacity, lead time, surges and holds), and answers nothing:
// every aggregator replica holds every workload's samples, and so, learning
// every planner trigger, the state the replica KEDA asks holds; after a
// failover KEDA's new replica plans from what it has learned, not from the
// start. A trigger whose metadata KEDA's call would be refused for, or
// that names another namespace's workload, teaches nothing and is not
// recorded as refused (KEDA's own calls are). It returns the states
// planned (a workload with no pod here, or none fresh, is not).
func (s *Server) Learn(refs []*externalscaler.ScaledObjectRef) int {
	n := 0
	// Triggers of one state (one workload, SLO and window, asked from one
	// namespace) are planned once a round: a tenant's ScaledObjects of
	// eight identical triggers each had every one planned, up to the
	// round's whole share, each a snapshot of the workload.
	planned := map[planKey]bool{}
	for _, ref := range refs {
		t, err := ParseTrigger(ref, s.maxWindow, s.resolver)
		if err != nil || t.Metric != MetricReplicas || !s.crossNS && t.Workload.Namespace != ref.GetNamespace() {
			continue
		}
		k := keyOf(t, configOf(t))
		if planned[k] {
			continue
		}
		planned[k] = true
		// Its window sizes the store's retention here too, as KEDA's calls'
		// do on the replica KEDA asks: a replica that only learned kept 10 s
		// of each pod, and planned over that (a 10 s window's noise held as
		// peaks) what it would answer with after a failover.
		s.windows.note(t.Window, s.now())
		if s.gate != nil && s.gate() != nil {
			// While answers would be partial (the warm-up after a start,
			// before every agent is heard), KEDA's calls are not planned:
			// neither is learning. A plan made over some nodes' replicas
			// started its state then (the restart's hold counted from
			// it) and held their share of the work as peaks.
			continue
		}
		if _, err := s.plan(t); err == nil {
			n++
		}
	}
	return n
}

// LearnFrom runs Learn over the cache's planner triggers each LearnEvery
// until ctx ends.
func (s *Server) LearnFrom(ctx context.Context, r *InformerResolver) {
	wait.UntilWithContext(ctx, func(context.Context) { s.Learn(r.PlannerRefs(maxPlans)) }, LearnEvery)
}
