package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/syncbuf"
)

type fixture struct {
	store  *store.Store
	srv    *Server
	client pulsev1.IngestClient
	logs   *syncbuf.Buffer
	opts   []grpc.CallOption // each stream's
}

func newFixture(t *testing.T) *fixture { t.Helper(); return newFixtureWith(t, nil) }

// newFixtureWith serves ingest over bufconn, authenticating with auth when
// it is not nil.
func newFixtureWith(t *testing.T, auth Authenticator) *fixture {
	t.Helper()
	return newFixtureStore(t, auth, store.Options{})
}

// newFixtureStore is newFixtureWith on a store with opts.
func newFixtureStore(t testing.TB, auth Authenticator, opts store.Options) *fixture {
	t.Helper()
	f := &fixture{store: store.New(opts), logs: new(syncbuf.Buffer)}
	f.srv = New(f.store, Options{Log: slog.New(slog.NewTextHandler(f.logs, nil)), Version: "test", Limits: Limits{MaxPodsPerStream: 3},
		Registerer: prometheus.NewRegistry(), Auth: auth})
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(grpc.ForceServerCodecV2(Codec())) // as the aggregator serves it
	pulsev1.RegisterIngestServer(g, f.srv)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); g.Stop() })
	f.client = pulsev1.NewIngestClient(conn)
	return f
}

func hello() *pulsev1.AgentMessage {
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{
		Node: "node-1", AgentVersion: "test", ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}
}

func catalogue(pods ...*pulsev1.Pod) *pulsev1.AgentMessage {
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Full: true, Upsert: pods}}}
}

func pod(id uint32, name string) *pulsev1.Pod {
	return &pulsev1.Pod{Id: id, Uid: "uid-" + name, Namespace: "ns", Name: name, Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
}

// run sends msgs on a new stream and returns how the stream ended.
func (f *fixture) run(t *testing.T, msgs ...*pulsev1.AgentMessage) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := f.client.Report(ctx, f.opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the server ended the stream; Recv says why
		}
	}
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func TestGoodStreamFeedsTheStore(t *testing.T) {
	f := newFixture(t)
	enc := wire.NewEncoder()
	var b pulsev1.SampleBatch
	b.Seq, b.TimeUnixMs = 1, 1000
	s := wire.Sample{Pod: 1}
	s.Values.Set(metric.Waiting, 4)
	s.Values.Set(metric.Running, -2) // bad input: dropped, the rest kept
	enc.Append(&b, &s)
	enc.Append(&b, &wire.Sample{Pod: 2, Missing: pulsev1.MissingReason_MISSING_REASON_TIMEOUT, Error: "timed out"})
	if err := f.run(t, hello(), catalogue(pod(1, "a"), pod(2, "b")), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}}); err != nil {
		t.Fatal(err)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
	if len(v) != 1 || len(v[0].Pods) != 2 || v[0].Pods[0].Values["waiting"] != 4 || v[0].Pods[1].Missing != "timeout" {
		t.Fatalf("store = %+v", v)
	}
	if _, ok := v[0].Pods[0].Values["running"]; ok {
		t.Fatal("a negative value was stored")
	}
	// The pod shows what was refused (it once looked fresh and well with
	// its older values).
	if got := v[0].Pods[0].Rejected; got != "negative running" {
		t.Fatalf("pod a's refused values: %q, want \"negative running\"", got)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "pod values rejected") || !strings.Contains(logs, "pod=ns/a") || !strings.Contains(logs, "negative running") {
		t.Fatalf("no log line names the pod and the value:\n%s", logs)
	}
	want := `
# HELP pulse_aggregator_agent_streams Agent streams open now.
# TYPE pulse_aggregator_agent_streams gauge
pulse_aggregator_agent_streams 0
# HELP pulse_aggregator_pod_samples_total Pod samples received, by outcome (ok or missing).
# TYPE pulse_aggregator_pod_samples_total counter
pulse_aggregator_pod_samples_total{outcome="missing"} 1
pulse_aggregator_pod_samples_total{outcome="ok"} 1
# HELP pulse_aggregator_rejected_reports_total Reports rejected, by reason.
# TYPE pulse_aggregator_rejected_reports_total counter
pulse_aggregator_rejected_reports_total{reason="agent_full"} 0
pulse_aggregator_rejected_reports_total{reason="auth_unavailable"} 0
pulse_aggregator_rejected_reports_total{reason="bad_extra"} 0
pulse_aggregator_rejected_reports_total{reason="bad_time"} 0
pulse_aggregator_rejected_reports_total{reason="catalogue"} 0
pulse_aggregator_rejected_reports_total{reason="duplicate_id"} 0
pulse_aggregator_rejected_reports_total{reason="invalid_entry"} 0
pulse_aggregator_rejected_reports_total{reason="invalid_hello"} 0
pulse_aggregator_rejected_reports_total{reason="malformed_batch"} 0
pulse_aggregator_rejected_reports_total{reason="message"} 0
pulse_aggregator_rejected_reports_total{reason="negative_value"} 1
pulse_aggregator_rejected_reports_total{reason="node_streams"} 0
pulse_aggregator_rejected_reports_total{reason="nonpositive_bound"} 0
pulse_aggregator_rejected_reports_total{reason="other_node"} 0
pulse_aggregator_rejected_reports_total{reason="ratio_above_one"} 0
pulse_aggregator_rejected_reports_total{reason="store_full"} 0
pulse_aggregator_rejected_reports_total{reason="superseded"} 0
pulse_aggregator_rejected_reports_total{reason="too_many_workloads"} 0
pulse_aggregator_rejected_reports_total{reason="unauthenticated"} 0
pulse_aggregator_rejected_reports_total{reason="unknown_pod"} 0
pulse_aggregator_rejected_reports_total{reason="workload_claim"} 0
`
	if err := testutil.CollectAndCompare(f.srv.m.streams, strings.NewReader(want), "pulse_aggregator_agent_streams"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(f.srv.m.samples, strings.NewReader(want), "pulse_aggregator_pod_samples_total"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(f.srv.m.rejected, strings.NewReader(want), "pulse_aggregator_rejected_reports_total"); err != nil {
		t.Error(err)
	}
}

func TestBadStreamsAreRefusedClearly(t *testing.T) {
	badBatch := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Pods: []uint32{1}}}}
	tests := map[string]struct {
		msgs []*pulsev1.AgentMessage
		code codes.Code
	}{
		"no hello": {msgs: []*pulsev1.AgentMessage{catalogue(pod(1, "a"))}, code: codes.InvalidArgument},
		// Found by FuzzReport: it ended with Unknown, "EOF".
		"no message":      {code: codes.InvalidArgument},
		"no node":         {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{ProtocolVersion: 1}}}}, code: codes.InvalidArgument},
		"unknown version": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n", ProtocolVersion: 9}}}}, code: codes.FailedPrecondition},
		"too many pods": {msgs: []*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a"), pod(2, "b"), pod(3, "c"), pod(4, "d"), pod(5, "e"),
			pod(6, "f"), pod(7, "g"))}, code: codes.InvalidArgument}, // past twice the limit of 3
		"malformed batch": {msgs: []*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a")), badBatch}, code: codes.InvalidArgument},
		"second hello":    {msgs: []*pulsev1.AgentMessage{hello(), hello()}, code: codes.InvalidArgument},
		// A hello's strings are bounded before they are logged or kept.
		"4 MB agent version": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n", ProtocolVersion: 1,
			AgentVersion: strings.Repeat("v", 4<<20-64)}}}}, code: codes.InvalidArgument},
		"long instance": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n", ProtocolVersion: 1,
			AgentInstance: strings.Repeat("i", 601)}}}}, code: codes.InvalidArgument},
		"long extra metric name": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n", ProtocolVersion: 1,
			ExtraMetrics: []string{"ok", strings.Repeat("m", 100<<10)}}}}}, code: codes.InvalidArgument},
		// Found in a review: the names are shown to every tenant whose
		// trigger names a gauge none forwards, and a node's hello could
		// carry control characters and newlines into their refusals.
		"extra metric name not a metric's": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n", ProtocolVersion: 1,
			ExtraMetrics: []string{"vllm:ok_gauge", "a\x1b]52;c;cHduZWQ=\x07\nforged line"}}}}}, code: codes.InvalidArgument},
		"long node": {msgs: []*pulsev1.AgentMessage{{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: strings.Repeat("n", 601), ProtocolVersion: 1}}}},
			code: codes.InvalidArgument},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			if err := f.run(t, tc.msgs...); status.Code(err) != tc.code {
				t.Fatalf("stream ended with %v, want %v", err, tc.code)
			}
		})
	}
	f := newFixture(t)
	_ = f.run(t, hello(), catalogue(pod(1, "a")), badBatch)
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("malformed_batch")); got != 1 {
		t.Fatalf("rejected malformed_batch = %v, want 1", got)
	}
	// Every hello refused is counted (only those past a string's bound were).
	for _, name := range []string{"long instance", "no hello", "no node", "unknown version"} {
		_ = f.run(t, tests[name].msgs...)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("invalid_hello")); got != 4 {
		t.Fatalf("rejected invalid_hello = %v, want 4", got)
	}
}

// TestPodsPastTheAgentsLimitAreRefusedAlone: a node listing more pods than
// --max-pods-per-agent (a router naming 64 workloads is 64 entries) once
// made the aggregator refuse the whole catalogue and end the stream, for
// ever: the agent sent the same catalogue again on its next stream. Now the
// entries past the limit are refused alone (agent_full), the pods held keep
// their places, a refused pod listed again once there is room is held, and
// a held entry refused gives its place to a new one of the same catalogue.
func TestPodsPastTheAgentsLimitAreRefusedAlone(t *testing.T) {
	f := newFixture(t)       // at most 3 pods a stream
	enc := wire.NewEncoder() // the stream's, as an agent keeps it
	batch := func(seq uint64, ids ...uint32) *pulsev1.AgentMessage {
		b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: 1000 * int64(seq)}
		for _, id := range ids {
			s := wire.Sample{Pod: id}
			s.Values.Set(metric.Waiting, float64(id))
			enc.Append(b, &s)
		}
		return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
	}
	names := func() []string {
		var out []string
		for _, w := range f.store.View(store.ViewOptions{FreshFor: time.Hour}) {
			for _, p := range w.Pods {
				out = append(out, p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	relist := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Remove: []uint32{1}, Upsert: []*pulsev1.Pod{pod(4, "d")}}}}
	// c changes to an entry refused (no uid) beside a new pod f: c's place
	// is f's.
	badC := pod(3, "c")
	badC.Uid = ""
	swap := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Upsert: []*pulsev1.Pod{badC, pod(6, "f")}}}}
	first := batch(1, 1, 2, 3, 4, 5)
	enc.Forget(1)
	second := batch(2, 2, 3, 4, 5)
	enc.Forget(3)
	err := f.run(t, hello(), catalogue(pod(1, "a"), pod(2, "b"), pod(3, "c"), pod(4, "d"), pod(5, "e")), first,
		relist, second, swap, batch(3, 2, 4, 6))
	if err != nil {
		t.Fatalf("the stream ended: %v", err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("agent_full")); got != 2 {
		t.Fatalf("rejected agent_full = %v, want 2 (d and e)", got)
	}
	if got, want := names(), []string{"b", "d", "f"}; !slices.Equal(got, want) {
		t.Fatalf("pods held %v, want %v: d listed again once a left room, f in the place of c, refused", got, want)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "reason=agent_full") || !strings.Contains(logs, "pod=ns/e") {
		t.Fatalf("no log line names the refused pod and why:\n%s", logs)
	}
}

// TestOneBadEntryIsRefusedAlone: a pod whose entry breaks a limit (nine
// owner references, a bad workload, no uid, a demand entry not named after
// its router) once made the aggregator refuse the whole catalogue and end
// the stream; the agent reconnected with the same catalogue for ever and
// every other pod of the node went unreported. Now the one entry is refused
// (counted by reason) and its samples dropped; the node's other pods are
// stored and the stream stays open.
func TestOneBadEntryIsRefusedAlone(t *testing.T) {
	nine := make([]*pulsev1.Workload, 9)
	for i := range nine {
		nine[i] = &pulsev1.Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, Name: fmt.Sprintf("d%d", i)}
	}
	tests := map[string]struct {
		bad    *pulsev1.Pod
		reason string
	}{
		"nine workloads": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", Ready: true, Workloads: nine}, "too_many_workloads"},
		"bad workload":   {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", Workloads: []*pulsev1.Workload{{Name: "x"}}}, "invalid_entry"},
		"no uid":         {&pulsev1.Pod{Id: 2, Namespace: "ns", Name: "b"}, "invalid_entry"},
		"ready before created": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", Ready: true,
			CreatedUnixMs: 1_700_000_000_000, ReadySinceUnixMs: 1_699_999_999_000}, "invalid_entry"},
		"created before 1970": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", CreatedUnixMs: -1}, "invalid_entry"},
		"unready before created": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b",
			CreatedUnixMs: 1_700_000_000_000, UnreadySinceUnixMs: 1_699_999_999_000}, "invalid_entry"},
		"unready since, and ready": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", Ready: true,
			CreatedUnixMs: 1_700_000_000_000, UnreadySinceUnixMs: 1_700_000_001_000}, "invalid_entry"},
		"unready since before 1970": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", UnreadySinceUnixMs: -1}, "invalid_entry"},
		// A time past 2262 wrapped in the store's nanoseconds: the pod's
		// startup and age read as garbage. Past an hour ahead, as a
		// sample's time, the entry is refused.
		"created past 2262": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", CreatedUnixMs: math.MaxInt64}, "invalid_entry"},
		"ready since a day ahead": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b", Ready: true,
			CreatedUnixMs: 1_700_000_000_000, ReadySinceUnixMs: time.Now().Add(24 * time.Hour).UnixMilli()}, "invalid_entry"},
		"unready since a day ahead": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b",
			CreatedUnixMs: 1_700_000_000_000, UnreadySinceUnixMs: time.Now().Add(24 * time.Hour).UnixMilli()}, "invalid_entry"},
		// A newline in a name forged a row of the debug tables under
		// another namespace's name; a bidi override reorders the rest.
		"newline in a workload's name": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b",
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "x\nother  Workspace victim/llama"}}}, "invalid_entry"},
		"escape in a pod's name":       {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b\x1b[2J"}, "invalid_entry"},
		"bidi override in a namespace": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns\u202e", Name: "b"}, "invalid_entry"},
		// protobuf's marshaller writes no string that is not UTF-8: the
		// client's codec writes notUTF8 as such.
		"a pod's name not UTF-8": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: notUTF8}, "invalid_entry"},
		"a workload's name not UTF-8": {&pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: "b",
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: notUTF8}}}, "invalid_entry"},
		"demand entry without its router's uid": {&pulsev1.Pod{Id: 2, Uid: "u", Namespace: "ns", Name: "epp-0",
			Demand: true, Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}, "invalid_entry"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.opts = []grpc.CallOption{grpc.ForceCodecV2(notUTF8Codec{})}
			enc := wire.NewEncoder()
			var b pulsev1.SampleBatch
			b.Seq, b.TimeUnixMs = 1, 1000
			for _, id := range []uint32{1, 2} {
				s := wire.Sample{Pod: id}
				s.Values.Set(metric.Waiting, 4)
				enc.Append(&b, &s)
			}
			if err := f.run(t, hello(), catalogue(pod(1, "a"), tc.bad), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}}); err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
			v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
			if len(v) != 1 || len(v[0].Pods) != 1 || v[0].Pods[0].Name != "a" || v[0].Pods[0].Values["waiting"] != 4 {
				t.Fatalf("store = %+v, want pod a alone with its sample", v)
			}
			if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues(tc.reason)); got != 1 {
				t.Fatalf("rejected %s = %v, want 1", tc.reason, got)
			}
		})
	}
}

// notUTF8 is a name notUTF8Codec writes with its last byte 0xff.
const notUTF8 = "not-utf8-name"

// notUTF8Codec is gRPC's protobuf codec, except that each notUTF8 in what
// it writes is written with its last byte 0xff (of the same length): an
// agent that sends what protobuf's marshaller would refuse to write.
type notUTF8Codec struct{}

func (notUTF8Codec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	bad := notUTF8[:len(notUTF8)-1] + "\xff"
	return mem.BufferSlice{mem.SliceBuffer(bytes.ReplaceAll(b, []byte(notUTF8), []byte(bad)))}, err
}

func (notUTF8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (notUTF8Codec) Name() string { return "proto" }

// TestBatchOfUncataloguedIDsEndsTheStream: a batch was decoded (allocating
// residual state for every id in it) before its ids were checked: 100
// batches of 1,000 unknown ids grew the heap by 39 MB and the stream stayed
// open. The ids are now checked first: the batch is malformed, the stream
// ends at once and the rejection is counted.
func TestBatchOfUncataloguedIDsEndsTheStream(t *testing.T) {
	f := newFixture(t)
	msgs := []*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a"))}
	for b := range 100 {
		batch := &pulsev1.SampleBatch{Seq: uint64(b + 1), TimeUnixMs: 1}
		for i := range 1000 {
			batch.Pods = append(batch.Pods, uint32(1000+b*1000+i))
			batch.OffsetsMs = append(batch.OffsetsMs, 0)
			batch.PresentXor = append(batch.PresentXor, 1<<1)
			batch.Values = append(batch.Values, 5)
		}
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: batch}})
	}
	err := f.run(t, msgs...)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pod id 1000, which the catalogue has not listed") {
		t.Fatalf("stream ended with %v, want InvalidArgument naming pod id 1000", err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("malformed_batch")); got != 1 {
		t.Fatalf("rejected malformed_batch = %v, want 1 (the first batch ends the stream)", got)
	}
	// Missing samples and extra values are checked too.
	for name, b := range map[string]*pulsev1.SampleBatch{
		"missing": {Seq: 1, Missing: []*pulsev1.MissingSample{{Pod: 7, Reason: pulsev1.MissingReason_MISSING_REASON_TIMEOUT}}},
		"extra":   {Seq: 1, Extra: []*pulsev1.ExtraValues{{Pod: 7, Values: []float64{1}}}},
	} {
		if err := f.run(t, hello(), catalogue(pod(1, "a")), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s of an unknown id: %v, want InvalidArgument", name, err)
		}
	}
}

// TestAgentStringsAreBounded: strings an agent sends are kept; 40 missing
// samples with 3 MiB error texts once held 143 MiB. An error's text is kept
// to 256 bytes, and an entry whose names are longer than any Kubernetes
// name is refused alone.
func TestAgentStringsAreBounded(t *testing.T) {
	f := newFixture(t)
	enc := wire.NewEncoder()
	var b pulsev1.SampleBatch
	b.Seq, b.TimeUnixMs = 1, 1000
	enc.Append(&b, &wire.Sample{Pod: 1, Missing: pulsev1.MissingReason_MISSING_REASON_TIMEOUT, Error: strings.Repeat("é", 1<<20)})
	long := &pulsev1.Pod{Id: 2, Uid: "u2", Namespace: "ns", Name: strings.Repeat("n", 1<<20),
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	longWorkload := &pulsev1.Pod{Id: 3, Uid: "u3", Namespace: "ns", Name: "w",
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: strings.Repeat("\x01", 1<<20)}}}
	if err := f.run(t, hello(), catalogue(pod(1, "a"), long, longWorkload), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}}); err != nil {
		t.Fatalf("the stream ended: %v", err)
	}
	// The refused entries are logged with their names cut: a 1 MiB name
	// was logged whole (a name of control characters six times its size,
	// escaped), at every reconnect.
	if logs := f.logs.String(); len(logs) > 16<<10 || strings.Count(logs, "reason=invalid_entry") != 2 {
		t.Fatalf("%d bytes of log, %d refusals logged; want both, in under 16 KiB", len(logs), strings.Count(logs, "reason=invalid_entry"))
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
	if len(v) != 1 || len(v[0].Pods) != 1 {
		t.Fatalf("store = %+v, want pod a alone", v)
	}
	if e := v[0].Pods[0].Error; len(e) > 256 || !utf8.ValidString(e) || !strings.HasPrefix(e, "é") {
		t.Fatalf("error kept: %d bytes, valid %v", len(e), utf8.ValidString(e))
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("invalid_entry")); got != 2 {
		t.Fatalf("rejected invalid_entry = %v, want 2", got)
	}
}

// openStream opens a stream as node's agent, says hello and waits for the
// welcome.
func (f *fixture) openStream(ctx context.Context, t *testing.T, node string) pulsev1.Ingest_ReportClient {
	t.Helper()
	stream, err := f.client.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := hello()
	h.GetHello().Node = node
	if err := stream.Send(h); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	return stream
}

// sendBatch sends a batch of one waiting value per pod id and waits for its
// ack (the server has stored it, or ended the stream).
func sendBatch(t *testing.T, stream pulsev1.Ingest_ReportClient, enc *wire.Encoder, seq uint64, waiting float64, ids ...uint32) {
	t.Helper()
	b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: int64(seq) * 1000}
	for _, id := range ids {
		s := wire.Sample{Pod: id}
		s.Values.Set(metric.Waiting, waiting)
		enc.Append(b, &s)
	}
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("batch %d: the stream ended: %v", seq, err)
	}
}

// TestFullStoreRefusesTheNewPodNotALiveOne: at --max-pods, another agent's
// new pods once evicted replicas whose agent was connected and reporting;
// their samples were then dropped as unknown_pod until that agent
// reconnected. Now the new pod waits (its samples counted as store_full,
// its stream and the pods held untouched) and is held, from its own
// stream's next batch, once there is room.
func TestFullStoreRefusesTheNewPodNotALiveOne(t *testing.T) {
	f := newFixtureStore(t, nil, store.Options{MaxPods: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	encA, encB := wire.NewEncoder(), wire.NewEncoder()

	a := f.openStream(ctx, t, "node-1")
	if err := a.Send(catalogue(pod(1, "a"), pod(2, "b"))); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, a, encA, 1, 3, 1, 2)

	b := f.openStream(ctx, t, "node-2")
	neighbour := pod(1, "c")
	neighbour.Workloads[0].Name = "other"
	if err := b.Send(catalogue(neighbour)); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, b, encB, 1, 7, 1)
	sendBatch(t, a, encA, 2, 4, 1, 2)
	if f.store.Pods() != 2 {
		t.Fatalf("pods %d: want a and b kept", f.store.Pods())
	}
	for _, p := range f.store.View(store.ViewOptions{FreshFor: time.Minute})[0].Pods {
		if p.Values["waiting"] != 4 {
			t.Fatalf("pod %s: %v, want its latest sample (4)", p.Name, p.Values)
		}
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("store_full")); got != 2 {
		t.Fatalf("rejected store_full = %v, want 2 (the entry, then its sample)", got)
	}
	if !strings.Contains(f.logs.String(), "pod not held") || !strings.Contains(f.logs.String(), "ns/c") {
		t.Fatalf("no warning naming ns/c: %s", f.logs.String())
	}

	// node-1's agent removes b (a scale-down): there is room; c is held at
	// its stream's next batch, with that batch's sample.
	if err := a.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Remove: []uint32{2}}}}); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, a, encA, 3, 4, 1)
	sendBatch(t, b, encB, 2, 8, 1)
	var got float64 = -1
	for _, w := range f.store.View(store.ViewOptions{FreshFor: time.Minute}) {
		for _, p := range w.Pods {
			if p.Name == "c" {
				got = p.Values["waiting"]
			}
		}
	}
	if got != 8 || f.store.Pods() != 2 {
		t.Fatalf("c's waiting %v (%d pods): want c held with its sample 8, beside a", got, f.store.Pods())
	}
}

// TestFirstHistogramsAreAnnounced: the aggregator sizes its memory warning
// by whether any agent forwards histograms: the first sample with them
// calls OnHistograms, once.
func TestFirstHistogramsAreAnnounced(t *testing.T) {
	var calls atomic.Int64
	f := newFixture(t)
	f.srv.onHist = func() { calls.Add(1) }
	enc := wire.NewEncoder()
	var msgs []*pulsev1.AgentMessage
	msgs = append(msgs, hello(), catalogue(pod(1, "a")))
	for i := range 3 {
		b := &pulsev1.SampleBatch{Seq: uint64(i + 1), TimeUnixMs: int64(i+1) * 1000}
		s := wire.Sample{Pod: 1, Hist: &metric.Histograms{}}
		s.Values.Set(metric.Waiting, 1)
		s.Hist[metric.TTFTHist] = metric.Buckets{Bounds: []float64{0.5, math.Inf(1)}, Counts: []float64{float64(i), float64(2 * i)}}
		enc.Append(b, &s)
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
	}
	if f.srv.SawHistograms() {
		t.Fatal("histograms seen before any arrived")
	}
	if err := f.run(t, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 || !f.srv.SawHistograms() {
		t.Fatalf("OnHistograms called %d times, want once; SawHistograms %v, want true", n, f.srv.SawHistograms())
	}
}

// TestStreamsCountsTheStreamsOpen: Streams, which the aggregator's memory
// estimate counts once agents connect, is the streams open now.
func TestStreamsCountsTheStreamsOpen(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := f.openStream(ctx, t, "node-1")
	b := f.openStream(ctx, t, "node-2")
	if n := f.srv.Streams(); n != 2 {
		t.Fatalf("Streams = %d with two open, want 2", n)
	}
	_ = a.CloseSend()
	if _, err := a.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("closed stream: %v, want EOF", err)
	}
	_ = b.CloseSend()
	if _, err := b.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("closed stream: %v, want EOF", err)
	}
	waitFor(t, "Streams back to 0 once both closed", func() bool { return f.srv.Streams() == 0 })
}

// TestAcksAsOftenAsTheAgentAsks: with the hello's ack_every_ms, a stream
// of batches gets one ack (the first batch's) within that time, and every
// batch is stored all the same; without it every batch is acked.
func TestAcksAsOftenAsTheAgentAsks(t *testing.T) {
	for _, every := range []uint32{0, 3_600_000} {
		f := newFixture(t)
		h := hello()
		h.GetHello().AckEveryMs = every
		enc := wire.NewEncoder()
		msgs := []*pulsev1.AgentMessage{h, catalogue(pod(1, "a"))}
		for seq := uint64(1); seq <= 5; seq++ {
			b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: int64(seq) * 1000}
			s := wire.Sample{Pod: 1}
			s.Values.Set(metric.Waiting, float64(seq))
			enc.Append(b, &s)
			msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stream, err := f.client.Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		_ = stream.CloseSend()
		var acks []uint64
		for {
			msg, err := stream.Recv()
			if err != nil {
				break
			}
			if a := msg.GetAck(); a != nil {
				acks = append(acks, a.Seq)
			}
		}
		cancel()
		want := []uint64{1, 2, 3, 4, 5}
		if every > 0 {
			want = []uint64{1}
		}
		if !slices.Equal(acks, want) {
			t.Errorf("ack_every_ms %d: acks %v, want %v", every, acks, want)
		}
		v := f.store.View(store.ViewOptions{FreshFor: time.Hour, Window: 0})
		if len(v) != 1 || v[0].Pods[0].Values["waiting"] != 5 {
			t.Errorf("ack_every_ms %d: the store holds %+v, want the last batch's waiting 5", every, v)
		}
	}
}

// TestASampleFromTheFarFutureIsRefusedAlone: a sample timed hours ahead
// of the aggregator's clock held every later sample of its pod out (the
// store keeps a pod's series in time order): refused alone (bad_time),
// the stream and the other pods go on.
func TestASampleFromTheFarFutureIsRefusedAlone(t *testing.T) {
	f := newFixture(t)
	batch := func(seq uint64, at time.Time, pod uint32, waiting float64) *pulsev1.AgentMessage {
		enc := wire.NewEncoder()
		b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: at.UnixMilli()}
		s := wire.Sample{Pod: pod}
		s.Values.Set(metric.Waiting, waiting)
		enc.Append(b, &s)
		return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
	}
	now := time.Now()
	// And one before 1970 (its time delta overflowed the series' encoding).
	if err := f.run(t, hello(), catalogue(pod(1, "a"), pod(2, "b"), pod(3, "c")), batch(1, now.Add(2*time.Hour), 1, 9), batch(2, now, 2, 3),
		batch(3, time.UnixMilli(-1<<62), 3, 7)); err != nil {
		t.Fatal(err)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
	if len(v) != 1 || len(v[0].Pods) != 3 || v[0].Pods[0].Fresh || v[0].Pods[1].Values["waiting"] != 3 || v[0].Pods[2].Fresh {
		t.Fatalf("store = %+v: want a and c with no sample, b's kept", v)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("bad_time")); got != 2 {
		t.Fatalf("rejected bad_time = %v, want 2", got)
	}
	// Each warning says which: one before 1970 was logged as an hour ahead.
	if logs := f.logs.String(); !strings.Contains(logs, "its time is more than an hour ahead") || !strings.Contains(logs, "its time is before 1970") {
		t.Fatalf("the warnings do not say which way each time is wrong:\n%s", logs)
	}
}

// TestAnIDListedTwiceInOneCatalogueIsRefusedAlone: each later entry for an
// id a catalogue had listed moved the id to its own uid, past the stream's
// room (an id held takes none), and every uid was stored while the stream
// kept the last: one stream held pods it could neither report nor remove,
// as many as it listed. The first entry for an id stands; each later one
// is refused alone (duplicate_id), named in a warning, and the stream and
// its other pods go on.
func TestAnIDListedTwiceInOneCatalogueIsRefusedAlone(t *testing.T) {
	f := newFixture(t) // at most 3 pods a stream
	names := func() []string {
		var out []string
		for _, w := range f.store.View(store.ViewOptions{FreshFor: time.Hour}) {
			for _, p := range w.Pods {
				out = append(out, p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	// An invalid entry after a valid one for the same id: the valid one
	// stands.
	bad := pod(2, "b2")
	bad.Uid = ""
	repeats := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{
		Upsert: []*pulsev1.Pod{pod(1, "a"), pod(1, "a2"), pod(1, "a3"), pod(1, "a4"), pod(2, "b"), bad}}}}
	more := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{
		Upsert: []*pulsev1.Pod{pod(3, "c"), pod(4, "d")}}}}
	if err := f.run(t, hello(), repeats, more); err != nil {
		t.Fatalf("the stream ended: %v", err)
	}
	if got, want := names(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("pods held %v, want %v: each id's first entry, and no more than the stream's room", got, want)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("duplicate_id")); got != 4 {
		t.Fatalf("rejected duplicate_id = %v, want 4", got)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("agent_full")); got != 1 {
		t.Fatalf("rejected agent_full = %v, want 1 (d: a, b and c fill the room)", got)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "reason=duplicate_id") || !strings.Contains(logs, "pod=ns/a2") || !strings.Contains(logs, "lists pod id 1 more than once") {
		t.Fatalf("no warning names the repeated entry and why:\n%s", logs)
	}
}

// TestExtraValuesThatDoNotMatchAreDroppedAlone: one pod's sample with more
// extra values than the hello named ended the stream, every other pod's
// sample of the batch lost with it, though the batch decoded (the two ends
// still agreed). Now that sample's extra values alone are dropped
// (bad_extra), shown on the pod.
func TestExtraValuesThatDoNotMatchAreDroppedAlone(t *testing.T) {
	f := newFixture(t)
	h := hello()
	h.GetHello().ExtraMetrics = []string{"vllm:extra"}
	enc := wire.NewEncoder()
	b := &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: time.Now().UnixMilli()}
	for i, extra := range [][]float64{{1, 2}, {5}} {
		s := wire.Sample{Pod: uint32(i + 1), Extra: extra}
		s.Values.Set(metric.Waiting, float64(4-i))
		enc.Append(b, &s)
	}
	if err := f.run(t, h, catalogue(pod(1, "a"), pod(2, "b")), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
		t.Fatalf("one pod's extra values past the hello's: %v, want the stream on", err)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
	if len(v) != 1 || len(v[0].Pods) != 2 {
		t.Fatalf("store = %+v, want pods a and b", v)
	}
	a, bp := v[0].Pods[0], v[0].Pods[1]
	if a.Values["waiting"] != 4 || !strings.Contains(a.Rejected, "2 extra values for 1 extra metrics") || bp.Values["waiting"] != 3 {
		t.Fatalf("pods = %+v, %+v: want a's waiting kept and its extra values refused, b's sample whole", a, bp)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("bad_extra")); got != 1 {
		t.Fatalf("rejected bad_extra = %v, want 1", got)
	}
}

// TestSamplesOfARefusedEntryAreNotCountedAgain: an entry refused once had
// every later sample of its pod counted unknown_pod, a steady rate that
// read as the store losing pods. Its refusal is counted once.
func TestSamplesOfARefusedEntryAreNotCountedAgain(t *testing.T) {
	f := newFixture(t)
	enc := wire.NewEncoder()
	var msgs []*pulsev1.AgentMessage
	for seq := range uint64(3) {
		b := &pulsev1.SampleBatch{Seq: seq + 1, TimeUnixMs: time.Now().UnixMilli()}
		for id := range uint32(2) {
			s := wire.Sample{Pod: id + 1}
			s.Values.Set(metric.Waiting, 1)
			enc.Append(b, &s)
		}
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
	}
	if err := f.run(t, append([]*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a"), &pulsev1.Pod{Id: 2})}, msgs...)...); err != nil {
		t.Fatal(err)
	}
	invalid := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("invalid_entry"))
	unknown := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("unknown_pod"))
	if invalid != 1 || unknown != 0 {
		t.Fatalf("rejected invalid_entry = %v, unknown_pod = %v after three batches: want 1 and 0", invalid, unknown)
	}
}

// TestACatalogueRepeatingAHeldEntryIsBounded: a catalogue's entries are
// bounded whatever they name (twice the stream's limit): one held pod
// listed 60,000 times counted as no new pod, and each copy was looked up
// and upserted under the store's lock (61 ms a catalogue, every reader
// waiting). Such a catalogue ends the stream, as one of too many pods does.
func TestACatalogueRepeatingAHeldEntryIsBounded(t *testing.T) {
	f := newFixture(t) // at most 3 pods a stream
	dup := &pulsev1.Catalogue{}
	for range 7 {
		dup.Upsert = append(dup.Upsert, pod(1, "mine"))
	}
	err := f.run(t, hello(), catalogue(pod(1, "mine")), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: dup}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "7 entries") {
		t.Fatalf("a catalogue of 7 copies of one held pod (limit 3): %v, want the stream ended", err)
	}
}

// TestPodsWaitingForRoomAreLoggedBounded: an entry the store refuses for
// room is listed again at each batch; its warning is bounded as every
// refusal's (ten a minute a stream), where it was logged each time, as
// fast as an agent sends.
func TestPodsWaitingForRoomAreLoggedBounded(t *testing.T) {
	f := newFixtureStore(t, nil, store.Options{MaxPods: 1})
	msgs := []*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a"))}
	for range 500 {
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{
			Upsert: []*pulsev1.Pod{pod(2, "b"), pod(3, "c")}}}})
	}
	if err := f.run(t, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(f.logs.String(), "pod not held"); n == 0 || n > 10 {
		t.Fatalf("%d warnings of pods waiting for room from one stream, want 1 to 10", n)
	}
}

// gatedAuth binds every stream to node-1 and, while gate is set, holds the
// lookup of the pod named "slow" until gate closes (a slow API).
type gatedAuth struct {
	gate    chan struct{}
	entered chan struct{}
}

func (gatedAuth) Authenticate(context.Context, string) (Agent, error) {
	return Agent{Node: "node-1"}, nil
}

func (a gatedAuth) PodNode(ctx context.Context, e Entry) (string, error) {
	if e.Name == "slow" {
		a.entered <- struct{}{}
		select {
		case <-a.gate:
		case <-ctx.Done():
			return "", ErrLookupUnavailable
		}
	}
	return e.Node, nil
}

// TestAStaleStreamOfTheNodeChangesNothing: a stream's full catalogue that
// waited on a slow pod lookup while its agent reconnected was stored after
// the new stream's: it dropped the pods the new stream listed (their
// series with them) and put back its agent's old instance. Now, once a
// stream opened later has listed the node in full, the older stream's
// catalogue and samples are refused and it ends (Aborted, counted as
// superseded); the newer stream's pods and samples stand, and it goes on.
func TestAStaleStreamOfTheNodeChangesNothing(t *testing.T) {
	auth := gatedAuth{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	f := newFixtureWith(t, auth)
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer t"), 20*time.Second)
	defer cancel()
	old := f.openStream(ctx, t, "node-1")
	if err := old.Send(catalogue(pod(1, "slow"))); err != nil {
		t.Fatal(err)
	}
	<-auth.entered // its catalogue waits on the lookup
	fresh := f.openStream(ctx, t, "node-1")
	if err := fresh.Send(catalogue(pod(1, "b"))); err != nil {
		t.Fatal(err)
	}
	enc := wire.NewEncoder()
	sendBatch(t, fresh, enc, 1, 7, 1)
	close(auth.gate) // the old stream's catalogue goes on
	_, err := old.Recv()
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "newer stream") {
		t.Fatalf("the old stream: %v, want Aborted naming the newer stream", err)
	}
	if _, ok := f.store.ListedOn("node-1", "uid-slow"); ok {
		t.Fatal("the old stream's late catalogue was stored")
	}
	if _, ok := f.store.ListedOn("node-1", "uid-b"); !ok {
		t.Fatal("the newer stream's pod was dropped by the old stream's late catalogue")
	}
	sendBatch(t, fresh, enc, 2, 9, 1) // the newer stream goes on
	views := f.store.View(store.ViewOptions{FreshFor: time.Hour})
	if len(views) != 1 || len(views[0].Pods) != 1 || views[0].Pods[0].Name != "b" {
		t.Fatalf("held %+v; want pod b alone", views)
	}
	if v, ok := views[0].Pods[0].Values[metric.Waiting.Name()]; !ok || v != 9 {
		t.Fatalf("pod b's last waiting %v (%v); want 9, the newer stream's", v, ok)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("superseded")); got != 1 {
		t.Fatalf("superseded streams counted: %v, want 1", got)
	}
}

// TestValuesPastBeliefAreRefusedAlone: a fraction past 1 (a KV cache
// "50000 full", a GPU 300 % used) and a latency histogram with a bound at
// or below 0 are refused, that value or histogram alone: the pod's other
// values are stored, and its workload's quantile is read from the pods
// whose buckets hold durations. Stored, one pod's KV cache of 50000 made
// its workload's mean 12,500 against a threshold of 0.4, and one pod's
// bucket at -100 left its workload's pods, merged on the bounds they
// share, only +Inf: the quantile Unavailable.
func TestValuesPastBeliefAreRefusedAlone(t *testing.T) {
	f := newFixture(t)
	llama := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	enc := wire.NewEncoder()
	now := time.Now()
	var msgs []*pulsev1.AgentMessage
	for i, at := range []time.Time{now.Add(-3 * time.Second), now.Add(-time.Second)} {
		b := &pulsev1.SampleBatch{Seq: uint64(i + 1), TimeUnixMs: at.UnixMilli()}
		n := float64(10 * i) // requests so far, each within 0.5 s
		a := wire.Sample{Pod: 1, Hist: &metric.Histograms{}}
		a.Values.Set(metric.Waiting, 1)
		a.Values.Set(metric.KVCacheUsage, 0.5)
		a.Hist[metric.TTFTHist] = metric.Buckets{Bounds: []float64{0.5, 1, math.Inf(1)}, Counts: []float64{n, n, n}}
		enc.Append(b, &a)
		bad := wire.Sample{Pod: 2, Hist: &metric.Histograms{}}
		bad.Values.Set(metric.Waiting, 2)
		bad.Values.Set(metric.KVCacheUsage, 50000)
		bad.Values.Set(metric.GPUUtilization, 3)
		bad.Hist[metric.TTFTHist] = metric.Buckets{Bounds: []float64{-100, math.Inf(1)}, Counts: []float64{n, n}}
		enc.Append(b, &bad)
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
	}
	if err := f.run(t, append([]*pulsev1.AgentMessage{hello(), catalogue(pod(1, "a"), pod(2, "b"))}, msgs...)...); err != nil {
		t.Fatal(err)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute})
	if len(v) != 1 || len(v[0].Pods) != 2 {
		t.Fatalf("store = %+v", v)
	}
	b := v[0].Pods[1]
	if _, ok := b.Values["kvCacheUsage"]; ok || b.Values["waiting"] != 2 {
		t.Fatalf("pod b's values %v: want waiting 2 and no kvCacheUsage", b.Values)
	}
	if _, ok := b.Values["gpuUtilization"]; ok {
		t.Fatalf("pod b's values %v: want no gpuUtilization", b.Values)
	}
	for _, want := range []string{"kvCacheUsage 50000 above 1", "gpuUtilization 3 above 1", "ttft's bound -100 at or below 0"} {
		if !strings.Contains(b.Rejected, want) {
			t.Errorf("pod b's refused values %q: want %q among them", b.Rejected, want)
		}
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("ratio_above_one")); got != 4 {
		t.Errorf("rejected ratio_above_one = %v, want 4 (two values in each of two samples)", got)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("nonpositive_bound")); got != 2 {
		t.Errorf("rejected nonpositive_bound = %v, want 2", got)
	}
	p90 := metric.Def{Name: "ttftP90Seconds", Rule: metric.RuleQuantile, Hist: metric.TTFTHist, Q: 0.9}
	if _, q, ok, _ := f.store.QueryQuantile(nil, llama, p90, time.Minute, time.Minute); !ok || q != 0.45 {
		t.Fatalf("TTFT p90 = %v (ok %v), want 0.45: pod a's ten requests within 0.5 s", q, ok)
	}
}

// TestHistogramsOfASampleNotStoredAreKept: an agent sends a histogram only
// when it changed, so one in a sample the aggregator decoded and did not
// store (its time refused, its pod waiting for room) was not sent again:
// the store carried the pod's older histogram on, its quantiles reading
// no observations (or fewer) until the histogram changed again. The
// stream now keeps such a sample's histograms for the pod's next stored
// sample.
func TestHistogramsOfASampleNotStoredAreKept(t *testing.T) {
	llama := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	p90 := metric.Def{Name: "ttftP90Seconds", Rule: metric.RuleQuantile, Hist: metric.TTFTHist, Q: 0.9}
	withHist := func(enc *wire.Encoder, seq uint64, at int64, id uint32, slow float64) *pulsev1.AgentMessage {
		b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: at}
		s := wire.Sample{Pod: id, Hist: &metric.Histograms{}}
		s.Values.Set(metric.Waiting, 1)
		// One request within 0.5 s, slow ones past it.
		s.Hist[metric.TTFTHist] = metric.Buckets{Bounds: []float64{0.5, math.Inf(1)}, Counts: []float64{1, 1 + slow}}
		enc.Append(b, &s)
		return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
	}
	quantile := func(f *fixture) (float64, bool) {
		_, q, ok, _ := f.store.QueryQuantile(nil, llama, p90, time.Minute, time.Minute)
		return q, ok
	}

	t.Run("a time refused", func(t *testing.T) {
		f := newFixture(t)
		enc := wire.NewEncoder()
		now := time.Now()
		// 10 slow requests in the sample refused; the next sample's
		// histogram is the same, so not sent.
		if err := f.run(t, hello(), catalogue(pod(1, "a")),
			withHist(enc, 1, now.Add(-3*time.Second).UnixMilli(), 1, 0),
			withHist(enc, 2, now.Add(2*time.Hour).UnixMilli(), 1, 10),
			withHist(enc, 3, now.Add(-time.Second).UnixMilli(), 1, 10)); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("bad_time")); got != 1 {
			t.Fatalf("rejected bad_time = %v, want 1", got)
		}
		if q, ok := quantile(f); !ok || q != 0.5 {
			t.Fatalf("TTFT p90 = %v (ok %v), want 0.5: the 10 slow requests of the refused sample's histogram", q, ok)
		}
	})

	t.Run("a pod waiting for room", func(t *testing.T) {
		f := newFixtureStore(t, nil, store.Options{MaxPods: 1})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a := f.openStream(ctx, t, "node-1")
		if err := a.Send(catalogue(pod(1, "x"))); err != nil {
			t.Fatal(err)
		}
		sendBatch(t, a, wire.NewEncoder(), 1, 3, 1)
		b := f.openStream(ctx, t, "node-2")
		if err := b.Send(catalogue(pod(1, "a"))); err != nil {
			t.Fatal(err)
		}
		enc := wire.NewEncoder()
		send := func(m *pulsev1.AgentMessage) {
			t.Helper()
			if err := b.Send(m); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Recv(); err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
		}
		send(withHist(enc, 1, 1000, 1, 0)) // waits: store_full
		if err := a.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Remove: []uint32{1}}}}); err != nil {
			t.Fatal(err)
		}
		sendBatch(t, a, wire.NewEncoder(), 2, 3)
		send(withHist(enc, 2, 2000, 1, 0))  // held now; its histogram unchanged, not sent
		send(withHist(enc, 3, 3000, 1, 10)) // 10 slow requests since
		if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("store_full")); got < 1 {
			t.Fatalf("rejected store_full = %v, want the waiting pod's sample counted", got)
		}
		if q, ok := quantile(f); !ok || q != 0.5 {
			t.Fatalf("TTFT p90 = %v (ok %v), want 0.5: 10 slow requests since the pod's first stored sample", q, ok)
		}
	})
}

// samplesOf is the samples the store holds of ns/llama's pod name, and
// whether it holds it.
func samplesOf(f *fixture, name string) (int, bool) {
	k := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	pods, _ := f.store.Query(nil, k, metric.Canonical[0], time.Minute, time.Hour)
	for _, p := range pods {
		if p.Name == name {
			return p.Samples, true
		}
	}
	return 0, false
}

// TestAPodMovedToANewIDKeepsItsSeriesAndPlace: a pod the agent lists under
// a new id (it left the catalogue and came back between two sends, its old
// id taken by another pod) in one catalogue of changes keeps its series,
// and at --max-pods its place: it was removed before it was listed again,
// its samples dropped, and the new pod (another namespace's) took its
// place, though no pod held is evicted for a new one.
func TestAPodMovedToANewIDKeepsItsSeriesAndPlace(t *testing.T) {
	for _, maxPods := range []int{0, 2} {
		f := newFixtureStore(t, nil, store.Options{MaxPods: maxPods})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		enc := wire.NewEncoder()
		s := f.openStream(ctx, t, "node-1")
		if err := s.Send(catalogue(pod(1, "a"), pod(2, "b"))); err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= 3; seq++ {
			sendBatch(t, s, enc, seq, 1, 1, 2)
		}
		// As DiffCatalogue sends it: id 1 is now c, a is id 3.
		enc.Forget(1)
		c := pod(1, "c")
		c.Namespace = "other"
		delta := &pulsev1.Catalogue{Remove: []uint32{1}, Upsert: []*pulsev1.Pod{c, pod(3, "a")}}
		if err := s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: delta}}); err != nil {
			t.Fatal(err)
		}
		sendBatch(t, s, enc, 4, 1, 1, 2, 3)
		if n, ok := samplesOf(f, "a"); n != 4 {
			t.Fatalf("--max-pods %d: a (held %v) holds %d samples after moving ids, want 4 (its series kept)", maxPods, ok, n)
		}
		cancel()
	}
}
