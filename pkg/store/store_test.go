package store

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

var (
	ws = Key{Namespace: "ns", Kind: KindWorkspace, Name: "llama"}
	is = Key{Namespace: "ns", Kind: KindInferenceSet, Name: "llama-set"}
)

func report(uid string, ms int64, waiting float64) Report {
	r := Report{UID: uid}
	r.TimeMs = ms
	r.Values.Set(metric.Waiting, waiting)
	return r
}

func TestPodInSeveralWorkloads(t *testing.T) {
	s := New(Options{})
	s.Upsert(Source{Node: "node-1"}, []PodInfo{{UID: "u1", Namespace: "ns", Name: "p1", Ready: true, Workloads: []Key{ws, is}}}, true)
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

// A view holds the store's lock one workload at a time: a writer (the
// ingest) goes on between workloads, and so may the reader of Views (a
// write from it would wait for ever on a view that held the lock from one
// workload to the next). Match runs outside the lock too.
func TestAViewLetsWritersInBetweenWorkloads(t *testing.T) {
	s := New(Options{})
	s.Upsert(Source{Node: "node-1"}, []PodInfo{{UID: "u1", Namespace: "ns", Name: "p1", Ready: true, Workloads: []Key{ws, is}}}, true)
	s.Add([]Report{report("u1", 1000, 3)})
	writes := 0
	var got []float64
	for v := range s.Views(ViewOptions{FreshFor: time.Minute, Match: func(Key) bool {
		s.Add([]Report{report("u1", 1000, 3)})
		return true
	}}) {
		got = append(got, v.Averages["waiting"])
		writes++
		s.Add([]Report{report("u1", 1000+int64(writes)*1000, float64(10*writes))})
	}
	// Each shows the value written just before it was viewed (3, then
	// 10): the pod of both workloads is decoded again for the second, not
	// read from the first's decoding.
	if !slices.Equal(got, []float64{3, 10}) {
		t.Errorf("waiting %v in the two views, want 3 and 10: the value written before each was viewed", got)
	}
}

func TestFullCatalogueReplacesThatNodesPods(t *testing.T) {
	s := New(Options{})
	s.Upsert(Source{Node: "node-1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}, {UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	s.Upsert(Source{Node: "node-2"}, []PodInfo{{UID: "c", Namespace: "ns", Name: "c", Workloads: []Key{ws}}}, true)
	// node-1's agent restarts and lists only a.
	s.Upsert(Source{Node: "node-1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}}, true)
	if n := s.Pods(); n != 2 {
		t.Fatalf("%d pods, want a and c", n)
	}
	if dropped := s.Add([]Report{report("b", 1, 1)}); dropped != 1 {
		t.Fatalf("a sample of a removed pod was kept")
	}
}

func TestRetentionAndChangeNotification(t *testing.T) {
	s := New(Options{Retention: 5 * time.Second, MaxSamples: 100})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	changed := map[Key]int{}
	s.OnChange(func(k Key) { changed[k]++ })
	for i := range 20 {
		s.Add([]Report{report("a", int64(i)*1000, float64(i))})
	}
	if changed[ws] != 20 {
		t.Fatalf("the workload was told of %d changes, want one a sample", changed[ws])
	}
	if len(changed) != 1 {
		t.Fatalf("changes told %v: only the pod's workload changed", changed)
	}
	// Expired samples go lazily; what a reader sees is the window.
	if n := s.peek("a").series.len(); n > 5+1+4 {
		t.Fatalf("%d samples kept, want the retention's, the one before and at most 4 more", n)
	}
	if n := len(s.peek("a").window(new(scratch), 5*time.Second, metric.RuleRate, allIDs)); n != 6 {
		t.Fatalf("a 5s rate window holds %d samples, want 5s of them plus the one before", n)
	}
	// Out-of-order samples are dropped, keeping the series in time order
	// (further back than a few seconds, a clock stepped back: see
	// TestAClockSteppedBackStartsTheSeriesAgain).
	s.Add([]Report{report("a", 17500, 99)})
	all := s.peek("a").window(new(scratch), 0, metric.RuleGauge, allIDs)
	if got, _ := all[len(all)-1].Get(metric.Waiting); got != 19 {
		t.Fatalf("last waiting = %v", got)
	}
}

// A pod ages on any clock the store is given, however far from today (a
// simulation's, a test's): its last sample's arrival is counted from the
// store's first reading of its clock. Counted from the process's start,
// a clock 292 years from it saturated the count: every pod's age 0, fresh
// for ever.
func TestAPodAgesOnAClockFarFromToday(t *testing.T) {
	for _, start := range []time.Time{time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(100, 0)} {
		now := start
		s := New(Options{Now: func() time.Time { return now }, Retention: 2 * time.Hour})
		s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
		s.Add([]Report{report("a", 1000, 2)})
		now = now.Add(time.Hour)
		if p := s.View(ViewOptions{FreshFor: time.Minute})[0].Pods[0]; p.Age != time.Hour || p.Fresh {
			t.Errorf("clock at %v: an hour after its sample the pod's age is %v, fresh %v; want an hour, stale", start, p.Age, p.Fresh)
		}
		if snap := s.Snapshot(nil, ws, time.Minute, time.Minute, 0); len(snap.Pods) != 1 || snap.Pods[0].State != PodMissing {
			t.Errorf("clock at %v: an hour after its sample the snapshot reads %+v; want the pod missing (stale)", start, snap.Pods)
		}
	}
}

// TestAPodsRareStateComesAndGoes: what few pods have (a missing report, a
// refused value, forwarded gauges) is kept apart from the pod, and a clean
// sample, or a listing without extra gauges, clears it as before.
func TestAPodsRareStateComesAndGoes(t *testing.T) {
	now := time.Unix(100, 0)
	s := New(Options{Now: func() time.Time { return now }})
	info := []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}
	s.Upsert(Source{Node: "n"}, info, true)
	s.Add([]Report{report("a", 1000, 2)})
	if p := s.peek("a"); p.rare != nil {
		t.Fatalf("a pod with nothing rare holds rare state: %+v", p.rare)
	}
	s.Add([]Report{{UID: "a", Sample: Sample{TimeMs: 2000, Missing: "timeout", Error: "scrape timed out"}}})
	if p := s.View(ViewOptions{FreshFor: time.Hour})[0].Pods[0]; p.Missing != "timeout" || p.Error != "scrape timed out" || p.Fresh {
		t.Fatalf("after a missing report: %+v", p)
	}
	bad := report("a", 3000, 3)
	bad.Rejected = "negative running"
	s.Add([]Report{bad})
	if p := s.View(ViewOptions{FreshFor: time.Hour})[0].Pods[0]; p.Missing != "" || p.Error != "" || p.Rejected != "negative running" || !p.Fresh {
		t.Fatalf("after a sample with a refused value: %+v", p)
	}
	s.Add([]Report{report("a", 4000, 4)})
	if p := s.View(ViewOptions{FreshFor: time.Hour})[0].Pods[0]; p.Rejected != "" {
		t.Fatalf("a clean sample left the refusal shown: %+v", p)
	}
	s.Upsert(Source{Node: "n", ExtraNames: []string{"queue_depth"}}, info, true)
	x := report("a", 5000, 5)
	x.Extra = []float64{7}
	s.Add([]Report{x})
	if got := s.View(ViewOptions{FreshFor: time.Hour})[0].Pods[0].Values["queue_depth"]; got != 7 {
		t.Fatalf("forwarded gauge = %v, want 7", got)
	}
	// An agent rolled out with another --extra-metric list: the values
	// held came by position under the old names, and are never read under
	// a new one (queue_depth's 7 was once read as batch_size's).
	s.Upsert(Source{Node: "n", ExtraNames: []string{"batch_size", "queue_depth"}}, info, true)
	vals := s.View(ViewOptions{FreshFor: time.Hour, Window: time.Minute})[0].Pods[0].Values
	if _, ok := vals["batch_size"]; ok {
		t.Fatalf("after the names changed: %v, want neither gauge until a sample under the new names", vals)
	}
	if _, ok := vals["queue_depth"]; ok {
		t.Fatalf("after the names changed: %v, want neither gauge until a sample under the new names", vals)
	}
	x = report("a", 6000, 6)
	x.Extra = []float64{3, 9}
	s.Add([]Report{x})
	if vals := s.View(ViewOptions{FreshFor: time.Hour, Window: time.Minute})[0].Pods[0].Values; vals["batch_size"] != 3 || vals["queue_depth"] != 9 {
		t.Fatalf("under the new names: %v, want batch_size 3 and queue_depth 9", vals)
	}
	s.Upsert(Source{Node: "n"}, info, true)
	if _, ok := s.View(ViewOptions{FreshFor: time.Hour})[0].Pods[0].Values["queue_depth"]; ok {
		t.Fatal("a listing without extra gauges left the pod's forwarded gauge shown")
	}
}

// TestAnExtraGaugeNamedAsPulsesOwnReplacesNothing: an agent forwarding a
// gauge under the name of a metric of pulse's own (waiting) had its value
// replace pulse's in the pod's row and its workload's average on /debug,
// for every tenant's pod of that node; triggers read pulse's own. The
// gauge is shown nowhere now (and the agent refuses such an
// --extra-metric).
func TestAnExtraGaugeNamedAsPulsesOwnReplacesNothing(t *testing.T) {
	s := New(Options{})
	k := Key{Namespace: "ns", Kind: KindDeployment, Name: "d"}
	s.Upsert(Source{Node: "n1", Instance: "i", ExtraNames: []string{"waiting", "queue_depth"}},
		[]PodInfo{{UID: "u", Namespace: "ns", Name: "p", Ready: true, Workloads: []Key{k}}}, true)
	r := Report{UID: "u"}
	r.TimeMs = time.Now().UnixMilli()
	r.Values.Set(metric.Waiting, 3)
	r.Extra = []float64{99, 7}
	s.Add([]Report{r})
	v := s.View(ViewOptions{FreshFor: time.Minute})
	if got := v[0].Pods[0].Values["waiting"]; got != 3 {
		t.Fatalf("the pod's waiting reads %v, want pulse's own 3", got)
	}
	if got := v[0].Averages["waiting"]; got != 3 {
		t.Fatalf("the workload's waiting reads %v, want pulse's own 3", got)
	}
	if got := v[0].Pods[0].Values["queue_depth"]; got != 7 {
		t.Fatalf("the other forwarded gauge reads %v, want 7", got)
	}
}

func TestMissingAndFreshness(t *testing.T) {
	now := time.Unix(100, 0)
	s := New(Options{Now: func() time.Time { return now }})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.Add([]Report{report("a", 1000, 2)})
	s.Add([]Report{{UID: "a", Sample: Sample{TimeMs: 2000, Missing: "timeout", Error: "scrape timed out"}}})
	v := s.View(ViewOptions{FreshFor: time.Second})[0]
	if p := v.Pods[0]; p.Fresh || p.Missing != "timeout" || p.Values["waiting"] != 2 {
		t.Fatalf("pod = %+v: want not fresh, missing timeout, last values kept", p)
	}
	if _, ok := v.Averages["waiting"]; ok {
		t.Fatal("a missing pod entered the average")
	}
	pods, _ := s.Query(nil, ws, canonical(t, "waiting"), 10*time.Second, time.Second)
	if pods[0].State != PodMissing || pods[0].Reason != "timeout" {
		t.Fatalf("query = %+v: want missing (timeout)", pods[0])
	}
}

func (s *Store) peek(uid string) *pod {
	return s.pods[uid]
}

// TestMaxPodsRefusesNewPodsNeverEvicts: at --max-pods, another tenant's
// new pods (here a router's demand entries on another node) once evicted
// the replicas listed least recently, though their agent was connected and
// reporting; their samples were then dropped until it reconnected. No pod
// held is evicted now: the new one is refused, and held once there is
// room (a pod its agent removes, or one of an agent gone past Expiry).
func TestMaxPodsRefusesNewPodsNeverEvicts(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{MaxPods: 2, Expiry: time.Minute, Now: func() time.Time { return now }})
	other := Key{Namespace: "other", Kind: KindWorkspace, Name: "w"}
	replica := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	demand := PodInfo{UID: DemandUID("router", "w"), Namespace: "other", Name: "router", Demand: true, Workloads: []Key{other}}
	mustOpen(t, s, "n1")
	mustOpen(t, s, "n2")
	s.Upsert(Source{Node: "n1"}, []PodInfo{replica("a"), replica("b")}, true)
	if refused := s.Upsert(Source{Node: "n2"}, []PodInfo{demand}, true); len(refused) != 1 || refused[0] != demand.UID {
		t.Fatalf("refused %v: want the new entry refused", refused)
	}
	if s.Pods() != 2 || s.Refused() != 1 || s.peek("a") == nil || s.peek("b") == nil {
		t.Fatalf("pods %d refused %d: want a and b kept", s.Pods(), s.Refused())
	}
	// An agent briefly gone (a restart, a partition) keeps its pods: the
	// newcomer still waits.
	s.CloseSource("n1", 1)
	if refused := s.Upsert(Source{Node: "n2"}, []PodInfo{demand}, false); len(refused) != 1 || s.Refused() != 2 {
		t.Fatalf("refused %v (%d): want refused again", refused, s.Refused())
	}
	// Its agent removes b: room for the newcomer.
	s.Remove("n1", "b")
	if refused := s.Upsert(Source{Node: "n2"}, []PodInfo{demand}, false); len(refused) != 0 || s.peek(demand.UID) == nil {
		t.Fatalf("refused %v: want the newcomer held", refused)
	}
	if v := s.View(ViewOptions{}); len(v) != 2 {
		t.Fatalf("%d workloads held, want 2", len(v))
	}
}

// TestTwoNamespacesCannotTakeEveryonesRoom: each namespace was held to
// MaxPodsPerNamespace alone, half the room by default, so two namespaces
// (one tenant's, or two), routers naming workloads that need not exist
// being the cheap way, took it all, and every other tenant's new replicas
// waited for as long as those were held. Room freed now goes first to the
// namespaces below a share (MaxPods over one more than the namespaces
// holding pods) that wait for it; no pod held is evicted for them, and no
// room is kept while none waits: two namespaces, or one with a stray pod
// of another beside it, fill the store as their caps let them, and a pod
// that moves namespace takes no new room.
func TestTwoNamespacesCannotTakeEveryonesRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	fill := func(s *Store, ns string, from, n int) (held int) {
		for i := from; i < from+n; i++ {
			uid := fmt.Sprintf("%s-%d", ns, i)
			info := PodInfo{UID: uid, Namespace: ns, Name: uid, Ready: true, Workloads: []Key{{Namespace: ns, Kind: KindWorkspace, Name: "w"}}}
			if len(s.Upsert(Source{Node: "n1"}, []PodInfo{info}, false)) == 0 {
				held++
			}
		}
		return held
	}
	s := New(Options{MaxPods: 100, MaxPodsPerNamespace: 50, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	if a, b, victim := fill(s, "a", 0, 60), fill(s, "b", 0, 60), fill(s, "victim", 0, 5); a != 50 || b != 50 || victim != 0 {
		t.Fatalf("held a %d, b %d, victim %d: want 50, 50 (no room kept while none waits), 0", a, b, victim)
	}
	// a's rollout frees room; its new pods wait while the victim, holding
	// less than a share (100 / 3), waits too; the victim takes it.
	s.Remove("n1", "a-0", "a-1", "a-2")
	if again := fill(s, "a", 100, 3); again != 0 {
		t.Fatalf("a's new pods took %d of the room freed while the victim waited", again)
	}
	if victim := fill(s, "victim", 0, 5); victim != 3 || s.Pods() != 100 {
		t.Fatalf("the victim took %d of the 3 freed (%d held): want 3", victim, s.Pods())
	}
	// Once the victim's pods are all held it waits no more, and room
	// freed is anyone's at once (it was kept for it a minute more, every
	// new pod of a refused meanwhile, its workloads Unavailable: found in
	// a review of the rule, 2026-12-05).
	s.Remove("n1", "a-3", "a-4")
	if rest := fill(s, "victim", 3, 2); rest != 2 {
		t.Fatalf("the victim's last two took %d of the 2 freed: want 2", rest)
	}
	s.Remove("n1", "a-5")
	if a := fill(s, "a", 200, 1); a != 1 {
		t.Fatalf("a's new pod was refused the room freed with no pod waiting")
	}
	// A pod refused under one namespace and held under another (an agent
	// not checked) leaves the first waiting no more (found in a review of
	// the rule, 2026-12-05).
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "moved", Namespace: "victim", Name: "moved", Ready: true}}, false)
	s.Remove("n1", "a-6")
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "moved", Namespace: "late", Name: "moved", Ready: true}}, false)
	s.Remove("n1", "a-7")
	if a := fill(s, "a", 300, 1); a != 1 {
		t.Fatalf("a's new pod was refused the room freed with the pod that waited held under another namespace")
	}
	// A minute after the victim's last refusal, room freed is anyone's.
	now = now.Add(refusedFor + time.Second)
	s.Remove("n1", "b-0")
	if b := fill(s, "b", 100, 1); b != 1 {
		t.Fatalf("b took %d of the room freed with none waiting: want 1", b)
	}
	// One namespace with a stray pod of another beside it fills the store
	// as its cap lets it.
	s = New(Options{MaxPods: 100, MaxPodsPerNamespace: 100, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	if main, demo, more := fill(s, "main", 0, 70), fill(s, "demo", 0, 1), fill(s, "main", 70, 40); main+more != 99 || demo != 1 {
		t.Fatalf("main held %d, demo %d: want 99 and 1", main+more, demo)
	}
	// A pod that moves namespace takes no new room, even in a full store.
	info := PodInfo{UID: "demo-0", Namespace: "main", Name: "demo-0", Ready: true, Workloads: []Key{{Namespace: "main", Kind: KindWorkspace, Name: "w"}}}
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{info}, false); len(refused) != 0 || s.nsPods["main"] != 100 || s.nsPods["demo"] != 0 {
		t.Fatalf("the move refused %v, counts %v: want it held", refused, s.nsPods)
	}
}

// TestOneNamespaceCannotTakeEveryonesRoom: --max-pods was one cap for all
// tenants: one namespace's pods (a router's demand entries on every node)
// could fill it, and another tenant's rolled-out replicas (new uids) were
// refused while the old ones went, so its workload had none held: read as
// the routers' demand alone (0 when they held nothing: scaled to zero) or
// NotFound. A namespace now holds at most MaxPodsPerNamespace, and a
// workload whose new replicas were refused says so (RefusedAt).
func TestOneNamespaceCannotTakeEveryonesRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{MaxPods: 4, MaxPodsPerNamespace: 2, Now: func() time.Time { return now }})
	other := Key{Namespace: "other", Kind: KindWorkspace, Name: "w"}
	pod := func(ns, uid string, k Key) PodInfo {
		return PodInfo{UID: uid, Namespace: ns, Name: uid, Ready: true, Workloads: []Key{k}}
	}
	mustOpen(t, s, "n1")
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("other", "o1", other), pod("other", "o2", other), pod("other", "o3", other)}, true); len(refused) != 1 || refused[0] != "o3" {
		t.Fatalf("refused %v: want the namespace's third pod refused", refused)
	}
	// Room is left for another tenant.
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("ns", "a", ws), pod("ns", "b", ws)}, false); len(refused) != 0 {
		t.Fatalf("refused %v: want ns's pods held", refused)
	}
	// ns rolls out: its new replicas are refused, the old ones removed.
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("ns", "c", ws)}, false); len(refused) != 1 {
		t.Fatalf("refused %v: want the new replica refused", refused)
	}
	s.Remove("n1", "a", "b")
	now = now.Add(30 * time.Second)
	snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0)
	waiting, _ := metric.Lookup("waiting")
	r := s.Read(nil, ws, waiting, time.Minute, 5*time.Second, false)
	if snap.Found || snap.RefusedAt.IsZero() || r.Found || r.RefusedAt.IsZero() {
		t.Fatalf("snapshot found %v refused at %v, read found %v refused at %v: want none found, the refusal said", snap.Found, snap.RefusedAt, r.Found, r.RefusedAt)
	}
	// The pods removed freed its namespace's room: the replica is held.
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("ns", "c", ws)}, false); len(refused) != 0 {
		t.Fatalf("refused %v after the old replicas left, want c held", refused)
	}
	// A uid listed again under another namespace (an agent not checked)
	// takes its count with it: the namespace it left is not full for ever.
	s.Upsert(Source{Node: "n1"}, []PodInfo{pod("third", "c", ws)}, false)
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("ns", "d", ws)}, false); len(refused) != 0 || s.nsPods["ns"] != 1 || s.nsPods["third"] != 1 {
		t.Fatalf("refused %v, counts %v: want ns's room back after c moved", refused, s.nsPods)
	}
	s.Remove("n1", "c", "d")
	if s.nsPods["ns"] != 0 || s.nsPods["third"] != 0 {
		t.Fatalf("counts %v after the removals, want none", s.nsPods)
	}
	// A refusal is remembered a minute, then forgotten.
	now = now.Add(2 * time.Minute)
	s.Sweep()
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); !snap.RefusedAt.IsZero() {
		t.Fatalf("refused at %v two minutes later, want forgotten", snap.RefusedAt)
	}
}

// TestAPodListedByTwoNodesGoesOnce: a pod two agents list stays while one
// of them lists it; when both expire in one sweep it is dropped, and
// counted lost, once. A full catalogue of one node leaves the other's
// pods alone.
func TestAPodListedByTwoNodesGoesOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	a := PodInfo{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}
	for _, n := range []string{"n1", "n2", "n3"} {
		mustOpen(t, s, n)
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{a}, true)
	s.Upsert(Source{Node: "n2"}, []PodInfo{a, {UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	s.Upsert(Source{Node: "n3"}, []PodInfo{{UID: "c", Namespace: "ns", Name: "c", Workloads: []Key{ws}}}, true)
	s.Upsert(Source{Node: "n1"}, nil, true) // n1 lists nothing now: a stays, listed by n2
	if s.Pods() != 3 || s.peek("a") == nil {
		t.Fatalf("%d pods: a, still listed by n2, went with n1's empty catalogue", s.Pods())
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{a}, true)
	s.CloseSource("n1", 1)
	s.CloseSource("n2", 1)
	now = now.Add(2 * time.Minute)
	s.Sweep()
	if s.Pods() != 1 || s.peek("c") == nil {
		t.Fatalf("%d pods after both of a's agents expired: want c alone", s.Pods())
	}
	if l, ok := s.LostReplicas(ws); ok || l.Pods != 0 {
		t.Fatalf("lost %+v %v: c still reports for the workload", l, ok)
	}
	s.Upsert(Source{Node: "n3"}, nil, true)
	if l, ok := s.LostReplicas(ws); !ok || l.Pods != 2 {
		t.Fatalf("lost %+v %v: want a and b, each counted once", l, ok)
	}
}

// TestAPodListedByThreeNodesKeepsEachOnce: a pod holds the node that
// lists it first in place and any others apart (pod.source, moreSources):
// each is kept once however often it lists the pod again, the pod stays
// while any of them lists it, in whatever order they stop, and goes with
// the last.
func TestAPodListedByThreeNodesKeepsEachOnce(t *testing.T) {
	s := New(Options{})
	a := PodInfo{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}
	nodes := func() []string { return slices.Collect(s.peek("a").nodes()) }
	for _, n := range []string{"n1", "n2", "n1", "n3", "n2"} {
		s.Upsert(Source{Node: n}, []PodInfo{a}, false)
	}
	if got := nodes(); !slices.Equal(got, []string{"n1", "n2", "n3"}) {
		t.Fatalf("listed by %v, want n1, n2, n3 once each", got)
	}
	s.Remove("n1", "a") // the first: the next takes its place
	if got := nodes(); s.Pods() != 1 || !slices.Equal(got, []string{"n2", "n3"}) {
		t.Fatalf("%d pods listed by %v after n1's remove, want a listed by n2, n3", s.Pods(), got)
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{a}, false)
	s.Remove("n3", "a")
	if got := nodes(); !slices.Equal(got, []string{"n2", "n1"}) {
		t.Fatalf("listed by %v, want n2, n1", got)
	}
	s.Remove("n2", "a")
	s.Remove("n2", "a") // twice: nothing more
	if got := nodes(); s.Pods() != 1 || !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("%d pods listed by %v, want a listed by n1", s.Pods(), got)
	}
	s.Remove("n1", "a")
	if s.Pods() != 0 {
		t.Fatal("a pod no node lists is kept")
	}
}

// TestAnAgentsPodsShareItsInstance: the pods one agent process lists hold
// one copy of its instance (a string header each took a pod past its size
// class); its next process gets another, and each pod follows it.
func TestAnAgentsPodsShareItsInstance(t *testing.T) {
	s := New(Options{})
	mustOpen(t, s, "n1")
	pods := []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}, {UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}
	s.Upsert(Source{Node: "n1", Instance: "one"}, pods, true)
	a, b := s.peek("a"), s.peek("b")
	if a.instance == nil || a.instance != b.instance || *a.instance != "one" {
		t.Fatalf("instances %p and %p, want one shared \"one\"", a.instance, b.instance)
	}
	s.Upsert(Source{Node: "n1", Instance: "two"}, pods, true)
	if a.instance != b.instance || *a.instance != "two" {
		t.Fatalf("instances %q and %q after the agent's restart, want one shared \"two\"", *a.instance, *b.instance)
	}
	s.Upsert(Source{Node: "n2", Instance: "x"}, pods[:1], false) // no source opened for n2
	if *a.instance != "x" || *b.instance != "two" {
		t.Fatalf("instances %q and %q, want x and two", *a.instance, *b.instance)
	}
}

func TestPodsOfADisconnectedAgentExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	mustOpen(t, s, "n2")
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}}, true)
	s.Upsert(Source{Node: "n2"}, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	mustOpen(t, s, "n1") // a restarted agent's new stream opens before the old one closes
	s.CloseSource("n1", 1)
	now = now.Add(2 * time.Minute)
	s.Upsert(Source{Node: "n2"}, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Workloads: []Key{ws}}}, true)
	if s.Pods() != 2 {
		t.Fatalf("%d pods: a connected agent's pods expired", s.Pods())
	}
	s.CloseSource("n1", 2)
	now = now.Add(2 * time.Minute)
	s.Upsert(Source{Node: "n2"}, nil, false)
	if s.Pods() != 1 || s.peek("a") != nil {
		t.Fatalf("%d pods: the disconnected agent's pod did not expire", s.Pods())
	}
}

// TestDeadNodesPodsGoWithoutCatalogueTraffic: a node that died kept its pods
// counted until some other agent changed its catalogue. Readers now leave
// them out once --pod-expiry has passed, and Sweep drops them.
func TestDeadNodesPodsGoWithoutCatalogueTraffic(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.CloseSource("n1", 1)
	now = now.Add(30 * time.Second)
	if pods, found := s.Query(nil, ws, canonical(t, "waiting"), time.Second, time.Second); !found || pods[0].State != PodMissing {
		t.Fatalf("within --pod-expiry the pod is held as missing: %v %+v", found, pods)
	}
	now = now.Add(5 * time.Minute)
	if pods, found := s.Query(nil, ws, canonical(t, "waiting"), time.Second, time.Second); found {
		t.Fatalf("a dead node's pod is still counted: %+v", pods)
	}
	if v := s.View(ViewOptions{}); len(v) != 0 {
		t.Fatalf("the debug view still shows %+v", v)
	}
	s.Sweep()
	if s.Pods() != 0 {
		t.Fatalf("%d pods after Sweep", s.Pods())
	}
}

// TestChangesOfEveryKind: a pod joining, changing, reporting, missing a
// scrape and leaving each tell of its workloads' change, the old and the new
// one when it moves.
func TestChangesOfEveryKind(t *testing.T) {
	s := New(Options{})
	var told []Key
	s.OnChange(func(k Key) { told = append(told, k) })
	expect := func(what string, want ...Key) {
		t.Helper()
		if !slices.Equal(told, want) {
			t.Fatalf("%s told %v, want %v", what, told, want)
		}
		told = nil
	}
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{ws}}}, false)
	expect("a new pod", ws)
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Workloads: []Key{is}}}, false)
	expect("a pod moved to another workload", ws, is)
	s.Add([]Report{report("a", 1000, 1)})
	expect("a sample", is)
	s.Add([]Report{{UID: "a", Sample: Sample{TimeMs: 2000, Missing: "scrape failed"}}})
	expect("a missed scrape", is)
	s.Add([]Report{report("b", 3000, 1)})
	expect("a sample of a pod not held")
	s.Remove("n", "a")
	expect("a pod removed", is)
}

// TestRemoveByOneAgentKeepsAnotherAgentsPod: one agent's remove deleted the
// pod globally although another agent still listed it.
func TestRemoveByOneAgentKeepsAnotherAgentsPod(t *testing.T) {
	s := New(Options{})
	info := PodInfo{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}
	s.Upsert(Source{Node: "n1"}, []PodInfo{info}, false)
	s.Upsert(Source{Node: "n2"}, []PodInfo{info}, false)
	s.Remove("n1", "a")
	if s.Pods() != 1 {
		t.Fatal("n1's remove deleted a pod n2 still lists")
	}
	s.Upsert(Source{Node: "n1"}, nil, true) // a full catalogue without it: no effect either
	if s.Pods() != 1 {
		t.Fatal("n1's full catalogue deleted a pod n2 still lists")
	}
	s.Remove("n2", "a")
	if s.Pods() != 0 {
		t.Fatal("a pod no agent lists is kept")
	}
}

// TestNewAgentInstanceCountsNoIncreaseAcrossIt: a restarted agent starts its
// per-series reset handling anew, so its cumulative values may be lower; no
// increase (and no reset spike) is counted across the change of instance,
// and no time either: the series starts again at the new instance's first
// sample (the rate once divided the increases by the time across the
// change: 200 tokens over 3 s here, where the pod made 100 a second).
func TestNewAgentInstanceCountsNoIncreaseAcrossIt(t *testing.T) {
	s := New(Options{})
	info := PodInfo{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}
	tokens := func(ms int64, v float64) Report {
		r := Report{UID: "a"}
		r.TimeMs = ms
		r.Values.Set(metric.GenerationTokens, v)
		return r
	}
	s.Upsert(Source{Node: "n1", Instance: "one"}, []PodInfo{info}, true)
	s.Add([]Report{tokens(1000, 5000), tokens(2000, 5100)})
	s.Upsert(Source{Node: "n1", Instance: "two"}, []PodInfo{info}, true)
	// Until the new instance's first sample the pod has none: not fresh
	// with an empty series.
	if pods, _ := s.Query(nil, ws, canonical(t, "generationTokensPerSecond"), 10*time.Second, time.Hour); pods[0].State != PodMissing {
		t.Fatalf("between the new instance's catalogue and its first sample: %+v, want missing (no sample yet)", pods[0])
	}
	s.Add([]Report{tokens(3000, 1200), tokens(4000, 1300)})
	pods, _ := s.Query(nil, ws, canonical(t, "generationTokensPerSecond"), 10*time.Second, time.Hour)
	// 100 tokens/s before, 100/s after, the series from the restart on.
	if got := pods[0].Value; math.Abs(got-100) > 1e-9 {
		t.Fatalf("rate %v, want 100 (no spike, and no time, across the agent restart)", got)
	}
}

func canonical(t *testing.T, name string) metric.Def {
	t.Helper()
	m, ok := metric.Lookup(name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return m
}

// TestAClockSteppedBackStartsTheSeriesAgain: samples at or before a pod's
// last were dropped, so a node whose clock stepped back ten minutes had
// every sample of its pods dropped for ten minutes (each stale, its
// workloads filled or in error), and one sample years ahead silenced its
// pod for good. A step back past a few seconds now starts the pod's
// series again (two samples in a row: one is a second agent's clock
// apart); a sample a moment out of order is still dropped.
func TestAClockSteppedBackStartsTheSeriesAgain(t *testing.T) {
	now := time.Unix(2000, 0)
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	for i := range 10 {
		s.Add([]Report{report("a", 1_000_000+int64(i)*1000, 5)})
	}
	s.Add([]Report{report("a", 1_000_000+8500, 99)}) // a moment out of order
	if n := s.peek("a").series.len(); n != 10 {
		t.Fatalf("%d samples after one out of order, want 10 (it dropped)", n)
	}
	// One sample far behind (a second agent listing the pod, its clock
	// apart) is dropped; the series goes on.
	s.Add([]Report{report("a", 1_000_000-600_000, 7)})
	s.Add([]Report{report("a", 1_000_000+10_000, 5)})
	if n := s.peek("a").series.len(); n != 11 {
		t.Fatalf("%d samples after one far behind, want 11 (it dropped)", n)
	}
	now = now.Add(3 * time.Second)
	s.Add([]Report{report("a", 1_000_000-600_000, 7)}) // ten minutes back, then on from there
	s.Add([]Report{report("a", 1_000_000-599_000, 8)})
	p := s.View(ViewOptions{FreshFor: time.Second})[0].Pods[0]
	if !p.Fresh || p.Values["waiting"] != 8 || s.peek("a").series.len() != 1 {
		t.Fatalf("after the step back: %+v, %d samples; want fresh, waiting 8, the series started again", p, s.peek("a").series.len())
	}
	s.Add([]Report{report("a", 1_000_000-598_000, 9)})
	if n := s.peek("a").series.len(); n != 2 {
		t.Fatalf("%d samples after the step, want 2", n)
	}
}

// TestAClockStepKeepsThePodsHistograms: an agent sends a histogram only
// when it changed, and the store carried the last one forward within a
// series; a clock step back started the series again without it, so an
// idle pod (its histograms unchanged) had none after the step, and its
// workload's quantile triggers answered Unavailable as if no agent
// forwarded them. They are carried over the step now (not over a new
// agent process, whose first sample sends them all).
func TestAClockStepKeepsThePodsHistograms(t *testing.T) {
	s := New(Options{Retention: time.Minute})
	s.Upsert(Source{Node: "n", Instance: "one"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	first := report("a", 1_000_000, 5)
	first.Hist = vllmHist(1)
	s.Add([]Report{first})
	for i := 1; i < 5; i++ {
		s.Add([]Report{report("a", 1_000_000+int64(i)*1000, 5)}) // unchanged: not sent
	}
	s.Add([]Report{report("a", 1_000_000-600_000, 5)}) // ten minutes back, twice: a step
	s.Add([]Report{report("a", 1_000_000-599_000, 5)})
	p := s.peek("a")
	if p.series.len() != 1 || p.series.lastHist() == nil || !p.series.lastHist()[metric.TTFTHist].Present() {
		t.Fatalf("after the step: %d samples, histograms %v; want the series started again with the pod's histograms", p.series.len(), p.series.lastHist())
	}
	// A new agent process: its first sample sends every histogram; the
	// old ones are not carried into its series.
	s.Upsert(Source{Node: "n", Instance: "two"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.Add([]Report{report("a", 1_000_000-598_000, 5)})
	if p := s.peek("a"); p.series.lastHist() != nil {
		t.Fatalf("after a new agent process: histograms %v carried, want none until it sends them", p.series.lastHist())
	}
}

// TestAHostilePageIsBoundedInBytes: a page whose values swing across their
// range and whose histogram bounds change at every sample wrote each
// sample in full, about 2 KB, ten times an honest pod's: one tenant's
// pods could grow the store every tenant shares far past its sizing. One
// pod's series is now held to podBytes a sample kept (its newest).
func TestAHostilePageIsBoundedInBytes(t *testing.T) {
	s := New(Options{Retention: time.Hour, MaxSamples: 600})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	for i := range 600 {
		r := Report{UID: "a"}
		r.TimeMs = int64(i+1) * 1000
		for id := metric.ID(1); id < metric.NumIDs; id++ {
			if id.Kind() != metric.Counter {
				r.Values.Set(id, float64((i%2)*9e12))
			}
		}
		r.Hist = changingBounds(i, float64(i)*1e12)
		s.Add([]Report{r})
	}
	p := s.peek("a")
	if b, limit := p.series.size(), podBytes*600; b > limit+64<<10 {
		t.Fatalf("the pod's series holds %d bytes, want about its bound (%d) at most", b, limit)
	}
	if p.series.len() < 2 || p.series.lastMs() != 600_000 {
		t.Fatalf("%d samples, the last at %d: want the newest kept", p.series.len(), p.series.lastMs())
	}
}

// TestChangingBoundsCountAgainstThePodsBound: a page whose histogram
// bounds change at every sample, with counts of 0 (cheap to encode), had
// a slice of bounds held for each sample kept, none counted against the
// pod's bound: 137 KB a pod where the bound is 48 KiB. The bounds held
// now count.
func TestChangingBoundsCountAgainstThePodsBound(t *testing.T) {
	s := New(Options{Retention: time.Minute, MaxSamples: 128})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	for i := range 400 {
		r := Report{UID: "a"}
		r.TimeMs = int64(i+1) * 250
		r.Values.Set(metric.Waiting, 1)
		r.Hist = changingBounds(i, 0)
		s.Add([]Report{r})
	}
	p := s.peek("a")
	held := p.series.bytes()
	for k := range p.series.hist.cols {
		for _, b := range p.series.hist.cols[k].bounds {
			held += 8*cap(b) + 24
		}
	}
	if limit := podBytes * 128; held > limit {
		t.Fatalf("the pod's series holds %d bytes with its bounds (%d samples), want at most its bound, %d", held, p.series.len(), limit)
	}
	if p.series.len() < 2 || p.series.lastMs() != 100_000 {
		t.Fatalf("%d samples, the last at %d: want the newest kept", p.series.len(), p.series.lastMs())
	}
}

// changingBounds is sample i's histograms with 64 bounds of their own (a
// hostile page's: no two samples' alike), every count the given one.
func changingBounds(i int, count float64) *metric.Histograms {
	var h metric.Histograms
	for k := range h {
		bounds := make([]float64, 64)
		for j := range 63 {
			bounds[j] = float64(i*100 + j + 1)
		}
		bounds[63] = math.Inf(1)
		counts := make([]float64, 64)
		for j := range counts {
			counts[j] = count
		}
		h[k].Bounds, h[k].Counts = bounds, counts
	}
	return &h
}

// TestATerminatingPodGoneWithItsAgentIsNoReplicaLost: a workload scaling
// to zero whose last pod, terminating, went with its agent was held lost
// for a day (every answer Unavailable, its routers' demand unread), so it
// never scaled from zero again. A terminating pod was leaving: it is no
// replica lost, held for its expired agent or dropped.
func TestATerminatingPodGoneWithItsAgentIsNoReplicaLost(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	mustOpen(t, s, "n2")
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Terminating: true, Workloads: []Key{ws}}}, true)
	s.Upsert(Source{Node: "n2"}, []PodInfo{{UID: DemandUID("r", "llama"), Namespace: "ns", Name: "router", Demand: true, Workloads: []Key{ws}}}, true)
	s.CloseSource("n1", 1)
	now = now.Add(2 * time.Minute)
	if l, ok := s.LostReplicas(ws); ok {
		t.Fatalf("held for its expired agent: lost %+v", l)
	}
	s.Sweep()
	now = now.Add(time.Hour)
	if l, ok := s.LostReplicas(ws); ok {
		t.Fatalf("dropped with its agent: lost %+v", l)
	}
	// A ready replica gone the same way is lost.
	mustOpen(t, s, "n3")
	s.Upsert(Source{Node: "n3"}, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Ready: true, Workloads: []Key{ws}}}, true)
	s.CloseSource("n3", 1)
	now = now.Add(2 * time.Minute)
	s.Sweep()
	if l, ok := s.LostReplicas(ws); !ok || l.Pods != 1 {
		t.Fatalf("a ready replica gone with its agent: lost %+v %v, want 1", l, ok)
	}
}

// TestACutIsMarkedOnTheWindowsItShortens: a rate needs the sample at or
// before its window's start, and when MaxSamples dropped only that one
// the rate was answered over a shorter span, unmarked. It is now marked
// (Truncated: the scaler refuses such a window, naming what would hold
// it), and no window the cut leaves whole is.
func TestACutIsMarkedOnTheWindowsItShortens(t *testing.T) {
	s := New(Options{Retention: time.Hour, MaxSamples: 10})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	for i := int64(1); i <= 11; i++ { // 11 samples a second apart: the first is dropped
		r := report("a", i*1000, 1)
		r.Values.Set(metric.GenerationTokens, float64(i*100))
		s.Add([]Report{r})
	}
	for _, c := range []struct {
		metric    string
		window    time.Duration
		truncated bool
	}{
		{"generationTokensPerSecond", 10 * time.Second, true}, // its start, at 1 s, dropped
		{"generationTokensPerSecond", 9500 * time.Millisecond, true},
		{"generationTokensPerSecond", 9 * time.Second, false}, // from 2 s, kept
		{"waiting", 10 * time.Second, false},                  // a gauge: the samples after 1 s
		{"waiting", 10500 * time.Millisecond, true},           // the one at 1 s is within it
	} {
		pods, _ := s.Query(nil, ws, canonical(t, c.metric), c.window, time.Hour)
		if p := pods[0]; p.State != PodCounted || p.Truncated != c.truncated {
			t.Errorf("%s over %v: %v, truncated %v; want counted, truncated %v", c.metric, c.window, p.State, p.Truncated, c.truncated)
		}
	}
}

// TestAStreamsListingEndsWithIt: a node's listing is kept per stream. A
// pod that only its ended streams listed, and that no open stream lists
// again, goes Expiry after the last of them ended, though the node has
// another stream open (a node that reconnected with a delta and stayed
// connected had kept every pod its earlier streams listed); one listed
// again by an open stream stays.
func TestAStreamsListingEndsWithIt(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	replica := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	held := func() []string {
		var out []string
		for _, w := range s.View(ViewOptions{FreshFor: time.Hour}) {
			for _, p := range w.Pods {
				out = append(out, p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	a, err := s.OpenSource("n1")
	if err != nil {
		t.Fatal(err)
	}
	s.Upsert(Source{Node: "n1", Stream: a}, []PodInfo{replica("x"), replica("y"), replica("z")}, true)
	b, err := s.OpenSource("n1")
	if err != nil || b == a {
		t.Fatalf("second stream %d (%v): want one apart from %d", b, err, a)
	}
	s.Upsert(Source{Node: "n1", Stream: b}, []PodInfo{replica("x")}, false) // a delta
	s.CloseSource("n1", a)
	now = now.Add(30 * time.Second)
	s.Upsert(Source{Node: "n1", Stream: b}, []PodInfo{replica("y")}, false) // listed again before the expiry
	if got := held(); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("held %v within the expiry: want x y z", got)
	}
	now = now.Add(31 * time.Second)
	if got := held(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("held %v past the expiry of the stream that alone listed z: want x y", got)
	}
	if l, ok := s.LostReplicas(ws); ok {
		t.Fatalf("lost %+v: x and y still report", l)
	}
	s.Sweep()
	if s.Pods() != 2 || s.peek("z") != nil {
		t.Fatalf("%d pods after the sweep: want z dropped", s.Pods())
	}
	// A restarted agent's new stream lists in full: nothing of the old one
	// is orphaned past it.
	c, _ := s.OpenSource("n1")
	s.CloseSource("n1", b)
	s.Upsert(Source{Node: "n1", Stream: c}, []PodInfo{replica("x"), replica("y")}, true)
	now = now.Add(time.Hour)
	s.Sweep()
	if got := held(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("held %v an hour on: want x y, listed by the open stream", got)
	}
	// A stream closed (its token expired) while it listed lists nothing:
	// what it named is held as its closed streams' are, then goes.
	s.Upsert(Source{Node: "n1", Stream: b}, []PodInfo{replica("w")}, false)
	if c2, _ := s.OpenSource("n1"); c2 != b {
		t.Fatalf("stream %d opened: want %d, free again", c2, b)
	}
	now = now.Add(61 * time.Second)
	if got := held(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("held %v: want w gone, listed only by a stream already closed", got)
	}
}

// TestANodesOpenStreamsAreBounded: a node holds at most 63 streams open in
// a store (each a bit of its listings); the next is refused, and one
// closed makes room.
func TestANodesOpenStreamsAreBounded(t *testing.T) {
	s := New(Options{})
	seen := map[Stream]bool{}
	for i := 0; i < maxStreams; i++ {
		st, err := s.OpenSource("n1")
		if err != nil || st == 0 || seen[st] {
			t.Fatalf("stream %d: %d, %v", i, st, err)
		}
		seen[st] = true
	}
	if _, err := s.OpenSource("n1"); !errors.Is(err, ErrStreams) {
		t.Fatalf("stream past the bound: %v, want ErrStreams", err)
	}
	if _, err := s.OpenSource("n2"); err != nil {
		t.Fatalf("another node: %v", err)
	}
	s.CloseSource("n1", 5)
	if st, err := s.OpenSource("n1"); err != nil || st != 5 {
		t.Fatalf("after one closed: %d, %v; want 5 again", st, err)
	}
}

// mustOpen opens a stream of node.
func mustOpen(t *testing.T, s *Store, node string) Stream {
	t.Helper()
	st, err := s.OpenSource(node)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestAnOlderStreamIsSupersededByANewerFullListing: a node's stream whose
// catalogue waited (a slow pod lookup) while its agent reconnected was
// taken after the new stream's full listing: it put back the pods the new
// one no longer listed, dropped those it did not know, and its agent's
// old instance restarted every pod's series. Once a stream opened later
// has listed the node in full, the older one's listings, removals and
// samples are refused (ErrSuperseded) and change nothing; before that, and
// for the zero Stream, they are taken as ever.
func TestAnOlderStreamIsSupersededByANewerFullListing(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	replica := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	sample := func(uid string, ms int64) []Report {
		r := Report{UID: uid}
		r.TimeMs = ms
		r.Values.Set(metric.Waiting, float64(ms))
		return []Report{r}
	}
	older, newer := mustOpen(t, s, "n1"), mustOpen(t, s, "n1")
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "before", Stream: older}, []PodInfo{replica("a")}, true); err != nil {
		t.Fatalf("the older stream's listing before any newer one's: %v", err)
	}
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "after", Stream: newer}, []PodInfo{replica("b")}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddStream("n1", older, sample("a", 1000)); err != nil {
		t.Fatalf("the older stream's samples, no newer full listing yet: %v", err)
	}
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "after", Stream: newer}, []PodInfo{replica("b")}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddStream("n1", newer, sample("b", 2000)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "before", Stream: older}, []PodInfo{replica("a")}, true); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the older stream's late full listing: %v, want ErrSuperseded", err)
	}
	if err := s.RemoveStream("n1", older, "b"); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the older stream's removal: %v, want ErrSuperseded", err)
	}
	if _, err := s.AddStream("n1", older, sample("b", 3000)); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the older stream's samples: %v, want ErrSuperseded", err)
	}
	if s.peek("a") != nil {
		t.Fatal("a, which the newer full listing left out, is held again")
	}
	b := s.peek("b")
	if b == nil || b.instance == nil || *b.instance != "after" || b.series.len() != 1 || b.series.lastMs() != 2000 {
		t.Fatalf("b: %+v; want held, of instance after, with the newer stream's one sample", b)
	}
	// The newer stream closed, the older stays superseded: the listing held
	// is the newer's, which the older's changes would not continue. A
	// stream opened after both is taken.
	s.CloseSource("n1", newer)
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "before", Stream: older}, []PodInfo{replica("a")}, false); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("after the newer stream closed: %v, want ErrSuperseded still", err)
	}
	third := mustOpen(t, s, "n1")
	if _, err := s.UpsertStream(Source{Node: "n1", Instance: "third", Stream: third}, []PodInfo{replica("c")}, false); err != nil {
		t.Fatalf("a stream opened after the full listing: %v", err)
	}
	if _, err := s.AddStream("n1", 0, sample("b", 4000)); err != nil {
		t.Fatalf("the zero Stream: %v", err)
	}
	if got := s.sources["n1"].opened; len(got) != 2 {
		t.Fatalf("open streams kept: %v, want the two still open", got)
	}
}

// TestHistogramsOfASampleDroppedOutOfOrderAreKept: an agent sends a
// histogram only when it changed, so one in a sample the store dropped as
// out of order (a moment behind, or the first sample after a clock step
// back) was not sent again, and the store carried the pod's older
// histogram on until it changed again. The pod's next sample taken now
// carries it, when the pod's one agent sent it; a pod two agents list
// keeps its older one (a sample behind may be the other's older scrape).
func TestHistogramsOfASampleDroppedOutOfOrderAreKept(t *testing.T) {
	ttft := func(s *Store) float64 {
		t.Helper()
		h := s.peek("a").series.lastHist()
		if h == nil {
			t.Fatal("no histograms")
		}
		return h[metric.TTFTHist].Total()
	}
	withHist := func(ms int64, i int) Report {
		r := report("a", ms, 5)
		r.Hist = vllmHist(i)
		return r
	}
	newStore := func(nodes ...string) *Store {
		s := New(Options{Retention: time.Minute})
		for _, n := range nodes {
			s.Upsert(Source{Node: n, Instance: "one"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
		}
		return s
	}
	add := func(s *Store, node string, r Report) {
		t.Helper()
		if _, err := s.AddStream(node, 0, []Report{r}); err != nil {
			t.Fatal(err)
		}
	}
	want := vllmHist(5)[metric.TTFTHist].Total()
	if want == vllmHist(1)[metric.TTFTHist].Total() {
		t.Fatal("the test's histograms do not differ")
	}

	t.Run("a moment out of order", func(t *testing.T) {
		s := newStore("n")
		add(s, "n", withHist(1_000_000, 1))
		add(s, "n", report("a", 1_001_000, 5))
		add(s, "n", withHist(1_000_500, 5))    // dropped: behind the last
		add(s, "n", report("a", 1_002_000, 5)) // unchanged since: not sent
		if got := ttft(s); got != want {
			t.Fatalf("TTFT observations %v, want %v: the dropped sample's histogram", got, want)
		}
	})
	t.Run("a clock step back", func(t *testing.T) {
		s := newStore("n")
		add(s, "n", withHist(1_000_000, 1))
		add(s, "n", withHist(1_000_000-600_000, 5)) // one far behind: dropped
		add(s, "n", report("a", 1_000_000-599_000, 5))
		if p := s.peek("a"); p.series.len() != 1 {
			t.Fatalf("%d samples: want the series started again", p.series.len())
		}
		// The new series counts no increase across the step: from its
		// first sample's histograms (the dropped sample's, unchanged
		// since), the next change counts what it added to them.
		add(s, "n", withHist(1_000_000-598_000, 9))
		if got, want := ttft(s), vllmHist(9)[metric.TTFTHist].Total()-want; got != want || want == 0 {
			t.Fatalf("TTFT observations since the step %v, want %v: those added after the dropped sample's", got, want)
		}
	})
	t.Run("two agents", func(t *testing.T) {
		s := newStore("n", "m")
		add(s, "n", withHist(1_000_000, 1))
		add(s, "m", withHist(999_500, 5)) // the other agent's, behind: dropped
		add(s, "n", report("a", 1_001_000, 5))
		if got, old := ttft(s), vllmHist(1)[metric.TTFTHist].Total(); got != old {
			t.Fatalf("TTFT observations %v, want %v: a second agent's sample behind is not taken", got, old)
		}
	})
}

// TestAFullListingFreesTheRoomItsNodeNoLongerUses: a node's full listing
// (its agent reconnected after its pods were replaced) was checked for room
// with the node's old pods still counted, unlisted only after: the new
// replicas were refused (a namespace at its cap), the workload answered as
// waiting for room for a minute, and the room freed could go to another
// node's pods first.
func TestAFullListingFreesTheRoomItsNodeNoLongerUses(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{MaxPods: 10, MaxPodsPerNamespace: 2, Expiry: time.Minute, Now: func() time.Time { return now }})
	pod := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	a := mustOpen(t, s, "n1")
	if _, err := s.UpsertStream(Source{Node: "n1", Stream: a}, []PodInfo{pod("old1"), pod("old2")}, true); err != nil {
		t.Fatal(err)
	}
	b := mustOpen(t, s, "n1")
	s.CloseSource("n1", a)
	refused, err := s.UpsertStream(Source{Node: "n1", Stream: b}, []PodInfo{pod("new1"), pod("new2")}, true)
	snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0)
	if err != nil || len(refused) != 0 || s.Pods() != 2 || !snap.RefusedAt.IsZero() {
		t.Fatalf("refused %v (%v), %d pods held, refused at %v; want the new two held", refused, err, s.Pods(), snap.RefusedAt)
	}
}

// TestAWorkloadNamedTwiceIsOneReplica: a pod naming a workload twice (an
// agent not to be trusted) was, once its agent was lost, as many unseen
// replicas of it (threshold triggers filled each; the planner's floor
// counted each).
func TestAWorkloadNamedTwiceIsOneReplica(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now },
		Exists: func(_, _, _ string, k Key) bool { return k == ws }})
	mustOpen(t, s, "lost")
	mustOpen(t, s, "kept")
	s.Upsert(Source{Node: "lost"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws, ws}}}, true)
	s.Upsert(Source{Node: "kept"}, []PodInfo{{UID: "b", Namespace: "ns", Name: "b", Ready: true, Workloads: []Key{ws}}}, true)
	s.CloseSource("lost", 1)
	now = now.Add(2 * time.Minute)
	s.Sweep()
	if pods, _ := s.Query(nil, ws, metric.Def{Rule: metric.RuleGauge, Num: metric.Running}, time.Minute, 5*time.Second); len(pods) != 2 {
		t.Fatalf("%d pods, want b and a once each", len(pods))
	}
}

// TestAUidMovedToAFullNamespaceIsRefused: a uid listed again under another
// namespace (an agent not checked) moved its count there past the
// namespace's cap.
func TestAUidMovedToAFullNamespaceIsRefused(t *testing.T) {
	s := New(Options{MaxPods: 10, MaxPodsPerNamespace: 1})
	mustOpen(t, s, "n1")
	pod := func(ns, uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: ns, Name: uid, Workloads: []Key{{Namespace: ns, Kind: KindWorkspace, Name: "w"}}}
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{pod("full", "f1"), pod("other", "o1")}, true)
	if refused := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("full", "o1")}, false); len(refused) != 1 {
		t.Errorf("o1 listed again under a full namespace: refused %v", refused)
	}
	if s.nsPods["full"] != 1 || s.nsPods["other"] != 1 {
		t.Fatalf("namespaces hold %v; want 1 each, the cap kept", s.nsPods)
	}
}

// TestARefusalEndsWhenItsPodIsAdmitted: a workload a new pod of which was
// refused for room says so (RefusedAt) for a minute, so that a workload
// with none held then is not taken for one without replicas; once that
// pod was admitted, the refusal still stood for the minute, and every
// trigger and plan of the workload, every replica held, failed
// (Unavailable) meanwhile: a rollout at --max-pods-per-namespace cost a
// minute of no scaling. A refusal is the refused pod's, and ends when it
// is admitted; another pod's still refused stands.
func TestARefusalEndsWhenItsPodIsAdmitted(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{MaxPods: 10, MaxPodsPerNamespace: 1, Now: func() time.Time { return now }})
	pod := func(uid string) PodInfo {
		return PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{ws}}
	}
	mustOpen(t, s, "n1")
	s.Upsert(Source{Node: "n1"}, []PodInfo{pod("old")}, true)
	if r := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("new"), pod("other")}, false); len(r) != 2 {
		t.Fatalf("refused %v, want both", r)
	}
	s.Remove("n1", "old")
	now = now.Add(time.Second)
	if r := s.Upsert(Source{Node: "n1"}, []PodInfo{pod("new")}, false); len(r) != 0 {
		t.Fatalf("refused %v after room freed", r)
	}
	waiting, _ := metric.Lookup("waiting")
	if r := s.Read(nil, ws, waiting, 10*time.Second, time.Hour, false); r.RefusedAt.IsZero() {
		t.Fatal("another pod of the workload still refused: its refusal forgotten")
	}
	// other is gone from its agent's listing, and its refusal from the
	// workload a minute after it.
	now = now.Add(refusedFor + time.Second)
	s.Add([]Report{report("new", now.UnixMilli()-1000, 1), report("new", now.UnixMilli(), 1)})
	if r := s.Read(nil, ws, waiting, 10*time.Second, time.Hour, false); !r.RefusedAt.IsZero() || !r.Found {
		t.Fatalf("found %v, refused at %v", r.Found, r.RefusedAt)
	}
	// A refused pod admitted ends its refusal at once.
	s2 := New(Options{MaxPods: 10, MaxPodsPerNamespace: 1, Now: func() time.Time { return now }})
	mustOpen(t, s2, "n1")
	s2.Upsert(Source{Node: "n1"}, []PodInfo{pod("old")}, true)
	s2.Upsert(Source{Node: "n1"}, []PodInfo{pod("new")}, false)
	s2.Remove("n1", "old")
	s2.Upsert(Source{Node: "n1"}, []PodInfo{pod("new")}, false)
	if r := s2.Read(nil, ws, waiting, 10*time.Second, time.Hour, false); !r.RefusedAt.IsZero() {
		t.Fatalf("every pod held, refused at %v: its triggers answer Unavailable for a minute", r.RefusedAt)
	}
}

// TestAGapLongerThanTheWindowIsReadAtItsShare: a window's rates and counts
// include the sample just before it, and after a gap longer than the window
// (scrapes failing, an agent's stream cut) that sample is the gap's start:
// a router's every request of a 5-minute gap was counted as arrived in a
// 30 s window (demand held for a scale from zero, and a backlog to
// drain), and a replica's Span was 5 minutes, every other replica's 30 s
// window thin beside it to the planner. The arrivals are the window's
// share of the gap's, at its mean rate, and a Span at most the window.
func TestAGapLongerThanTheWindowIsReadAtItsShare(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Retention: 10 * time.Minute, MaxSamples: 1000, Now: func() time.Time { return now }})
	mustOpen(t, s, "n1")
	uid := DemandUID("router", "llama")
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: uid, Namespace: "ns", Name: "router", Ready: true, Demand: true, Workloads: []Key{ws}},
		{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	at := func(ms int64, n float64) []Report {
		d, r := Report{UID: uid}, report("a", ms, 0)
		d.TimeMs = ms
		d.Values.Set(metric.ArrivedRequests, n)
		d.Values.Set(metric.PendingRequests, 0)
		r.Values.Set(metric.GenerationTokens, 100*n)
		return []Report{d, r}
	}
	for i := int64(0); i <= 30; i++ { // a request and 100 tokens a second
		s.Add(at(i*1000, float64(i)))
	}
	now = now.Add(5 * time.Minute)
	s.Add(at(330_000, 330))
	if d := s.Demand(ws, 30*time.Second, 5*time.Second); math.Abs(d.Arrived-30) > 1e-9 {
		t.Fatalf("arrived over a 30 s window after a 5-minute gap at a request a second: %v, want 30", d.Arrived)
	}
	snap := s.Snapshot(nil, ws, 30*time.Second, 5*time.Second, 0)
	if len(snap.Pods) != 1 || snap.Pods[0].Span != 30*time.Second || math.Abs(snap.Pods[0].GenerationTokens-100) > 1e-9 {
		t.Fatalf("the replica after the gap: %+v; want a Span of the window and the gap's 100 tokens a second", snap.Pods)
	}
}

// TestAPodsExtrasFollowItsSeries: a pod's extras kept their peak room after
// its window shrank (the tail holding the dropped samples' values), and
// once its agent forwarded none, a nil was appended at every sample for
// ever. Trimmed, they give their room back as the series' buffer does;
// forwarded no more, none is kept.
func TestAPodsExtrasFollowItsSeries(t *testing.T) {
	s := New(Options{Retention: time.Hour, MaxSamples: 4000})
	src := Source{Node: "n1", ExtraNames: []string{"e"}}
	info := []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}
	s.Upsert(src, info, true)
	ms := int64(0)
	add := func(n int, extra []float64) {
		for range n {
			ms += 1000
			r := report("a", ms, 1)
			r.Extra = extra
			s.Add([]Report{r})
		}
	}
	add(3600, []float64{1})
	s.SetRetention(10 * time.Second)
	add(600, []float64{1})
	p := s.peek("a")
	if n, c := len(p.rare.extras), cap(p.rare.extras); n != p.series.len() || c > 2*n+16 {
		t.Fatalf("extras %d long, room for %d, beside %d samples: want them parallel, their room given back", n, c, p.series.len())
	}
	s.Upsert(Source{Node: "n1"}, info, true) // its agent forwards none now
	add(100, nil)
	if p := s.peek("a"); p.rare != nil && p.rare.extras != nil {
		t.Fatalf("%d extras kept after its agent forwarded none", len(p.rare.extras))
	}
}

// TestAViewsAgeIsNeverNegative: a view reads each workload apart, writers
// running between, so a pod sampled after the view began had a negative
// Age, which reads as never sampled (the debug page showed no age).
func TestAViewsAgeIsNeverNegative(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Options{Now: func() time.Time { return now }})
	s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.Add([]Report{report("a", 1000, 1)})
	views := s.View(ViewOptions{FreshFor: time.Minute, Match: func(Key) bool {
		now = now.Add(2 * time.Second) // a sample arrives before this workload is read
		s.Add([]Report{report("a", 3000, 1)})
		return true
	}})
	if pv := views[0].Pods[0]; pv.Age < 0 || !pv.Fresh {
		t.Fatalf("a pod sampled just now: age %v, fresh %v", pv.Age, pv.Fresh)
	}
}

// TestGoneDropsAPodAndItsRoutersEntries: a pod the API no longer runs is
// unlisted from every node that lists it, and a router's entries (one a
// workload it fronts) go with their router pod; other pods stay.
func TestGoneDropsAPodAndItsRoutersEntries(t *testing.T) {
	s := New(Options{})
	other := Key{Namespace: "ns", Kind: KindWorkspace, Name: "qwen"}
	s.Upsert(Source{Node: "n1"}, []PodInfo{
		{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}},
		{UID: "b", Namespace: "ns", Name: "b", Ready: true, Workloads: []Key{ws}},
		{UID: DemandUID("router", ws.Name), Namespace: "ns", Name: "router", Ready: true, Demand: true, Workloads: []Key{ws}},
		{UID: DemandUID("router", other.Name), Namespace: "ns", Name: "router", Ready: true, Demand: true, Workloads: []Key{other}},
	}, true)
	s.Upsert(Source{Node: "n2"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	s.Gone("n1", "a")
	s.Gone("n1", "router")
	held := map[string]bool{}
	for _, w := range s.View(ViewOptions{FreshFor: time.Hour}) {
		for _, p := range w.Pods {
			held[p.UID] = true
		}
	}
	if len(held) != 1 || !held["b"] {
		t.Fatalf("held %v after a and the router went; want b alone (a listed by two nodes, the router's two entries, all gone)", held)
	}
}

// An entry kept as last listed (ListedOn, as a full catalogue's entry whose
// lookup failed is kept) and upserted in the call whose sweep drops its pod
// (its only listing an orphan past Expiry) re-creates the pod with the
// start it had, its creation, not the store's clock: a startup measured
// from it is the pod's (found in a review, 2026-12-05, after the pod
// stopped holding its listing's times: the pod came back started now, and
// its startup of 11 minutes read as 1 s).
func TestAnEntryKeptAsListedRecreatesThePodWithItsStart(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := New(Options{Expiry: time.Minute, Now: func() time.Time { return now }})
	ws := Key{Kind: "Deployment", Namespace: "ns", Name: "w"}
	created := now.Add(-10 * time.Minute)
	info := PodInfo{UID: "u", Namespace: "ns", Name: "p", Workloads: []Key{ws}, CreatedMs: created.UnixMilli()}
	a, _ := s.OpenSource("n1")
	s.Upsert(Source{Node: "n1", Stream: a}, []PodInfo{info}, true)
	b, _ := s.OpenSource("n1")
	s.CloseSource("n1", a) // u is an orphan now
	now = now.Add(61 * time.Second)
	held, ok := s.ListedOn("n1", "u")
	if !ok || held.CreatedMs != created.UnixMilli() {
		t.Fatalf("ListedOn = %+v, %v: want its creation as CreatedMs", held, ok)
	}
	s.Upsert(Source{Node: "n1", Stream: b}, []PodInfo{held}, true)
	if p := s.peek("u"); p == nil || p.startNs != created.UnixNano() {
		t.Fatalf("re-created pod %+v: want its start at its creation %v", p, created)
	}
	ready := now.Add(time.Second)
	info.Ready, info.ReadySinceMs = true, ready.UnixMilli()
	now = now.Add(2 * time.Second)
	s.Upsert(Source{Node: "n1", Stream: b}, []PodInfo{info}, false)
	if p := s.peek("u"); time.Duration(p.readyNs-p.startNs) != ready.Sub(created) {
		t.Errorf("startup %v, want %v", time.Duration(p.readyNs-p.startNs), ready.Sub(created))
	}
	// Ready, its ready time is handed out too.
	if held, _ := s.ListedOn("n1", "u"); held.ReadySinceMs != ready.UnixMilli() || held.CreatedMs != created.UnixMilli() {
		t.Errorf("ListedOn of the ready pod = %+v: want its creation and ready time", held)
	}
}

// TestAnAbsentGaugeReadsNoOtherPodsValue: a pod running nothing, its
// waiting gauge absent (refused, or not on its page), and no request
// finished, is idle (an absent gauge reads 0). A pod's samples are decoded
// into a pooled buffer that clears only an absent value's present bit, and
// its waiting read the slot as the pod decoded there before had left it:
// a busy pod of its workload's, or another tenant's read just before, and
// it read busy (found in a review, 2026-12-07).
func TestAnAbsentGaugeReadsNoOtherPodsValue(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ttft := canonical(t, "ttftSeconds")
	other := Key{Namespace: "tenant-b", Kind: KindWorkload, Name: "w"}
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	s.Upsert(Source{Node: "n"}, []PodInfo{
		{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}},
		{UID: "b", Namespace: "ns", Name: "b", Ready: true, Workloads: []Key{ws}},
		{UID: "x", Namespace: "tenant-b", Name: "x", Ready: true, Workloads: []Key{other}},
	}, true)
	for i := range 5 {
		ms := now.UnixMilli() - int64(4-i)*1000
		a := Report{UID: "a"} // busy, none finished yet: undefined, not idle
		a.TimeMs = ms
		a.Values.Set(metric.Waiting, 5)
		a.Values.Set(metric.Running, 3)
		a.Values.Set(metric.TTFTSum, 1)
		a.Values.Set(metric.TTFTCount, 2)
		b := Report{UID: "b", Sample: Sample{Rejected: "negative waiting"}}
		b.TimeMs = ms
		b.Values.Set(metric.Running, 0)
		b.Values.Set(metric.TTFTSum, 10)
		b.Values.Set(metric.TTFTCount, 20)
		x := Report{UID: "x"}
		x.TimeMs = ms
		x.Values.Set(metric.Waiting, 7)
		s.Add([]Report{a, b, x})
	}
	for _, before := range []string{"its workload's busy pod", "another tenant's read"} {
		if before == "another tenant's read" {
			s.Snapshot(nil, other, 3*time.Second, time.Minute, 0)
		}
		pods, _ := s.Query(nil, ws, ttft, 3*time.Second, time.Minute)
		var idle, found bool
		for _, p := range pods {
			if p.Name == "b" {
				idle, found = p.Idle, true
			}
		}
		if !found || !idle {
			t.Errorf("b (running 0, waiting absent) after %s: idle %v (listed %v); want idle", before, idle, found)
		}
	}
}

// TestAPodRefusedForRoomAndGoneWaitsNoMore: a pod refused for room is
// counted as waiting for it, for a minute, so that room freed goes to it
// rather than to a namespace at its share. Deleted (Gone), or unlisted by
// its agent, it waited on: room freed was refused to the other
// namespaces' new replicas, though no pod waited for it, and their
// workloads read RefusedAt, every trigger Unavailable (found in a review,
// 2026-12-07).
func TestAPodRefusedForRoomAndGoneWaitsNoMore(t *testing.T) {
	for name, gone := range map[string]func(s *Store){
		"deleted":  func(s *Store) { s.Gone("n1", "v-0") },
		"unlisted": func(s *Store) { s.Remove("n1", "v-0") },
		// A router's entry is its pod's uid and the workload's name: the
		// router pod deleted, its entries wait no more either.
		"a router's entry, its pod deleted": func(s *Store) { s.Gone("n1", "router") },
	} {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			s := New(Options{MaxPods: 10, MaxPodsPerNamespace: 10, Now: func() time.Time { return now }})
			mustOpen(t, s, "n1")
			add := func(ns, uid string) bool {
				k := Key{Namespace: ns, Kind: KindWorkspace, Name: "w"}
				return len(s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: uid, Namespace: ns, Name: uid, Ready: true, Workloads: []Key{k}}}, false)) == 0
			}
			for i := range 8 {
				add("a", fmt.Sprintf("a-%d", i))
			}
			add("b", "b-0")
			add("b", "b-1")
			if add("victim", "v-0") {
				t.Fatal("v-0 admitted into a full store")
			}
			if name == "a router's entry, its pod deleted" {
				// The refusal is a router's demand entry's, not v-0's.
				s.forgetRefusedLocked("v-0", false)
				k := Key{Namespace: "victim", Kind: KindWorkspace, Name: "w"}
				if len(s.Upsert(Source{Node: "n1"}, []PodInfo{{UID: "router" + demandSep + "w", Namespace: "victim", Name: "router", Ready: true, Demand: true, Workloads: []Key{k}}}, false)) == 0 {
					t.Fatal("the router's entry admitted into a full store")
				}
			}
			gone(s)
			now = now.Add(2 * time.Second)
			s.Remove("n1", "a-0") // a replaces a replica (a rollout)
			if !add("a", "a-new") {
				t.Fatal("a's new replica refused with room free and no pod waiting: v-0 waited on")
			}
			wv := Key{Namespace: "victim", Kind: KindWorkspace, Name: "w"}
			if r := s.Read(nil, wv, canonical(t, "waiting"), 10*time.Second, time.Minute, false); !r.RefusedAt.IsZero() {
				t.Errorf("v-0's workload reads refused at %v after v-0 went; want no refusal", r.RefusedAt)
			}
		})
	}
}

// TestATruncatedWindowIsNeverReadIdle: a window reaching back past the
// samples MaxSamples kept is refused when its value is defined (Truncated),
// and Snapshot marks it whatever the value. Query marked it only when the
// value was defined: a ratio whose requests all finished in the part of
// the window that was cut read undefined and Idle (no load), unmarked, so
// the scaler took a workload whose mean TTFT over the window was 2 s as
// one with nothing to do.
func TestATruncatedWindowIsNeverReadIdle(t *testing.T) {
	s := New(Options{Retention: time.Minute, MaxSamples: 10})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "a", Namespace: "ns", Name: "a", Ready: true, Workloads: []Key{ws}}}, true)
	for i := int64(0); i <= 30; i++ {
		r := report("a", i*1000, 0)
		r.Values.Set(metric.Running, 0)
		// Ten requests finished in the first 5 s, 2 s each; none since.
		n := float64(min(i, 5) * 2)
		r.Values.Set(metric.TTFTCount, n)
		r.Values.Set(metric.TTFTSum, 2*n)
		s.Add([]Report{r})
	}
	ttft := metric.Def{Name: "ttft", Rule: metric.RuleRatio, Num: metric.TTFTSum, Den: metric.TTFTCount}
	pods, _ := s.Query(nil, ws, ttft, 30*time.Second, time.Hour)
	if len(pods) != 1 {
		t.Fatalf("pods %+v", pods)
	}
	p := pods[0]
	if p.State == PodUndefined && p.Idle || !p.Truncated {
		t.Fatalf("a 30 s window of which 10 samples are kept reads %+v: want it marked truncated (spanning %d ms), never idle",
			p, 9000)
	}
	if snap := s.Snapshot(nil, ws, 30*time.Second, time.Hour, 0); !snap.Pods[0].Truncated {
		t.Fatalf("Snapshot: %+v", snap.Pods[0])
	}
}
