package relay

import (
	"context"
	"sync"

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

// agentConn counts one agent connection's streams by the replica each
// names.
type agentConn struct {
	mu       sync.Mutex
	replicas map[string]int
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
// contexts derive from the connection's).
type connTagger struct{}

func (connTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, agentConnKey{}, &agentConn{})
}
func (connTagger) HandleConn(context.Context, stats.ConnStats) {}
func (connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (connTagger) HandleRPC(context.Context, stats.RPCStats) {}
