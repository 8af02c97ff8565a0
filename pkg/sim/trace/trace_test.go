package trace

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadTheShippedAzureTrace(t *testing.T) {
	reqs, err := Load("testdata/azure-llm-2023-conv.csv", 1)
	if err != nil {
		t.Fatal(err)
	}
	// The README's facts: 19,366 requests over an hour, 5.5/s, mean 1,155
	// prompt and 211 generated tokens.
	if len(reqs) != 19366 {
		t.Fatalf("%d requests", len(reqs))
	}
	span := reqs[len(reqs)-1].At
	var p, o float64
	for i, r := range reqs {
		p += float64(r.Prompt)
		o += float64(r.Output)
		if i > 0 && r.At < reqs[i-1].At {
			t.Fatal("not in time order")
		}
	}
	n := float64(len(reqs))
	if span < 58*time.Minute || span > time.Hour || math.Abs(n/span.Seconds()-5.5) > 0.1 ||
		math.Abs(p/n-1155) > 1 || math.Abs(o/n-211) > 1 {
		t.Fatalf("span %s, %.2f/s, prompt %.0f, output %.0f", span, n/span.Seconds(), p/n, o/n)
	}
	if reqs[0].At != 0 || reqs[1].At != 4314579*time.Microsecond {
		t.Fatalf("first offsets %v %v", reqs[0].At, reqs[1].At)
	}
}

func TestBadTracesAreRefusedClearly(t *testing.T) {
	for name, body := range map[string]string{
		"header":    "time,prompt,output\n",
		"bad row":   "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,1\n",
		"negative":  "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-1,1\n",
		"no rows":   "TIMESTAMP,ContextTokens,GeneratedTokens\n",
		"bad field": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16,1\n",
	} {
		if _, err := ReadAzure(strings.NewReader(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Load("poisson:rate=x", 1); err == nil || !strings.Contains(err.Error(), "rate") {
		t.Errorf("bad generator: %v", err)
	}
	if _, err := Load("poisson:rate=1,colour=red", 1); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("unknown key: %v", err)
	}
	if _, err := Load("no-such-file.csv", 1); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestGenerators(t *testing.T) {
	reqs, err := Load("poisson:rate=20,duration=10m", 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := float64(len(reqs)) / 600; math.Abs(got-20) > 1 {
		t.Fatalf("poisson: %.2f/s, want 20", got)
	}
	again, _ := Load("poisson:rate=20,duration=10m", 7)
	if len(again) != len(reqs) || again[100] != reqs[100] {
		t.Fatal("the same seed gave another trace")
	}
	steps, err := Load("steps:rates=5/40/5,step=10m,prompt=100,output=10", 1)
	if err != nil {
		t.Fatal(err)
	}
	r := Rate(steps, 10*time.Minute)
	if len(r) != 3 || math.Abs(r[0]-5) > 0.5 || math.Abs(r[1]-40) > 2 || math.Abs(r[2]-5) > 0.5 || steps[0].Prompt != 100 {
		t.Fatalf("steps: rates %v", r)
	}
	bursts, err := Load("bursts:base=2,peak=30,on=1m,off=4m,duration=10m", 1)
	if err != nil {
		t.Fatal(err)
	}
	r = Rate(bursts, time.Minute)
	if r[0] > 5 || r[4] < 20 || r[9] < 20 {
		t.Fatalf("bursts: per-minute rates %v", r)
	}
}

func TestDensifyKeepsTheShape(t *testing.T) {
	reqs, _ := Load("testdata/azure-llm-2023-conv.csv", 1)
	dense := Densify(reqs, 4.5, 3)
	if got := float64(len(dense)) / float64(len(reqs)); math.Abs(got-4.5) > 0.05 {
		t.Fatalf("densified by %.2f, want 4.5", got)
	}
	a, b := Rate(reqs, time.Minute), Rate(dense, time.Minute)
	for i := range a {
		if math.Abs(b[i]-4.5*a[i]) > 0.25*4.5*a[i]+1 {
			t.Fatalf("minute %d: %.1f/s, want about 4.5 x %.1f", i, b[i], a[i])
		}
	}
}

func TestName(t *testing.T) {
	for spec, want := range map[string]string{
		"steps:rates=5/60,step=5m":         "steps:rates=5/60,step=5m",
		"poisson:rate=20,duration=1h":      "poisson:rate=20,duration=1h",
		"pkg/sim/trace/testdata/azure.csv": "azure.csv",
		"/data/c:/weird/name.csv":          "name.csv",
	} {
		if got := Name(spec); got != want {
			t.Errorf("Name(%q) = %q, want %q", spec, got, want)
		}
	}
}
