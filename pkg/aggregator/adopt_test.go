package aggregator

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestNoReplicaIsAdoptedDuringTheWarmUp: while a restarted aggregator's
// agents connect again, the API's replicas are not adopted as unseen
// (every node would be unheard for a moment, and each agent's first
// catalogue would walk them all to forget its own); once the warm-up is
// over they are.
func TestNoReplicaIsAdoptedDuringTheWarmUp(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "ns", UID: "uid-0",
		Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "gpu-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	agent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pulse-agent-x", Namespace: "pulse-system", UID: "uid-agent"},
		Spec: corev1.PodSpec{NodeName: "gpu-1", ServiceAccountName: "pulse-agent"}}
	tr, err := ingest.NewTokenReviewer(fake.NewClientset(pod, agent), "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go tr.Run(ctx)
	for tr.Ready() != nil {
		if ctx.Err() != nil {
			t.Fatal("the pod cache did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := store.New(store.Options{})
	a := &Aggregator{reviewer: tr, store: st, warmup: newWarmup(st, time.Hour, 0, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	k := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	all := func(string) bool { return true }
	if got, ok := a.apiReplicas(k, all); got != nil || ok {
		t.Fatalf("during the warm-up: %+v, %v; want no answer", got, ok)
	}
	a.warmup.over.Store(true)
	if got, ok := a.apiReplicas(k, all); !ok || len(got) != 1 || got[0].Node != "gpu-1" {
		t.Fatalf("after the warm-up: %+v, %v; want llama-0 on gpu-1", got, ok)
	}
}
