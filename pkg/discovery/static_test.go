package discovery

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "targets.yaml")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLoadStaticTargets(t *testing.T) {
	ts, err := LoadStaticTargets(writeFile(t, `targets:
- namespace: demo
  pod: llama-0
  workspace: llama
  inferenceSet: llama-set
  url: http://127.0.0.1:8001/metrics
- namespace: demo
  pod: phi-0
  deployment: phi
  url: https://10.0.0.1:5000/metrics
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || len(ts[0].Workloads) != 2 || ts[1].Workloads[0].Kind != pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT {
		t.Fatalf("targets = %+v", ts)
	}
}

// TestStaticTargetsShowEveryState: a static target can be a starting pod
// (ready: false) or a terminating one, so that the demo and tests show the
// scaler's rule without a cluster.
func TestStaticTargetsShowEveryState(t *testing.T) {
	ts, err := LoadStaticTargets(writeFile(t, `targets:
- {namespace: demo, pod: up, workspace: w, url: "http://127.0.0.1:1/metrics"}
- {namespace: demo, pod: starting, workspace: w, url: "http://127.0.0.1:2/metrics", ready: false}
- {namespace: demo, pod: leaving, workspace: w, url: "http://127.0.0.1:3/metrics", terminating: true}
- {namespace: demo, pod: both, workspace: w, url: "http://127.0.0.1:4/metrics", ready: true, terminating: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, tg := range ts {
		got += fmt.Sprintf("%s:%v/%v ", tg.Pod, tg.Ready, tg.Terminating)
	}
	// A terminating pod keeps its Ready (default true), as a draining pod
	// does; the agent does not scrape it.
	if want := "up:true/false starting:false/false leaving:true/true both:true/true "; got != want {
		t.Fatalf("ready/terminating = %q, want %q", got, want)
	}
}

func TestLoadStaticTargetsReportsEveryProblem(t *testing.T) {
	_, err := LoadStaticTargets(writeFile(t, `targets:
- namespace: demo
  url: ftp://x
- namespace: demo
  pod: a
  workspace: w
  url: http://127.0.0.1:1/metrics
- namespace: demo
  pod: a
  workspace: w
  url: http://127.0.0.1:1/metrics
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"target 0: namespace and pod are required", "target 0: name a workload", `target 0: url "ftp://x"`, "target 2: pod demo/a is listed twice"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := LoadStaticTargets(writeFile(t, "targets:\n- namespace: a\n  pood: x\n")); err == nil || !strings.Contains(err.Error(), "pood") {
		t.Errorf("unknown key: %v", err)
	}
}

// TestStaticTargetsErrorsSpeakYAML: the file is YAML and its errors say so,
// in its own terms (they used to speak of JSON and Go struct fields).
func TestStaticTargetsErrorsSpeakYAML(t *testing.T) {
	for body, want := range map[string]string{
		"targets:\n  - namespace: demo\n    pod: [x\n":                  `is not a valid targets YAML: line 3: did not find expected ',' or ']'`,
		"targets:\n  - namespace: demo\n    pod: x\n    ready: maybe\n": `is not a valid targets YAML: targets.ready: want a bool, got a string`,
		"targets:\n  - namespace: demo\n    pood: x\n":                  `is not a valid targets YAML: unknown key "pood"`,
	} {
		_, err := LoadStaticTargets(writeFile(t, body))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "JSON") {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}

// TestStaticTargetsInANamespaceNamedDemand: a static target's uid is
// static/NAMESPACE/POD, and a demand entry's POD_UID/demand/WORKLOAD was
// cut at its first "/demand/": in a namespace named demand, every router's
// entries had the pod uid "static" (one scrape unit, every workload's
// demand read from the first router's page), and so had every model
// server. Each is its own pod's.
func TestStaticTargetsInANamespaceNamedDemand(t *testing.T) {
	ts, err := LoadStaticTargets(writeFile(t, `targets:
- {namespace: demand, pod: router-a, url: "http://127.0.0.1:1/metrics", annotations: {pulse.io/demand-source: epp, pulse.io/demand-workloads: llama}}
- {namespace: demand, pod: router-b, url: "http://127.0.0.1:2/metrics", annotations: {pulse.io/demand-source: epp, pulse.io/demand-workloads: phi}}
- {namespace: demand, pod: vllm-0, workspace: llama, url: "http://127.0.0.1:3/metrics"}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"router-a": "static/demand/router-a", "router-b": "static/demand/router-b", "vllm-0": "static/demand/vllm-0"}
	if len(ts) != 3 {
		t.Fatalf("%d targets: %+v", len(ts), ts)
	}
	for _, tg := range ts {
		if got := tg.PodUID(); got != want[tg.Pod] {
			t.Errorf("%s (uid %s): pod uid %q, want %q", tg.Pod, tg.UID, got, want[tg.Pod])
		}
	}
}
