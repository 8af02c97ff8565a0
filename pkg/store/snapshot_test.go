package store

import (
	"math"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

func TestSnapshotStartupsLoadsAndDemand(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	src := Source{Node: "node-1", Instance: "agent"}
	starting := PodInfo{UID: "u1", Namespace: "ns", Name: "p1", Workloads: []Key{ws}}
	s.Upsert(src, []PodInfo{starting}, false)
	// Listed ready at its first sight: its start was not seen.
	s.Upsert(src, []PodInfo{{UID: "u2", Namespace: "ns", Name: "p2", Ready: true, Workloads: []Key{ws}}}, false)
	now = now.Add(3 * time.Minute)
	starting.Ready = true
	s.Upsert(src, []PodInfo{starting}, false)
	s.Upsert(src, []PodInfo{{UID: DemandUID("router", "llama"), Namespace: "ns", Name: "router", Ready: true, Demand: true, Workloads: []Key{ws}}}, false)
	for i := range 11 {
		now = now.Add(time.Second)
		ms := now.UnixMilli()
		var rs []Report
		for _, uid := range []string{"u1", "u2"} {
			r := Report{UID: uid}
			r.TimeMs = ms
			r.Values.Set(metric.PromptTokens, 1000*float64(i))
			r.Values.Set(metric.GenerationTokens, 50*float64(i))
			r.Values.Set(metric.TTFTCount, float64(i))
			r.Values.Set(metric.TTFTSum, 0.5*float64(i))
			r.Values.Set(metric.QueueTimeCount, float64(i))
			r.Values.Set(metric.QueueTimeSum, 0.2*float64(i))
			r.Values.Set(metric.Waiting, float64(i))
			r.Values.Set(metric.KVCacheUsage, 0.5)
			// p1's TTFTs: each second one within 0.5 s and one within 4 s.
			if uid == "u1" {
				var h metric.Histograms
				h[metric.TTFTHist].Bounds = []float64{0.5, 4, math.Inf(1)}
				h[metric.TTFTHist].Counts = []float64{float64(i), 2 * float64(i), 2 * float64(i)}
				r.Hist = &h
			}
			rs = append(rs, r)
		}
		d := Report{UID: DemandUID("router", "llama")}
		d.TimeMs = ms
		d.Values.Set(metric.PendingRequests, 7)
		rs = append(rs, d)
		s.Add(rs)
	}
	snap := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0)
	if !snap.Found || len(snap.Pods) != 2 || snap.Demand.Held != 7 || snap.LostOK {
		t.Fatalf("snapshot %+v: want two replicas, 7 held at the router", snap)
	}
	p1, p2 := snap.Pods[0], snap.Pods[1]
	if p1.Startup != 3*time.Minute || p1.Age != 3*time.Minute+11*time.Second || p2.Startup != 0 {
		t.Fatalf("startups %s (age %s) and %s: want 3m0s (3m11s) and unseen", p1.Startup, p1.Age, p2.Startup)
	}
	if p1.State != PodCounted || !p1.Tokens || p1.PromptTokens != 1000 || p1.GenerationTokens != 50 || p1.FirstTokens != 1 {
		t.Fatalf("rates %+v", p1)
	}
	if !p1.TTFTOK || p1.TTFT != 0.5 || !p1.QueueOK || p1.QueueTime != 0.2 || p1.KVCache != 0.5 {
		t.Fatalf("latencies %+v", p1)
	}
	if p1.WaitingNow != 10 || p1.WaitingGrowth != 1 {
		t.Fatalf("waiting now %v growth %v, want 10 and 1/s", p1.WaitingNow, p1.WaitingGrowth)
	}
	if p1.TTFTQuantileOK || p2.TTFTQuantileOK {
		t.Fatalf("a TTFT quantile read when none was asked for: %+v %+v", p1, p2)
	}
	// The p90 of p1's TTFTs over the window: half within 0.5 s, half in
	// (0.5, 4]: 0.5 + 3.5 × 0.8 (linear within the bucket, as Prometheus').
	q := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0.9)
	if p1 := q.Pods[0]; !p1.TTFTQuantileOK || math.Abs(p1.TTFTQuantile-3.3) > 1e-9 {
		t.Fatalf("p90 TTFT %v (%v), want 3.3", p1.TTFTQuantile, p1.TTFTQuantileOK)
	}
	if p2 := q.Pods[1]; p2.TTFTQuantileOK {
		t.Fatalf("p2 has no TTFT histogram, yet a p90 of %v", p2.TTFTQuantile)
	}
	now = now.Add(6 * time.Second)
	if snap = s.Snapshot(snap.Pods, ws, 10*time.Second, 5*time.Second, 0); snap.Pods[0].State != PodMissing || snap.Pods[0].Reason != "stale" {
		t.Fatalf("6 s later: %+v, want stale", snap.Pods[0])
	}
	if snap := s.Snapshot(nil, Key{Namespace: "ns", Kind: KindWorkspace, Name: "other"}, time.Second, time.Second, 0); snap.Found {
		t.Fatal("an unknown workload was found")
	}
}

// TestAStartupIsFromItsPodsCreation: a pod listed with its creation and
// its Ready condition's transition (the agent's kube listing) started when
// it was created and was ready when its condition turned, whenever the
// store first saw it: the minutes before an agent lists a pod (scheduling,
// a node provisioned for it) count, and a store started after the pod was
// ready still learns its startup (but for a pod listed ready with no ready
// time: its startup is not the store's clock less its creation). Each time
// is the first listed: a later transition (a readiness flap) is no new
// startup. A creation ahead of the store's clock is an age of 0.
func TestAStartupIsFromItsPodsCreation(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	src := Source{Node: "n"}
	created := now.Add(-3 * time.Minute) // pending for a node until now
	p := PodInfo{UID: "u", Namespace: "ns", Name: "p", Workloads: []Key{ws}, CreatedMs: created.UnixMilli()}
	s.Upsert(src, []PodInfo{p}, false)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.State != PodStarting || l.Age != 3*time.Minute || l.Unready {
		t.Fatalf("starting: %+v, want an age of 3m0s from its creation, never ready", l)
	}
	now = now.Add(2 * time.Minute)
	p.Ready, p.ReadySinceMs = true, now.Add(-10*time.Second).UnixMilli()
	s.Upsert(src, []PodInfo{p}, false)
	now = now.Add(time.Minute)
	p.ReadySinceMs = now.UnixMilli() // flapped: not its startup
	s.Upsert(src, []PodInfo{p}, false)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.Startup != 5*time.Minute-10*time.Second || l.Age != 6*time.Minute {
		t.Fatalf("ready: startup %s, age %s; want 4m50s (created to ready) and 6m0s", l.Startup, l.Age)
	}
	// Its readiness lost (a failed probe): not ready, and ready before.
	lost := p
	lost.Ready = false
	s.Upsert(src, []PodInfo{lost}, false)
	now = now.Add(3 * time.Minute)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.State != PodStarting || !l.Unready || l.UnreadyFor != 3*time.Minute {
		t.Fatalf("ready, then not for 3 minutes: %+v, want starting, Unready for 3m0s", l)
	}
	s.Upsert(src, []PodInfo{lost}, false) // listed again, still not ready: the same loss
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.UnreadyFor != 3*time.Minute {
		t.Fatalf("listed again not ready: unready for %s, want 3m0s (since it was first listed so)", l.UnreadyFor)
	}
	s.Upsert(src, []PodInfo{p}, false)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.Unready || l.UnreadyFor != 0 {
		t.Fatalf("ready again: %+v, want no loss kept", l)
	}
	now = now.Add(-3 * time.Minute) // the clock the rest of the test reads from
	// A store that first sees it ready (an aggregator restarted) learns
	// the same startup; one with no times, none.
	fresh := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	p.ReadySinceMs = now.Add(-time.Minute - 10*time.Second).UnixMilli()
	fresh.Upsert(src, []PodInfo{p, {UID: "v", Namespace: "ns", Name: "q", Ready: true, Workloads: []Key{ws}},
		{UID: "w", Namespace: "ns", Name: "r", Workloads: []Key{ws}, CreatedMs: now.Add(time.Second).UnixMilli()},
		{UID: "x", Namespace: "ns", Name: "s", Ready: true, Workloads: []Key{ws}, CreatedMs: created.UnixMilli()}}, false)
	now = now.Add(time.Second)
	fresh.Upsert(src, []PodInfo{{UID: "x", Namespace: "ns", Name: "s", Ready: true, Workloads: []Key{ws}, CreatedMs: created.UnixMilli()}}, false)
	snap := fresh.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0)
	byName := map[string]PodLoad{}
	for _, l := range snap.Pods {
		byName[l.Name] = l
	}
	if byName["p"].Startup != 5*time.Minute-10*time.Second || byName["q"].Startup != 0 || byName["r"].Age != 0 || byName["s"].Startup != 0 {
		t.Fatalf("after a restart: startups %s and %s, a creation ahead aged %s, ready with no ready time %s; want 4m50s, unknown, 0, unknown",
			byName["p"].Startup, byName["q"].Startup, byName["r"].Age, byName["s"].Startup)
	}
}

// TestAGaugeAbsentIsSaidSo: a gauge absent from a pod's window was read as
// 0 (the planner refused nothing and planned an empty queue); it is said
// so (NoWaiting, NoRunning, NoKV). A running gauge at 0 is no gauge
// absent (the planner judges a replica wedged only on one).
func TestAGaugeAbsentIsSaidSo(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	s.Upsert(Source{Node: "n"}, []PodInfo{{UID: "vllm", Namespace: "ns", Name: "vllm", Ready: true, Workloads: []Key{ws}},
		{UID: "tgi", Namespace: "ns", Name: "tgi", Ready: true, Workloads: []Key{ws}}}, false)
	for i := range 3 {
		now = now.Add(time.Second)
		a, b := Report{UID: "vllm"}, Report{UID: "tgi"} // TGI's page has no KV-cache gauge
		a.TimeMs, b.TimeMs = now.UnixMilli(), now.UnixMilli()
		a.Values.Set(metric.Waiting, float64(i))
		a.Values.Set(metric.KVCacheUsage, 0.5)
		a.Values.Set(metric.Running, 0)
		b.Values.Set(metric.Waiting, float64(i))
		s.Add([]Report{a, b})
	}
	snap := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0)
	if len(snap.Pods) != 2 {
		t.Fatalf("%d pods, want 2", len(snap.Pods))
	}
	tgi, vllm := snap.Pods[0], snap.Pods[1]
	if vllm.NoWaiting || vllm.NoKV || tgi.NoWaiting || !tgi.NoKV || tgi.KVCache != 0 {
		t.Fatalf("gauges absent: vllm %v %v, tgi %v %v (KV %v); want only tgi's KV cache absent", vllm.NoWaiting, vllm.NoKV, tgi.NoWaiting, tgi.NoKV, tgi.KVCache)
	}
	if vllm.NoRunning || vllm.Running != 0 || !tgi.NoRunning {
		t.Fatalf("running at 0: absent %v (%v); no running gauge: absent %v", vllm.NoRunning, vllm.Running, tgi.NoRunning)
	}
}

// TestDemandUnheardOnlyWhenSilentRoutersCouldHoldSomething: the routers'
// demand is unheard while some ready router has not reported and those
// that report hold and saw nothing; anything held or arrived, or no silent
// router, is an answer.
func TestDemandUnheardOnlyWhenSilentRoutersCouldHoldSomething(t *testing.T) {
	for _, c := range []struct {
		d    DemandValue
		want bool
	}{
		{DemandValue{Sources: 1, Stale: 1, Silent: 1}, true},
		{DemandValue{Sources: 0, Stale: 2, Silent: 2}, true},
		{DemandValue{Sources: 1, Stale: 1, Silent: 1, Held: 3}, false},
		{DemandValue{Sources: 1, Stale: 1, Silent: 1, Arrived: 0.5}, false},
		{DemandValue{Sources: 1, Stale: 1, Silent: 1, Arrived: -2}, true}, // not above 0: nothing heard
		{DemandValue{Sources: 1, Stale: 1}, false},                        // a router starting or stopping: listed, not scraped
		{DemandValue{Sources: 2}, false},
	} {
		if got := c.d.Unheard(); got != c.want {
			t.Errorf("%+v: unheard %v, want %v", c.d, got, c.want)
		}
	}
}

// TestAPodListedAsHavingLostItsReadinessIsNoStart: a store that never saw
// a pod ready (an aggregator restarted while a replica failed its probe)
// took it as starting, its age a startup under way: capacity coming, its
// lead time stretched to that age. Listed with when it lost its readiness
// (PodInfo.UnreadySinceMs), it is a replica ready before, unready since
// then; ready again, it is ready, with no startup learned from it.
func TestAPodListedAsHavingLostItsReadinessIsNoStart(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(Options{Retention: time.Minute, Now: func() time.Time { return now }})
	src := Source{Node: "n"}
	p := PodInfo{UID: "u", Namespace: "ns", Name: "p", Workloads: []Key{ws}, CreatedMs: now.Add(-30 * time.Minute).UnixMilli(),
		UnreadySinceMs: now.Add(-2 * time.Minute).UnixMilli()}
	s.Upsert(src, []PodInfo{p}, true)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.State != PodStarting || !l.Unready || l.UnreadyFor != 2*time.Minute || l.Startup != 0 {
		t.Fatalf("first listed not ready, unready for 2 minutes: %+v, want Unready for 2m0s and no startup", l)
	}
	now = now.Add(time.Minute)
	p.Ready, p.UnreadySinceMs, p.ReadySinceMs = true, 0, now.UnixMilli()
	s.Upsert(src, []PodInfo{p}, true)
	if l := s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0).Pods[0]; l.Unready || l.Startup != 0 {
		t.Fatalf("ready again: %+v, want ready and no startup learned (it was ready before, at a time not told)", l)
	}
	// A pod starting says none: it is starting.
	q := PodInfo{UID: "v", Namespace: "ns", Name: "q", Workloads: []Key{ws}, CreatedMs: now.Add(-time.Minute).UnixMilli()}
	s.Upsert(src, []PodInfo{p, q}, true)
	if l, ok := podLoad(s.Snapshot(nil, ws, 10*time.Second, 5*time.Second, 0), "q"); !ok || l.State != PodStarting || l.Unready || l.Age != time.Minute {
		t.Fatalf("a pod starting: %+v (listed %v), want starting, aged 1m0s", l, ok)
	}
}
