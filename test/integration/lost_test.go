package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/test/fakenode"
)

// TestALostAgentsReplicasAreHeldWhileTheAPIHasThem: a workload's two
// replicas on two nodes; one node's agent is cut off (no removal, its
// stream simply gone) past --pod-expiry while its replica serves on. The
// planner saw only the other replica and planned one (docs/planner.md,
// rule 8). While the API still has the pod it is now planned as a ready
// replica with no sample: 2, with the plan naming it unseen; a threshold
// trigger fills it as the HPA's rule fills a ready pod with no value. Once
// the pod has failed (evicted), it is gone: 1.
func TestALostAgentsReplicasAreHeldWhileTheAPIHasThem(t *testing.T) {
	c := newLostCluster(t)
	link := newForwarder(t, c.agg.IngestAddr()) // node 1's way to the aggregator
	c.runAgent(t, 1, link.addr())
	c.runAgent(t, 2, c.agg.IngestAddr())
	agg, a, serverAPI, o := c.agg, c.a, c.serverAPI, c.o
	keda := kedaClient(t, agg.ScalerAddr())
	plan := func(want float64, unseen int) func() error { return planIs(keda, agg.HTTPAddr(), want, unseen) }
	eventually(t, "both replicas reporting", plan(2, 0))
	link.cut()
	// Past --pod-expiry node 1's replica is dropped from the store; the
	// API still has it.
	eventually(t, "node 1's replica unseen, held", plan(2, 1))
	time.Sleep(2 * o.Store.PodExpiry)
	if err := plan(2, 1)(); err != nil {
		t.Fatalf("well past --pod-expiry: %v", err)
	}
	// Evicted by its kubelet (Failed, not deleted): its ReplicaSet has
	// replaced it, and it is no replica.
	failed := a.DeepCopy()
	failed.Status.Phase, failed.Status.Reason = corev1.PodFailed, "Evicted"
	if _, err := serverAPI.CoreV1().Pods("demo").UpdateStatus(context.Background(), failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node 1's replica evicted, gone", plan(1, 0))
}

// lostCluster: an aggregator with TLS and TokenReview (--pod-expiry 2s,
// no warm-up) whose API has the two replicas of workspace llama, a on
// gpu-node-1 and b on gpu-node-2, each running 2.
type lostCluster struct {
	agg                 *aggregator.Aggregator
	a                   *corev1.Pod
	agentAPI, serverAPI *fake.Clientset
	files               []string
	o                   *aggregator.Options
}

func newLostCluster(t *testing.T) *lostCluster {
	simA, simB := startCountingSim(t), startCountingSim(t)
	setLoad(simPod{sim: simA.sim}, 0, 2, 0.2)
	setLoad(simPod{sim: simB.sim}, 0, 2, 0.2)
	a, b := kubePod("llama-a", "gpu-node-1", "llama", simA, true), kubePod("llama-b", "gpu-node-2", "llama", simB, true)
	// The agents' own pods (the DaemonSet's), as the API has them: a node
	// whose agent's pod is there and does not stream has its agent lost.
	agentPod := func(node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pulse-agent-" + node, Namespace: "pulse-system", UID: types.UID("uid-agent-" + node)},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "pulse-agent"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	c := &lostCluster{a: a, agentAPI: fake.NewClientset(a.DeepCopy(), b.DeepCopy()),
		serverAPI: fake.NewClientset(a.DeepCopy(), b.DeepCopy(), agentPod("gpu-node-1"), agentPod("gpu-node-2"))}
	fakenode.TokenReviews(c.serverAPI, "pulse", map[string]fakenode.Token{
		"token-1": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-1"},
		"token-2": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-2"}})
	c.files = agentTLS(t, "token-1", "token-2")
	c.o = aggregator.NewOptions()
	c.o.Serving.IngestAddr, c.o.Serving.ScalerAddr, c.o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	c.o.IngestTLS.CertFile, c.o.IngestTLS.KeyFile = c.files[0], c.files[1]
	c.o.Warmup.Duration, c.o.AgentAuth.Mode, c.o.Store.PodExpiry = 0, "tokenreview", 2*time.Second
	c.agg = runAggregator(t, c.o, aggregator.Deps{Kube: c.serverAPI})
	return c
}

// runAgent runs gpu-node-n's agent, streaming to addr.
func (c *lostCluster) runAgent(t *testing.T, n int, addr string) {
	node := fmt.Sprintf("gpu-node-%d", n)
	ao := agent.NewOptions()
	ao.Aggregators, ao.NodeName, ao.NVML = []string{"localhost:" + portOf(addr)}, node, gpu.ModeOff
	ao.AggregatorCAFile, ao.TokenFile = c.files[2], c.files[2+n]
	runAgent(t, ao, agent.Deps{Pods: fakenode.NodePods(c.agentAPI, node), Resolver: loopbackDNS{}}, nil)
}

// TestAReplicaNoAgentReportsIsHeldFromTheStart: an aggregator started (or
// restarted) while a node's agent is lost never heard of that node's
// replicas, and planned the workload from the others' share: 1 for 2
// serving (docs/planner.md, rule 8). The API's replica on a node no agent
// streams from is an unseen replica too: 2; once its agent streams and
// lists it, it is seen.
func TestAReplicaNoAgentReportsIsHeldFromTheStart(t *testing.T) {
	c := newLostCluster(t)
	c.runAgent(t, 2, c.agg.IngestAddr())
	keda := kedaClient(t, c.agg.ScalerAddr())
	eventually(t, "node 1 unheard, its replica unseen", planIs(keda, c.agg.HTTPAddr(), 2, 1))
	c.runAgent(t, 1, c.agg.IngestAddr())
	eventually(t, "node 1's agent back", planIs(keda, c.agg.HTTPAddr(), 2, 0))
}

// planIs checks the replicas trigger of workspace llama (its two pods
// each running 2): GetMetrics answers want, /debug/triggers' plan has want
// ready replicas of which unseen unseen, and a running trigger at 10
// fills each unseen replica at its threshold (the HPA's rule for a ready
// pod with no value).
func planIs(keda externalscaler.ExternalScalerClient, httpAddr string, want float64, unseen int) func() error {
	md := map[string]string{"workspace": "llama", "metric": "replicas"}
	running := map[string]string{"workspace": "llama", "metric": "running", "threshold": "10", "window": "5s"}
	return func() error {
		v, err := getMetric(keda, md)
		if err != nil || v != want {
			return fmt.Errorf("GetMetrics = %v, %v; want %v", v, err, want)
		}
		wantRunning := 2*(want-float64(unseen)) + 10*float64(unseen)
		if v, err := getMetric(keda, running); err != nil || v != wantRunning {
			return fmt.Errorf("running: GetMetrics = %v, %v; want %v", v, err, wantRunning)
		}
		p, err := planOf(httpAddr)
		if err != nil || p.Unseen != unseen || p.Ready != int(want) {
			return fmt.Errorf("plan %+v, %v: want %v ready, %d unseen", p, err, want, unseen)
		}
		return nil
	}
}

// planOf reads the replicas trigger's plan from /debug/triggers.
func planOf(httpAddr string) (*planner.Plan, error) {
	doc, err := triggers(httpAddr)
	if err != nil {
		return nil, err
	}
	for _, tr := range doc.Triggers {
		if tr.Decision != nil && tr.Decision.Plan != nil {
			return tr.Decision.Plan, nil
		}
	}
	return nil, fmt.Errorf("triggers %+v: want a replicas trigger's plan", doc.Triggers)
}
