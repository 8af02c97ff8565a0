package planner

import (
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
)

// TestARestartLearnsNoReadinessFlapAsAStartup: four replicas that each
// started in 4 minutes; one of them, created 50 minutes ago, flapped
// (its readiness probe timed out under load) 5 minutes ago. Rule 6 says a
// later readiness flap is no new startup, and an aggregator started after
// a pod was ready still learns its startup. The aggregator that watched
// them learns 4 minutes; one restarted now is listed the Ready condition's
// lastTransitionTime (the flap's) as the pod's ready time, and learns a
// 45-minute startup of it.
func TestARestartLearnsNoReadinessFlapAsAStartup(t *testing.T) {
	now := t0
	ws := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	src := store.Source{Node: "n"}
	type podT struct {
		uid     string
		created time.Duration // ago
	}
	pods := []podT{{"u1", 50 * time.Minute}, {"u2", 3 * time.Hour}, {"u3", 2 * time.Hour}, {"u4", 90 * time.Minute}}
	info := func(p podT, readySince time.Time) store.PodInfo {
		return store.PodInfo{UID: p.uid, Namespace: "ns", Name: "pod-" + p.uid, Workloads: []store.Key{ws}, Ready: true,
			CreatedMs: now.Add(-p.created).UnixMilli(), ReadySinceMs: readySince.UnixMilli()}
	}
	cfg := Default(0)
	learn := func(s *store.Store) State {
		// No sample yet (ErrStale): the startups are learned all the same.
		_, st, _ := Make(s.Snapshot(nil, ws, 30*time.Second, 5*time.Second, 0), State{}, cfg)
		return st
	}
	// The aggregator that watched them start: each listed not ready, then
	// ready 4 minutes after its creation; then u1's flap.
	watched := store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
	for _, p := range pods {
		starting := info(p, time.Time{})
		starting.Ready, starting.ReadySinceMs = false, 0
		watched.Upsert(src, []store.PodInfo{starting}, false)
		watched.Upsert(src, []store.PodInfo{info(p, now.Add(-p.created+4*time.Minute))}, false)
	}
	flap := info(pods[0], now.Add(-5*time.Minute))
	watched.Upsert(src, []store.PodInfo{flap}, false)
	// One restarted now: the listing gives the flap's transition.
	restarted := store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
	var list []store.PodInfo
	for _, p := range pods[1:] {
		list = append(list, info(p, now.Add(-p.created+4*time.Minute)))
	}
	restarted.Upsert(src, append([]store.PodInfo{flap}, list...), true)

	w, r := learn(watched), learn(restarted)
	t.Logf("watched: lead %s, hold %s (%d startups); restarted: lead %s, hold %s (%d startups)",
		w.lead(cfg), w.hold(cfg), w.Startups, r.lead(cfg), r.hold(cfg), r.Startups)
	if w.lead(cfg) != 4*time.Minute || w.Startups != 4 {
		t.Fatalf("the aggregator that watched learned %s of %d startups, want 4m0s of 4", w.lead(cfg), w.Startups)
	}
	if r.lead(cfg) != w.lead(cfg) {
		t.Fatalf("after a restart the same four replicas, each started in 4m0s, taught a lead time of %s and a hold of %s (against %s): a readiness flap 45 minutes after a creation was learned as a startup",
			r.lead(cfg), r.hold(cfg), w.hold(cfg))
	}
}
