package wire

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/metric"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// extremes are values a page may give, the encoder's bounds' edges among
// them.
var extremes = []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 1.5, 2.5, 1e300, -1e300, math.Inf(1), math.Inf(-1), math.NaN(),
	maxQuantum, maxQuantum + 2, -maxQuantum, -maxQuantum - 2, math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64,
	math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, 1 << 40, -(1 << 40)}

func propValue(rng *rand.Rand) float64 {
	switch rng.IntN(4) {
	case 0:
		return extremes[rng.IntN(len(extremes))]
	case 1:
		return rng.NormFloat64() * math.Pow(10, float64(rng.IntN(20)))
	default:
		return float64(rng.IntN(1000)) / 10
	}
}

var boundSets = [][]float64{
	{0.1, 1, math.Inf(1)},
	{0.1, 0.5, 1, math.Inf(1)},
	{math.Inf(-1), 0, math.Inf(1)},
	{1, math.Inf(1)},
	{2, 1, math.Inf(1)},       // not ascending: never sent
	{math.NaN(), math.Inf(1)}, // never sent
}

func propBuckets(rng *rand.Rand) metric.Buckets {
	b := boundSets[rng.IntN(len(boundSets))]
	counts := make([]float64, len(b))
	c := float64(rng.IntN(5))
	for i := range counts {
		c += float64(rng.IntN(3))
		counts[i] = c
		switch rng.IntN(30) {
		case 0:
			counts[i] = math.NaN()
		case 1:
			counts[i] = math.Inf(1)
		case 2:
			counts[i] = -3
		case 3:
			counts[i] = c + 0.4 // rounds to c
		}
	}
	if rng.IntN(20) == 0 {
		counts = counts[:len(counts)-1]
	}
	return metric.Buckets{Bounds: b, Counts: counts}
}

// TestRoundTripProperty: whatever values and histograms an agent's pages
// give (extremes, NaN, infinities, histograms the decoder would refuse),
// pods forgotten at both ends and missing samples between, every batch the
// Encoder makes decodes, through the aggregator's pooled messages (whose
// arrays are reused), to the values quantized and the histograms as the
// receiver keeps them (an unchanged one absent: the last stands).
func TestRoundTripProperty(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 99))
		enc, dec := NewEncoder(), NewDecoder()
		view := map[uint32]*metric.Histograms{} // what the receiver holds of each pod
		for step := range 300 {
			var b pulsev1.SampleBatch
			want := map[uint32]Sample{}
			for pod := uint32(1); pod <= 5; pod++ {
				switch rng.IntN(10) {
				case 0:
					continue
				case 1:
					enc.Forget(pod)
					dec.Forget(pod)
					delete(view, pod)
					continue
				}
				s := propSample(rng, pod)
				enc.Append(&b, &s)
				want[pod] = s
			}
			raw, err := proto.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}})
			if err != nil {
				t.Fatal(err)
			}
			msg := pulsev1.AgentMessageFromVTPool()
			if err := msg.UnmarshalVT(raw); err != nil {
				t.Fatal(err)
			}
			got, err := dec.Decode(nil, msg.GetBatch())
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			if len(got) != len(want) {
				t.Fatalf("seed %d step %d: %d samples, want %d", seed, step, len(got), len(want))
			}
			// What the receiver keeps is taken before the message goes back
			// to its pool, and checked after the next message reused it.
			for _, g := range got {
				checkDecoded(t, fmt.Sprintf("seed %d step %d pod %d", seed, step, g.Pod), g, want[g.Pod], view)
			}
			msg.ReturnToVTPool()
			for pod, w := range want {
				checkHeld(t, fmt.Sprintf("seed %d step %d pod %d", seed, step, pod), w, view[pod])
			}
		}
	}
}

// propSample is pod's sample of one step: missing one time in eight, else
// values, histograms and extra values drawn from rng.
func propSample(rng *rand.Rand, pod uint32) Sample {
	if rng.IntN(8) == 0 {
		return Sample{Pod: pod, Missing: pulsev1.MissingReason_MISSING_REASON_PARSE, Error: "bad\xffpage"}
	}
	s := Sample{Pod: pod, OffsetMs: int32(rng.IntN(1000))}
	for id := metric.ID(1); id < metric.NumIDs; id++ {
		if rng.IntN(3) != 0 {
			s.Values.Set(id, propValue(rng))
		}
	}
	if rng.IntN(2) == 0 {
		s.Hist = &metric.Histograms{}
		for h := range s.Hist {
			if rng.IntN(3) != 0 {
				s.Hist[h] = propBuckets(rng)
			}
		}
	}
	if rng.IntN(3) == 0 {
		s.Extra = []float64{propValue(rng), math.NaN()}
	}
	return s
}

// checkDecoded checks g, decoded, against w, sent, and keeps g's
// histograms in view, the receiver's.
func checkDecoded(t *testing.T, at string, g, w Sample, view map[uint32]*metric.Histograms) {
	t.Helper()
	if g.Missing != w.Missing || g.OffsetMs != w.OffsetMs {
		t.Fatalf("%s: got %+v, want %+v", at, g, w)
	}
	if w.Missing != 0 {
		if g.Error != "bad\uFFFDpage" {
			t.Fatalf("%s: error %q", at, g.Error)
		}
		return
	}
	for id := metric.ID(1); id < metric.NumIDs; id++ {
		x, sent := w.Values.Get(id)
		sent = sent && x == x
		y, ok := g.Values.Get(id)
		if ok != sent || sent && y != float64(quantize(id, x))/metric.Pow10(id.Scale()) {
			t.Fatalf("%s %s: sent %v (%v), decoded %v (%v)", at, id.Name(), x, sent, y, ok)
		}
	}
	if (w.Extra == nil) != (g.Extra == nil) || w.Extra != nil && !slices.EqualFunc(w.Extra, g.Extra, func(a, b float64) bool { return a == b || a != a && b != b }) {
		t.Fatalf("%s: extra %v, want %v", at, g.Extra, w.Extra)
	}
	if g.Hist == nil {
		return
	}
	if view[g.Pod] == nil {
		view[g.Pod] = &metric.Histograms{}
	}
	for h := range g.Hist {
		if g.Hist[h].Present() {
			view[g.Pod][h] = metric.Buckets{Bounds: g.Hist[h].Bounds, Counts: slices.Clone(g.Hist[h].Counts)}
		}
	}
}

// checkHeld checks that v, what the receiver holds of a pod, is each
// histogram w sent that the decoder takes, its counts rounded.
func checkHeld(t *testing.T, at string, w Sample, v *metric.Histograms) {
	t.Helper()
	if w.Hist == nil {
		return
	}
	for h := range w.Hist {
		hb := &w.Hist[h]
		if !hb.Present() || !sendable(hb) {
			continue
		}
		if v == nil || !slices.Equal(v[h].Bounds, hb.Bounds) {
			t.Fatalf("%s hist %d: receiver holds bounds %v, sent %v", at, h, v, hb.Bounds)
		}
		for i, c := range hb.Counts {
			if v[h].Counts[i] != float64(quantizeCount(c)) {
				t.Fatalf("%s hist %d: receiver holds %v, sent %v", at, h, v[h].Counts, hb.Counts)
			}
		}
	}
}
