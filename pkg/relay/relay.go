// Package relay forwards agents' streams to the aggregator replicas over a
// few shared connections.
//
// Every agent holds one gRPC connection to each aggregator replica, and a
// connection costs the aggregator far more than the stream it carries: its
// transport, buffers, timers and three goroutines of gRPC's own, about 1.1
// KB of heap per pod at 8 pods a node (docs/performance.md, "A relay"). A relay
// takes the agents' connections instead and carries their streams to each
// replica on connections of its own, at most StreamsPerConnection streams
// each. It is transparent: it forwards each stream's messages as bytes, never
// decoded, and the agent's token (no other metadata), so
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
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/netbound"
)

// UpstreamKey is the metadata key in which an agent names the aggregator
// replica (ip:port, as it resolved it) that a stream through a relay is for.
const UpstreamKey = "pulse-upstream"

// DefaultHelloWait is Config.HelloWait's default: the 10 s an agent's
// hello waits for its welcome.
const DefaultHelloWait = 10 * time.Second

// ReviewedKey is the header a replica sends as soon as it has reviewed a
// stream's token, before it reads the stream's first message (pkg/ingest's
// ReviewedHeader): the relay reads the agent's first message only then, so
// that a stream whose token no one has reviewed holds no more than its
// flow control window (64 KiB) of the relay's memory.
const ReviewedKey = "pulse-reviewed"

// unreviewedWait is how long the relay waits for a replica's ReviewedKey
// before it reads the agent's first message anyway, from a replica not
// known to send it (one older than it): each of its streams starts that
// much later. A replica known to send it is waited for up to half the
// HelloWait, and is then taken as not known (a replica of the same
// address downgraded).
var unreviewedWait = time.Second

// DefaultStreamWait is Config.StreamWait's default, well within the 10 s an
// agent's hello waits for its welcome.
const DefaultStreamWait = 3 * time.Second

// DefaultAgentSendWait is Config.AgentSendWait's default: an agent reads
// every message the replica sends (a welcome, an ack a batch, a few bytes
// each) at once, so one that has left them unread for this long has
// stopped reading.
const DefaultAgentSendWait = 30 * time.Second

// reportMethod is the one method a relay forwards.
const reportMethod = "/pulse.v1.Ingest/Report"

// Resolver resolves a host name (net.DefaultResolver).
type Resolver = netbound.Resolver

// Config wires a Relay.
type Config struct {
	// Aggregators are the aggregators' host:port entries (a headless
	// Service name gives every replica), resolved every ResolveInterval.
	Aggregators     []string
	ResolveInterval time.Duration
	Resolver        Resolver
	// StreamsPerConnection bounds the streams one connection to a replica
	// carries (at most the aggregator's
	// --max-ingest-streams-per-connection): past it another is opened.
	StreamsPerConnection int
	// StreamWait: how long a stream may wait for a replica to let it open
	// on a connection (DefaultStreamWait); past it the connection is full.
	StreamWait time.Duration
	// AgentSendWait: how long a message of the replica's may wait for the
	// agent to take it (DefaultAgentSendWait); past it the stream ends.
	AgentSendWait time.Duration
	// HelloWait: how long an agent's first message may take to arrive
	// whole from the stream's start, the replica's review of its token
	// included (DefaultHelloWait); past it the stream ends.
	HelloWait time.Duration
	// AgentConnIdle: an agent connection (on a listener Track wraps) with
	// no stream a replica accepted for this long is closed, however many
	// the relay or a replica had refused (DefaultAgentConnIdle).
	AgentConnIdle time.Duration
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
	// unreviewedWait: the package's, when the relay was made (the tests
	// set it; streams of a relay still running read their own).
	unreviewedWait time.Duration
	// pending: the agents' connections a listener Track wraps accepted,
	// open and not tagged by gRPC yet, by remote address (*trackedConn).
	pending sync.Map

	// resolving serialises lookups: a pass that finished last with an
	// older answer cut the streams of a replica just added.
	resolving chan struct{} // held (a send) while a pass runs

	mu        sync.Mutex
	allowed   map[string]string // replica address (canonical) → the name it was resolved from
	resolved  bool              // every entry resolved at least once
	closed    bool              // Run has returned: no stream is forwarded
	upstreams map[string]*upstream
	missed    map[string]int // a replica's timed passes in a row without it
	lastAsk   time.Time      // a lookup for an address not known, at most one a second
	asking    bool           // such a lookup is asked for and not done: no other is

	m metrics
}

type metrics struct {
	streams    prometheus.Gauge
	refused    *prometheus.CounterVec
	messages   *prometheus.CounterVec
	idleClosed prometheus.Counter
}

// refuseReasons are the reason label values of
// pulse_relay_refused_streams_total.
var refuseReasons = []string{"method", "no_upstream", "unknown_upstream", "plaintext_token", "upstream_unavailable", "upstream_full", "closing", "agent_not_reading", "hello_too_large", "hello_wait", "replica_streams", "agent_not_sending"}

// New returns a Relay; Run resolves its aggregators.
func New(cfg Config) *Relay {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.AgentSendWait <= 0 {
		cfg.AgentSendWait = DefaultAgentSendWait
	}
	if cfg.StreamWait <= 0 {
		cfg.StreamWait = DefaultStreamWait
	}
	if cfg.HelloWait <= 0 {
		cfg.HelloWait = DefaultHelloWait
	}
	if cfg.AgentConnIdle <= 0 {
		cfg.AgentConnIdle = DefaultAgentConnIdle
	}
	r := &Relay{cfg: cfg, unreviewedWait: unreviewedWait, resolving: make(chan struct{}, 1), allowed: map[string]string{}, upstreams: map[string]*upstream{}, missed: map[string]int{}, m: metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_relay_streams", Help: "Agent streams the relay forwards now."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_relay_refused_streams_total", Help: "Agent streams refused, by reason."}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_relay_messages_total", Help: "Messages forwarded, by direction (to_aggregator, to_agent)."}, []string{"direction"}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_relay_idle_connections_closed_total", Help: "Agents' connections closed with no stream under way or accepted by a replica for the idle time (30 s), however many streams the relay or a replica had refused."}),
	}}
	for _, reason := range refuseReasons {
		r.m.refused.WithLabelValues(reason)
	}
	for _, direction := range []string{"to_aggregator", "to_agent"} {
		r.m.messages.WithLabelValues(direction) // at 0 from the start
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.m.streams, r.m.refused, r.m.messages, r.m.idleClosed,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "pulse_relay_upstream_connections", Help: "Connections open to aggregator replicas."},
				func() float64 { return float64(r.connections()) }))
	}
	return r
}

// Run resolves the aggregators every ResolveInterval until ctx ends, then
// closes every connection to them (their streams end) and forwards no
// stream more.
func (r *Relay) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.ResolveInterval)
	defer t.Stop()
	for {
		r.resolve(ctx, true)
		select {
		case <-ctx.Done():
			r.mu.Lock()
			r.closed = true
			gone := r.upstreams
			r.upstreams = map[string]*upstream{}
			r.mu.Unlock()
			for _, u := range gone {
				u.closeAll()
			}
			return
		case <-t.C:
		}
	}
}

// Ready reports whether every aggregator entry has been resolved once.
func (r *Relay) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resolved && !r.closed
}

// connections counts the connections open to replicas.
func (r *Relay) connections() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, u := range r.upstreams {
		u.mu.Lock()
		n += len(u.conns)
		u.mu.Unlock()
	}
	return n
}

// resolve looks every entry up. A failed lookup keeps the entry's
// addresses (a DNS hiccup must not cut healthy streams). With prune (the
// timed pass), replicas missing from two passes' answers in a row lose
// their connections, and the streams on them end (one answer without a
// replica, a readiness probe's blip taking it out of the headless
// Service's endpoints for a moment, cut every stream it carried); without
// it (a lookup for a replica an agent named first) replicas are only
// added.
func (r *Relay) resolve(ctx context.Context, prune bool) {
	r.resolving <- struct{}{}
	defer func() { <-r.resolving }()
	found := map[string]string{}
	r.mu.Lock()
	prev := r.allowed
	r.mu.Unlock()
	ok := true
	for _, entry := range r.cfg.Aggregators {
		host, addrs, err := netbound.ResolveAll(ctx, r.cfg.Resolver, entry)
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Log.Warn("resolve aggregator", logging.KeyAggregator, entry, logging.KeyErr, err)
			}
			ok = false
			for addr, name := range prev {
				if name == host {
					found[addr] = name
				}
			}
			continue
		}
		for _, a := range addrs {
			found[a] = host
		}
	}
	r.mu.Lock()
	var gone []*upstream
	if prune {
		for addr, name := range prev {
			if _, ok := found[addr]; ok {
				delete(r.missed, addr)
			} else if r.missed[addr]++; r.missed[addr] < missesToDrop {
				found[addr] = name
			} else {
				delete(r.missed, addr)
			}
		}
		r.allowed = found
		r.resolved = r.resolved || ok
		for addr, u := range r.upstreams {
			if _, ok := found[addr]; !ok {
				gone = append(gone, u)
				delete(r.upstreams, addr)
			}
		}
	} else {
		maps.Copy(r.allowed, found)
	}
	r.mu.Unlock()
	for _, u := range gone {
		u.closeAll()
	}
}

// isClosed says that Run has returned.
func (r *Relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// missesToDrop: a replica is dropped once this many timed passes in a row
// have not found it.
const missesToDrop = 2

// upstreamFor is the replica addr's upstream, when addr is one the relay
// resolved. An address not known yet (a replica the agent resolved first)
// makes one lookup at most each second.
func (r *Relay) upstreamFor(ctx context.Context, addr string) (*upstream, bool) {
	r.mu.Lock()
	_, ok := r.allowed[addr]
	// At most one asked lookup waits or runs: with lookups slower than a
	// second (the DNS failing, each at its bound) one stream a second
	// naming any address not known piled up a goroutine and a lookup
	// each second for as long as the DNS was slow, the timed pass behind
	// them all. A stream finding one asked waits for it (below).
	ask := !ok && !r.closed && !r.asking && time.Since(r.lastAsk) >= time.Second
	if ask {
		r.lastAsk = time.Now()
		r.asking = true
	}
	r.mu.Unlock()
	// The stream's end ends its wait for a lookup: it was bounded by the
	// lookup's own timeout alone, and a stream its agent had given up
	// held its handler that long.
	switch {
	case ask:
		// The lookup runs to its own bound (resolve's), not the asking
		// stream's: a stream reset at once cut the one lookup a second
		// every other stream waits on.
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() {
				r.mu.Lock()
				r.asking = false
				r.mu.Unlock()
			}()
			r.resolve(context.WithoutCancel(ctx), false)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, false
		}
	case !ok:
		// A lookup under way (another stream's, or the periodic one) may
		// add it: its answer is waited for. A second stream for a replica
		// just added, arriving while the first stream's lookup ran, was
		// refused as not a replica.
		select {
		case r.resolving <- struct{}{}:
			<-r.resolving
		case <-ctx.Done():
			return nil, false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	name, ok := r.allowed[addr]
	if !ok || r.closed {
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
	// reviewsFirst: a stream of it has had its ReviewedKey header.
	reviewsFirst atomic.Bool
	mu           sync.Mutex
	conns        []*pooled
	closed       bool
}

type pooled struct {
	cc      *grpc.ClientConn
	streams int
	// limit: the streams the replica let this connection open at once,
	// learned when one more waited past StreamWait (0: not learned).
	limit int
}

// room is how many streams c may carry.
func (c *pooled) room(perConn int) int {
	if c.limit > 0 {
		return min(c.limit, perConn)
	}
	return perConn
}

// replicaBackoff is the relay's reconnect to a replica: the agents' own
// (--reconnect-max-backoff's default, 5 s, at most). At gRPC's default (1 s
// growing to 120 s) a replica restarted on its address (an OOM kill, a
// liveness probe's restart) was refused to every agent behind the relay
// for up to some 60 % of its outage once it was back, where an agent
// streaming to it directly was back within 5 s (found in a review,
// 2026-12-07). The connection is the replica's last, kept however long
// it is down. (A variable for the tests.)
var replicaBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// acquire returns a connection with room for one more stream, dialled if
// none has.
func (u *upstream) acquire() (*pooled, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, errors.New("the replica is no longer resolved")
	}
	for _, c := range u.conns {
		if c.streams < c.room(u.r.cfg.StreamsPerConnection) {
			c.streams++
			return c, nil
		}
	}
	cc, err := grpc.NewClient(u.addr, grpc.WithTransportCredentials(u.r.cfg.Transport(u.name)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: replicaBackoff, MinConnectTimeout: 2 * time.Second}),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(Codec{})))
	if err != nil {
		return nil, err
	}
	c := &pooled{cc: cc, streams: 1}
	u.conns = append(u.conns, c)
	return c, nil
}

// full marks c as carrying no more than the streams it has open without
// the one that waited (the replica's bound is below StreamsPerConnection),
// and returns that bound.
func (u *upstream) full(c *pooled) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	c.limit = max(c.streams-1, 1)
	return c.limit
}

// release gives c's stream back; a connection left with none is closed
// unless it is the replica's last.
func (u *upstream) release(c *pooled) {
	u.mu.Lock()
	c.streams--
	if c.streams > 0 || u.closed || len(u.conns) == 1 {
		u.mu.Unlock()
		return
	}
	u.conns = slices.DeleteFunc(u.conns, func(o *pooled) bool { return o == c })
	u.mu.Unlock()
	_ = c.cc.Close()
}

// closeAll closes every connection: their streams end.
func (u *upstream) closeAll() {
	u.mu.Lock()
	u.closed = true
	conns := u.conns
	u.conns = nil
	u.mu.Unlock()
	for _, c := range conns {
		_ = c.cc.Close()
	}
}

// ServerOptions serve the relay on a grpc.Server: every method reaches
// Handler, with its messages as bytes.
func (r *Relay) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodec(Codec{}), grpc.UnknownServiceHandler(r.Handler), grpc.StatsHandler(connTagger{r})}
}

// Handler forwards one agent stream (grpc.UnknownServiceHandler).
func (r *Relay) Handler(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	if method != reportMethod {
		r.m.refused.WithLabelValues("method").Inc()
		return status.Errorf(codes.Unimplemented, "relay: only %s is forwarded, not %s", reportMethod, shown(method))
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	names := md.Get(UpstreamKey)
	if len(names) != 1 || names[0] == "" {
		r.m.refused.WithLabelValues("no_upstream").Inc()
		return status.Errorf(codes.InvalidArgument, "relay: the stream names no aggregator replica: metadata %s must hold one ip:port (the agent's --relay)", UpstreamKey)
	}
	// An address that is none (Canonical's "") is refused before any
	// lookup: each spent the one lookup a second that a replica not
	// resolved yet waits on.
	addr := netbound.Canonical(names[0])
	var u *upstream
	ok := false
	if addr != "" {
		u, ok = r.upstreamFor(ctx, addr)
	}
	if !ok {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err() // the agent gave the stream up
		}
		if r.isClosed() {
			r.m.refused.WithLabelValues("closing").Inc()
			return status.Error(codes.Unavailable, "relay: shutting down: reconnect (through another relay)")
		}
		r.m.refused.WithLabelValues("unknown_upstream").Inc()
		return status.Errorf(codes.Unavailable, "relay: %s is not an aggregator replica this relay resolves from %s", shown(names[0]), strings.Join(r.cfg.Aggregators, ", "))
	}
	forwarded := false
	if ac := connOf(ctx); ac != nil {
		if !ac.take(addr) {
			r.m.refused.WithLabelValues("replica_streams").Inc()
			return status.Errorf(codes.ResourceExhausted, "relay: this connection has %d streams open to %s: an agent opens one a replica", MaxStreamsPerReplica, addr)
		}
		ac.begin()
		defer func() {
			ac.end(forwarded)
			ac.give(addr)
		}()
	}
	// Only the agent's token is forwarded: the aggregator reads nothing
	// else of a stream's metadata, and a header HTTP/2 forbids (keep-alive,
	// upgrade...) is not carried on.
	token := md.Get("authorization")
	if len(token) > 0 && (!r.cfg.Secure || !overTLS(ctx)) {
		r.m.refused.WithLabelValues("plaintext_token").Inc()
		return status.Error(codes.FailedPrecondition, "relay: the stream carries a token over plaintext: the relay serves the agents TLS with --tls-cert-file and reaches the aggregators with --aggregator-ca-file, and a token never travels without either")
	}
	out := metadata.MD{}
	if len(token) > 0 {
		out["authorization"] = token
	}
	c, err := u.acquire()
	if err != nil {
		r.m.refused.WithLabelValues("upstream_unavailable").Inc()
		return status.Errorf(codes.Unavailable, "relay: aggregator %s: %v", addr, err)
	}
	defer u.release(c)
	fctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, out))
	defer cancel()
	up, err := r.open(fctx, cancel, u, c)
	if err != nil {
		return err
	}
	r.m.streams.Inc()
	defer r.m.streams.Dec()
	forwarded, err = r.forward(ctx, ss, up, cancel, u)
	return err
}

// maxHello bounds the first message of an agent's stream, its hello,
// which the relay forwards before the replica has reviewed the stream's
// token: the largest the aggregator takes is about 22 KB (four strings and
// 32 extra metrics' names of 600 bytes each: pkg/ingest), an agent's a few
// hundred bytes.
const maxHello = 64 << 10

// forward carries the agent's stream ss and the replica's up both ways
// until either ends; cancel ends up.
//
// Until the replica's first answer (the welcome, after it reviewed the
// stream's token) only the agent's first message is read and forwarded:
// the aggregator reads nothing of a stream before its review, and the
// relay had read on, a message of up to 4 MiB queued to the replica and
// another held, for every stream a client opened with a token no one
// had reviewed yet.
//
// accepted: the replica's first message reached the agent. Only such a
// stream is a use of the agent's connection (agentConn.end): one the
// replica refused (no token, a made-up one) is no more than one the relay
// refused, and a client with no token kept its connection for ever by
// opening one naming a real replica every few seconds.
func (r *Relay) forward(ctx context.Context, ss grpc.ServerStream, up grpc.ClientStream, cancel context.CancelFunc, u *upstream) (accepted bool, err error) {
	addr := u.addr
	toAgent := r.m.messages.WithLabelValues("to_agent")
	answered := make(chan struct{}) // the replica's first message reached the agent
	defer func() {
		select {
		case <-answered:
			accepted = true
		default:
		}
	}()
	// One error each from the hello's wait, the agent's side and the
	// replica's.
	errc := make(chan error, 3)
	// The agent's first message, its review waited for, arrives whole
	// within HelloWait: a first message declared of 4 MiB and never
	// finished held its 4 MiB (gRPC's window grows to a message's length
	// as it is read) until the replica ended the stream, never with
	// --agent-auth=none.
	hello := time.AfterFunc(r.cfg.HelloWait, func() {
		r.m.refused.WithLabelValues("hello_wait").Inc()
		select {
		case errc <- status.Errorf(codes.DeadlineExceeded, "relay: the stream's first message did not arrive whole within %s", r.cfg.HelloWait):
		default:
		}
		cancel()
	})
	defer hello.Stop()
	go r.fromAgent(ctx, ss, up, u, cancel, hello, answered, errc)
	// The replica's messages, forwarded to the agent on a goroutine of
	// their own: a send the agent does not take (it stopped reading, its
	// window full) blocks until the stream ends, which, while this
	// handler waited in it, was never: a replica's stream that had ended
	// (its slot freed at the aggregator) kept the relay's goroutine, its
	// queued messages and its place on the shared upstream connection for
	// as long as the agent kept its connection open. Past AgentSendWait
	// the stream ends.
	stuck := make(chan struct{})
	wait := time.AfterFunc(r.cfg.AgentSendWait, func() { close(stuck) })
	wait.Stop()
	go func() {
		for first := true; ; first = false {
			var f Frame
			if err := up.RecvMsg(&f); err != nil {
				ss.SetTrailer(up.Trailer())
				if errors.Is(err, io.EOF) {
					errc <- nil
				} else {
					errc <- upstreamError(ctx, addr, err)
				}
				return
			}
			wait.Reset(r.cfg.AgentSendWait)
			err := ss.SendMsg(&f)
			if !wait.Stop() {
				return // it waited past AgentSendWait: the handler ended the stream
			}
			if err != nil {
				errc <- err
				return
			}
			if first {
				close(answered)
			}
			toAgent.Inc()
		}
	}()
	select {
	case err := <-errc:
		return false, err
	case <-stuck:
		cancel()
		r.m.refused.WithLabelValues("agent_not_reading").Inc()
		return false, status.Errorf(codes.DeadlineExceeded, "relay: the agent took none of the aggregator's messages for %s: the stream ends (reconnect)", r.cfg.AgentSendWait)
	}
}

// fromAgent forwards the agent's messages on ss to up until the agent
// closes its side (then up's is closed too) or the stream ends: the first
// once the replica u has reviewed the stream (awaitReview), then stops
// hello; until the replica's first answer (answered closed), only the
// first, refused past maxHello (its error sent on errc); cancel ends up.
func (r *Relay) fromAgent(ctx context.Context, ss grpc.ServerStream, up grpc.ClientStream, u *upstream, cancel context.CancelFunc,
	hello *time.Timer, answered <-chan struct{}, errc chan<- error) {
	toAgg := r.m.messages.WithLabelValues("to_aggregator")
	wait := answered // nil once answered
	if !r.awaitReview(ctx, up, u) {
		return
	}
	// After the first, a whole message within twice AgentSendWait: an
	// agent sends one at least every 10 s (its heartbeat). A message begun
	// and never finished held up to 4 MiB here (gRPC grows the stream's
	// window to its declared length) for as long as the connection to the
	// replica lived, about an hour.
	sending := 2 * r.cfg.AgentSendWait
	stall := time.AfterFunc(time.Hour, func() {
		r.m.refused.WithLabelValues("agent_not_sending").Inc()
		select {
		case errc <- status.Errorf(codes.DeadlineExceeded, "relay: no whole message from the agent for %s: the stream ends (reconnect)", sending):
		default:
		}
		cancel()
	})
	stall.Stop()
	defer stall.Stop()
	for first := true; ; first = false {
		if !first && wait != nil {
			select {
			case <-wait:
				wait = nil
			case <-ctx.Done():
				return
			}
		}
		var f Frame
		if !first {
			stall.Reset(sending)
		}
		err := ss.RecvMsg(&f)
		if !first && !stall.Stop() {
			return // past the wait: the stream ends
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
			} else {
				cancel()
			}
			return
		}
		if first && !hello.Stop() {
			return // past HelloWait: the stream ends
		}
		if first && len(f.b) > maxHello {
			// The hello, before the review: one of up to 4 MiB was
			// queued to the replica, and held there until it reviewed
			// the stream's token (seconds), for every stream a
			// client opened with any token: 8 connections of 32
			// streams an address held about 1 GiB.
			r.m.refused.WithLabelValues("hello_too_large").Inc()
			errc <- status.Errorf(codes.InvalidArgument, "relay: a first message of %d bytes: a hello is at most %d", len(f.b), maxHello)
			cancel()
			return
		}
		if err := up.SendMsg(&f); err != nil {
			return // the replica's side ended: RecvMsg below says how
		}
		toAgg.Inc()
	}
}

// awaitReview waits until the replica u has reviewed the stream up's
// token (its ReviewedKey header), so that the agent's first message is
// not read before: read, gRPC grows the stream's window to the message's
// declared length, up to 4 MiB, all of it held here for any stream any
// client opens with any token (8 connections of 32 streams from one
// address, 1 GiB). From a replica not known to send the header it waits
// unreviewedWait, then reads; from one known to, half the HelloWait, then
// reads this stream's. The replica is known to send the header once one
// stream's headers have it, and not known once one stream's headers come
// without it (a replica rolled back); a review slow past the wait (the API
// server's, under load) says nothing of the replica, and one such stream
// took the wait before reading from every stream to it. False when the
// stream ended meanwhile, the replica's side first (its refusal: the
// agent's first message is then never read, and the replica's status is
// what the agent gets; read on, a first message past maxHello raced the
// refusal and was refused as too large, read whole).
func (r *Relay) awaitReview(ctx context.Context, up grpc.ClientStream, u *upstream) bool {
	reviewed := make(chan bool, 1) // false: the replica's side ended
	go func() {
		// The replica's headers, or (nil) the stream's end, its refusal.
		md, err := up.Header()
		got := err == nil && md != nil
		if got {
			u.reviewsFirst.Store(len(md.Get(ReviewedKey)) > 0)
		}
		reviewed <- got
	}()
	known := u.reviewsFirst.Load()
	wait := r.unreviewedWait
	if known {
		wait = r.cfg.HelloWait / 2
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case got := <-reviewed:
		// Headers: with the key, reviewed; without it, a replica that
		// sends no key (older than it): read on either way.
		return got
	case <-t.C:
		return true // this stream's review is slow: its hello is read
	case <-ctx.Done():
		return false
	}
}

// open opens the stream to the replica on c. A stream that waits past
// StreamWait for the replica to let it open (the aggregator's
// --max-ingest-streams-per-connection below --streams-per-connection)
// marks c full and is refused, saying so, and the agent's next try gets a
// connection of its own.
func (r *Relay) open(ctx context.Context, cancel context.CancelFunc, u *upstream, c *pooled) (grpc.ClientStream, error) {
	var waited, readyThen atomic.Bool
	timer := time.AfterFunc(r.cfg.StreamWait, func() {
		readyThen.Store(c.cc.GetState() == connectivity.Ready)
		waited.Store(true)
		cancel()
	})
	up, err := c.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, reportMethod)
	if timer.Stop() && err == nil {
		return up, nil
	}
	// A connection up when the wait ended that did not let the stream
	// open (its NewStream cut by that end) is at the replica's bound; one
	// still connecting then is only slow, and a stream that opened as the
	// wait ended proves nothing.
	if waited.Load() && readyThen.Load() && status.Code(err) == codes.Canceled {
		n := u.full(c)
		r.m.refused.WithLabelValues("upstream_full").Inc()
		r.cfg.Log.Warn("an aggregator replica let no more streams open on a relay connection: its --max-ingest-streams-per-connection is below the relay's --streams-per-connection",
			logging.KeyAggregator, u.addr, "streams", n)
		return nil, status.Errorf(codes.Unavailable, "relay: aggregator %s let no more streams open on the relay's connection within %s (its --max-ingest-streams-per-connection is below the relay's --streams-per-connection); try again", u.addr, r.cfg.StreamWait)
	}
	if waited.Load() {
		r.m.refused.WithLabelValues("upstream_unavailable").Inc()
		return nil, status.Errorf(codes.Unavailable, "relay: aggregator %s: no connection within %s", u.addr, r.cfg.StreamWait)
	}
	r.m.refused.WithLabelValues("upstream_unavailable").Inc()
	return nil, upstreamError(ctx, u.addr, err)
}

// overTLS reports whether the stream's own connection is TLS.
func overTLS(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	_, tls := p.AuthInfo.(credentials.TLSInfo)
	return tls
}

// upstreamError is a replica's error as the agent gets it: a status from
// the aggregator as it was (its code and message: a refusal, an
// authentication failure); anything else, and a stream the relay cancelled
// (its connection closed: the replica is no longer resolved) while the
// agent's was not, Unavailable, naming the replica.
func upstreamError(ctx context.Context, addr string, err error) error {
	if s, ok := status.FromError(err); ok && (s.Code() != codes.Canceled || ctx.Err() != nil) {
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

// shown is an agent's string as an error quotes it: printable, and at most
// a name's length (a header's value is up to the port's header bound, and
// %q made a byte past ASCII four). Not wire's CleanText and Printable,
// which ingest shows an agent's strings with: the relay forwards bytes and
// depends on no package of the wire format.
func shown(v string) string {
	const most = 256
	if len(v) > most {
		v = v[:most] + "…"
	}
	return strconv.QuoteToASCII(v)
}
