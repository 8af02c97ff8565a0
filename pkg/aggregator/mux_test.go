package aggregator

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/framed"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// TestTheIngestPortTellsTheTransportsApart: on one bounded listener, a
// framed connection is served by the framed server, any other is handed
// to Accept with its bytes untouched, and one that sends nothing in time
// is closed; closing the port ends the framed streams.
func TestTheIngestPortTellsTheTransportsApart(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	fs := framed.NewServer(func(st pulsev1.Ingest_ReportServer) error {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		served <- m.GetHello().GetNode()
		_, err = st.Recv() // until the port closes
		return err
	}, framed.ServerOptions{})
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"transport"})
	ln := newLimitListener(tcp, 8, 8)
	m := newIngestMux(ln, fs, conns)
	// The framed client's handshake is read within the wait, or never:
	// 100 ms was a race on a loaded machine, and a race lost would hang
	// the test.
	m.wait = 2 * time.Second
	defer m.Close()
	// Each transport's series is there at 0 before its first connection
	// (one made then had no 0 for rate() to start from).
	if n := testutil.CollectAndCount(conns); n != 2 {
		t.Fatalf("before any connection: %d series, want grpc's and framed's", n)
	}
	for _, tr := range []string{"grpc", "framed"} {
		if v := testutil.ToFloat64(conns.WithLabelValues(tr)); v != 0 {
			t.Fatalf("before any connection: %s at %v, want 0", tr, v)
		}
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := m.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	// gRPC's: handed over whole.
	g, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := io.WriteString(g, "PRI * HTTP/2.0"); err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	got := make([]byte, 14)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "PRI * HTTP/2.0" {
		t.Fatalf("the gRPC server read %q, %v", got, err)
	}
	_ = c.Close()

	// Framed: served in place.
	cl, err := framed.NewClient(m.Addr().String(), framed.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "node-f"}}}); err != nil {
		t.Fatal(err)
	}
	if node := <-served; node != "node-f" {
		t.Fatalf("the framed server saw node %q", node)
	}
	// Read on ready (a message in one read into a pooled buffer): the
	// only such reads so far are the framed stream's.
	if n := ln.readyReads.Load(); n == 0 {
		t.Error("the framed stream's hello was not read on ready")
	}

	// Silent: closed once the wait is over, never handed to gRPC.
	s, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.Read(got); !errors.Is(err, io.EOF) {
		t.Fatalf("a connection that sent nothing: %v; want it closed", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("a silent connection was handed to gRPC: %v", c.RemoteAddr())
	default:
	}
	if n := testutil.ToFloat64(conns.WithLabelValues("grpc")); n != 1 {
		t.Errorf("gRPC connections counted %v, want 1", n)
	}
	if n := testutil.ToFloat64(conns.WithLabelValues("framed")); n != 1 {
		t.Errorf("framed connections counted %v, want 1", n)
	}

	_ = m.Close()
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the framed stream after the port closed: %v; want Unavailable", err)
	}
	if _, err := m.Accept(); err == nil {
		t.Fatal("Accept after Close handed a connection")
	}
}

// TestAGRPCHandshakeIsDueByTheWaitsEnd: the port waits for a connection's
// first byte within the handshake's time, then hands a gRPC one to gRPC,
// whose ConnectionTimeout set a handshake time of its own from then: one
// byte at the end of the wait held a place twice as long. gRPC's handshake
// is due by the wait's end (here: gRPC's own time an hour, the wait's a
// moment; the connection that sends one byte is closed at the wait's end).
// A handshake done keeps its connection past it.
func TestAGRPCHandshakeIsDueByTheWaitsEnd(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := framed.NewServer(func(pulsev1.Ingest_ReportServer) error { return nil }, framed.ServerOptions{})
	m := newIngestMux(newLimitListener(tcp, 8, 8), fs, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"transport"}))
	// Long enough for a client's whole handshake on a loaded machine
	// (200 ms was near a race under -race).
	m.wait = time.Second
	srv := grpc.NewServer(grpc.ConnectionTimeout(time.Hour))
	healthpb.RegisterHealthServer(srv, grpchealth.NewServer())
	go func() { _ = srv.Serve(m) }()
	defer srv.Stop()
	c, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0x16}); err != nil { // a TLS record's first byte, then nothing
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("a connection that sent one byte and no handshake: %v; want it closed at the wait's end", err)
	}
	// A client whose handshake is done is served past the wait's end.
	cc, err := grpc.NewClient(m.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for range 2 {
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("a gRPC client past its handshake: %v", err)
		}
		time.Sleep(2 * m.wait)
	}
}
