package ingest

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// goneRacingAuth: the API deletes pod "victim" just after the stream has
// asked whether it is gone and before its catalogue is stored: the pod
// cache's delete (TokenReviewer.tellGone: the uid marked gone, then
// store.Gone, which holds nothing of it yet) runs between the two.
type goneRacingAuth struct {
	st   *store.Store
	mu   sync.Mutex
	gone map[string]bool
}

func (*goneRacingAuth) Authenticate(context.Context, string) (string, error) { return "node-1", nil }
func (*goneRacingAuth) PodNode(_ context.Context, e Entry) (string, error)   { return e.Node, nil }

func (a *goneRacingAuth) Gone(uid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if uid == "uid-victim" && !a.gone[uid] {
		a.gone[uid] = true       // the informer's goneUIDs.Add, just after this check
		a.st.Gone("node-1", uid) // then its store.Gone: nothing held yet, a no-op
		return false             // what the check saw
	}
	return a.gone[uid]
}

// TestAPodDeletedWhileItsCatalogueIsStoredIsNotHeld: a pod the API
// deletes between the stream's check and its catalogue's upsert is let go
// once stored. It was held, with whatever its node's stream sent for it,
// until the stream ended (up to an hour).
func TestAPodDeletedWhileItsCatalogueIsStoredIsNotHeld(t *testing.T) {
	auth := &goneRacingAuth{gone: map[string]bool{}}
	f := newFixtureWith(t, auth)
	auth.st = f.store
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer t"), 20*time.Second)
	defer cancel()
	s := f.openStream(ctx, t, "node-1")
	if err := s.Send(catalogue(pod(1, "victim"))); err != nil {
		t.Fatal(err)
	}
	enc := wire.NewEncoder()
	for seq := uint64(1); seq <= 3; seq++ {
		sendBatch(t, s, enc, seq, 42, 1)
	}
	if !auth.Gone("uid-victim") {
		t.Fatal("setup: the pod is not gone")
	}
	if _, ok := f.store.ListedOn("node-1", "uid-victim"); ok {
		t.Fatal("a pod the API deleted while its catalogue was stored is held, with the samples its node's stream sends, for the stream's life")
	}
}
