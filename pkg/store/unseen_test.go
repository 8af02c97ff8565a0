package store

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// unseenFixture: a store whose API (Exists) has the pods inAPI names, as
// replicas of ws; node "lost" lists a1, a2 (ready) and a3 (starting), node
// "kept" lists b1, and node lost's agent is lost past Expiry (not swept).
type unseenFixture struct {
	s     *Store
	now   time.Time
	inAPI map[string]bool
}

func newUnseenFixture(t *testing.T) *unseenFixture {
	t.Helper()
	f := &unseenFixture{now: time.Unix(1000, 0), inAPI: map[string]bool{"a1": true, "a2": true, "a3": true}}
	f.s = New(Options{Expiry: time.Minute, Now: func() time.Time { return f.now },
		Exists: func(ns, name, uid string, k Key) bool {
			return ns == "ns" && name == "pod-"+uid && f.inAPI[uid] && k == ws
		}})
	mustOpen(t, f.s, "lost")
	mustOpen(t, f.s, "kept")
	f.s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", true), unseenInfo("a2", true), unseenInfo("a3", false)}, true)
	f.s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	f.s.CloseSource("lost", 1)
	f.now = f.now.Add(2 * time.Minute)
	return f
}

func unseenInfo(uid string, ready bool) PodInfo {
	return PodInfo{UID: uid, Namespace: "ns", Name: "pod-" + uid, Ready: ready, Workloads: []Key{ws}}
}

// TestAReplicaWhoseAgentIsLostIsPlannedWhileTheAPIHasIt: when a node's
// agent is lost past Expiry while its replicas serve on, the snapshot
// had only the other nodes' replicas, so the planner (which sees only
// their share of the work) planned the workload down (an audit measured
// 5 → 3). A replica dropped so, that the API still has, is now in the
// snapshot and a threshold trigger's query as a ready replica with no
// sample (Unseen; starting, if it was): before the sweep drops it and
// after; not once the API no longer has it; and with no replica listed,
// the loss is an error as before (Lost).
func TestAReplicaWhoseAgentIsLostIsPlannedWhileTheAPIHasIt(t *testing.T) {
	f := newUnseenFixture(t)
	s := f.s
	f.inAPI["a2"] = false // deleted (or being deleted, or finished) since
	want := "pod-b1 missing, pod-a1 missing unseen, pod-a3 starting unseen"
	if got := loads(s); got != want {
		t.Fatalf("expired, not swept: %s; want %s", got, want)
	}
	s.Sweep()
	if got := loads(s); got != want || len(s.unseenKeys) != 2 {
		t.Fatalf("swept: %s (index %v); want %s, a2 forgotten", got, s.unseenKeys, want)
	}
	pods, found := s.Query(nil, ws, metric.Def{Rule: metric.RuleGauge, Num: metric.Running}, time.Minute, 5*time.Second)
	if !found || len(pods) != 3 || pods[1].Name != "pod-a1" || pods[1].State != PodMissing || pods[1].Reason != UnseenReason || pods[2].State != PodStarting {
		t.Fatalf("query: %+v, %v; want b1, a1 missing (unseen), a3 starting", pods, found)
	}
	s.Upsert(Source{Node: "kept"}, nil, true)
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); snap.Found || !snap.LostOK {
		t.Fatalf("no replica listed: found %v, lost %v; want the loss", snap.Found, snap.LostOK)
	}
}

// TestAnUnseenReplicaBackNotReadyIsUnready: a replica ready when its
// agent was lost, listed again not ready when the agent is back (crash
// looping meanwhile), was a new pod to the store: a replica starting
// since its creation, capacity joining at once. It is ready before and
// not now.
func TestAnUnseenReplicaBackNotReadyIsUnready(t *testing.T) {
	f := newUnseenFixture(t)
	s := f.s
	s.Sweep()
	mustOpen(t, s, "lost")
	s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", false)}, false)
	l, ok := podLoad(s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0), "pod-a1")
	if !ok || l.State != PodStarting || !l.Unready || l.Unseen {
		t.Fatalf("a1 back, not ready: %+v (listed %v); want starting, Unready, seen", l, ok)
	}
}

// podLoad is the pod named name of a snapshot, and whether it has one.
func podLoad(sn Snapshot, name string) (PodLoad, bool) {
	for _, l := range sn.Pods {
		if l.Name == name {
			return l, true
		}
	}
	return PodLoad{}, false
}

// TestAnUnseenReplicaIsForgotten: when its agent lists it again (once, not
// twice; under whichever workload it names now), when its agent lists its
// node in full without it, when the API no longer has it, and a day after
// it was lost.
func TestAnUnseenReplicaIsForgotten(t *testing.T) {
	f := newUnseenFixture(t)
	s := f.s
	s.Sweep()
	back := mustOpen(t, s, "lost")
	s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", true)}, false)
	if got, want := loads(s), "pod-a1 missing, pod-b1 missing, pod-a2 missing unseen, pod-a3 starting unseen"; got != want {
		t.Fatalf("a1 listed again: %s; want %s", got, want)
	}
	s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", true), unseenInfo("a2", true)}, true)
	if got, want := loads(s), "pod-a1 missing, pod-a2 missing, pod-b1 missing"; got != want || len(s.unseenKeys) != 0 {
		t.Fatalf("node lost listed in full without a3: %s (index %v); want %s", got, s.unseenKeys, want)
	}
	// Lost again: gone from the API, it is forgotten at the sweep.
	s.CloseSource("lost", back)
	f.now = f.now.Add(2 * time.Minute)
	s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	f.inAPI["a1"] = false
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-a2 missing unseen"; got != want || len(s.unseenKeys) != 1 {
		t.Fatalf("a1 gone from the API: %s (index %v); want %s", got, s.unseenKeys, want)
	}
	// A day later.
	f.now = f.now.Add(lostFor + time.Minute)
	s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing"; got != want || len(s.unseen) != 0 || len(s.unseenKeys) != 0 {
		t.Fatalf("a day later: %s (unseen %v, index %v); want %s", got, s.unseen, s.unseenKeys, want)
	}
	checkUnseenOn(t, s)
	// Listed again under another workload (relabelled meanwhile):
	// forgotten under the workload it was lost from too.
	f2 := newUnseenFixture(t)
	f2.s.Sweep()
	mustOpen(t, f2.s, "lost")
	relabelled := unseenInfo("a1", true)
	relabelled.Workloads = []Key{{Namespace: "ns", Kind: ws.Kind, Name: "other"}}
	f2.s.Upsert(Source{Node: "lost"}, []PodInfo{relabelled}, false)
	if got, want := loads(f2.s), "pod-b1 missing, pod-a2 missing unseen, pod-a3 starting unseen"; got != want || len(f2.s.unseenKeys) != 2 {
		t.Fatalf("a1 listed again under another workload: %s (index %v); want %s", got, f2.s.unseenKeys, want)
	}
	checkUnseenOn(t, f2.s)
}

// TestNoAPINoUnseen: with no API to ask (Exists nil, --agent-auth=none), a
// replica gone with its agent is gone, and nothing is kept of it.
func TestNoAPINoUnseen(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	mustOpen(t, s, "lost")
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", true)}, true)
	s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	s.CloseSource("lost", 1)
	now = now.Add(2 * time.Minute)
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing"; got != want || len(s.unseen) != 0 || len(s.unseenKeys) != 0 {
		t.Fatalf("without Exists: %s (unseen %v); want %s, nothing kept", got, s.unseen, want)
	}
}

// TestUnseenReplicasAreBoundedPerWorkload: a workload whose agents are
// lost one after another remembers at most maxUnseen of its replicas, the
// newest.
func TestUnseenReplicasAreBoundedPerWorkload(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, MaxPods: 2 * maxUnseen, Now: func() time.Time { return now },
		Exists: func(string, string, string, Key) bool { return true }})
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "kept"}, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Ready: true, Workloads: []Key{ws}}}, true)
	for i := range maxUnseen + 10 {
		node := fmt.Sprintf("n%d", i)
		mustOpen(t, s, node)
		s.Upsert(Source{Node: node}, []PodInfo{{UID: node, Namespace: "ns", Name: node, Ready: true, Workloads: []Key{ws}}}, true)
		s.CloseSource(node, 1)
		now = now.Add(2 * time.Minute)
		s.Sweep()
	}
	snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0)
	if n := len(snap.Pods); n != maxUnseen+1 {
		t.Fatalf("%d replicas: want %d unseen and b", n, maxUnseen)
	}
	if first := snap.Pods[1].Name; first != "n10" {
		t.Fatalf("oldest unseen kept %s: want n10 (the first 10 forgotten)", first)
	}
	if n := len(s.unseenKeys); n != maxUnseen {
		t.Fatalf("the index holds %d uids, want the %d remembered", n, maxUnseen)
	}
	checkUnseenOn(t, s)
}

// checkUnseenOn fails t unless the count of unseen entries by node
// (unseenOn, which spares a full catalogue a walk) is the lists' own.
func checkUnseenOn(t *testing.T, s *Store) {
	t.Helper()
	want := map[string]int{}
	for _, list := range s.unseen {
		for _, u := range list {
			want[u.node]++
		}
	}
	if !maps.Equal(want, s.unseenOn) {
		t.Fatalf("unseen entries by node %v; the lists hold %v", s.unseenOn, want)
	}
}

// loads describes the workload's snapshot: each pod's name, state and
// whether it is unseen.
func loads(s *Store) string {
	snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0)
	out := ""
	for i, l := range snap.Pods {
		if i > 0 {
			out += ", "
		}
		out += l.Name + " " + map[PodState]string{PodCounted: "counted", PodMissing: "missing", PodStarting: "starting", PodTerminating: "terminating"}[l.State]
		if l.Unseen {
			out += " unseen"
		}
	}
	return out
}

// TestTheAPIsReplicasNoAgentReportsAreUnseen: an aggregator started while
// a node's agent was lost never hears of that node's replicas, and
// planned the workload from the others' share as if they were gone. The
// API's replicas (Options.Replicas) on a node no agent streams from are
// unseen replicas, ready or starting as the API has them now; not those of a
// node whose agent streams, nor those its agent lists; forgotten when the
// node's agent lists it in full without them or the API no longer has
// them.
func TestTheAPIsReplicasNoAgentReportsAreUnseen(t *testing.T) {
	now := time.Unix(1000, 0)
	api := map[string]APIPod{
		"b1": {Namespace: "ns", Name: "pod-b1", UID: "b1", Node: "kept", Ready: true},
		"b2": {Namespace: "ns", Name: "pod-b2", UID: "b2", Node: "kept", Ready: true}, // its agent does not list it
		"c1": {Namespace: "ns", Name: "pod-c1", UID: "c1", Node: "quiet", Ready: true},
		"c2": {Namespace: "ns", Name: "pod-c2", UID: "c2", Node: "quiet", CreatedMs: now.Add(-time.Minute).UnixMilli()},
	}
	exists := func(ns, name, uid string, k Key) bool {
		p, ok := api[uid]
		return ok && k == ws && p.Namespace == ns && p.Name == name
	}
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }, Exists: exists,
		Replicas: func(k Key, on func(string) bool) ([]APIPod, bool) {
			var out []APIPod
			for _, uid := range []string{"b1", "b2", "c1", "c2"} {
				if p, ok := api[uid]; ok && k == ws && on(p.Node) {
					out = append(out, p)
				}
			}
			return out, true
		}})
	s.Sweep()
	if len(s.unseen) != 0 {
		t.Fatalf("no workload listed yet: unseen %v; want none", s.unseen)
	}
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-c1 missing unseen, pod-c2 starting unseen"; got != want {
		t.Fatalf("node quiet unheard: %s; want %s", got, want)
	}
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); snap.Pods[2].Age != time.Minute {
		t.Fatalf("c2 starting for %v; want its age from its creation, 1m", snap.Pods[2].Age)
	}
	c2 := api["c2"]
	c2.Ready = true
	api["c2"] = c2
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-c1 missing unseen, pod-c2 missing unseen"; got != want {
		t.Fatalf("c2 ready in the API: %s; want %s", got, want)
	}
	c1 := api["c1"]
	c1.Ready = false // crash-looping, or its node unreachable
	api["c1"] = c1
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-c1 starting unseen, pod-c2 missing unseen"; got != want {
		t.Fatalf("c1 not ready in the API: %s; want %s", got, want)
	}
	// Ready before and not now: no replica starting (the planner holds it
	// as a ready one without a sample, then stuck), and since when.
	now = now.Add(5 * time.Minute)
	s.Sweep()
	if l := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0).Pods[1]; l.Name != "pod-c1" || !l.Unready || l.UnreadyFor != 5*time.Minute {
		t.Fatalf("c1, ready and then not while unseen: %+v; want Unready for 5m0s", l)
	}
	if l := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0).Pods[2]; l.Unready {
		t.Fatalf("c2, ready: %+v; want no loss", l)
	}
	delete(api, "c1")
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-c2 missing unseen"; got != want {
		t.Fatalf("c1 gone from the API: %s; want %s", got, want)
	}
	checkUnseenOn(t, s)
	mustOpen(t, s, "quiet")
	s.Upsert(Source{Node: "quiet"}, nil, true)
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing"; got != want || len(s.unseen) != 0 || len(s.unseenKeys) != 0 {
		t.Fatalf("node quiet's agent listed its node in full: %s (unseen %v); want %s", got, s.unseen, want)
	}
	checkUnseenOn(t, s)
}

// TestAWorkloadServingOnlyUnseenIsLostNotIdle: a workload whose replicas
// all run on a node whose agent is lost, fronted by a router on another
// node, was read as its router's demand alone (scale from zero: 1, or 0),
// the adopted replicas unread; it is lost (an error, the HPA holds), as
// when its replicas are dropped with their agent.
func TestAWorkloadServingOnlyUnseenIsLostNotIdle(t *testing.T) {
	now := time.Unix(1000, 0)
	api := []APIPod{{Namespace: "ns", Name: "pod-c1", UID: "c1", Node: "quiet", Ready: true},
		{Namespace: "ns", Name: "pod-c2", UID: "c2", Node: "quiet", Ready: true}}
	inAPI := true
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now },
		Exists: func(_, _, _ string, k Key) bool { return k == ws && inAPI },
		Replicas: func(k Key, on func(string) bool) ([]APIPod, bool) {
			if k == ws && on("quiet") {
				return api, true
			}
			return nil, true
		}})
	mustOpen(t, s, "router-node")
	s.Upsert(Source{Node: "router-node"}, []PodInfo{{UID: DemandUID("r1", "llama"), Namespace: "ns", Name: "router", Demand: true, Workloads: []Key{ws}}}, true)
	s.Sweep()
	snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0)
	if snap.Found || !snap.LostOK || snap.Lost.Pods != 2 {
		t.Fatalf("2 replicas serving unseen: found %v, lost %v %+v; want lost, 2", snap.Found, snap.LostOK, snap.Lost)
	}
	inAPI, api = false, nil // evicted
	s.Sweep()
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); snap.LostOK {
		t.Fatalf("none left: lost %+v; want the router's demand alone", snap.Lost)
	}
}

// TestAReplicaDroppedWhileTheAPIIsAskedIsKept: the API is asked with the
// store's lock not held; a replica dropped with its agent meanwhile (an
// Upsert's own sweep) was not asked about, and the answer does not make it
// forgotten.
func TestAReplicaDroppedWhileTheAPIIsAskedIsKept(t *testing.T) {
	now := time.Unix(1000, 0)
	var s *Store
	asked := false
	s = New(Options{Expiry: time.Minute, Now: func() time.Time { return now },
		Exists: func(_, _, _ string, k Key) bool { return k == ws },
		Replicas: func(Key, func(string) bool) ([]APIPod, bool) {
			if !asked {
				asked = true
				now = now.Add(2 * time.Minute) // node lost's streams expire: the Upsert's sweep drops a1
				s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
			}
			return nil, true
		}})
	mustOpen(t, s, "lost")
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "lost"}, []PodInfo{unseenInfo("a1", true)}, true)
	s.Upsert(Source{Node: "kept"}, []PodInfo{unseenInfo("b1", true)}, true)
	s.CloseSource("lost", 1)
	s.Sweep()
	if got, want := loads(s), "pod-b1 missing, pod-a1 missing unseen"; !asked || got != want {
		t.Fatalf("a1 dropped while the API was asked: %s; want %s", got, want)
	}
	checkUnseenOn(t, s)
}
