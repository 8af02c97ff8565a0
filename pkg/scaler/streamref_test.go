package scaler

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
)

// refWatch is a server stream that tells, on gone, when the
// ScaledObjectRef its handler received is collected.
type refWatch struct {
	grpc.ServerStream
	gone chan<- struct{}
}

func (w *refWatch) RecvMsg(m any) error {
	err := w.ServerStream.RecvMsg(m)
	if ref, ok := m.(*externalscaler.ScaledObjectRef); ok && err == nil {
		runtime.AddCleanup(ref, func(gone chan<- struct{}) { gone <- struct{}{} }, w.gone)
	}
	return err
}

// A stream whose trigger names its workload in its metadata never reads
// its ScaledObjectRef again: the ref (its metadata map, about 650 bytes)
// is not held while the stream waits, 1.3 MB at 1,000 ScaledObjects'
// two streams each (BenchmarkWaitingStreamStack's heap-bytes/stream).
// One resolved from its scaleTargetRef keeps it, to resolve it again
// (TestWorkloadFromScaleTargetRef: its streams follow a retarget).
func TestAStreamNamedByItsMetadataLetsItsRefGo(t *testing.T) {
	gone := make(chan struct{}, 4)
	f := newFixtureWith(t, nil, grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(s, &refWatch{ServerStream: ss, gone: gone})
	}))
	f.pods("a")
	client, srv := f.client, f.server

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	md := map[string]string{"workspace": "llama", "metric": "waiting", "threshold": "5"}
	spec, err := client.StreamMetricSpec(ctx, ref(md))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spec.Recv(); err != nil { // open, and waiting for a change
		t.Fatal(err)
	}
	if _, err := client.StreamIsActive(ctx, ref(md)); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(10 * time.Second)
	for collected := 0; collected < 2; {
		runtime.GC()
		select {
		case <-gone:
			collected++
		case <-time.After(10 * time.Millisecond):
		}
		if collected < 2 && time.Now().After(until) {
			t.Fatalf("%d of the two streams' refs collected while they wait; want both", collected)
		}
	}
	// Both still open: the refs went while they waited.
	if n := srv.OpenStreams(); n != 2 {
		t.Fatalf("%d streams open, want the 2", n)
	}
}
