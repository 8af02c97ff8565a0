package ingest

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/fuzzbytes"
)

// FuzzReport sends node-1's agent stream (its token bound to node-1)
// whatever the fuzzer's bytes decode to: hellos, catalogues and batches in
// any order, with any ids, names, workloads, times and values, well formed
// or not. After each stream it asserts:
//   - no panic, and the stream ends well or with a status of the codes the
//     server refuses with, saying why;
//   - node-2's pod, reported before by node-2's agent, is as it was: no
//     entry or sample of another node's stream disturbs it;
//   - the store holds no pod but node-2's and node-1's own ("mine"): a
//     pod the API does not place on node-1 is never admitted from it;
//   - what the store shows of a pod (its name, error, missing reason and
//     rejected values) is valid UTF-8 and bounded.
//
// `make fuzz` runs it; its seed corpus runs in `make test`.
func FuzzReport(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 0, 1, 2, 1, 1, 2, 0, 1, 0, 3, 0x10})
	f.Add([]byte{0, 0, 1, 2, 1, 0, 0, 1, 1, 1, 1, 2, 2, 1, 1, 4, 9, 9, 9, 2, 2, 0, 0, 7})
	f.Add([]byte{1, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte{0, 1, 0, 2, 3, 0, 0xff, 0xff, 0xff, 0xff, 3, 4, 5, 6, 7, 8})
	fx := newFixtureStore(f, runningReviewer(f, fakeAPI()), store.Options{Expiry: 24 * time.Hour})
	// node-2's agent reports its pod: the bystander.
	theirs := &pulsev1.Pod{Id: 7, Uid: "uid-theirs", Namespace: "ns", Name: "theirs", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	enc := wire.NewEncoder()
	var msgs []*pulsev1.AgentMessage
	for i := range 3 {
		var b pulsev1.SampleBatch
		b.Seq, b.TimeUnixMs = uint64(i+1), time.Now().UnixMilli()-int64(3-i)*1000
		s := wire.Sample{Pod: 7}
		s.Values.Set(metric.Waiting, float64(3+i))
		s.Values.Set(metric.PromptTokens, float64(1000*(i+1)))
		enc.Append(&b, &s)
		msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}})
	}
	if err := fx.runAs(f, "token-node-2", append([]*pulsev1.AgentMessage{helloFrom("node-2"), catalogue(theirs)}, msgs...)...); err != nil {
		f.Fatal(err)
	}
	before := podView(fx.store, "theirs")
	if before == nil || before.Values["waiting"] != 5 {
		f.Fatalf("node-2's pod = %+v, want it with its last sample", before)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		r := recipe{fuzzbytes.New(data)}
		msgs := r.messages()
		err := fx.runAs(t, "token-node-1", msgs...)
		if err != nil {
			st, ok := status.FromError(err)
			if !ok || st.Message() == "" || !refusalCodes[st.Code()] {
				t.Fatalf("the stream ended with %v (%T): want a refusal that says why", err, err)
			}
		}
		if after := podView(fx.store, "theirs"); !reflect.DeepEqual(after, before) {
			t.Fatalf("node-2's pod changed by node-1's stream:\nbefore %+v\nafter  %+v", before, after)
		}
		for _, w := range fx.store.View(store.ViewOptions{FreshFor: time.Hour}) {
			for _, p := range w.Pods {
				if p.Name != "theirs" && p.Name != "mine" {
					t.Fatalf("pod %q of workload %v admitted from node-1's stream", p.Name, w.Key)
				}
				for _, s := range []string{p.Name, p.Error, p.Missing, p.Rejected} {
					if !utf8.ValidString(s) || len(s) > 1024 {
						t.Fatalf("pod %q shows %d bytes (valid UTF-8 %v)", p.Name, len(s), utf8.ValidString(s))
					}
				}
			}
		}
	})
}

// refusalCodes are the codes the server ends a stream with.
var refusalCodes = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.PermissionDenied: true, codes.Unauthenticated: true,
	codes.ResourceExhausted: true, codes.FailedPrecondition: true, codes.Unavailable: true,
}

func helloFrom(node string) *pulsev1.AgentMessage {
	m := hello()
	m.GetHello().Node = node
	return m
}

// podView is the store's latest view of the pod named name, nil if none.
func podView(s *store.Store, name string) *store.PodView {
	for _, w := range s.View(store.ViewOptions{FreshFor: 24 * time.Hour}) {
		for _, p := range w.Pods {
			if p.Name == name {
				p.Fresh, p.Age = false, 0 // they move with the clock
				return &p
			}
		}
	}
	return nil
}

// recipe reads a stream's messages from the fuzzer's bytes; past the end
// every read is 0.
type recipe struct{ *fuzzbytes.Reader }

// str is one of a few names that mean something to the fixture, or an
// odd one: empty, long, with a slash, upper case. (Not invalid UTF-8: the
// client's codec refuses to send it.)
func (r *recipe) str(names ...string) string {
	odd := []string{"", strings.Repeat("é", 300), "ns/x", "UPPER", "a\x00b"}
	i := r.Pick(len(names) + len(odd))
	if i < len(names) {
		return names[i]
	}
	return odd[i-len(names)]
}

func (r *recipe) ms() int64 {
	now := time.Now().UnixMilli()
	return []int64{now, now - 1000, now + 1000, 0, -1, now + 365*24*3600*1000, math.MaxInt64, int64(r.U64())}[r.Pick(8)]
}

func (r *recipe) value() float64 {
	return []float64{0, 1, 4, -1, 0.5, 1e6, 1e300, math.NaN(), math.Inf(1), math.Inf(-1), float64(r.Byte()) * 1000}[r.Pick(11)]
}

// messages decodes up to 13 messages.
func (r *recipe) messages() []*pulsev1.AgentMessage {
	enc := wire.NewEncoder()
	var out []*pulsev1.AgentMessage
	if r.Pick(8) != 0 {
		// Most streams open as an agent's do, so that the bytes reach what
		// follows a hello.
		out = append(out, helloFrom("node-1"))
	}
	for n := r.Pick(12) + 1; n > 0 && r.Len() > 0; n-- {
		switch r.Pick(4) {
		case 0:
			h := &pulsev1.Hello{Node: r.str("node-1", "node-2"), AgentVersion: "fuzz",
				ProtocolVersion: pulsev1.ProtocolVersion(r.Pick(3)), AckEveryMs: uint32(r.Byte()) * 100}
			for range r.Pick(4) {
				h.ExtraMetrics = append(h.ExtraMetrics, r.str("vllm:x", "vllm:y"))
			}
			out = append(out, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: h}})
		case 1:
			c := &pulsev1.Catalogue{Full: r.Pick(2) == 0}
			for range r.Pick(5) {
				c.Upsert = append(c.Upsert, r.pod())
			}
			for range r.Pick(3) {
				c.Remove = append(c.Remove, uint32(r.Pick(6)))
			}
			out = append(out, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: c}})
		case 2:
			out = append(out, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: r.batch(enc)}})
		default:
			out = append(out, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: r.rawBatch()}})
		}
	}
	return out
}

func (r *recipe) pod() *pulsev1.Pod {
	p := &pulsev1.Pod{Id: uint32(r.Pick(6)), Uid: r.str("uid-mine", "uid-theirs", "uid-ghost"),
		Namespace: r.str("ns", "other"), Name: r.str("mine", "theirs", "ghost"),
		Ready: r.Pick(2) == 0, Terminating: r.Pick(4) == 0, Demand: r.Pick(6) == 0,
		CreatedUnixMs: r.ms(), ReadySinceUnixMs: r.ms(), UnreadySinceUnixMs: r.ms()}
	if r.Pick(8) == 0 {
		p.Id = uint32(r.U64())
	}
	for range r.Pick(3) {
		p.Workloads = append(p.Workloads, &pulsev1.Workload{Kind: pulsev1.WorkloadKind(r.Pick(8)), Name: r.str("llama", "other")})
	}
	return p
}

// batch is a well-formed batch of the stream's encoder, its values
// anything (below 0, NaN, infinite), its pods catalogued or not.
func (r *recipe) batch(enc *wire.Encoder) *pulsev1.SampleBatch {
	b := &pulsev1.SampleBatch{Seq: uint64(r.Byte()), TimeUnixMs: r.ms()}
	used := map[uint32]bool{}
	for range r.Pick(4) {
		s := wire.Sample{Pod: uint32(r.Pick(6)), OffsetMs: int32(r.Byte()) - 128}
		if used[s.Pod] {
			continue
		}
		used[s.Pod] = true
		for range r.Pick(6) {
			s.Values.Set(metric.ID(r.Pick(int(metric.NumIDs))), r.value())
		}
		enc.Append(b, &s)
	}
	for range r.Pick(2) {
		b.Missing = append(b.Missing, &pulsev1.MissingSample{Pod: uint32(r.Pick(6)), Reason: pulsev1.MissingReason(r.Pick(9)),
			Error: r.str("connection refused")})
	}
	for range r.Pick(2) {
		e := &pulsev1.ExtraValues{Pod: uint32(r.Pick(6))}
		for range r.Pick(3) {
			e.Values = append(e.Values, r.value())
		}
		b.Extra = append(b.Extra, e)
	}
	for range r.Pick(2) {
		h := &pulsev1.HistogramSample{Pod: uint32(r.Pick(6)), Histogram: pulsev1.Histogram(r.Pick(4))}
		for i := range r.Pick(4) {
			h.Bounds = append(h.Bounds, []float64{0.1, 0.5, float64(i), math.Inf(1), math.NaN()}[r.Pick(5)])
			h.Counts = append(h.Counts, int64(r.Byte())-8)
		}
		b.Histograms = append(b.Histograms, h)
	}
	return b
}

// rawBatch is a batch's columns as the bytes say: of any lengths, with
// any bits and values.
func (r *recipe) rawBatch() *pulsev1.SampleBatch {
	b := &pulsev1.SampleBatch{Seq: r.U64(), TimeUnixMs: r.ms()}
	for range r.Pick(4) {
		b.Pods = append(b.Pods, uint32(r.Pick(6)))
	}
	for range r.Pick(4) {
		b.OffsetsMs = append(b.OffsetsMs, int32(r.Byte())-128)
	}
	for range r.Pick(4) {
		b.PresentXor = append(b.PresentXor, r.U64()>>r.Pick(64))
	}
	for range r.Pick(8) {
		b.Values = append(b.Values, int64(r.U64())>>r.Pick(64))
	}
	return b
}
