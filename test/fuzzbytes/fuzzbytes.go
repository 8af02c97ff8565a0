// Package fuzzbytes reads a fuzzer's bytes as a sequence of choices, for the
// fuzz tests that build structured input (a planner's snapshots, an agent's
// stream) from them.
package fuzzbytes

import "encoding/binary"

// Reader hands out a fuzzer's bytes one choice at a time; past their end
// every read is 0.
type Reader struct{ b []byte }

// New reads data.
func New(data []byte) *Reader { return &Reader{b: data} }

// Len is how many bytes are left.
func (r *Reader) Len() int { return len(r.b) }

// Byte is the next byte.
func (r *Reader) Byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// Pick is a choice among n (n > 0): the next byte modulo n.
func (r *Reader) Pick(n int) int { return int(r.Byte()) % n }

// U64 is the next eight bytes, little-endian.
func (r *Reader) U64() uint64 {
	var b [8]byte
	for i := range b {
		b[i] = r.Byte()
	}
	return binary.LittleEndian.Uint64(b[:])
}
