package ingest

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/reflect/protoreflect"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Codec is the ingest server's gRPC codec (grpc.ForceServerCodecV2): gRPC's
// protobuf codec, except that an agent's messages after its hello are
// decoded into pooled messages whose batches keep their columns' arrays
// (vtprotobuf's generated UnmarshalVT and pools, ingest_vtproto.pb.go).
//
// gRPC decodes each message into a new one, and a batch's columns (pods,
// offsets, present bitmaps, values) into new arrays: on a fleet that was
// most of what the aggregator allocated (2,000 agents: 60 % of its
// allocations in bytes, the GC running every 15 s), and the GC's marking
// on the aggregator's CPU is what a KEDA poll waits behind at its p99.
//
// A hello's strings are checked to be UTF-8, as protobuf's own Unmarshal
// checks them (UnmarshalVT does not): such a message was decoded again by
// protobuf's Unmarshal, which grows a packed field's slice to its exact
// length at each run of it, so that a catalogue of 54 KB whose 18,432
// removals each came in a run of its own allocated 695 MB, and a first
// message of 63 KB 1.9 GB (validUTF8). A catalogue entry's strings are
// checked with the rest of the entry, which is refused alone
// (entryInfo); a batch's one string, a scrape's error, is cleaned where
// it is read.
func Codec() encoding.CodecV2 { return CodecFor(Limits{}) }

// CodecFor is Codec for a server of these limits: a message past them is
// refused before it is decoded (Limits.prescan).
func CodecFor(l Limits) encoding.CodecV2 {
	return codec{base: encoding.GetCodecV2(gproto.Name), limits: l.withDefaults()}
}

type codec struct {
	base   encoding.CodecV2
	limits Limits
}

func (c codec) Name() string { return c.base.Name() }

func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, pooled := v.(*received)
	m, first := v.(*pulsev1.AgentMessage) // a stream's hello: stream.Recv
	if !pooled && !first {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	// Counted before its decode, the first message too: unchecked, a
	// first message of 4 MiB of empty pods was decoded whole (414 MB
	// allocated) before it was refused as no hello.
	if err := c.limits.prescan(buf.ReadOnlyData()); err != nil {
		return err
	}
	if first {
		if err := m.UnmarshalVT(buf.ReadOnlyData()); err != nil {
			return err
		}
		return validUTF8(m)
	}
	m = pulsev1.AgentMessageFromVTPool()
	err := m.UnmarshalVT(buf.ReadOnlyData())
	if err == nil {
		err = validUTF8(m)
	}
	// The bound holds on both paths: a message that fails after a whole
	// batch (one truncated field after it) holds that batch at its size.
	pool := buf.Len() <= maxPooledMessage && subMessages(m) <= maxPooledSubMessages
	if err != nil {
		if pool {
			m.ReturnToVTPool()
		}
		return err
	}
	r.msg, r.pool = m, pool
	return nil
}

// maxPooledMessage: a message decoded from more bytes than this is not
// given back to the pool. The pool keeps a message's columns and
// sub-messages at their capacity: one 4 MiB batch of 2-byte empty entries
// (85 bytes each decoded) held 165 MB in the pool that every stream
// shares, handed out again under steady traffic and so never collected.
// An agent's batch of 1,024 pods (its bound) is about 46 KB.
const maxPooledMessage = 64 << 10

// maxPooledSubMessages: a message of more sub-messages than this is not
// given back to the pool either, whatever its bytes: the pool keeps a
// batch's arrays of sub-messages, each reset, at their length, and 64 KiB
// of 2-byte empty entries decodes to about 32,000 of them, 2.3 MB a pooled
// message. An agent's batch has at most four a pod (a missing sample or
// its extra values, and two histograms: TTFT and ITL), 1,024 pods by
// default.
const maxPooledSubMessages = 4 << 10

// subMessages counts a batch's sub-messages (0 for another message).
func subMessages(m *pulsev1.AgentMessage) int {
	b := m.GetBatch()
	if b == nil {
		return 0
	}
	return len(b.Missing) + len(b.Extra) + len(b.Histograms)
}

// received is what a stream's RecvMsg decodes into: with Codec, a pooled
// message, to be released once handled; with gRPC's own codec (a server
// without Codec: tests), a new message as gRPC decodes it.
type received struct {
	msg  *pulsev1.AgentMessage
	pool bool // given back to the pool once handled
}

// ProtoReflect makes a received a protobuf message for gRPC's own codec,
// which decodes into a new message.
func (r *received) ProtoReflect() protoreflect.Message {
	if r.msg == nil {
		r.msg = new(pulsev1.AgentMessage)
	}
	return r.msg.ProtoReflect()
}

// release gives a handled message back to the pool: nothing may hold it or
// its batch's columns after. (The decoder keeps no column; what it keeps of
// a batch, extra values and histogram bounds, are arrays of sub-messages,
// which the pool resets but does not reuse.)
func (r *received) release() {
	if r.msg != nil && r.pool {
		r.msg.ReturnToVTPool()
	}
	r.msg, r.pool = nil, false
}

// validUTF8 is protobuf's check that a hello's strings are UTF-8, without
// its decode. A catalogue's are not checked here: an entry whose uid,
// namespace, name or workload is not UTF-8 is refused alone, with the
// stream kept (entryInfo; checked here, it ended the stream, and every
// other pod of the node went unreported).
func validUTF8(m *pulsev1.AgentMessage) error {
	h := m.GetHello()
	if h == nil {
		return nil
	}
	ok := utf8.ValidString(h.Node) && utf8.ValidString(h.AgentVersion) && utf8.ValidString(h.AgentInstance)
	for _, x := range h.ExtraMetrics {
		ok = ok && utf8.ValidString(x)
	}
	if !ok {
		return errors.New("proto: a string field of the hello is not valid UTF-8")
	}
	return nil
}
