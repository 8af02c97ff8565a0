// Package wire encodes and decodes the samples of a SampleBatch. Each value is
// quantized to its metric's resolution and sent as a zigzag residual against
// a prediction from what was last sent for the same pod and metric on the
// same stream: the last value for a gauge, the last value plus the last
// increase for a counter. The present bitmap travels as its XOR with the
// last one. An Encoder and a Decoder hold the two ends of that per-stream
// state; a new stream starts both from zero, so the first value is absolute.
package wire

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pulse-io/pulse/pkg/metric"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// presentMask has a bit for every valid metric id.
const presentMask = (uint64(1)<<metric.NumIDs - 1) &^ 1

// podState.present holds presentMask's bits: this fails to compile once
// they pass 32.
var _ = [1]struct{}{}[presentMask>>32]

// maxQuantum bounds quantized values so that residuals cannot overflow.
const maxQuantum = 1 << 53

// podState is what one end last sent or received for a pod.
//
// A decoder holds one for every pod of its stream (an aggregator holds tens
// of thousands): its fields are sized to fit 256 bytes, a size class below
// the 320 it took (and 352 before that).
type podState struct {
	// gen is the Decode call that last saw the pod (the duplicate check;
	// 0: none; the count starts again at 1 after 2^32 calls, 136 years of
	// 1 s batches); idx is its
	// sample's index in that call's output (-1: a missing entry).
	gen     uint32
	idx     int32
	present uint32
	// delta is each counter's last increase, by metric.ID.CounterIndex,
	// when it fits 32 bits; wideDelta when it did not, and more.wide[c]
	// holds it (a counter reset, or a jump of 2^31 quanta in a scrape:
	// rare, where an int64 each took 60 bytes a pod).
	delta [metric.NumCounters]int32
	// last is each metric's last value, by id−1 (id 0 is no metric's).
	last [metric.NumIDs - 1]int64
	// more is allocated at the pod's first histogram or wide increase: a
	// decoder holds thousands of pods, most with neither.
	more *podMore
}

// podMore is the part of a pod's state that few pods have.
type podMore struct {
	hist [metric.NumHists]histState
	wide [metric.NumCounters]int64
}

// histState is what one end last sent or received of a pod's histogram.
type histState struct {
	bounds []float64
	counts []int64
}

// wideDelta in podState.delta says the increase is in podMore.wide.
const wideDelta = math.MinInt32

// extra is s.more, allocated.
func (s *podState) extra() *podMore {
	if s.more == nil {
		s.more = new(podMore)
	}
	return s.more
}

// histograms is the pod's histograms' state, allocated.
func (s *podState) histograms() *[metric.NumHists]histState { return &s.extra().hist }

// increase is counter c's last increase.
func (s *podState) increase(c int) int64 {
	if d := s.delta[c]; d != wideDelta {
		return int64(d)
	}
	return s.more.wide[c]
}

// predict is the value both ends expect for id, within ±maxQuantum as
// every value is, so that a residual is within ±2·maxQuantum: a counter
// that swung from −maxQuantum to +maxQuantum (a page's −1e300, then 1e300)
// once predicted 3·maxQuantum, a residual the decoder refuses, and ended
// its node's stream at every second scrape.
func (s *podState) predict(id metric.ID) int64 {
	if c := id.CounterIndex(); c >= 0 {
		return min(max(s.last[id-1]+s.increase(c), -maxQuantum), maxQuantum)
	}
	return s.last[id-1]
}

func (s *podState) record(id metric.ID, n int64) {
	if c := id.CounterIndex(); c >= 0 {
		switch d := n - s.last[id-1]; {
		case d > math.MinInt32 && d <= math.MaxInt32:
			s.delta[c] = int32(d)
		default:
			s.extra().wide[c], s.delta[c] = d, wideDelta
		}
	}
	s.last[id-1] = n
}

// Sample is one pod's entry in a batch: its values, or why it has none.
type Sample struct {
	Pod      uint32
	OffsetMs int32
	Values   metric.Values
	// Extra holds forwarded raw gauges (NaN when absent); nil when none.
	Extra []float64
	// Hist holds forwarded histograms; nil when none. A histogram unchanged
	// since the last sent for the pod on the stream is not sent: decoded, it
	// is absent, and the receiver keeps the last it had.
	Hist    *metric.Histograms
	Missing pulsev1.MissingReason
	Error   string
}

// MaxExtraMetrics bounds the extra gauges a stream forwards (a hello
// naming more is refused): the agent refuses more --extra-metric, which
// had validated, then had every stream refused, delivering nothing.
const MaxExtraMetrics = 32

// Printable is s as a terminal shows it as text: each character that
// would move or restyle it (C0 controls but newline and tab, DEL, C1), or
// that reorders or hides what follows (Unicode's format characters: bidi
// overrides, zero-width ones), replaced by U+FFFD. What pulse prints of
// tenant text (a workload's name, an error quoting a page) is text, never
// commands.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || unicode.IsGraphic(r) {
			return r
		}
		return '\uFFFD'
	}, s)
}

// OneLine is s as one printable line: Printable, and a newline or tab
// shown as \n or \t, so that a tenant's name or key printed in a line
// forges no other.
func OneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace(Printable(s))
}

// MaxName bounds a Kubernetes object's name (a DNS subdomain): a workload's
// name pulse takes from a tenant is at most this many bytes.
const MaxName = 253

// IsName reports whether s is a name pulse takes from a tenant (a pod's,
// a namespace's, a workload's): valid UTF-8 of graphic characters alone
// (no control or format character: a newline in a workload's name forged
// a row of the debug tables, a bidi override reordered what follows it).
func IsName(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsGraphic(r) {
			return false
		}
	}
	return true
}

// CleanText is s as valid UTF-8 (each invalid byte a U+FFFD) cut to at most
// limit bytes on a character's boundary. proto3 refuses to marshal a string
// that is not UTF-8; an error's text may quote what a pod's server sent.
// A text cut is a copy: a part of s kept (an agent's error of a missing
// sample, held with its pod) held all of s, up to a message's 4 MiB.
func CleanText(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	for limit > 0 && !utf8.RuneStart(s[limit]) {
		limit--
	}
	return strings.Clone(s[:limit])
}

// Encoder is the sending end of one stream.
type Encoder struct{ pods map[uint32]*podState }

// NewEncoder returns an Encoder for a new stream.
func NewEncoder() *Encoder { return &Encoder{pods: make(map[uint32]*podState)} }

// Append adds s to b. A pod must appear at most once per batch.
func (e *Encoder) Append(b *pulsev1.SampleBatch, s *Sample) {
	if s.Missing != pulsev1.MissingReason_MISSING_REASON_UNSPECIFIED {
		// proto3 refuses to marshal a string that is not UTF-8: an error's
		// text that is not must never cost the batch.
		b.Missing = append(b.Missing, &pulsev1.MissingSample{Pod: s.Pod, OffsetMs: s.OffsetMs, Reason: s.Missing, Error: strings.ToValidUTF8(s.Error, "\uFFFD")})
		return
	}
	st := e.pods[s.Pod]
	if st == nil {
		st = new(podState)
		e.pods[s.Pod] = st
	}
	present := s.Values.Present & presentMask
	b.Pods = append(b.Pods, s.Pod)
	b.OffsetsMs = append(b.OffsetsMs, s.OffsetMs)
	for p := present; p != 0; p &= p - 1 {
		id := metric.ID(bits.TrailingZeros64(p))
		x := s.Values.V[id]
		if x != x {
			// A NaN is no value: absent, never 0 (the extractor drops a
			// page's, but the GPU values are set on the page after it).
			present &^= p & -p
			continue
		}
		n := quantize(id, x)
		b.Values = append(b.Values, n-st.predict(id))
		st.record(id, n)
	}
	b.PresentXor = append(b.PresentXor, present^uint64(st.present))
	st.present = uint32(present)
	if s.Extra != nil {
		b.Extra = append(b.Extra, &pulsev1.ExtraValues{Pod: s.Pod, Values: s.Extra})
	}
	if s.Hist != nil {
		for h := range s.Hist {
			if hb := &s.Hist[h]; hb.Present() && sendable(hb) {
				if x := st.histograms()[h].encode(s.Pod, metric.Hist(h), hb); x != nil {
					b.Histograms = append(b.Histograms, x)
				}
			}
		}
	}
}

// encode is one histogram's entry, and records it as sent; nil when it is
// unchanged since the last sent (the receiver keeps the last: see Sample),
// which costs no allocation.
func (st *histState) encode(pod uint32, h metric.Hist, b *metric.Buckets) *pulsev1.HistogramSample {
	newBounds := !slices.Equal(st.bounds, b.Bounds)
	if !newBounds && slices.EqualFunc(st.counts, b.Counts, func(n int64, c float64) bool { return n == quantizeCount(c) }) {
		return nil
	}
	out := &pulsev1.HistogramSample{Pod: pod, Histogram: pulsev1.Histogram(h + 1), Counts: make([]int64, len(b.Counts))}
	if newBounds {
		out.Bounds = b.Bounds
		st.bounds, st.counts = slices.Clone(b.Bounds), make([]int64, len(b.Bounds))
	}
	for i, c := range b.Counts {
		n := quantizeCount(c)
		out.Counts[i] = n - st.counts[i]
		st.counts[i] = n
	}
	return out
}

// quantizeCount is a bucket count as the wire carries it (NaN as 0).
func quantizeCount(c float64) int64 {
	if c != c {
		return 0
	}
	return int64(min(max(math.Round(c), 0), maxQuantum))
}

// sendable says whether the decoder takes b: bounds as checkBounds wants
// them, a count for each, and counts that do not decrease once quantized.
// The encoder leaves any other out (the extractor's histograms are so
// already), so that no pod's page can end its node's stream.
func sendable(b *metric.Buckets) bool {
	if checkBounds(b.Bounds) != nil || len(b.Counts) != len(b.Bounds) {
		return false
	}
	for i, c := range b.Counts {
		// A NaN count, sent as 0, read as none where the page said nothing
		// (docs/protocol.md: never sent); one first was sent.
		if c != c || i > 0 && quantizeCount(c) < quantizeCount(b.Counts[i-1]) {
			return false
		}
	}
	return true
}

// Forget drops a pod's state; call it when the pod leaves the catalogue.
func (e *Encoder) Forget(pod uint32) { delete(e.pods, pod) }

func quantize(id metric.ID, x float64) int64 {
	q := math.RoundToEven(x * metric.Pow10(id.Scale()))
	switch {
	case q > maxQuantum:
		return maxQuantum
	case q < -maxQuantum:
		return -maxQuantum
	case q != q: // NaN never reaches the wire: Append leaves it absent
		return 0
	}
	return int64(q)
}

// Decoder is the receiving end of one stream.
type Decoder struct {
	pods map[uint32]*podState
	gen  uint32
}

// NewDecoder returns a Decoder for a new stream.
func NewDecoder() *Decoder { return &Decoder{pods: make(map[uint32]*podState)} }

// Decode appends the samples of a batch to dst. A malformed batch (columns
// of different lengths, a pod twice, unknown metric bits, a value count that
// does not match, a value out of range) yields an error, after which the
// Decoder must not be used again: the two ends no longer agree, so the stream
// must end, and a new stream starts a new Decoder.
func (d *Decoder) Decode(dst []Sample, b *pulsev1.SampleBatch) ([]Sample, error) {
	if len(b.OffsetsMs) != len(b.Pods) || len(b.PresentXor) != len(b.Pods) {
		return dst, fmt.Errorf("decode batch %d: %d pods, %d offsets, %d present bitmaps", b.Seq, len(b.Pods), len(b.OffsetsMs), len(b.PresentXor))
	}
	d.gen++
	if d.gen == 0 {
		// Wrapped: a pod's state from 2^32 calls ago, or a new one's 0,
		// must not read as seen in this call.
		for _, st := range d.pods {
			st.gen = 0
		}
		d.gen = 1
	}
	vi := 0
	for i, pod := range b.Pods {
		st := d.pods[pod]
		if st == nil {
			st = new(podState)
			d.pods[pod] = st
		}
		if st.gen == d.gen {
			return dst, fmt.Errorf("decode batch %d: pod %d appears twice", b.Seq, pod)
		}
		st.gen, st.idx = d.gen, int32(len(dst))
		present := b.PresentXor[i] ^ uint64(st.present)
		if present&^presentMask != 0 {
			return dst, fmt.Errorf("decode batch %d: pod %d: unknown metric bits %#x", b.Seq, pod, present&^presentMask)
		}
		if n := bits.OnesCount64(present); vi+n > len(b.Values) {
			return dst, fmt.Errorf("decode batch %d: pod %d: %d metrics present but only %d values left", b.Seq, pod, n, len(b.Values)-vi)
		}
		st.present = uint32(present)
		dst = append(dst, Sample{Pod: pod, OffsetMs: b.OffsetsMs[i]})
		s := &dst[len(dst)-1]
		for p := present; p != 0; p &= p - 1 {
			id := metric.ID(bits.TrailingZeros64(p))
			pred, r := st.predict(id), b.Values[vi]
			vi++
			if r > 2*maxQuantum || r < -2*maxQuantum || pred+r > maxQuantum || pred+r < -maxQuantum {
				return dst, fmt.Errorf("decode batch %d: pod %d: %s out of range", b.Seq, pod, id.Name())
			}
			st.record(id, pred+r)
			s.Values.Set(id, float64(pred+r)/metric.Pow10(id.Scale()))
		}
	}
	if vi != len(b.Values) {
		return dst, fmt.Errorf("decode batch %d: %d values left over", b.Seq, len(b.Values)-vi)
	}
	for _, x := range b.Extra {
		st := d.pods[x.Pod]
		if st == nil || st.gen != d.gen || st.idx < 0 || dst[st.idx].Extra != nil {
			return dst, fmt.Errorf("decode batch %d: extra values of pod %d, which has no sample or has two", b.Seq, x.Pod)
		}
		dst[st.idx].Extra = x.Values
	}
	for _, x := range b.Histograms {
		if err := d.decodeHist(dst, x); err != nil {
			return dst, fmt.Errorf("decode batch %d: %w", b.Seq, err)
		}
	}
	for _, m := range b.Missing {
		st := d.pods[m.Pod]
		if st == nil {
			st = new(podState)
			d.pods[m.Pod] = st
		}
		if st.gen == d.gen || m.Reason == pulsev1.MissingReason_MISSING_REASON_UNSPECIFIED {
			return dst, fmt.Errorf("decode batch %d: missing entry of pod %d is a duplicate or has no reason", b.Seq, m.Pod)
		}
		st.gen, st.idx = d.gen, -1
		dst = append(dst, Sample{Pod: m.Pod, OffsetMs: m.OffsetMs, Missing: m.Reason, Error: m.Error})
	}
	return dst, nil
}

// decodeHist checks one histogram entry and sets it on its pod's sample.
func (d *Decoder) decodeHist(dst []Sample, x *pulsev1.HistogramSample) error {
	st := d.pods[x.Pod]
	if st == nil || st.gen != d.gen || st.idx < 0 {
		return fmt.Errorf("histogram of pod %d, which has no sample in the batch", x.Pod)
	}
	// The range is checked on the wire's value: converted first, 257
	// wrapped to TTFT and 258 to ITL.
	if x.Histogram <= 0 || x.Histogram > pulsev1.Histogram(metric.NumHists) {
		return fmt.Errorf("pod %d: unknown histogram %d", x.Pod, x.Histogram)
	}
	h := metric.Hist(x.Histogram - 1)
	s := &dst[st.idx]
	if s.Hist != nil && s.Hist[h].Present() {
		return fmt.Errorf("pod %d: histogram %s twice", x.Pod, h.Name())
	}
	hs := &st.histograms()[h]
	if len(x.Bounds) > 0 {
		if err := checkBounds(x.Bounds); err != nil {
			return fmt.Errorf("pod %d: histogram %s: %w", x.Pod, h.Name(), err)
		}
		hs.bounds, hs.counts = x.Bounds, make([]int64, len(x.Bounds))
	}
	if len(hs.bounds) == 0 || len(x.Counts) != len(hs.bounds) {
		return fmt.Errorf("pod %d: histogram %s: %d counts for %d bounds", x.Pod, h.Name(), len(x.Counts), len(hs.bounds))
	}
	b := metric.Buckets{Bounds: hs.bounds, Counts: make([]float64, len(x.Counts))}
	for i, r := range x.Counts {
		n := hs.counts[i] + r
		if r > maxQuantum || r < -maxQuantum || n < 0 || n > maxQuantum || (i > 0 && n < hs.counts[i-1]) {
			return fmt.Errorf("pod %d: histogram %s: bucket le=%g count out of range or below the bucket before", x.Pod, h.Name(), hs.bounds[i])
		}
		hs.counts[i] = n
		b.Counts[i] = float64(n)
	}
	if s.Hist == nil {
		s.Hist = new(metric.Histograms)
	}
	s.Hist[h] = b
	return nil
}

// checkBounds: 2 to metric.MaxBuckets bounds, ascending, the last +Inf.
func checkBounds(b []float64) error {
	if len(b) < 2 || len(b) > metric.MaxBuckets {
		return fmt.Errorf("%d buckets; want 2 to %d", len(b), metric.MaxBuckets)
	}
	for i, x := range b {
		if math.IsNaN(x) || (i > 0 && x <= b[i-1]) {
			return fmt.Errorf("bounds %v do not ascend", b)
		}
	}
	if !math.IsInf(b[len(b)-1], 1) {
		return fmt.Errorf("the last bound is %g, not +Inf", b[len(b)-1])
	}
	return nil
}

// Forget drops a pod's state; call it when the pod leaves the catalogue.
func (d *Decoder) Forget(pod uint32) { delete(d.pods, pod) }

// ReasonName is a missing reason's name in metrics labels and the debug endpoint.
func ReasonName(r pulsev1.MissingReason) string {
	switch r {
	case pulsev1.MissingReason_MISSING_REASON_TIMEOUT:
		return "timeout"
	case pulsev1.MissingReason_MISSING_REASON_CONNECT:
		return "connect"
	case pulsev1.MissingReason_MISSING_REASON_HTTP_STATUS:
		return "http_status"
	case pulsev1.MissingReason_MISSING_REASON_PARSE:
		return "parse"
	case pulsev1.MissingReason_MISSING_REASON_NOT_VLLM:
		return "not_vllm"
	case pulsev1.MissingReason_MISSING_REASON_TOO_LARGE:
		return "too_large"
	case pulsev1.MissingReason_MISSING_REASON_NOT_READY:
		return "not_ready"
	}
	return "unknown"
}
