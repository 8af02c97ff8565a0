package scaler

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestRefusedTriggersAreVisible: a ScaledObject whose metadata pulse
// refuses shows on pulse's side — in the trigger records (/debug/triggers),
// in pulse_aggregator_refused_triggers_total by reason, and in the log once
// a minute — not only in KEDA's log.
func TestRefusedTriggersAreVisible(t *testing.T) {
	f := newFixture(t)
	var logs bytes.Buffer
	f.server.log = slog.New(slog.NewTextHandler(&logs, nil))
	bad := map[string]string{"workspace": "llama", "threshold": "ten"}
	for range 3 {
		if _, err := f.client.GetMetricSpec(context.Background(), ref(bad)); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("bad threshold: %v", err)
		}
	}
	other := map[string]string{"workspace": "llama", "namespace": "elsewhere"}
	if _, err := f.client.IsActive(context.Background(), ref(other)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("another namespace: %v", err)
	}
	evs := f.server.Evaluations()
	if len(evs) != 1 || !evs[0].Refused || evs[0].MetricName != RefusedMetricName || !strings.Contains(evs[0].Err, `namespace "elsewhere"`) {
		t.Fatalf("records %+v: want the ScaledObject's last refusal", evs)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	exp := `
# HELP pulse_aggregator_refused_triggers_total Trigger requests refused for their ScaledObject's metadata (InvalidArgument), by reason: the metadata key at fault, namespace, unforwarded or metadata.
# TYPE pulse_aggregator_refused_triggers_total counter
pulse_aggregator_refused_triggers_total{reason="namespace"} 1
pulse_aggregator_refused_triggers_total{reason="threshold"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "pulse_aggregator_refused_triggers_total"); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "ScaledObject trigger refused"); n != 1 {
		t.Fatalf("%d log lines for 4 refusals within a minute, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "scaledObject=llama-so") || !strings.Contains(logs.String(), "reason=threshold") {
		t.Fatalf("the log line does not name the ScaledObject and reason:\n%s", logs.String())
	}
	f.clock.Add(refusalLogEvery + time.Second)
	if _, err := f.client.GetMetricSpec(context.Background(), ref(bad)); err == nil {
		t.Fatal("accepted")
	}
	if n := strings.Count(logs.String(), "ScaledObject trigger refused"); n != 2 {
		t.Fatalf("%d log lines a minute later, want 2", n)
	}
}

// TestARefusedTriggerBesideAnAnsweredOneKeepsTheScrape: a ScaledObject with
// a trigger answered and another refused, whose metadata read as far as it
// went names the same workload and metric, gets one series each (two with
// the same labels made the whole scrape fail, every tenant's series with
// it).
func TestARefusedTriggerBesideAnAnsweredOneKeepsTheScrape(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	f.report(map[string]float64{"a": 3})
	if _, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "waiting"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.metric(t, map[string]string{"workspace": "llama", "metric": "waiting", "threshold": "ten"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad threshold: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	exp := `
# HELP pulse_aggregator_trigger_failed 1 when the trigger's last evaluation answered an error (stale, warming up, not found).
# TYPE pulse_aggregator_trigger_failed gauge
pulse_aggregator_trigger_failed{metric="(refused)",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 1
pulse_aggregator_trigger_failed{metric="waiting",namespace="demo",scaledobject="llama-so",workload="Workspace demo/llama"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "pulse_aggregator_trigger_failed"); err != nil {
		t.Fatal(err)
	}
}

// TestTriggerSeriesAreBoundedAndShared: past MaxTriggerSeries, /metrics
// carries the series of that many triggers, shared among their namespaces
// in turn, and counts the rest: one tenant's ScaledObjects made a page of
// hundreds of megabytes and left every other tenant's series on it.
func TestTriggerSeriesAreBoundedAndShared(t *testing.T) {
	f := newFixture(t)
	f.server.maxTriggerSeries = 4
	tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10}
	for i := range 5 {
		f.server.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "team-a", Name: fmt.Sprintf("so-%d", i)}, tr, Decision{Value: 1}, nil)
	}
	for i := range 2 {
		f.server.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "team-b", Name: fmt.Sprintf("so-%d", i)}, tr, Decision{Value: 1}, nil)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	exp := `
# HELP pulse_aggregator_trigger_series_left_out Triggers whose series this page leaves out, past --max-trigger-series (the triggers shown are shared among their namespaces in turn; /debug/triggers has every one).
# TYPE pulse_aggregator_trigger_series_left_out gauge
pulse_aggregator_trigger_series_left_out 3
# HELP pulse_aggregator_trigger_threshold The trigger's threshold (the HPA's per-pod target).
# TYPE pulse_aggregator_trigger_threshold gauge
pulse_aggregator_trigger_threshold{metric="waiting",namespace="team-a",scaledobject="so-0",workload="Workspace demo/llama"} 10
pulse_aggregator_trigger_threshold{metric="waiting",namespace="team-a",scaledobject="so-1",workload="Workspace demo/llama"} 10
pulse_aggregator_trigger_threshold{metric="waiting",namespace="team-b",scaledobject="so-0",workload="Workspace demo/llama"} 10
pulse_aggregator_trigger_threshold{metric="waiting",namespace="team-b",scaledobject="so-1",workload="Workspace demo/llama"} 10
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "pulse_aggregator_trigger_series_left_out", "pulse_aggregator_trigger_threshold"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// TestARefusedLongNameIsKeptCut: a trigger refused for a workload name past
// 253 bytes is recorded with the name cut (a valid label value: cut at a
// character's start), not the whole of what was sent.
func TestARefusedLongNameIsKeptCut(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("a", 252) + strings.Repeat("é", 200)
	if _, err := f.metric(t, map[string]string{"workspace": long}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a name of %d bytes: %v", len(long), err)
	}
	evals := f.server.Evaluations()
	if len(evals) != 1 || len(evals[0].Trigger.Workload.Name) > maxWorkloadName+3 || !utf8.ValidString(evals[0].Trigger.Workload.Name) {
		t.Fatalf("the refusal's record: %+v", evals)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.server.Collector())
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestOneNamespacesEvaluationsAreItsOwn: one namespace's debug page copied
// every namespace's records (up to 10,000), under the lock KEDA's answers
// take, and kept its own. EvaluationsOf reads that namespace's alone.
func TestOneNamespacesEvaluationsAreItsOwn(t *testing.T) {
	f := newFixture(t)
	tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10}
	for i := range 3 {
		f.server.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "team-a", Name: fmt.Sprintf("so-%d", i)}, tr, Decision{Value: 1}, nil)
	}
	f.server.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "team-b", Name: "so-0"}, tr, Decision{Value: 1}, nil)
	for ns, want := range map[string]int{"team-a": 3, "team-b": 1, "team-c": 0, "": 4} {
		got := f.server.EvaluationsOf(ns)
		if len(got) != want {
			t.Errorf("EvaluationsOf(%q): %d, want %d", ns, len(got), want)
		}
		for _, e := range got {
			if ns != "" && e.Namespace != ns {
				t.Errorf("EvaluationsOf(%q) holds %s's", ns, e.Namespace)
			}
		}
	}
}

// TestOneTenantsRefusalsLeaveAnothersLogLimit: one tenant's 10,000 broken
// ScaledObjects filled the log limit's record, which was then cleared, so
// every tenant's refusals were logged at every poll. Past the bound the
// namespace holding the most gives its own entries.
func TestOneTenantsRefusalsLeaveAnothersLogLimit(t *testing.T) {
	f := refusals{logged: map[string]map[TriggerID]time.Time{}}
	now := time.Unix(1_700_000_000, 0)
	b := TriggerID{Namespace: "team-b", ScaledObject: "one", MetricName: RefusedMetricName}
	if !f.shouldLog(b, now) {
		t.Fatal("team-b's first refusal not logged")
	}
	logged := 0
	for i := range 3 * maxDecisions {
		if f.shouldLog(TriggerID{Namespace: "team-a", ScaledObject: fmt.Sprintf("so-%d", i), MetricName: RefusedMetricName}, now) {
			logged++
		}
	}
	if logged != 3*maxDecisions || f.nLogged > maxDecisions || f.nLogged < maxDecisions/2 {
		t.Fatalf("team-a's %d new ScaledObjects: %d logged, %d kept; want each logged once, %d to %d kept", 3*maxDecisions, logged, f.nLogged, maxDecisions/2, maxDecisions)
	}
	if f.shouldLog(b, now.Add(time.Second)) {
		t.Fatal("team-b's refusal a second later was logged again: team-a's flood cleared its limit")
	}
	if !f.shouldLog(b, now.Add(refusalLogEvery)) {
		t.Fatal("team-b's refusal a minute later was not logged")
	}
	n := 0
	for _, m := range f.logged {
		n += len(m)
	}
	if n != f.nLogged {
		t.Fatalf("%d entries, counted %d", n, f.nLogged)
	}
}

// TestTriggerSeriesShareTheirLabelsSafely: a trigger's series share its
// label pairs (triggerGauge), which no scrape changes: two scrapes write
// the same page, each trigger's series under its own labels. A label
// value that is not UTF-8 (none is: a proto3 string each) is written with
// U+FFFD, the rest of the page kept (a const metric's panicked).
func TestTriggerSeriesShareTheirLabelsSafely(t *testing.T) {
	s := New(store.New(store.Options{Retention: time.Minute}), Options{MaxWindow: time.Minute})
	tr := Trigger{Workload: llama, Metric: "waiting", Threshold: 10}
	for i, name := range []string{"so-a", "so-\xff"} {
		s.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "team", Name: name}, tr, Decision{Value: 1, Counted: i + 1, Filled: 10 * (i + 1), LeftOut: 100 * (i + 1)}, nil)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	page := func() string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
		return b.String()
	}
	first := page()
	if again := page(); again != first {
		t.Fatalf("a second scrape wrote another page:\n%s\nthen\n%s", first, again)
	}
	for _, want := range []string{
		`pulse_aggregator_trigger_pods{metric="waiting",namespace="team",scaledobject="so-a",use="filled",workload="Workspace demo/llama"} 10`,
		`pulse_aggregator_trigger_pods{metric="waiting",namespace="team",scaledobject="so-�",use="left_out",workload="Workspace demo/llama"} 200`,
		`pulse_aggregator_trigger_value{metric="waiting",namespace="team",scaledobject="so-�",workload="Workspace demo/llama"} 1`,
	} {
		if !strings.Contains(first, want) {
			t.Errorf("the page lacks %s:\n%s", want, first)
		}
	}
}

// BenchmarkTriggerSeriesScrape: one scrape of /metrics's trigger series at
// 1,000 ScaledObjects (the --max-trigger-series default's worth), half of
// them planner triggers (27 series each) and half others (7): what a
// scrape allocates, all of it garbage once the page is written, and
// counted live by a GC that marks meanwhile (docs/performance.md, "A
// pod in 288 bytes, a trigger held once, a stream's wait on one channel").
func BenchmarkTriggerSeriesScrape(b *testing.B) {
	s := New(store.New(store.Options{Retention: time.Minute}), Options{MaxWindow: time.Minute, MaxTriggerSeries: 1000})
	plan := &planner.Plan{Work: 1000, Capacity: 300, Confidence: 0.5, Observations: 12, LeadTime: 4 * time.Minute, Need: 4}
	series := 0
	for i := range 1000 {
		tr := Trigger{Workload: store.Key{Namespace: "bench", Kind: store.KindWorkspace, Name: fmt.Sprintf("w%d", i)}, Metric: "waiting", Threshold: 10}
		d, n := Decision{Value: 12, Counted: 4}, 7
		if i%2 == 0 {
			tr.Metric, tr.Threshold, d.Plan, n = "replicas", 1, plan, 27
		}
		series += n
		s.decisions.record(&externalscaler.ScaledObjectRef{Namespace: "bench", Name: fmt.Sprintf("so-%d", i)}, tr, d, nil)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	b.ReportAllocs()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(io.Discard, mf); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(series), "series")
}
