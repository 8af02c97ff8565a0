package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/store"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// slowAPI is a pod ListerWatcher whose List waits until release is
// closed: an API server slow to answer the agent's first LIST. listing is
// closed once a List has begun.
type slowAPI struct {
	release, listing chan struct{}
	listed           *sync.Once
}

func (s slowAPI) List(metav1.ListOptions) (runtime.Object, error) {
	s.listed.Do(func() { close(s.listing) })
	<-s.release
	return &corev1.PodList{}, nil
}

func (s slowAPI) Watch(o metav1.ListOptions) (watch.Interface, error) {
	if o.SendInitialEvents != nil {
		return nil, errors.New("no watch-list here: the informer lists") // it falls back to List
	}
	<-s.release
	return watch.NewFake(), nil
}

// TestARestartedAgentDoesNotDropItsNodesPodsBeforeItKnowsThem: a restarted
// agent opened its streams at once and sent each a full catalogue of what
// it knew, before its pod informer had synced: nothing. A full catalogue
// replaces every pod the aggregator holds for the node, so every replica
// dropped the node's pods (their series, their startup times) at each
// rollout, crash or OOM of the agent. No stream opens before discovery has
// listed the node's pods once.
func TestARestartedAgentDoesNotDropItsNodesPodsBeforeItKnowsThem(t *testing.T) {
	st := store.New(store.Options{})
	s, client := streamTo(t, ingest.New(st, ingest.Options{}), nil)
	ctx, cancel := context.WithCancel(context.Background())
	old, err := client.Report(ctx) // the agent before its restart lists one pod of node n1
	if err != nil {
		t.Fatal(err)
	}
	_ = old.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n1", AgentInstance: "before",
		ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}})
	if _, err := old.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = old.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Full: true, Upsert: []*pulsev1.Pod{{
		Id: 1, Uid: "uid-1", Namespace: "demo", Name: "llama-0", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}}}}})
	for st.Pods() != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel() // the agent restarts; its first LIST is slow
	api := slowAPI{release: make(chan struct{}), listing: make(chan struct{}), listed: new(sync.Once)}
	o := NewOptions()
	o.NodeName, o.NVML, o.HTTPAddr, o.Aggregators = "n1", gpu.ModeOff, "127.0.0.1:0", []string{s.addr}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{Pods: api})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = a.Run(rctx) }()
	<-api.listing // its informer waits on the LIST: no stream, for a second
	for until := time.Now().Add(time.Second); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
		if _, ok := a.aggregatorConnected(); ok || st.Pods() != 1 {
			t.Fatalf("before its pods were listed: connected %v, the node's pods held %d; want no stream yet, and 1 held", ok, st.Pods())
		}
	}
	close(api.release) // the LIST answers: the node has no pod now
	for deadline := time.Now().Add(10 * time.Second); st.Pods() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("its pods listed (none), the node's pods held: %d, want 0", st.Pods())
		}
	}
}

// TestTheBackoffResetsOnlyAfterAStreamUp: the reconnect delay went back to
// its first 100 ms after any session that took more than 10 s, up or not:
// a welcome not sent within its wait, a dial to an address that drops
// packets. A fleet whose streams failed together then retried every 10 s
// in lockstep. Only a stream up for that long, from its welcome, resets it
// now.
func TestTheBackoffResetsOnlyAfterAStreamUp(t *testing.T) {
	for _, c := range []struct {
		upFor     time.Duration
		want      time.Duration
		situation string
	}{
		{0, 4 * time.Second, "a session never up, however long it waited"},
		{time.Second, 4 * time.Second, "a stream up for a second"},
		{healthyFor + time.Second, firstBackoff, "a stream up for a while"},
	} {
		if got := backoffAfter(4*time.Second, c.upFor); got != c.want {
			t.Errorf("%s: the delay's bound %s after one of 4s, want %s", c.situation, got, c.want)
		}
	}
}
