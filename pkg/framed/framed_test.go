package framed

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/netbound"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/testpki"
)

// serve runs s on a loopback listener, each connection in its own
// goroutine as the aggregator's port runs it, read on ready as its
// plaintext connections are (netbound.Ready); it returns the address.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	return serveOn(t, s, true)
}

// serveOn is serve, its connections read on ready or not.
func serveOn(t *testing.T, s *Server, ready bool) string {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pooled := netbound.NewPooled(tcp)
	ln := net.Listener(pooled)
	if !ready {
		ln = tcp
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.ServeConn(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.Close() })
	return ln.Addr().String()
}

// echo is a handler as the ingest's is shaped: a hello answered with a
// welcome, then an ack for every batch, until the agent's half-close.
// It reports what it saw on seen.
type seen struct {
	token string
	node  string
	err   error
}

func echo(out chan<- seen) func(pulsev1.Ingest_ReportServer) error {
	return func(st pulsev1.Ingest_ReportServer) error {
		var sn seen
		defer func() { out <- sn }()
		md, _ := metadata.FromIncomingContext(st.Context())
		if v := md.Get("authorization"); len(v) == 1 {
			sn.token = v[0]
		}
		first, err := st.Recv()
		if err != nil {
			sn.err = err
			return err
		}
		if first.GetHello() == nil {
			sn.err = status.Error(codes.InvalidArgument, "no hello")
			return sn.err
		}
		sn.node = first.GetHello().Node
		if sn.node == "refuse-me" {
			return status.Error(codes.PermissionDenied, "node refuse-me may not report")
		}
		if err := st.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{AggregatorVersion: "test"}}}); err != nil {
			return err
		}
		for {
			var m pulsev1.AgentMessage
			err := st.RecvMsg(&m)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				sn.err = err
				return err
			}
			if b := m.GetBatch(); b != nil {
				if err := st.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: b.Seq}}}); err != nil {
					return err
				}
			}
		}
	}
}

func hello(node string) *pulsev1.AgentMessage {
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: node, ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}
}

func batch(seq uint64, pods int) *pulsev1.AgentMessage {
	b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: 1}
	for i := range pods {
		b.Pods = append(b.Pods, uint32(i+1))
	}
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
}

func client(t *testing.T, addr string, o ClientOptions) *Client {
	t.Helper()
	c, err := NewClient(addr, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// say opens a plaintext stream and says hello as node.
func say(t *testing.T, addr, node string) grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage] {
	t.Helper()
	st, err := client(t, addr, ClientOptions{}).Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hello(node)); err != nil {
		t.Fatal(err)
	}
	return st
}

// open opens a stream, says hello as node and reads the welcome.
func open(ctx context.Context, t *testing.T, addr string, o ClientOptions, node string) grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage] {
	t.Helper()
	st, err := client(t, addr, o).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hello(node)); err != nil {
		t.Fatal(err)
	}
	if w, err := st.Recv(); err != nil || w.GetWelcome() == nil {
		t.Fatalf("welcome %v, %v", w, err)
	}
	return st
}

func TestAStreamRoundTripsAndEndsAtTheHalfClose(t *testing.T) {
	out := make(chan seen, 1)
	addr := serve(t, NewServer(echo(out), ServerOptions{}))
	st := say(t, addr, "node-a")
	w, err := st.Recv()
	if err != nil || w.GetWelcome().GetAggregatorVersion() != "test" {
		t.Fatalf("welcome %v, %v", w, err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if err := st.Send(batch(seq, 8)); err != nil {
			t.Fatal(err)
		}
		a, err := st.Recv()
		if err != nil || a.GetAck().GetSeq() != seq {
			t.Fatalf("ack %v, %v; want seq %d", a, err, seq)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the half-close: %v, want io.EOF (the handler's nil)", err)
	}
	if sn := <-out; sn.node != "node-a" || sn.err != nil || sn.token != "" {
		t.Fatalf("the handler saw %+v", sn)
	}
}

func TestTheHandlersErrorReachesTheAgentAsItsStatus(t *testing.T) {
	out := make(chan seen, 1)
	addr := serve(t, NewServer(echo(out), ServerOptions{}))
	st := say(t, addr, "refuse-me")
	_, err := st.Recv()
	if s, _ := status.FromError(err); s.Code() != codes.PermissionDenied || s.Message() != "node refuse-me may not report" {
		t.Fatalf("Recv: %v; want the handler's PermissionDenied", err)
	}
}

// tlsPair is a server configuration and a client one that trusts it.
func tlsPair(t *testing.T) (server, client *tls.Config) {
	ca := testpki.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, "aggregator", 2, x509.ExtKeyUsageServerAuth)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

func TestTheTokenTravelsInsideTLS(t *testing.T) {
	out := make(chan seen, 1)
	srvTLS, cliTLS := tlsPair(t)
	addr := serve(t, NewServer(echo(out), ServerOptions{TLS: srvTLS}))
	st := open(context.Background(), t, addr, ClientOptions{TLS: cliTLS, Token: func() (string, error) { return "tok-1", nil }}, "node-t")
	if err := st.Send(batch(1, 2)); err != nil {
		t.Fatal(err)
	}
	if a, err := st.Recv(); err != nil || a.GetAck().GetSeq() != 1 {
		t.Fatalf("ack %v, %v", a, err)
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the half-close: %v", err)
	}
	if sn := <-out; sn.token != "Bearer tok-1" || sn.node != "node-t" {
		t.Fatalf("the handler saw %+v; want the token as gRPC's authorization metadata", sn)
	}
}

func TestATokenNeedsTLS(t *testing.T) {
	if _, err := NewClient("127.0.0.1:1", ClientOptions{Token: func() (string, error) { return "t", nil }}); err == nil {
		t.Fatal("a client sending its token in plaintext was made")
	}
}

func TestAPortAndAnAgentThatDisagreeOnTLSSaySo(t *testing.T) {
	srvTLS, cliTLS := tlsPair(t)
	plain := serve(t, NewServer(echo(make(chan seen, 1)), ServerOptions{}))
	secure := serve(t, NewServer(echo(make(chan seen, 1)), ServerOptions{TLS: srvTLS}))
	for _, c := range []struct {
		addr string
		o    ClientOptions
		want string
	}{
		{plain, ClientOptions{TLS: cliTLS}, "serves plaintext"},
		{secure, ClientOptions{}, "serves TLS"},
	} {
		_, err := client(t, c.addr, c.o).Report(context.Background())
		if s, _ := status.FromError(err); s.Code() != codes.FailedPrecondition || !strings.Contains(s.Message(), c.want) {
			t.Errorf("Report: %v; want FailedPrecondition saying the port %s", err, c.want)
		}
	}
}

func TestAConnectionThatIsNotFramedIsRefusedWithAStatus(t *testing.T) {
	addr := serve(t, NewServer(echo(make(chan seen, 1)), ServerOptions{}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := io.WriteString(c, "pulse-framed/9 xyz\n"); err != nil {
		t.Fatal(err)
	}
	var h [headerLen]byte
	kind, n, err := readHeader(c, &h)
	if err != nil || kind != kindStatus {
		t.Fatalf("answer: kind %d, %v; want a status", kind, err)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c, p); err != nil {
		t.Fatal(err)
	}
	if s, _ := status.FromError(readStatus(p)); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "pulse-framed/1") {
		t.Fatalf("status %v", s)
	}
	if _, err := c.Read(p[:1]); !errors.Is(err, io.EOF) {
		t.Fatalf("after the status: %v; want the connection closed", err)
	}
}

func TestAMessagePastTheBoundIsRefusedAndNothingElse(t *testing.T) {
	out := make(chan seen, 2)
	addr := serve(t, NewServer(echo(out), ServerOptions{MaxMessage: 1 << 10}))
	// A stream beside it, open before and after: the bound ends only the
	// stream past it.
	other := open(context.Background(), t, addr, ClientOptions{}, "other")
	st := open(context.Background(), t, addr, ClientOptions{}, "big")
	if err := st.Send(batch(1, 2000)); err != nil { // about 4 KB
		t.Fatal(err)
	}
	_, err := st.Recv()
	if s, _ := status.FromError(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), "vs. 1024") {
		t.Fatalf("Recv: %v; want ResourceExhausted", err)
	}
	if sn := <-out; sn.node != "big" || status.Code(sn.err) != codes.ResourceExhausted {
		t.Fatalf("the handler saw %+v", sn)
	}
	if err := other.Send(batch(7, 1)); err != nil {
		t.Fatal(err)
	}
	if a, err := other.Recv(); err != nil || a.GetAck().GetSeq() != 7 {
		t.Fatalf("the other stream: %v, %v", a, err)
	}
}

func TestClosingTheServerEndsItsStreams(t *testing.T) {
	out := make(chan seen, 1)
	s := NewServer(echo(out), ServerOptions{})
	addr := serve(t, s)
	st := open(context.Background(), t, addr, ClientOptions{}, "node-c")
	s.Close() // returns once the handler has
	if sn := <-out; sn.err == nil {
		t.Fatal("the handler's stream did not end with an error")
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the agent's Recv: %v; want Unavailable", err)
	}
	if _, err := client(t, addr, ClientOptions{ConnectTimeout: time.Second}).Report(context.Background()); err == nil {
		t.Fatal("a stream opened on a closed server")
	}
}

func TestTheAgentsContextEndsItsStream(t *testing.T) {
	addr := serve(t, NewServer(echo(make(chan seen, 1)), ServerOptions{}))
	ctx, cancel := context.WithCancel(context.Background())
	st := open(ctx, t, addr, ClientOptions{}, "node-x")
	done := make(chan error, 1)
	go func() { _, err := st.Recv(); done <- err }() // blocked: no batch, no ack
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("Recv after the cancel: %v; want Canceled", err)
	}
}

func TestAnIdleConnectionEnds(t *testing.T) {
	out := make(chan seen, 1)
	addr := serve(t, NewServer(echo(out), ServerOptions{Idle: 50 * time.Millisecond}))
	st := open(context.Background(), t, addr, ClientOptions{}, "node-i")
	// Nothing sent: the handler's read ends, and the agent reads its status.
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Recv: %v; want Unavailable", err)
	}
	if sn := <-out; status.Code(sn.err) != codes.Unavailable {
		t.Fatalf("the handler saw %+v", sn)
	}
}

func TestAStreamPastItsAgeEndsAtItsNextMessage(t *testing.T) {
	out := make(chan seen, 1)
	addr := serve(t, NewServer(echo(out), ServerOptions{MaxAge: time.Nanosecond}))
	st := say(t, addr, "node-old")
	_, err := st.Recv()
	if s, _ := status.FromError(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "reconnect") {
		t.Fatalf("Recv: %v; want Unavailable, reconnect", err)
	}
}

func TestAnAggregatorThatIsNotThereIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if _, err := client(t, addr, ClientOptions{}).Report(context.Background()); status.Code(err) != codes.Unavailable {
		t.Fatalf("Report: %v; want Unavailable", err)
	}
}

// TestAnAggregatorWithoutTheTransportIsNamed: a port that serves gRPC
// alone (an aggregator of a version before this transport) answers the
// preface with HTTP/2's settings; the agent's error says what that likely
// is.
func TestAnAggregatorWithoutTheTransportIsNamed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	// The settings come at once; the timeout only bounds a wait for them.
	_, err = client(t, ln.Addr().String(), ClientOptions{ConnectTimeout: 5 * time.Second}).Report(context.Background())
	if s, _ := status.FromError(err); s.Code() != codes.FailedPrecondition || !strings.Contains(s.Message(), "--transport=grpc only") {
		t.Fatalf("Report to a gRPC-only port: %v; want FailedPrecondition naming --transport=grpc", err)
	}
}

// fallback is a Fallback client that records its streams.
type fallback struct{ reports atomic.Int32 }

var errFallback = errors.New("the fallback's stream")

func (f *fallback) Report(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage], error) {
	f.reports.Add(1)
	return nil, errFallback
}

// TestAnAggregatorWithoutTheTransportGetsTheFallback: a gRPC-only port, in
// plaintext (it answers with HTTP/2's settings) and with TLS (it closes at
// the preface, a bad TLS record), gets the stream on the Fallback, once a
// Report, each Report trying the framed transport first; a framed port,
// and one that cannot be reached, never do.
func TestAnAggregatorWithoutTheTransportGetsTheFallback(t *testing.T) {
	srvTLS, cliTLS := tlsPair(t)
	grpcPort := func(opts ...grpc.ServerOption) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(opts...)
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
		return ln.Addr().String()
	}
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = gone.Close()
	// A port that takes the connection and closes it at once, as an
	// aggregator of this version past its connections from an address
	// does: in plaintext, no sign of an older one (which answers with its
	// settings), so Unavailable, no fallback.
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closing.Close() })
	go func() {
		for {
			c, err := closing.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for _, c := range []struct {
		name, addr string
		tls        *tls.Config
		fallback   bool
		code       codes.Code // Report's, without the fallback
	}{
		{"a gRPC-only plaintext port", grpcPort(), nil, true, codes.OK},
		{"a gRPC-only TLS port", grpcPort(grpc.Creds(credentials.NewTLS(srvTLS))), cliTLS, true, codes.OK},
		{"a framed port", serve(t, NewServer(echo(make(chan seen, 4)), ServerOptions{})), nil, false, codes.OK},
		{"no port", gone.Addr().String(), nil, false, codes.Unavailable},
		{"a plaintext port that closes at once", closing.Addr().String(), nil, false, codes.Unavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fallback{}
			var told []error
			cl := client(t, c.addr, ClientOptions{TLS: c.tls, ConnectTimeout: 2 * time.Second, Fallback: f, OnFallback: func(err error) { told = append(told, err) }})
			for range 2 {
				st, err := cl.Report(context.Background())
				if st != nil {
					_ = st.CloseSend()
				}
				if c.fallback != errors.Is(err, errFallback) || !c.fallback && status.Code(err) != c.code {
					t.Fatalf("Report: %v; fallback wanted: %v (else %v)", err, c.fallback, c.code)
				}
			}
			if want := map[bool]int32{true: 2}[c.fallback]; f.reports.Load() != want || len(told) != int(want) {
				t.Fatalf("%d streams on the fallback, %d told (%v); want %d", f.reports.Load(), len(told), told, want)
			}
			for _, err := range told {
				if !strings.Contains(err.Error(), "--transport=grpc only") {
					t.Errorf("OnFallback was told %v; want it to say what the port likely is", err)
				}
			}
		})
	}
}

// sizes is a buffer pool that records the largest buffer asked of it and
// how many it gave and got back.
type sizes struct {
	mem.BufferPool
	largest, out atomic.Int64
}

func (p *sizes) Get(n int) *[]byte {
	for {
		l := p.largest.Load()
		if int64(n) <= l || p.largest.CompareAndSwap(l, int64(n)) {
			break
		}
	}
	p.out.Add(1)
	return p.BufferPool.Get(n)
}

func (p *sizes) Put(b *[]byte) {
	p.out.Add(-1)
	p.BufferPool.Put(b)
}

// acking is a handler that sends each batch's pod count to pods and acks
// it.
func acking(pods chan<- int) func(pulsev1.Ingest_ReportServer) error {
	return func(st pulsev1.Ingest_ReportServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				return err
			}
			if b := m.GetBatch(); b != nil {
				pods <- len(b.Pods)
				if err := st.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: b.Seq}}}); err != nil {
					return err
				}
			}
		}
	}
}

// A header declaring a message of MaxMessage held a buffer of that size,
// 4 MiB by default, for 5 bytes sent, until the idle bound. The payload is
// read in pieces as it comes: a header alone takes one piece, and a
// message of many pieces is decoded whole.
func TestAMessagesBytesAreHeldOnlyAsTheyCome(t *testing.T) {
	pool := &sizes{BufferPool: mem.DefaultBufferPool()}
	pods := make(chan int, 1)
	addr := serve(t, NewServer(acking(pods), ServerOptions{Pool: pool}))

	// Many pieces: 30,000 pods' ids are about 90 KB.
	st, err := client(t, addr, ClientOptions{}).Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	big := batch(1, 30000)
	if proto.Size(big) <= 2*readPiece {
		t.Fatalf("the batch is %d bytes, not three pieces", proto.Size(big))
	}
	if err := st.Send(big); err != nil {
		t.Fatal(err)
	}
	if n := <-pods; n != 30000 {
		t.Fatalf("the handler read %d pods of 30000", n)
	}
	if a, err := st.Recv(); err != nil || a.GetAck().GetSeq() != 1 {
		t.Fatalf("ack %v, %v", a, err)
	}
	if l := pool.largest.Load(); l != readPiece {
		t.Fatalf("the largest buffer taken: %d bytes; want a piece, %d", l, readPiece)
	}

	// A header alone, declaring 4 MiB, and 10 bytes.
	c := rawStream(t, addr)
	var h [headerLen]byte
	header(&h, kindMessage, DefaultMaxMessage)
	if _, err := c.Write(append(h[:], make([]byte, 10)...)); err != nil {
		t.Fatal(err)
	}
	// Wait for the server to hold its piece for it (the read ahead that
	// took the header and the 10 bytes is given back once they are
	// copied into it), then look.
	for t0 := time.Now(); pool.largest.Load() != readPiece || pool.out.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("for a header of 4 MiB and 10 bytes: the largest buffer %d bytes, %d held; want one piece of %d", pool.largest.Load(), pool.out.Load(), readPiece)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if l, o := pool.largest.Load(), pool.out.Load(); l != readPiece || o != 1 {
		t.Fatalf("for a header of 4 MiB and 10 bytes: the largest buffer %d bytes, %d held; want one piece of %d", l, o, readPiece)
	}
	// Its stream's end gives the piece back.
	_ = c.Close()
	for t0 := time.Now(); pool.out.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("the stream ended and %d pieces are still held: its piece was never given back", pool.out.Load())
		}
	}
}

// deadlines is a connection that records the write deadlines set on it.
type deadlines struct {
	net.Conn
	write chan time.Time
}

func (d *deadlines) note(t time.Time) {
	select {
	case d.write <- t:
	default:
	}
}

func (d *deadlines) SetDeadline(t time.Time) error {
	d.note(t)
	return d.Conn.SetDeadline(t)
}

func (d *deadlines) SetWriteDeadline(t time.Time) error {
	d.note(t)
	return d.Conn.SetWriteDeadline(t)
}

// With TLS a read may write (crypto/tls answers a peer's key update from
// within Read). The handshake cleared the write deadline and a read set
// only its own: such a write to a peer that reads nothing had no bound,
// and after a send the write deadline was its, long past. Each read sets
// the write deadline to the idle bound too.
func TestAReadBoundsTheWritesItMayMake(t *testing.T) {
	const idle = time.Hour
	out := make(chan seen, 1)
	s := NewServer(echo(out), ServerOptions{Idle: idle})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := make(chan time.Time, 16)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			s.ServeConn(&deadlines{Conn: c, write: d})
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.Close() })
	st := open(context.Background(), t, ln.Addr().String(), ClientOptions{}, "node-w")
	defer func() { _ = st.CloseSend() }()
	// The welcome was written with the write timeout's deadline; the read
	// after it sets the idle bound's.
	for {
		select {
		case w := <-d:
			if time.Until(w) > idle/2 {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no read after the welcome set a write deadline of the idle bound")
		}
	}
}

// gRPC spreads MaxConnectionAge by ±10 %: a replica's streams, all taken at
// its start, do not all end and reconnect at once every MaxAge.
func TestAStreamsAgeIsSpread(t *testing.T) {
	const age = time.Hour
	lo, hi := age, time.Duration(0)
	for range 1000 {
		j := jitter(age)
		if j < age-age/10 || j > age+age/10 {
			t.Fatalf("jitter(%s) = %s, beyond ±10 %%", age, j)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if hi-lo < age/10 {
		t.Fatalf("1,000 ages spread over %s only; want most of ±10 %% of %s", hi-lo, age)
	}
	if jitter(time.Nanosecond) != time.Nanosecond {
		t.Fatal("an age too short to spread is kept")
	}
}

// A stream the aggregator ended fails the agent's next sends; the status
// it ended with is the agent's to read, as gRPC's SendMsg returns io.EOF
// and RecvMsg the status. A failed write closed the connection, and the
// status was lost to "use of closed network connection".
func TestASendAfterTheStreamEndedLeavesItsStatusToRecv(t *testing.T) {
	out := make(chan seen, 1)
	addr := serve(t, NewServer(echo(out), ServerOptions{}))
	st := say(t, addr, "refuse-me")
	<-out // the handler has returned: its status is written, the connection closed
	deadline := time.Now().Add(10 * time.Second)
	for seq := uint64(1); ; seq++ {
		err := st.Send(batch(seq, 8))
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("Send after the stream's end: %v; want io.EOF", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("every send succeeded on a stream the aggregator ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err := st.Recv()
	if s, _ := status.FromError(err); s.Code() != codes.PermissionDenied || s.Message() != "node refuse-me may not report" {
		t.Fatalf("Recv: %v; want the handler's PermissionDenied", err)
	}
}

// The ingest port waits up to its handshake bound for a connection's first
// byte, and the framed handshake then had a bound of its own from then: a
// peer whose first byte came at the end of the wait held its place for
// twice the bound. ServeConnBy keeps the wait's deadline: one already past
// serves nothing, however complete the preface.
func TestAHandshakeDueBeforeItsStartServesNothing(t *testing.T) {
	out := make(chan seen, 1)
	s := NewServer(echo(out), ServerOptions{})
	defer s.Close()
	srv, cl := net.Pipe()
	defer func() { _ = cl.Close() }()
	done := make(chan struct{})
	go func() { s.ServeConnBy(srv, time.Now().Add(-time.Second)); close(done) }()
	go func() { _, _ = io.WriteString(cl, PrefaceTCP) }()
	var h [headerLen]byte
	if _, err := io.ReadFull(cl, h[:]); err == nil {
		t.Fatalf("answered %x past the handshake's deadline", h)
	}
	<-done
	select {
	case sn := <-out:
		t.Fatalf("the handler ran: %+v", sn)
	default:
	}
}

// TestAHeaderPastTwoGiBIsRefused: a header declaring 2^31 bytes or more is
// refused as it is read (ResourceExhausted), on every platform: on a
// 32-bit one it was a negative length past every bound, and the token's
// allocation panicked before any authentication.
func TestAHeaderPastTwoGiBIsRefused(t *testing.T) {
	for _, b := range [][]byte{{kindToken, 0x80, 0, 0, 0}, {kindMessage, 0xff, 0xff, 0xff, 0xff}} {
		var h [headerLen]byte
		kind, n, err := readHeader(bytes.NewReader(b), &h)
		if status.Code(err) != codes.ResourceExhausted || kind != b[0] || n != 0 {
			t.Errorf("%x: kind %d, %d bytes, %v; want the kind, 0 and ResourceExhausted", b, kind, n, err)
		}
	}
	var h [headerLen]byte
	if kind, n, err := readHeader(bytes.NewReader([]byte{kindMessage, 0x7f, 0xff, 0xff, 0xff}), &h); err != nil || kind != kindMessage || n != maxFrame {
		t.Errorf("2^31 - 1: kind %d, %d bytes, %v; want it read", kind, n, err)
	}
}

// TestAHugeFrameIsAnsweredByItsStagesBound: a header declaring 2^31 bytes
// or more where the token belongs closed the connection with no status,
// and one of any kind where a message belongs was answered ResourceExhausted
// naming 2^31 − 1 as the bound. Each is answered as a frame past the
// stage's own bound (16 KiB a token, the message size), its kind first.
func TestAHugeFrameIsAnsweredByItsStagesBound(t *testing.T) {
	addr := serve(t, NewServer(echo(make(chan seen, 4)), ServerOptions{MaxMessage: 1 << 10}))
	answer := func(c net.Conn) error {
		t.Helper()
		for {
			var h [headerLen]byte
			kind, n, err := readHeader(c, &h)
			if err != nil {
				t.Fatalf("no status: %v", err)
			}
			p := make([]byte, n)
			if _, err := io.ReadFull(c, p); err != nil {
				t.Fatal(err)
			}
			if kind == kindStatus {
				return readStatus(p)
			}
		}
	}
	dial := func(token bool) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, PrefaceTCP); err != nil {
			t.Fatal(err)
		}
		if token {
			if err := writeFrame(c, kindToken, nil); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		token  bool // a token sent first: the header is where a message belongs
		header []byte
		code   codes.Code
		says   string
	}{
		{"a token of 4 GiB", false, []byte{kindToken, 0xff, 0xff, 0xff, 0xff}, codes.InvalidArgument, "at most 16384"},
		{"a message of 2 GiB", true, []byte{kindMessage, 0x80, 0, 0, 0}, codes.ResourceExhausted, "vs. 1024"},
		{"a status of 2 GiB where a message belongs", true, []byte{kindStatus, 0x80, 0, 0, 0}, codes.InvalidArgument, "where a message belongs"},
	} {
		c := dial(tc.token)
		if _, err := c.Write(tc.header); err != nil {
			t.Fatal(err)
		}
		if s, _ := status.FromError(answer(c)); s.Code() != tc.code || !strings.Contains(s.Message(), tc.says) {
			t.Errorf("%s: %v; want %s saying %q", tc.name, s, tc.code, tc.says)
		}
	}
}

// TestAStreamTheServerClosesSeesItClosing: a stream that Close ends reads
// Canceled, "the server is closing" (the read's refusal looks at the
// stream's context for that). Close closed the connections before it
// cancelled the context, so the read failed first and the handler saw
// Unavailable, "use of closed network connection", every time.
func TestAStreamTheServerClosesSeesItClosing(t *testing.T) {
	for _, ready := range []bool{true, false} {
		out := make(chan seen, 1)
		s := NewServer(echo(out), ServerOptions{})
		addr := serveOn(t, s, ready)
		_ = open(context.Background(), t, addr, ClientOptions{}, "node-c")
		s.Close()
		if sn := <-out; status.Code(sn.err) != codes.Canceled {
			t.Fatalf("read on ready %v: the handler saw %v; want Canceled, the server closing", ready, sn.err)
		}
	}
}

// TestAStreamMidMessageTheServerClosesSeesItClosing: a stream whose
// message's header is read, its payload yet to come, ends Canceled too when
// Close ends it, as one waiting for a header does (found in a review: the
// payload's read said Unavailable, "use of closed network connection").
func TestAStreamMidMessageTheServerClosesSeesItClosing(t *testing.T) {
	for _, ready := range []bool{true, false} {
		out := make(chan seen, 1)
		pool := &asked{BufferPool: mem.DefaultBufferPool(), n: 1000, got: make(chan struct{})}
		s := NewServer(echo(out), ServerOptions{Pool: pool})
		addr := serveOn(t, s, ready)
		c := rawStream(t, addr)
		var h [headerLen]byte
		b, _ := proto.Marshal(hello("node-p"))
		if err := writeFrame(c, kindMessage, b); err != nil {
			t.Fatal(err)
		}
		kind, n, err := readHeader(c, &h) // the welcome
		if err != nil || kind != kindMessage {
			t.Fatalf("welcome %x, %v", h, err)
		}
		if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		header(&h, kindMessage, 1000)
		if _, err := c.Write(append(h[:], make([]byte, 10)...)); err != nil {
			t.Fatal(err)
		}
		<-pool.got // the handler is in its payload's read, of the other 990
		s.Close()
		if sn := <-out; status.Code(sn.err) != codes.Canceled {
			t.Errorf("ready %v: mid-payload, the handler saw %v; want Canceled, the server closing", ready, sn.err)
		}
	}
}

// asked is a pool that closes got when a buffer of n bytes is asked of
// it: a message's payload of n bytes about to be read.
type asked struct {
	mem.BufferPool
	n    int
	once sync.Once
	got  chan struct{}
}

func (p *asked) Get(n int) *[]byte {
	if n == p.n {
		p.once.Do(func() { close(p.got) })
	}
	return p.BufferPool.Get(n)
}
