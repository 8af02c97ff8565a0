package ingest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// racingGone: once armed, the API deletes pod victim just after the
// stream has asked whether it is gone and before what it listed is
// stored: the pod cache's delete (TokenReviewer.tellGone: the uid marked
// gone, then store.Gone, which holds nothing of it yet) runs between the
// two.
type racingGone struct {
	st     *store.Store
	victim string
	mu     sync.Mutex
	armed  bool
	gone   map[string]bool
}

func (*racingGone) Authenticate(context.Context, string) (Agent, error) {
	return Agent{Node: "node-1"}, nil
}
func (*racingGone) PodNode(_ context.Context, e Entry) (string, error) { return e.Node, nil }

func (a *racingGone) Gone(uid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if uid == a.victim && a.armed && !a.gone[uid] {
		a.gone[uid] = true       // marked gone, just after this check
		a.st.Gone("node-1", uid) // then the store told: nothing held yet
		return false             // what the check saw
	}
	return a.gone[uid]
}

func goneCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer t"), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestAPodDeletedWhileItsCatalogueIsStoredIsNotHeld: a pod (or a router's
// demand entry) the API deletes between the stream's check and its
// catalogue's upsert, or between a relist's check and its upsert (the pod
// waited for room), is let go once stored. It was held, with whatever its
// node's stream sent for it, until the stream ended (up to an hour).
func TestAPodDeletedWhileItsCatalogueIsStoredIsNotHeld(t *testing.T) {
	t.Run("catalogue", func(t *testing.T) {
		auth := &racingGone{victim: "uid-victim", armed: true, gone: map[string]bool{}}
		f := newFixtureWith(t, auth)
		auth.st = f.store
		s := f.openStream(goneCtx(t), t, "node-1")
		if err := s.Send(catalogue(pod(1, "victim"), pod(2, "keep"))); err != nil {
			t.Fatal(err)
		}
		enc := wire.NewEncoder()
		for seq := uint64(1); seq <= 3; seq++ {
			sendBatch(t, s, enc, seq, 42, 1, 2)
		}
		if _, ok := f.store.ListedOn("node-1", "uid-victim"); ok {
			t.Error("a pod the API deleted while its catalogue was stored is held, with the samples its node's stream sends")
		}
		if _, ok := f.store.ListedOn("node-1", "uid-keep"); !ok {
			t.Error("the catalogue's other pod is not held")
		}
	})
	t.Run("demand", func(t *testing.T) {
		uid := store.DemandUID("uid-router", "llama")
		auth := &racingGone{victim: "uid-router", armed: true, gone: map[string]bool{}}
		f := newFixtureWith(t, auth)
		auth.st = f.store
		s := f.openStream(goneCtx(t), t, "node-1")
		d := &pulsev1.Pod{Id: 1, Uid: uid, Namespace: "ns", Name: "router", Ready: true, Demand: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
		if err := s.Send(catalogue(d, pod(2, "keep"))); err != nil {
			t.Fatal(err)
		}
		sendBatch(t, s, wire.NewEncoder(), 1, 1, 1, 2)
		if _, ok := f.store.ListedOn("node-1", uid); ok {
			t.Error("the demand entry of a router the API deleted while its catalogue was stored is held")
		}
	})
	t.Run("relist", func(t *testing.T) {
		auth := &racingGone{victim: "uid-c", gone: map[string]bool{}}
		f := newFixtureStore(t, auth, store.Options{MaxPods: 1})
		auth.st = f.store
		s := f.openStream(goneCtx(t), t, "node-1")
		enc := wire.NewEncoder()
		if err := s.Send(catalogue(pod(1, "a"), pod(2, "c"))); err != nil {
			t.Fatal(err)
		}
		sendBatch(t, s, enc, 1, 1, 1, 2)
		if _, ok := f.store.ListedOn("node-1", "uid-c"); ok {
			t.Fatal("setup: c is held, want it waiting for room")
		}
		if err := s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Remove: []uint32{1}}}}); err != nil {
			t.Fatal(err)
		}
		auth.mu.Lock()
		auth.armed = true // c is deleted as the room freed is taken
		auth.mu.Unlock()
		sendBatch(t, s, enc, 2, 1, 2)
		sendBatch(t, s, enc, 3, 1, 2)
		if _, ok := f.store.ListedOn("node-1", "uid-c"); ok {
			t.Error("a pod the API deleted while a relist stored it is held")
		}
		if strings.Contains(f.logs.String(), "pod held now") {
			t.Errorf("a pod let go as it was stored is logged held:\n%s", f.logs.String())
		}
	})
}
