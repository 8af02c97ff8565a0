package ingest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// randomMessage is a batch (of 0 to 12 pods, with or without missing,
// extra and histogram entries, any field possibly zero) or a catalogue.
func randomMessage(r *rand.Rand) *pulsev1.AgentMessage {
	if r.IntN(6) == 0 {
		return catalogue(pod(uint32(r.IntN(5)), "p"))
	}
	b := &pulsev1.SampleBatch{Seq: uint64(r.IntN(3)), TimeUnixMs: int64(r.IntN(3)) * 1_700_000_000_000}
	for i := range r.IntN(13) {
		b.Pods = append(b.Pods, uint32(i))
		b.OffsetsMs = append(b.OffsetsMs, int32(r.IntN(5)-2))
		b.PresentXor = append(b.PresentXor, uint64(r.IntN(4)))
	}
	for range r.IntN(40) {
		b.Values = append(b.Values, r.Int64N(1<<40)-1<<39)
	}
	if r.IntN(3) == 0 {
		b.Missing = append(b.Missing, &pulsev1.MissingSample{Pod: 99, Reason: pulsev1.MissingReason_MISSING_REASON_TIMEOUT, Error: "slow"})
	}
	if r.IntN(3) == 0 {
		b.Extra = append(b.Extra, &pulsev1.ExtraValues{Pod: 1, Values: []float64{r.Float64()}})
	}
	if r.IntN(3) == 0 {
		b.Histograms = append(b.Histograms, &pulsev1.HistogramSample{Pod: 1, Histogram: pulsev1.Histogram_HISTOGRAM_TTFT, Bounds: []float64{1, 2}, Counts: []int64{3, 4}})
	}
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
}

// TestCodecDecodesEachMessageAsItIs: 2,000 random messages in a row through
// the pooled decode each read back equal to what was sent; nothing of the
// message before (a longer column, a field the next one leaves at zero, a
// missing entry) is left in it.
func TestCodecDecodesEachMessageAsItIs(t *testing.T) {
	c := Codec()
	r := rand.New(rand.NewPCG(1, 2))
	var got received
	for i := range 2000 {
		want := randomMessage(r)
		data, err := c.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got.release()
		if err := c.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got.msg, want) {
			t.Fatalf("message %d decoded as\n%v\nwant\n%v", i, got.msg, want)
		}
	}
}

// TestCodecReusesABatchsColumns: a batch decoded into a reset one writes
// its columns into the arrays it had; through the pool, a batch allocates
// no array and no batch (at most the oneof's wrapper), where gRPC's own
// codec allocates a new message, a new batch and an array per column.
func TestCodecReusesABatchsColumns(t *testing.T) {
	b := &pulsev1.SampleBatch{Seq: 7, TimeUnixMs: 1_700_000_000_000}
	for i := range 8 {
		b.Pods = append(b.Pods, uint32(i))
		b.OffsetsMs = append(b.OffsetsMs, int32(i))
		b.PresentXor = append(b.PresentXor, 0)
		for j := range 18 {
			b.Values = append(b.Values, int64(i*100+j))
		}
	}
	rawBatch, err := proto.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var reused pulsev1.SampleBatch
	if err := reused.UnmarshalVT(rawBatch); err != nil {
		t.Fatal(err)
	}
	arrays := []any{&reused.Pods[0], &reused.OffsetsMs[0], &reused.PresentXor[0], &reused.Values[0]}
	reused.ResetVT()
	if err := reused.UnmarshalVT(rawBatch); err != nil {
		t.Fatal(err)
	}
	if again := []any{&reused.Pods[0], &reused.OffsetsMs[0], &reused.PresentXor[0], &reused.Values[0]}; !slices.Equal(arrays, again) {
		t.Fatal("a reset batch decoded its columns into new arrays")
	}
	if !proto.Equal(&reused, b) {
		t.Fatalf("decoded %v", &reused)
	}

	if raceEnabled {
		t.Skip("allocations through sync.Pool vary under the race detector; the arrays' reuse is checked above")
	}
	data, err := Codec().Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
	if err != nil {
		t.Fatal(err)
	}
	in := mem.BufferSlice{mem.SliceBuffer(data.Materialize())} // read, never freed: a slice's buffer
	decode := func(c encoding.CodecV2, into func() any) float64 {
		return testing.AllocsPerRun(100, func() {
			if err := c.Unmarshal(in, into()); err != nil {
				t.Fatal(err)
			}
		})
	}
	var r received
	pooled := decode(Codec(), func() any { r.release(); return &r })
	fresh := decode(encoding.GetCodecV2(gproto.Name), func() any { return new(pulsev1.AgentMessage) })
	if pooled > 1 || fresh < 7 {
		t.Fatalf("allocations a batch: %v pooled, %v with gRPC's codec; want at most 1 (the oneof's wrapper) and at least 7 (the message, its wrapper, the batch, its four columns)", pooled, fresh)
	}
	if !proto.Equal(r.msg.GetBatch(), b) {
		t.Fatalf("decoded %v", r.msg)
	}
}

// TestReceivedDecodesWithGRPCsCodec: a server without Codec decodes a
// stream's messages into a received as gRPC's codec does.
func TestReceivedDecodesWithGRPCsCodec(t *testing.T) {
	want := randomMessage(rand.New(rand.NewPCG(3, 4)))
	c := encoding.GetCodecV2(gproto.Name)
	data, err := c.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var r received
	if err := c.Unmarshal(data, &r); err != nil || !proto.Equal(r.msg, want) {
		t.Fatalf("decoded %v, %v; want %v", r.msg, err, want)
	}
}

// TestReleasedBatchLeavesWhatTheDecoderKept: the decoder keeps a batch's
// histogram bounds and reads its extra values in place; a batch decoded
// into the released one after it leaves them as they were.
func TestReleasedBatchLeavesWhatTheDecoderKept(t *testing.T) {
	c := Codec()
	batch := func(bounds []float64, extra float64) mem.BufferSlice {
		data, err := c.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{
			Pods: []uint32{1}, OffsetsMs: []int32{0}, PresentXor: []uint64{0},
			Extra:      []*pulsev1.ExtraValues{{Pod: 1, Values: []float64{extra}}},
			Histograms: []*pulsev1.HistogramSample{{Pod: 1, Histogram: pulsev1.Histogram_HISTOGRAM_TTFT, Bounds: bounds, Counts: make([]int64, len(bounds))}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	var r received
	if err := c.Unmarshal(batch([]float64{1, 2, 4}, 7), &r); err != nil {
		t.Fatal(err)
	}
	kept, extra := r.msg.GetBatch().Histograms[0].Bounds, r.msg.GetBatch().Extra[0].Values
	r.release()
	if err := c.Unmarshal(batch([]float64{10, 20, 40}, 70), &r); err != nil {
		t.Fatal(err)
	}
	if kept[0] != 1 || kept[2] != 4 || extra[0] != 7 {
		t.Fatalf("after the next batch: bounds %v, extra %v; want [1 2 4] and [7]", kept, extra)
	}
}

// TestALargeMessageGoesBackToNoPool: a message decoded from more than
// maxPooledMessage bytes is not given back to the pool every stream
// shares, which keeps a message's columns and sub-messages at their
// capacity: one 4 MiB batch of 2-byte empty entries (85 bytes each
// decoded) held 165 MB there, handed out again under steady traffic and
// so never collected.
func TestALargeMessageGoesBackToNoPool(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: the pool hands back what was put last
	// Limits that let 100,000 entries be decoded (--max-pods-per-agent
	// may be that high): within the default's, such a message is refused
	// before it is decoded
	// (TestAMessageOfEmptyEntriesIsRefusedBeforeItIsDecoded).
	c := CodecFor(Limits{MaxPodsPerStream: 100_000})
	small, err := c.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 2,
		Pods: []uint32{1}, OffsetsMs: []int32{0}, PresentXor: []uint64{2}, Values: []int64{3}}}})
	if err != nil {
		t.Fatal(err)
	}
	// Past the bytes' bound; and within it (10,000 entries are 20 KB),
	// past the sub-messages' (about 2.3 MB a pooled message at 64 KiB).
	for _, n := range []int{100_000, 10_000} {
		hostile := &pulsev1.SampleBatch{Seq: 1}
		for range n {
			hostile.Missing = append(hostile.Missing, &pulsev1.MissingSample{})
		}
		big, err := c.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: hostile}})
		if err != nil {
			t.Fatal(err)
		}
		if (n == 100_000) != (big.Len() > maxPooledMessage) || small.Len() > maxPooledMessage {
			t.Fatalf("messages of %d and %d bytes", big.Len(), small.Len())
		}
		// Twenty times: the race detector's sync.Pool drops a quarter of
		// what is put back, so a large message put back is seen at once
		// but for a chance of 4^-20.
		for range 20 {
			var r received
			if err := c.Unmarshal(big, &r); err != nil {
				t.Fatal(err)
			}
			large := r.msg
			r.release()
			if err := c.Unmarshal(small, &r); err != nil {
				t.Fatal(err)
			}
			if r.msg == large {
				t.Fatalf("a message of %d bytes and %d entries went back to the pool: the next one decoded into it, its entries held", big.Len(), cap(large.GetBatch().GetMissing()))
			}
			r.release()
		}
	}
}

// TestALargeMessageThatFailsToDecodeGoesBackToNoPool: the bound on what
// goes back to the shared pool (maxPooledMessage) holds only on success.
// A message over the bound whose batch decodes whole and that then fails
// (one truncated field after the batch) is handed to m.ReturnToVTPool()
// on Codec.Unmarshal's error path, whatever its size: its batch, with
// 100,000 entries' capacity, goes back to the pool every stream shares,
// and the next honest batch decodes into it.
func TestALargeMessageThatFailsToDecodeGoesBackToNoPool(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))  // one P: the pool hands back what was put last
	c := CodecFor(Limits{MaxPodsPerStream: 100_000}) // as above
	hostile := &pulsev1.SampleBatch{Seq: 1}
	for range 100_000 {
		hostile.Missing = append(hostile.Missing, &pulsev1.MissingSample{})
	}
	big, err := c.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: hostile}})
	if err != nil {
		t.Fatal(err)
	}
	// After the whole batch: field 3 again, its length past the end.
	raw := append(big.Materialize(), 0x1a, 0xff, 0x01)
	if len(raw) <= maxPooledMessage {
		t.Fatalf("message of %d bytes", len(raw))
	}
	small, err := c.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 2,
		Pods: []uint32{1}, OffsetsMs: []int32{0}, PresentXor: []uint64{2}, Values: []int64{3}}}})
	if err != nil {
		t.Fatal(err)
	}
	// Twenty times: the race detector's sync.Pool drops a quarter of what
	// is put back (the test was skipped under it, so never run by make
	// test), so a large message put back is seen but for a chance of 4^-20.
	for range 20 {
		var r received
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &r); err == nil {
			t.Fatal("the truncated message decoded")
		}
		r.release()
		if err := c.Unmarshal(small, &r); err != nil {
			t.Fatal(err)
		}
		if n := cap(r.msg.GetBatch().GetMissing()); n >= 100_000 {
			t.Fatalf("a message of %d bytes that failed to decode went back to the pool: the next batch decoded into it, its %d entries held", len(raw), n)
		}
		r.release()
	}
}

// emptyEntries is field num, of the bytes type and empty, given until the
// result is size bytes (2 bytes each): an entry a decoder makes a struct
// or a string of.
func emptyEntries(num protowire.Number, size int) []byte {
	var b []byte
	for len(b) < size {
		b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), nil)
	}
	return b
}

// unpacked is field num of the varint type, 0, given until the result is
// size bytes (2 bytes each): a repeated scalar written unpacked.
func unpacked(num protowire.Number, size int) []byte {
	var b []byte
	for len(b) < size {
		b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 0)
	}
	return b
}

// split64KiB is a batch of 1-byte values given as fields of 64 KiB each,
// until size bytes: the decoder merges them into one batch.
func split64KiB(size int) []byte {
	chunk := inField(fieldBatch, protowire.AppendBytes(protowire.AppendTag(nil, batchValues, protowire.BytesType), make([]byte, maxPooledMessage-8)))
	var b []byte
	for len(b)+len(chunk) <= size {
		b = append(b, chunk...)
	}
	return b
}

// runs is field num given as packed runs of one 1-byte value each, until
// size bytes.
func runs(num protowire.Number, size int) []byte {
	var b []byte
	for len(b)+3 <= size {
		b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), []byte{0})
	}
	return b
}

// TestPackedRunsOfOneValueDecodeInLinearCost: a packed field given as many
// runs of one value each is decoded at a cost linear in its bytes, as a
// stream's first message and as a later one. protobuf's own Unmarshal
// (which decoded a hello and a catalogue again, for its UTF-8 check) grows
// the field's slice to its exact length at each run: a catalogue of 54 KB
// whose removals each came in a run of its own allocated 695 MB, and a
// first message of 63 KB 1.9 GB.
func TestPackedRunsOfOneValueDecodeInLinearCost(t *testing.T) {
	for name, raw := range map[string][]byte{
		"a batch of 64 KiB":      inField(fieldBatch, runs(batchValues, maxPooledMessage-8)),
		"a catalogue's removals": inField(fieldCatalogue, runs(catalogueRemove, 3*(maxWorkloadsPerPod+1)*2048)),
	} {
		for _, into := range []any{new(received), new(pulsev1.AgentMessage)} {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			err := CodecFor(Limits{MaxPodsPerStream: 1024}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, into)
			runtime.ReadMemStats(&m1)
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 64*uint64(len(raw)) {
				t.Errorf("%s into %T: %v after %d MB allocated for %d KB; want its cost linear in its bytes", name, into, err, alloc>>20, len(raw)>>10)
			}
		}
	}
}

// TestAHellosStringsAreUTF8: a hello whose string is not UTF-8 is refused,
// as a stream's first message and as a later one; a catalogue whose
// entry's string is not UTF-8 is decoded, that entry to be refused alone
// (TestOneBadEntryIsRefusedAlone). Protobuf's marshaller writes no such
// message: the bytes are written by hand.
func TestAHellosStringsAreUTF8(t *testing.T) {
	str := func(num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	for name, tc := range map[string]struct {
		raw     []byte
		refused bool
	}{
		"a hello's node":          {inField(fieldHello, str(1, "node-\xff")), true},
		"a hello's extra metric":  {inField(fieldHello, slices.Concat(str(1, "node"), str(helloExtraMetrics, "m\xc3\x28"))), true},
		"a pod's name":            {inField(fieldCatalogue, inField(catalogueUpsert, str(4, "p\xff"))), false},
		"a pod's workload's name": {inField(fieldCatalogue, inField(catalogueUpsert, inField(podWorkloads, str(2, "w\xff")))), false},
	} {
		for _, into := range []any{new(received), new(pulsev1.AgentMessage)} {
			err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.raw)}, into)
			if refused := err != nil && strings.Contains(err.Error(), "UTF-8"); refused != tc.refused || !refused && err != nil {
				t.Errorf("%s not UTF-8, into %T: %v; want refused %v", name, into, err, tc.refused)
			}
		}
	}
}

// inField is m's bytes as field num of the bytes type.
func inField(num protowire.Number, m []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), m)
}

// TestAMessageOfEmptyEntriesIsRefusedBeforeItIsDecoded: a message whose
// entries are past what any agent within the limits sends is refused
// before it is decoded, whatever transport carries it. Decoded first, one
// 4 MiB catalogue of 2-byte empty pods allocated 848 MB and held 353 MB
// live (the chart limits the aggregator to 512 MiB); a pod of 2 million
// empty workloads, a batch of 2 million empty missing samples or
// histograms, each 150 to 220 MB live.
func TestAMessageOfEmptyEntriesIsRefusedBeforeItIsDecoded(t *testing.T) {
	const size = 4<<20 - 64
	limits := Limits{MaxPodsPerStream: 1024}
	twice := inField(fieldCatalogue, emptyEntries(catalogueUpsert, 2*2048)) // 2,048 empty pods: the bound
	packed := protowire.AppendBytes(protowire.AppendTag(nil, catalogueRemove, protowire.BytesType), make([]byte, size))
	for name, raw := range map[string][]byte{
		"a catalogue of empty pods":         inField(fieldCatalogue, emptyEntries(catalogueUpsert, size)),
		"one pod of empty workloads":        inField(fieldCatalogue, inField(catalogueUpsert, emptyEntries(podWorkloads, size))),
		"a packed run of removed ids":       inField(fieldCatalogue, packed),
		"a batch of empty missing samples":  inField(fieldBatch, emptyEntries(batchMissing, size)),
		"a batch of empty extra values":     inField(fieldBatch, emptyEntries(batchExtra, size)),
		"a batch of empty histograms":       inField(fieldBatch, emptyEntries(batchHist, size)),
		"a hello of empty extra metrics":    inField(fieldHello, emptyEntries(helloExtraMetrics, size)),
		"a packed column of 1-byte values":  inField(fieldBatch, protowire.AppendBytes(protowire.AppendTag(nil, batchValues, protowire.BytesType), make([]byte, size))),
		"an unpacked column of values":      inField(fieldBatch, unpacked(batchValues, size)),
		"a batch in 64 KiB fields, merged":  split64KiB(size),
		"a histogram of 1-byte counts":      inField(fieldBatch, inField(batchHist, protowire.AppendBytes(protowire.AppendTag(nil, histCounts, protowire.BytesType), make([]byte, size)))),
		"a catalogue given twice, merged":   slices.Concat(twice, twice),
		"empty pods, then a truncated tail": append(inField(fieldCatalogue, emptyEntries(catalogueUpsert, size)), 0x12, 0xff),
	} {
		// As a stream's later messages are read (into a pooled
		// received), and as its first, the hello (stream.Recv).
		for _, into := range []any{new(received), new(pulsev1.AgentMessage)} {
			c := CodecFor(limits)
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, into)
			runtime.ReadMemStats(&m1)
			if r, ok := into.(*received); err == nil || ok && r.msg != nil {
				t.Errorf("%s into %T: decoded (%v); want it refused", name, into, err)
				continue
			}
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 2*uint64(len(raw)) {
				t.Errorf("%s into %T: %v, after allocating %d KB for %d KB; want it refused before it is decoded", name, into, err, alloc>>10, len(raw)>>10)
			}
		}
	}
	// Within the limits: 2,048 pods of 8 workloads each, one of 9 (refused
	// alone later), and a batch of four sub-messages a pod.
	var pods []*pulsev1.Pod
	for i := range 2048 {
		p := pod(uint32(i), "p")
		p.Workloads = make([]*pulsev1.Workload, 8+i/2047)
		for j := range p.Workloads {
			p.Workloads[j] = &pulsev1.Workload{Name: "w"}
		}
		pods = append(pods, p)
	}
	// Each pod with every metric's value, 32 extra values and two
	// histograms of 64 buckets.
	b := &pulsev1.SampleBatch{}
	bounds, counts := make([]float64, metric.MaxBuckets), make([]int64, metric.MaxBuckets+1)
	for i := range 2048 {
		b.Pods, b.OffsetsMs, b.PresentXor = append(b.Pods, uint32(i)), append(b.OffsetsMs, 1), append(b.PresentXor, 1<<metric.NumIDs-2)
		for range metric.NumIDs - 1 {
			b.Values = append(b.Values, 1)
		}
		b.Missing = append(b.Missing, &pulsev1.MissingSample{Pod: uint32(i)})
		b.Extra = append(b.Extra, &pulsev1.ExtraValues{Pod: uint32(i), Values: make([]float64, wire.MaxExtraMetrics)})
		b.Histograms = append(b.Histograms, &pulsev1.HistogramSample{Pod: uint32(i), Bounds: bounds, Counts: counts},
			&pulsev1.HistogramSample{Pod: uint32(i), Bounds: bounds, Counts: counts})
	}
	for _, m := range []*pulsev1.AgentMessage{catalogue(pods...), {Msg: &pulsev1.AgentMessage_Batch{Batch: b}}} {
		raw, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var r received
		if err := CodecFor(limits).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &r); err != nil || !proto.Equal(r.msg, m) {
			t.Errorf("a message within the limits: %v", err)
		}
	}
}

// BenchmarkPrescanANodesBatch: what the walk before the decode costs a
// node's batch (8 pods, 20 values each, two histograms of 20 buckets), and
// the pooled decode it stands before (sub-benchmark decode).
func BenchmarkPrescanANodesBatch(b *testing.B) {
	batch := &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: 1_700_000_000_000}
	bounds, counts := make([]float64, 20), make([]int64, 20)
	for i := range bounds {
		bounds[i], counts[i] = float64(i)/10, int64(i*7)
	}
	for p := range uint32(8) {
		batch.Pods = append(batch.Pods, p)
		batch.OffsetsMs = append(batch.OffsetsMs, int32(p))
		batch.PresentXor = append(batch.PresentXor, 0xfffff)
		for v := range 20 {
			batch.Values = append(batch.Values, int64(v*1000+int(p)))
		}
		for _, h := range []pulsev1.Histogram{pulsev1.Histogram_HISTOGRAM_TTFT, pulsev1.Histogram_HISTOGRAM_ITL} {
			batch.Histograms = append(batch.Histograms, &pulsev1.HistogramSample{Pod: p, Histogram: h, Bounds: bounds, Counts: counts})
		}
	}
	raw, err := proto.Marshal(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: batch}})
	if err != nil {
		b.Fatal(err)
	}
	l := Limits{}.withDefaults()
	b.Run("prescan", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if err := l.prescan(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		c := CodecFor(l)
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var r received
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &r); err != nil {
				b.Fatal(err)
			}
			r.release()
		}
	})
}

// rawCodec sends a message's bytes as they are: a client that writes what
// no agent would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

// TestAStreamsFirstMessageIsCountedBeforeItIsDecoded: a stream's first
// message, read as its hello (stream.Recv, not into a pooled message),
// goes through the same count before its decode, over real gRPC. It went
// to gRPC's own decoder unchecked, and a first message of 4 MiB of empty
// pods allocated 414 MB before it was refused as no hello.
func TestAStreamsFirstMessageIsCountedBeforeItIsDecoded(t *testing.T) {
	limits := Limits{MaxPodsPerStream: 1024}
	srv := New(store.New(store.Options{}), Options{Log: slog.New(slog.DiscardHandler), Limits: limits, Registerer: prometheus.NewRegistry()})
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(grpc.ForceServerCodecV2(CodecFor(limits)))
	pulsev1.RegisterIngestServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); g.Stop() })
	raw := inField(fieldCatalogue, emptyEntries(catalogueUpsert, 4<<20-64))
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	stream, err := conn.NewStream(context.Background(), &pulsev1.Ingest_ServiceDesc.Streams[0], pulsev1.Ingest_Report_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.SendMsg(&raw)
	_ = stream.CloseSend()
	var out []byte
	err = stream.RecvMsg(&out)
	runtime.ReadMemStats(&m1)
	if err == nil || !strings.Contains(err.Error(), "catalogue has 2097120 entries") {
		t.Errorf("a first message of 4 MiB of empty pods: %v; want it refused by its count", err)
	}
	if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 4*uint64(len(raw)) {
		t.Errorf("a first message of %d KB of empty pods: %d MB allocated; want it refused before it is decoded", len(raw)>>10, alloc>>20)
	}
}
