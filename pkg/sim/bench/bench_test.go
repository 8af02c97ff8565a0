package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/sim"
	"github.com/pulse-io/pulse/pkg/sim/replica"
)

// miniSuite writes a small suite beside the shipped ScaledObjects and trace.
func miniSuite(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	body = strings.ReplaceAll(body, "ROOT", root)
	f := filepath.Join(dir, "suite.yaml")
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

const mini = `seeds: 2
profiles: [llama-3.1-8b-h100]
scaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]
clairvoyant: {utilisations: [0.5, 0.8, 1, 1.5], windows: [30s], holds: [0s, 10m]}
traces:
- name: bursty
  trace: bursts:base=1,peak=30,on=2m,off=6m,duration=30m,lengths=lognormal
- name: mooncake-half
  trace: ROOT/pkg/sim/trace/testdata/mooncake-synthetic.jsonl
  rateScale: 0.5
`

// TestSuiteWritesTheScoreboard: a suite run writes scoreboard.json and .md
// and a frontier picture a case; every signal pipeline and every fixed
// fleet is scored, the frontiers are monotone, distances are the score
// minus the frontier, and the same suite gives the same scoreboard, byte
// for byte.
func TestSuiteWritesTheScoreboard(t *testing.T) {
	f := miniSuite(t, mini)
	s, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	sb, _, err := s.Run("mini", &log)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	files, err := Write(sb, out, "png")
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Cases) != 2 || len(files) != 4 || strings.Count(log.String(), "2 seeds in") != 2 {
		t.Fatalf("%d cases, files %v, log %q", len(sb.Cases), files, log.String())
	}
	for _, c := range sb.Cases {
		// The family: the default switches (3 fractions × 9 sizes × up and
		// down), then the sweep's 8 plans.
		if len(c.Pipelines) != 5 || len(c.Static) != 10 || len(c.Clairvoyant) != 54+8 {
			t.Fatalf("%s: %d pipelines, %d static, %d clairvoyant", c.Trace, len(c.Pipelines), len(c.Static), len(c.Clairvoyant))
		}
		if a, b := c.Clairvoyant[54].Pipeline, c.Clairvoyant[61].Pipeline; a != "clairvoyant:utilisation=0.5,window=30s" || b != "clairvoyant:utilisation=1.5,window=30s,hold=10m0s" {
			t.Fatalf("%s: the sweep runs %s … %s, want no hold first and the 10-minute hold last", c.Trace, a, b)
		}
		for _, front := range [][]Point{c.StaticFrontier, c.ClairvoyantFrontier} {
			for i := 1; i < len(front); i++ {
				if front[i].GPUHours < front[i-1].GPUHours || front[i].SLO <= front[i-1].SLO {
					t.Fatalf("%s: frontier not monotone: %+v", c.Trace, front)
				}
			}
		}
		prof, err := replica.Load(c.Profile)
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range c.Pipelines {
			f, ok := At(c.StaticFrontier, sc.GPUHoursAfterWarmup, FrontierSlack(prof))
			if ok != (sc.ToStatic != nil) || ok && round(sc.SLOAfterWarmup-f) != *sc.ToStatic {
				t.Fatalf("%s %s: to static %v, frontier %v %v", c.Trace, sc.Pipeline, sc.ToStatic, f, ok)
			}
		}
		if p := c.PulseMinusPrometheus; p == nil || p.N != 2 {
			t.Fatalf("%s: pulse − prometheus %+v", c.Trace, p)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "scoreboard.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## bursty ×1", "## mooncake-half ×0.5", "Static frontier", "Clairvoyant frontier", "pulse − prometheus, paired by seed (n = 2)", "![frontier](frontier-1-"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("scoreboard.md lacks %q", want)
		}
	}
	fh, err := os.Open(files[1])
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if img, err := png.Decode(fh); err != nil || img.Bounds().Dx() < 500 {
		t.Fatalf("%s: %v", files[1], err)
	}
	a, _ := json.Marshal(sb)
	again, _, err := s.Run("mini", &log)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(again); !bytes.Equal(a, b) {
		t.Fatal("the same suite gave another scoreboard")
	}
}

// TestARateByProfileFileIsApplied: rateScaleByProfile's keys are the
// suite's profiles as it writes them, a file's path included. The rate
// was once looked up by the profile's own name, so a profile given as a
// file ran every trace at the trace's rate: its key was accepted, and its
// rate silently left out.
func TestARateByProfileFileIsApplied(t *testing.T) {
	f := miniSuite(t, `seeds: 1
profiles: [llama-3.1-8b-h100, fast.yaml]
scaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]
pipelines: [pulse]
clairvoyant: {utilisations: [1], windows: [30s]}
traces:
- name: steady
  trace: poisson:rate=2,duration=5m
  rateScale: 2
  rateScaleByProfile: {fast.yaml: 0.5}
`)
	shipped, err := replica.Load("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	fast := *shipped
	fast.Name, fast.Startup, fast.StartupStddev = "llama-3.1-8b-h100-fast", replica.Duration{Duration: time.Minute}, replica.Duration{Duration: 10 * time.Second}
	b, err := json.Marshal(fast)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(f), "fast.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := s.Runs()
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].RateScale != 2 || runs[1].RateScale != 0.5 || runs[1].ProfileName != "llama-3.1-8b-h100-fast" {
		t.Fatalf("runs %+v: want the shipped profile at 2 and the file at 0.5", runs)
	}
	sb, _, err := s.Run("rates", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Cases) != 2 || sb.Cases[0].RateScale != 2 || sb.Cases[1].RateScale != 0.5 || sb.Cases[1].Requests*4 > sb.Cases[0].Requests*3/2 {
		t.Fatalf("cases: %s ×%g, %d requests; %s ×%g, %d requests: want the file's trace at a quarter of the other's rate",
			sb.Cases[0].Profile, sb.Cases[0].RateScale, sb.Cases[0].Requests, sb.Cases[1].Profile, sb.Cases[1].RateScale, sb.Cases[1].Requests)
	}
}

func TestBadSuitesAreRefusedClearly(t *testing.T) {
	for name, tc := range map[string]struct{ body, want string }{
		"unknown key":  {"seeds: 1\ncolour: red\n", "colour"},
		"empty":        {"seeds: 1\n", "at least one entry"},
		"rate":         {"profiles: [llama-3.1-8b-h100]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1', rateScale: -1}]\n", "rate scale -1"},
		"by profile":   {"profiles: [llama-3.1-8b-h100]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1', rateScaleByProfile: {other: 2}}]\n", "not one of the suite's profiles"},
		"static":       {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\npipelines: [pulse, static:3]\n", "added by the suite itself"},
		"clairvoyant":  {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\npipelines: [pulse, 'clairvoyant:utilisation=1']\n", "added by the suite itself"},
		"copy lengths": {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\ncopyLengths: longer\n", "copyLengths"},
		"duplicate":    {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}, {trace: 'poisson:rate=1'}]\n", "used twice"},
		"hold":         {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\nclairvoyant: {holds: [25h]}\n", "clairvoyant.holds: 25h0m0s"},
		"switch at":    {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\nclairvoyant: {switches: [0.5, 1]}\n", "clairvoyant.switches: 1:"},
		"switch twice": {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\nclairvoyant: {switches: [0.5, 0.25, 0.5]}\n", "0.5 is named twice"},
		"switch":       {"profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\npipelines: [pulse, 'switch:from=1,to=2,at=0.5']\n", "added by the suite itself"},
		"seeds":        {"seeds: 1000\nprofiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n", "seeds 1000"},
		"ttft":         {"ttftSlo: -2s\nprofiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n", "ttftSlo -2s"},
		"warmup":       {"warmup: -5m\nprofiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n", "warmup -5m0s"},
		// Refused where run's flags are (found in a review, 2026-12-05:
		// accepted, or found only when a case ran).
		"copy jitter": {"copyJitter: -5m\nprofiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n", "copyJitter -5m0s"},
		"balancer":    {"balancer: bogus\nprofiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n", `balancer "bogus"`},
	} {
		_, err := Read(miniSuite(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, tc.want)
		}
	}
	if _, err := Read("no-such-suite.yaml"); err == nil {
		t.Error("a missing suite was read")
	}
	// Every profile, ScaledObject and trace is read before the first case
	// runs, each bad one named by its file: a bad trace after a good one
	// was found only when its case came, after the first had run, and a
	// bad ScaledObject was named by a metadata name two files may share
	// (found in a review, 2026-12-05).
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-1,20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badSO := filepath.Join(dir, "so.yaml")
	if err := os.WriteFile(badSO, []byte("apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: llama}\nspec: {maxReplicaCout: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Read(miniSuite(t, "seeds: 1\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml, "+badSO+"]\ntraces:\n- {name: good, trace: 'poisson:rate=1,duration=20m'}\n- {name: late, trace: "+bad+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	if _, _, err := s.Run("late", &log); err == nil || !strings.Contains(err.Error(), "late:") || !strings.Contains(err.Error(), badSO) || log.Len() > 0 {
		t.Errorf("a suite with a bad trace and ScaledObject: %v, after %q; want both named before any case ran", err, log.String())
	}
	// So are a trigger pulse refuses and a generated trace whose seeds
	// fall either side of the default warm-up (found in a review of the
	// change: each still found at its case).
	badTrigger := filepath.Join(dir, "threshold.yaml")
	if err := os.WriteFile(badTrigger, []byte("apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: llama}\nspec: {scaleTargetRef: {name: llama}, triggers: [{type: external-push, metadata: {workspace: llama, metric: kvCacheUsage, threshold: '0.0015'}}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = Read(miniSuite(t, "seeds: 6\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml, "+badTrigger+"]\ntraces:\n- {name: good, trace: 'poisson:rate=1,duration=20m'}\n- {name: short, trace: 'poisson:rate=0.03,duration=10m30s'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	log.Reset()
	if _, _, err := s.Run("late", &log); err == nil || !strings.Contains(err.Error(), "thousandths") || !strings.Contains(err.Error(), "short at ×1: seed") || log.Len() > 0 {
		t.Errorf("a suite with a bad trigger and seeds either side of the warm-up: %v, after %q; want both named before any case ran", err, log.String())
	}
	// The seeds are judged at the rate scale their case runs them at, as
	// runCase thins or copies them, not raw (found in a review of the
	// check, 2026-12-05: a suite that would run was refused, and one that
	// would not passed).
	for _, c := range []struct {
		trace   string
		scale   float64
		refused bool
	}{{"poisson:rate=3,duration=10m1s", 0.1, true}, {"poisson:rate=3,duration=10m0.3s", 0.01, false}} {
		s, err := Read(miniSuite(t, fmt.Sprintf("seeds: 2\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]\ntraces:\n- {name: x, trace: '%s', rateScale: %g}\n", c.trace, c.scale)))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.checkInputs(); (err != nil) != c.refused {
			t.Errorf("%s at ×%g: %v; want refused %v", c.trace, c.scale, err, c.refused)
		}
	}
	// A scale past what a run may hold is refused before the copies are
	// made, as the case refuses it (made first, the check asked for
	// gigabytes: found in a review, 2026-12-05).
	s, err = Read(miniSuite(t, "seeds: 1\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]\ntraces:\n- {name: big, trace: 'poisson:rate=100,duration=1h', rateScale: 1000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkInputs(); err == nil || !strings.Contains(err.Error(), "big at ×1000: rate scale 1000") {
		t.Errorf("a trace at ×1000 past what a run may hold: %v", err)
	}
	// With a warm-up given, so is every seed's trace at every scale, and
	// one the warm-up leaves nothing of (found in a review, 2026-12-07:
	// the first seed's trace alone was loaded, and such a case failed
	// after the cases before it had run).
	for name, body := range map[string]string{
		"short": "warmup: 6m\nseeds: 1\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]\ntraces:\n- {name: long, trace: 'poisson:rate=2,duration=20m'}\n- {name: short, trace: 'poisson:rate=2,duration=5m'}\n",
		"big":   "warmup: 1m\nseeds: 1\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/tuned-scaledobject.yaml]\ntraces:\n- {name: big, trace: 'poisson:rate=100,duration=1h', rateScale: 1000}\n",
	} {
		s, err := Read(miniSuite(t, body))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"short": "short at ×1, seed 1: the warm-up (6m0s) leaves nothing", "big": "big at ×1000: rate scale 1000"}[name]
		if err := s.checkInputs(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s, with a warm-up given: %v; want %q", name, err, want)
		}
	}
	// hindsight is a reference a suite may name: the bench adds only the
	// fixed fleets and the clairvoyant sweep itself.
	if _, err := Read(miniSuite(t, "profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\npipelines: [pulse, 'hindsight:utilisation=0.5,hold=15m']\n")); err != nil {
		t.Errorf("a suite naming hindsight: %v", err)
	}
}

func TestFrontierAndPairs(t *testing.T) {
	xy := func(s *Score) (float64, float64) { return s.GPUHoursAfterWarmup, s.SLOAfterWarmup }
	scores := []*Score{
		{Pipeline: "c", GPUHoursAfterWarmup: 3, SLOAfterWarmup: 0.9},
		{Pipeline: "a", GPUHoursAfterWarmup: 1, SLOAfterWarmup: 0.5},
		{Pipeline: "b", GPUHoursAfterWarmup: 2, SLOAfterWarmup: 0.4}, // beaten by a
		{Pipeline: "d", GPUHoursAfterWarmup: 4, SLOAfterWarmup: 0.99},
	}
	front := Frontier(scores, xy)
	var names []string
	for _, p := range front {
		names = append(names, p.Pipeline)
	}
	if strings.Join(names, ",") != "a,c,d" {
		t.Fatalf("frontier %v, want a,c,d", names)
	}
	for g, want := range map[float64]float64{1: 0.5, 2.9: 0.5, 2.95: 0.9, 3.5: 0.9, 10: 0.99} {
		if got, ok := At(front, g, 0); !ok || got != want {
			t.Errorf("At(%g) = %g %v, want %g", g, got, ok, want)
		}
	}
	// Within the slack (a replica's startup spread), past the 2 %: a
	// 7-minute window's frontier point 21 s of a replica dearer counts.
	if got, ok := At(front, 2.8, 0.2); !ok || got != 0.9 {
		t.Errorf("At(2.8, slack 0.2) = %g %v, want 0.9 (c, at 3)", got, ok)
	}
	if got, _ := At(front, 2.8, 0); got != 0.5 {
		t.Errorf("At(2.8, no slack) = %g, want 0.5 (a)", got)
	}
	if _, ok := At(front, 0.5, 0); ok {
		t.Error("a frontier answered below its first point")
	}
	// A fixed fleet's point has no allowance: its GPU-hours do not vary.
	fixed := []Point{{Pipeline: "static:1", GPUHours: 1, SLO: 0.5}, {Pipeline: "static:2", GPUHours: 2, SLO: 0.9}}
	if got, _ := At(fixed, 1.99, 0.2); got != 0.5 {
		t.Errorf("At(1.99, slack 0.2) over fixed fleets = %g, want 0.5 (static:1: static:2 uses more)", got)
	}
	if got, _ := At(fixed, 2, 0); got != 0.9 {
		t.Errorf("At(2) over fixed fleets = %g, want 0.9", got)
	}
	m, se := meanSE([]float64{1, 2, 3, 4})
	if m != 2.5 || se < 0.6454 || se > 0.6455 {
		t.Errorf("mean %g, standard error %g; want 2.5 and 0.6455", m, se)
	}
}

// TestTheSweepsHindsightPlansJoinTheFamily: with hindsight in the sweep, its
// hindsight plans are members of the clairvoyant family (a plan that knows
// the future may act as one that does not) and bound the pipelines; a
// hindsight plan a suite names is a pipeline scored against the family.
func TestTheSweepsHindsightPlansJoinTheFamily(t *testing.T) {
	sw := Sweep{Utilisations: []float64{1}, Windows: []replica.Duration{{Duration: 30 * time.Second}}, Hindsight: true} // no holds: none
	names := sw.Names()
	if strings.Join(names, " ") != "clairvoyant:utilisation=1,window=30s hindsight:utilisation=1,window=30s" {
		t.Fatalf("sweep names %q", names)
	}
	scores := []*Score{
		{Pipeline: "static:1", GPUHoursAfterWarmup: 1, SLOAfterWarmup: 0.2},
		{Pipeline: names[0], GPUHoursAfterWarmup: 2, SLOAfterWarmup: 0.8},
		{Pipeline: names[1], GPUHoursAfterWarmup: 1.5, SLOAfterWarmup: 0.9},
		{Pipeline: "hindsight:utilisation=1,window=30s,hold=1h", GPUHoursAfterWarmup: 1.6, SLOAfterWarmup: 0.85},
		{Pipeline: "pulse", GPUHoursAfterWarmup: 1.6, SLOAfterWarmup: 0.7},
	}
	pipes, static, family, _, front := Split(scores, names, 0)
	if len(pipes) != 2 || pipes[0].Pipeline != scores[3].Pipeline || pipes[1].Pipeline != "pulse" || len(static) != 1 || len(family) != 2 {
		t.Fatalf("split into %d pipelines, %d static, %d of the family", len(pipes), len(static), len(family))
	}
	if len(front) != 2 || front[1].Pipeline != names[1] {
		t.Fatalf("family frontier %+v, want static:1 then the sweep's hindsight plan", front)
	}
	if d := pipes[1].ToClairvoyant; d == nil || round(*d) != round(0.7-0.9) {
		t.Fatalf("pulse's distance to the family %v, want %.2f (to the hindsight plan)", d, 0.7-0.9)
	}
	// Without it in the sweep, the same plan is a pipeline, and above the
	// clairvoyant plans.
	pipes, _, family, _, _ = Split(scores, names[:1], 0)
	if len(pipes) != 3 || len(family) != 1 || pipes[0].ToClairvoyant == nil || *pipes[0].ToClairvoyant <= 0 {
		t.Fatalf("without hindsight in the sweep: %d pipelines, %d of the family", len(pipes), len(family))
	}
	// A suite run: the sweep's hindsight plans are scored in the family,
	// not as pipelines; a suite that names no holds runs one plan a
	// utilisation × window.
	f := miniSuite(t, "seeds: 1\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [ROOT/docs/simulation/default-scaledobject.yaml]\n"+
		"clairvoyant: {utilisations: [1], windows: [30s], hindsight: true}\ntraces: [{trace: 'steps:rates=2/20/2,step=8m'}]\n")
	s, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := s.Run("family", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Cases[0]
	var got []string
	for _, sc := range c.Clairvoyant {
		if kind(sc.Pipeline) != "switch" {
			got = append(got, sc.Pipeline)
		}
	}
	if strings.Join(got, " ") != strings.Join(names, " ") || len(c.Pipelines) != 1 || c.Pipelines[0].Pipeline != "pulse" {
		t.Fatalf("the suite's family %q and pipelines %d, want %q and pulse alone", got, len(c.Pipelines), names)
	}
	// A suite may not name a hindsight plan its sweep adds.
	_, err = Read(miniSuite(t, "profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n"+
		"clairvoyant: {utilisations: [1], windows: [30s], hindsight: true}\npipelines: [pulse, 'hindsight:utilisation=1,window=30s']\n"))
	if err == nil || !strings.Contains(err.Error(), "hindsight:utilisation=1,window=30s is added by the suite itself") {
		t.Fatalf("a suite naming its sweep's hindsight plan: %v", err)
	}
	// However it is written: keys in another order, the window as 0.5m,
	// or left to its default (30 s).
	for _, alias := range []string{"hindsight:window=0.5m,utilisation=1", "hindsight:utilisation=1.0"} {
		_, err = Read(miniSuite(t, "profiles: [a]\nscaledObjects: [x.yaml]\ntraces: [{trace: 'poisson:rate=1'}]\n"+
			"clairvoyant: {utilisations: [1], windows: [30s], hindsight: true}\npipelines: [pulse, '"+alias+"']\n"))
		if err == nil || !strings.Contains(err.Error(), alias+" is added by the suite itself") {
			t.Errorf("a suite naming its sweep's hindsight plan as %s: %v", alias, err)
		}
		alike := []*Score{{Pipeline: alias, GPUHoursAfterWarmup: 1, SLOAfterWarmup: 0.5}, {Pipeline: "pulse", GPUHoursAfterWarmup: 1, SLOAfterWarmup: 0.5}}
		if pipes, _, family, _, _ := Split(alike, names, 0); len(pipes) != 1 || len(family) != 1 || family[0].Pipeline != alias {
			t.Errorf("%s split as a pipeline, not as the sweep's plan", alias)
		}
	}
}

// TestTheSwitchesJoinTheFamily: at each of the sweep's switches the
// references change each fleet size to the next and back, and those plans
// are the clairvoyant family's: a pipeline between two fixed fleets that
// a switch beats is below the family, not above it.
func TestTheSwitchesJoinTheFamily(t *testing.T) {
	so, err := sim.ReadScaledObject("../../../docs/simulation/default-scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var switches []string
	for _, n := range References(so, Sweep{Switches: []float64{0.25, 0.5}}) {
		if kind(n) == "switch" {
			switches = append(switches, n)
		}
	}
	if most := int(so.MaxReplicas()); len(switches) != 2*2*(most-1) || switches[0] != "switch:from=1,to=2,at=0.25" ||
		switches[1] != "switch:from=2,to=1,at=0.25" || switches[len(switches)-1] != fmt.Sprintf("switch:from=%d,to=%d,at=0.5", most, most-1) {
		t.Fatalf("switches %q, want each of 1…%d to the next and back at 0.25 and 0.5", switches, most)
	}
	scores := []*Score{scored("static:1", 1, 0), scored("static:2", 2, 0.2), scored("switch:from=2,to=1,at=0.5", 1.5, 0.15), scored("prometheus-avg", 1.6, 0.1)}
	pipes, static, family, _, front := Split(scores, nil, 0)
	if len(pipes) != 1 || len(static) != 2 || len(family) != 1 || family[0].Pipeline != scores[2].Pipeline {
		t.Fatalf("split into %d pipelines, %d static, family %d", len(pipes), len(static), len(family))
	}
	if len(front) != 3 || front[1].Pipeline != scores[2].Pipeline {
		t.Fatalf("family frontier %+v, want the switch between the fixed fleets", front)
	}
	if d := pipes[0].ToClairvoyant; d == nil || round(*d) != round(0.1-0.15) {
		t.Fatalf("prometheus-avg's distance to the family %v, want %.2f (below the switch)", d, 0.1-0.15)
	}
	if d := pipes[0].ToStatic; d == nil || round(*d) != 0.1 {
		t.Fatalf("prometheus-avg's distance to the fixed fleets %v, want +0.1 (the switch is no fixed fleet)", d)
	}
}

// TestASuiteMayRunTheDefaultHPATolerance: every suite ran the HPA with
// the HPAConfigurableTolerance gate on (alpha and off by default in
// Kubernetes 1.33), so the shipped planner's tolerance 0 was honoured
// where a default cluster applies 10 %. hpaConfigurableTolerance: false
// TestASuiteSetsTheHPAToleranceAndTheWarmStart: a suite's
// hpaConfigurableTolerance reaches its runs' HPA, and its warmStart (unset:
// true) its runs and its scoreboard, which says which.
func TestASuiteSetsTheHPAToleranceAndTheWarmStart(t *testing.T) {
	for _, c := range []struct {
		gate, want bool
		line       string
	}{{true, true, ""}, {false, false, "warmStart: false\n"}} {
		body := fmt.Sprintf(`seeds: 1
hpaConfigurableTolerance: %v
%sprofiles: [llama-3.1-8b-h100]
scaledObjects: [ROOT/docs/simulation/default-scaledobject.yaml]
clairvoyant: {utilisations: [1], windows: [30s]}
traces:
- trace: poisson:rate=20,duration=12m
`, c.gate, c.line)
		s, err := Read(miniSuite(t, body))
		if err != nil {
			t.Fatal(err)
		}
		sb, reports, err := s.Run("gate", io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if len(reports) != 1 {
			t.Fatalf("%d reports, want 1", len(reports))
		}
		if got := reports[0].Config.ConfigTolerance; got != c.gate {
			t.Fatalf("hpaConfigurableTolerance %v: the run's HPA had it %v", c.gate, got)
		}
		if reports[0].Config.WarmStart != c.want || sb.WarmStart != c.want {
			t.Fatalf("warmStart %q: the run's %v, the scoreboard's %v; want %v", c.line, reports[0].Config.WarmStart, sb.WarmStart, c.want)
		}
		var md strings.Builder
		Markdown(&md, sb, nil)
		if says := strings.Contains(md.String(), "the signal pipelines start warm"); says != c.want {
			t.Fatalf("warmStart %q: the scoreboard says it started warm: %v", c.line, says)
		}
	}
}

// TestASuiteMayDropOnScaleDown: a suite could not ask for a removed
// replica to drop its requests, as stock vLLM does at SIGTERM (its
// --shutdown-timeout 0 by default), where the scoreboards let it finish
// them: dropOnScaleDown reaches its runs. A fixed switch from 4 replicas
// to 1 halfway through drops requests with it, and none without.
func TestASuiteMayDropOnScaleDown(t *testing.T) {
	dropped := func(drop bool) int {
		body := fmt.Sprintf(`seeds: 1
dropOnScaleDown: %v
profiles: [llama-3.1-8b-h100]
scaledObjects: [ROOT/docs/simulation/default-scaledobject.yaml]
clairvoyant: {utilisations: [1], windows: [30s]}
traces:
- trace: poisson:rate=20,duration=12m,output=2000
`, drop)
		s, err := Read(miniSuite(t, body))
		if err != nil {
			t.Fatal(err)
		}
		s.Pipelines = []string{"switch:from=4,to=1,at=0.5"}
		s.NoReferences = true
		_, reports, err := s.Run("drop", io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range reports {
			for _, p := range r.Pipelines {
				n += p.Dropped
			}
		}
		return n
	}
	if n := dropped(false); n != 0 {
		t.Fatalf("without dropOnScaleDown: %d requests dropped, want none", n)
	}
	if n := dropped(true); n == 0 {
		t.Fatal("with dropOnScaleDown: no request dropped by a switch from 4 replicas to 1 under load")
	}
}

// TestTheBoundAllowsARunsNoise: a pipeline a few requests above the
// clairvoyant frontier (every pipeline at 100 %, the family's best at its
// GPU-hours 99.99 %) is within the noise of one plan's runs, not above
// the bound; a tenth of a point more is.
func TestTheBoundAllowsARunsNoise(t *testing.T) {
	front := []Point{{Pipeline: "c", GPUHours: 1, SLO: 0.9999}}
	for _, tc := range []struct {
		slo   float64
		above bool
	}{{1, false}, {0.9999 + BoundTolerance + 0.0001, true}} {
		d := distance(front, 1, tc.slo, 0)
		if got := d != nil && *d > BoundTolerance; got != tc.above {
			t.Errorf("attainment %g: above %v, want %v", tc.slo, got, tc.above)
		}
	}
}

// TestAPlanBehindACheaperFixedFleetStillCounts: the frontier leaves out a
// plan a fixed fleet a little cheaper beats; the fixed fleet has no
// allowance, so at GPU-hours just below both, the plan (within its
// allowance) is what a pipeline is measured against, not the cheaper
// fixed fleet below.
func TestAPlanBehindACheaperFixedFleetStillCounts(t *testing.T) {
	all := []*Score{scored("static:1", 1, 0.5), scored("static:2", 2, 0.9), scored("clairvoyant:utilisation=0.5", 2.01, 0.9), scored("pulse", 1.99, 0.8)}
	_, _, _, _, front := Split(all, nil, 0.05)
	for _, p := range front {
		if strings.HasPrefix(p.Pipeline, "clairvoyant") {
			t.Fatalf("the frontier keeps %s, beaten by static:2; the test wants it left out", p.Pipeline)
		}
	}
	pulse := all[3]
	if pulse.ToStatic == nil || *pulse.ToStatic != 0.3 {
		t.Errorf("Δ static %v, want +0.3 (static:1: static:2 uses more)", pulse.ToStatic)
	}
	if pulse.ToClairvoyant == nil || *pulse.ToClairvoyant != -0.1 {
		t.Errorf("Δ clairvoyant %v, want -0.1 (the plan at 2.01, within its allowance)", pulse.ToClairvoyant)
	}
}

// TestAPlanOnTheFrontierShowsWhatAFixedFleetAsGoodCosts: the static
// frontier's distance is a test of height alone, and a plan dearer than a
// fixed fleet as good is on it as long as no fixed fleet of its GPU-hours
// does better. Each score carries its GPU-hours over the cheapest fixed
// fleet's that attains as much within half a point, as the frontier's
// verdict allows (none where no fixed fleet does): a fleet 0.4 point short
// of "near" was not as good, and "near" read as having no fixed fleet as
// good at all.
func TestAPlanOnTheFrontierShowsWhatAFixedFleetAsGoodCosts(t *testing.T) {
	all := []*Score{scored("static:2", 2, 0.95), scored("static:3", 3, 0.99), scored("static:4", 4, 0.992),
		scored("dear", 3.5, 0.99), scored("cheap", 1.5, 0.95), scored("best", 3, 0.999), scored("near", 3.5, 0.996)}
	Split(all, nil, 0)
	want := map[string]*float64{"dear": ptr(3.5 / 3), "cheap": ptr(0.75), "best": nil, "static:3": ptr(1), "near": ptr(3.5 / 4)}
	for _, sc := range all {
		w, ok := want[sc.Pipeline]
		if !ok {
			continue
		}
		if (w == nil) != (sc.StaticCost == nil) || w != nil && *sc.StaticCost != round(*w) {
			t.Errorf("%s: cost against a fixed fleet as good %v, want %v", sc.Pipeline, deref(sc.StaticCost), deref(w))
		}
	}
	if d := all[3].ToStatic; d == nil || *d != 0 {
		t.Errorf("dear: Δ static %v, want 0 (on the frontier: static:3 attains as much)", deref(d))
	}
}

func ptr(v float64) *float64 { return &v }

func deref(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}

// TestThePipelinesScoreTheSameWithoutTheReferences: a suite run with
// NoReferences and Metric runs only the ScaledObjects whose trigger asks
// for that metric, scores their pipelines as the whole run does — each
// pipeline's world is its own, so the references change none of its
// numbers, which is what lets two planners be compared by the planner's
// pipeline alone (docs/simulation/planner-ab.py) — and writes no frontier
// and no picture, saying so.
func TestThePipelinesScoreTheSameWithoutTheReferences(t *testing.T) {
	s, whole := plannerSuite(t, "ROOT/docs/simulation/default-scaledobject.yaml, ROOT/docs/simulation/tuned-scaledobject.yaml")
	s.NoReferences, s.Metric = true, "replicas"
	alone, _, err := s.Run("alone", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Cases) != 2 || len(alone.Cases) != 1 || !alone.NoReferences || whole.NoReferences {
		t.Fatalf("%d cases with the references, %d alone (noReferences %v, %v); want 2 and the planner's 1", len(whole.Cases), len(alone.Cases), whole.NoReferences, alone.NoReferences)
	}
	w, a := whole.Cases[0], alone.Cases[0]
	if w.Metric != "replicas" || a.Metric != "replicas" || len(w.Static) == 0 || len(a.Static)+len(a.Clairvoyant)+len(a.StaticFrontier) != 0 {
		t.Fatalf("with the references: %s, %d fixed fleets; alone: %s, %d fixed fleets, %d plans, %d frontier points", w.Metric, len(w.Static), a.Metric, len(a.Static), len(a.Clairvoyant), len(a.StaticFrontier))
	}
	if len(w.Pipelines) != 1 || len(a.Pipelines) != 1 || a.Pipelines[0].ToStatic != nil {
		t.Fatalf("pipelines %d and %d, alone to static %v", len(w.Pipelines), len(a.Pipelines), a.Pipelines[0].ToStatic)
	}
	ws, as := *w.Pipelines[0], *a.Pipelines[0]
	ws.ToStatic, ws.ToClairvoyant, ws.ToStaticWholeRun, ws.ToClairvoyantWholeRun, ws.StaticCost = nil, nil, nil, nil, nil
	if ws != as {
		t.Fatalf("the planner's scores moved without the references:\n%+v\n%+v", ws, as)
	}
	out := t.TempDir()
	files, err := Write(alone, out, "png")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "scoreboard.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || !bytes.Contains(md, []byte("No references were run")) || bytes.Contains(md, []byte("frontier (after")) || bytes.Contains(md, []byte("![frontier]")) || bytes.Contains(md, []byte("Δ")) {
		t.Fatalf("files %v; scoreboard.md, with no frontier and no distance to one:\n%s", files, md)
	}
	// No family, so not "bounded by it" (an empty list).
	raw, _ := json.Marshal(alone)
	if whole.AboveClairvoyant == nil || !bytes.Contains(raw, []byte(`"aboveClairvoyant":null`)) || !bytes.Contains(raw, []byte(`"noReferences":true`)) {
		t.Fatalf("above the clairvoyant: with the references %v; alone %s", whole.AboveClairvoyant, raw)
	}
	// The pipelines set as a suite file's are, and refused as theirs are.
	if err := s.SetPipelines([]string{"pulse", "static:2"}); err == nil || !strings.Contains(err.Error(), "static:2 is added by the suite itself") {
		t.Fatalf("a fixed fleet among the pipelines: %v", err)
	}
	if err := s.SetPipelines(nil); err == nil {
		t.Fatal("no pipeline named: accepted")
	}
}

// TestTheFixedFleetsAloneGiveTheSameStaticDistances: with only the fixed
// fleets run of the references (StaticOnly), the static frontier and every
// pipeline's distance to it are those of the whole run, and nothing of the
// clairvoyant family is given: no frontier, no distance, no "bounded by it".
func TestTheFixedFleetsAloneGiveTheSameStaticDistances(t *testing.T) {
	s, whole := plannerSuite(t, "ROOT/docs/simulation/default-scaledobject.yaml")
	s.StaticOnly = true
	fleets, _, err := s.Run("fleets", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w, f := whole.Cases[0], fleets.Cases[0]
	if !fleets.StaticOnly || whole.StaticOnly || len(f.Clairvoyant) != 0 || len(f.ClairvoyantFrontier) != 0 || f.StaticAboveSweep != nil {
		t.Fatalf("static only %v (whole %v): %d plans, %d clairvoyant frontier points, fleets above the sweep %v", fleets.StaticOnly, whole.StaticOnly, len(f.Clairvoyant), len(f.ClairvoyantFrontier), f.StaticAboveSweep)
	}
	if len(w.Clairvoyant) == 0 || len(f.Static) != len(w.Static) || !reflect.DeepEqual(f.StaticFrontier, w.StaticFrontier) {
		t.Fatalf("fixed fleets %d and %d, plans in the whole run %d; static frontiers\n%v\n%v", len(f.Static), len(w.Static), len(w.Clairvoyant), f.StaticFrontier, w.StaticFrontier)
	}
	ws, fs := *w.Pipelines[0], *f.Pipelines[0]
	if ws.ToStatic == nil || fs.ToStatic == nil || *ws.ToStatic != *fs.ToStatic || fs.ToClairvoyant != nil || fs.ToClairvoyantWholeRun != nil || ws.ToClairvoyant == nil {
		t.Fatalf("to static %v and %v; to the clairvoyant with the fleets alone %v (whole run %v)", ws.ToStatic, fs.ToStatic, fs.ToClairvoyant, ws.ToClairvoyant)
	}
	if ws.ToStaticWholeRun == nil || fs.ToStaticWholeRun == nil || *ws.ToStaticWholeRun != *fs.ToStaticWholeRun {
		t.Fatalf("to static over the whole run %v and %v", ws.ToStaticWholeRun, fs.ToStaticWholeRun)
	}
	if ws.StaticCost == nil || fs.StaticCost == nil || *ws.StaticCost != *fs.StaticCost {
		t.Fatalf("against a fixed fleet as good %v and %v", deref(ws.StaticCost), deref(fs.StaticCost))
	}
	ws.ToClairvoyant, ws.ToClairvoyantWholeRun = nil, nil
	ws.ToStatic, fs.ToStatic, ws.ToStaticWholeRun, fs.ToStaticWholeRun, ws.StaticCost, fs.StaticCost = nil, nil, nil, nil, nil, nil // compared above
	if ws != fs {
		t.Fatalf("the planner's scores moved with the fleets alone:\n%+v\n%+v", ws, fs)
	}
	for i := range w.Static {
		a, b := *w.Static[i], *f.Static[i]
		a.ToClairvoyant, a.ToClairvoyantWholeRun = nil, nil
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("fixed fleet %d: with every reference %+v, alone %+v", i, a, b)
		}
	}
	out := t.TempDir()
	files, err := Write(fleets, out, "png")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "scoreboard.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || !bytes.Contains(md, []byte("Only the fixed fleets were run")) || !bytes.Contains(md, []byte("Static frontier (after")) ||
		bytes.Contains(md, []byte("Clairvoyant frontier")) || bytes.Contains(md, []byte("clairvoyant |")) || !bytes.Contains(md, []byte("| Δ static |")) {
		t.Fatalf("files %v; scoreboard.md, with the static frontier alone:\n%s", files, md)
	}
	raw, _ := json.Marshal(fleets)
	if !bytes.Contains(raw, []byte(`"aboveClairvoyant":null`)) || !bytes.Contains(raw, []byte(`"staticOnly":true`)) {
		t.Fatalf("with the fixed fleets alone: %s", raw)
	}
}

// plannerSuite reads a small suite of scaledObjects (a YAML list's
// items) on a bursty 20 minutes, 2 seeds and a small clairvoyant sweep,
// its pipelines set to pulse alone, and runs it with every reference.
func plannerSuite(t *testing.T, scaledObjects string) (*Suite, *Scoreboard) {
	t.Helper()
	body := `seeds: 2
profiles: [llama-3.1-8b-h100]
scaledObjects: [` + scaledObjects + `]
clairvoyant: {utilisations: [0.8, 1.5], windows: [30s]}
traces:
- name: bursty
  trace: bursts:base=1,peak=30,on=2m,off=6m,duration=20m,lengths=lognormal
`
	s, err := Read(miniSuite(t, body))
	if err != nil {
		t.Fatal(err)
	}
	s.Pipelines = []string{"pulse"}
	whole, _, err := s.Run("whole", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return s, whole
}

// TestAPipelineCheaperThanTheFamilyIsNotBounded: a signal pipeline that
// used fewer GPU-hours than every plan of the clairvoyant family has no
// distance to it; keeping any attainment, it is named as not bounded (it
// passed as bounded, and the scoreboard said the family bounded every
// pipeline), and one at 0 % is not.
func TestAPipelineCheaperThanTheFamilyIsNotBounded(t *testing.T) {
	above := 0.05
	c := &Case{Trace: "t", RateScale: 1, Profile: "p", ScaledObject: "so.yaml", Pipelines: []*Score{
		{Pipeline: "cheap", SLOAfterWarmup: 0.6, GPUHoursAfterWarmup: 0.1},
		{Pipeline: "idle", SLOAfterWarmup: 0, GPUHoursAfterWarmup: 0},
		{Pipeline: "above", SLOAfterWarmup: 0.99, GPUHoursAfterWarmup: 2, ToClairvoyant: &above},
		{Pipeline: "bounded", SLOAfterWarmup: 0.9, GPUHoursAfterWarmup: 2, ToClairvoyant: new(float64)},
	}}
	got := unbounded(c)
	want := []string{"t ×1 · p · so.yaml: cheap (below the family's cheapest plan)", "t ×1 · p · so.yaml: above"}
	if !slices.Equal(got, want) {
		t.Fatalf("not bounded: %q, want %q", got, want)
	}
}

// scored is a pipeline's score after the warm-up: g GPU-hours, slo
// attained.
func scored(pipeline string, g, slo float64) *Score {
	return &Score{Pipeline: pipeline, GPUHoursAfterWarmup: g, SLOAfterWarmup: slo}
}
