package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/test/fakenode"
	"github.com/pulse-io/pulse/test/procs"
)

// TestAgentsThroughARelay: two nodes' agents reach two aggregator replicas
// through a pulse-relay, over TLS both ways, each with its ServiceAccount
// token; each replica reviews each stream's token as it does an agent's own
// and takes each node's pods. Each agent holds one connection to the relay
// (its two streams on it), and each replica gets its streams on one. A
// relay that stops ends its streams; the agents come back through the
// next.
func TestAgentsThroughARelay(t *testing.T) {
	sim1, sim2 := startCountingSim(t), startCountingSim(t)
	setLoad(simPod{sim: sim1.sim}, 6, 1, 0.5)
	setLoad(simPod{sim: sim2.sim}, 3, 1, 0.5)
	pod1 := kubePod("one", "gpu-node-1", "llama", sim1, true)
	pod2 := kubePod("two", "gpu-node-2", "llama", sim2, true)
	api := fake.NewClientset(pod1.DeepCopy(), pod2.DeepCopy())
	fakenode.TokenReviews(api, "pulse", map[string]fakenode.Token{
		"token-1": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-1"},
		"token-2": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-2"}})
	files := agentTLS(t, "token-1", "token-2")

	o := aggregator.NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.Serving.MaxIngestStreamsPerConnection = 64
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = files[0], files[1]
	o.Warmup.Duration = 0
	o.AgentAuth.Mode = "tokenreview"
	agg := runAggregator(t, o, aggregator.Deps{Kube: api})
	o2 := *o // a second replica
	agg2 := runAggregator(t, &o2, aggregator.Deps{Kube: api})
	replicas := []string{"localhost:" + portOf(agg.IngestAddr()), "localhost:" + portOf(agg2.IngestAddr())}

	ro := relay.NewOptions()
	var err error
	if ro.Listen, err = procs.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	if ro.HTTPAddr, err = procs.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	ro.Aggregators = replicas
	ro.TLSCertFile, ro.TLSKeyFile, ro.AggregatorCAFile = files[0], files[1], files[2]
	if err := ro.Validate(); err != nil {
		t.Fatal(err)
	}
	stopRelay := startRelay(t, ro)

	for i, node := range []string{"gpu-node-1", "gpu-node-2"} {
		ao := agent.NewOptions()
		ao.Aggregators, ao.NodeName, ao.NVML = replicas, node, gpu.ModeOff
		ao.Relay = "localhost:" + portOf(ro.Listen)
		ao.AggregatorCAFile, ao.TokenFile = files[2], files[3+i]
		runAgent(t, ao, agent.Deps{Pods: fakenode.NodePods(api, node), Resolver: loopbackDNS{}}, nil)
	}

	for _, a := range []*aggregator.Aggregator{agg, agg2} {
		eventually(t, "both nodes' pods at each replica, through the relay", func() error {
			w, err := workload(a.HTTPAddr(), "llama")
			if err != nil {
				return err
			}
			got := map[string]float64{}
			for _, p := range w.Pods {
				got[p.Name] = p.Values["waiting"]
			}
			if len(got) != 2 || got["one"] != 6 || got["two"] != 3 {
				return fmt.Errorf("pods %v", got)
			}
			return nil
		})
	}
	for _, a := range []*aggregator.Aggregator{agg, agg2} {
		if err := streamsAre(t, a.HTTPAddr(), 2); err != nil {
			t.Error(err)
		}
	}
	if err := testutil.GatherAndCompare(servedMetrics(t, "http://"+ro.HTTPAddr+"/metrics"), strings.NewReader(`
# HELP pulse_relay_connections Agents' connections held open now.
# TYPE pulse_relay_connections gauge
pulse_relay_connections 2
# HELP pulse_relay_streams Agent streams the relay forwards now.
# TYPE pulse_relay_streams gauge
pulse_relay_streams 4
# HELP pulse_relay_upstream_connections Connections open to aggregator replicas.
# TYPE pulse_relay_upstream_connections gauge
pulse_relay_upstream_connections 2
`), "pulse_relay_connections", "pulse_relay_streams", "pulse_relay_upstream_connections"); err != nil {
		t.Error(err)
	}

	// The relay stops (its pod gone): its streams end, and the agents
	// reconnect through the relay that takes its place (here, on the same
	// address: a Service's), with their tokens reviewed again.
	stopRelay()
	eventually(t, "the streams gone with the relay", func() error {
		return errors.Join(streamsAre(t, agg.HTTPAddr(), 0), streamsAre(t, agg2.HTTPAddr(), 0))
	})
	startRelay(t, ro)
	eventually(t, "the agents back through the new relay", func() error {
		return errors.Join(streamsAre(t, agg.HTTPAddr(), 2), streamsAre(t, agg2.HTTPAddr(), 2))
	})
}

// startRelay runs a pulse-relay of o until it is ready; stop ends it (and
// the test's end does, once).
func startRelay(t *testing.T, o *relay.Options) (stop func()) {
	t.Helper()
	rs, err := relay.NewServer(o, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rs.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	eventually(t, "the relay ready", func() error {
		resp, err := http.Get("http://" + o.HTTPAddr + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	return stop
}

// streamsAre checks the aggregator's agent streams open now.
func streamsAre(t *testing.T, httpAddr string, want int) error {
	return testutil.GatherAndCompare(servedMetrics(t, "http://"+httpAddr+"/metrics"), strings.NewReader(fmt.Sprintf(`
# HELP pulse_aggregator_agent_streams Agent streams open now.
# TYPE pulse_aggregator_agent_streams gauge
pulse_aggregator_agent_streams %d
`, want)), "pulse_aggregator_agent_streams")
}
