package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/test/fuzzbytes"
)

// fuzzBytes reads a fuzzer's bytes as choices; past their end every
// choice is the first.
type fuzzBytes struct{ *fuzzbytes.Reader }

// Values a window can hold, sensible (fuzzFloats) or not (fuzzOdd: pulse's
// store never gives them, but the planner is a pure function and is held
// to its rules whatever it is given).
var (
	fuzzFloats = [...]float64{0, 0.5, 1, 2, 5, 30, 1000, 4e4, 1e6, 1e8}
	fuzzOdd    = [...]float64{-1, -1e4, math.NaN(), math.Inf(1), math.Inf(-1), 1e300}
	fuzzDurs   = [...]time.Duration{0, time.Second, 5 * time.Second, 30 * time.Second, 4 * time.Minute, time.Hour, 5 * time.Hour, -5 * time.Second}
	// The time between two plans; the last goes back (a wall clock set
	// back).
	fuzzSteps = [...]time.Duration{0, time.Second, 5 * time.Second, 15 * time.Second, time.Minute, 10 * time.Minute, 2 * time.Hour, -3 * time.Second}
)

// float is one of fuzzFloats, or one time in four one of fuzzOdd: a
// replica with one odd value is refused whole, and the rules for the
// believed ones need most windows believable.
func (b *fuzzBytes) float() float64 {
	if i := b.Pick(4 * len(fuzzFloats)); i < 3*len(fuzzFloats) {
		return fuzzFloats[i%len(fuzzFloats)]
	}
	return fuzzOdd[b.Pick(len(fuzzOdd))]
}

func (b *fuzzBytes) dur() time.Duration    { return fuzzDurs[b.Pick(len(fuzzDurs))] }
func (b *fuzzBytes) flag() bool            { return b.Pick(2) == 1 }
func (b *fuzzBytes) step() time.Duration   { return fuzzSteps[b.Pick(len(fuzzSteps))] }
func (b *fuzzBytes) state() store.PodState { return store.PodState(1 + b.Pick(5)) }

func (b *fuzzBytes) pod(i int) store.PodLoad {
	return store.PodLoad{
		Name: fmt.Sprintf("p%d", i), State: b.state(),
		PromptTokens: b.float(), GenerationTokens: b.float(), Tokens: b.flag(),
		FirstTokens: b.float(), TTFT: b.float(), TTFTOK: b.flag(), QueueTime: b.float(), QueueOK: b.flag(),
		ITL: b.float(), ITLOK: b.flag(), TTFTQuantile: b.float(), TTFTQuantileOK: b.flag(), Preemptions: b.float(),
		Waiting: b.float(), Running: b.float(), KVCache: b.float(), WaitingNow: b.float(), WaitingGrowth: b.float(),
		NoWaiting: b.Pick(8) == 0, NoKV: b.flag(), Span: b.dur(), Startup: b.dur(), Age: b.dur(),
		TTFTQuantileBeyond: b.Pick(4) == 0, StartupUnseen: b.Pick(4) == 0, Unseen: b.Pick(4) == 0,
		Unready: b.Pick(4) == 0, UnreadyFor: b.dur(),
	}
}

// FuzzMake feeds the planner a sequence of snapshots built from the
// fuzzer's bytes — any pods, in any state, with any values, the clock
// stepping on or back — threading its state, and holds it to what rules 8
// and "Every plan explained" promise whatever comes: no panic; a plan is 0
// to 2³¹−1 replicas and every number it shows (and every one it keeps) is
// finite, so /debug/triggers and the gauges can show it; with a ready
// replica lacking a fresh sample, never fewer than the ready replicas,
// and within the first hold of a workload (an aggregator just restarted)
// never fewer than the ready and starting; a need above 0 at least one
// replica; no cascade from a replica starting, and no fewer replicas
// for a longer queue (checkVariants); and Make changes neither its input
// nor the state it is given.
func FuzzMake(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 1, 1, 5, 7, 3, 1, 4, 1, 2, 1, 2, 1, 0, 1, 3, 0, 4, 2, 3, 1, 2, 2, 2, 1, 0})
	f.Add([]byte{2, 4, 0, 12, 13, 1, 14, 1, 15, 1, 12, 1, 13, 1, 14, 12, 13, 14, 15, 12, 13, 1, 1, 7, 7, 7})
	f.Add([]byte{6, 0, 3, 1, 10, 10, 1, 9, 9, 1, 9, 1, 9, 1, 9, 1, 9, 9, 9, 9, 9, 9, 1, 1, 6, 6, 6, 3, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes{fuzzbytes.New(data)}
		cfg := Default([...]time.Duration{2 * time.Second, time.Millisecond, 10 * time.Minute}[b.Pick(3)])
		cfg.Percentile = [...]float64{0, 0.9}[b.Pick(2)]
		cfg.ITL = [...]time.Duration{0, 50 * time.Millisecond}[b.Pick(2)]
		var st State
		at := t0
		for step := 0; step < 40 && b.Len() > 0; step++ {
			at = at.Add(b.step())
			in := Input{At: at, Found: b.Pick(8) != 0, Demand: store.DemandValue{Sources: b.Pick(3), Held: b.float(), Arrived: b.float(), Stale: b.Pick(2), Silent: b.Pick(2)}}
			if b.Pick(4) == 0 { // replicas lost with their agent
				in.Lost, in.LostOK = store.Lost{At: at.Add(-b.dur()), Pods: b.Pick(4)}, true
			}
			if b.Pick(4) == 0 { // a new replica refused for room
				in.RefusedAt = at.Add(-b.dur())
			}
			for i := range b.Pick(7) {
				in.Pods = append(in.Pods, b.pod(i))
			}
			podsBefore := fmt.Sprint(in.Pods)
			prev := st
			prev.peaks = slices.Clone(st.peaks)
			stateBefore := fmt.Sprintf("%+v", prev)

			p, next, err := Make(in, st, cfg)

			if fmt.Sprint(in.Pods) != podsBefore || fmt.Sprintf("%+v", st) != stateBefore {
				t.Fatalf("step %d: Make changed its input or the state it was given", step)
			}
			checkState(t, step, next)
			st = next
			if err != nil {
				if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrStale) && !errors.Is(err, ErrLost) && !errors.Is(err, ErrRefused) {
					t.Fatalf("step %d: error %v is none of the planner's", step, err)
				}
				continue
			}
			if p.Replicas < 0 || p.Replicas > math.MaxInt32 {
				t.Fatalf("step %d: %d replicas, outside 0 to 2³¹−1", step, p.Replicas)
			}
			if _, err := json.Marshal(p); err != nil {
				t.Fatalf("step %d: the plan cannot be shown: %v (%+v)", step, err, p)
			}
			if p.Need > 0 && p.Replicas == 0 {
				t.Fatalf("step %d: a need of %g planned as no replica (%s)", step, p.Need, p.Reason)
			}
			if p.Missing > 0 && p.Replicas < p.Ready {
				t.Fatalf("step %d: %d replicas with %d ready, %d of them without a fresh sample: want at least the ready", step, p.Replicas, p.Ready, p.Missing)
			}
			// The first hold (an aggregator restarted) keeps the ready
			// replicas and those starting; the hold without its
			// extension, which the regrets of this very plan may add.
			if since := at.Sub(next.Since); since >= 0 && since < next.hold(cfg)-next.HoldExtra && p.Replicas < p.Ready+p.Starting {
				t.Fatalf("step %d: %d replicas with %d ready and %d starting, %s after the workload was first seen: want at least those", step, p.Replicas, p.Ready, p.Starting, since)
			}
			checkVariants(t, step, in, prev, cfg, p)
		}
	})
}

// checkVariants plans in again from the same state with one replica more
// starting, and with more requests queued at one believable replica, and
// fails unless the first asks for no replica beyond those listed and p's
// (a replica starting is capacity coming: no cascade while it loads), and
// the second for no fewer than p (a longer queue never needs less).
func checkVariants(t *testing.T, step int, in Input, prev State, cfg Config, p Plan) {
	t.Helper()
	starting := in
	starting.Pods = append(slices.Clone(in.Pods), store.PodLoad{Name: "new", State: store.PodStarting})
	if q, _, err := Make(starting, prev, cfg); err == nil && q.Replicas > max(p.Replicas, q.Ready+q.Starting) {
		t.Fatalf("step %d: one replica more starting planned %d (%s), against %d (%s) without it, with %d listed: a cascade", step, q.Replicas, q.Reason, p.Replicas, p.Reason, q.Ready+q.Starting)
	}
	for i := range in.Pods {
		if in.Pods[i].State != store.PodCounted || implausible(&in.Pods[i]) != "" {
			continue
		}
		longer := in
		longer.Pods = slices.Clone(in.Pods)
		longer.Pods[i].WaitingNow += 100
		if implausible(&longer.Pods[i]) != "" {
			break
		}
		if q, _, err := Make(longer, prev, cfg); err == nil && q.Replicas < p.Replicas {
			t.Fatalf("step %d: 100 requests more queued at %s planned %d (%s), against %d (%s)", step, in.Pods[i].Name, q.Replicas, q.Reason, p.Replicas, p.Reason)
		}
		break
	}
}

// checkState fails unless every number the state keeps, and will show or
// plan on, is finite and not negative, and its hold's extension within its
// bound.
func checkState(t *testing.T, step int, st State) {
	t.Helper()
	for name, v := range map[string]float64{"capacity": st.Capacity, "break capacity": st.BreakCapacity, "healthy max": st.HealthyMax,
		"work per request": st.WorkPerRequest, "surge": st.Surge, "peak work": st.PeakWork, "level surge": st.LevelSurge, "trend": st.Trend} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("step %d: the state's %s is %v: want a finite number, not negative", step, name, v)
		}
	}
	for _, pk := range st.peaks {
		if math.IsNaN(pk.need) || math.IsInf(pk.need, 0) || pk.need < 0 || math.IsNaN(pk.work) || math.IsInf(pk.work, 0) || pk.work < 0 {
			t.Fatalf("step %d: a peak held is %+v: want finite numbers, not negative", step, pk)
		}
	}
	if len(st.peaks) > maxPeaks {
		t.Fatalf("step %d: %d peaks held, past %d", step, len(st.peaks), maxPeaks)
	}
	if st.HoldExtra < 0 || st.HoldExtra > maxHoldExtra || st.LeadTime < 0 || st.LeadTime > maxStartup {
		t.Fatalf("step %d: hold extension %s, lead time %s: want within 0 to %s, and 0 to %s", step, st.HoldExtra, st.LeadTime, maxHoldExtra, maxStartup)
	}
}
