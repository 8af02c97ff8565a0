package integration

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/fakenode"
	"github.com/pulse-io/pulse/test/testpki"
)

// TestAgentOverTLSWithItsToken: the agent reaches the aggregator over TLS
// with its ServiceAccount token; the aggregator reviews the token and takes
// only the pods of the token's node. On either transport.
func TestAgentOverTLSWithItsToken(t *testing.T) {
	for _, transport := range []string{agent.TransportGRPC, agent.TransportFramed} {
		t.Run(transport, func(t *testing.T) { agentOverTLSWithItsToken(t, transport) })
	}
}

func agentOverTLSWithItsToken(t *testing.T, transport string) {
	simMine, simTheirs := startCountingSim(t), startCountingSim(t)
	setLoad(simPod{sim: simMine.sim}, 6, 1, 0.5)
	mine := kubePod("mine", "gpu-node-1", "llama", simMine, true)
	theirs := kubePod("theirs", "gpu-node-2", "llama", simTheirs, true)
	// The agent's view: a (wrongly) unfiltered cache holding both pods, as a
	// compromised or buggy agent could send. The aggregator must refuse theirs.
	agentAPI := fake.NewClientset(mine.DeepCopy(), theirs.DeepCopy())
	theirsOnMyNode := theirs.DeepCopy()
	theirsOnMyNode.Spec.NodeName = "gpu-node-1"
	_, _ = agentAPI.CoreV1().Pods("demo").Update(context.Background(), theirsOnMyNode, metav1Update)
	serverAPI := fake.NewClientset(mine.DeepCopy(), theirs.DeepCopy())
	fakenode.TokenReviews(serverAPI, "pulse", map[string]fakenode.Token{
		"agent-token": {User: "system:serviceaccount:pulse-system:pulse-agent", Node: "gpu-node-1"}})

	files := agentTLS(t, "agent-token")

	o := aggregator.NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = files[0], files[1]
	o.Warmup.Duration = 0
	o.AgentAuth.Mode = "tokenreview"
	agg := runAggregator(t, o, aggregator.Deps{Kube: serverAPI})

	ao := agent.NewOptions()
	ao.Aggregators, ao.NodeName, ao.NVML = []string{"localhost:" + portOf(agg.IngestAddr())}, "gpu-node-1", gpu.ModeOff
	ao.AggregatorCAFile, ao.TokenFile = files[2], files[3]
	ao.Transport = transport
	runAgent(t, ao, agent.Deps{Pods: fakenode.NodePods(agentAPI, "gpu-node-1"), Resolver: loopbackDNS{}}, nil)

	eventually(t, "only the pod of the token's node", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		if err != nil {
			return err
		}
		if len(w.Pods) != 1 || w.Pods[0].Name != "mine" || w.Pods[0].Values["waiting"] != 6 {
			return fmt.Errorf("pods %+v", w.Pods)
		}
		return nil
	})
	// The API deletes mine while the agent's view (not told) still lists
	// it and sends its samples: the aggregator lets it go as its pod cache
	// sees it deleted, not when the stream ends.
	if err := serverAPI.CoreV1().Pods("demo").Delete(context.Background(), "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mine let go once the API deleted it", func() error {
		w, err := workload(agg.HTTPAddr(), "llama")
		switch {
		case err == nil && len(w.Pods) > 0:
			return fmt.Errorf("pods %+v", w.Pods)
		case err != nil && !strings.Contains(err.Error(), "404"):
			return err // the page not read: says nothing
		}
		return nil // none held: the workload is gone from the page (404)
	})
}

var metav1Update = metav1.UpdateOptions{}

// agentTLS writes the aggregator's serving certificate and key, the CA
// that signed them, and a file for each token: their paths, in that order.
func agentTLS(t *testing.T, tokens ...string) []string {
	t.Helper()
	ca := testpki.NewCA(t)
	crt, key := ca.Issue(t, "pulse-aggregator", 7, x509.ExtKeyUsageServerAuth)
	content := map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca.PEM}
	names := []string{"tls.crt", "tls.key", "ca.crt"}
	for i, tok := range tokens {
		name := fmt.Sprintf("token-%d", i)
		content[name], names = []byte(tok+"\n"), append(names, name)
	}
	return testpki.Write(t, t.TempDir(), content, names...)
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// loopbackDNS resolves every name to 127.0.0.1.
type loopbackDNS struct{}

func (loopbackDNS) LookupHost(context.Context, string) ([]string, error) {
	return []string{"127.0.0.1"}, nil
}
