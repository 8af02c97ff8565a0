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
// The columns lie one after another in one buffer, each with a 12-byte
// header: a pod's few seconds of samples are a few hundred bytes, and a
// buffer and a 40-byte header for each of its 18 columns took more than the
// samples themselves. Which metric a column holds is in one bitmap of the
// series (ids), not in its header: an id there took the header from 12
// bytes to 16. An append writes every column's entry in one pass
// from the last column to the first, moving each column up by the entries
// written before it.
//
// A value that is not exactly n/10^scale for an integer n (a counter made
// monotonic across a reset adds two of them, which may fall off the grid
// by a rounding error; NaN; a value too large for 53 bits) is kept as its
// 8 raw bytes, so that every value reads back exactly as it was added.
//
// Histograms are encoded likewise, one column per histogram (histseries.go),
// once the pod has sent any.
type series struct {
	// buf holds the columns' entries, column after column: cols[0] is the
	// times', the others are by id, ascending; a metric's column goes when
	// all its entries are absent.
	buf []byte
	// cols is the first of the columns' headers (columns: one for the
	// times and one for each bit of ids; nil with no sample). A pointer,
	// not a slice: their number is ids', and the 16 bytes of a slice's
	// length and capacity took a pod past its size class (320 bytes to
	// 288).
	cols *column
	// n is the number of samples held (at most MaxSamples and the
	// retention's: 2^31 of them would take 40 GB); ids has a bit for each
	// metric with a column: cols[1:] are theirs, by id ascending.
	n   int32
	ids uint32
	// hist: the histogram columns and the newest sample's histograms,
	// from the pod's first histogram (nil until then).
	hist *hists
}

// lastMs is the newest sample's time (0 when none is held): the last entry
// of the times' column, which the next is written against.
func (r *series) lastMs() int64 {
	if r.cols == nil {
		return 0
	}
	return r.cols.last()
}

// columns is the columns' headers: the times' and then one for each
// metric in ids, by id ascending (none with no sample).
func (r *series) columns() []column {
	if r.cols == nil {
		return nil
	}
	return unsafe.Slice(r.cols, 1+bits.OnesCount32(r.ids)) //nolint:gosec // G103: addColumns allocated exactly this many, drop as many as it keeps
}

// lastHist is the newest sample's histograms (nil when it had none).
func (r *series) lastHist() *metric.Histograms {
	if r.hist == nil {
		return nil
	}
	return r.hist.last
}

// column is one column's header: its entries are buf[start:end], where
// start is the end of the column before it (0 for the first).
type column struct {
	// prev: the last entry's value as the next one is written against it
	// (0 when it was absent), an int64 in two halves (last, setLast), so
	// that the header is aligned to 4 bytes and takes 12, not 16.
	prev [2]uint32
	end  uint32
}

func (c *column) last() int64 { return int64(uint64(c.prev[1])<<32 | uint64(c.prev[0])) }

func (c *column) setLast(n int64) { c.prev[0], c.prev[1] = uint32(n), uint32(uint64(n)>>32) }

// The ids bitmap holds every metric's bit: this fails to compile once they
// pass 32.
var _ = [1]struct{}{}[validIDs>>32]

// entries is column i's encoded entries (none in a series with no sample).
func (r *series) entries(i int) []byte {
	cols := r.columns()
	if i >= len(cols) {
		return nil
	}
	start := uint32(0)
	if i > 0 {
		start = cols[i-1].end
	}
	return r.buf[start:cols[i].end]
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
	// −0 is kept raw too: as the integer 0 it read back as +0.
	if !(math.Abs(y) < maxExact) || y/p != x || x == 0 && math.Signbit(x) {
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

// appendInt appends to dst an entry of integer n written against c's last.
func (c *column) appendInt(dst []byte, n int64) []byte {
	dst = binary.AppendUvarint(dst, zigzag(n-c.last())<<2|tagInt)
	c.setLast(n)
	return dst
}

// appendValue appends to dst an entry of metric id's value x (c is id's
// column).
func (c *column) appendValue(dst []byte, id metric.ID, x float64) []byte {
	n, ok := grid(id, x)
	if ok {
		return c.appendInt(dst, n)
	}
	dst = append(dst, tagRaw)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x))
	c.setLast(n)
	return dst
}

func (c *column) appendAbsent(dst []byte) []byte {
	c.setLast(0)
	return append(dst, tagAbsent)
}

// growBytes returns buf with room for k more bytes, grown by an eighth
// rather than doubled: a series holds its window for the pod's life (an
// append and the trim after it leave its size about the same), and most
// of a doubling would stay unused.
func growBytes(buf []byte, k int) []byte {
	if need := len(buf) + k; need > cap(buf) {
		nb := make([]byte, len(buf), room(need))
		copy(nb, buf)
		return nb
	}
	return buf
}

// entry decodes the entry of metric id (0: a time) at buf[off:] written
// against prev: the integer it stands for (what the next entry is written
// against), the raw value when raw, whether it is present, and the offset
// past it. The series wrote the bytes itself, so a malformed encoding is a
// bug: it panics.
func entry(buf []byte, id metric.ID, off int, prev int64) (n int64, raw float64, isRaw, present bool, next int) {
	u, off := uvarintAt(buf, off)
	switch u & 3 {
	case tagInt:
		return prev + unzigzag(u>>2), 0, false, true, off
	case tagAbsent:
		return 0, 0, false, false, off
	default:
		x := math.Float64frombits(binary.LittleEndian.Uint64(buf[off:]))
		return baseOf(id, x), x, true, true, off + 8
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

// appendDropped appends to dst column c's entries b without their k oldest;
// the new first is written again against nothing. It reports whether any
// entry left is present.
func appendDropped(dst, b []byte, id metric.ID, k int) (_ []byte, kept bool) {
	var n, prev int64
	var raw float64
	var isRaw, present bool
	off := 0
	for i := 0; i <= k; i++ {
		n, raw, isRaw, present, off = entry(b, id, off, prev)
		prev = n
	}
	switch {
	case !present:
		dst = append(dst, tagAbsent)
	case isRaw:
		dst = binary.LittleEndian.AppendUint64(append(dst, tagRaw), math.Float64bits(raw))
	default:
		dst = binary.AppendUvarint(dst, zigzag(n)<<2|tagInt)
	}
	kept = present
	if !kept {
		// An absent entry is one tagAbsent byte; any other byte belongs to
		// a present one.
		kept = slices.ContainsFunc(b[off:], func(c byte) bool { return c != tagAbsent })
	}
	return append(dst, b[off:]...), kept
}

// validIDs is the mask of every metric id.
const validIDs = (uint64(1)<<metric.NumIDs - 1) &^ 1

// len is the number of samples held.
func (r *series) len() int { return int(r.n) }

// maxEntry bounds one entry's encoding.
const maxEntry = binary.MaxVarintLen64 + 8

// add appends s, newer than every sample held.
func (r *series) add(s metric.Sample) {
	present := s.Present & validIDs &^ uint64(r.ids)
	if r.cols == nil || present != 0 {
		r.addColumns(present)
	}
	cols := r.columns()
	// Every column's new entry, then the buffer made room for them once.
	var tmp [(metric.NumIDs + 1) * maxEntry]byte
	var ends [metric.NumIDs + 1]uint32
	e := cols[0].appendInt(tmp[:0], s.TimeMs)
	ends[0] = uint32(len(e))
	for i, ids := 1, r.ids; i < len(cols); i, ids = i+1, ids&(ids-1) {
		c, id := &cols[i], metric.ID(bits.TrailingZeros32(ids))
		if s.Present&(1<<id) != 0 {
			e = c.appendValue(e, id, s.V[id])
		} else {
			e = c.appendAbsent(e)
		}
		ends[i] = uint32(len(e))
	}
	size := len(r.buf)
	r.buf = growBytes(r.buf, len(e))[:size+len(e)]
	// From the last column to the first: column i moves up by the entries
	// of the columns before it, and its own entry follows it.
	for i := len(cols) - 1; i >= 0; i-- {
		start, end := uint32(0), cols[i].end
		if i > 0 {
			start = cols[i-1].end
		}
		shift, from := uint32(0), uint32(0)
		if i > 0 {
			shift, from = ends[i-1], ends[i-1]
		}
		if shift > 0 {
			copy(r.buf[start+shift:end+shift], r.buf[start:end])
		}
		if ends[i]-from == 1 {
			r.buf[end+shift] = e[from] // most entries: one byte
		} else {
			copy(r.buf[end+shift:], e[from:ends[i]])
		}
		cols[i].end = end + ends[i]
	}
	if s.Hist != nil && r.hist == nil {
		r.hist = new(hists)
	}
	if r.hist != nil {
		r.hist.add(s.Hist, int(r.n))
		r.hist.last = s.Hist
	}
	r.n++
}

// addColumns adds the times' column (when there is none yet) and a column
// for each metric in ids, absent for every sample held. The buffer and the
// headers are reallocated once, exactly (columns are added rarely: at the
// first sample, or when a page gains a metric).
func (r *series) addColumns(ids uint64) {
	all := r.ids | uint32(ids)
	was := r.columns()
	cols := make([]column, 1+bits.OnesCount32(all))
	buf := make([]byte, 0, len(r.buf)+int(r.n)*(len(cols)-len(was)))
	j := 0 // the old column that comes next
	for i, rest := 0, all; i < len(cols); i++ {
		old := len(was) > 0 // the times' is old once there is one
		if i > 0 {
			bit := rest & -rest
			rest &^= bit
			old = r.ids&bit != 0
		}
		if old {
			cols[i] = was[j]
			buf = append(buf, r.entries(j)...)
			j++
		} else {
			for range r.n {
				buf = append(buf, tagAbsent)
			}
		}
		cols[i].end = uint32(len(buf))
	}
	r.buf, r.cols, r.ids = buf, &cols[0], all
}

// expired reports whether the k+1th oldest sample is at from or older:
// the k oldest are then not needed by a window that starts at from or
// later.
func (r *series) expired(from int64, k int) bool {
	if int(r.n) <= k {
		return false
	}
	var t int64
	for i, off := 0, 0; i <= k; i++ {
		t, _, _, _, off = entry(r.buf, 0, off, t)
	}
	return t <= from
}

// decodeTimes writes the samples' times into dst[:len] (grown as
// needed), oldest first, with no value or histogram present.
func (r *series) decodeTimes(dst []metric.Sample) []metric.Sample {
	n := int(r.n)
	if cap(dst) < n {
		dst = make([]metric.Sample, n, n+n/4)
	}
	dst = dst[:n]
	var t int64
	times := r.entries(0)
	for i, off := 0, 0; i < n; i++ {
		t, _, _, _, off = entry(times, 0, off, t)
		dst[i].TimeMs, dst[i].Present, dst[i].Hist = t, 0, nil
	}
	return dst
}

// decode writes the values of the metrics in want into the samples dst
// that decodeTimes wrote; other values are left as they were.
func (r *series) decode(dst []metric.Sample, want uint64) {
	for ci, ids, n := 1, r.ids, len(r.columns()); ci < n; ci, ids = ci+1, ids&(ids-1) {
		id := metric.ID(bits.TrailingZeros32(ids))
		if want&(1<<id) == 0 {
			continue
		}
		b := r.entries(ci)
		bit := uint64(1) << id
		p := metric.Pow10(id.Scale())
		var n int64
		for i, off := 0, 0; i < int(r.n); i++ {
			var raw float64
			var isRaw, present bool
			n, raw, isRaw, present, off = entry(b, id, off, n)
			switch {
			case !present:
				dst[i].Present &^= bit
			case isRaw:
				dst[i].V[id], dst[i].Present = raw, dst[i].Present|bit
			default:
				dst[i].V[id], dst[i].Present = float64(n)/p, dst[i].Present|bit
			}
		}
	}
}

// drop removes the k oldest samples (0 < k < len).
func (r *series) drop(k int) {
	sc := dropScratch.Get().(*[]byte)
	out := (*sc)[:0]
	was := r.columns()
	cols := was[:0] // written behind the reads: kept columns are renumbered
	start, ids := uint32(0), r.ids
	for i := range was {
		c, id := was[i], metric.ID(0)
		if i > 0 {
			id = metric.ID(bits.TrailingZeros32(ids))
			ids &= ids - 1
		}
		b := r.buf[start:c.end]
		start = c.end
		mark := len(out)
		var kept bool
		out, kept = appendDropped(out, b, id, k)
		if i > 0 && !kept {
			out = out[:mark] // every entry left is absent: the column goes
			r.ids &^= 1 << id
			continue
		}
		c.end = uint32(len(out))
		cols = append(cols, c)
	}
	if len(cols) < len(was) {
		// A column went: the headers are reallocated, exactly (rare: a
		// metric the pod no longer reports, once its window is past).
		r.cols = &slices.Clone(cols)[0]
	}
	r.buf = replaceHead(r.buf, len(r.buf), out)
	*sc = out
	dropScratch.Put(sc)
	r.n -= int32(k)
	if r.hist != nil {
		for h := range r.hist.cols {
			r.hist.cols[h].dropFront(k)
		}
	}
}

// dropScratch holds drop's rewritten buffer before it is copied back.
var dropScratch = sync.Pool{New: func() any { return new([]byte) }}

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

// size is what the series' encoding uses (its buffers' lengths and the
// columns' headers): what podBytes bounds (a buffer's capacity left by a
// cut would have it cut again).
func (r *series) size() int {
	n := len(r.buf) + len(r.columns())*int(unsafe.Sizeof(column{}))
	if r.hist != nil {
		n += r.hist.size()
	}
	return n
}

// bytes is the memory the series' encoding holds (its buffers' capacity
// and the columns' headers).
func (r *series) bytes() int {
	n := cap(r.buf) + len(r.columns())*int(unsafe.Sizeof(column{}))
	if r.hist != nil {
		n += r.hist.bytes()
	}
	return n
}

// room is the capacity a buffer of size bytes is given when it grows.
func room(size int) int { return size + size/8 + 8 }

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
	nb := make([]byte, size, room(size))
	copy(nb, head)
	copy(nb[len(head):], tail)
	return nb
}
