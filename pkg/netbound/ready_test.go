package netbound

import (
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/mem"
)

// TestReadyWrapsOnlyTCP: a TCP connection within a bound's (two bounds'
// here, as the aggregator's ingest port nests them) is read for gRPC
// into pooled buffers, and its close gives each room back once; any
// other connection is handed over as it is (gRPC gives it a buffer of its
// own).
func TestReadyWrapsOnlyTCP(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	peer, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := tcp.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var inner, outer int
	var reads atomic.Int64
	rc := Ready(NewConn(NewConn(c, func() { inner++ }), func() { outer++ }), &reads)
	r, ok := rc.(interface {
		ReadOnReady(int, mem.BufferPool) (*[]byte, int, error)
	})
	if !ok {
		t.Fatalf("a TCP connection within two bounds is a %T, want one with ReadOnReady", rc)
	}
	if _, err := peer.Write([]byte("batch")); err != nil {
		t.Fatal(err)
	}
	pool := mem.DefaultBufferPool()
	buf, n, err := r.ReadOnReady(64, pool)
	if err != nil || string((*buf)[:n]) != "batch" || reads.Load() != 1 {
		t.Fatalf("ReadOnReady = %d, %v (%d reads counted), want the 5 bytes written, once", n, err, reads.Load())
	}
	pool.Put(buf)
	_ = rc.Close()
	_ = rc.Close()
	if inner != 1 || outer != 1 {
		t.Fatalf("rooms given back %d and %d times, want once each", inner, outer)
	}

	a, b := net.Pipe()
	defer b.Close()
	pc := NewConn(a, func() {})
	if got := Ready(pc, &reads); got != net.Conn(pc) {
		t.Fatalf("a pipe within a bound came back as a %T, want the connection itself", got)
	}
	_ = pc.Close()
}
