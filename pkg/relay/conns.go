package relay

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
)

// MaxStreamsPerReplica bounds the streams one agent connection has open
// to one replica at once. An agent opens one a replica on its one
// connection; a second is one that replaces it, its end not yet seen here.
// Without it one connection held its 32 streams at one replica: from one
// address 256 of the replica's stream places and their reviews, and the
// relay's connections to the replica dialed past the aggregator's bound
// of a relay's address.
const MaxStreamsPerReplica = 2

// DefaultAgentConnIdle is Config.AgentConnIdle's default: gRPC's
// MaxConnectionIdle of the agents' port, which any stream's end restarts
// (a refused one's too: a client sending a stream the relay refuses, at no
// cost and with no token, every few seconds held its connection for ever).
const DefaultAgentConnIdle = 30 * time.Second

// agentConn counts one agent connection's streams by the replica each
// names, and closes it once no stream has been forwarded on it for the
// relay's AgentConnIdle.
type agentConn struct {
	mu         sync.Mutex
	replicas   map[string]int
	conn       *trackedConn // nil: not tracked (a listener Track did not wrap)
	idle       time.Duration
	forwarding int
	last       time.Time // when the last stream forwarded ended, or the connection came
	timer      *time.Timer
	closed     prometheus.Counter // counts the idle closes
}

// begin and end bracket a stream on the connection from its replica's
// place taken (its setup, a lookup and a dial, is not idle); only a stream
// that was forwarded moves the connection's last use (a refused one, at
// no cost to its client, does not).
func (c *agentConn) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forwarding++
}

func (c *agentConn) end(forwarded bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forwarding--
	if forwarded {
		c.last = time.Now()
	}
}

// check closes the connection when it has been idle for c.idle, else
// looks again when it would be.
func (c *agentConn) check() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer == nil {
		return // the connection ended
	}
	if c.forwarding == 0 {
		if left := c.idle - time.Since(c.last); left > 0 {
			c.timer.Reset(left)
			return
		}
		_ = c.conn.Close()
		c.closed.Inc()
		return
	}
	c.timer.Reset(c.idle)
}

// stop ends the idle watch (the connection ended).
func (c *agentConn) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// take takes one of the connection's streams to addr; false when it has
// MaxStreamsPerReplica open.
func (c *agentConn) take(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replicas[addr] >= MaxStreamsPerReplica {
		return false
	}
	if c.replicas == nil {
		c.replicas = map[string]int{}
	}
	c.replicas[addr]++
	return true
}

// give gives back a stream take took.
func (c *agentConn) give(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replicas[addr]--; c.replicas[addr] <= 0 {
		delete(c.replicas, addr)
	}
}

type agentConnKey struct{}

// connOf is the agent connection a stream's context is of (nil on a
// server without connTagger).
func connOf(ctx context.Context) *agentConn {
	c, _ := ctx.Value(agentConnKey{}).(*agentConn)
	return c
}

// connTagger gives each agent connection its agentConn (its streams'
// contexts derive from the connection's), with its net.Conn when a
// listener Track wrapped accepted it.
type connTagger struct{ r *Relay }

func (t connTagger) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	c := &agentConn{idle: t.r.cfg.AgentConnIdle, last: time.Now()}
	if info.RemoteAddr != nil {
		if p, ok := t.r.pending.LoadAndDelete(info.RemoteAddr.String()); ok {
			c.mu.Lock()
			c.conn, c.closed = p.(*trackedConn), t.r.m.idleClosed
			c.timer = time.AfterFunc(c.idle, c.check)
			c.mu.Unlock()
		}
	}
	return context.WithValue(ctx, agentConnKey{}, c)
}

func (connTagger) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, end := s.(*stats.ConnEnd); end {
		if c := connOf(ctx); c != nil {
			c.stop()
		}
	}
}
func (connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (connTagger) HandleRPC(context.Context, stats.RPCStats) {}

// Track returns ln with each connection it accepts known to the relay
// until gRPC tags it (after its handshake) or it closes, so that its idle
// watch can close it (AgentConnIdle). Serve the agents' port on it. A
// connection gRPC reads into pooled buffers (netbound.Pooled's) keeps its
// ReadOnReady.
func (r *Relay) Track(ln net.Listener) net.Listener { return trackedListener{ln, r} }

type trackedListener struct {
	net.Listener
	r *Relay
}

func (l trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	key := c.RemoteAddr().String()
	tc := &trackedConn{Conn: c}
	tc.forget = func() { l.r.pending.CompareAndDelete(key, tc) }
	l.r.pending.Store(key, tc)
	if rr, ok := c.(readyReader); ok {
		return &trackedReadyConn{tc, rr}, nil
	}
	return tc, nil
}

// trackedConn forgets its connection once closed (a handshake that
// failed, a probe: never tagged).
type trackedConn struct {
	net.Conn
	forget func()
	once   sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(c.forget)
	return c.Conn.Close()
}

// readyReader is what gRPC reads into pooled buffers through.
type readyReader interface {
	ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error)
}

// trackedReadyConn is a trackedConn of a connection with ReadOnReady.
type trackedReadyConn struct {
	*trackedConn
	rr readyReader
}

func (c *trackedReadyConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	return c.rr.ReadOnReady(size, pool)
}
