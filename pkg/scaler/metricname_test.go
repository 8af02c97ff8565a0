package scaler

import (
	"regexp"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/store"
)

// metricNameByExpression is how MetricName made the name until 2026-12-05
// (sixth session): joined, lower-cased, each run of other characters
// replaced by a regular expression, trimmed. MetricName must give the same
// name for every trigger: KEDA and the HPA know a trigger's metric by it.
func metricNameByExpression(t Trigger) string {
	n := strings.ToLower(strings.Join([]string{"pulse", t.Workload.Kind, t.Workload.Namespace, t.Workload.Name, t.Metric}, "-"))
	return strings.Trim(unsafeName.ReplaceAllString(n, "-"), "-")
}

var unsafeName = regexp.MustCompile(`[^a-z0-9-]+`)

func metricNameTrigger(kind, namespace, name, metric string) Trigger {
	return Trigger{Workload: store.Key{Kind: kind, Namespace: namespace, Name: name}, Metric: metric}
}

// TestMetricNameIsTheExpressions: the names of the kinds of trigger pulse
// serves, and of names that lower-case, collapse and trim, are those the
// expression gave, byte for byte.
func TestMetricNameIsTheExpressions(t *testing.T) {
	for _, c := range []struct{ kind, namespace, name, metric, want string }{
		{"workspace", "demo", "llama", "waiting", "pulse-workspace-demo-llama-waiting"},
		{"Workspace", "team-x", "llama-big-1", "kvCacheUsage", "pulse-workspace-team-x-llama-big-1-kvcacheusage"},
		{"inferenceset", "ns", "set.a", "vllm:num_requests_waiting", "pulse-inferenceset-ns-set-a-vllm-num-requests-waiting"},
		{"", "", "", "", "pulse"},
		{"__", "-a-", "b__c", "_", "pulse----a--b-c"},
		{"ÄÖ", "ns", "ünï", "KELVIN", "pulse---ns--n--kelvin"},            // each run one dash, beside the joins' own
		{"\u212a", "\u0130x", "x\xffy", "a\u00a0b", "pulse-k-ix-x-y-a-b"}, // the Kelvin sign and İ lower to ASCII
	} {
		tr := metricNameTrigger(c.kind, c.namespace, c.name, c.metric)
		if got, ref := MetricName(tr), metricNameByExpression(tr); got != c.want || ref != c.want {
			t.Errorf("MetricName(%q, %q, %q, %q) = %q, the expression %q, want %q", c.kind, c.namespace, c.name, c.metric, got, ref, c.want)
		}
	}
}

// TestMetricNameIsOneAllocation: the name is built in its one allocation
// (the expression's replacement took five, at every poll and push).
func TestMetricNameIsOneAllocation(t *testing.T) {
	tr := metricNameTrigger("Workspace", "team-x", "llama_big.1", "kvCacheUsage")
	if n := testing.AllocsPerRun(100, func() { _ = MetricName(tr) }); n > 1 {
		t.Fatalf("MetricName allocates %v times, want 1", n)
	}
}

// FuzzMetricName: any trigger's name is the expression's.
func FuzzMetricName(f *testing.F) {
	f.Add("workspace", "demo", "llama", "waiting")
	f.Add("\u212a", "\u0130", "\xff\xfe", "-_-")
	f.Add("", "ÀÉ", "a--b", "c__")
	f.Fuzz(func(t *testing.T, kind, namespace, name, metric string) {
		tr := metricNameTrigger(kind, namespace, name, metric)
		if got, want := MetricName(tr), metricNameByExpression(tr); got != want {
			t.Fatalf("MetricName(%q, %q, %q, %q) = %q, the expression gives %q", kind, namespace, name, metric, got, want)
		}
	})
}
