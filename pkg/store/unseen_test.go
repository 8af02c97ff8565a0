package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// TestAReplicaWhoseAgentIsLostIsPlannedWhileTheAPIHasIt: when a node's
// agent is lost past Expiry while its replicas serve on, the snapshot
// had only the other nodes' replicas, so the planner (which sees only
// their share of the work) planned the workload down (an audit measured
// 5 → 3). A replica dropped so, that the API still has, is now in the
// snapshot as a ready replica with no sample (Unseen): before the sweep
// drops it and after; not once the API no longer has it, nor with no API
// to ask (Exists nil); once, not twice, when its agent lists it again;
// and not past lostFor.
func TestAReplicaWhoseAgentIsLostIsPlannedWhileTheAPIHasIt(t *testing.T) {
	now := time.Unix(1000, 0)
	inAPI := map[string]bool{"a1": true, "a2": true, "a3": true}
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now },
		Exists: func(ns, name, uid string) bool { return ns == "ns" && name == "pod-"+uid && inAPI[uid] }})
	info := func(uid string, ready bool) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: "pod-" + uid, Ready: ready, Workloads: []Key{ws}}
	}
	mustOpen(t, s, "lost")
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "lost"}, []PodInfo{info("a1", true), info("a2", true), info("a3", false)}, true)
	s.Upsert(Source{Node: "kept"}, []PodInfo{info("b1", true)}, true)
	s.CloseSource("lost", 1)
	now = now.Add(2 * time.Minute)
	inAPI["a2"] = false // deleted (or being deleted) since
	want := "pod-b1 missing, pod-a1 missing unseen, pod-a3 starting unseen"
	if got := loads(s); got != want {
		t.Fatalf("expired, not swept: %s; want %s", got, want)
	}
	s.Sweep()
	if got := loads(s); got != want {
		t.Fatalf("swept: %s; want %s", got, want)
	}
	// A threshold trigger's query lists them too, as the snapshot does.
	pods, found := s.Query(nil, ws, metric.Def{Rule: metric.RuleGauge, Num: metric.Running}, time.Minute, 5*time.Second)
	if !found || len(pods) != 3 || pods[1].Name != "pod-a1" || pods[1].State != PodMissing || pods[1].Reason != UnseenReason || pods[2].State != PodStarting {
		t.Fatalf("query: %+v, %v; want b1, a1 missing (unseen), a3 starting", pods, found)
	}
	// With no replica listed, the loss is an error (Lost), as before.
	s.Upsert(Source{Node: "kept"}, nil, true)
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); snap.Found || !snap.LostOK {
		t.Fatalf("no replica listed: found %v, lost %v; want the loss", snap.Found, snap.LostOK)
	}
	s.Upsert(Source{Node: "kept"}, []PodInfo{info("b1", true)}, true)
	// Its agent back, a1 is listed again: once.
	back := mustOpen(t, s, "lost")
	s.Upsert(Source{Node: "lost"}, []PodInfo{info("a1", true)}, true)
	if got, want := loads(s), "pod-a1 missing, pod-b1 missing, pod-a3 starting unseen"; got != want {
		t.Fatalf("a1 listed again: %s; want %s", got, want)
	}
	inAPI["a3"] = false
	if got, want := loads(s), "pod-a1 missing, pod-b1 missing"; got != want {
		t.Fatalf("a3 gone from the API: %s; want %s", got, want)
	}
	inAPI["a3"] = true
	now = now.Add(lostFor + time.Minute)
	s.Upsert(Source{Node: "kept"}, []PodInfo{info("b1", true)}, true)
	s.Upsert(Source{Node: "lost"}, []PodInfo{info("a1", true)}, true)
	if got, want := loads(s), "pod-a1 missing, pod-b1 missing"; got != want {
		t.Fatalf("a day later: %s; want %s", got, want)
	}
	if len(s.unseen) != 0 || len(s.unseenKeys) != 0 {
		t.Fatalf("unseen %v (index %v) a day later: want forgotten", s.unseen, s.unseenKeys)
	}
	// Lost again, then listed again under another workload (relabelled
	// meanwhile): forgotten under the workload it was lost from too.
	s.CloseSource("lost", back)
	now = now.Add(2 * time.Minute)
	s.Upsert(Source{Node: "kept"}, []PodInfo{info("b1", true)}, true)
	if got, want := loads(s), "pod-b1 missing, pod-a1 missing unseen"; got != want {
		t.Fatalf("a1 lost again: %s; want %s", got, want)
	}
	mustOpen(t, s, "lost")
	relabelled := info("a1", true)
	relabelled.Workloads = []Key{{Namespace: "ns", Kind: ws.Kind, Name: "other"}}
	s.Upsert(Source{Node: "lost"}, []PodInfo{relabelled}, true)
	if got, want := loads(s), "pod-b1 missing"; got != want || len(s.unseenKeys) != 0 {
		t.Fatalf("a1 listed again under another workload: %s (index %v); want %s", got, s.unseenKeys, want)
	}

	// No API to ask: a replica gone with its agent is gone.
	s2 := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	mustOpen(t, s2, "lost")
	mustOpen(t, s2, "kept")
	s2.Upsert(Source{Node: "lost"}, []PodInfo{info("a1", true)}, true)
	s2.Upsert(Source{Node: "kept"}, []PodInfo{info("b1", true)}, true)
	s2.CloseSource("lost", 1)
	now = now.Add(2 * time.Minute)
	s2.Sweep()
	if got, want := loads(s2), "pod-b1 missing"; got != want {
		t.Fatalf("without Exists: %s; want %s", got, want)
	}
}

// TestUnseenReplicasAreBoundedPerWorkload: a workload whose agents are
// lost one after another remembers at most maxUnseen of its replicas, the
// newest.
func TestUnseenReplicasAreBoundedPerWorkload(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, MaxPods: 2 * maxUnseen, Now: func() time.Time { return now },
		Exists: func(string, string, string) bool { return true }})
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
