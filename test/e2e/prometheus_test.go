//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// prometheusServer is a Debian prometheus process scraping one job.
type prometheusServer struct {
	url     string
	config  string
	targets []string
	proc    *proc
}

// writeConfig writes a configuration whose job is named job: Prometheus
// derives a target's scrape offset from its labels, so a new job name draws
// a new phase of the scrapes.
func (p *prometheusServer) writeConfig(t *testing.T, job string) {
	quoted := make([]string, len(p.targets))
	for i, tg := range p.targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs:\n- job_name: %s\n  static_configs:\n  - targets: [%s]\n",
		job, strings.Join(quoted, ", "))
	must(t, os.WriteFile(p.config, []byte(cfg), 0o644))
}

// relabel renames the job and reloads the configuration (SIGHUP), so that
// the target's scrape offset is drawn anew.
func (p *prometheusServer) relabel(t *testing.T, job string) {
	p.writeConfig(t, job)
	must(t, p.proc.cmd.Process.Signal(syscall.SIGHUP))
}

// startPrometheus runs Debian's prometheus scraping targets every 15 s (as
// the Kaito proposal's PodMonitor does), on loopback.
func (e *env) startPrometheus(targets ...string) *prometheusServer {
	t := e.t
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("the e2e compares pulse with a real Prometheus: install Debian's prometheus package (.ci/run does)")
	}
	dir := filepath.Join(e.dir, "prometheus")
	must(t, os.MkdirAll(dir, 0o755))
	ps := &prometheusServer{config: filepath.Join(dir, "prometheus.yml"), targets: targets}
	ps.writeConfig(t, "vllm")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ps.url = "http://" + addr
	ps.proc = start(t, e.dir, "prometheus", nil, bin, "--config.file="+ps.config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--storage.tsdb.retention.time=2h")
	e.extra = append(e.extra, ps.proc)
	return ps
}

// promQuery runs an instant query and returns its single value.
func promQuery(base, q string) (float64, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var doc struct {
		Data struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return 0, err
	}
	if len(doc.Data.Result) != 1 || len(doc.Data.Result[0].Value) != 2 {
		return 0, fmt.Errorf("query %q: %d series", q, len(doc.Data.Result))
	}
	s, _ := doc.Data.Result[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}

// stepInferenceSet creates an InferenceSet held at 1 replica whose /scale
// reports a selector (nothing creates pods for more: only the HPA's
// decision is measured).
func (e *env) stepInferenceSet(name string) {
	e.createWorkload(infSetGVR, name, map[string]any{"replicas": int64(1)})
	u, err := e.dyn.Resource(infSetGVR).Namespace(appNS).Get(e.ctx, name, metav1.GetOptions{})
	must(e.t, err)
	must(e.t, unstructured.SetNestedField(u.Object, int64(1), "status", "replicas"))
	must(e.t, unstructured.SetNestedField(u.Object, "inferenceset.kaito.sh/created-by="+name, "status", "selector"))
	_, err = e.dyn.Resource(infSetGVR).Namespace(appNS).UpdateStatus(e.ctx, u, metav1.UpdateOptions{})
	must(e.t, err)
}

// stepBehavior: no stabilization, so that each run starts from 1 again
// quickly; up to 4 pods per 15 s.
var stepBehavior = map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
	"scaleUp":   map[string]any{"stabilizationWindowSeconds": int64(0), "policies": []any{map[string]any{"type": "Pods", "value": int64(4), "periodSeconds": int64(15)}}},
	"scaleDown": map[string]any{"stabilizationWindowSeconds": int64(0), "policies": []any{map[string]any{"type": "Percent", "value": int64(100), "periodSeconds": int64(15)}}},
}}}

// StepQuery is the Kaito proposal's query in its sum form (the avg form
// under KEDA's AverageValue would ask for ceil(25/10) replicas too, for one
// pod: the two agree at one replica).
const stepQuery = `sum(vllm:num_requests_waiting)`

// stepRuns is how many steps stepLatency times: $PULSE_E2E_STEP_RUNS, or 2.
// Two show both paths scale on a step; the medians docs/simulation.md
// gives take more (8 a run: each step takes about 50 s).
func stepRuns(t *testing.T) int {
	v := os.Getenv("PULSE_E2E_STEP_RUNS")
	if v == "" {
		return 2
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		t.Fatalf("PULSE_E2E_STEP_RUNS=%q: want a whole number of runs from 1 to 100", v)
	}
	return n
}

// stepLatency: one simulated vLLM pod, scraped by pulse's agent every
// 500 ms and by a real Prometheus every 15 s; two InferenceSets at 1
// replica scaled by KEDA's HPA, one through pulse, one through KEDA's own
// prometheus trigger. The pod's queue steps from 0 to 25 (threshold 10) at
// a random moment; measured for each: the time to the HPA's new desired
// count and to the InferenceSet's /scale. docs/simulation.md compares
// these with what pulse-sim predicts for the same step.
func (e *env) stepLatency(t *testing.T) {
	if !e.cp.local() {
		t.Skip("1 → N needs KEDA's metrics adapter, which runs here only beside the test's own control plane")
	}
	sim := newSim(t)
	sim.setWaiting(0)
	ps := e.startPrometheus("127.0.0.1:" + sim.port)
	prom := ps.url
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "step-pulse-0", Namespace: appNS,
		Labels:      map[string]string{"kaito.sh/workspace": "step-pulse-0", "inferenceset.kaito.sh/created-by": "step-pulse"},
		Annotations: map[string]string{"pulse.io/port": sim.port}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	e.runReady(pod)
	for _, n := range []string{"step-pulse", "step-prom"} {
		e.stepInferenceSet(n)
	}
	spec := func(target string, trigger map[string]any) map[string]any {
		return map[string]any{"scaleTargetRef": map[string]any{"apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet", "name": target},
			"minReplicaCount": int64(1), "maxReplicaCount": int64(5), "pollingInterval": int64(30),
			"triggers": []any{trigger}, "advanced": stepBehavior}
	}
	e.createScaledObjectSpec("step-pulse-so", spec("step-pulse", map[string]any{"type": "external-push",
		"metadata":          map[string]any{"scalerAddress": e.scaler, "inferenceSet": "step-pulse", "threshold": "10", "window": "2s"},
		"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}))
	e.createScaledObjectSpec("step-prom-so", spec("step-prom", map[string]any{"type": "prometheus",
		"metadata": map[string]any{"serverAddress": prom, "query": stepQuery, "threshold": "10"}}))

	type sample struct{ desired, scale time.Duration }
	runs := map[string][]sample{}
	nRuns := stepRuns(t)
	for run := range nRuns {
		sim.setWaiting(0)
		waitFor(t, 120*time.Second, "both back at 1 replica, Prometheus seeing an empty queue", func() error {
			for _, so := range []string{"step-pulse-so", "step-prom-so"} {
				d, err := e.hpaDesired(so)
				if err != nil || d != 1 {
					return fmt.Errorf("%s: HPA desired %d, %v", so, d, err)
				}
			}
			for _, is := range []string{"step-pulse", "step-prom"} {
				if r, err := e.replicas(infSetGVR, is); err != nil || r != 1 {
					return fmt.Errorf("%s at %d, %v", is, r, err)
				}
			}
			if v, err := promQuery(prom, stepQuery); err != nil || v != 0 {
				return fmt.Errorf("prometheus sees %v, %v", v, err)
			}
			return nil
		})
		// Prometheus' scrapes and the HPA's syncs both come every 15 s:
		// their relative phase would be the same for every run. A new job
		// name gives the target a new scrape offset. (The old job's last
		// sample is the empty queue, so the sum is 0 until the new one's.)
		job := fmt.Sprintf("vllm-run%d", run)
		ps.relabel(t, job)
		waitFor(t, 60*time.Second, "the relabelled target scraped", func() error {
			_, err := promQuery(prom, fmt.Sprintf("vllm:num_requests_waiting{job=%q}", job))
			return err
		})
		// The step lands at a random point of the scrape and sync cycles.
		time.Sleep(rand.N(15 * time.Second))
		start := time.Now()
		sim.setWaiting(25)
		got := map[string]*sample{"pulse": {-1, -1}, "prometheus": {-1, -1}}
		waitFor(t, 120*time.Second, "both HPAs ask for more and both InferenceSets are scaled", func() error {
			for name, so := range map[string]string{"pulse": "step-pulse", "prometheus": "step-prom"} {
				s := got[name]
				if s.desired < 0 {
					if d, err := e.hpaDesired(so + "-so"); err == nil && d > 1 {
						s.desired = time.Since(start)
					}
				}
				if s.scale < 0 {
					if r, err := e.replicas(infSetGVR, so); err == nil && r > 1 {
						s.scale = time.Since(start)
					}
				}
				if s.desired < 0 || s.scale < 0 {
					return fmt.Errorf("%s not yet", name)
				}
			}
			return nil
		})
		for name, s := range got {
			runs[name] = append(runs[name], *s)
		}
		t.Logf("run %d: step → HPA desired / → /scale: pulse %s / %s, prometheus %s / %s", run+1,
			got["pulse"].desired.Round(100*time.Millisecond), got["pulse"].scale.Round(100*time.Millisecond),
			got["prometheus"].desired.Round(100*time.Millisecond), got["prometheus"].scale.Round(100*time.Millisecond))
	}
	sim.setWaiting(0)
	var report strings.Builder
	for _, name := range []string{"pulse", "prometheus"} {
		var d, s []time.Duration
		for _, x := range runs[name] {
			d, s = append(d, x.desired), append(s, x.scale)
		}
		slices.Sort(d)
		slices.Sort(s)
		fmt.Fprintf(&report, "%s: step → HPA desired median %s, max %s; → /scale median %s, max %s; all desired %v\n", name,
			d[len(d)/2].Round(100*time.Millisecond), d[len(d)-1].Round(100*time.Millisecond),
			s[len(s)/2].Round(100*time.Millisecond), s[len(s)-1].Round(100*time.Millisecond), d)
	}
	t.Log("\n" + report.String())
	if p := os.Getenv("PULSE_E2E_STEP_REPORT"); p != "" {
		_ = os.WriteFile(p, []byte(report.String()), 0o644)
	}
	for _, so := range []string{"step-pulse-so", "step-prom-so"} {
		_ = e.dyn.Resource(soGVR).Namespace(appNS).Delete(e.ctx, so, metav1.DeleteOptions{})
	}
}
