//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pulse-io/pulse/test/router"
)

// demandAtZero: an endpoint picker's pod on the agent's node, annotated as
// the demand source of Workspace mistral, which has no pod at all; the
// first request it holds for mistral scales the Workspace from 0 to 1
// through KEDA's push stream (its ScaledObject is polled every 5 minutes).
func (e *env) demandAtZero(t *testing.T) {
	rt := router.New(router.Options{LLMD: true})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "epp-0", Namespace: appNS, Annotations: map[string]string{
			"pulse.io/demand-source": "epp", "pulse.io/demand-workloads": "mistral=mistralai/Mistral-7B-Instruct",
			"pulse.io/port": u.Port()}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "epp", Image: "registry.k8s.io/gateway-api-inference-extension/epp"}}},
	}
	e.runReady(pod)
	e.createWorkload(workspaceGVR, "mistral", map[string]any{"inference": map[string]any{"replicas": int64(0)}})
	e.createScaledObject("mistral-so", "Workspace", "kaito.sh/v1beta1", "mistral", 300, nil, nil)

	md := map[string]string{"workspace": "mistral", "threshold": "10", "activationThreshold": "0", "window": "2s"}
	e.waitValue(t, "the router's demand for mistral reported (0)", md, "mistral-so", 0)
	if r, err := e.replicas(workspaceGVR, "mistral"); err != nil || r != 0 {
		t.Fatalf("mistral at %d replicas (%v) before any request", r, err)
	}
	// The request lands at a random point of the agent's scrape interval
	// (500 ms here).
	time.Sleep(500*time.Millisecond + rand.N(500*time.Millisecond))
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	start := time.Now()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions",
			bytes.NewReader([]byte(`{"model":"mistralai/Mistral-7B-Instruct"}`)))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	waitFor(t, 60*time.Second, "KEDA scales mistral 0 → 1", func() error {
		r, err := e.replicas(workspaceGVR, "mistral")
		if err != nil {
			return err
		}
		if r != 1 {
			return fmt.Errorf("replicas %d (router holds %d)", r, rt.Held("mistralai/Mistral-7B-Instruct"))
		}
		return nil
	})
	report := fmt.Sprintf("demand at zero (first held request at the router → Workspace /scale at 1, no pod of the workload): %s",
		time.Since(start).Round(time.Millisecond))
	t.Log(report)
	if p := os.Getenv("PULSE_E2E_DEMAND_REPORT"); p != "" {
		_ = os.WriteFile(p, []byte(report+"\n"), 0o644)
	}
	rt.SetBackend("mistralai/Mistral-7B-Instruct", true)
	must(t, e.kube.CoreV1().Pods(appNS).Delete(e.ctx, "epp-0", metav1.DeleteOptions{}))
}
