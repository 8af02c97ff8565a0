package store

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/pulse-io/pulse/pkg/metric"
)

// randomSample is a sample of a random set of values: most at their wire
// resolution, some off it (a counter made monotonic across a reset), NaN,
// infinite, or too large for 53 bits.
func randomSample(rng *rand.Rand, timeMs int64, prev *metric.Sample) metric.Sample {
	s := metric.Sample{TimeMs: timeMs}
	for id := metric.ID(1); id < metric.NumIDs; id++ {
		if rng.IntN(5) == 0 {
			continue // absent
		}
		p := metric.Pow10(id.Scale())
		var x float64
		switch k := rng.IntN(40); {
		case k == 0:
			x = math.NaN()
		case k == 1:
			x = math.Inf(1 - 2*rng.IntN(2))
		case k == 2:
			x = 1e300
		case k == 3:
			x = 1234.5 + 10.3 // off the grid by a rounding error
		case k == 4:
			x = math.Copysign(0, -1) // read back as +0 until 2026-12-04
		case k < 20 && prev != nil && prev.Has(id):
			x = prev.V[id] + float64(rng.IntN(5000))/p // a counter's increase
		default:
			x = float64(rng.Int64N(1<<40)-1<<39) / p
		}
		s.Set(id, x)
	}
	return s
}

func sameSample(a, b metric.Sample) bool {
	if a.TimeMs != b.TimeMs || a.Present != b.Present || !sameHist(a.Hist, b.Hist) {
		return false
	}
	for id := range metric.NumIDs {
		if a.Has(metric.ID(id)) && math.Float64bits(a.V[id]) != math.Float64bits(b.V[id]) {
			return false
		}
	}
	return true
}

// sameHist: the same histograms present, with the same bounds and counts
// bit for bit (nil and none present are the same).
func sameHist(a, b *metric.Histograms) bool {
	for h := range metric.NumHists {
		var x, y metric.Buckets
		if a != nil {
			x = a[h]
		}
		if b != nil {
			y = b[h]
		}
		if x.Present() != y.Present() || !slices.Equal(x.Bounds, y.Bounds) || len(x.Counts) != len(y.Counts) {
			return false
		}
		for i := range x.Counts {
			if math.Float64bits(x.Counts[i]) != math.Float64bits(y.Counts[i]) {
				return false
			}
		}
	}
	return true
}

// randomHist is a pod's histograms at its i-th sample: vLLM's, one of
// them at times absent or with other bounds, counts now and then not
// whole (a merge's float noise).
func randomHist(rng *rand.Rand, i int) *metric.Histograms {
	h := vllmHist(i)
	switch rng.IntN(8) {
	case 0:
		h[metric.ITLHist] = metric.Buckets{}
	case 1:
		h[metric.TTFTHist].Bounds = []float64{0.1, 1, math.Inf(1)}
		h[metric.TTFTHist].Counts = []float64{1, 2, float64(i)}
	case 2:
		h[metric.ITLHist].Counts[3] += 0.5
	case 3:
		h[metric.TTFTHist].Counts[0] = math.Copysign(0, -1)
	}
	return h
}

// Every value reads back bit for bit as it was added, across drops of the
// oldest samples.
func TestSeriesReadsBackExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		var r series
		var want []metric.Sample
		var prev *metric.Sample
		for i := range 200 {
			s := randomSample(rng, int64(1_700_000_000_000+i*1000+rng.IntN(900)), prev)
			switch {
			case i > 20 && rng.IntN(10) == 0 && prev != nil:
				s.Hist = prev.Hist // unchanged
			case i > 10:
				s.Hist = randomHist(rng, i)
			}
			r.add(s)
			want = append(want, s)
			prev = &want[len(want)-1]
			if len(want) > 3 && rng.IntN(15) == 0 {
				k := 1 + rng.IntN(len(want)-1)
				r.drop(k)
				want = want[k:]
			}
			sc := new(scratch)
			got := sc.samples(&pod{series: r}, allIDs)
			if len(got) != len(want) || r.len() != len(want) {
				t.Fatalf("trial %d, sample %d: %d samples read back, want %d", trial, i, len(got), len(want))
			}
			for j := range want {
				if !sameSample(got[j], want[j]) {
					t.Fatalf("trial %d, sample %d: sample %d reads back as %+v, want %+v", trial, i, j, got[j], want[j])
				}
			}
			if w := want[len(want)-1]; r.lastMs() != w.TimeMs || !sameHist(r.lastHist(), w.Hist) {
				t.Fatalf("trial %d: the last sample's time and histograms are %d %p, want %d %p", trial, r.lastMs(), r.lastHist(), w.TimeMs, w.Hist)
			}
		}
	}
}

// A busy vLLM pod's sample of 18 values takes tens of bytes held, where
// the decoded struct takes 208.
func TestSeriesIsCompact(t *testing.T) {
	var r series
	for i := range 61 {
		r.add(vllmSample(i))
	}
	if per := float64(r.bytes()) / float64(r.len()); per > 64 {
		t.Fatalf("%.0f bytes per sample held, want at most 64", per)
	}
}

// A store holds a pod struct and a column header for each metric of each
// pod, tens of thousands of pods: the pod at 432 bytes took the 448-byte
// size class, at 296 the 320-byte one (its sources a slice, its columns'
// headers a slice, its instance a string), and a header at 16 bytes (an
// id beside the last value and the end) took a third more than 12.
func TestPodAndColumnSizes(t *testing.T) {
	if n := unsafe.Sizeof(pod{}); n > 288 {
		t.Errorf("pod is %d bytes, want at most 288 (a size class)", n)
	}
	if n := unsafe.Sizeof(column{}); n > 12 {
		t.Errorf("column is %d bytes, want at most 12", n)
	}
}

// vllmSample is a busy vLLM pod's i-th sample at 1 s, at the wire's
// resolution: counters growing at plausible rates (3,000 prompt and 800
// generated tokens a second, 6 requests with their latency sums), gauges
// that move.
func vllmSample(i int) metric.Sample {
	perSecond := map[metric.ID]float64{
		metric.PrefixHits: 1200, metric.PrefixQueries: 3000, metric.PromptTokens: 3000, metric.GenerationTokens: 800,
		metric.RequestSuccess: 6, metric.Preemptions: 0.1, metric.TTFTSum: 1.7, metric.TTFTCount: 6, metric.QueueTimeSum: 0.4,
		metric.QueueTimeCount: 6, metric.E2ELatencySum: 40, metric.E2ELatencyCount: 6, metric.ITLSum: 24, metric.ITLCount: 800,
	}
	s := metric.Sample{TimeMs: 1_700_000_000_000 + int64(i)*1000 + int64(i%7)}
	for id, r := range perSecond {
		var total float64
		for j := range i {
			total += r * (1 + 0.3*math.Sin(float64(j)*float64(id)))
		}
		s.Set(id, metric.Quantize(id, total))
	}
	s.Set(metric.Waiting, float64(i%9))
	s.Set(metric.Running, float64(40+i%17))
	s.Set(metric.Swapped, 0)
	s.Set(metric.KVCacheUsage, metric.Quantize(metric.KVCacheUsage, 0.3+float64(i%10)/37))
	return s
}

// BenchmarkStoreHeapPerPod measures the store's heap per pod: 16,000 pods
// with a minute of 1 s samples each, without and with the latency
// histograms an agent forwards with --forward-histograms (docs/performance.md).
func BenchmarkStoreHeapPerPod(b *testing.B) {
	for _, retention := range []time.Duration{time.Minute, 10 * time.Second} {
		for _, hist := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/%v", map[bool]string{false: "values", true: "values+histograms"}[hist], retention), func(b *testing.B) {
				for b.Loop() {
					b.ReportMetric(storeHeapPerPod(hist, retention), "heap-bytes/pod")
				}
			})
		}
	}
}

// vllmBounds are vLLM's TTFT and ITL bucket bounds (vllm/v1/metrics/loggers.py).
var vllmBounds = [metric.NumHists][]float64{
	metric.TTFTHist: {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560, math.Inf(1)},
	metric.ITLHist:  {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, math.Inf(1)},
}

// vllmHist is a busy pod's histograms at its i-th second: 6 first tokens
// and 800 generated tokens a second, spread over the middle buckets.
func vllmHist(i int) *metric.Histograms {
	h := new(metric.Histograms)
	for k, per := range [metric.NumHists]float64{metric.TTFTHist: 6, metric.ITLHist: 800} {
		bounds := vllmBounds[k]
		counts := make([]float64, len(bounds))
		var cum float64
		for j := range bounds {
			if j > 3 && j < 12 {
				cum += math.Floor(float64(i) * per / 8 * (1 + 0.2*math.Sin(float64(i*j))))
			}
			counts[j] = cum
		}
		h[k] = metric.Buckets{Bounds: bounds, Counts: counts}
	}
	return h
}

// storeHeapPerPod is the heap a store holds per pod after 90 s of 1 s
// samples of 16,000 pods with the retention given (60 s: the goal's; 10 s:
// what the fleet's triggers ask for, the store's least).
func storeHeapPerPod(hist bool, retention time.Duration) float64 {
	const pods = 16000
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	now := time.UnixMilli(1_700_000_000_000)
	s := New(Options{Retention: retention, Now: func() time.Time { return now }})
	infos := make([]PodInfo, pods)
	for i := range infos {
		infos[i] = PodInfo{UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i), Namespace: "tenant-a", Name: fmt.Sprintf("llama-%d", i),
			Ready: true, Workloads: []Key{{Namespace: "tenant-a", Kind: KindWorkspace, Name: fmt.Sprintf("llama-%d", i/8)}}}
	}
	for a := range pods / 8 {
		s.Upsert(Source{Node: fmt.Sprintf("node-%d", a), Instance: "agent"}, infos[a*8:a*8+8], true)
	}
	reports := make([]Report, pods)
	for i := range 90 {
		smp := vllmSample(i)
		for j := range reports {
			reports[j] = Report{UID: infos[j].UID, Sample: Sample{TimeMs: smp.TimeMs, Values: smp.Values}}
			if hist {
				reports[j].Hist = vllmHist(i) // each pod's own, as the wire decodes them
			}
		}
		s.Add(reports)
	}
	infos = nil
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	runtime.KeepAlive(s)
	return float64(m1.HeapAlloc-m0.HeapAlloc) / pods
}

// BenchmarkFullCatalogue: one agent's full catalogue (8 pods) into a store
// of 80,000 pods on 10,000 nodes. It touches that node's pods only (it
// once walked every pod held: 10,000 agents connecting walked 800 million).
func BenchmarkFullCatalogue(b *testing.B) {
	s := New(Options{MaxPods: 100000})
	node := func(n int) (Source, []PodInfo) {
		var infos []PodInfo
		for i := range 8 {
			uid := fmt.Sprintf("n%d-p%d", n, i)
			infos = append(infos, PodInfo{UID: uid, Namespace: "ns", Name: uid, Ready: true, Workloads: []Key{{Namespace: "ns", Kind: KindDeployment, Name: fmt.Sprintf("w%d", n)}}})
		}
		return Source{Node: fmt.Sprintf("node-%d", n), Instance: "agent"}, infos
	}
	for n := range 10000 {
		src, infos := node(n)
		s.Upsert(src, infos, true)
	}
	src, infos := node(4242)
	for b.Loop() {
		s.Upsert(src, infos, true)
	}
}

// BenchmarkStoreAdd is the store's cost per pod-sample once every pod's
// series holds its window (each append then drops the sample that
// expired): 2,000 pods of 1 s samples, at the fleet's 10 s window and the
// goal's 60 s (docs/performance.md).
func BenchmarkStoreAdd(b *testing.B) {
	for _, retention := range []time.Duration{10 * time.Second, time.Minute} {
		b.Run(retention.String(), func(b *testing.B) {
			const pods = 2000
			now := time.UnixMilli(1_700_000_000_000)
			s := New(Options{Retention: retention, Now: func() time.Time { return now }})
			infos := make([]PodInfo, pods)
			for i := range infos {
				infos[i] = PodInfo{UID: fmt.Sprintf("pod-%d", i), Namespace: "tenant-a", Name: fmt.Sprintf("llama-%d", i), Ready: true,
					Workloads: []Key{{Namespace: "tenant-a", Kind: KindWorkspace, Name: fmt.Sprintf("llama-%d", i/8)}}}
			}
			s.Upsert(Source{Node: "node", Instance: "agent"}, infos, true)
			const ticks = 120 // samples prepared: a window's worth, then more
			reports := make([][]Report, ticks)
			for i := range reports {
				smp := vllmSample(i)
				reports[i] = make([]Report, pods)
				for j := range reports[i] {
					reports[i][j] = Report{UID: infos[j].UID, Sample: Sample{TimeMs: smp.TimeMs, Values: smp.Values}}
				}
			}
			tick := 0
			add := func() {
				// Each tick's reports again, a window of ticks later.
				shift := int64(tick/ticks) * ticks * 1000
				batch := reports[tick%ticks]
				t := vllmSample(tick%ticks).TimeMs + shift
				for j := range batch {
					batch[j].TimeMs = t
				}
				s.Add(batch)
				tick++
			}
			for range 2 * int(retention/time.Second) {
				add() // every series at its window
			}
			b.ResetTimer()
			for b.Loop() {
				add()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pods), "ns/pod-sample")
		})
	}
}

// The replicas of a workload hold one group (namespace and workload list)
// among them; a pod listed again with the same keeps its own, one listed
// with others gets a new group and leaves its replicas' as they were, and
// ListedOn hands out a copy of the list.
func TestReplicasShareOneGroup(t *testing.T) {
	s := New(Options{})
	ws := Key{Kind: "Workspace", Namespace: "ns", Name: "w"}
	other := Key{Kind: "Workspace", Namespace: "ns", Name: "other"}
	entry := func(uid string, ks ...Key) PodInfo {
		// Each entry its own strings and list, as a decoded catalogue's.
		return PodInfo{UID: uid, Namespace: strings.Clone("ns"), Name: "pod-" + uid, Ready: true,
			Workloads: slices.Clone(ks), CreatedMs: 1, ReadySinceMs: 2}
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{entry("a", ws), entry("b", ws)}, true)
	s.Upsert(Source{Node: "n2"}, []PodInfo{entry("c", ws)}, true)
	g := s.pods["a"].podGroup
	for _, uid := range []string{"b", "c"} {
		if s.pods[uid].podGroup != g {
			t.Errorf("pod %s holds a group of its own, want its workload's first replica's", uid)
		}
	}
	if unsafe.StringData(g.Namespace) != unsafe.StringData(g.Workloads[0].Namespace) { //nolint:gosec // G103: the strings' addresses, compared, never written
		t.Error("the group's namespace is a string of its own, want its first key's")
	}
	s.Upsert(Source{Node: "n1"}, []PodInfo{entry("a", ws), entry("b", ws, other)}, true)
	if s.pods["a"].podGroup != g {
		t.Error("a pod listed again as it was got a new group")
	}
	if b := s.pods["b"]; b.podGroup == g || !slices.Equal(b.Workloads, []Key{ws, other}) {
		t.Errorf("pod b listed under two workloads holds %v (the shared group: %v)", b.Workloads, b.podGroup == g)
	}
	if !slices.Equal(g.Workloads, []Key{ws}) || s.pods["c"].podGroup != g {
		t.Errorf("the shared group changed with one replica's listing: %v", g.Workloads)
	}
	info, ok := s.ListedOn("n2", "c")
	if !ok || info.Namespace != "ns" || info.Name != "pod-c" || !info.Ready || !slices.Equal(info.Workloads, []Key{ws}) {
		t.Fatalf("ListedOn(n2, c) = %+v, %v", info, ok)
	}
	info.Workloads[0].Name = "changed"
	if g.Workloads[0].Name != "w" {
		t.Error("ListedOn's list is the store's own")
	}
}
