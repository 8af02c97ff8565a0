package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

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
	simA, simB := startCountingSim(t), startCountingSim(t)
	setLoad(simPod{sim: simA.sim}, 0, 2, 0.2)
	setLoad(simPod{sim: simB.sim}, 0, 2, 0.2)
	a, b := kubePod("llama-a", "gpu-node-1", "llama", simA, true), kubePod("llama-b", "gpu-node-2", "llama", simB, true)
	agentAPI := fake.NewClientset(a.DeepCopy(), b.DeepCopy())
	serverAPI := fake.NewClientset(a.DeepCopy(), b.DeepCopy())
	fakenode.TokenReviews(serverAPI, "pulse", map[string]fakenode.Token{
		"token-1": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-1"},
		"token-2": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-2"}})
	files := agentTLS(t, "token-1", "token-2")

	o := aggregator.NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = files[0], files[1]
	o.Warmup.Duration, o.AgentAuth.Mode, o.Store.PodExpiry = 0, "tokenreview", 2*time.Second
	agg := runAggregator(t, o, aggregator.Deps{Kube: serverAPI})
	link := newForwarder(t, agg.IngestAddr()) // node 1's way to the aggregator
	for i, addr := range []string{link.addr(), agg.IngestAddr()} {
		node := fmt.Sprintf("gpu-node-%d", i+1)
		ao := agent.NewOptions()
		ao.Aggregators, ao.NodeName, ao.NVML = []string{"localhost:" + portOf(addr)}, node, gpu.ModeOff
		ao.AggregatorCAFile, ao.TokenFile = files[2], files[3+i]
		runAgent(t, ao, agent.Deps{Pods: fakenode.NodePods(agentAPI, node), Resolver: loopbackDNS{}}, nil)
	}
	keda := kedaClient(t, agg.ScalerAddr())
	md := map[string]string{"workspace": "llama", "metric": "replicas"}
	// A threshold trigger too: each replica runs 2, under 10, so the
	// HPA's rule fills a ready replica with no value at the threshold.
	running := map[string]string{"workspace": "llama", "metric": "running", "threshold": "10", "window": "5s"}
	plan := func(want float64, unseen int) func() error {
		return func() error {
			v, err := getMetric(keda, md)
			if err != nil || v != want {
				return fmt.Errorf("GetMetrics = %v, %v; want %v", v, err, want)
			}
			wantRunning := 2 * (want - float64(unseen))
			if unseen > 0 {
				wantRunning += 10
			}
			if v, err := getMetric(keda, running); err != nil || v != wantRunning {
				return fmt.Errorf("running: GetMetrics = %v, %v; want %v", v, err, wantRunning)
			}
			p, err := planOf(agg.HTTPAddr())
			if err != nil || p.Unseen != unseen || p.Ready != int(want) {
				return fmt.Errorf("plan %+v, %v: want %v ready, %d unseen", p, err, want, unseen)
			}
			return nil
		}
	}
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
