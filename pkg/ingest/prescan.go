package ingest

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/wire"
)

// The fields prescan counts: AgentMessage's hello, catalogue and batch
// (proto/pulse/v1/ingest.proto), and within them the repeated entries a
// decoder makes a struct or a string of.
const (
	fieldHello, fieldCatalogue, fieldBatch = 1, 2, 3
	helloExtraMetrics                      = 5
	catalogueUpsert, catalogueRemove       = 2, 3
	podWorkloads                           = 5
	batchPods, batchValues                 = 3, 6 // pods, offsets, present bitmaps, values
	batchMissing, batchExtra, batchHist    = 7, 8, 9
	extraValues                            = 2
	histBounds, histCounts                 = 3, 4
)

// Per pod of a batch: its id, offset and present bitmap, and at most
// metric.NumIDs values (columns); its extra values and two histograms'
// bounds and counts (values).
const (
	columnsAPod = 3 + metric.NumIDs
	valuesAPod  = wire.MaxExtraMetrics + 2*2*(metric.MaxBuckets+1)
)

// prescan counts an agent's message's entries in its bytes, before it is
// decoded, and refuses a message past what any stream within limits sends:
// a catalogue's entries past twice the pods an agent may list (checkSize
// ends the stream past them anyway), their workloads past
// maxWorkloadsPerPod each on average, the pods it removes past twice the
// pods; a batch's sub-messages past four a pod of twice the pods (an
// agent's batch has at most one sample a pod, each with a missing sample
// or extra values, and two histograms), its columns past columnsAPod a
// pod, its extra values and histograms' bounds and counts past
// valuesAPod a pod (a 4 MiB column of 1-byte values decoded to 32 MB,
// unpacked allocating 97 MB); a hello's extra metrics past
// the limit (hello refuses them anyway). Decoded first, one 4 MiB
// message of 2-byte empty entries was 170 bytes an entry: a catalogue of
// empty pods allocated 848 MB and held 353 MB live in an aggregator the
// chart limits to 512 MiB, and a node may hold four streams. A pod's own
// bounds (its workloads past maxWorkloadsPerPod, its strings) are still
// checked after the decode, and refuse that entry alone. The walk
// allocates nothing; a message it cannot walk is left to the decoder's
// own error, what it counted before judged as above.
func (l Limits) prescan(b []byte) error {
	var counts [fieldBatch + 1]struct{ entries, nested, columns int }
	// A batch given in several fields is merged: the whole message's size
	// decides whether its columns are counted (judged field by field, 63
	// batches of 64 KiB in one message were none of them counted).
	large := len(b) > maxPooledMessage
walk:
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if typ != protowire.BytesType || num < fieldHello || num > fieldBatch {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				break
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			break walk
		}
		b = b[n:]
		// A message field given twice is merged: its entries add up.
		c := &counts[num]
		switch num {
		case fieldHello:
			c.entries += countFields(v, helloExtraMetrics, helloExtraMetrics, nil)
		case fieldCatalogue:
			c.entries += countFields(v, catalogueUpsert, catalogueUpsert, func(_ protowire.Number, pod []byte) int {
				c.nested += countFields(pod, podWorkloads, podWorkloads, nil)
				return 1
			})
			c.nested += countFields(v, catalogueRemove, catalogueRemove, varints)
		case fieldBatch:
			if !large {
				// Its scalars decode to at most 8 times its bytes (in
				// all: UnmarshalVT grows a packed field's slice as
				// append does): a node's batch (a few KB) is not
				// walked for them.
				c.entries += countFields(v, batchMissing, batchHist, nil)
				continue
			}
			c.columns += countFields(v, batchPods, batchValues, varints)
			c.entries += countFields(v, batchMissing, batchHist, func(num protowire.Number, sub []byte) int {
				switch num {
				case batchExtra:
					c.nested += countFields(sub, extraValues, extraValues, fixed64s)
				case batchHist:
					c.nested += countFields(sub, histBounds, histCounts, func(num protowire.Number, run []byte) int {
						if num == histBounds {
							return fixed64s(num, run)
						}
						return varints(num, run)
					})
				}
				return 1
			})
		}
	}
	pods := 2 * l.MaxPodsPerStream
	switch {
	case counts[fieldHello].entries > l.MaxExtraMetrics:
		return fmt.Errorf("hello names %d extra metrics; at most %d", counts[fieldHello].entries, l.MaxExtraMetrics)
	case counts[fieldCatalogue].entries > pods:
		return fmt.Errorf("catalogue has %d entries; at most %d per agent, and as many again refused", counts[fieldCatalogue].entries, l.MaxPodsPerStream)
	case counts[fieldCatalogue].nested > (maxWorkloadsPerPod+1)*pods:
		return fmt.Errorf("catalogue names %d workloads and removals; at most %d", counts[fieldCatalogue].nested, (maxWorkloadsPerPod+1)*pods)
	case counts[fieldBatch].entries > 4*pods:
		return fmt.Errorf("batch has %d missing samples, extra values and histograms; at most %d (four a pod)", counts[fieldBatch].entries, 4*pods)
	case counts[fieldBatch].columns > columnsAPod*pods:
		return fmt.Errorf("batch has %d pods, offsets, bitmaps and values; at most %d", counts[fieldBatch].columns, columnsAPod*pods)
	case counts[fieldBatch].nested > valuesAPod*pods:
		return fmt.Errorf("batch has %d extra values and histogram bounds and counts; at most %d", counts[fieldBatch].nested, valuesAPod*pods)
	}
	return nil
}

// countFields counts the fields numbered lo to hi in the message m: one
// each, or for one of the bytes type what each (when not nil) counts of
// its bytes. A field it cannot walk ends the count: the decoder refuses
// the message.
func countFields(m []byte, lo, hi protowire.Number, each func(protowire.Number, []byte) int) int {
	count := 0
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return count
		}
		m = m[n:]
		in := lo <= num && num <= hi
		if in && typ == protowire.BytesType && each != nil {
			v, n := protowire.ConsumeBytes(m)
			if n < 0 {
				return count
			}
			count += each(num, v)
			m = m[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, m); n < 0 {
			return count
		}
		if in {
			count++
		}
		m = m[n:]
	}
	return count
}

// varints counts the varints of a packed run: a byte below 0x80 ends one.
func varints(_ protowire.Number, v []byte) int {
	count := 0
	for _, x := range v {
		if x < 0x80 {
			count++
		}
	}
	return count
}

// fixed64s counts the 8-byte values of a packed run (doubles).
func fixed64s(_ protowire.Number, v []byte) int { return len(v) / 8 }
