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
	// A bad row's number is its line's, blank lines counted; a JSONL
	// trace may start with a byte-order mark, as a CSV one may (found in
	// a review, 2026-12-05: "line 2" for line 4; the mark refused as
	// "invalid character 'ï'").
	_, err := ReadAzure(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n\n\n2023-11-16 18:15:46.68,abc,20\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "line 4:") {
		t.Errorf("a bad row on line 4: %v", err)
	}
	if reqs, err := ReadMooncake(strings.NewReader("\ufeff{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5}\n")); err != nil || len(reqs) != 1 {
		t.Errorf("a JSONL trace with a byte-order mark: %d requests, %v", len(reqs), err)
	}
	// A key given twice: the last was taken (found in a review, 2026-12-05).
	if _, err := Load("poisson:rate=5,duration=1h,rate=6", 1); err == nil || !strings.Contains(err.Error(), "rate given twice") {
		t.Errorf("a key given twice: %v", err)
	}
	if _, err := Load("no-such-file.csv", 1); err == nil {
		t.Error("a missing file loaded")
	}
}

// TestTracesPastTheBoundsAreRefusedFirst: NaN or infinite rates hung a
// generator for ever (or panicked, as a step's rate); token counts that
// overflowed an int, a span of years and a generator of billions of
// requests ran out of memory or for days of virtual time; 200,000 bad
// rows in a row were each listed. Each is refused first, saying why.
func TestTracesPastTheBoundsAreRefusedFirst(t *testing.T) {
	const head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for spec, want := range map[string]string{
		"poisson:rate=NaN,duration=10m":    "rate: want a number",
		"poisson:rate=Inf,duration=10m":    "rate: want a number",
		"ramp:from=1,to=Inf,duration=10m":  "to: want a number",
		"steps:rates=1/NaN,step=5m":        "rates: \"NaN\" is not a rate",
		"poisson:rate=1,sigma=NaN":         "sigma",
		"poisson:rate=1,duration=100000h":  "past the 168h0m0s a trace may span",
		"steps:rates=1/2,step=2000000h":    "past the 168h0m0s a trace may span",
		"poisson:rate=1e7,duration=1h":     "past the 10000000 a trace may have",
		"poisson:rate=1,prompt=1000000000": "prompt: want a whole number from 1 to 16777216",
	} {
		if _, err := Load(spec, 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", spec, err, want)
		}
	}
	for name, c := range map[string]struct{ body, want string }{
		"tokens past an int": {head + "2023-11-16 18:15:46.6805900,4611686018427387904,4611686018427387904\n", "0 to 16777216"},
		"two years":          {head + "2023-11-16 18:15:46.6805900,1,1\n2025-11-16 18:15:46.6805900,1,1\n", "past the 168h0m0s a trace may span"},
		"many bad rows":      {head + strings.Repeat("2023-11-16 18:15:46.6805900,x,1\n", 1000), "the listing stops at 21 bad lines"},
	} {
		_, err := ReadAzure(strings.NewReader(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Count(err.Error(), "\n") > 30 {
			t.Errorf("%s: %v, want at most a few lines saying %q", name, err, c.want)
		}
	}
	if _, err := ReadMooncake(strings.NewReader("{\"timestamp\": 1e13, \"input_length\": 1, \"output_length\": 1}\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a timestamp of 1e13 ms: %v", err)
	}
	for _, c := range []struct {
		n     int
		scale float64
		ok    bool
	}{{1000, 2, true}, {1000, math.NaN(), false}, {1000, math.Inf(1), false}, {1000, 0, false}, {1000, 1e12, false}} {
		if err := CheckScale(c.n, c.scale); (err == nil) != c.ok {
			t.Errorf("CheckScale(%d, %v): %v", c.n, c.scale, err)
		}
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

func TestReadTheShippedMooncakeTrace(t *testing.T) {
	reqs, err := Load("testdata/mooncake-synthetic.jsonl", 1)
	if err != nil {
		t.Fatal(err)
	}
	// The README's facts: 3,993 requests over 17 minutes, mean 15,325
	// prompt and 149 generated tokens.
	var p, o float64
	for _, r := range reqs {
		p += float64(r.Prompt)
		o += float64(r.Output)
	}
	n := float64(len(reqs))
	span := reqs[len(reqs)-1].At
	if len(reqs) != 3993 || span < 16*time.Minute || span > 18*time.Minute || math.Abs(p/n-15325) > 1 || math.Abs(o/n-149) > 1 {
		t.Fatalf("%d requests over %s, prompt %.0f, output %.0f", len(reqs), span, p/n, o/n)
	}
	if reqs[0].At != 0 || reqs[0].Prompt != 40160 || reqs[2].At != 40*time.Millisecond {
		t.Fatalf("first requests %+v %+v", reqs[0], reqs[2])
	}
}

func TestBadMooncakeLinesAreRefusedClearly(t *testing.T) {
	for name, body := range map[string]string{
		"not json":  "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\nnope\n",
		"missing":   "{\"timestamp\": 0, \"input_length\": 1}\n",
		"negative":  "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1}\n",
		"no lines":  "\n\n",
		"bad field": "{\"timestamp\": \"soon\", \"input_length\": 1, \"output_length\": 1}\n",
	} {
		_, err := ReadMooncake(strings.NewReader(body))
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if name != "no lines" && !strings.Contains(err.Error(), "line ") {
			t.Errorf("%s: %v does not name the line", name, err)
		}
	}
}

func TestShapesAndLengthMixes(t *testing.T) {
	ramp, err := Load("ramp:from=2,to=20,duration=30m,prompt=100,output=10", 1)
	if err != nil {
		t.Fatal(err)
	}
	r := Rate(ramp, 10*time.Minute)
	if len(r) != 3 || !(r[0] < r[1] && r[1] < r[2]) || math.Abs(r[0]-5) > 1 || math.Abs(r[2]-17) > 1.5 {
		t.Fatalf("ramp: rates %v", r)
	}
	day, err := Load("diurnal:min=1,max=21,duration=1h", 2)
	if err != nil {
		t.Fatal(err)
	}
	r = Rate(day, 15*time.Minute)
	if len(r) != 4 || r[0] > 8 || r[3] > 8 || r[1] < 12 || r[2] < 12 {
		t.Fatalf("diurnal: quarter-hour rates %v, want low, high, high, low", r)
	}
	mix, err := Load("poisson:rate=20,duration=30m,prompt=12000,output=300,lengths=lognormal,sigma=1", 3)
	if err != nil {
		t.Fatal(err)
	}
	var p, o float64
	distinct := map[int]bool{}
	for _, q := range mix {
		p += float64(q.Prompt)
		o += float64(q.Output)
		distinct[q.Prompt] = true
		if q.Prompt < 1 || q.Output < 1 {
			t.Fatalf("a length below 1: %+v", q)
		}
	}
	n := float64(len(mix))
	if math.Abs(p/n-12000) > 600 || math.Abs(o/n-300) > 15 || len(distinct) < len(mix)/2 {
		t.Fatalf("lognormal: mean prompt %.0f (want 12000), output %.0f (want 300), %d distinct prompts of %d", p/n, o/n, len(distinct), len(mix))
	}
	for spec, want := range map[string]string{
		"poisson:rate=1,lengths=uniform": "lengths",
		"poisson:rate=1,sigma=0":         "sigma",
		"ramp:from=1":                    "to is required",
		"diurnal:min=1,max=x":            "max",
	} {
		if _, err := Load(spec, 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", spec, err, want)
		}
	}
}

func TestCopiesSpreadAndResample(t *testing.T) {
	reqs, _ := Load("testdata/azure-llm-2023-conv.csv", 1)
	dense := DensifyWith(reqs, 4, 3, Copies{Jitter: time.Minute, Resample: true})
	if len(dense) != 4*len(reqs) {
		t.Fatalf("%d requests, want %d", len(dense), 4*len(reqs))
	}
	// The per-5-minute shape is kept; lengths come from the trace's own.
	a, b := Rate(reqs, 5*time.Minute), Rate(dense, 5*time.Minute)
	for i := range a {
		if math.Abs(b[i]-4*a[i]) > 0.15*4*a[i]+1 {
			t.Fatalf("5 minutes %d: %.1f/s, want about 4 x %.1f", i, b[i], a[i])
		}
	}
	lengths := map[[2]int]bool{}
	for _, r := range reqs {
		lengths[[2]int{r.Prompt, r.Output}] = true
	}
	for _, r := range dense {
		if !lengths[[2]int{r.Prompt, r.Output}] {
			t.Fatalf("a copy's lengths %d/%d are no request's of the trace", r.Prompt, r.Output)
		}
	}
	// Copies are not in lockstep: one request every 10 s, ×4: coherent
	// copies land in their original's second (4 a second), spread ones
	// over the minute around it.
	var even []Request
	for i := range 360 {
		even = append(even, Request{At: time.Duration(i) * 10 * time.Second, Prompt: 1, Output: 1})
	}
	if bc, bd := bunching(Densify(even, 4, 3)), bunching(DensifyWith(even, 4, 3, Copies{Jitter: time.Minute})); bc < 3 || bd > 2 {
		t.Fatalf("requests sharing their second: coherent %.2f (want about 4), spread %.2f (want under 2)", bc, bd)
	}
}

// bunching is the mean, over requests, of how many requests share their
// second (Σ count² / N).
func bunching(reqs []Request) float64 {
	per := map[time.Duration]int{}
	for _, r := range reqs {
		per[r.At/time.Second]++
	}
	s := 0.0
	for _, c := range per {
		s += float64(c * c)
	}
	return s / float64(len(reqs))
}

// TestJitteredCopiesAreNotPiledAtTheEnds: copies the jitter placed outside
// the trace's span were clamped onto its first and last instants (on the
// Azure hour at 6×, about a hundred requests at one instant, a burst only
// the clairvoyant saw coming). They are reflected into the span.
func TestJitteredCopiesAreNotPiledAtTheEnds(t *testing.T) {
	var reqs []Request
	for i := range 600 {
		reqs = append(reqs, Request{At: time.Duration(i) * time.Second, Prompt: 100, Output: 10})
	}
	// A jitter longer than the span (100 hours on ten minutes) is folded
	// in as often as it takes: reflected once and clamped, it piled most
	// copies on the span's ends (found in a review, 2026-12-05).
	for _, jitter := range []time.Duration{30 * time.Second, 100 * time.Hour} {
		out := DensifyWith(reqs, 6, 1, Copies{Jitter: jitter})
		end := reqs[len(reqs)-1].At
		atEnds := 0
		for _, r := range out {
			if r.At < 0 || r.At > end {
				t.Fatalf("jitter %s: a copy at %s, outside the span [0, %s]", jitter, r.At, end)
			}
			if r.At == 0 || r.At == end {
				atEnds++
			}
		}
		if atEnds > 4 { // the two originals there, and a copy landing exactly on one at most by chance
			t.Fatalf("jitter %s: %d requests at the span's first or last instant, want the two originals", jitter, atEnds)
		}
	}
}

// TestBurstsShorterThanASecond: the thinning's peak was the rate at whole
// seconds, and an "on" phase that holds no whole second was never seen:
// bursts of 500 ms were generated at the base rate. Steps shorter than a
// second the same.
func TestBurstsShorterThanASecond(t *testing.T) {
	reqs, err := Generate("bursts", "base=1,peak=20,on=500ms,off=1500ms,duration=10m", 1)
	if err != nil {
		t.Fatal(err)
	}
	// A quarter of the time at 20, the rest at 1: 5.75 a second.
	if got := float64(len(reqs)) / 600; got < 5.2 || got > 6.3 {
		t.Fatalf("%.2f requests a second, want about 5.75", got)
	}
	steps, err := Generate("steps", "rates=1/20,step=500ms", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) < 3 {
		t.Fatalf("steps of 500 ms at 1 and 20 a second: %d requests, want about 10", len(steps))
	}
}

// TestAMixThatChangesByStep: a steps generator's prompts= and outputs=
// give each step its own means (a new use coming to a model at a constant
// request rate), the one not given the prompt or output key's; a list of
// another length than the rates', a bad length, or both keys for one
// length are refused.
func TestAMixThatChangesByStep(t *testing.T) {
	reqs, err := Load("steps:rates=5/5/5,step=10m,prompts=100/4000/100,output=30", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		want := 100
		if r.At >= 10*time.Minute && r.At < 20*time.Minute {
			want = 4000
		}
		if r.Prompt != want || r.Output != 30 {
			t.Fatalf("at %s: prompt %d output %d, want %d and 30", r.At, r.Prompt, r.Output, want)
		}
	}
	mix, err := Load("steps:rates=20/20,step=15m,prompts=500/8000,outputs=600/100,lengths=lognormal", 2)
	if err != nil {
		t.Fatal(err)
	}
	var sum [2][2]float64
	var n [2]float64
	for _, r := range mix {
		i := int(r.At / (15 * time.Minute))
		sum[i][0] += float64(r.Prompt)
		sum[i][1] += float64(r.Output)
		n[i]++
	}
	for i, want := range [2][2]float64{{500, 600}, {8000, 100}} {
		p, o := sum[i][0]/n[i], sum[i][1]/n[i]
		if math.Abs(p-want[0]) > want[0]/10 || math.Abs(o-want[1]) > want[1]/10 {
			t.Errorf("step %d: mean prompt %.0f and output %.0f, want %.0f and %.0f", i, p, o, want[0], want[1])
		}
	}
	same, err := Load("steps:rates=5/5,step=10m,prompt=700,output=70", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range same {
		if r.Prompt != 700 || r.Output != 70 {
			t.Fatalf("without the lists: prompt %d output %d", r.Prompt, r.Output)
		}
	}
	for spec, want := range map[string]string{
		"steps:rates=5/5,prompts=100":             "1 lengths for 2 steps",
		"steps:rates=5/5,outputs=100/x":           `"x" is not a whole number`,
		"steps:rates=5/5,outputs=100/0":           `"0" is not a whole number`,
		"steps:rates=5/5,prompt=9,prompts=100/10": "prompt and prompts: give one",
		"poisson:rate=5,prompts=100":              `unknown key "prompts"`,
	} {
		if _, err := Load(spec, 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", spec, err, want)
		}
	}
}
