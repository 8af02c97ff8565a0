package framed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/netbound"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// batches is a handler that reports each batch's seq and pod count on got,
// and the error its stream ended with (nil at the agent's half-close) on
// end.
func batches(got chan<- [2]uint64, end chan<- error) func(pulsev1.Ingest_ReportServer) error {
	return func(st pulsev1.Ingest_ReportServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				end <- err
				return err
			}
			if b := m.GetBatch(); b != nil {
				got <- [2]uint64{b.Seq, uint64(len(b.Pods))}
			}
		}
	}
}

// rawStream opens a plaintext framed connection by hand, through its
// token (none), for a test to write frames on as it likes.
func rawStream(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, PrefaceTCP); err != nil {
		t.Fatal(err)
	}
	var h [headerLen]byte
	if _, err := io.ReadFull(c, h[:]); err != nil || h[0] != kindAccept {
		t.Fatalf("the preface's answer %x, %v", h, err)
	}
	if err := writeFrame(c, kindToken, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// frameOf is m as a message frame.
func frameOf(t *testing.T, m *pulsev1.AgentMessage) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var h [headerLen]byte
	header(&h, kindMessage, len(b))
	return append(h[:], b...)
}

// writeApart writes each part on its own, a pause after each so that it
// comes in a read of its own (the test holds either way: a read ends
// where the bytes that have come end, wherever that is).
func writeApart(t *testing.T, c net.Conn, parts ...[]byte) {
	t.Helper()
	for _, p := range parts {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A read takes what has come: two messages together, a header split
// between reads, a payload that comes in pieces, a message and the start
// of the next. Each is decoded whole and in order, read on ready (the
// ingest port's plaintext connections) or not (TLS's, read through
// crypto/tls), and the half-close after them ends the stream cleanly.
func TestMessagesAreReadWhateverTheirBytesComeIn(t *testing.T) {
	for _, ready := range []bool{true, false} {
		t.Run(map[bool]string{true: "read on ready", false: "read as a stream"}[ready], func(t *testing.T) {
			got, end := make(chan [2]uint64, 16), make(chan error, 1)
			addr := serveOn(t, NewServer(batches(got, end), ServerOptions{}), ready)
			c := rawStream(t, addr)
			f := func(seq uint64, pods int) []byte { return frameOf(t, batch(seq, pods)) }
			two := append(f(1, 3), f(2, 5)...)
			three := f(3, 40)
			four, five := f(4, 7), f(5, 2000) // five: past the read ahead
			six := f(6, 1)
			writeApart(t, c,
				two,                              // two messages in one read
				three[:2], three[2:9], three[9:], // a header split, then the payload in pieces
				append(four, five[:3]...), five[3:1000], // a message and the start of the next
				five[1000:], six)
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			want := [][2]uint64{{1, 3}, {2, 5}, {3, 40}, {4, 7}, {5, 2000}, {6, 1}}
			for _, w := range want {
				select {
				case g := <-got:
					if g != w {
						t.Fatalf("batch %v, want %v", g, w)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("batch %v never came", w)
				}
			}
			if err := <-end; err != nil {
				t.Fatalf("the stream ended with %v, want the half-close's clean end", err)
			}
		})
	}
}

// A connection that ends within a header, or within a payload, ends its
// stream Unavailable, as one read as a stream does; one that ends between
// two messages ends it cleanly (above).
func TestAConnectionThatEndsWithinAMessageIsUnavailable(t *testing.T) {
	f := frameOf(t, batch(1, 8))
	for name, sent := range map[string][]byte{"within the header": f[:3], "within the payload": f[:headerLen+4]} {
		t.Run(name, func(t *testing.T) {
			got, end := make(chan [2]uint64, 1), make(chan error, 1)
			addr := serveOn(t, NewServer(batches(got, end), ServerOptions{}), true)
			c := rawStream(t, addr)
			writeApart(t, c, sent)
			_ = c.Close()
			select {
			case err := <-end:
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("the stream ended with %v, want Unavailable", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the stream did not end")
			}
		})
	}
}

// countingConn counts the reads made of a connection read on ready: on
// ready (ReadOnReady) and as a stream (Read).
type countingConn struct {
	net.Conn
	rr            readyReader
	ready, stream *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	c.stream.Add(1)
	return c.Conn.Read(b)
}

func (c *countingConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	c.ready.Add(1)
	return c.rr.ReadOnReady(size, pool)
}

// A message of a node's batch is one read once the socket is readable:
// read as a header and then a payload, it was two (three read(2)s with
// the one that found nothing yet).
func TestAMessageIsOneRead(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The handler holds each batch until the test has counted the reads
	// (resume): it reads nothing meanwhile.
	got, resume := make(chan uint64), make(chan struct{})
	s := NewServer(func(st pulsev1.Ingest_ReportServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				return err
			}
			if b := m.GetBatch(); b != nil {
				got <- b.Seq
				<-resume
			}
		}
	}, ServerOptions{})
	var ready, stream, reads atomic.Int64
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			rc := netbound.Ready(c, &reads)
			rr, ok := rc.(readyReader)
			if !ok {
				t.Errorf("a loopback TCP connection is not read on ready")
				_ = c.Close()
				return
			}
			go s.ServeConn(&countingConn{Conn: rc, rr: rr, ready: &ready, stream: &stream})
		}
	}()
	t.Cleanup(func() { _ = tcp.Close(); s.Close() })
	st := say(t, tcp.Addr().String(), "node-a") // batches answers nothing
	for seq := uint64(1); seq <= 5; seq++ {
		if err := st.Send(batch(seq, 8)); err != nil {
			t.Fatal(err)
		}
		// The handler has the batch and is not reading: every read made
		// so far is counted.
		if g := <-got; g != seq {
			t.Fatalf("batch %d, want %d", g, seq)
		}
		// The hello's read, then one a batch (or none where the hello's
		// read took the first batch too); the handshake's reads (the
		// preface, the token) are reads as a stream.
		if r := ready.Load(); r != 1+int64(seq) && r != int64(seq) {
			t.Fatalf("after %d batches: %d reads on ready, want %d (one a message)", seq, r, 1+seq)
		}
		resume <- struct{}{}
	}
	handshake := stream.Load()
	if handshake > 3 {
		t.Fatalf("%d reads as a stream before the first message: the preface's and the token's are 2 or 3", handshake)
	}
	for seq := uint64(6); seq <= 8; seq++ {
		if err := st.Send(batch(seq, 8)); err != nil {
			t.Fatal(err)
		}
		<-got
		resume <- struct{}{}
	}
	if n := stream.Load(); n != handshake {
		t.Fatalf("%d reads as a stream after the handshake: a message read on ready took more reads", n-handshake)
	}
}

// Messages that came together are taken from the bytes read in place:
// the rest of them was copied at each message, so a read of many small
// messages (4 KiB of 5-byte frames: 800 of them) cost 800 copies of up
// to 4 KiB.
func TestPendingMessagesAreTakenInPlace(t *testing.T) {
	srv, cli := net.Pipe()
	defer func() { _ = srv.Close(); _ = cli.Close() }()
	s := NewServer(nil, ServerOptions{})
	defer s.Close()
	st := &serverStream{s: s, conn: srv, ctx: context.Background()}
	var data []byte
	var offsets []int
	for i := range 50 {
		offsets = append(offsets, len(data))
		data = append(data, frameOf(t, hello(fmt.Sprintf("node-%d", i)))...)
	}
	st.pending = data
	for i := range 50 {
		if len(st.pending) == 0 || &st.pending[0] != &data[offsets[i]] {
			t.Fatalf("before message %d the pending bytes are not the ones read", i)
		}
		var m pulsev1.AgentMessage
		if err := st.recvReady(&m); err != nil {
			t.Fatal(err)
		}
		if got, want := m.GetHello().GetNode(), fmt.Sprintf("node-%d", i); got != want {
			t.Fatalf("message %d: node %q, want %q", i, got, want)
		}
	}
	if len(st.pending) != 0 {
		t.Fatalf("%d bytes left pending", len(st.pending))
	}
}
