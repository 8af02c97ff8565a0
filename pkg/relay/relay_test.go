package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/ingest"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/testpki"
)

// aggregator is an ingest server on loopback that answers a hello with a
// welcome naming the stream's node and each batch with an ack, and records
// what each stream carried; refuse, when set, ends a stream with that error
// at its hello. As pkg/ingest, it says it has reviewed a stream's token
// (ReviewedKey) before it reads the hello, unless old.
type aggregator struct {
	pulsev1.UnimplementedIngestServer
	addr   string
	conns  atomic.Int64 // connections accepted
	mu     sync.Mutex
	md     []metadata.MD
	ended  []error
	refuse error
	// hold, when set, holds each hello's welcome until it is closed;
	// hellos counts the hellos read.
	hold   chan struct{}
	hellos atomic.Int64
	srv    *grpc.Server
	// old: it says nothing before its welcome (an aggregator before
	// ReviewedKey). review, when set, is each stream's review: its error
	// refuses the stream (nil: reviewed), taken before the header.
	old    bool
	review chan error
}

func startAggregator(t testing.TB, streamsPerConn uint32) *aggregator {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &aggregator{addr: ln.Addr().String()}
	a.srv = grpc.NewServer(grpc.MaxConcurrentStreams(streamsPerConn))
	pulsev1.RegisterIngestServer(a.srv, a)
	go func() { _ = a.srv.Serve(countingListener{ln, &a.conns}) }()
	t.Cleanup(a.srv.Stop)
	return a
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func (a *aggregator) Report(s pulsev1.Ingest_ReportServer) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	a.mu.Lock()
	a.md = append(a.md, md)
	refuse, old, review := a.refuse, a.old, a.review
	a.mu.Unlock()
	var err error
	if review != nil {
		err = <-review
	}
	if err == nil && !old {
		err = s.SendHeader(metadata.Pairs(ReviewedKey, "1"))
	}
	if err == nil {
		err = a.serve(s, refuse)
	}
	a.mu.Lock()
	a.ended = append(a.ended, err)
	a.mu.Unlock()
	return err
}

func (a *aggregator) serve(s pulsev1.Ingest_ReportServer, refuse error) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var out *pulsev1.AggregatorMessage
		switch {
		case m.GetHello() != nil:
			a.hellos.Add(1)
			if refuse != nil {
				return refuse
			}
			if a.hold != nil {
				<-a.hold
			}
			out = &pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{AggregatorVersion: "for " + m.GetHello().Node}}}
		case m.GetBatch() != nil:
			out = &pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: m.GetBatch().Seq}}}
		default:
			continue
		}
		if err := s.Send(out); err != nil {
			return err
		}
	}
}

func (a *aggregator) streams() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.md)
}

// dns resolves every name to its addresses, which a test may change.
type dns struct {
	mu      sync.Mutex
	addrs   map[string][]string
	lookups atomic.Int32
}

func (d *dns) LookupHost(_ context.Context, host string) ([]string, error) {
	d.lookups.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	ips, ok := d.addrs[host]
	if !ok || len(ips) == 0 { // as net.Resolver: a name with no address is an error
		return nil, fmt.Errorf("no such host %s", host)
	}
	return ips, nil
}

// set sets the aggregators' name's addresses.
func (d *dns) set(ips ...string) {
	d.mu.Lock()
	d.addrs["aggregator"] = ips
	d.mu.Unlock()
}

// relayAt is a relay's address and what an agent dials it with.
type relayAt struct {
	addr  string
	creds credentials.TransportCredentials
}

// startRelay serves a relay for aggregators named "aggregator:PORT" on
// loopback: with TLS to the agents when cfg.Secure (which stands for the
// aggregators' side too: the stand-in replicas are plaintext).
func startRelay(t testing.TB, cfg Config) (*Relay, relayAt) {
	t.Helper()
	if cfg.ResolveInterval == 0 {
		cfg.ResolveInterval = time.Hour
	}
	if cfg.StreamsPerConnection == 0 {
		cfg.StreamsPerConnection = 100
	}
	if cfg.Transport == nil {
		cfg.Transport = func(string) credentials.TransportCredentials { return insecure.NewCredentials() }
	}
	r := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := relayAt{addr: ln.Addr().String(), creds: insecure.NewCredentials()}
	opts := r.ServerOptions()
	if cfg.Secure {
		ca := testpki.NewCA(t)
		crt, key := ca.Issue(t, "pulse-relay", 1, x509.ExtKeyUsageServerAuth)
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(ca.PEM)
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})))
		at.creds = credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	}
	srv := grpc.NewServer(opts...)
	go func() { _ = srv.Serve(r.Track(ln)) }()
	t.Cleanup(func() { srv.Stop(); cancel(); <-done })
	return r, at
}

// agentStream opens a Report stream through the relay at for upstream
// (none when empty), with md added.
func agentStream(ctx context.Context, t testing.TB, at relayAt, upstream string, md ...string) pulsev1.Ingest_ReportClient {
	t.Helper()
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if upstream != "" {
		md = append(md, UpstreamKey, upstream)
	}
	s, err := pulsev1.NewIngestClient(conn).Report(metadata.AppendToOutgoingContext(ctx, md...))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func hello(node string) *pulsev1.AgentMessage {
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: node, ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}
}

func batch(seq uint64) *pulsev1.AgentMessage {
	return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: seq, Pods: []uint32{1, 2}, Values: []int64{5, -3}}}}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestAStreamIsForwardedBothWays: what an agent sends reaches the replica
// it names, and the replica's answers reach the agent, message by message;
// the agent's token goes with it, its other metadata and the relay's key
// do not;
// the agent closing its side ends the replica's stream as it would end it
// directly.
func TestAStreamIsForwardedBothWays(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	reg := prometheus.NewRegistry()
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, Secure: true, Registerer: reg})
	s := agentStream(context.Background(), t, at, agg.addr, "authorization", "Bearer node-1-token", "x-tenant", "other")
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil || m.GetWelcome().GetAggregatorVersion() != "for node-1" {
		t.Fatalf("welcome: %v, %v", m, err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if err := s.Send(batch(seq)); err != nil {
			t.Fatal(err)
		}
		m, err := s.Recv()
		if err != nil || !proto.Equal(m, &pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: seq}}}) {
			t.Fatalf("ack %d: %v, %v", seq, m, err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the agent closed its side: %v, want the stream ended cleanly", err)
	}
	agg.mu.Lock()
	md, ended := agg.md[0], agg.ended
	agg.mu.Unlock()
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer node-1-token" {
		t.Errorf("the replica got authorization %q", got)
	}
	if got := md.Get(UpstreamKey); len(got) != 0 {
		t.Errorf("the relay's key reached the replica: %q", got)
	}
	if got := md.Get("x-tenant"); len(got) != 0 {
		t.Errorf("metadata other than the token reached the replica: %q", got)
	}
	if len(ended) != 1 || ended[0] != nil {
		t.Errorf("the replica's stream ended with %v", ended)
	}
	messagesAre(t, reg, 4, 4)
}

// messagesAre checks pulse_relay_messages_total's two series.
func messagesAre(t *testing.T, reg prometheus.Gatherer, toAgent, toAggregator int) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP pulse_relay_messages_total Messages forwarded, by direction (to_aggregator, to_agent).
# TYPE pulse_relay_messages_total counter
pulse_relay_messages_total{direction="to_agent"} %d
pulse_relay_messages_total{direction="to_aggregator"} %d
`, toAgent, toAggregator)), "pulse_relay_messages_total"); err != nil {
		t.Error(err)
	}
}

// TestStreamsTheRelayRefuses: a stream that names no replica, one that
// names an address the relay does not resolve from its aggregators (it
// would be an open proxy), another method, and a token over a plaintext
// relay: each is refused, saying why, and none reaches a replica.
func TestStreamsTheRelayRefuses(t *testing.T) {
	agg := startAggregator(t, 100)
	other := startAggregator(t, 100) // a server that is not an aggregator the relay knows
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	reg := prometheus.NewRegistry()
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, Registerer: reg})
	for _, c := range []struct {
		name, upstream string
		md             []string
		code           codes.Code
		says           string
	}{
		{"no replica named", "", nil, codes.InvalidArgument, "names no aggregator replica"},
		{"not an aggregator", other.addr, nil, codes.Unavailable, "is not an aggregator replica this relay resolves"},
		{"a token in plaintext", agg.addr, []string{"authorization", "Bearer x"}, codes.FailedPrecondition, "carries a token over plaintext"},
	} {
		s := agentStream(context.Background(), t, at, c.upstream, c.md...)
		_ = s.Send(hello("node-1"))
		_, err := s.Recv()
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %s saying %q", c.name, err, c.code, c.says)
		}
	}
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	err = conn.Invoke(metadata.AppendToOutgoingContext(context.Background(), UpstreamKey, agg.addr), "/grpc.health.v1.Health/Check", &Frame{}, &Frame{}, grpc.ForceCodec(Codec{}))
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("another method: %v, want Unimplemented", err)
	}
	if agg.streams() != 0 || other.streams() != 0 {
		t.Fatalf("refused streams reached a server: %d and %d", agg.streams(), other.streams())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP pulse_relay_refused_streams_total Agent streams refused, by reason.
# TYPE pulse_relay_refused_streams_total counter
pulse_relay_refused_streams_total{reason="agent_not_reading"} 0
pulse_relay_refused_streams_total{reason="agent_not_sending"} 0
pulse_relay_refused_streams_total{reason="closing"} 0
pulse_relay_refused_streams_total{reason="hello_too_large"} 0
pulse_relay_refused_streams_total{reason="hello_wait"} 0
pulse_relay_refused_streams_total{reason="method"} 1
pulse_relay_refused_streams_total{reason="no_upstream"} 1
pulse_relay_refused_streams_total{reason="plaintext_token"} 1
pulse_relay_refused_streams_total{reason="replica_streams"} 0
pulse_relay_refused_streams_total{reason="unknown_upstream"} 1
pulse_relay_refused_streams_total{reason="upstream_full"} 0
pulse_relay_refused_streams_total{reason="upstream_unavailable"} 0
`), "pulse_relay_refused_streams_total"); err != nil {
		t.Error(err)
	}
	// Nothing was forwarded, and each direction says so from the start (a
	// series made at its first message had no 0 for rate() to start from).
	messagesAre(t, reg, 0, 0)
}

// TestBadBytesEndOnlyTheirStream: the relay decodes nothing, so bytes that
// are no message reach the replica, whose gRPC refuses them and ends that
// stream, saying so; another agent's stream on the same connection goes
// on.
func TestBadBytesEndOnlyTheirStream(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	good := agentStream(context.Background(), t, at, agg.addr)
	if err := good.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := good.Recv(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	bad, err := conn.NewStream(metadata.AppendToOutgoingContext(context.Background(), UpstreamKey, agg.addr),
		&grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, reportMethod, grpc.ForceCodec(Codec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.SendMsg(&Frame{b: []byte{0xff, 0xff, 0xff, 0xff}}); err != nil {
		t.Fatal(err)
	}
	if err := bad.RecvMsg(&Frame{}); status.Code(err) == codes.OK || !strings.Contains(err.Error(), "unmarshal") {
		t.Fatalf("bytes that are no message: %v, want the replica's refusal", err)
	}
	if err := good.Send(batch(7)); err != nil {
		t.Fatal(err)
	}
	if m, err := good.Recv(); err != nil || m.GetAck().GetSeq() != 7 {
		t.Fatalf("the other stream after the bad one: %v, %v", m, err)
	}
}

// TestTheReplicasAnswerReachesTheAgent: a replica's refusal (an agent
// reporting for another node, say) reaches the agent with its code and
// message, as it would directly.
func TestTheReplicasAnswerReachesTheAgent(t *testing.T) {
	agg := startAggregator(t, 100)
	agg.refuse = status.Error(codes.PermissionDenied, "the token is bound to node-2")
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	s := agentStream(context.Background(), t, at, agg.addr)
	_ = s.Send(hello("node-1"))
	if _, err := s.Recv(); status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "the token is bound to node-2" {
		t.Fatalf("%v, want the replica's own refusal", err)
	}
}

// TestStreamsShareConnections: streams to one replica share connections,
// at most StreamsPerConnection each; a connection left with no stream is
// closed, but a replica's last is kept. An agent that goes away ends its
// stream at the replica.
func TestStreamsShareConnections(t *testing.T) {
	agg := startAggregator(t, 2)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	reg := prometheus.NewRegistry()
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, StreamsPerConnection: 2, Registerer: reg})
	var cancels []context.CancelFunc
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		s := agentStream(ctx, t, at, agg.addr)
		if err := s.Send(hello(fmt.Sprintf("node-%d", i))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if n := agg.conns.Load(); n != 3 {
		t.Errorf("5 streams at 2 a connection took %d connections at the replica, want 3", n)
	}
	if got := float64(r.connections()); got != 3 {
		t.Errorf("connections gauge %v, want 3", got)
	}
	if got := testutil.ToFloat64(r.m.streams); got != 5 {
		t.Errorf("streams gauge %v, want 5", got)
	}
	for _, c := range cancels {
		c()
	}
	eventually(t, "every stream ended at the replica, one connection kept", func() error {
		agg.mu.Lock()
		ended := len(agg.ended)
		agg.mu.Unlock()
		if ended != 5 || testutil.ToFloat64(r.m.streams) != 0 || float64(r.connections()) != 1 {
			return fmt.Errorf("%d ended, streams %v, connections %v", ended, testutil.ToFloat64(r.m.streams), float64(r.connections()))
		}
		return nil
	})
}

// TestAReplicaGoneEndsItsStreams: a replica the agent resolved before
// the relay did is looked up at once; a replica the name no longer
// resolves to (a pod replaced: the name gives another address) loses its
// connections at the next timed pass, and the streams on them end, as a
// direct stream to a replica that went away does. A lookup that fails
// keeps the addresses (a DNS hiccup cuts nothing).
func TestAReplicaGoneEndsItsStreams(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.2"}}}
	// An hour between timed passes: what is resolved below is the
	// stream's own lookup.
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	eventually(t, "resolved", func() error {
		if !r.Ready() {
			return errors.New("not ready")
		}
		return nil
	})
	d.set("127.0.0.2", "127.0.0.1")
	s := agentStream(context.Background(), t, at, agg.addr)
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("a replica looked up at once: %v", err)
	}
	d.set() // no address: the lookup fails, and nothing is cut
	r.resolve(context.Background(), true)
	if r.connections() != 1 {
		t.Fatalf("a failed lookup cut the replica's connection (%d open)", r.connections())
	}
	d.set("127.0.0.2") // the replica replaced
	// One answer without it (a readiness blip takes a replica out of the
	// headless Service's endpoints for a moment) cuts nothing; a second
	// in a row does.
	r.resolve(context.Background(), true)
	if r.connections() != 1 {
		t.Fatalf("one answer without the replica cut its connection (%d open)", r.connections())
	}
	r.resolve(context.Background(), true)
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the replica gone: %v, want Unavailable", err)
	}
	if r.connections() != 0 {
		t.Fatalf("%d connections left to a replica gone", r.connections())
	}
}

// TestAReplicaThatLetsFewerStreamsOpen: an aggregator whose
// --max-ingest-streams-per-connection is below the relay's
// --streams-per-connection: the stream past its bound, which would wait
// for ever, is refused after StreamWait, saying why, and the connection is
// marked full, so that the agent's next try gets a connection of its own.
func TestAReplicaThatLetsFewerStreamsOpen(t *testing.T) {
	agg := startAggregator(t, 2)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	// The wait covers a new connection's dial too (200 ms was near a
	// race under -race).
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, StreamsPerConnection: 5, StreamWait: time.Second})
	open := func() error {
		s := agentStream(context.Background(), t, at, agg.addr)
		if err := s.Send(hello("node")); err != nil {
			return err
		}
		_, err := s.Recv()
		return err
	}
	for i := range 2 {
		if err := open(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if err := open(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--max-ingest-streams-per-connection") {
		t.Fatalf("the third stream on a connection the replica holds to 2: %v, want Unavailable naming the flag", err)
	}
	if err := open(); err != nil {
		t.Fatalf("the next try: %v", err)
	}
	if n := agg.conns.Load(); n != 2 {
		t.Fatalf("%d connections at the replica, want 2", n)
	}
}

// TestOptionsValidate: bad flags are errors that name them.
func TestOptionsValidate(t *testing.T) {
	o := NewOptions()
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--aggregator is required") {
		t.Fatalf("no aggregator: %v", err)
	}
	o.Aggregators = []string{"pulse-aggregator-ingest.pulse-system:9091"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	o.Aggregators = append(o.Aggregators, "no-port")
	o.StreamsPerConnection, o.TLSCertFile, o.ShutdownDelay = 0, "tls.crt", 2*time.Minute
	err := o.Validate()
	for _, want := range []string{`--aggregator "no-port"`, "--streams-per-connection", "--tls-cert-file and --tls-key-file", "--shutdown-delay 2m0s: from 0 to 1m"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want it to say %q", err, want)
		}
	}
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNothingButTheHelloBeforeTheWelcome: the aggregator reads nothing of
// a stream before it has reviewed its token, and the relay read on: a
// message of up to 4 MiB queued to the replica and another held, for each
// stream a client opened with a token no one had reviewed. Until the
// replica's first answer only the agent's first message is forwarded; the
// rest follow it.
func TestNothingButTheHelloBeforeTheWelcome(t *testing.T) {
	agg := startAggregator(t, 100)
	agg.hold = make(chan struct{})
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	s := agentStream(context.Background(), t, at, agg.addr)
	for _, m := range []*pulsev1.AgentMessage{hello("node-1"), batch(1), batch(2)} {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	toAgg := r.m.messages.WithLabelValues("to_aggregator")
	eventually(t, "the hello forwarded", func() error {
		if agg.hellos.Load() != 1 || testutil.ToFloat64(toAgg) < 1 {
			return errors.New("no hello at the replica, or not counted yet")
		}
		return nil
	})
	// Not proof of a negative, but a relay that read on forwards the
	// batches within microseconds.
	for range 20 {
		if n := testutil.ToFloat64(toAgg); n != 1 {
			t.Fatalf("%v messages forwarded before the replica answered; want the hello alone", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(agg.hold)
	if w, err := s.Recv(); err != nil || w.GetWelcome() == nil {
		t.Fatalf("welcome: %v, %v", w, err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if a, err := s.Recv(); err != nil || a.GetAck().GetSeq() != seq {
			t.Fatalf("ack %d: %v, %v", seq, a, err)
		}
	}
}

// TestTheAgentsOwnFailureIsItsStatus: a message past the relay's bound
// failed the relay's read of the agent, which cut the replica's stream,
// and the agent was told the replica was unavailable (and sent the same
// message again, for ever). It is told what a direct stream would have
// said: ResourceExhausted, the message larger than the bound.
func TestTheAgentsOwnFailureIsItsStatus(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	s := agentStream(context.Background(), t, at, agg.addr)
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if w, err := s.Recv(); err != nil || w.GetWelcome() == nil {
		t.Fatalf("welcome: %v, %v", w, err)
	}
	big := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1, Values: make([]int64, 5<<20)}}}
	_ = s.Send(big)
	_, err := s.Recv()
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
		t.Fatalf("Recv after a message past the bound: %v; want ResourceExhausted, larger than max", err)
	}
}

// flooder is a replica that, at an agent's first batch, sends six
// messages of 60 KiB and ends its stream.
type flooder struct {
	pulsev1.UnimplementedIngestServer
	ended chan struct{}
}

func (f *flooder) Report(s pulsev1.Ingest_ReportServer) error {
	defer close(f.ended)
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		if m.GetHello() != nil {
			if err := s.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{}}}); err != nil {
				return err
			}
			continue
		}
		for range 6 {
			big := &pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{AggregatorVersion: strings.Repeat("x", 60<<10)}}}
			if err := s.Send(big); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestAnAgentThatStopsReadingEndsItsStream: the relay sent the replica's
// messages to the agent with a send that, once the agent stopped reading
// (its window full), waited until the stream ended, which, with the
// relay's handler waiting in it, was never: the replica's stream ended
// (its slot freed at the aggregator) and the relay kept the stream, its
// goroutine, its queued messages and its place on the shared upstream
// connection for as long as the agent's connection stayed open. Past
// AgentSendWait the stream ends.
func TestAnAgentThatStopsReadingEndsItsStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flooder{ended: make(chan struct{})}
	srv := grpc.NewServer()
	pulsev1.RegisterIngestServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	reg := prometheus.NewRegistry()
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(ln.Addr().String())}, Resolver: d, Registerer: reg, AgentSendWait: 300 * time.Millisecond})
	// The agent's window fixed at 64 KiB (no growth from reading): it
	// reads the welcome, sends a batch, and reads nothing more.
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s, err := pulsev1.NewIngestClient(conn).Report(metadata.AppendToOutgoingContext(context.Background(), UpstreamKey, ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("welcome: %v", err)
	}
	if err := s.Send(batch(1)); err != nil {
		t.Fatal(err)
	}
	<-f.ended
	eventually(t, "the relay's stream ended, and its place on the upstream connection given back", func() error {
		if n := testutil.ToFloat64(r.m.streams); n != 0 {
			return fmt.Errorf("%v streams forwarded", n)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, u := range r.upstreams {
			u.mu.Lock()
			held := 0
			for _, c := range u.conns {
				held += c.streams
			}
			u.mu.Unlock()
			if held != 0 {
				return fmt.Errorf("%d streams held on the upstream connections", held)
			}
		}
		return nil
	})
	if n := testutil.ToFloat64(r.m.refused.WithLabelValues("agent_not_reading")); n != 1 {
		t.Fatalf("agent_not_reading %v, want 1", n)
	}
}

// TestAFirstMessagePastAHellosBoundIsRefused: the relay forwards a
// stream's first message before the replica has reviewed its token, and
// one of up to 4 MiB was queued to the replica and held there for the
// review (seconds), for every stream a client opened with any token: 8
// connections of 32 streams from one address held about 1 GiB of a relay
// limited to 512Mi. A first message past a hello's bound is refused, and
// nothing of it reaches the replica.
func TestAFirstMessagePastAHellosBoundIsRefused(t *testing.T) {
	agg := startAggregator(t, 100)
	agg.hold = make(chan struct{})
	defer close(agg.hold)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	s := agentStream(context.Background(), t, at, agg.addr)
	big := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1, Values: make([]int64, 3<<20/8)}}}
	if err := s.Send(big); err != nil {
		t.Fatal(err)
	}
	endsWith(t, s, codes.InvalidArgument, "a hello is at most")
	if n := testutil.ToFloat64(r.m.messages.WithLabelValues("to_aggregator")); n != 0 {
		t.Fatalf("%v messages forwarded to the replica; want none", n)
	}
	wantRefused(t, r, "hello_too_large", 1)
	// A hello within the bound goes on as before.
	s = agentStream(context.Background(), t, at, agg.addr)
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hello forwarded", func() error {
		if agg.hellos.Load() != 1 {
			return errors.New("no hello at the replica")
		}
		return nil
	})
}

// TestEveryRefusalsReasonIsCountedFromTheStart: each reason the relay
// counts a refusal under has its series, at 0, from the relay's start
// (hello_too_large had none until the first such refusal: a rate over it,
// or an alert on it, saw nothing).
func TestEveryRefusalsReasonIsCountedFromTheStart(t *testing.T) {
	src, err := os.ReadFile("relay.go")
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`refused\.WithLabelValues\("([a-z_]+)"\)`).FindAllStringSubmatch(string(src), -1)
	if len(used) == 0 {
		t.Fatal("no refusal counted in relay.go: the pattern is out of date")
	}
	reg := prometheus.NewRegistry()
	New(Config{Registerer: reg})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "pulse_relay_refused_streams_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					have[l.GetValue()] = m.GetCounter().GetValue() == 0
				}
			}
		}
	}
	for _, u := range used {
		if !have[u[1]] {
			t.Errorf("reason %q is counted, but has no series at 0 at the start", u[1])
		}
	}
}

// TestAnAddressThatIsNoneSpendsNoLookup: a stream naming no address
// (pulse-upstream "x") made the relay look its aggregators up again, the
// one lookup a second a replica not resolved yet waits on: a client naming
// one each second kept a new replica's streams refused until the timed
// pass. It is refused with no lookup; an address not known yet still
// makes one.
func TestAnAddressThatIsNoneSpendsNoLookup(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	refused := func(upstream string) {
		t.Helper()
		s := agentStream(context.Background(), t, at, upstream)
		_ = s.Send(hello("node-1"))
		if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("%s: %v, want Unavailable", upstream, err)
		}
	}
	for d.lookups.Load() == 0 { // the relay's first pass
		time.Sleep(time.Millisecond)
	}
	before := d.lookups.Load()
	refused("x")
	if n := d.lookups.Load() - before; n != 0 {
		t.Fatalf("a stream naming no address made %d lookups", n)
	}
	refused("127.0.0.1:1")
	if n := d.lookups.Load() - before; n != 1 {
		t.Fatalf("a stream naming an address not known made %d lookups, want 1", n)
	}
}

// TestAFirstMessageIsReadOnlyOnceTheReplicaReviewedTheStream: read before
// the replica had reviewed the stream's token, an agent's first message
// declared of 4 MiB and never finished held its 4 MiB here (gRPC's window
// grows to a message's length as it is read) until the replica ended the
// stream: 1 GiB from one address (8 connections of 32 streams). The relay
// reads it only once the replica says it reviewed the token; one that
// refuses the token ends the stream with nothing of it read.
func TestAFirstMessageIsReadOnlyOnceTheReplicaReviewedTheStream(t *testing.T) {
	// Only the replica's answer lets the relay read (a fresh relay does
	// not know the replica sends ReviewedKey, and would read after a
	// second: the test's own waits come near it).
	defer func(d time.Duration) { unreviewedWait = d }(unreviewedWait)
	unreviewedWait = time.Hour
	agg := startAggregator(t, 100)
	agg.review = make(chan error, 1)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	s := agentStream(context.Background(), t, at, agg.addr)
	big := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1, Values: make([]int64, 3<<20/8)}}}
	go func() { _ = s.Send(big) }() // blocks on the relay's window, unread
	eventually(t, "the stream at the replica", func() error {
		if agg.streams() == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	// Read, it would be refused for its size (the relay does not wait).
	for i := 0; i < 50 && testutil.ToFloat64(r.m.refused.WithLabelValues("hello_too_large")) == 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	agg.review <- status.Error(codes.Unauthenticated, "a made-up token")
	if _, err := s.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Recv: %v; want the replica's refusal of the token, the first message unread", err)
	}
	wantRefused(t, r, "hello_too_large", 0) // the first message was not read before the review
	if n := testutil.ToFloat64(r.m.messages.WithLabelValues("to_aggregator")); n != 0 {
		t.Fatalf("%v messages forwarded to the replica; want none", n)
	}
}

// headerStream is a stream to a replica whose Header answers md at once
// (nil: the stream ended without headers, a refusal).
type headerStream struct {
	grpc.ClientStream
	md metadata.MD
}

func (s headerStream) Header() (metadata.MD, error) { return s.md, nil }

// TestAReplicaThatEndsTheStreamFirstStopsTheRead: awaitReview answers as
// soon as the replica's side answers, the waits an hour. A stream the
// replica ended with no headers (its refusal of the token) is not read
// on: it was, and the agent's first message past the hello's bound was
// read whole and refused as too large, the agent told InvalidArgument
// where the replica said Unauthenticated. A refusal says nothing of
// whether the replica sends ReviewedKey; headers do.
func TestAReplicaThatEndsTheStreamFirstStopsTheRead(t *testing.T) {
	r := &Relay{unreviewedWait: time.Hour, cfg: Config{HelloWait: 2 * time.Hour}}
	for _, c := range []struct {
		name        string
		known       bool
		md          metadata.MD
		read, after bool // awaitReview's answer; reviewsFirst after it
	}{
		{"ended, the replica not known to send the header", false, nil, false, false},
		{"ended, the replica known to send it", true, nil, false, true},
		{"reviewed", false, metadata.Pairs(ReviewedKey, "1"), true, true},
		{"headers without the key", true, metadata.Pairs("x", "1"), true, false},
	} {
		u := &upstream{}
		u.reviewsFirst.Store(c.known)
		if got := r.awaitReview(context.Background(), headerStream{md: c.md}, u); got != c.read {
			t.Errorf("%s: awaitReview %v, want %v", c.name, got, c.read)
		}
		if got := u.reviewsFirst.Load(); got != c.after {
			t.Errorf("%s: known to send the header %v, want %v", c.name, got, c.after)
		}
	}
}

// TestAFirstMessageNotWholeWithinTheHelloWaitEndsTheStream: a stream
// whose first message does not arrive whole within the HelloWait (with
// --agent-auth=none nothing else ends it) is ended, saying so.
func TestAFirstMessageNotWholeWithinTheHelloWaitEndsTheStream(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	// The wait holds the replica's review and the hello's read too (200
	// ms was near a race under -race).
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, HelloWait: time.Second})
	s := agentStream(context.Background(), t, at, agg.addr) // sends nothing
	endsWith(t, s, codes.DeadlineExceeded, "did not arrive whole")
	wantRefused(t, r, "hello_wait", 1)
	welcomed(t, at, agg.addr) // a hello in time goes on
}

// endsWith: s's next Recv ends it with code, saying says.
func endsWith(t *testing.T, s pulsev1.Ingest_ReportClient, code codes.Code, says string) {
	t.Helper()
	_, err := s.Recv()
	if st, _ := status.FromError(err); st.Code() != code || !strings.Contains(st.Message(), says) {
		t.Fatalf("Recv: %v; want %s saying %q", err, code, says)
	}
}

// wantRefused: r has refused n streams for reason.
func wantRefused(t *testing.T, r *Relay, reason string, n float64) {
	t.Helper()
	if got := testutil.ToFloat64(r.m.refused.WithLabelValues(reason)); got != n {
		t.Fatalf("refused %s %v, want %v", reason, got, n)
	}
}

// welcomed: a stream through at to the replica at addr has its hello
// answered with a welcome.
func welcomed(t *testing.T, at relayAt, addr string) {
	t.Helper()
	s := agentStream(context.Background(), t, at, addr)
	if err := s.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("a hello: %v, %v; want its welcome", m, err)
	}
}

// TestAReplicaThatSaysNothingBeforeItsWelcomeIsStillForwarded: a replica
// older than ReviewedKey says nothing before its welcome, which it sends
// after the hello: the relay reads the hello after unreviewedWait, and
// the stream goes on.
func TestAReplicaThatSaysNothingBeforeItsWelcomeIsStillForwarded(t *testing.T) {
	defer func(d time.Duration) { unreviewedWait = d }(unreviewedWait)
	unreviewedWait = 20 * time.Millisecond
	agg := startAggregator(t, 100)
	agg.old = true
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	welcomed(t, at, agg.addr)
}

// TestOneSlowReviewLeavesTheReplicaKnown: a review slow past half the
// HelloWait (the API server's, under load) took the replica as one that
// does not review first, and every stream to it then had its first
// message read a second after it opened, before its review (4 MiB held a
// stream). The slow stream's hello is read; the replica stays known until
// a stream's headers come without the header.
func TestOneSlowReviewLeavesTheReplicaKnown(t *testing.T) {
	agg := startAggregator(t, 100)
	agg.review = make(chan error, 1)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	// The slow stream's hello is read between half the wait and the
	// wait: 3 s for it (1 s was near a race under -race).
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, HelloWait: 6 * time.Second})
	agg.review <- nil
	welcomed(t, at, agg.addr)
	u, _ := r.upstreamFor(context.Background(), agg.addr)
	eventually(t, "a reviewed stream's header: the replica known to review first", func() error {
		if !u.reviewsFirst.Load() {
			return errors.New("not known to review first")
		}
		return nil
	})
	before := testutil.ToFloat64(r.m.messages.WithLabelValues("to_aggregator"))
	s := agentStream(context.Background(), t, at, agg.addr)
	if err := s.Send(hello("node-slow")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slow stream's hello read past the wait", func() error {
		if testutil.ToFloat64(r.m.messages.WithLabelValues("to_aggregator")) == before {
			return errors.New("not yet")
		}
		return nil
	})
	if !u.reviewsFirst.Load() {
		t.Fatal("one slow review took the replica as one that does not review first")
	}
	agg.review <- nil
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("the slow stream: %v, %v; want its welcome", m, err)
	}
	// A replica rolled back: its headers come without the header.
	agg.mu.Lock()
	agg.old, agg.review = true, nil
	agg.mu.Unlock()
	welcomed(t, at, agg.addr)
	// The headers are read apart from the welcome forwarded: the agent may
	// have its welcome before the relay has taken the headers in.
	eventually(t, "a stream's headers without the header: the replica no longer known to review first", func() error {
		if u.reviewsFirst.Load() {
			return errors.New("still known to review first")
		}
		return nil
	})
}

// TestTheReviewedHeaderIsTheAggregators: the relay waits for the header
// the aggregator's ingest sends.
func TestTheReviewedHeaderIsTheAggregators(t *testing.T) {
	if ReviewedKey != ingest.ReviewedHeader {
		t.Fatalf("the relay waits for %q, the aggregator sends %q", ReviewedKey, ingest.ReviewedHeader)
	}
}

// TestAConnectionHoldsFewStreamsAtAReplica: nothing bounded the streams
// one agent connection opened to one replica but the connection's 32: one
// connection held 32 of the replica's stream places and their reviews,
// eight from one address 256. An agent opens one a replica (and a second
// replaces it): a connection's third at once is refused, saying why;
// another connection's is forwarded, and so is a new one once one ends.
func TestAConnectionHoldsFewStreamsAtAReplica(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	open := func(ctx context.Context) pulsev1.Ingest_ReportClient {
		s, err := pulsev1.NewIngestClient(conn).Report(metadata.AppendToOutgoingContext(ctx, UpstreamKey, agg.addr))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var cancels []context.CancelFunc
	for i := range MaxStreamsPerReplica {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		s := open(ctx)
		if err := s.Send(hello(fmt.Sprintf("node-%d", i))); err != nil {
			t.Fatal(err)
		}
		if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("stream %d: %v, %v; want its welcome", i, m, err)
		}
	}
	endsWith(t, open(context.Background()), codes.ResourceExhausted, "streams open to")
	wantRefused(t, r, "replica_streams", 1)
	welcomed(t, at, agg.addr) // another connection's
	cancels[0]()
	eventually(t, "a new stream once one ended", func() error {
		s := open(context.Background())
		if err := s.Send(hello("node-again")); err != nil {
			return err
		}
		m, err := s.Recv()
		if err != nil || m.GetWelcome() == nil {
			return fmt.Errorf("%v, %v", m, err)
		}
		return nil
	})
	for _, c := range cancels {
		c()
	}
}

// closedRefusing opens a stream (open: its code) on one client connection
// to at every 50 ms until the relay closes a connection idle, with no
// stream accepted for AgentConnIdle (300 ms); each is refused (refused or
// Unavailable, the connection closed).
func closedRefusing(t *testing.T, r *Relay, at relayAt, what string, open func(*grpc.ClientConn) codes.Code, refused codes.Code) {
	t.Helper()
	conn, err := grpc.NewClient(at.addr, grpc.WithTransportCredentials(at.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(r.m.idleClosed) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a connection whose every stream was refused (%s), one every 50 ms: still held after 5 s (idle 300 ms)", what)
		}
		if c := open(conn); c != refused && c != codes.Unavailable {
			t.Fatalf("a stream %s: %v, want %v", what, c, refused)
		}
	}
}

// TestRefusedStreamsHoldNoConnection: gRPC's idle close of the agents'
// port restarts at any stream's end, a refused one's too, so a client with
// no token, sending a stream the relay refuses every few hundred
// milliseconds, held its connection (its share of --max-connections) for
// ever. A connection with no stream forwarded for AgentConnIdle is
// closed, however many it had refused; one forwarding a stream is kept.
func TestRefusedStreamsHoldNoConnection(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, AgentConnIdle: 300 * time.Millisecond})
	working := agentStream(context.Background(), t, at, agg.addr)
	if err := working.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if m, err := working.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("a hello: %v, %v", m, err)
	}
	// Refused streams, each well within the idle time of the one before
	// (the client dials again once its connection is closed).
	closedRefusing(t, r, at, "naming no replica", func(conn *grpc.ClientConn) codes.Code {
		s, err := pulsev1.NewIngestClient(conn).Report(context.Background()) // names no replica
		if err == nil {
			_, err = s.Recv()
		}
		return status.Code(err)
	}, codes.InvalidArgument)
	// The agent's connection, its stream forwarded, is kept past twice
	// the idle time: its batch is still answered.
	time.Sleep(600 * time.Millisecond)
	if err := working.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1}}}); err != nil {
		t.Fatalf("the forwarding connection: %v", err)
	}
	if m, err := working.Recv(); err != nil || m.GetAck().GetSeq() != 1 {
		t.Fatalf("the forwarding connection's batch: %v, %v; want its ack", m, err)
	}
	// Connections never tagged (a handshake that failed, a probe that
	// only connects) are forgotten once closed: they were kept a minute.
	for range 50 {
		c, err := net.Dial("tcp", at.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	eventually(t, "the untagged connections forgotten", func() error {
		n := 0
		r.pending.Range(func(any, any) bool { n++; return true })
		if n != 0 {
			return fmt.Errorf("%d connections pending", n)
		}
		return nil
	})
}

// slowDNS answers as its dns after a delay.
type slowDNS struct {
	*dns
	delay time.Duration
}

func (s slowDNS) LookupHost(ctx context.Context, host string) ([]string, error) {
	time.Sleep(s.delay)
	return s.dns.LookupHost(ctx, host)
}

// TestAStreamDuringALookupWaitsForIt: one lookup a second is made for
// streams naming a replica not known; a second stream for a replica just
// added, arriving while the first stream's lookup ran, was refused as not
// a replica (unknown_upstream), though that lookup added it. It waits for
// the lookup in flight.
func TestAStreamDuringALookupWaitsForIt(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, _ := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: slowDNS{d, 2 * time.Second}})
	eventually(t, "the first lookup", func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.allowed) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	d.set("127.0.0.1", "127.0.0.2")
	added := "127.0.0.2:" + port(agg.addr)
	found := make(chan bool, 2)
	for range 2 {
		go func() {
			_, ok := r.upstreamFor(context.Background(), added)
			found <- ok
		}()
		time.Sleep(50 * time.Millisecond) // the second within the first's lookup (2 s)
	}
	for i := range 2 {
		if !<-found {
			t.Fatalf("stream %d for a replica the lookup in flight adds: not found", i+1)
		}
	}
}

// blockedDNS answers no lookup until release is closed.
type blockedDNS struct {
	*dns
	release chan struct{}
}

func (b blockedDNS) LookupHost(ctx context.Context, host string) ([]string, error) {
	<-b.release
	return b.dns.LookupHost(ctx, host)
}

// TestAStreamGivenUpEndsItsWaitForALookup: a stream naming a replica not
// known waits for a lookup (its own, or one under way), and the wait was
// bounded by the lookup's own timeout alone: a stream its agent had given
// up held its handler that long. The stream's end ends its wait, whether
// it asked for the lookup or found one under way; the lookup goes on.
func TestAStreamGivenUpEndsItsWaitForALookup(t *testing.T) {
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	b := blockedDNS{d, make(chan struct{})}
	r := New(Config{Aggregators: []string{"aggregator:8443"}, Resolver: b})
	defer close(b.release)
	for _, what := range []string{"the stream that asked for the lookup", "a stream that found it under way"} {
		ctx, cancel := context.WithCancel(context.Background())
		found := make(chan bool, 1)
		go func() {
			_, ok := r.upstreamFor(ctx, "127.0.0.9:8443")
			found <- ok
		}()
		cancel()
		select {
		case ok := <-found:
			if ok {
				t.Fatalf("%s, given up: found a replica", what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s, given up, still waits for a lookup that has not returned", what)
		}
	}
}

// TestAReplicaDownIsTriedAtTheAgentsPace: a replica's process goes and its
// address stays, refusing (a container restarted in place). The relay's
// connection to it, its last, is kept, and it tried again at gRPC's
// default pace, 1 s growing to 120 s: once the replica was back, every
// agent behind the relay was refused for up to some 60 % of the outage,
// where an agent streaming directly was back within its 5 s (found in a
// review, 2026-12-07). With the relay's backoff at 20 ms here, the relay
// tries dozens of times in the second the agents ask; at gRPC's default it
// tried once or twice.
func TestAReplicaDownIsTriedAtTheAgentsPace(t *testing.T) {
	defer func(b backoff.Config) { replicaBackoff = b }(replicaBackoff)
	replicaBackoff = backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1, MaxDelay: 20 * time.Millisecond}
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	welcomed(t, at, agg.addr)
	agg.srv.Stop()
	ln, err := net.Listen("tcp", agg.addr) // the address stays, refusing
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var attempts atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			attempts.Add(1)
			_ = c.Close()
		}
	}()
	// Agents ask for a stream through the relay every 50 ms for a second.
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		if s := agentStream(ctx, t, at, agg.addr); s.Send(hello("node-1")) == nil {
			_, _ = s.Recv()
		}
		<-ctx.Done()
		cancel()
	}
	if n := attempts.Load(); n < 10 {
		t.Fatalf("the relay tried the replica %d times in a second of agents asking; want it tried at its backoff (20 ms here), not gRPC's default of 1 s and more", n)
	}
}

// TestStreamsTheReplicaRefusesHoldNoConnection: the idle close of an
// agent connection (AgentConnIdle) counts a stream the relay forwarded as
// a use of the connection, and a stream the replica refused (no token,
// a made-up one: Unauthenticated before any welcome) was one. A client
// with no token kept its connection, its share of --max-connections, for
// ever by opening a stream naming a real replica every few seconds; only
// a stream the replica accepted (its first answer reached the agent) is a
// use.
func TestStreamsTheReplicaRefusesHoldNoConnection(t *testing.T) {
	agg := startAggregator(t, 100)
	agg.refuse = status.Error(codes.Unauthenticated, "no token")
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d, AgentConnIdle: 300 * time.Millisecond})
	closedRefusing(t, r, at, "the replica refused", func(conn *grpc.ClientConn) codes.Code {
		s, err := pulsev1.NewIngestClient(conn).Report(metadata.AppendToOutgoingContext(context.Background(), UpstreamKey, agg.addr))
		if err == nil {
			_ = s.Send(hello("node-1"))
			_, err = s.Recv()
		}
		return status.Code(err)
	}, codes.Unauthenticated)
}

// TestLookupsForAddressesNotKnownDoNotPileUp: a stream naming an address
// not known asks for a lookup, at most one a second, each on a goroutine
// of its own that waits for the lookup under way. With lookups slower
// than a second (the cluster's DNS failing, each lookup at its 5 s bound)
// one such stream a second (any client: no token needed, any well-formed
// address) piled up a goroutine and a lookup each second for as long as
// the DNS was slow, all of them made, one after the other, once it
// answered, the timed pass waiting behind them. At most one ask waits.
func TestLookupsForAddressesNotKnownDoNotPileUp(t *testing.T) {
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	b := blockedDNS{d, make(chan struct{})}
	r := New(Config{Aggregators: []string{"aggregator:8443"}, Resolver: b})
	defer close(b.release)
	before := runtime.NumGoroutine()
	const asks = 50
	for i := range asks {
		r.mu.Lock()
		r.lastAsk = time.Time{} // a second has gone by since the last ask
		r.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the stream given up: its ask goes on
		if _, ok := r.upstreamFor(ctx, fmt.Sprintf("127.0.0.9:%d", 1000+i)); ok {
			t.Fatal("an address not resolved was found")
		}
	}
	if n := runtime.NumGoroutine() - before; n > asks/5 {
		t.Fatalf("%d asks for lookups while one is under way left %d goroutines waiting; want at most one ask waiting", asks, n)
	}
}
