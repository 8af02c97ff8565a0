package certs

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

// TestANewerVersionTheWatchLoadsDuringAPublishStaysServed: publish's check
// finds its copy current, then another replica's renewal lands and the
// watch delivers it before publish loads its copy. The newer pair is
// served after both: the check and the load are one step against the
// watch's load. The older copy was loaded over it, and served until the
// next check, up to an hour (a renewal for new names or a new CA: the
// clients the newer one admits were refused).
func TestANewerVersionTheWatchLoadsDuringAPublishStaysServed(t *testing.T) {
	m, client, old := ensured(t)
	ctx := context.Background()
	newer := old.DeepCopy()
	if err := m.renew(newer); err != nil { // another replica's renewal
		t.Fatal(err)
	}
	newer.ResourceVersion = old.ResourceVersion + "1"
	var armed atomic.Bool
	armed.Store(true)
	watched := make(chan struct{})
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != "pulse-aggregator-certs" || !armed.CompareAndSwap(true, false) {
			return false, nil, nil
		}
		answered := old.DeepCopy() // the API's answer: the older version still
		// Right after it, the other replica's update lands and the
		// informer delivers it (on its own goroutine).
		if err := client.Tracker().Update(gvr, newer.DeepCopy(), "pulse-system"); err != nil {
			t.Error(err)
		}
		go func() { m.watched(newer.DeepCopy()); close(watched) }()
		select { // the watch's load, unless it waits for publish's
		case <-watched:
		case <-time.After(200 * time.Millisecond):
		}
		return true, answered, nil
	})
	if err := m.publish(ctx, old.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	<-watched
	servedPair := m.served.Load().ingest.Certificates[0].Certificate[0]
	want, err := parseCert(newer.Data[KeyServerCert])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(servedPair, want.Raw) {
		t.Fatal("the older pair is served over the newer one the watch loaded during the publish")
	}
}
