//go:build unix

package netbound

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// TestPeekLeavesTheBytesForTheRead: Peek waits for the first bytes and
// leaves them, so the reader after it (gRPC's, or the framed transport's)
// reads the connection from its first byte; it keeps the read deadline,
// says io.EOF at a close before any byte, and refuses what Ready did not
// wrap.
func TestPeekLeavesTheBytesForTheRead(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	accept := func() (peer, c net.Conn) {
		peer, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := tcp.Accept()
		if err != nil {
			t.Fatal(err)
		}
		var reads atomic.Int64
		return peer, Ready(NewConn(raw, func() {}), &reads)
	}

	peer, c := accept()
	defer peer.Close()
	defer c.Close()
	go func() {
		time.Sleep(20 * time.Millisecond) // Peek waits for it
		_, _ = peer.Write([]byte("PRI * HTTP/2.0"))
	}()
	var b [1]byte
	if n, err := Peek(c, b[:]); n != 1 || err != nil || b[0] != 'P' {
		t.Fatalf("Peek = %d %q, %v; want the first byte", n, b[:n], err)
	}
	got := make([]byte, 14)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "PRI * HTTP/2.0" {
		t.Fatalf("read after Peek: %q, %v; want every byte, the peeked one first", got, err)
	}

	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := Peek(c, b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Peek with nothing sent: %v; want the read deadline's error", err)
	}

	peer2, c2 := accept()
	defer c2.Close()
	_ = peer2.Close()
	if _, err := Peek(c2, b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("Peek at a close: %v; want io.EOF", err)
	}

	a, p := net.Pipe()
	defer a.Close()
	defer p.Close()
	if _, err := Peek(a, b[:]); !errors.Is(err, ErrNoPeek) {
		t.Fatalf("Peek of a pipe: %v; want ErrNoPeek", err)
	}
}
