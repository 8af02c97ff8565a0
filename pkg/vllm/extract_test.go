package vllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/test/vllmsim"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// named turns a page into name → value for golden files and comparisons.
func named(p Page, extras []ExtraMetric) map[string]float64 {
	out := map[string]float64{}
	for id := metric.ID(1); id < metric.NumIDs; id++ {
		if v, ok := p.Get(id); ok {
			out[id.Name()] = v
		}
	}
	for i, x := range extras {
		if !math.IsNaN(p.Extra[i]) {
			out["extra:"+x.Name] = p.Extra[i]
		}
	}
	if p.Hist != nil {
		for h := range p.Hist {
			b := &p.Hist[h]
			for i := range b.Bounds {
				out[fmt.Sprintf("hist:%s{le=%g}", metric.Hist(h).Name(), b.Bounds[i])] = b.Counts[i]
			}
		}
	}
	return out
}

func newExtractor(t testing.TB, extras ...string) *Extractor {
	t.Helper()
	var xs []ExtraMetric
	for _, s := range extras {
		x, err := ParseExtraMetric(s)
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	e, err := NewExtractor(xs, WithHistograms())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func simPage(opts vllmsim.Options, setup func(*vllmsim.Server), openMetrics bool) []byte {
	s := vllmsim.New(opts)
	if setup != nil {
		setup(s)
	}
	return s.Page(openMetrics)
}

// goldenPages are the real captured pages and the simulator's V1 pages.
func goldenPages(t *testing.T) map[string][]byte {
	t.Helper()
	pages := map[string][]byte{}
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pages[strings.TrimSuffix(filepath.Base(f), ".txt")] = b
	}
	load := func(s *vllmsim.Server) {
		s.SetSeries(0, 5, 3, 0.25)
		s.SetSeries(1, 7, 2, 0.75)
		s.Complete(4, 1.5)
	}
	pages["sim-v1-engine0-engine1"] = simPage(vllmsim.Options{Engines: 2}, load, false)
	pages["sim-v1-engine0-engine1-openmetrics"] = simPage(vllmsim.Options{Engines: 2}, load, true)
	pages["sim-v1-two-models"] = simPage(vllmsim.Options{Models: []string{"llama", "phi"}}, load, false)
	pages["sim-v0"] = simPage(vllmsim.Options{V0: true}, func(s *vllmsim.Server) {
		s.SetLoad(vllmsim.Load{Waiting: vllmsim.F(4), Running: vllmsim.F(2), Swapped: vllmsim.F(1), KVCacheUsage: vllmsim.F(0.5)})
	}, false)
	return pages
}

func TestGolden(t *testing.T) {
	e := newExtractor(t, "vllm:cpu_cache_usage_perc:max")
	for name, page := range goldenPages(t) {
		t.Run(name, func(t *testing.T) {
			got, err := e.Extract(page)
			if err != nil {
				t.Fatal(err)
			}
			gotJSON, _ := json.MarshalIndent(named(got, e.Extras()), "", "  ")
			file := filepath.Join("testdata", "golden", name+".json")
			if *update {
				_ = os.MkdirAll(filepath.Dir(file), 0o755)
				if err := os.WriteFile(file, append(gotJSON, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			wantJSON, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test -update once to create it)", err)
			}
			if strings.TrimSpace(string(wantJSON)) != string(gotJSON) {
				t.Errorf("got\n%s\nwant\n%s", gotJSON, wantJSON)
			}
		})
	}
}

// TestRules pins the combination rules on pages whose answers are known.
func TestRules(t *testing.T) {
	e := newExtractor(t)
	tests := map[string]struct {
		page []byte
		want map[string]float64
	}{
		"two engines: requests summed, kv averaged": {
			page: simPage(vllmsim.Options{Engines: 2}, func(s *vllmsim.Server) {
				s.SetSeries(0, 5, 3, 0.2)
				s.SetSeries(1, 7, 2, 0.6)
			}, false),
			want: map[string]float64{"waiting": 12, "running": 5, "kvCacheUsage": 0.4},
		},
		"two models": {
			page: simPage(vllmsim.Options{Models: []string{"a", "b"}}, func(s *vllmsim.Server) {
				s.SetSeries(0, 1, 1, 0.1)
				s.SetSeries(1, 2, 3, 0.3)
			}, false),
			want: map[string]float64{"waiting": 3, "running": 4, "kvCacheUsage": 0.2},
		},
		"kubeai V0 page with a second model": {
			page: mustRead(t, "testdata/substratusai-kubeai__v0-llama3.1-8b-fp8-2024-08.txt"),
			want: map[string]float64{"waiting": 5, "running": 3, "swapped": 0, "kvCacheUsage": 0.0026235242675994863},
		},
		"histogram sum and count of all finished reasons": {
			page: simPage(vllmsim.Options{}, func(s *vllmsim.Server) { s.Complete(3, 0.9) }, false),
			want: map[string]float64{"e2eLatencyCount": 3, "e2eLatencySum": 2.7, "requestSuccess": 3, "ttftCount": 3},
		},
		"no trailing newline, NaN series skipped, unknown families and label orders": {
			page: []byte("# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n" +
				"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n" +
				"vllm:num_requests_waiting{model_name=\"m\",engine=\"1\"} NaN\n" +
				"something_else{a=\"}\"} 1\n" +
				"# TYPE vllm:spec_decode_efficiency gauge\n" +
				"vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5"),
			want: map[string]float64{"waiting": 3, "kvCacheUsage": 0.5},
		},
		"V1 name wins over the deprecated V0 name": {
			page: []byte("vllm:kv_cache_usage_perc 0.25\nvllm:gpu_cache_usage_perc 0.75\n" +
				"vllm:inter_token_latency_seconds_sum 2\nvllm:time_per_output_token_seconds_sum 9\n"),
			want: map[string]float64{"kvCacheUsage": 0.25, "itlSum": 2},
		},
		"OpenMetrics timestamps and exemplars": {
			page: []byte("# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{engine=\"0\"} 12.0 1700000000.5 # {trace_id=\"a\"} 1.0\n# EOF\n"),
			want: map[string]float64{"promptTokens": 12},
		},
		"empty families only": {
			page: []byte("# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n"),
			want: map[string]float64{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := e.Extract(tc.page)
			if err != nil {
				t.Fatal(err)
			}
			got := named(p, nil)
			for k, v := range tc.want {
				if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-12 {
					t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
				}
			}
			if len(tc.want) == 0 && len(got) != 0 {
				t.Errorf("got %v, want nothing: an absent metric is absent, never 0", got)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	e := newExtractor(t)
	tests := map[string]struct {
		page    string
		notVLLM bool
	}{
		"not a vLLM page":          {page: "# TYPE go_goroutines gauge\ngo_goroutines 12\n", notVLLM: true},
		"empty page":               {page: "", notVLLM: true},
		"malformed value":          {page: "vllm:num_requests_waiting{engine=\"0\"} twelve\n"},
		"unterminated label set":   {page: "vllm:num_requests_waiting{engine=\"0\n"},
		"missing value":            {page: "vllm:num_requests_waiting{engine=\"0\"}\n"},
		"duplicate label in a set": {page: "vllm:num_requests_running{a=\"1\",a=\"2\"} 1\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := e.Extract([]byte(tc.page))
			if err == nil {
				t.Fatal("no error")
			}
			var pe *ParseError
			if tc.notVLLM != errors.Is(err, ErrNotVLLM) || !tc.notVLLM && !errors.As(err, &pe) {
				t.Fatalf("error %v: want notVLLM=%v or a ParseError", err, tc.notVLLM)
			}
		})
	}
}

func TestParseExtraMetric(t *testing.T) {
	tests := map[string]struct {
		in   string
		want ExtraMetric
		bad  bool
	}{
		"plain":             {in: "my_gauge", want: ExtraMetric{"my_gauge", "sum"}},
		"vllm name":         {in: "vllm:cpu_cache_usage_perc", want: ExtraMetric{"vllm:cpu_cache_usage_perc", "sum"}},
		"vllm name and max": {in: "vllm:cpu_cache_usage_perc:max", want: ExtraMetric{"vllm:cpu_cache_usage_perc", "max"}},
		"mean":              {in: "x:mean", want: ExtraMetric{"x", "mean"}},
		"empty":             {in: "", bad: true},
		"bad name":          {in: "a b", bad: true},
		// A trigger's metricName "waiting" reads pulse's own; the gauge
		// replaced it in the aggregator's debug rows.
		"pulse's own name":        {in: "waiting", bad: true},
		"pulse's own name, a max": {in: "kvCacheUsage:max", bad: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseExtraMetric(tc.in)
			if (err != nil) != tc.bad || got != tc.want {
				t.Fatalf("got %v, %v; want %v, bad=%v", got, err, tc.want, tc.bad)
			}
		})
	}
	if _, err := NewExtractor([]ExtraMetric{{Name: "vllm:num_requests_waiting", Combine: "sum"}}); err == nil {
		t.Error("an extra metric that pulse already reads was accepted")
	}
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSaturationOnRealPages: saturation reads from pages pulse was not
// written against, each server's own gauges: SGLang's queue dominates its
// KV share; TGI has no KV-cache gauge, so its queue alone counts; a vLLM
// V0 page's KV usage.
func TestSaturationOnRealPages(t *testing.T) {
	e := newExtractor(t)
	sat, _ := metric.Lookup("saturation")
	for name, want := range map[string]float64{
		"sgl-project-sglang__docs-llama3.1-8b":   2826.0 / 2, // 2826 queued of 2 > KV 0.28 of 0.7
		"DataDog-integrations-core__tgi-PARTIAL": 0,          // an idle router: 0 queued
	} {
		page, err := e.Extract(mustRead(t, "testdata/"+name+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := sat.Eval([]metric.Sample{{Values: page.Values}}); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: saturation %v %v, want %v", name, got, ok, want)
		}
	}
	page, err := e.Extract(mustRead(t, "testdata/sgl-project-sglang__docs-llama3.1-8b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	kvOnly := sat.WithLoad(metric.LoadTargets{KVCache: 0.7})
	if got, _ := kvOnly.Eval([]metric.Sample{{Values: page.Values}}); math.Abs(got-0.4) > 1e-9 {
		t.Errorf("SGLang KV term = %v, want 0.28/0.7 = 0.4", got)
	}
}

// TestExtractDemand: the first of the metrics the page has is read (llm-d's
// two names for one gauge count once), series of other models are left
// out, and a page with none of them is 0: a labelled gauge with no series
// yet is not exported at all.
func TestExtractDemand(t *testing.T) {
	e := newExtractor(t)
	page := []byte(`# TYPE llm_d_epp_flow_control_queue_size gauge
llm_d_epp_flow_control_queue_size{fairness_id="a",priority="0",target_model_name="llama"} 2
llm_d_epp_flow_control_queue_size{fairness_id="b",priority="1",target_model_name="llama"} 3
llm_d_epp_flow_control_queue_size{fairness_id="a",priority="0",target_model_name="phi"} 7
inference_extension_flow_control_queue_size{fairness_id="a",priority="0",target_model_name="llama"} 2
inference_extension_flow_control_queue_size{fairness_id="b",priority="1",target_model_name="llama"} 3
process_open_fds 9
`)
	d := DemandPresets["epp"]
	d.Match = "llama"
	got, err := e.ExtractDemand(page, &d, nil)
	if v, ok := got.Get(metric.PendingRequests); err != nil || !ok || v != 5 {
		t.Fatalf("held = %v, %v, %v; want 5", v, ok, err)
	}
	if got, _ := e.ExtractDemand([]byte("process_open_fds 9\n"), &d, nil); got.V[metric.PendingRequests] != 0 || !got.Has(metric.PendingRequests) {
		t.Fatalf("empty page: %+v", got)
	}
	ps := DemandPresets["production-stack"]
	ps.Match = "phi"
	got, _ = e.ExtractDemand([]byte("vllm:num_incoming_requests_total{model=\"phi\"} 4\n"), &ps, nil)
	if v, ok := got.Get(metric.ArrivedRequests); !ok || v != 4 {
		t.Fatalf("arrivals = %v, %v", v, ok)
	}
	if _, err := e.ExtractDemand([]byte("inference_extension_flow_control_queue_size{target_model_name=\"llama\"\n"), &d, nil); err == nil {
		t.Fatal("a malformed line of the demand metric is accepted")
	}
	// Nothing after OpenMetrics' "# EOF" is of the page.
	eof := append(append([]byte{}, page...), "# EOF\nllm_d_epp_flow_control_queue_size{fairness_id=\"c\",priority=\"0\",target_model_name=\"llama\"} 40\n"...)
	if got, err := e.ExtractDemand(eof, &d, nil); err != nil || got.V[metric.PendingRequests] != 5 {
		t.Fatalf("held past # EOF = %v, %v; want 5", got.V[metric.PendingRequests], err)
	}
}

// TestExtractDemandsReadsThePageOnceForAll: a router naming many
// workloads is read once a scrape for all of them, each its own sum, as
// ExtractDemand reads it alone (a series given twice taken once, as
// Prometheus takes it: it was summed, the workload's demand doubled); a
// demand of other metrics is read apart, and a page malformed in its
// metric fails it alone.
func TestExtractDemandsReadsThePageOnceForAll(t *testing.T) {
	e := newExtractor(t)
	page := []byte(`llm_d_epp_flow_control_queue_size{target_model_name="llama",priority="0"} 2
llm_d_epp_flow_control_queue_size{target_model_name="llama",priority="1"} 3
llm_d_epp_flow_control_queue_size{target_model_name="phi"} 7
llm_d_epp_flow_control_queue_size{target_model_name="phi"} 7
other_queue{model="phi"} 1
broken{a="x"
`)
	var demands []*Demand
	for _, m := range []string{"llama", "phi", "qwen"} {
		d := DemandPresets["epp"]
		d.Match = m
		demands = append(demands, &d)
	}
	demands = append(demands, &Demand{Metrics: []string{"other_queue"}, Label: "model", Match: "phi"},
		&Demand{Metrics: []string{"broken"}, Label: "a", Match: "x"})
	pages, errs := e.ExtractDemands(page, demands, nil)
	for i, want := range []float64{5, 7, 0, 1} {
		alone, err := e.ExtractDemand(page, demands[i], nil)
		if errs[i] != nil || err != nil || pages[i].V != alone.V || pages[i].Present != alone.Present || pages[i].V[metric.PendingRequests] != want {
			t.Fatalf("demand %d: %v (%v), alone %v (%v); want %v", i, pages[i].V[metric.PendingRequests], errs[i], alone.V[metric.PendingRequests], err, want)
		}
	}
	if errs[4] == nil {
		t.Fatal("a malformed line of the demand metric is accepted")
	}
	// Read once: 64 workloads of the same metrics cost about what one does.
	var many []*Demand
	for range 64 {
		many = append(many, demands[0])
	}
	one := testing.AllocsPerRun(5, func() { _, _ = e.ExtractDemand(page[:len(page)-len("broken{a=\"x\"\n")], demands[0], nil) })
	all := testing.AllocsPerRun(5, func() { _, _ = e.ExtractDemands(page[:len(page)-len("broken{a=\"x\"\n")], many, nil) })
	if all > one+3*64 { // a page read again costs about one's
		t.Fatalf("64 workloads: %.0f allocations a scrape, one alone %.0f: the page is read for each", all, one)
	}
}

// TestARoutersClientsLinesAreNotRead: a router's label values are often
// its clients' to write (production-stack's router counts a request under
// the model it names before it knows the model): a line of another value
// past a line's bounds (a 9 KB model name, 17 labels), or 16,384 series of
// models that do not exist, are not read; each workload's demand is read
// of its own series. Any of them refused the page, and every workload
// behind the router lost its demand.
func TestARoutersClientsLinesAreNotRead(t *testing.T) {
	e := newExtractor(t)
	var page bytes.Buffer
	page.WriteString("vllm:num_incoming_requests_total{model=\"llama\"} 10\n")
	page.WriteString("vllm:num_incoming_requests_total{model=\"qwen\",server=\"a\"} 4\n")
	fmt.Fprintf(&page, "vllm:num_incoming_requests_total{model=%q} 1\n", strings.Repeat("x", 9000))
	fmt.Fprintf(&page, "vllm:num_incoming_requests_total{model=\"m\"%s} 1\n", strings.Repeat(",l=\"v\"", 17))
	for i := range maxKeptPageSeries + 1 {
		fmt.Fprintf(&page, "vllm:num_incoming_requests_total{model=\"nope-%d\"} 1\n", i)
	}
	// Another value that holds the pair, escaped within it: not the
	// label.
	page.WriteString(`vllm:num_incoming_requests_total{model="a,model=\"llama\""} 100` + "\n")
	// A value with a quote and a backslash is matched as written.
	page.WriteString(`vllm:num_incoming_requests_total{model="q\"\\"} 7` + "\n")
	var demands []*Demand
	for _, m := range []string{"llama", "qwen", `q"\`} {
		d := DemandPresets["production-stack"]
		d.Match = m
		demands = append(demands, &d)
	}
	pages, errs := e.ExtractDemands(page.Bytes(), demands, nil)
	for i, want := range []float64{10, 4, 7} {
		alone, err := e.ExtractDemand(page.Bytes(), demands[i], nil)
		if errs[i] != nil || err != nil || pages[i].V[metric.ArrivedRequests] != want || alone.V[metric.ArrivedRequests] != want {
			t.Fatalf("demand %q: %v (%v), alone %v (%v); want %v", demands[i].Match, pages[i].V[metric.ArrivedRequests], errs[i], alone.V[metric.ArrivedRequests], err, want)
		}
	}
	// A demand of every series (no label) reads every line, bounds and
	// all.
	if _, err := e.ExtractDemand(page.Bytes(), &Demand{Metrics: []string{"vllm:num_incoming_requests_total"}}, nil); err == nil {
		t.Fatal("a demand of every series read a page past the bounds")
	}
}

// TestDemandNamesAreBounded: a router's page is read for each metric its
// annotations name, at every scrape; at most MaxDemandMetrics of at most
// 256 bytes each are taken, and a label name of at most 256 bytes.
func TestDemandNamesAreBounded(t *testing.T) {
	many := make([]string, MaxDemandMetrics+1)
	for i := range many {
		many[i] = fmt.Sprintf("queue_%d", i)
	}
	long := strings.Repeat("a", 257)
	for name, d := range map[string]Demand{
		"too many metrics": {Metrics: many, Label: "model"},
		"a long metric":    {Metrics: []string{long}, Label: "model"},
		"a long label":     {Metrics: []string{"queue"}, Label: long},
	} {
		if err := ValidateDemand(&d); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := Demand{Metrics: many[:MaxDemandMetrics], Label: strings.Repeat("a", 256)}
	if err := ValidateDemand(&ok); err != nil {
		t.Fatalf("%d metrics, a 256-byte label: %v", MaxDemandMetrics, err)
	}
}

// BenchmarkExtractDemands: a router fronting 64 workloads (the most a
// demand source may name), its page of 64 × 16 queue series and 1,000 other
// lines; each/ reads it once a workload, as the agent did, once/ once for
// all.
func BenchmarkExtractDemands(b *testing.B) {
	e, err := NewExtractor(nil)
	if err != nil {
		b.Fatal(err)
	}
	var page strings.Builder
	var demands []*Demand
	for w := range 64 {
		for f := range 16 {
			fmt.Fprintf(&page, "llm_d_epp_flow_control_queue_size{fairness_id=\"f%d\",priority=\"0\",target_model_name=\"model-%d\"} %d\n", f, w, f)
		}
		d := DemandPresets["epp"]
		d.Match = fmt.Sprintf("model-%d", w)
		demands = append(demands, &d)
	}
	for i := range 1000 {
		fmt.Fprintf(&page, "http_requests_total{code=\"200\",handler=\"h%d\"} %d\n", i, i)
	}
	body := []byte(page.String())
	b.Run("each", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for range b.N {
			for _, d := range demands {
				if _, err := e.ExtractDemand(body, d, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("once", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for range b.N {
			if _, errs := e.ExtractDemands(body, demands, nil); errs[0] != nil {
				b.Fatal(errs[0])
			}
		}
	})
}

// labelsLine is a sample line of name with n labels.
func labelsLine(name string, n int) string {
	var b strings.Builder
	b.WriteString(name + "{")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "a%d=\"\"", i)
	}
	b.WriteString("} 1\n")
	return b.String()
}

// TestLinesOfManyLabelsAreRefusedFirst: expfmt's parser rebuilds a map of
// a line's labels at every label it reads, so one line of tens of
// thousands of labels cost it minutes of CPU a scrape, which the scrape's
// timeout cannot stop (the page is read by then). Such a line, a label
// set past 8 KiB, and a page of more sample lines of the metrics read than
// any engine writes are refused before the parse, as a page error of that
// pod alone (BenchmarkExtractManyLabels).
func TestLinesOfManyLabelsAreRefusedFirst(t *testing.T) {
	e := newExtractor(t)
	if _, err := e.Extract([]byte(labelsLine("vllm:num_requests_waiting", maxLineLabels))); err != nil {
		t.Fatalf("a line of %d labels: %v", maxLineLabels, err)
	}
	// A comma before the closing brace is legal, and no label.
	if _, err := e.Extract([]byte(strings.Replace(labelsLine("vllm:num_requests_waiting", maxLineLabels), "}", ",}", 1))); err != nil {
		t.Fatalf("a line of %d labels and a trailing comma: %v", maxLineLabels, err)
	}
	many := labelsLine("vllm:num_requests_waiting", 40000)
	long := "vllm:num_requests_waiting{a=\"" + strings.Repeat("x", maxLabelSetBytes) + "\"} 1\n"
	lines := strings.Repeat("vllm:num_requests_waiting 1\n", maxKeptPageSeries+1)
	// A value of 1 MiB of control bytes was kept for the parse, which
	// quoted it whole: a 4 MB error (46 MB allocated) a scrape.
	value := "vllm:num_requests_running " + strings.Repeat("\x01", 1<<20) + "\n"
	for what, page := range map[string]string{"more than 16 labels": many, "labels of more than 8192 bytes": long, "more than 16384 sample lines": lines,
		"a value of more than 64 bytes": value} {
		_, err := e.Extract([]byte(page))
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), what) || len(err.Error()) > 1<<10 {
			t.Fatalf("%s: error %.300v (%d bytes), want a short ParseError saying so", what, err, len(err.Error()))
		}
	}
	if _, err := e.Extract([]byte("vllm:num_requests_running -1.7976931348623157e+308\n")); err != nil {
		t.Fatalf("the longest float's text: %v", err)
	}
	d := DemandPresets["epp"]
	d.Match = "llama"
	// (A line of the workload's own value: one of another is not read,
	// TestARoutersClientsLinesAreNotRead.)
	own := strings.Replace(labelsLine("llm_d_epp_flow_control_queue_size", 40000), "{", `{target_model_name="llama",`, 1)
	if _, err := e.ExtractDemand([]byte(own), &d, nil); err == nil || !strings.Contains(err.Error(), "more than 16 labels") {
		t.Fatalf("a demand page's line of 40,000 labels: %v", err)
	}
}

// BenchmarkExtractManyLabels: a line of 40,000 labels (refused before the
// parse), and the costliest page that is parsed: 1 MiB of lines at the
// label limit.
func BenchmarkExtractManyLabels(b *testing.B) {
	e, err := NewExtractor(nil)
	if err != nil {
		b.Fatal(err)
	}
	var atLimit strings.Builder
	for i := 0; atLimit.Len() < 1<<20-300; i++ {
		atLimit.WriteString(strings.Replace(labelsLine("vllm:num_requests_waiting", maxLineLabels), "a0=\"\"", fmt.Sprintf("a0=\"%d\"", i), 1))
	}
	for name, c := range map[string]struct {
		page []byte
		ok   bool
	}{"40000-labels-line": {[]byte(labelsLine("vllm:num_requests_waiting", 40000)), false}, "1MiB-at-the-limit": {[]byte(atLimit.String()), true}} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(c.page)))
			for range b.N {
				if _, err := e.Extract(c.page); (err == nil) != c.ok {
					b.Fatalf("error %v", err)
				}
			}
		})
	}
}

// TestFiniteSeriesThatSumPastTheLargestFloat: an infinite series is
// skipped, and so is a sum of finite ones that is infinite (two of
// 1e308): it was reported as present, and the wire clamped it to 2^53
// requests waiting.
func TestFiniteSeriesThatSumPastTheLargestFloat(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{
		"vllm:num_requests_waiting{engine=\"0\"} 1e308\nvllm:num_requests_waiting{engine=\"1\"} 1e308\n",
		"vllm:num_requests_waiting{engine=\"0\"} -1e308\nvllm:num_requests_waiting{engine=\"1\"} -1e308\n",
	} {
		for name, extract := range map[string]func([]byte) (Page, error){"fast": e.Extract, "full": e.FullParse} {
			p, err := extract([]byte(page))
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := p.Get(metric.Waiting); ok {
				t.Errorf("%s path: waiting = %v, present", name, v)
			}
		}
	}
}

// TestABlankBeforeTheLabels: the text format allows blanks between a
// metric's name and its labels, and expfmt and Prometheus read
// `name {l="v"} 5`; the fast path took the labels for the value and refused
// the whole page.
func TestABlankBeforeTheLabels(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := []byte("vllm:num_requests_waiting {engine=\"0\"} 5\nvllm:num_requests_running\t{engine=\"0\"} 3\nvllm:num_requests_running 2\n")
	full, ferr := e.FullParse(page)
	fast, err := e.Extract(page)
	if ferr != nil || err != nil || fast.Values != full.Values {
		t.Fatalf("fast path %v (%v), full parse %v (%v)", fast.Values, err, full.Values, ferr)
	}
	if v, _ := fast.Get(metric.Waiting); v != 5 {
		t.Fatalf("waiting %v, want 5", v)
	}
}

// TestACommentIsReadForItsFirstWords: until a page shows a family pulse
// reads, its comments are read for a HELP or TYPE of one; only their first
// two words are. Split whole, a 1 MiB comment of one-letter words allocated
// 12 MB a scrape, in an agent limited to 128 Mi.
func TestACommentIsReadForItsFirstWords(t *testing.T) {
	e, err := NewExtractor(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := append([]byte("#"), bytes.Repeat([]byte(" a"), 512<<10)...)
	page = append(page, "\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n"...)
	if _, err := e.Extract(page); err != nil {
		t.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	if _, err := e.Extract(page); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	if got := m1.TotalAlloc - m0.TotalAlloc; got > uint64(len(page)) {
		t.Fatalf("one %d-byte page allocated %d bytes", len(page), got)
	}
	for line, want := range map[string]bool{"# TYPE vllm:x gauge": true, "#HELP\tsglang:y z": true, "# TYPE other gauge": false, "# a b": false, "#": false, "# TYPE": false} {
		if got := isVLLMComment([]byte(line)); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
}

// TestOneWorkloadsBadLinesFailItsDemandAlone: the lines of a router's page
// that hold one workload's pair were read with every other workload's:
// one of them past the bounds (the EPP's fairness_id is a request's
// header: a client's to write), 16,385 of them (one model's requests under
// as many fairness ids), or one the parser refuses, failed the read of
// every workload behind the router. Each pair's lines are read apart:
// that workload's demand fails, the others' are read.
func TestOneWorkloadsBadLinesFailItsDemandAlone(t *testing.T) {
	e := newExtractor(t)
	line := func(fairness, model string, v int) string {
		return fmt.Sprintf("llm_d_epp_flow_control_queue_size{fairness_id=%q,inference_pool=\"p\",model_name=%q,priority=\"0\",target_model_name=%q} %d\n", fairness, model, model, v)
	}
	good := line("a", "phi", 7) + line("a", "llama", 2)
	var many strings.Builder
	for i := range maxKeptPageSeries + 1 {
		many.WriteString(line(fmt.Sprint("f", i), "llama", 1))
	}
	for name, bad := range map[string]string{
		"labels past the bound":     line(strings.Repeat("x", 9000), "llama", 1),
		"more lines than the bound": many.String(),
		"a line the parser refuses": `llm_d_epp_flow_control_queue_size{target_model_name="llama",1x="1"} 1` + "\n",
		"a line of 17 labels":       `llm_d_epp_flow_control_queue_size{target_model_name="llama",a="",b="",c="",d="",e="",f="",g="",h="",i="",j="",k="",l="",m="",n="",o="",p=""} 1` + "\n",
	} {
		var ds []*Demand
		for _, m := range []string{"llama", "phi"} {
			d := DemandPresets["epp"]
			d.Match = m
			ds = append(ds, &d)
		}
		pages, errs := e.ExtractDemands([]byte(good+bad), ds, nil)
		if errs[0] == nil {
			t.Errorf("%s: llama's demand read %v; want its read failed", name, pages[0].V[metric.PendingRequests])
		}
		if errs[1] != nil || pages[1].V[metric.PendingRequests] != 7 {
			t.Errorf("%s: phi's demand %v, %v; want 7", name, pages[1].V[metric.PendingRequests], errs[1])
		}
		if _, err := e.ExtractDemand([]byte(good+bad), ds[1], nil); err != nil {
			t.Errorf("%s: phi read alone: %v", name, err)
		}
	}
}

// TestARoutersLineIsSoughtInItsLabelsAlone: a workload's pair is sought
// in a series' labels, not in what follows them. Sought in the whole
// line, one whose exemplar (any text after the value) named every one of
// 64 workloads was kept and parsed once for each: a 1 MiB router page
// allocated 458 MiB and held 145 MiB live in an agent limited to 128.
// A series that gives a workload's label twice fails the reads of the
// workloads it names, kept for none.
func TestARoutersLineIsSoughtInItsLabelsAlone(t *testing.T) {
	e := newExtractor(t)
	var ds []*Demand
	var names strings.Builder
	for w := range 64 {
		ds = append(ds, &Demand{Metrics: []string{"q"}, Label: "model", Match: fmt.Sprint("w", w)})
		fmt.Fprintf(&names, ",model=\"w%d\"", w)
	}
	page := func(tail string) []byte {
		var b strings.Builder
		for i := 0; b.Len() < 256<<10; i++ {
			fmt.Fprintf(&b, "q{model=\"w%d\",path=%q} 1%s\n", i%64, strings.Repeat("x", 500), tail)
		}
		return []byte(b.String())
	}
	allocated := func(body []byte) uint64 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		pages, errs := e.ExtractDemands(body, ds, nil)
		runtime.ReadMemStats(&m1)
		for w, err := range errs {
			if err != nil || pages[w].V[metric.PendingRequests] == 0 {
				t.Fatalf("w%d: %v, %v; want its lines' sum", w, pages[w].V[metric.PendingRequests], err)
			}
		}
		return m1.TotalAlloc - m0.TotalAlloc
	}
	plain := allocated(page(""))
	named := allocated(page(" # {" + names.String()[1:] + "} 1"))
	if named > 2*plain {
		t.Errorf("a page whose every line's exemplar names the 64 workloads allocated %d KiB, the same page without them %d KiB: want about the same", named>>10, plain>>10)
	}

	twice := []byte("q{model=\"w0\"} 3\nq{model=\"w1\",model=\"w2\"} 1\nq{model=\"w3\"} 4\n")
	pages, errs := e.ExtractDemands(twice, ds[:4], nil)
	for w, want := range []float64{3, -1, -1, 4} {
		switch {
		case want < 0 && (errs[w] == nil || !strings.Contains(errs[w].Error(), "twice")):
			t.Errorf("w%d: %v; want its read failed, the label given twice", w, errs[w])
		case want >= 0 && (errs[w] != nil || pages[w].V[metric.PendingRequests] != want):
			t.Errorf("w%d: %v, %v; want %v", w, pages[w].V[metric.PendingRequests], errs[w], want)
		}
	}
}

// TestARoutersWorkloadsCostLinearly: what one scrape of a router
// allocates grows with the workloads it names, not with their square.
// Each workload's read looked its slot up by making every pair again for
// each compared: 64 workloads of 256-byte names allocated 3.9 MB a
// scrape, 61 KB a workload against 11 KB at 8.
func TestARoutersWorkloadsCostLinearly(t *testing.T) {
	e := newExtractor(t)
	perWorkload := func(n int) float64 {
		var ds []*Demand
		for w := range n {
			ds = append(ds, &Demand{Metrics: []string{"q"}, Label: strings.Repeat("l", 256), Match: fmt.Sprintf("%0250d", w)})
		}
		page := []byte("q 1\n")
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		e.ExtractDemands(page, ds, nil)
		runtime.ReadMemStats(&m1)
		return float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
	}
	perWorkload(64) // the extractor's first use
	if few, many := perWorkload(8), perWorkload(64); many > 2*few {
		t.Errorf("a scrape of a router naming 64 workloads allocated %.0f bytes a workload, one naming 8 %.0f: want about the same", many, few)
	}
}
