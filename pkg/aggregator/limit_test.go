package aggregator

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"

	"github.com/pulse-io/pulse/test/h2settings"
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
	ln := newLimitListener(tcp, 1, 1)
	defer ln.Close()
	peer, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := c.(interface {
		net.Conn
		ReadOnReady(int, mem.BufferPool) (*[]byte, int, error)
	})
	if !ok {
		t.Fatalf("a TCP connection of the limit is a %T, want one with ReadOnReady", c)
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
	ln := newLimitListener(tcp, 1, 1)
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

// TestTheIngestPortsSettings: the ingest port's first SETTINGS frame asks
// for a header table of 0, so that no agent connection's headers (its token
// among them) are held for the connection's life in HPACK's dynamic table;
// bounds a stream's headers at 32 KiB (gRPC's default, 16 MiB, was held for
// the stream's life); and keeps fixed 64 KiB windows (streamOptions).
func TestTheIngestPortsSettings(t *testing.T) {
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	h2settings.Expect(t, h2settings.Read(t, a.IngestAddr()), map[http2.SettingID]uint32{
		http2.SettingHeaderTableSize:   0,
		http2.SettingMaxHeaderListSize: maxIngestHeaders,
		http2.SettingInitialWindowSize: 64 << 10,
	})
}

// TestOneAddressHoldsItsShareOfTheIngestPort: the ingest port held at most
// --max-ingest-connections in all, and a connection is not authenticated
// (a stream's token is): one client's connections could take every place,
// and the agents waited behind them. Past --max-ingest-connections-per-
// address from one address a new connection is closed at once; another
// address is served, and a place given back is that address's again.
func TestOneAddressHoldsItsShareOfTheIngestPort(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newLimitListener(tcp, 10, 2)
	defer ln.Close()
	dialFrom := func(ip net.IP) {
		t.Helper()
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	flood := net.IPv4(127, 0, 0, 1)
	var held []net.Conn
	for range 3 {
		dialFrom(flood)
	}
	dialFrom(net.IPv4(127, 0, 0, 2)) // an agent
	// The flood's two, then the agent's: the flood's third was closed.
	for range 3 {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if got := held[2].RemoteAddr().(*net.TCPAddr).IP; !got.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Fatalf("the third accepted is from %v, want the agent's address: one address took more than its 2", got)
	}
	if len(ln.sem) != 3 {
		t.Fatalf("%d places held, want 3", len(ln.sem))
	}
	// A place given back is its address's again.
	_ = held[0].Close()
	dialFrom(flood)
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := ln.byIP.HeldFrom("127.0.0.1"); n != 2 || len(ln.sem) != 3 {
		t.Fatalf("after a close and a new connection: %d of the flood's, %d places, want 2 of the flood's and 3 in all", n, len(ln.sem))
	}
}

// TestAConnectionWithNoStreamGivesItsPlaceBack: an agent's connection
// always has its stream; one with none (no token ever reviewed) held its
// place for the connection's hour. The server says GOAWAY once it has
// been idle for ingestConnectionIdle and closes it itself, the client
// staying (it answers the server's pings and closes nothing).
func TestAConnectionWithNoStreamGivesItsPlaceBack(t *testing.T) {
	defer func(d time.Duration) { ingestConnectionIdle = d }(ingestConnectionIdle)
	ingestConnectionIdle = 300 * time.Millisecond
	a := start(t, func(o *Options) { o.Warmup.Duration = 0 })
	ln := a.ingestLn.(*limitListener)
	fr := h2settings.Dial(t, a.IngestAddr())
	goaway := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if !goaway {
				t.Fatalf("no GOAWAY to a connection with no stream: %v", err)
			}
			break // the server closed it
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goaway = true
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// (The server's next Accept, waiting, holds a place of the total.)
	held := func() int { return ln.byIP.HeldFrom("127.0.0.1") }
	for held() != 0 {
		if ctx.Err() != nil {
			t.Fatalf("the client gone, its address still holds %d places", held())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTheScalerPortHoldsBoundedConnections: the scaler port held every
// connection, unbounded: one pod opening them in a loop took the replica
// past its memory limit. It holds at most
// --max-scaler-connections-per-address from one address (KEDA's operator
// keeps one a scaler address and TLS configuration); each refusal is
// counted, so that clients sharing an address are told why.
func TestTheScalerPortHoldsBoundedConnections(t *testing.T) {
	const perIP = 4
	a := start(t, func(o *Options) { o.Warmup.Duration = 0; o.Serving.MaxScalerConnectionsPerAddress = perIP })
	sl, ok := a.scalerLn.(scalerListener)
	if !ok {
		t.Fatalf("the scaler listener is a %T, want a bounded one", a.scalerLn)
	}
	ln := sl.Listener
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range perIP + 4 {
		c, err := net.Dial("tcp", a.ScalerAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ln.Held() != perIP || testutil.ToFloat64(a.refused.WithLabelValues("scaler")) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the scaler port holds %d connections of one address, want %d; refused %v, want 4", ln.Held(), perIP,
				testutil.ToFloat64(a.refused.WithLabelValues("scaler")))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// KEDA, from another address, is served.
	conn, err := grpc.NewClient(a.ScalerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("KEDA beside a flood of the scaler port: %v", err)
	}
}
