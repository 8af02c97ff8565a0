// Package wire encodes and decodes the values of a PodSample: each value is
// quantized to its metric's resolution and sent as the zigzag difference from
// the value last sent for the same pod and metric on the same stream.
// An Encoder and a Decoder hold the two ends of that per-stream state; a new
// stream starts both from zero, so the first value is absolute.
package wire

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/pulse-io/pulse/pkg/signal"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// presentMask has a bit for every valid metric id.
const presentMask = (uint64(1)<<signal.NumIDs - 1) &^ 1

// maxQuantum bounds quantized values so that differences cannot overflow.
const maxQuantum = 1 << 53

type last [signal.NumIDs]int64

// Encoder is the sending end of one stream.
type Encoder struct{ last map[uint32]*last }

// NewEncoder returns an Encoder for a new stream.
func NewEncoder() *Encoder { return &Encoder{last: make(map[uint32]*last)} }

// Encode fills out.Present and out.Values from v, appending to out.Values.
func (e *Encoder) Encode(pod uint32, v *signal.Values, out *pulsev1.PodSample) {
	l := e.last[pod]
	if l == nil {
		l = new(last)
		e.last[pod] = l
	}
	out.Present = v.Present & presentMask
	for p := out.Present; p != 0; p &= p - 1 {
		id := signal.ID(bits.TrailingZeros64(p))
		n := quantize(id, v.V[id])
		out.Values = append(out.Values, n-l[id])
		l[id] = n
	}
}

// Forget drops a pod's state; call it when the pod leaves the catalogue.
func (e *Encoder) Forget(pod uint32) { delete(e.last, pod) }

func quantize(id signal.ID, x float64) int64 {
	q := math.RoundToEven(x * signal.Pow10(id.Scale()))
	switch {
	case q > maxQuantum:
		return maxQuantum
	case q < -maxQuantum:
		return -maxQuantum
	case q != q: // NaN never reaches the wire: the extractor drops it
		return 0
	}
	return int64(q)
}

// Decoder is the receiving end of one stream.
type Decoder struct{ last map[uint32]*last }

// NewDecoder returns a Decoder for a new stream.
func NewDecoder() *Decoder { return &Decoder{last: make(map[uint32]*last)} }

// Decode returns the absolute values of a sample. A malformed sample (unknown
// metric bits, a value count that does not match, a value out of range)
// yields an error and leaves the decoder's state unchanged.
func (d *Decoder) Decode(s *pulsev1.PodSample) (signal.Values, error) {
	var v signal.Values
	if s.Present&^presentMask != 0 {
		return v, fmt.Errorf("decode sample of pod %d: unknown metric bits %#x", s.Pod, s.Present&^presentMask)
	}
	if n := bits.OnesCount64(s.Present); n != len(s.Values) {
		return v, fmt.Errorf("decode sample of pod %d: %d metrics present but %d values", s.Pod, n, len(s.Values))
	}
	l := d.last[s.Pod]
	var next last
	if l != nil {
		next = *l
	}
	i := 0
	for p := s.Present; p != 0; p &= p - 1 {
		id := signal.ID(bits.TrailingZeros64(p))
		n := next[id] + s.Values[i]
		i++
		if n > maxQuantum || n < -maxQuantum {
			return signal.Values{}, fmt.Errorf("decode sample of pod %d: %s out of range", s.Pod, id.Name())
		}
		next[id] = n
		v.Set(id, float64(n)/signal.Pow10(id.Scale()))
	}
	if l == nil {
		l = new(last)
		d.last[s.Pod] = l
	}
	*l = next
	return v, nil
}

// Forget drops a pod's state; call it when the pod leaves the catalogue.
func (d *Decoder) Forget(pod uint32) { delete(d.last, pod) }

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
