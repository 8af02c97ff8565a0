package aggregator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

const (
	benchWorkloads   = 1000 // one KEDA stream each
	benchPodsPerLoad = 4
	benchAgents      = 8 // streams feeding the aggregator
)

// startBench runs a real aggregator on loopback with 1,000 StreamIsActive
// streams open, one per workload, as KEDA would hold them.
func startBench(b *testing.B) (keda externalscaler.ExternalScalerClient, ingestAddr string) {
	b.Helper()
	o := NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.Warmup.Duration = 0 // measured: the answers, not the warm-up
	o.Store.MaxPodsPerAgent = benchWorkloads * benchPodsPerLoad
	a, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })

	kconn, err := grpc.NewClient(a.ScalerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = kconn.Close() })
	keda = externalscaler.NewExternalScalerClient(kconn)
	return keda, a.IngestAddr()
}

func ref(w int) *externalscaler.ScaledObjectRef {
	return &externalscaler.ScaledObjectRef{Name: "so", Namespace: "bench", ScalerMetadata: map[string]string{
		"workspace": fmt.Sprintf("w%d", w), "activationThreshold": "5", "staleAfter": "10m"}}
}

func openKEDAStreams(b *testing.B, keda externalscaler.ExternalScalerClient) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for w := range benchWorkloads {
		s, err := keda.StreamIsActive(ctx, ref(w))
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
	}
}

// agentStream is one agent's stream, with its pods listed.
type agentStream struct {
	stream grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage]
	enc    *wire.Encoder
	pods   []uint32
	seq    uint64
}

// openAgent opens agent's stream on a connection of its own, as an agent
// does: the aggregator takes a few streams a connection (all the agents on
// one connection, the fifth waited for ever, and so did the benchmarks).
func openAgent(b *testing.B, addr string, agent int) *agentStream {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	s, err := pulsev1.NewIngestClient(conn).Report(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{
		Node: fmt.Sprintf("node-%d", agent), ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}))
	if _, err := s.Recv(); err != nil {
		b.Fatal(err)
	}
	as := &agentStream{stream: s, enc: wire.NewEncoder()}
	cat := &pulsev1.Catalogue{Full: true}
	// Agent k holds every benchAgents-th workload's pods.
	for w := agent; w < benchWorkloads; w += benchAgents {
		for p := range benchPodsPerLoad {
			id := uint32(len(as.pods) + 1)
			as.pods = append(as.pods, id)
			cat.Upsert = append(cat.Upsert, &pulsev1.Pod{Id: id, Uid: fmt.Sprintf("w%d-p%d", w, p), Namespace: "bench",
				Name: fmt.Sprintf("w%d-p%d", w, p), Ready: true,
				Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: fmt.Sprintf("w%d", w)}}})
		}
	}
	must(s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: cat}}))
	return as
}

// batch is one tick of every pod of the agent, with the standard metric set.
func (as *agentStream) batch(tick int) *pulsev1.AgentMessage {
	as.seq++
	b := &pulsev1.SampleBatch{Seq: as.seq, TimeUnixMs: 1_700_000_000_000 + int64(tick)*1000}
	for _, id := range as.pods {
		s := wire.Sample{Pod: id, OffsetMs: int32(id % 50)}
		for m := metric.ID(1); m <= metric.ITLCount; m++ {
			s.Values.Set(m, float64(tick*int(m)+int(id)%7))
		}
		s.Values.Set(metric.Waiting, float64((tick+int(id))%10))
		s.Values.Set(metric.KVCacheUsage, 0.5)
		as.enc.Append(b, &s)
	}
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
}

// BenchmarkIngest measures pod-samples per second through the whole ingest
// path (protobuf over loopback gRPC, decoding, the store, waking the KEDA
// streams whose workload changed) while 1,000 StreamIsActive streams are open.
func BenchmarkIngest(b *testing.B) {
	keda, addr := startBench(b)
	agents := make([]*agentStream, benchAgents)
	for i := range agents {
		agents[i] = openAgent(b, addr, i)
	}
	// PULSE_BENCH_NO_STREAMS=1 measures the same path with no KEDA stream.
	if os.Getenv("PULSE_BENCH_NO_STREAMS") == "" {
		openKEDAStreams(b, keda)
	}
	samples := 0
	var busy time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		// Encoding and marshalling are the agents' work: left out of the time.
		b.StopTimer()
		msgs := make([]*grpc.PreparedMsg, len(agents))
		for i, as := range agents {
			msgs[i] = new(grpc.PreparedMsg)
			if err := msgs[i].Encode(as.stream, as.batch(n)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		// Every agent sends one tick; all are acked before the next.
		for i, as := range agents {
			if err := as.stream.SendMsg(msgs[i]); err != nil {
				b.Fatal(err)
			}
			samples += len(as.pods)
		}
		for _, as := range agents {
			if _, err := as.stream.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		busy += time.Since(t0)
	}
	b.ReportMetric(float64(samples)/busy.Seconds(), "pod-samples/s")
}

// BenchmarkGetMetrics measures GetMetrics over loopback gRPC, as KEDA calls
// it, with 1,000 streams open and agents reporting; it reports p50 and p99.
func BenchmarkGetMetrics(b *testing.B) { benchGetMetrics(b, nil) }

// BenchmarkGetMetricsPlanner is BenchmarkGetMetrics for the planner's
// trigger (metric replicas): one store snapshot and one plan an answer.
func BenchmarkGetMetricsPlanner(b *testing.B) {
	benchGetMetrics(b, map[string]string{"metric": "replicas", "activationThreshold": ""})
}

// benchGetMetrics times GetMetrics round trips with 1,000 workloads
// reported and their streams open; extra is added to each trigger's
// metadata.
func benchGetMetrics(b *testing.B, extra map[string]string) {
	keda, addr := startBench(b)
	agents := make([]*agentStream, benchAgents)
	for i := range agents {
		agents[i] = openAgent(b, addr, i)
		for t := range 3 {
			if err := agents[i].stream.Send(agents[i].batch(t)); err != nil {
				b.Fatal(err)
			}
			if _, err := agents[i].stream.Recv(); err != nil {
				b.Fatal(err)
			}
		}
	}
	openKEDAStreams(b, keda)
	var lat []time.Duration
	ctx := context.Background()
	n := 0
	for b.Loop() {
		r := ref(n % benchWorkloads)
		for k, v := range extra {
			r.ScalerMetadata[k] = v
		}
		req := &externalscaler.GetMetricsRequest{ScaledObjectRef: r, MetricName: "m"}
		t0 := time.Now()
		if _, err := keda.GetMetrics(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		n++
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPushLatency measures the time from an agent's batch that raises a
// workload's queue above activationThreshold (sent over loopback gRPC) to
// KEDA's StreamIsActive receiving true, with 1,000 streams open.
func BenchmarkPushLatency(b *testing.B) {
	keda, addr := startBench(b)
	as := openAgent(b, addr, 0)
	openKEDAStreams(b, keda)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched, err := keda.StreamIsActive(ctx, ref(0)) // workload w0: agent 0's first four pods
	if err != nil {
		b.Fatal(err)
	}
	send := func(tick int, waiting float64) {
		as.seq++
		batch := &pulsev1.SampleBatch{Seq: as.seq, TimeUnixMs: 1_700_000_000_000 + int64(tick)*1000}
		for _, id := range as.pods[:benchPodsPerLoad] {
			s := wire.Sample{Pod: id}
			s.Values.Set(metric.Waiting, waiting)
			as.enc.Append(batch, &s)
		}
		if err := as.stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: batch}}); err != nil {
			b.Fatal(err)
		}
	}
	await := func(want bool) {
		for {
			msg, err := watched.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if msg.Result == want {
				return
			}
		}
	}
	go func() { // drain acks
		for {
			if _, err := as.stream.Recv(); err != nil {
				return
			}
		}
	}()
	var lat []time.Duration
	tick := 0
	for b.Loop() {
		tick++
		send(tick, 0)
		await(false)
		// Samples of one pod come a scrape interval apart; a stream coalesces
		// changes that come within 40ms of its last evaluation (a tick's
		// batches), so the rise is sent after that quiet spell.
		time.Sleep(45 * time.Millisecond)
		// The window (10s) averages the gauge: the next ten seconds of the
		// agent's clock all carry the high value, so the average leaves 0
		// with the first of them.
		tick += 10
		t0 := time.Now()
		send(tick, 100)
		await(true)
		lat = append(lat, time.Since(t0))
		tick += 10
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkWaitingStreamStack is the stack a KEDA stream's handler holds
// while it waits (StreamIsActive and StreamMetricSpec, one each a
// ScaledObject, as KEDA opens them), as the GC scans it: every GC scans
// every waiting goroutine's stack, and its goal counts what it scanned
// beside the live heap (docs/performance.md,
// "Stacks that wait with less, a smaller decoder and pod (2026-12-05, second session)").
// 1,000 ScaledObjects' streams opened, nothing read from them (a
// server-streaming call holds no client goroutine until it is read): the
// scanned stacks' growth, over the streams, and the live heap's (both
// ends': KEDA's client is in this process too; "A waiting stream lets its
// ref go (2026-12-05, fourth session)", "A pod in 288 bytes, a trigger
// held once, a stream's wait on one channel (2026-12-05, fifth session)").
func BenchmarkWaitingStreamStack(b *testing.B) {
	keda, _ := startBench(b)
	// scanned and live: what the last GC scanned of the stacks, and the
	// live heap it left.
	read := func() (scanned, live float64) {
		runtime.GC()
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/scan/stack:bytes"}, {Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return float64(s[0].Value.Uint64()), float64(s[1].Value.Uint64())
	}
	// The connection's own goroutines start at its first call.
	if _, err := keda.GetMetricSpec(context.Background(), ref(0)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		g0 := runtime.NumGoroutine()
		before, live0 := read()
		for w := range benchWorkloads {
			if _, err := keda.StreamIsActive(ctx, ref(w)); err != nil {
				b.Fatal(err)
			}
			if _, err := keda.StreamMetricSpec(ctx, ref(w)); err != nil {
				b.Fatal(err)
			}
		}
		// Each stream's handler is a goroutine of its own once it runs.
		for t0 := time.Now(); runtime.NumGoroutine() < g0+2*benchWorkloads; time.Sleep(10 * time.Millisecond) {
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("%d goroutines, want %d and more: the streams did not all open", runtime.NumGoroutine(), g0+2*benchWorkloads)
			}
		}
		time.Sleep(100 * time.Millisecond) // each handler at its wait
		after, live1 := read()
		b.ReportMetric((after-before)/(2*benchWorkloads), "stack-bytes/stream")
		// Both ends' live heap: the client's streams are in this process too.
		b.ReportMetric((live1-live0)/(2*benchWorkloads), "heap-bytes/stream")
		cancel()
		// The streams ended (a few goroutines the first streams started,
		// the pusher's, may stay).
		for t0 := time.Now(); runtime.NumGoroutine() > g0+benchWorkloads/100; time.Sleep(10 * time.Millisecond) {
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("%d goroutines, want %d or fewer: the streams did not all end", runtime.NumGoroutine(), g0+benchWorkloads/100)
			}
		}
	}
}
