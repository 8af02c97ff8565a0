package discovery

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestNodePodsAsksForPodsNotFinished: the list and watch asked for every pod
// bound to the node, the finished ones too (a tenant's pods pinned to the
// node to fail, or Jobs that end: no quota counts them, the pod GC keeps
// thousands), each held whole by a relist until the informer's transform
// slimmed it, past the agent's memory limit. The API server is asked for
// the node's pods that have not finished, in the list and in the watch.
func TestNodePodsAsksForPodsNotFinished(t *testing.T) {
	var mu sync.Mutex
	asked := map[string]string{} // by request kind: list, watch
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := "list"
		if r.URL.Query().Get("watch") == "true" {
			kind = "watch"
		}
		mu.Lock()
		asked[kind] = r.URL.Query().Get("fieldSelector")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if kind == "list" {
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`))
		}
	}))
	defer srv.Close()
	lw, err := NodePods(&rest.Config{Host: srv.URL}, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	lwc := cache.ToListerWatcherWithContext(lw)
	if _, err := lwc.ListWithContext(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if w, err := lwc.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "1"}); err == nil {
		w.Stop()
	}
	mu.Lock()
	defer mu.Unlock()
	for _, kind := range []string{"list", "watch"} {
		sel, err := fields.ParseSelector(asked[kind])
		if err != nil {
			t.Fatalf("%s: field selector %q: %v", kind, asked[kind], err)
		}
		for phase, want := range map[corev1.PodPhase]bool{corev1.PodPending: true, corev1.PodRunning: true, corev1.PodUnknown: true, corev1.PodSucceeded: false, corev1.PodFailed: false} {
			if got := sel.Matches(fields.Set{"spec.nodeName": "node-1", "status.phase": string(phase)}); got != want {
				t.Errorf("%s (%q): a pod of the node %s selected %v, want %v", kind, asked[kind], phase, got, want)
			}
		}
		if sel.Matches(fields.Set{"spec.nodeName": "node-2", "status.phase": string(corev1.PodRunning)}) {
			t.Errorf("%s (%q): another node's pod selected", kind, asked[kind])
		}
	}
}
