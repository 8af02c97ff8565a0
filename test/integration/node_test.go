package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/fakenode"
	"github.com/pulse-io/pulse/test/syncbuf"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// runAgent runs an agent with the given clients until the test ends.
func runAgent(t *testing.T, o *agent.Options, deps agent.Deps, log *slog.Logger) *agent.Agent {
	t.Helper()
	o.ScrapeInterval, o.HTTPAddr, o.ReconnectMaxBackoff = 200*time.Millisecond, "127.0.0.1:0", 500*time.Millisecond
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = quietLog()
	}
	a, err := agent.NewWithDeps(o, log, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	return a
}

// countingSim serves a simulated vLLM and counts the scrapes it gets.
type countingSim struct {
	sim   *vllmsim.Server
	port  string
	calls atomic.Int64
}

func startCountingSim(t *testing.T) *countingSim {
	t.Helper()
	c := &countingSim{sim: vllmsim.New(vllmsim.Options{})}
	h := c.sim.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			c.calls.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	c.port = u.Port()
	return c
}

// kubePod is a Kaito inference pod on node whose page is the sim's.
func kubePod(name, node, workspace string, sim *countingSim, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", UID: types.UID("uid-" + name),
			Labels:      map[string]string{discovery.LabelWorkspace: workspace},
			Annotations: map[string]string{discovery.AnnotationPort: sim.port}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestKubernetesPodsComeAndGo(t *testing.T) {
	simA, simB, simOther := startCountingSim(t), startCountingSim(t), startCountingSim(t)
	setLoad(simPod{sim: simA.sim}, 3, 1, 0.5)
	setLoad(simPod{sim: simB.sim}, 5, 1, 0.5)
	client := fake.NewClientset(kubePod("llama-a", "gpu-node-1", "llama", simA, false),
		kubePod("elsewhere", "gpu-node-2", "llama", simOther, true))
	agg, _ := startAggregator(t, "127.0.0.1:0")
	o := agent.NewOptions()
	o.Aggregators, o.NodeName, o.NVML = []string{agg.IngestAddr()}, "gpu-node-1", gpu.ModeOff
	runAgent(t, o, agent.Deps{Pods: fakenode.NodePods(client, "gpu-node-1")}, nil)
	pods := client.CoreV1().Pods("demo")
	ctx := context.Background()

	podsOf := func(name string) (map[string]string, error) {
		w, err := workload(agg.HTTPAddr(), name)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, p := range w.Pods {
			out[p.Name] = fmt.Sprintf("ready=%v fresh=%v waiting=%v", p.Ready, p.Fresh, p.Values["waiting"])
		}
		return out, nil
	}
	expect := func(what, workloadName string, want map[string]string) {
		t.Helper()
		eventually(t, what, func() error {
			got, err := podsOf(workloadName)
			if len(want) == 0 {
				if err == nil && len(got) > 0 {
					return fmt.Errorf("still there: %v", got)
				}
				return nil
			}
			if err != nil {
				return err
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("got %v, want %v", got, want)
			}
			return nil
		})
	}
	expect("a listed, not ready, not scraped", "llama", map[string]string{"llama-a": "ready=false fresh=false waiting=0"})
	if simA.calls.Load() != 0 {
		t.Fatal("a pod that is not ready was scraped")
	}

	if _, err := pods.UpdateStatus(ctx, kubePod("llama-a", "gpu-node-1", "llama", simA, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a made ready", "llama", map[string]string{"llama-a": "ready=true fresh=true waiting=3"})

	if _, err := pods.Create(ctx, kubePod("llama-b", "gpu-node-1", "llama", simB, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("b added", "llama", map[string]string{"llama-a": "ready=true fresh=true waiting=3", "llama-b": "ready=true fresh=true waiting=5"})

	if _, err := pods.Update(ctx, kubePod("llama-a", "gpu-node-1", "phi", simA, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a relabelled: gone from llama", "llama", map[string]string{"llama-b": "ready=true fresh=true waiting=5"})
	expect("a relabelled: in phi", "phi", map[string]string{"llama-a": "ready=true fresh=true waiting=3"})

	if _, err := pods.Update(ctx, kubePod("llama-b", "gpu-node-2", "llama", simB, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("b moved to another node", "llama", nil)

	if err := pods.Delete(ctx, "llama-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a deleted", "phi", nil)
	if n := simOther.calls.Load(); n != 0 {
		t.Fatalf("the pod of another node was scraped %d times", n)
	}
}

func TestGPUUtilizationPerPod(t *testing.T) {
	gpus := fakenode.GPUs(func(i int) uint32 { return uint32(10 * i) })
	agg := runGPUAgent(t, gpus, fakenode.Pod("demo", "llama-0", "nvidia.com/gpu", fakenode.UUID(gpus, 2), fakenode.UUID(gpus, 5)))
	eventually(t, "GPU values", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		v := w.Pods[0].Values
		// GPUs 2 and 5: 20% and 50% busy, 2 and 5 GiB of 40 used.
		if v["gpuUtilization"] != 0.35 || v["gpuMemoryUsage"] != 0.0875 {
			return fmt.Errorf("gpuUtilization %v gpuMemoryUsage %v, want 0.35 and 0.0875", v["gpuUtilization"], v["gpuMemoryUsage"])
		}
		return nil
	})
}

// TestAHungGPUReadIsNotSentAsFresh: an NVML call that hangs (a GPU fallen
// off the bus, a wedged driver) stopped the GPU reads, and every pod kept
// sending the last values read as fresh, for ever. Values older than three
// scrape intervals are no longer sent, and the agent stops while the call
// still hangs.
func TestAHungGPUReadIsNotSentAsFresh(t *testing.T) {
	gpus := fakenode.GPUs(func(i int) uint32 { return uint32(10 * i) })
	var hung atomic.Bool
	release := make(chan struct{})
	count := gpus.DeviceGetCountFunc
	gpus.DeviceGetCountFunc = func() (int, nvml.Return) {
		if hung.Load() {
			<-release
		}
		return count()
	}
	// Released after the agent stops (cleanups run last first): its stop
	// no longer waits for the GPU loop's hung call, which once held it
	// until the kubelet killed the pod.
	t.Cleanup(func() { close(release) })
	agg := runGPUAgent(t, gpus, fakenode.Pod("demo", "llama-0", "nvidia.com/gpu", fakenode.UUID(gpus, 2)))
	gpuValue := func() (float64, bool, error) {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil || len(w.Pods) == 0 {
			return 0, false, fmt.Errorf("no pod yet: %v", err)
		}
		v, ok := w.Pods[0].Values["gpuUtilization"]
		return v, ok, nil
	}
	eventually(t, "GPU values", func() error {
		if v, ok, err := gpuValue(); err != nil || !ok || v != 0.2 {
			return fmt.Errorf("gpuUtilization %v (%v), want 0.2: %v", v, ok, err)
		}
		return nil
	})
	hung.Store(true)
	eventually(t, "the GPU values gone while NVML hangs", func() error {
		if v, ok, err := gpuValue(); err != nil || ok {
			return fmt.Errorf("gpuUtilization %v (%v) still sent: %v", v, ok, err)
		}
		return nil
	})
}

// TestADriverReloadedIsReadAgain: a driver unloaded and loaded again (an
// upgrade) made every NVML read fail for good: NVML was initialized once.
// Now the agent shuts NVML down, initializes it again (at the next
// interval, then backing off), and the GPU values come back.
func TestADriverReloadedIsReadAgain(t *testing.T) {
	gpus := fakenode.GPUs(func(i int) uint32 { return uint32(10 * i) })
	var gone atomic.Bool
	count, initNVML := gpus.DeviceGetCountFunc, gpus.InitFunc
	gpus.DeviceGetCountFunc = func() (int, nvml.Return) {
		if gone.Load() {
			return 0, nvml.ERROR_DRIVER_NOT_LOADED
		}
		return count()
	}
	gpus.InitFunc = func() nvml.Return {
		if gone.Load() {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return initNVML()
	}
	// llama-1's device is one NVML does not know: counted as unknown
	// while NVML reads, and not while it is away (every device unread
	// then, which was counted as unknown at each interval).
	agg, ag := runGPUAgentWith(t, gpu.ModeOn, gpus, fakenode.Pod("demo", "llama-0", "nvidia.com/gpu", fakenode.UUID(gpus, 2)),
		fakenode.Pod("demo", "llama-1", "nvidia.com/gpu", "GPU-made-up"))
	counter := func(name string) float64 {
		t.Helper()
		v, err := agentCounter(ag, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	gpuValue := func(want bool) func() error {
		return func() error {
			w, err := workload(agg.HTTPAddr(), "llama")
			if err != nil {
				return fmt.Errorf("no pod yet: %v", err)
			}
			for _, p := range w.Pods {
				if p.Name != "llama-0" {
					continue
				}
				if v, ok := p.Values["gpuUtilization"]; ok != want || (want && v != 0.2) {
					return fmt.Errorf("gpuUtilization %v (%v), want it sent: %v", v, ok, want)
				}
				return nil
			}
			return errors.New("no llama-0 yet")
		}
	}
	eventually(t, "GPU values", gpuValue(true))
	eventually(t, "the device NVML does not know counted", func() error {
		if n := counter("pulse_agent_gpu_unknown_devices_total"); n == 0 {
			return errors.New("not counted")
		}
		return nil
	})
	gone.Store(true)
	eventually(t, "the GPU values gone with the driver", gpuValue(false))
	unknown, failed := counter("pulse_agent_gpu_unknown_devices_total"), counter("pulse_agent_nvml_errors_total")
	eventually(t, "three more failed NVML reads", func() error {
		if n := counter("pulse_agent_nvml_errors_total"); n < failed+3 {
			return fmt.Errorf("%v failed reads, want %v", n, failed+3)
		}
		return nil
	})
	if n := counter("pulse_agent_gpu_unknown_devices_total"); n != unknown {
		t.Fatalf("unknown devices %v → %v while NVML was away: its devices are unread, not unknown", unknown, n)
	}
	gone.Store(false)
	eventually(t, "the GPU values back with the driver", gpuValue(true))
}

// runGPUAgent runs an aggregator and an agent (--nvml=on, lib its NVML: nil
// for the driver's) whose kubelet lists pods, each of workload llama with a
// simulated page.
func runGPUAgent(t *testing.T, lib nvml.Interface, pods ...*podresourcesv1.PodResources) *aggregator.Aggregator {
	t.Helper()
	return runGPUAgentMode(t, gpu.ModeOn, lib, pods...)
}

// runGPUAgentMode is runGPUAgent with --nvml=mode.
func runGPUAgentMode(t *testing.T, mode string, lib nvml.Interface, pods ...*podresourcesv1.PodResources) *aggregator.Aggregator {
	t.Helper()
	agg, _ := runGPUAgentWith(t, mode, lib, pods...)
	return agg
}

// runGPUAgentWith is runGPUAgentMode, returning the agent too.
func runGPUAgentWith(t *testing.T, mode string, lib nvml.Interface, pods ...*podresourcesv1.PodResources) (*aggregator.Aggregator, *agent.Agent) {
	t.Helper()
	var specs []simPod
	for _, p := range pods {
		specs = append(specs, simPod{name: p.Name, workload: "llama"})
	}
	sims := startSims(t, specs)
	agg, _ := startAggregator(t, "127.0.0.1:0")
	kubelet := &fakenode.Kubelet{}
	kubelet.SetPods(pods...)
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	kubelet.Serve(t, socket)
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, sims)
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName = file, []string{agg.IngestAddr()}, "gpu-node-1"
	o.NVML, o.PodResourcesSocket = mode, socket
	ag := runAgent(t, o, agent.Deps{NVML: lib}, nil)
	return agg, ag
}

// agentCounter is the value of the agent's counter name (no labels) on
// its /metrics.
func agentCounter(ag *agent.Agent, name string) (float64, error) {
	resp, err := http.Get("http://" + ag.HTTPAddr() + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s on the agent's /metrics", name)
}

// TestADriverLoadedAfterTheAgentIsRead: with --nvml=auto, a driver whose
// library is there and that is not loaded yet when the agent starts (the
// GPU Operator's driver container after the DaemonSet) left the agent
// without GPU values for its life. It is now initialized again until it
// loads, and the pods' GPU values come.
func TestADriverLoadedAfterTheAgentIsRead(t *testing.T) {
	gpus := fakenode.GPUs(func(i int) uint32 { return uint32(10 * i) })
	var loaded atomic.Bool
	init := gpus.InitFunc
	gpus.InitFunc = func() nvml.Return {
		if !loaded.Load() {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return init()
	}
	agg := runGPUAgentMode(t, gpu.ModeAuto, gpus, fakenode.Pod("demo", "llama-0", "nvidia.com/gpu", fakenode.UUID(gpus, 2)))
	eventually(t, "the pod's vLLM values, with no GPU value", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		if _, has := w.Pods[0].Values["gpuUtilization"]; has || w.Pods[0].Values["waiting"] != 0 {
			return fmt.Errorf("values %v, want vLLM's alone", w.Pods[0].Values)
		}
		return nil
	})
	loaded.Store(true)
	eventually(t, "GPU values once the driver is loaded", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		if v := w.Pods[0].Values["gpuUtilization"]; v != 0.2 {
			return fmt.Errorf("gpuUtilization %v, want GPU 2's 0.2", v)
		}
		return nil
	})
}

func TestNoGPUDriverSaysSoOnceAndKeepsStreaming(t *testing.T) {
	if nvml.New().Init() == nvml.SUCCESS {
		t.Skip("this machine has an NVIDIA driver")
	}
	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}})
	agg, _ := startAggregator(t, "127.0.0.1:0")
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{agg.IngestAddr()}, "node-1", gpu.ModeAuto
	var logs syncbuf.Buffer
	runAgent(t, o, agent.Deps{}, slog.New(slog.NewTextHandler(&logs, nil)))
	for _, waiting := range []float64{1, 2, 3} {
		setLoad(pods[0], waiting, 1, 0.1)
		eventually(t, "vLLM values keep streaming", func() error {
			w, err := workload(agg.HTTPAddr(), "llama")
			if err != nil {
				return err
			}
			if w.Pods[0].Values["waiting"] != waiting {
				return fmt.Errorf("waiting %v, want %v", w.Pods[0].Values["waiting"], waiting)
			}
			return nil
		})
	}
	if n := strings.Count(logs.String(), "NVML unavailable"); n != 1 {
		t.Fatalf("NVML unavailable said %d times, want once:\n%s", n, logs.String())
	}
}

// fakeDNS answers one name with the IPs it currently holds.
type fakeDNS struct {
	mu  sync.Mutex
	ips []string
}

func (f *fakeDNS) set(ips ...string) { f.mu.Lock(); f.ips = ips; f.mu.Unlock() }
func (f *fakeDNS) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if host != "pulse-aggregator-ingest.pulse.svc" {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return append([]string(nil), f.ips...), nil
}

func TestEveryAggregatorReplicaIsFed(t *testing.T) {
	// Three replicas behind one name, on one port of three loopback addresses.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	agg1, stop1 := startAggregator(t, "127.0.0.1:"+port)
	agg2, _ := startAggregator(t, "127.0.0.2:"+port)
	dns := &fakeDNS{}
	dns.set("127.0.0.1", "127.0.0.2")

	pods := startSims(t, []simPod{{name: "llama-0", workload: "llama"}, {name: "llama-1", workload: "llama"}})
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	o.StaticTargets, o.NodeName, o.NVML = file, "node-1", gpu.ModeOff
	o.Aggregators, o.ResolveInterval = []string{"pulse-aggregator-ingest.pulse.svc:" + port}, 200*time.Millisecond
	ag := runAgent(t, o, agent.Deps{Resolver: dns}, nil)

	same := func(what string, aggs ...string) {
		t.Helper()
		eventually(t, what, func() error {
			var first string
			for _, addr := range aggs {
				w, err := workload(addr, "llama")
				if err != nil {
					return fmt.Errorf("%s: %v", addr, err)
				}
				got := fmt.Sprint(len(w.Pods), w.Averages["waiting"], w.Averages["kvCacheUsage"])
				if first == "" {
					first = got
				} else if got != first {
					return fmt.Errorf("%s says %s, the first replica %s", addr, got, first)
				}
			}
			return nil
		})
	}
	setLoad(pods[0], 4, 1, 0.25)
	setLoad(pods[1], 8, 1, 0.75)
	same("both replicas hold the same state", agg1.HTTPAddr(), agg2.HTTPAddr())
	eventually(t, "the values", func() error {
		w, err := workload(agg2.HTTPAddr(), "llama")
		if err != nil || w.Averages["waiting"] != 6 {
			return fmt.Errorf("%v %v", w.Averages, err)
		}
		return nil
	})

	// One replica stops; the other goes on undisturbed.
	stop1()
	setLoad(pods[0], 10, 1, 0.25)
	eventually(t, "the other replica goes on", func() error {
		w, err := workload(agg2.HTTPAddr(), "llama")
		if err != nil || w.Averages["waiting"] != 9 {
			return fmt.Errorf("%v %v", w.Averages, err)
		}
		return nil
	})

	// A third replica appears behind the name: it is fed after a re-resolve.
	agg3, _ := startAggregator(t, "127.0.0.3:"+port)
	dns.set("127.0.0.2", "127.0.0.3")
	same("the new replica holds the same state", agg2.HTTPAddr(), agg3.HTTPAddr())
	// The replica gone from the name leaves no series behind: they stayed,
	// connected 0, after every rollout (an alert on them fired for ever).
	seriesOnlyOf(t, ag, "127.0.0.1:"+port, "127.0.0.3:"+port)
}

// seriesOnlyOf waits until the agent exports no series of the aggregator
// address gone, and some of the one kept.
func seriesOnlyOf(t *testing.T, ag *agent.Agent, gone, kept string) {
	t.Helper()
	eventually(t, "the series of the replica gone removed", func() error {
		resp, err := http.Get("http://" + ag.HTTPAddr() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b), `aggregator="`+gone+`"`) {
			return fmt.Errorf("series of %s still exported", gone)
		}
		if !strings.Contains(string(b), `aggregator="`+kept+`"`) {
			return fmt.Errorf("no series of %s:\n%s", kept, b)
		}
		return nil
	})
}

func writeTargets(t *testing.T, file string, pods []simPod) {
	t.Helper()
	targets := "targets:\n"
	for _, p := range pods {
		targets += fmt.Sprintf("- namespace: demo\n  pod: %s\n  workspace: %s\n  url: %s\n", p.name, p.workload, p.url)
		if p.state != "" {
			targets += "  " + p.state + "\n" // e.g. "ready: false" or "terminating: true"
		}
	}
	if err := writeFile(file, targets); err != nil {
		t.Fatal(err)
	}
}
