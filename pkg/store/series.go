package store

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"sync"
	"unsafe"

	"github.com/pulse-io/pulse/pkg/metric"
)

// series is one pod's samples, oldest first, in a compact encoding, one
// column per metric the pod reports (and one of times), so that a reader
// decodes only the metrics it derives. In each column every sample has one
// entry, written against the entry before it: a time as the interval since
// the previous one, a value at its wire resolution (an integer n standing
// for n/10^scale) as the change from the previous sample's value, an
// absent value as one byte. A sample of a dozen values takes about 30
// bytes, where the decoded struct takes 208. The first entry of a column
// is written in full, so dropping the oldest samples rewrites only the new
// first entry of each column.
//
// A value that is not exactly n/10^scale for an integer n (a counter made
// monotonic across a reset adds two of them, which may fall off the grid
// by a rounding error; NaN; a value too large for 53 bits) is kept as its
// 8 raw bytes, so that every value reads back exactly as it was added.
//
// Histograms are encoded likewise, one column per histogram (histseries.go),
// once the pod has sent any.
type series struct {
	times column
	cols  []column // by id, ascending; a column goes when all its entries are absent
	n     int
	// lastMs and lastHist are the newest sample's time and histograms.
	lastMs   int64
	lastHist *metric.Histograms
	// hist: the histogram columns, from the pod's first histogram (nil
	// until then).
	hist *hists
}

// column is one metric's entries (or the times').
type column struct {
	id  metric.ID
	buf []byte
	// prev: the last entry's value as the next one is written against it
	// (0 when it was absent).
	prev int64
}

// Entry tags, in the low two bits of an entry's first varint.
const (
	tagInt    = 0 // zigzag(n - prev) << 2
	tagAbsent = 1 // the whole entry: one byte
	tagRaw    = 2 // then the value's 8 raw bytes
)

// maxExact bounds the integers a float64 holds exactly.
const maxExact = 1 << 53

// grid is x at id's wire resolution: n with x == n/10^scale; ok is false
// when there is no such integer.
func grid(id metric.ID, x float64) (n int64, ok bool) {
	p := metric.Pow10(id.Scale())
	y := math.RoundToEven(x * p)
	if !(math.Abs(y) < maxExact) || y/p != x {
		return baseOf(id, x), false
	}
	return int64(y), true
}

// baseOf is what the entry after a raw value x is written against: x
// rounded to the grid, or 0 when that does not fit 53 bits.
func baseOf(id metric.ID, x float64) int64 {
	y := math.RoundToEven(x * metric.Pow10(id.Scale()))
	if !(math.Abs(y) < maxExact) {
		return 0
	}
	return int64(y)
}

func zigzag(d int64) uint64   { return uint64(d<<1) ^ uint64(d>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// appendInt appends an entry of integer n.
func (c *column) appendInt(n int64) {
	c.grow(binary.MaxVarintLen64)
	c.buf = binary.AppendUvarint(c.buf, zigzag(n-c.prev)<<2|tagInt)
	c.prev = n
}

// appendValue appends an entry of metric c.id's value x.
func (c *column) appendValue(x float64) {
	n, ok := grid(c.id, x)
	if ok {
		c.appendInt(n)
		return
	}
	c.grow(9)
	c.buf = append(c.buf, tagRaw)
	c.buf = binary.LittleEndian.AppendUint64(c.buf, math.Float64bits(x))
	c.prev = n
}

func (c *column) appendAbsent() {
	c.grow(1)
	c.buf = append(c.buf, tagAbsent)
	c.prev = 0
}

// grow makes room for k more bytes.
func (c *column) grow(k int) { c.buf = growBytes(c.buf, k) }

// growBytes returns buf with room for k more bytes, grown by a quarter
// rather than doubled: a series holds its window for the pod's life, and
// most of a doubling would stay unused.
func growBytes(buf []byte, k int) []byte {
	if need := len(buf) + k; need > cap(buf) {
		nb := make([]byte, len(buf), need+need/4+8)
		copy(nb, buf)
		return nb
	}
	return buf
}

// entry decodes the entry at c.buf[off:] written against prev: the
// integer it stands for (what the next entry is written against), the
// raw value when raw, whether it is present, and the offset past it. The
// series wrote the bytes itself, so a malformed encoding is a bug: it
// panics.
func (c *column) entry(off int, prev int64) (n int64, raw float64, isRaw, present bool, next int) {
	u, off := uvarintAt(c.buf, off)
	switch u & 3 {
	case tagInt:
		return prev + unzigzag(u>>2), 0, false, true, off
	case tagAbsent:
		return 0, 0, false, false, off
	default:
		x := math.Float64frombits(binary.LittleEndian.Uint64(c.buf[off:]))
		return baseOf(c.id, x), x, true, true, off + 8
	}
}

// uvarintAt and varintAt decode the varint at buf[off:] and return the
// offset past it. The store wrote the bytes itself, so a malformed
// encoding is a bug: they panic.
func uvarintAt(buf []byte, off int) (uint64, int) {
	u, k := binary.Uvarint(buf[off:])
	if k <= 0 {
		panic("store: corrupt series encoding")
	}
	return u, off + k
}

func varintAt(buf []byte, off int) (int64, int) {
	d, k := binary.Varint(buf[off:])
	if k <= 0 {
		panic("store: corrupt series encoding")
	}
	return d, off + k
}

// dropFront removes the k oldest entries; the new first is written again
// against nothing. It reports whether any entry left is present.
func (c *column) dropFront(k int) (kept bool) {
	var n, prev int64
	var raw float64
	var isRaw, present bool
	off := 0
	for i := 0; i <= k; i++ {
		n, raw, isRaw, present, off = c.entry(off, prev)
		prev = n
	}
	var head [binary.MaxVarintLen64 + 8]byte
	first := head[:0]
	switch {
	case !present:
		first = append(first, tagAbsent)
	case isRaw:
		first = binary.LittleEndian.AppendUint64(append(first, tagRaw), math.Float64bits(raw))
	default:
		first = binary.AppendUvarint(first, zigzag(n)<<2|tagInt)
	}
	c.buf = replaceHead(c.buf, off, first)
	if present {
		return true
	}
	for off = len(first); off < len(c.buf); {
		if c.buf[off] != tagAbsent {
			return true
		}
		off++
	}
	return false
}

// validIDs is the mask of every metric id.
const validIDs = (uint64(1)<<metric.NumIDs - 1) &^ 1

// len is the number of samples held.
func (r *series) len() int { return r.n }

// add appends s, newer than every sample held.
func (r *series) add(s metric.Sample) {
	r.times.appendInt(s.TimeMs)
	present := s.Present & validIDs
	for i := range r.cols {
		c := &r.cols[i]
		if present&(1<<c.id) != 0 {
			c.appendValue(s.V[c.id])
			present &^= 1 << c.id
		} else {
			c.appendAbsent()
		}
	}
	// Metrics the pod did not report before get a column, absent until
	// now; the columns are reallocated once, exactly (they are added
	// rarely: at the first sample, or when a page gains a metric).
	if present != 0 {
		cols := make([]column, 0, len(r.cols)+bits.OnesCount64(present))
		cols = append(cols, r.cols...)
		for ; present != 0; present &= present - 1 {
			c := column{id: metric.ID(bits.TrailingZeros64(present))}
			for range r.n {
				c.appendAbsent()
			}
			c.appendValue(s.V[c.id])
			cols = append(cols, c)
		}
		slices.SortFunc(cols, func(a, b column) int { return int(a.id) - int(b.id) })
		r.cols = cols
	}
	if s.Hist != nil && r.hist == nil {
		r.hist = new(hists)
	}
	if r.hist != nil {
		r.hist.add(s.Hist, r.n)
	}
	r.n++
	r.lastMs, r.lastHist = s.TimeMs, s.Hist
}

// decodeTimes writes the samples' times into dst[:len] (grown as
// needed), oldest first, with no value or histogram present.
func (r *series) decodeTimes(dst []metric.Sample) []metric.Sample {
	if cap(dst) < r.n {
		dst = make([]metric.Sample, r.n, r.n+r.n/4)
	}
	dst = dst[:r.n]
	var t int64
	for i, off := 0, 0; i < r.n; i++ {
		t, _, _, _, off = r.times.entry(off, t)
		dst[i].TimeMs, dst[i].Present, dst[i].Hist = t, 0, nil
	}
	return dst
}

// decode writes the values of the metrics in want into the samples dst
// that decodeTimes wrote; other values are left as they were.
func (r *series) decode(dst []metric.Sample, want uint64) {
	for ci := range r.cols {
		c := &r.cols[ci]
		if want&(1<<c.id) == 0 {
			continue
		}
		bit := uint64(1) << c.id
		p := metric.Pow10(c.id.Scale())
		var n int64
		for i, off := 0, 0; i < r.n; i++ {
			var raw float64
			var isRaw, present bool
			n, raw, isRaw, present, off = c.entry(off, n)
			switch {
			case !present:
				dst[i].Present &^= bit
			case isRaw:
				dst[i].V[c.id], dst[i].Present = raw, dst[i].Present|bit
			default:
				dst[i].V[c.id], dst[i].Present = float64(n)/p, dst[i].Present|bit
			}
		}
	}
}

// drop removes the k oldest samples (0 < k < len).
func (r *series) drop(k int) {
	r.times.dropFront(k)
	cols := r.cols[:0]
	for _, c := range r.cols {
		if c.dropFront(k) {
			cols = append(cols, c)
		}
	}
	clear(r.cols[len(cols):])
	r.cols = cols
	r.n -= k
	if r.hist != nil {
		for h := range r.hist {
			r.hist[h].dropFront(k)
		}
	}
}

// scratch holds a reader's decoded samples, reused from pod to pod: a
// read under the store's lock decodes each metric of a pod at most once,
// however many values it derives from it.
type scratch struct {
	buf  []metric.Sample
	of   *pod   // the pod buf holds; nil when none
	have uint64 // the metrics of it decoded (histBit: its histograms)
	// The decoded histograms, and their counts.
	hists []metric.Histograms
	arena []float64
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// getScratch returns a scratch for one read; putScratch gives it back.
func getScratch() *scratch { return scratches.Get().(*scratch) }

func putScratch(sc *scratch) {
	sc.of = nil
	if cap(sc.buf) > 1024 {
		sc.buf, sc.hists, sc.arena = nil, nil, nil // a pod with a long series: not kept for everyone
	}
	scratches.Put(sc)
}

// samples is p's samples, oldest first, with the values of the metrics in
// want decoded (and their times and histograms); valid until sc decodes
// another pod. The store's lock must be held: the pod does not change
// while sc holds it.
func (sc *scratch) samples(p *pod, want uint64) []metric.Sample {
	want &= validIDs | histBit
	if sc.of != p {
		sc.buf = p.series.decodeTimes(sc.buf)
		sc.of, sc.have = p, 0
	}
	missing := want &^ sc.have
	if missing&histBit != 0 && p.series.hist != nil {
		sc.hists, sc.arena = p.series.hist.decode(sc.buf, sc.hists, sc.arena)
	}
	if missing &^= histBit; missing != 0 {
		p.series.decode(sc.buf, missing)
	}
	sc.have |= want
	return sc.buf
}

// histBit asks samples for the histograms (bit 0: no metric's id).
const histBit = 1

// allIDs asks samples for every metric and the histograms.
const allIDs = validIDs | histBit

// ids is what samples decodes for m: the values it derives from, and the
// histograms of a quantile.
func ids(m metric.Def) uint64 {
	if m.Rule == metric.RuleQuantile {
		return m.IDs() | histBit
	}
	return m.IDs()
}

// bytes is the memory the series' encoding holds (its buffers' capacity
// and the columns' headers).
func (r *series) bytes() int {
	n := cap(r.times.buf) + cap(r.cols)*int(unsafe.Sizeof(column{}))
	if r.hist != nil {
		n += r.hist.bytes()
	}
	for _, c := range r.cols {
		n += cap(c.buf)
	}
	return n
}

// replaceHead returns buf with buf[:off] replaced by head, in place unless
// it does not fit or would leave most of the buffer unused (a column drops
// a few entries and gains as many: shrinking it at each drop and growing
// it at the next appends would allocate twice for nothing).
func replaceHead(buf []byte, off int, head []byte) []byte {
	tail := buf[off:]
	size := len(head) + len(tail)
	if size <= cap(buf) && cap(buf) <= 2*size+64 {
		copy(buf[len(head):size], tail) // copy handles the overlap
		copy(buf, head)
		return buf[:size]
	}
	nb := make([]byte, size, size+size/4+8)
	copy(nb, head)
	copy(nb[len(head):], tail)
	return nb
}
