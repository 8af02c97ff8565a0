package cli

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
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

func TestTunePrintsTheCheapestConfiguration(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := main(t, "tune", "--trace", "bursts:base=5,peak=40,on=2m,off=6m,duration=20m", "--scaledobject", seedSO,
		"--metrics", "waiting=5/20,kvCacheUsage=0.5", "--scale-up", "1/300s,4/15s", "--seeds", "2", "--target-slo", "0.5", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var cands []Candidate
	raw, _ := os.ReadFile(filepath.Join(dir, "tune.json"))
	if err := json.Unmarshal(raw, &cands); err != nil || len(cands) != 6 {
		t.Fatalf("tune.json: %v, %d candidates", err, len(cands))
	}
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
	for _, c := range cands[1:] {
		if c.MeetsTarget && c.GPUHours < best.GPUHours {
			t.Fatalf("a cheaper candidate meets the target: %+v", c)
		}
	}
	if !strings.Contains(out, "cheapest configuration") || !strings.Contains(out, "kind: ScaledObject") {
		t.Errorf("output:\n%s", out)
	}
}

func TestBadUsageIsClear(t *testing.T) {
	for name, args := range map[string][]string{
		"no trace":        {"--scaledobject", seedSO},
		"bad rate-scale":  {"--trace", shippedTrace, "--scaledobject", seedSO, "--rate-scale", "0"},
		"unknown flag":    {"--trace", shippedTrace, "--colour"},
		"unknown command": {"simulate"},
		"bad profile":     {"--trace", "poisson:rate=1,duration=1m", "--scaledobject", seedSO, "--profile", "gpt-9", "--out", t.TempDir()},
		"bad grid":        {"tune", "--trace", shippedTrace, "--scaledobject", seedSO, "--metrics", "waiting"},
	} {
		code, _, errs := main(t, args...)
		if code == 0 || !strings.HasPrefix(errs, "pulse-sim:") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%s: exit %d, %q: want one line", name, code, errs)
		}
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	code, _, errs := main(t, "--help")
	if code != 0 || !strings.Contains(errs, "-rate-scale") || !strings.Contains(errs, "-ttft-slo") {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
}
