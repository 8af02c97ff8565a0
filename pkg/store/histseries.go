package store

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/pulse-io/pulse/pkg/metric"
)

// histColumn is one histogram's entries, one per sample, each written
// against the entry before it: absent; the same as the previous one; or
// its bucket counts as changes from the previous entry's (counts are
// whole numbers: a bucket that gained 3 requests costs one byte), with
// the index of its bounds in the column's list. A count that is not a
// whole number below 2^53 is kept as its 8 raw bytes.
type histColumn struct {
	bounds [][]float64 // the distinct bounds of the entries held
	buf    []byte
	// prev is the last entry (nil when absent): what the next is written
	// against.
	prev *metric.Buckets
}

// Histogram entry tags, in the low two bits of an entry's first varint
// (the rest is the bounds' index).
const (
	histCounts = 0 // then a varint per bucket: the change of its count
	histAbsent = 1
	histSame   = 2
	histRaw    = 3 // then the counts' 8 raw bytes each
)

// boundsIndex is the index of bounds in the column's list, added when new.
func (c *histColumn) boundsIndex(bounds []float64) int {
	for i, b := range c.bounds {
		if slices.Equal(b, bounds) {
			return i
		}
	}
	c.bounds = append(c.bounds, bounds)
	return len(c.bounds) - 1
}

// wholeCounts reports whether every count is a whole number below 2^53.
func wholeCounts(counts []float64) bool {
	for _, x := range counts {
		if !(math.Abs(x) < maxExact) || x != math.Trunc(x) || x == 0 && math.Signbit(x) {
			return false
		}
	}
	return true
}

// add appends b (nil or not present: absent).
func (c *histColumn) add(b *metric.Buckets) {
	if b == nil || !b.Present() {
		c.buf = appendGrown(c.buf, []byte{histAbsent})
		c.prev = nil
		return
	}
	if p := c.prev; p != nil && slices.Equal(p.Bounds, b.Bounds) && slices.Equal(p.Counts, b.Counts) {
		c.buf = appendGrown(c.buf, []byte{histSame})
		return
	}
	var tmp [binary.MaxVarintLen64 * 64]byte
	c.buf = appendGrown(c.buf, encodeBuckets(tmp[:0], c.boundsIndex(b.Bounds), b, c.prev))
	c.prev = b
}

// encodeBuckets appends b's entry written against prev (nil: in full).
func encodeBuckets(dst []byte, bi int, b, prev *metric.Buckets) []byte {
	if !wholeCounts(b.Counts) {
		dst = binary.AppendUvarint(dst, uint64(bi)<<2|histRaw)
		for _, x := range b.Counts {
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x))
		}
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(bi)<<2|histCounts)
	against := prev != nil && slices.Equal(prev.Bounds, b.Bounds) && wholeCounts(prev.Counts)
	for i, x := range b.Counts {
		d := int64(x)
		if against {
			d -= int64(prev.Counts[i])
		}
		dst = binary.AppendVarint(dst, d)
	}
	return dst
}

// appendGrown appends b to buf, grown as growBytes does.
func appendGrown(buf, b []byte) []byte { return append(growBytes(buf, len(b)), b...) }

// entry decodes the entry at c.buf[off:] written against prev into dst
// (its Counts from arena, which it returns grown); dst is left not present
// when the entry is absent. It returns the offset past the entry. The
// series wrote the bytes itself.
func (c *histColumn) entry(off int, prev, dst *metric.Buckets, arena []float64) (int, []float64) {
	u, off := uvarintAt(c.buf, off)
	switch u & 3 {
	case histAbsent:
		*dst = metric.Buckets{}
		return off, arena
	case histSame:
		*dst = *prev
		return off, arena
	}
	bounds := c.bounds[u>>2]
	start := len(arena)
	arena = slices.Grow(arena, len(bounds))
	against := prev.Present() && slices.Equal(prev.Bounds, bounds) && u&3 == histCounts && wholeCounts(prev.Counts)
	for i := range bounds {
		var x float64
		if u&3 == histRaw {
			x = math.Float64frombits(binary.LittleEndian.Uint64(c.buf[off:]))
			off += 8
		} else {
			var d int64
			d, off = varintAt(c.buf, off)
			if against {
				d += int64(prev.Counts[i])
			}
			x = float64(d)
		}
		arena = append(arena, x)
	}
	*dst = metric.Buckets{Bounds: bounds, Counts: arena[start:len(arena):len(arena)]}
	return off, arena
}

// dropFront removes the k oldest entries; the new first is written again
// in full.
func (c *histColumn) dropFront(k int) {
	var prev, cur metric.Buckets
	var arena []float64
	off := 0
	for i := 0; i <= k; i++ {
		prev = cur
		off, arena = c.entry(off, &prev, &cur, arena)
	}
	var first []byte
	if cur.Present() {
		first = encodeBuckets(nil, c.boundsIndex(cur.Bounds), &cur, nil)
	} else {
		first = []byte{histAbsent}
	}
	c.buf = replaceHead(c.buf, off, first)
	c.pruneBounds()
}

// pruneBounds drops bounds no entry uses any more (bounds change when a
// server restarts with other buckets: rarely).
func (c *histColumn) pruneBounds() {
	if len(c.bounds) < 2 {
		return
	}
	used := make([]bool, len(c.bounds))
	for off := 0; off < len(c.buf); {
		u, k := binary.Uvarint(c.buf[off:])
		off += k
		switch u & 3 {
		case histCounts:
			used[u>>2] = true
			for range c.bounds[u>>2] {
				_, k := binary.Varint(c.buf[off:])
				off += k
			}
		case histRaw:
			used[u>>2] = true
			off += 8 * len(c.bounds[u>>2])
		}
	}
	if !slices.Contains(used, false) {
		return
	}
	// Renumber: rewrite each entry's index.
	remap := make([]int, len(c.bounds))
	var kept [][]float64
	for i, b := range c.bounds {
		remap[i] = len(kept)
		if used[i] {
			kept = append(kept, b)
		}
	}
	var out []byte
	for off := 0; off < len(c.buf); {
		u, k := binary.Uvarint(c.buf[off:])
		start := off + k
		end := start
		switch u & 3 {
		case histCounts:
			for range c.bounds[u>>2] {
				_, k := binary.Varint(c.buf[end:])
				end += k
			}
			u = uint64(remap[u>>2])<<2 | u&3
		case histRaw:
			end += 8 * len(c.bounds[u>>2])
			u = uint64(remap[u>>2])<<2 | u&3
		}
		out = binary.AppendUvarint(out, u)
		out = append(out, c.buf[start:end]...)
		off = end
	}
	c.bounds, c.buf = kept, out
}

// hists is a series' histogram columns, allocated at the pod's first
// histogram (nil before: most pods never send any).
type hists struct {
	cols [metric.NumHists]histColumn
	// last: the newest sample's histograms (nil: it had none).
	last *metric.Histograms
}

// add appends s's histograms (nil: none); n is the samples held before.
func (h *hists) add(s *metric.Histograms, n int) {
	for k := range h.cols {
		c := &h.cols[k]
		if len(c.buf) == 0 {
			// A column that starts now is absent for the samples before.
			for range n {
				c.buf = appendGrown(c.buf, []byte{histAbsent})
			}
		}
		var b *metric.Buckets
		if s != nil {
			b = &s[k]
		}
		c.add(b)
	}
}

// decode points each sample's Hist at its histograms, decoded into
// scratch storage (the returned slices, grown).
func (h *hists) decode(dst []metric.Sample, store []metric.Histograms, arena []float64) ([]metric.Histograms, []float64) {
	store = slices.Grow(store[:0], len(dst))[:len(dst)]
	arena = arena[:0]
	for k := range h.cols {
		c := &h.cols[k]
		var prev metric.Buckets
		for i, off := 0, 0; i < len(dst); i++ {
			off, arena = c.entry(off, &prev, &store[i][k], arena)
			prev = store[i][k]
		}
	}
	for i := range dst {
		dst[i].Hist = &store[i]
		if !store[i].Any() {
			dst[i].Hist = nil
		}
	}
	return store, arena
}

// size is what the columns' encodings use (their lengths), and the
// distinct bounds they hold: a page whose bounds
// change at every sample has a slice of them held for each sample kept,
// and with counts of 0 (cheap to encode) those slices were all its cost,
// uncounted: 137 KB a pod against its bound of 48 KiB.
func (h *hists) size() int {
	n := 0
	for k := range h.cols {
		n += len(h.cols[k].buf)
		for _, b := range h.cols[k].bounds {
			n += 8*len(b) + int(unsafe.Sizeof(b))
		}
	}
	return n
}

// bytes is the memory the columns' encodings hold (bounds are shared
// with the wire's decoder and not counted).
func (h *hists) bytes() int {
	n := 0
	for k := range h.cols {
		n += cap(h.cols[k].buf)
	}
	return n
}
