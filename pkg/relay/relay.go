// Package relay forwards agents' streams to the aggregator replicas over a
// few shared connections.
//
// Every agent holds one gRPC connection to each aggregator replica, and a
// connection costs the aggregator far more than the stream it carries: its
// transport, buffers, timers and three goroutines of gRPC's own, about 1 KB
// of heap per pod at 8 pods a node (docs/performance.md, "A relay"). A relay
// takes the agents' connections instead and carries their streams to each
// replica on connections of its own, at most StreamsPerConnection streams
// each. It is transparent: it forwards each stream's messages as bytes, never
// decoded, and the agent's metadata (its ServiceAccount token among them), so
// the aggregator authenticates and bounds every agent as it does a direct
// one. An agent names the replica its stream is for in the metadata
// (UpstreamKey); the relay forwards only to the replicas it resolves itself
// from its --aggregator names, so it is no open proxy.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/logging"
)

// UpstreamKey is the metadata key in which an agent names the aggregator
// replica (ip:port, as it resolved it) that a stream through a relay is for.
const UpstreamKey = "pulse-upstream"

// reportMethod is the one method a relay forwards.
const reportMethod = "/pulse.v1.Ingest/Report"

// Resolver resolves a host name (net.DefaultResolver).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Config wires a Relay.
type Config struct {
	// Aggregators are the aggregators' host:port entries (a headless
	// Service name gives every replica), resolved every ResolveInterval.
	Aggregators     []string
	ResolveInterval time.Duration
	Resolver        Resolver
	// StreamsPerConnection bounds the streams one connection to a replica
	// carries (at most the aggregator's
	// --ingest-max-streams-per-connection): past it another is opened.
	StreamsPerConnection int
	// Transport dials a replica whose address was resolved from name (the
	// name its certificate must carry).
	Transport func(name string) credentials.TransportCredentials
	// Secure: the connections to the replicas are TLS. A token is never
	// forwarded in plaintext.
	Secure     bool
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Relay forwards agents' streams; serve it with ServerOptions.
type Relay struct {
	cfg Config

	mu        sync.Mutex
	allowed   map[string]string // replica address → the name it was resolved from
	resolved  bool              // every entry resolved at least once
	upstreams map[string]*upstream
	lastAsk   time.Time // a lookup for an address not known, at most one a second

	m metrics
}

type metrics struct {
	streams     prometheus.Gauge
	connections prometheus.Gauge
	refused     *prometheus.CounterVec
	messages    *prometheus.CounterVec
}

// refuseReasons are the reason label values of
// pulse_relay_refused_streams_total.
var refuseReasons = []string{"method", "no_upstream", "unknown_upstream", "plaintext_token", "upstream_unavailable"}

// New returns a Relay; Run resolves its aggregators.
func New(cfg Config) *Relay {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	r := &Relay{cfg: cfg, allowed: map[string]string{}, upstreams: map[string]*upstream{}, m: metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_relay_streams", Help: "Agent streams the relay forwards now."}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_relay_upstream_connections", Help: "Connections open to aggregator replicas."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_relay_refused_streams_total", Help: "Agent streams refused, by reason."}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_relay_messages_total", Help: "Messages forwarded, by direction (to_aggregator, to_agent)."}, []string{"direction"}),
	}}
	for _, reason := range refuseReasons {
		r.m.refused.WithLabelValues(reason)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.m.streams, r.m.connections, r.m.refused, r.m.messages)
	}
	return r
}

// Run resolves the aggregators every ResolveInterval until ctx ends, then
// closes every connection to them.
func (r *Relay) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.ResolveInterval)
	defer t.Stop()
	for {
		r.resolve(ctx)
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for addr, u := range r.upstreams {
				u.closeAll()
				delete(r.upstreams, addr)
			}
			r.m.connections.Set(0)
			r.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// Ready reports whether every aggregator entry has been resolved once.
func (r *Relay) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resolved
}

// resolve looks every entry up. A failed lookup keeps the entry's
// addresses (a DNS hiccup must not cut healthy streams); replicas that are
// gone lose their connections, and the streams on them end.
func (r *Relay) resolve(ctx context.Context) {
	allowed := map[string]string{}
	r.mu.Lock()
	prev := r.allowed
	r.mu.Unlock()
	ok := true
	for _, entry := range r.cfg.Aggregators {
		host, port, _ := net.SplitHostPort(entry)
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := r.cfg.Resolver.LookupHost(lctx, host)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Log.Warn("resolve aggregator", logging.KeyAggregator, entry, logging.KeyErr, err)
			}
			ok = false
			for addr, name := range prev {
				if name == host {
					allowed[addr] = name
				}
			}
			continue
		}
		for _, ip := range ips {
			allowed[net.JoinHostPort(ip, port)] = host
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allowed = allowed
	r.resolved = r.resolved || ok
	for addr, u := range r.upstreams {
		if _, ok := allowed[addr]; !ok {
			u.closeAll()
			delete(r.upstreams, addr)
		}
	}
	r.countConnections()
}

// countConnections sets the connections gauge; r.mu is held.
func (r *Relay) countConnections() {
	n := 0
	for _, u := range r.upstreams {
		u.mu.Lock()
		n += len(u.conns)
		u.mu.Unlock()
	}
	r.m.connections.Set(float64(n))
}

// upstreamFor is the replica addr's upstream, when addr is one the relay
// resolved. An address not known yet (a replica the agent resolved first)
// makes one lookup at most each second.
func (r *Relay) upstreamFor(ctx context.Context, addr string) (*upstream, bool) {
	r.mu.Lock()
	_, ok := r.allowed[addr]
	ask := !ok && time.Since(r.lastAsk) >= time.Second
	if ask {
		r.lastAsk = time.Now()
	}
	r.mu.Unlock()
	if ask {
		r.resolve(ctx)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	name, ok := r.allowed[addr]
	if !ok {
		return nil, false
	}
	u := r.upstreams[addr]
	if u == nil {
		u = &upstream{addr: addr, name: name, r: r}
		r.upstreams[addr] = u
	}
	return u, true
}

// upstream is one replica's connections.
type upstream struct {
	addr, name string
	r          *Relay
	mu         sync.Mutex
	conns      []*pooled
	closed     bool
}

type pooled struct {
	cc      *grpc.ClientConn
	streams int
}

// acquire returns a connection with room for one more stream, dialled if
// none has.
func (u *upstream) acquire() (*pooled, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, errors.New("the replica is no longer resolved")
	}
	for _, c := range u.conns {
		if c.streams < u.r.cfg.StreamsPerConnection {
			c.streams++
			return c, nil
		}
	}
	cc, err := grpc.NewClient(u.addr, grpc.WithTransportCredentials(u.r.cfg.Transport(u.name)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(Codec{})))
	if err != nil {
		return nil, err
	}
	c := &pooled{cc: cc, streams: 1}
	u.conns = append(u.conns, c)
	u.r.m.connections.Inc()
	return c, nil
}

// release gives c's stream back; a connection left with none is closed
// unless it is the replica's last.
func (u *upstream) release(c *pooled) {
	u.mu.Lock()
	defer u.mu.Unlock()
	c.streams--
	if c.streams > 0 || u.closed || len(u.conns) == 1 {
		return
	}
	for i, o := range u.conns {
		if o == c {
			u.conns = append(u.conns[:i], u.conns[i+1:]...)
			_ = c.cc.Close()
			u.r.m.connections.Dec()
			return
		}
	}
}

// closeAll closes every connection: their streams end.
func (u *upstream) closeAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for _, c := range u.conns {
		_ = c.cc.Close()
	}
	u.conns = nil
}

// ServerOptions serve the relay on a grpc.Server: every method reaches
// Handler, with its messages as bytes.
func (r *Relay) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodec(Codec{}), grpc.UnknownServiceHandler(r.Handler)}
}

// Handler forwards one agent stream (grpc.UnknownServiceHandler).
func (r *Relay) Handler(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	if method != reportMethod {
		r.m.refused.WithLabelValues("method").Inc()
		return status.Errorf(codes.Unimplemented, "relay: only %s is forwarded, not %s", reportMethod, method)
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	names := md.Get(UpstreamKey)
	if len(names) != 1 || names[0] == "" {
		r.m.refused.WithLabelValues("no_upstream").Inc()
		return status.Errorf(codes.InvalidArgument, "relay: the stream names no aggregator replica: metadata %s must hold one ip:port (the agent's --relay)", UpstreamKey)
	}
	addr := names[0]
	u, ok := r.upstreamFor(ctx, addr)
	if !ok {
		r.m.refused.WithLabelValues("unknown_upstream").Inc()
		return status.Errorf(codes.Unavailable, "relay: %q is not an aggregator replica this relay resolves from %s", addr, strings.Join(r.cfg.Aggregators, ", "))
	}
	if !r.cfg.Secure && len(md.Get("authorization")) > 0 {
		r.m.refused.WithLabelValues("plaintext_token").Inc()
		return status.Error(codes.FailedPrecondition, "relay: the stream carries a token and the relay reaches the aggregators in plaintext: set its --aggregator-ca-file")
	}
	out := metadata.MD{}
	for k, v := range md {
		// The agent's own metadata (its token); not the transport's
		// headers, nor the relay's key.
		if k == UpstreamKey || strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") || k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	c, err := u.acquire()
	if err != nil {
		r.m.refused.WithLabelValues("upstream_unavailable").Inc()
		return status.Errorf(codes.Unavailable, "relay: aggregator %s: %v", addr, err)
	}
	defer u.release(c)
	r.m.streams.Inc()
	defer r.m.streams.Dec()
	fctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, out))
	defer cancel()
	up, err := c.cc.NewStream(fctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, reportMethod)
	if err != nil {
		r.m.refused.WithLabelValues("upstream_unavailable").Inc()
		return upstreamError(ctx, addr, err)
	}
	toAgg, toAgent := r.m.messages.WithLabelValues("to_aggregator"), r.m.messages.WithLabelValues("to_agent")
	// The agent's messages, forwarded until it closes its side (then the
	// replica's side is closed too) or the stream ends.
	go func() {
		for {
			var f Frame
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = up.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if err := up.SendMsg(&f); err != nil {
				return // the replica's side ended: RecvMsg below says how
			}
			toAgg.Inc()
		}
	}()
	for {
		var f Frame
		if err := up.RecvMsg(&f); err != nil {
			ss.SetTrailer(up.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return upstreamError(ctx, addr, err)
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
		toAgent.Inc()
	}
}

// upstreamError is a replica's error as the agent gets it: a status from
// the aggregator as it was (its code and message: a refusal, an
// authentication failure); anything else, and a stream the relay cancelled
// (its connection closed: the replica is no longer resolved) while the
// agent's was not, Unavailable, naming the replica.
func upstreamError(ctx context.Context, addr string, err error) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown && (s.Code() != codes.Canceled || ctx.Err() != nil) {
		return s.Err()
	}
	return status.Errorf(codes.Unavailable, "relay: aggregator %s: %v", addr, err)
}

// Frame is one message, as bytes.
type Frame struct{ b []byte }

// Codec passes messages through as bytes, never decoded: its name is
// proto's, so the aggregator reads them as the agent wrote them.
type Codec struct{}

// Marshal returns a Frame's bytes.
func (Codec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*Frame)
	if !ok {
		return nil, fmt.Errorf("relay: cannot marshal %T", v)
	}
	return f.b, nil
}

// Unmarshal copies data into a Frame.
func (Codec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("relay: cannot unmarshal into %T", v)
	}
	f.b = append(f.b[:0], data...)
	return nil
}

// Name is proto's.
func (Codec) Name() string { return "proto" }
