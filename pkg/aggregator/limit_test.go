package aggregator

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
)

// TestIngestConnectionsReadIntoPooledBuffers: wrapped by netutil's limit,
// every ingest connection held a 4 KiB read buffer of its own for its
// life (gRPC pools its read buffers only for a *net.TCPConn or a
// connection with ReadOnReady), 0.5 KB of heap a pod at 8 pods a node.
// gRPC now reads the limit's TCP connections through ReadOnReady. The
// check is that gRPC calls it: a gRPC version that stopped would be
// back on a buffer of its own, and this test would say so.
func TestIngestConnectionsReadIntoPooledBuffers(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	ln, ok := a.ingestLn.(*limitListener)
	if !ok {
		t.Fatalf("the ingest listener is a %T, want the limit listener", a.ingestLn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(dial(t, a.IngestAddr())).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil {
		t.Fatal(err)
	}
	if n := ln.readyReads.Load(); n == 0 {
		t.Fatal("gRPC served a call on the ingest port without reading through ReadOnReady: its read buffer is not pooled")
	}
}

// TestReadyConnReads: ReadOnReady waits for bytes, reads them into a
// buffer of the pool, and says EOF at the peer's close and an error once
// closed here; the connection's slot is given back once.
func TestReadyConnReads(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newLimitListener(tcp, 1)
	defer ln.Close()
	peer, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := c.(*readyConn)
	if !ok {
		t.Fatalf("a TCP connection of the limit is a %T, want *readyConn", c)
	}
	pool := mem.DefaultBufferPool()
	go func() {
		time.Sleep(20 * time.Millisecond) // the read waits for it
		_, _ = peer.Write([]byte("batch"))
	}()
	buf, n, err := rc.ReadOnReady(64, pool)
	if err != nil || n != 5 || string((*buf)[:n]) != "batch" {
		t.Fatalf("ReadOnReady = %d, %v, want the 5 bytes written", n, err)
	}
	pool.Put(buf)
	_ = peer.Close()
	if buf, n, err = rc.ReadOnReady(64, pool); !errors.Is(err, io.EOF) || buf != nil || n != 0 {
		t.Fatalf("after the peer closed: %v, %d, %v, want EOF and no buffer", buf, n, err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err = rc.ReadOnReady(64, pool); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("after its own close: %v, want the closed connection's error", err)
	}
	_ = rc.Close()
	if len(ln.sem) != 0 {
		t.Fatalf("slots held after the connection closed twice: %d, want 0", len(ln.sem))
	}
}

// TestLimitListenerCloseEndsTheWait: an Accept waiting past the bound
// returns once the listener closes.
func TestLimitListenerCloseEndsTheWait(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newLimitListener(tcp, 1)
	peer, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("an Accept past the bound returned %v, want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	_ = ln.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an Accept of a closed listener returned a connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting Accept did not return after Close")
	}
}

// TestTheIngestPortKeepsNoHeaderTable: the ingest port's first SETTINGS
// frame asks for a header table of 0, so that no agent connection's
// headers (its token among them) are held for the connection's life in
// HPACK's dynamic table (streamOptions).
func TestTheIngestPortKeepsNoHeaderTable(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	c, err := net.DialTimeout("tcp", a.IngestAddr(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame %v: want the server's SETTINGS", f)
	}
	if v, ok := sf.Value(http2.SettingHeaderTableSize); !ok || v != 0 {
		t.Fatalf("SETTINGS_HEADER_TABLE_SIZE %d (sent: %v): want 0", v, ok)
	}
}
