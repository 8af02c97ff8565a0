package scaler

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/pulse-io/pulse/pkg/planner"
)

// withTriggers is a ScaledObject of Workspace llama with these triggers.
func withTriggers(namespace, name string, triggers ...map[string]any) *unstructured.Unstructured {
	u := scaledObject(name, "Workspace", "llama")
	u.SetNamespace(namespace)
	ts := make([]any, len(triggers))
	for i, tr := range triggers {
		ts[i] = tr
	}
	_ = unstructured.SetNestedSlice(u.Object, ts, "spec", "triggers")
	return u
}

func trigger(typ string, md map[string]string) map[string]any {
	m := map[string]any{}
	for k, v := range md {
		m[k] = v
	}
	return map[string]any{"type": typ, "metadata": m}
}

// TestEveryReplicaLearnsWhatTheAskedOneDoes: two aggregator replicas hold
// the same samples; KEDA asks one. The other learns each planner trigger
// of the ScaledObjects it watches, at the planner's own cadence, and holds
// the same capacity and observations: after a failover KEDA's new replica
// plans from them, not from the start. A replica KEDA did not ask learned
// nothing, and relearned everything when asked. Triggers of another kind,
// another metric, metadata KEDA's call would be refused for, or another
// namespace's workload teach nothing, and are not recorded as refused.
func TestEveryReplicaLearnsWhatTheAskedOneDoes(t *testing.T) {
	replicas := replicasMD("scalerAddress", "pulse-aggregator.pulse-system.svc:9090")
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"},
		withTriggers("demo", "llama-so", trigger("cpu", map[string]string{"value": "50"}), trigger("external-push", replicas)),
		withTriggers("demo", "waiting-so", trigger("external-push", map[string]string{"workspace": "llama", "metric": "waiting"})),
		withTriggers("demo", "typo-so", trigger("external-push", replicasMD("sloTtf", "3s"))),
		withTriggers("evil", "reach-so", trigger("external-push", replicasMD("namespace", "demo", "sloTtft", "1s"))))
	r := NewInformerResolver(client)
	runSynced(t, r)
	refs := r.PlannerRefs(maxPlans)
	var names []string
	for _, ref := range refs {
		names = append(names, ref.Namespace+"/"+ref.Name)
	}
	// typo-so's trigger, which KEDA's call is refused, is not cached.
	if slices.Sort(names); !slices.Equal(names, []string{"demo/llama-so", "evil/reach-so"}) {
		t.Fatalf("planner refs %v, want demo/llama-so and evil/reach-so", names)
	}
	if got := r.PlannerRefs(1); len(got) != 1 {
		t.Fatalf("one ref at most: %v", got)
	}

	f := newFixtureWith(t, r)
	f.pods("a", "b")
	other := New(f.store, Options{MaxWindow: time.Minute, Resolver: r, Now: f.clock.Now})
	t.Cleanup(other.Shutdown)
	idle := New(f.store, Options{MaxWindow: time.Minute, Resolver: r, Now: f.clock.Now})
	t.Cleanup(idle.Shutdown)
	learned := 0
	for s := range 180 {
		f.serve(1, 10000, 0.01, "a", "b")
		if _, err := f.metric(t, replicas); err != nil && s > 0 {
			t.Fatal(err)
		}
		if s%int(LearnEvery/time.Second) == 0 {
			learned += other.Learn(r.PlannerRefs(maxPlans))
		}
	}
	k := planKey{Key: llama, TTFT: planner.DefaultTTFT, Window: DefaultPlanWindow, StaleAfter: DefaultStaleAfter, Owner: llama.Namespace}
	asked, learnt := f.server.plans.get(k), other.plans.get(k)
	if asked.Observations == 0 || learnt.Observations != asked.Observations || learnt.Capacity != asked.Capacity || learnt.HealthyMax != asked.HealthyMax {
		t.Fatalf("the replica asked: %d observations, capacity %v, proven %v; the other: %d, %v, %v; want the same, learned",
			asked.Observations, asked.Capacity, asked.HealthyMax, learnt.Observations, learnt.Capacity, learnt.HealthyMax)
	}
	if st := idle.plans.get(k); st.Observations != 0 {
		t.Fatalf("a replica neither asked nor learning has %d observations", st.Observations)
	}
	if learned != 36 { // llama-so's, every 5 s for 3 minutes; typo-so and reach-so never
		t.Fatalf("%d triggers planned in 36 passes, want llama-so's alone: 36", learned)
	}
	if other.plans.n != 1 {
		t.Fatalf("the learning replica holds %d states, want llama's alone", other.plans.n)
	}
	if evs := other.Evaluations(); len(evs) != 0 {
		t.Fatalf("learning recorded %d evaluations (%+v), want none: KEDA's calls are recorded, not the learner's", len(evs), evs)
	}
}

// TestALearningReplicaKeepsThePlannersWindow: a replica KEDA does not ask
// learns each planner trigger, but only KEDA's calls set the store's
// retention: it kept 10 s of each pod and planned over that (a 10 s
// window's noise held as peaks), and after a failover answered from it.
// Learning a trigger now holds its window, as KEDA's call does.
func TestALearningReplicaKeepsThePlannersWindow(t *testing.T) {
	f, r, standby := standbyFixture(t, nil)
	if got := f.store.Retention(); got != DefaultWindow {
		t.Fatalf("retention %s before any trigger, want %s", got, DefaultWindow)
	}
	standby.Learn(r.PlannerRefs(maxPlans))
	if got := f.store.Retention(); got != DefaultPlanWindow {
		t.Fatalf("retention %s once the planner's trigger was learned, want its window, %s", got, DefaultPlanWindow)
	}
}

// TestALearningReplicaWaitsForTheWarmUp: while the warm-up gate is shut
// (answers would be partial: not every agent heard since the start),
// KEDA's calls are not planned, and a standby replica's learning planned
// all the same, over some nodes' replicas: its state started then and
// held their share of the work. Learning waits as the calls do; the
// trigger's window is held meanwhile (the warm-up fills it).
func TestALearningReplicaWaitsForTheWarmUp(t *testing.T) {
	warming := errors.New("warming up")
	f, r, standby := standbyFixture(t, func() error { return warming })
	f.pods("a")
	f.serve(20, 1000, 0, "a")
	if n := standby.Learn(r.PlannerRefs(maxPlans)); n != 0 || standby.plans.n != 0 {
		t.Fatalf("learned %d triggers (%d states) during the warm-up, want none", n, standby.plans.n)
	}
	if got := f.store.Retention(); got != DefaultPlanWindow {
		t.Fatalf("retention %s during the warm-up, want the trigger's window %s", got, DefaultPlanWindow)
	}
	warming = nil
	if n := standby.Learn(r.PlannerRefs(maxPlans)); n != 1 || standby.plans.n != 1 {
		t.Fatalf("learned %d triggers (%d states) after the warm-up, want 1", n, standby.plans.n)
	}
	// The same trigger many times over (a tenant's ScaledObjects of
	// identical triggers) is one state, planned once a round.
	refs := r.PlannerRefs(maxPlans)
	for range 8 {
		refs = append(refs, refs[0])
	}
	if n := standby.Learn(refs); n != 1 {
		t.Fatalf("9 identical triggers: %d planned in a round, want 1", n)
	}
}

// standbyFixture: a fixture whose resolver watches one ScaledObject with a
// planner trigger, and a second server over its store that learns (with
// gate, when not nil).
func standbyFixture(t *testing.T, gate func() error) (*fixture, *InformerResolver, *Server) {
	t.Helper()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"},
		withTriggers("demo", "llama-so", trigger("external-push", replicasMD())))
	r := NewInformerResolver(client)
	runSynced(t, r)
	f := newFixtureWith(t, r)
	standby := New(f.store, Options{MaxWindow: time.Minute, Resolver: r, Now: f.clock.Now, FollowWindows: true, Gate: gate})
	t.Cleanup(standby.Shutdown)
	return f, r, standby
}

// TestTheScaledObjectCacheHoldsOnlyWhatItReads: the resolver's cache held
// every tenant's ScaledObjects whole (a last-applied annotation, every
// trigger of every scaler): a tenant's few hundred of 1 MB each took the
// aggregator past its memory limit, and PlannerRefs copied every trigger
// of every one every few seconds. It keeps the scale target and the
// planner triggers' known metadata keys, and a planner trigger written
// with metricName is learned as KEDA's call plans it.
func TestTheScaledObjectCacheHoldsOnlyWhatItReads(t *testing.T) {
	big := strings.Repeat("x", 256<<10)
	so := withTriggers("tenant-a", "big-so",
		trigger("prometheus", map[string]string{"query": big}),
		trigger("external-push", replicasMD("scalerAddress", "pulse-aggregator.pulse-system.svc:9090", "note", big[:1000])),
		trigger("external-push", map[string]string{"workspace": "llama", "metricName": "replicas", "threshold": "1"}))
	so.SetAnnotations(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": big})
	many := make([]map[string]any, 20)
	for i := range many {
		many[i] = trigger("external-push", replicasMD())
	}
	// Junk within the metadata's bounds (1 KiB a value) in KEDA's keys and
	// pulse's: the first kept at most pulse's keys, the second left out.
	junk := strings.Repeat("0", 1000)
	many[0] = trigger("external-push", replicasMD("scalerAddress", junk, "caCert", junk, "tlsClientCert", junk))
	many[1] = trigger("external-push", replicasMD("sloTtft", junk))
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"}, so, withTriggers("tenant-b", "many-so", many...))
	r := NewInformerResolver(client)
	runSynced(t, r)
	if kind, name, err := r.Resolve("tenant-a", "big-so"); err != nil || kind != "Workspace" || name != "llama" {
		t.Fatalf("Resolve: %s %s %v", kind, name, err)
	}
	var got []string
	for _, ref := range r.PlannerRefs(maxPlans) {
		tr, err := ParseTrigger(ref, time.Minute, r)
		if err != nil || tr.Metric != MetricReplicas {
			t.Fatalf("%s/%s: %+v, %v; want a planner trigger that parses", ref.Namespace, ref.Name, tr, err)
		}
		got = append(got, ref.Namespace+"/"+ref.Name)
	}
	if slices.Sort(got); len(got) != 2+maxPlannerTriggers || got[1] != "tenant-a/big-so" || got[2] != "tenant-b/many-so" {
		t.Fatalf("planner refs %v: want big-so's two (metric and metricName) and %d of many-so's", got, maxPlannerTriggers)
	}
	held := 0
	for _, obj := range r.informer.GetStore().List() {
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		held += len(b)
		triggers, _, _ := unstructured.NestedSlice(obj.(*unstructured.Unstructured).Object, "spec", "triggers")
		for _, tr := range triggers {
			md, _, _ := unstructured.NestedStringMap(tr.(map[string]any), "metadata")
			for k := range md {
				if !slices.Contains(pulseKeys, k) {
					t.Errorf("the cache keeps %s's metadata key %s: learning reads pulse's alone", obj.(*unstructured.Unstructured).GetName(), k)
				}
			}
		}
	}
	if held > 8<<10 {
		t.Fatalf("the ScaledObject cache holds %d bytes of two ScaledObjects whose targets and planner triggers are a few hundred", held)
	}
}

// TestATriggerWithKeysFromTheEnvironmentIsNotLearned: KEDA resolves a
// <key>FromEnv from the scale target's containers and forwards the value,
// but the ScaledObject holds only the variable's name. The cache kept the
// trigger without its FromEnv keys, so learning planned it under the
// defaults (an SLO of 2 s where KEDA's calls plan 500 ms): a state KEDA
// never asks for, and nothing kept for a failover. Such a trigger is not
// learned; one with only pulse's plain keys beside it still is, and KEDA's
// own call with the value resolved plans as before.
func TestATriggerWithKeysFromTheEnvironmentIsNotLearned(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ScaledObjects: "ScaledObjectList"},
		withTriggers("tenant-a", "slo-from-env", trigger("external-push", replicasMD("sloTtftFromEnv", "SLO_TTFT"))),
		withTriggers("tenant-a", "metric-from-env", trigger("external-push", map[string]string{"workspace": "llama", "metricFromEnv": "METRIC"})),
		withTriggers("tenant-a", "window-from-env", trigger("external-push", replicasMD("windowFromEnv", "WINDOW"))),
		withTriggers("tenant-a", "plain", trigger("external-push", replicasMD("sloTtft", "500ms"))),
		// A KEDA key from the environment is KEDA's: the trigger is learned.
		withTriggers("tenant-a", "keda-from-env", trigger("external-push", replicasMD("scalerAddressFromEnv", "ADDR"))))
	r := NewInformerResolver(client)
	runSynced(t, r)
	var got []string
	for _, ref := range r.PlannerRefs(maxPlans) {
		got = append(got, ref.Name)
	}
	if slices.Sort(got); !slices.Equal(got, []string{"keda-from-env", "plain"}) {
		t.Fatalf("learned %v; want only the triggers without pulse's keys from the environment", got)
	}
	tr, err := ParseTrigger(ref(replicasMD("sloTtftFromEnv", "500ms")), time.Minute, r)
	if err != nil || tr.SLOTTFT != 500*time.Millisecond {
		t.Fatalf("KEDA's call, the value resolved: %+v, %v", tr, err)
	}
}
