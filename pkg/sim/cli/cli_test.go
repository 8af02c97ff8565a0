package cli

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/sim"
)

const (
	shippedTrace = "../trace/testdata/azure-llm-2023-conv.csv"
	seedSO       = "../testdata/baseline-scaledobject.yaml"
)

func main(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestRunWritesTheReport: the documented command, on a bursty generated
// trace: the table, report.json with the documented fields, and a picture
// per pipeline plus the comparison.
func TestRunWritesTheReport(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := main(t, "--trace", "bursts:base=5,peak=40,on=2m,off=6m,duration=20m", "--scaledobject", seedSO,
		"--profile", "llama-3.1-8b-h100", "--pipelines", "pulse,prometheus,kaito,oracle", "--out", dir, "--seed", "3", "--ttft-slo", "3s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"pipeline", "SLO (≤3s)", "pulse", "prometheus", "kaito", "oracle", "report.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Pipelines []map[string]any `json:"pipelines"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Pipelines) != 4 {
		t.Fatalf("report.json: %v %d", err, len(doc.Pipelines))
	}
	for _, f := range []string{"pipeline", "requests", "ttftP50", "ttftP90", "ttftP99", "sloAttainment", "gpuHours", "maxReplicas",
		"scaleEvents", "reversals", "firstScaleUpSeconds", "dropped"} {
		if _, ok := doc.Pipelines[0][f]; !ok {
			t.Errorf("report.json lacks %s", f)
		}
	}
	for _, f := range []string{"pulse.png", "prometheus.png", "kaito.png", "oracle.png", "replicas.png"} {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil || img.Bounds().Dx() < 500 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestRunsAndSVG(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := main(t, "run", "--trace", "poisson:rate=20,duration=10m", "--scaledobject", seedSO, "--pipelines", "pulse",
		"--out", dir, "--runs", "3", "--format", "svg")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "mean of 3 seeds") {
		t.Errorf("output: %s", out)
	}
	var runs []Run
	raw, _ := os.ReadFile(filepath.Join(dir, "runs.json"))
	if err := json.Unmarshal(raw, &runs); err != nil || len(runs) != 3 || runs[2].Seed != 3 {
		t.Fatalf("runs.json: %v %+v", err, runs)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "pulse.svg")); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("pulse.svg: %v", err)
	}
}

// TestSeedsScoredOverDifferentWindowsAreRefused: a trace shorter than the
// default warm-up is scored whole, and a generated trace's seeds fell
// either side of it: --runs 6 averaged five seeds' scores after 10 minutes
// with one seed's whole run (its GPU-hours 30 times the others'), under
// the warm-up's label (found in a review, 2026-12-05). It is refused,
// saying so; a warm-up given that every seed passes is scored.
func TestSeedsScoredOverDifferentWindowsAreRefused(t *testing.T) {
	args := []string{"run", "--trace", "poisson:rate=0.03,duration=10m30s", "--scaledobject", seedSO, "--pipelines", "static:1", "--runs", "6", "--out", t.TempDir()}
	if code, _, errs := main(t, args...); code == 0 || !strings.Contains(errs, "scored after 600s") || !strings.Contains(errs, "after 0s") {
		t.Fatalf("exit %d: %s; want the seeds' warm-ups refused", code, errs)
	}
	if code, _, errs := main(t, append(args, "--warmup", "1m")...); code != 0 {
		t.Fatalf("with --warmup 1m: exit %d: %s", code, errs)
	}
	// tune's seeds likewise (it averaged them, and ranked by the mix).
	tuneArgs := []string{"tune", "--trace", "poisson:rate=0.03,duration=10m30s", "--scaledobject", seedSO,
		"--metrics", "running=64", "--scale-up", "1/60s", "--seeds", "6", "--out", t.TempDir()}
	if code, _, errs := main(t, tuneArgs...); code == 0 || !strings.Contains(errs, "scored after 600s") || !strings.Contains(errs, "after 0s") {
		t.Fatalf("tune: exit %d: %s; want the seeds' warm-ups refused", code, errs)
	}
}

// TestTuneMeetsATargetEverySeedMeets: six seeds of 100 % meet a target of
// 100 % (found in a review, 2026-12-07: each seed's score divided before
// the sum made 99.99999999999999 %, and no configuration met it). The
// seeds' mean is the benchmark's, rounded to 1e-4.
func TestTuneMeetsATargetEverySeedMeets(t *testing.T) {
	cands, out, _ := tune(t, 1, "--trace", "poisson:rate=2,duration=15m", "--scaledobject", seedSO,
		"--metrics", "running=64", "--scale-up", "1/60s", "--seeds", "6", "--target-slo", "1")
	if c := cands[0]; c.SLOAfterWarmup != 1 || !c.MeetsTarget {
		t.Fatalf("candidate %+v: want 100 %% after the warm-up, meeting a target of 100 %%\n%s", c, out)
	}
}

// tune runs pulse-sim tune with args into a new --out, and returns the n
// candidates of its tune.json, what it printed, and the --out.
func tune(t *testing.T, n int, args ...string) (cands []Candidate, out, dir string) {
	t.Helper()
	dir = t.TempDir()
	code, out, errs := main(t, append(append([]string{"tune"}, args...), "--out", dir)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "tune.json"))
	if err := json.Unmarshal(raw, &cands); err != nil || len(cands) != n {
		t.Fatalf("tune.json: %v, %d candidates; want %d", err, len(cands), n)
	}
	return cands, out, dir
}

func TestTunePrintsTheCheapestConfiguration(t *testing.T) {
	cands, out, dir := tune(t, 6, "--trace", "bursts:base=5,peak=40,on=2m,off=6m,duration=20m", "--scaledobject", seedSO,
		"--metrics", "waiting=5/20,kvCacheUsage=0.5", "--scale-up", "1/300s,4/15s", "--seeds", "2", "--target-slo", "0.5")
	tuned, err := os.ReadFile(filepath.Join(dir, "tuned-scaledobject.yaml"))
	if err != nil {
		t.Fatalf("no tuned ScaledObject: %v\n%s", err, out)
	}
	so, err := sim.ParseScaledObject(tuned)
	if err != nil {
		t.Fatal(err)
	}
	best := cands[0]
	md := so.PulseTrigger().Metadata
	up := so.Behavior().ScaleUp.Policies[0]
	if md["metric"] != best.Metric || md["scalerAddress"] == "" || up.Value != best.ScaleUpPods || up.PeriodSeconds != best.ScaleUpPeriod {
		t.Fatalf("tuned ScaledObject %v %+v does not match the best candidate %+v", md, up, best)
	}
	// Ranked as the benchmark scores: after the warm-up, to the last
	// arrival (the 10-minute drain after it not charged).
	for _, c := range cands {
		if c.MeetsTarget != (c.SLOAfterWarmup >= 0.5) || c.GPUHoursAfterWarmup <= 0 || c.GPUHoursAfterWarmup >= c.GPUHours {
			t.Fatalf("candidate %+v: want the target judged after the warm-up, and its GPU-hours to the last arrival below the whole run's", c)
		}
	}
	for _, c := range cands[1:] {
		if c.MeetsTarget && c.GPUHoursAfterWarmup < best.GPUHoursAfterWarmup {
			t.Fatalf("a cheaper candidate meets the target: %+v", c)
		}
	}
	if !strings.Contains(out, "cheapest configuration") || !strings.Contains(out, "kind: ScaledObject") {
		t.Errorf("output:\n%s", out)
	}
}

// TestTuneSuiteSweepsEachTraceAlone: tune --suite writes, for each trace ×
// profile of the suite, the sweep that tune on that trace alone (its rate
// scale for the profile, the suite's settings, its warm-up and warm start)
// writes as tune.json. (The suite's warm-up was left at the default's:
// the sweep ranked on other scores than the suite's bench.)
func TestTuneSuiteSweepsEachTraceAlone(t *testing.T) {
	dir := t.TempDir()
	suite := filepath.Join(dir, "suite.yaml")
	if err := os.WriteFile(suite, []byte(`seeds: 2
ttftSlo: 3s
warmup: 3m
copyJitter: 10s
profiles: [llama-3.1-8b-h100]
scaledObjects: [unused.yaml]
traces:
- name: burst
  trace: bursts:base=5,peak=40,on=2m,off=6m,duration=12m
- name: steps
  trace: steps:rates=4/12,step=5m
  rateScale: 2
`), 0o644); err != nil {
		t.Fatal(err)
	}
	grid := []string{"--scaledobject", seedSO, "--metrics", "waiting=5,running=64", "--scale-up", "1/300s,4/15s", "--seeds", "2", "--target-slo", "0.5"}
	out := filepath.Join(dir, "out")
	code, stdout, errs := main(t, append([]string{"tune", "--suite", suite, "--out", out}, grid...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, c := range []struct{ name, trace, scale string }{
		{"burst", "bursts:base=5,peak=40,on=2m,off=6m,duration=12m", "1"},
		{"steps", "steps:rates=4/12,step=5m", "2"},
	} {
		got, err := os.ReadFile(filepath.Join(out, c.name+"-llama-3.1-8b-h100.json"))
		if err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		alone := filepath.Join(dir, c.name)
		code, _, errs := main(t, append([]string{"tune", "--trace", c.trace, "--rate-scale", c.scale, "--ttft-slo", "3s", "--warmup", "3m", "--copy-jitter", "10s", "--warm-start", "--out", alone}, grid...)...)
		if code != 0 {
			t.Fatalf("%s alone: exit %d: %s", c.name, code, errs)
		}
		want, _ := os.ReadFile(filepath.Join(alone, "tune.json"))
		var cands []Candidate
		if err := json.Unmarshal(got, &cands); err != nil || len(cands) != 4 {
			t.Fatalf("%s: %v, %d candidates", c.name, err, len(cands))
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the suite's sweep differs from the trace's alone:\n%s\n%s", c.name, got, want)
		}
		if !strings.Contains(stdout, c.name+" ×"+c.scale+" · llama-3.1-8b-h100: ") {
			t.Errorf("no line for %s:\n%s", c.name, stdout)
		}
	}
}

func TestBadUsageIsClear(t *testing.T) {
	for name, args := range map[string][]string{
		"no trace":                        {"--scaledobject", seedSO},
		"bad rate-scale":                  {"--trace", shippedTrace, "--scaledobject", seedSO, "--rate-scale", "0"},
		"unknown flag":                    {"--trace", shippedTrace, "--colour"},
		"unknown command":                 {"simulate"},
		"bad profile":                     {"--trace", "poisson:rate=1,duration=1m", "--scaledobject", seedSO, "--profile", "gpt-9", "--out", t.TempDir()},
		"bad grid":                        {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--metrics", "waiting"},
		"bad lengths":                     {"--trace", shippedTrace, "--scaledobject", seedSO, "--copy-lengths", "longer"},
		"bad timeout":                     {"--trace", shippedTrace, "--scaledobject", seedSO, "--client-timeout", "-1s"},
		"bench no suite":                  {"bench"},
		"tune suite and trace":            {"tune", "--suite", "../../../docs/simulation/suite.yaml", "--trace", shippedTrace, "--scaledobject", seedSO},
		"tune bad suite":                  {"tune", "--suite", "no-such-suite.yaml", "--scaledobject", seedSO},
		"tune suite and initial replicas": {"tune", "--suite", "../../../docs/simulation/suite.yaml", "--initial-replicas", "2", "--scaledobject", seedSO},
		"bench bad suite":                 {"bench", "--suite", "no-such-suite.yaml"},
		// NaN and infinite rate scales panicked; 1e12 ran out of memory.
		"NaN rate-scale":       {"--trace", shippedTrace, "--scaledobject", seedSO, "--rate-scale", "NaN"},
		"huge rate-scale":      {"--trace", shippedTrace, "--scaledobject", seedSO, "--rate-scale", "1e12"},
		"NaN target":           {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--target-slo", "NaN"},
		"NaN threshold":        {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--metrics", "waiting=NaN"},
		"fractional period":    {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--scale-up", "1/1.5s"},
		"tune too many seeds":  {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--seeds", "1000"},
		"bench too many seeds": {"bench", "--suite", "../../../docs/simulation/suite.yaml", "--seeds", "1000"},
	} {
		code, _, errs := main(t, args...)
		if code == 0 || !strings.HasPrefix(errs, "pulse-sim:") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%s: exit %d, %q: want one line", name, code, errs)
		}
		// Refused before any run, by the flag, not by the run it would
		// start (the suite's warm start beside it).
		if name == "tune suite and initial replicas" && !strings.Contains(errs, "--initial-replicas: --suite sets it") {
			t.Errorf("%s: %q, want the flag refused beside --suite", name, errs)
		}
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	code, _, errs := main(t, "--help")
	for _, f := range []string{"-rate-scale", "-ttft-slo", "-initial-replicas", "-warm-start", "-warmup", "-copy-jitter", "-copy-lengths", "-client-timeout"} {
		if code != 0 || !strings.Contains(errs, f) {
			t.Fatalf("exit %d, no %s:\n%s", code, f, errs)
		}
	}
	if !strings.Contains(errs, "tune (sweep") || !strings.Contains(errs, "bench (run a suite") || !strings.Contains(errs, "-max-window") {
		t.Fatalf("--help names neither the other commands nor --max-window:\n%s", errs)
	}
	code, _, errs = main(t, "bench", "--help")
	if code != 0 || !strings.Contains(errs, "-suite") || !strings.Contains(errs, "-seeds") {
		t.Fatalf("bench --help: exit %d:\n%s", code, errs)
	}
}

// TestRunWithReferencesAndNewFlags: the references, warm-up scores and
// means with one decimal, with the new flags.
func TestRunWithReferencesAndNewFlags(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := main(t, "--trace", "../trace/testdata/mooncake-synthetic.jsonl", "--scaledobject", seedSO,
		"--pipelines", "pulse,static:2,clairvoyant:utilisation=0.8", "--out", dir, "--runs", "2", "--initial-replicas", "2",
		"--warmup", "5m", "--client-timeout", "60s", "--balancer", "gateway", "--rate-scale", "1.5", "--copy-jitter", "20s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"SLO after 5m", "goodput/GPU-h", "abandoned", "static:2", "clairvoyant:utilisation=0.8", "static-2.png"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// scale events are means over 2 seeds: one decimal.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "pulse ") && !strings.Contains(line, ".0 ") && !strings.Contains(line, ".5 ") {
			t.Errorf("a mean without its decimal: %q", line)
		}
	}
	var doc struct {
		Config    map[string]any   `json:"config"`
		Pipelines []map[string]any `json:"pipelines"`
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "report.json"))
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Pipelines) != 3 {
		t.Fatalf("report.json: %v", err)
	}
	for _, f := range []string{"sloAfterWarmup", "gpuHoursAfterWarmup", "goodputPerGpuHour", "abandoned"} {
		if _, ok := doc.Pipelines[0][f]; !ok {
			t.Errorf("report.json lacks %s", f)
		}
	}
	if doc.Config["warmupSeconds"] != 300.0 || doc.Config["clientTimeoutSeconds"] != 60.0 {
		t.Errorf("config %v", doc.Config)
	}
}

// TestBenchCommand: pulse-sim bench runs a suite and writes the scoreboard.
func TestBenchCommand(t *testing.T) {
	dir := t.TempDir()
	so, _ := filepath.Abs(seedSO)
	suite := filepath.Join(dir, "suite.yaml")
	body := "seeds: 3\nprofiles: [llama-3.1-8b-h100]\nscaledObjects: [" + so + "]\npipelines: [pulse, prometheus]\n" +
		"clairvoyant: {utilisations: [0.7, 1.2], windows: [30s]}\ntraces: [{name: steps, trace: 'steps:rates=2/20/2,step=8m'}]\n"
	if err := os.WriteFile(suite, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := main(t, "bench", "--suite", suite, "--out", filepath.Join(dir, "out"), "--seeds", "1", "--format", "svg")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "1 seeds in") || !strings.Contains(out, "scoreboard.md") {
		t.Errorf("output:\n%s", out)
	}
	var sb struct {
		Seeds []int `json:"seeds"`
		Cases []struct {
			Pipelines []struct{ Pipeline string } `json:"pipelines"`
		} `json:"cases"`
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "out", "scoreboard.json"))
	if err := json.Unmarshal(raw, &sb); err != nil || len(sb.Seeds) != 1 || len(sb.Cases) != 1 || len(sb.Cases[0].Pipelines) != 2 {
		t.Fatalf("scoreboard.json: %v %+v", err, sb)
	}
	// --pipelines is split as run's is (a plan's parameters and spaces
	// kept with it), and a reference among them, or none, refused.
	for list, want := range map[string]string{
		"pulse, static:2": "static:2 is added by the suite itself",
		" , ":             "pipelines: none named",
	} {
		if code, _, errs := main(t, "bench", "--suite", suite, "--out", filepath.Join(dir, "bad"), "--pipelines", list); code == 0 || !strings.Contains(errs, want) {
			t.Fatalf("--pipelines %q: exit %d: %s", list, code, errs)
		}
	}
	// A metric no ScaledObject asks for (a typo) is refused, not 0 cases.
	if code, _, errs := main(t, "bench", "--suite", suite, "--out", filepath.Join(dir, "none"), "--references=false", "--metric", "replicas"); code == 0 || !strings.Contains(errs, `no ScaledObject of the suite asks for metric "replicas"`) {
		t.Fatalf("--metric replicas: exit %d: %s", code, errs)
	}
	// The pipelines given, alone, of the ScaledObjects of the metric given:
	// the suite's one asks for waiting.
	aloneDir := filepath.Join(dir, "alone")
	code, _, errs = main(t, "bench", "--suite", suite, "--out", aloneDir, "--seeds", "1", "--references=false", "--pipelines", "prometheus, hindsight:utilisation=1.5,window=1m", "--metric", "waiting")
	if code != 0 {
		t.Fatalf("--metric waiting: exit %d: %s", code, errs)
	}
	var alone struct {
		NoReferences bool `json:"noReferences"`
		Cases        []struct {
			Pipelines []struct{ Pipeline string } `json:"pipelines"`
			Static    []struct{ Pipeline string } `json:"static"`
		} `json:"cases"`
	}
	raw, _ = os.ReadFile(filepath.Join(aloneDir, "scoreboard.json"))
	if err := json.Unmarshal(raw, &alone); err != nil || !alone.NoReferences || len(alone.Cases) != 1 {
		t.Fatalf("--metric waiting: scoreboard.json: %v %+v, want 1 case", err, alone)
	}
	if c := alone.Cases[0]; len(c.Pipelines) != 2 || c.Pipelines[0].Pipeline != "prometheus" || c.Pipelines[1].Pipeline != "hindsight:utilisation=1.5,window=1m" || len(c.Static) != 0 {
		t.Fatalf("--metric waiting: %+v, want prometheus and the hindsight plan alone", c)
	}
	// The fixed fleets alone of the references, and a value that is none
	// of the three refused.
	fleetsDir := filepath.Join(dir, "fleets")
	// The flag takes its value after a space too.
	if code, _, errs := main(t, "bench", "--suite", suite, "--out", fleetsDir, "--seeds", "1", "--references", "static", "--pipelines", "prometheus"); code != 0 {
		t.Fatalf("--references=static: exit %d: %s", code, errs)
	}
	var fleets struct {
		StaticOnly bool `json:"staticOnly"`
		Cases      []struct {
			Static              []struct{ Pipeline string } `json:"static"`
			Clairvoyant         []struct{ Pipeline string } `json:"clairvoyant"`
			ClairvoyantFrontier []struct{ Pipeline string } `json:"clairvoyantFrontier"`
			Pipelines           []struct {
				Pipeline      string   `json:"pipeline"`
				ToStatic      *float64 `json:"toStatic"`
				ToClairvoyant *float64 `json:"toClairvoyant"`
			} `json:"pipelines"`
		} `json:"cases"`
	}
	raw, _ = os.ReadFile(filepath.Join(fleetsDir, "scoreboard.json"))
	if err := json.Unmarshal(raw, &fleets); err != nil || !fleets.StaticOnly || len(fleets.Cases) != 1 {
		t.Fatalf("--references=static: scoreboard.json: %v %+v", err, fleets)
	}
	if c := fleets.Cases[0]; len(c.Static) == 0 || len(c.Clairvoyant)+len(c.ClairvoyantFrontier) != 0 || len(c.Pipelines) != 1 ||
		c.Pipelines[0].Pipeline != "prometheus" || c.Pipelines[0].ToStatic == nil || c.Pipelines[0].ToClairvoyant != nil {
		t.Fatalf("--references static: %+v, want the fixed fleets, the pipeline, its distance to the fleets and none to the clairvoyant", c)
	}
	// The boolean flag's other spellings still read.
	if code, _, errs := main(t, "bench", "--suite", suite, "--out", filepath.Join(dir, "f"), "--seeds", "1", "--references=0", "--pipelines", "prometheus"); code != 0 {
		t.Fatalf("--references=0: exit %d: %s", code, errs)
	}
	if code, _, errs := main(t, "bench", "--suite", suite, "--out", filepath.Join(dir, "maybe"), "--references=maybe"); code == 0 || !strings.Contains(errs, `"maybe": true, false or static`) {
		t.Fatalf("--references=maybe: exit %d: %s", code, errs)
	}
}

func TestVersion(t *testing.T) {
	if code, out, _ := main(t, "--version"); code != 0 || !strings.HasPrefix(out, "pulse-sim ") {
		t.Fatalf("exit %d, %q", code, out)
	}
}

// TestWindowLimitIsTheAggregators: a trigger window the aggregator refuses
// (over its --max-window, 1m by default) is refused by pulse-sim with the
// same message; --max-window simulates an aggregator that allows it.
func TestWindowLimitIsTheAggregators(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile(seedSO)
	if err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "so.yaml")
	if err := os.WriteFile(so, []byte(strings.Replace(string(raw), `threshold: "10"`, `threshold: "10"
      window: 2m`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--trace", "poisson:rate=2,duration=12m", "--scaledobject", so, "--pipelines", "pulse", "--out", dir}
	code, _, errs := main(t, args...)
	if code == 0 || !strings.Contains(errs, "window") || !strings.Contains(errs, "1m0s") {
		t.Fatalf("window 2m: exit %d, %q; want the aggregator's refusal naming its 1m limit", code, errs)
	}
	if code, _, errs := main(t, append(args, "--max-window", "5m")...); code != 0 {
		t.Fatalf("window 2m with --max-window 5m: exit %d, %s", code, errs)
	}
}

// TestAPipelinesParametersAreOnePipeline: --pipelines is comma-separated,
// and so are a clairvoyant or hindsight plan's parameters, as the flag's
// help writes them; "clairvoyant:utilisation=1,window=10s" was refused as
// a pipeline named "window=10s".
func TestAPipelinesParametersAreOnePipeline(t *testing.T) {
	got := splitPipelines("pulse, clairvoyant:utilisation=1,window=10s,hold=5m,static:2,hindsight:window=1m,utilisation=0.9")
	want := []string{"pulse", "clairvoyant:utilisation=1,window=10s,hold=5m", "static:2", "hindsight:window=1m,utilisation=0.9"}
	if !slices.Equal(got, want) {
		t.Fatalf("split %q, want %q", got, want)
	}
	code, out, errs := main(t, "--trace", "steps:rates=2/4,step=4m", "--scaledobject", seedSO,
		"--pipelines", "clairvoyant:utilisation=1,window=10s", "--out", t.TempDir())
	if code != 0 || !strings.Contains(out, "clairvoyant:utilisation=1,window=10s") {
		t.Fatalf("a clairvoyant plan with two parameters: exit %d: %s%s", code, out, errs)
	}
}
