package ingest

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// warm opens the fixture's connection (its buffers are not what a test
// measures) with a stream of nothing but its hello.
func warm(t *testing.T, f *fixture) {
	t.Helper()
	if err := f.run(t, hello()); err != nil {
		t.Fatal(err)
	}
}

// heapAfterGC is the live heap, collected: the sync.Pools (gRPC's buffers,
// the batches') are emptied by the second collection.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestAScrapeErrorKeepsOnlyWhatIsShown: a missing sample's error is kept
// cut to maxErrorBytes, but as a substring of the text the agent sent
// (wire.CleanText cuts in place), so the store held the whole text, up to
// the 4 MiB of a message, with each pod for as long as the pod's last
// report was that missing one: a node's agent sending one such sample a
// batch for each of its pods pinned 4 MiB a pod (a node of 110 pods: 440
// MiB, past the chart's 512 MiB with the rest, at every replica it streams
// to).
func TestAScrapeErrorKeepsOnlyWhatIsShown(t *testing.T) {
	f := newFixture(t) // at most 3 pods a stream
	const errBytes = 4<<20 - 4<<10
	warm(t, f)
	before := heapAfterGC()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := f.openStream(ctx, t, "node-1")
	if err := stream.Send(catalogue(pod(1, "a"), pod(2, "b"), pod(3, "c"))); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: time.Now().UnixMilli(), Missing: []*pulsev1.MissingSample{{
			Pod: uint32(seq), Reason: pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS, Error: strings.Repeat("x", errBytes)}}}
		if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // its ack: stored
			t.Fatalf("batch %d: %v", seq, err)
		}
	}
	_ = stream.CloseSend()
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream did not end")
	}
	for _, name := range []string{"a", "b", "c"} {
		if v := podView(f.store, name); v == nil || len(v.Error) != maxErrorBytes {
			t.Fatalf("pod %s: %+v; want its error cut to %d bytes", name, v, maxErrorBytes)
		}
	}
	after := heapAfterGC()
	grew := int64(after) - int64(before)
	t.Logf("heap grew %.2f MiB", float64(grew)/(1<<20))
	if grew > 3<<20 {
		t.Fatalf("the heap holds %.1f MiB more after three pods' errors of %d bytes were stored, each shown as %d bytes", float64(grew)/(1<<20), errBytes, maxErrorBytes)
	}
	runtime.KeepAlive(f)
}

// TestAHellosUnknownFieldsAreNotKept: a stream keeps its hello for its
// life; its strings are bounded (checkHello), but the fields it does not
// know were kept with it (vtprotobuf's UnmarshalVT keeps them), up to the
// 4 MiB of a message a stream, four streams a node's token.
func TestAHellosUnknownFieldsAreNotKept(t *testing.T) {
	f := newFixture(t)
	warm(t, f)
	before := heapAfterGC()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 3 {
		stream, err := f.client.Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := hello()
		pad := protowire.AppendTag(nil, 1000, protowire.BytesType)
		pad = protowire.AppendBytes(pad, make([]byte, 4<<20-4<<10))
		h.GetHello().ProtoReflect().SetUnknown(pad)
		if err := stream.Send(h); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // welcomed: open, its hello kept
			t.Fatal(err)
		}
		defer func() { _ = stream.CloseSend() }() // open until the heap is read
	}
	if f.srv.Streams() != 3 {
		t.Fatalf("%d streams open, want 3", f.srv.Streams())
	}
	after := heapAfterGC()
	grew := int64(after) - int64(before)
	t.Logf("heap grew %.2f MiB", float64(grew)/(1<<20))
	if grew > 3<<20 {
		t.Fatalf("the heap holds %.1f MiB more with three streams open, each welcomed after a hello of 4 MiB of unknown fields", float64(grew)/(1<<20))
	}
}

// unavailableAuth binds every stream to node-1 and looks no pod up: the
// API is down (every entry not looked up now: unchecked).
type unavailableAuth struct{}

func (unavailableAuth) Authenticate(context.Context, string) (Agent, error) {
	return Agent{Node: "node-1"}, nil
}

func (unavailableAuth) PodNode(context.Context, Entry) (string, error) {
	return "", ErrLookupUnavailable
}

// TestAnEntryNotLookedUpKeepsNoUnknownFields: an entry whose pod cannot be
// looked up now is kept (a clone) to be looked up again at each batch, for
// the stream's life while the API fails; the clone kept the fields the
// entry's message did not know, up to the 4 MiB of a message each entry,
// twice MaxPodsPerStream entries a stream (2,048 by default: 8 GiB).
func TestAnEntryNotLookedUpKeepsNoUnknownFields(t *testing.T) {
	f := newFixtureWith(t, unavailableAuth{})        // at most 3 pods a stream, 6 ids
	if err := f.runAs(t, "t", hello()); err != nil { // the connection's buffers, before the heap is read
		t.Fatal(err)
	}
	before := heapAfterGC()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer t"), 20*time.Second)
	defer cancel()
	stream := f.openStream(ctx, t, "node-1")
	for id := uint32(1); id <= 3; id++ {
		p := pod(id, "p"+string(rune('a'+id)))
		pad := protowire.AppendTag(nil, 1000, protowire.BytesType)
		pad = protowire.AppendBytes(pad, make([]byte, 2<<20-4<<10))
		p.ProtoReflect().SetUnknown(pad)
		p.Workloads[0].ProtoReflect().SetUnknown(pad)
		c := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Upsert: []*pulsev1.Pod{p}}}}
		if err := stream.Send(c); err != nil {
			t.Fatal(err)
		}
	}
	// A heartbeat, acked: the catalogues before it were taken.
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: time.Now().UnixMilli()}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("auth_unavailable")); got != 3 {
		t.Fatalf("auth_unavailable = %v, want 3: each entry not looked up", got)
	}
	after := heapAfterGC()
	grew := int64(after) - int64(before)
	t.Logf("heap grew %.2f MiB", float64(grew)/(1<<20))
	if grew > 3<<20 {
		t.Fatalf("the heap holds %.1f MiB more with three entries not looked up, each of 4 MiB of unknown fields", float64(grew)/(1<<20))
	}
	_ = stream.CloseSend()
}
