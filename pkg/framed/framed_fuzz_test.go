package framed

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/netbound"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// FuzzServeConn: whatever bytes a client of the ingest port sends on a
// framed connection (a preface or not, frames of any kind and length,
// cut anywhere), the server hands the handler only messages within the
// bound, ends the stream and returns; it never panics.
func FuzzServeConn(f *testing.F) {
	var tokenAndHello bytes.Buffer
	_ = writeFrame(&tokenAndHello, kindToken, []byte("tok"))
	h, _ := proto.Marshal(hello("node"))
	_ = writeFrame(&tokenAndHello, kindMessage, h)
	f.Add(append([]byte(PrefaceTCP), tokenAndHello.Bytes()...))
	f.Add([]byte(PrefaceTLS))
	f.Add([]byte("pulse-framed/1 tcp\n\x01\xff\xff\xff\xff"))
	f.Add(append([]byte(PrefaceTCP), 1, 0, 0, 0, 0, 2, 0x7f, 0xff, 0xff, 0xff))
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := fuzzServer(t)
		srv, cli := net.Pipe()
		done := make(chan struct{})
		go func() { s.ServeConn(srv); close(done) }()
		go func() { _, _ = io.Copy(io.Discard, cli) }() // the server's answers
		go func() {
			_, _ = cli.Write(in)
			_ = cli.Close()
		}()
		<-done
		s.Close()
	})
}

// fuzzServer is a server whose handler reads every message and checks
// none past its bound, with short handshake and idle bounds.
func fuzzServer(t *testing.T) *Server {
	const most = 1 << 12
	return NewServer(func(st pulsev1.Ingest_ReportServer) error {
		for {
			var m pulsev1.AgentMessage
			if err := st.RecvMsg(&m); err != nil {
				return err
			}
			if n := proto.Size(&m); n > most {
				t.Errorf("the handler was given a message of %d bytes; the bound is %d", n, most)
			}
		}
	}, ServerOptions{MaxMessage: most, Handshake: time.Second, Idle: time.Second})
}

// FuzzServeConnReadOnReady is FuzzServeConn over loopback TCP read on
// ready, as the ingest port's plaintext connections are: its bytes written
// in two parts (the first byte says where they split), so that a read
// ends within a header, within a payload, or past a message with the
// next one's start.
func FuzzServeConnReadOnReady(f *testing.F) {
	var tokenAndHellos bytes.Buffer
	_ = writeFrame(&tokenAndHellos, kindToken, []byte("tok"))
	h, _ := proto.Marshal(hello("node"))
	_ = writeFrame(&tokenAndHellos, kindMessage, h)
	_ = writeFrame(&tokenAndHellos, kindMessage, h)
	for _, at := range []byte{0, 20, 24, 30, 40} {
		f.Add(append([]byte{at}, append([]byte(PrefaceTCP), tokenAndHellos.Bytes()...)...))
	}
	f.Add([]byte("\x19pulse-framed/1 tcp\n\x01\x00\x00\x00\x00\x02\x7f\xff\xff\xff"))
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer func() { _ = tcp.Close() }()
	var reads atomic.Int64
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		s := fuzzServer(t)
		defer s.Close()
		cli, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		srv, err := tcp.Accept()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { s.ServeConn(netbound.Ready(srv, &reads)); close(done) }()
		go func() { _, _ = io.Copy(io.Discard, cli) }() // the server's answers
		at, rest := min(int(in[0]), len(in)-1), in[1:]
		_, _ = cli.Write(rest[:at])
		time.Sleep(time.Millisecond)
		_, _ = cli.Write(rest[at:])
		_ = cli.(*net.TCPConn).CloseWrite()
		<-done
		_ = cli.Close()
	})
}

// TestAConnectionClosedMidMessageEndsTheStream: a message cut short is
// an error to the handler, not the clean end of the agent's half-close.
func TestAConnectionClosedMidMessageEndsTheStream(t *testing.T) {
	got := make(chan error, 1)
	s := NewServer(func(st pulsev1.Ingest_ReportServer) error {
		var m pulsev1.AgentMessage
		err := st.RecvMsg(&m)
		got <- err
		return err
	}, ServerOptions{})
	defer s.Close()
	srv, cli := net.Pipe()
	go s.ServeConn(srv)
	go func() {
		var b bytes.Buffer
		b.WriteString(PrefaceTCP)
		_ = writeFrame(&b, kindToken, nil)
		b.Write([]byte{kindMessage, 0, 0, 0, 10, 1, 2}) // 2 of 10 bytes
		_, _ = cli.Write(b.Bytes()[:len(PrefaceTCP)])
		var h [headerLen]byte
		_, _, _ = readHeader(cli, &h) // the accept
		_, _ = cli.Write(b.Bytes()[len(PrefaceTCP):])
		_ = cli.Close()
	}()
	if err := <-got; err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("a message cut short: %v; want an error that is not the clean end", err)
	}
}

// cutConn writes half of what it is given, then fails, once cut: a write
// that timed out within a frame.
type cutConn struct {
	net.Conn
	cut *atomic.Bool
}

func (c cutConn) Write(p []byte) (int, error) {
	if c.cut.Load() {
		n, _ := c.Conn.Write(p[:len(p)/2])
		return n, errors.New("write timed out")
	}
	return c.Conn.Write(p)
}

// TestNoStatusFollowsAFrameCutShort: a message's write that failed within
// its frame (a write timeout) was followed by the status frame, whose
// bytes the agent read as the rest of the message: a message made up, or
// an error that was not the stream's. Nothing follows it now.
func TestNoStatusFollowsAFrameCutShort(t *testing.T) {
	var cut atomic.Bool
	s := NewServer(func(st pulsev1.Ingest_ReportServer) error {
		var m pulsev1.AgentMessage
		if err := st.RecvMsg(&m); err != nil {
			return err
		}
		cut.Store(true)
		return st.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{AggregatorVersion: "test"}}})
	}, ServerOptions{})
	defer s.Close()
	srv, cli := net.Pipe()
	go s.ServeConn(cutConn{Conn: srv, cut: &cut})
	var b bytes.Buffer
	b.WriteString(PrefaceTCP)
	_ = writeFrame(&b, kindToken, nil)
	h, _ := proto.Marshal(hello("node"))
	_ = writeFrame(&b, kindMessage, h)
	go func() { _, _ = cli.Write(b.Bytes()) }()
	var hdr [headerLen]byte
	if kind, _, err := readHeader(cli, &hdr); err != nil || kind != kindAccept {
		t.Fatalf("the accept: kind %d, %v", kind, err)
	}
	rest, _ := io.ReadAll(cli)
	welcome, _ := proto.Marshal(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{AggregatorVersion: "test"}}})
	if half := (headerLen + len(welcome)) / 2; len(rest) != half {
		t.Fatalf("%d bytes after the accept, want the %d of the frame cut short and nothing after", len(rest), half)
	}
}
