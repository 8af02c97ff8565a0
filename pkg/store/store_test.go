package store

import (
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/signal"
)

var (
	ws = Key{Namespace: "ns", Kind: KindWorkspace, Name: "llama"}
	is = Key{Namespace: "ns", Kind: KindInferenceSet, Name: "llama-set"}
)

func report(uid string, ms int64, waiting float64) Report {
	r := Report{UID: uid}
	r.TimeMs = ms
	r.Values.Set(signal.Waiting, waiting)
	return r
}

func TestPodInSeveralWorkloads(t *testing.T) {
	s := New(Options{})
	s.Upsert("node-1", nil, []PodInfo{{UID: "u1", Namespace: "ns", Name: "p1", Ready: true, Workloads: []Key{ws, is}}}, true)
	s.Add([]Report{report("u1", 1000, 3)})
	views := s.View(ViewOptions{FreshFor: time.Minute})
	if len(views) != 2 {
		t.Fatalf("%d workloads, want the Workspace and the InferenceSet", len(views))
	}
	for _, v := range views {
		if v.Averages["waiting"] != 3 {
			t.Errorf("%v: waiting %v", v.Key, v.Averages["waiting"])
		}
	}
}

func TestFullCatalogueReplacesThatNodesPods(t *testing.T) {
	s := New(Options{})
	s.Upsert("node-1", nil, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}, {UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	s.Upsert("node-2", nil, []PodInfo{{UID: "c", Namespace: "ns", Name: "c", Workloads: []Key{ws}}}, true)
	// node-1's agent restarts and lists only a.
	s.Upsert("node-1", nil, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}}, true)
	if n := s.Pods(); n != 2 {
		t.Fatalf("%d pods, want a and c", n)
	}
	if dropped := s.Add([]Report{report("b", 1, 1)}); dropped != 1 {
		t.Fatalf("a sample of a removed pod was kept")
	}
}

func TestRetentionAndChangeNotification(t *testing.T) {
	s := New(Options{Retention: 5 * time.Second, MaxSamples: 100})
	s.Upsert("n", nil, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	changed := s.Changed(ws)
	other := s.Changed(is)
	for i := range 20 {
		s.Add([]Report{report("a", int64(i)*1000, float64(i))})
	}
	select {
	case <-changed:
	default:
		t.Fatal("the workload's watch was not woken")
	}
	select {
	case <-other:
		t.Fatal("another workload's watch was woken")
	default:
	}
	// Expired samples go lazily; what a reader sees is the window.
	if n := len(s.peek("a").series); n > 12 {
		t.Fatalf("%d samples kept, want at most twice the retention's", n)
	}
	if n := len(s.peek("a").window(5*time.Second, signal.RuleRate)); n != 6 {
		t.Fatalf("a 5s rate window holds %d samples, want 5s of them plus the one before", n)
	}
	// Out-of-order samples are dropped, keeping the series in time order.
	s.Add([]Report{report("a", 3000, 99)})
	if got, _ := s.peek("a").series[len(s.peek("a").series)-1].Get(signal.Waiting); got != 19 {
		t.Fatalf("last waiting = %v", got)
	}
}

func TestMissingAndFreshness(t *testing.T) {
	now := time.Unix(100, 0)
	s := New(Options{Now: func() time.Time { return now }})
	s.Upsert("n", nil, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.Add([]Report{report("a", 1000, 2)})
	s.Add([]Report{{UID: "a", Sample: Sample{TimeMs: 2000, Missing: "timeout", Error: "scrape timed out"}}})
	v := s.View(ViewOptions{FreshFor: time.Second})[0]
	if p := v.Pods[0]; p.Fresh || p.Missing != "timeout" || p.Values["waiting"] != 2 {
		t.Fatalf("pod = %+v: want not fresh, missing timeout, last values kept", p)
	}
	if _, ok := v.Averages["waiting"]; ok {
		t.Fatal("a missing pod entered the average")
	}
	pods, _ := s.Query(nil, ws, "waiting", 10*time.Second, time.Second)
	if pods[0].Reporting || pods[0].Defined {
		t.Fatalf("query = %+v: want not reporting", pods[0])
	}
}

func (s *Store) peek(uid string) *pod {
	p, _ := s.pods.Peek(uid)
	return p
}

func TestMaxPodsEvictsTheLeastRecentlyListed(t *testing.T) {
	s := New(Options{MaxPods: 2})
	info := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	s.Upsert("n", nil, []PodInfo{info("a"), info("b")}, false)
	s.Upsert("n", nil, []PodInfo{info("a")}, false) // a is listed again; b is not
	s.Upsert("n", nil, []PodInfo{info("c")}, false)
	if s.Pods() != 2 || s.Evicted() != 1 || s.peek("b") != nil {
		t.Fatalf("pods %d evicted %d b %v: want b evicted", s.Pods(), s.Evicted(), s.peek("b"))
	}
	if v := s.View(ViewOptions{}); len(v[0].Pods) != 2 {
		t.Fatalf("workload still lists %d pods", len(v[0].Pods))
	}
}

func TestPodsOfADisconnectedAgentExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	s.OpenSource("n1")
	s.OpenSource("n2")
	s.Upsert("n1", nil, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}}, true)
	s.Upsert("n2", nil, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	s.OpenSource("n1") // a restarted agent's new stream opens before the old one closes
	s.CloseSource("n1")
	now = now.Add(2 * time.Minute)
	s.Upsert("n2", nil, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	if s.Pods() != 2 {
		t.Fatalf("%d pods: a connected agent's pods expired", s.Pods())
	}
	s.CloseSource("n1")
	now = now.Add(2 * time.Minute)
	s.Upsert("n2", nil, nil, false)
	if s.Pods() != 1 || s.peek("a") != nil {
		t.Fatalf("%d pods: the disconnected agent's pod did not expire", s.Pods())
	}
}
