package aggregator

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/netbound"
)

// scalerConns charges each of the scaler port's connections to the
// namespaces its calls name, so that a port full in all makes room for a
// new connection by closing one of the namespaces past their share
// (netbound.Listener.Evict).
//
// KEDA's operator keeps a connection for each scaler address and TLS
// setting its triggers write, and a tenant writes its own triggers: about
// 1,024 spellings of the aggregator's address (128 ScaledObjects of 8
// triggers; KEDA's verified connections are out of the bound by address)
// filled the port, and the connection every other tenant's triggers share
// was closed at once when it next connected (an aggregator's restart),
// their ScaledObjects falling to KEDA's fallback.
//
// A connection may be closed for room once it has made a call, when every
// namespace it names holds more than its share of the port: the port's
// bound over the namespaces charged and one more, the new connection's
// (unknown until its first call; counted, a tenant whose spellings hold
// the whole port, the shared connection out, is past its share). First
// one whose calls named no namespace (refused, past the request's bound:
// it serves none) that has made calls for a settling time, then one
// charged for it, then one not yet settled (the shared connection's first
// calls after a restart may be one tenant's alone, and it is among the
// first to connect again), then one of no namespace not yet settled, and
// last one that has made no call within a grace (KEDA connects again at
// once to an address whose connection closed, and calls only when one of
// its streams retries, up to a minute later). Of those, the one naming
// the namespace holding the most goes, the fewest named, the oldest first
// (the newest first, not settled). Tenants' namespaces acting together
// are each past their share, and so is each of their connections,
// whatever namespaces of theirs it names.
type scalerConns struct {
	mu    sync.Mutex
	conns map[string]*scalerConn // by remote and local address
	byNS  map[string]int         // the connections naming a namespace
	seq   uint64
	// most is the port's bound in all; settle the time a connection is
	// charged before it may be closed for room; grace the time one that
	// has made no call is kept out of it.
	most          int
	settle, grace time.Duration
	// evicted counts the connections closed for room.
	evicted prometheus.Counter
	log     *slog.Logger
	logged  time.Time
}

// scalerConn is one connection of the scaler port.
type scalerConn struct {
	c     net.Conn            // the tracked connection: its Close forgets it
	names map[string]struct{} // the namespaces its calls named
	since atomic.Int64        // its first call's, Unix ns (0: none yet)
	added time.Time           // accepted
	gone  bool                // closed: charged to none
	seq   uint64              // the order accepted
}

func newScalerConns(most int, settle, grace time.Duration, evicted prometheus.Counter, log *slog.Logger) *scalerConns {
	return &scalerConns{conns: map[string]*scalerConn{}, byNS: map[string]int{}, most: most, settle: settle, grace: grace,
		evicted: evicted, log: log}
}

func connKey(remote, local net.Addr) string {
	if remote == nil || local == nil {
		return ""
	}
	return remote.String() + "|" + local.String()
}

// scalerListener is the scaler port's bounded listener, each connection
// it accepts held in conns until it is closed.
type scalerListener struct {
	*netbound.Listener
	conns *scalerConns
}

func (l scalerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.conns.add(c), nil
}

// add holds c, and is c as the server is to use it.
func (s *scalerConns) add(c net.Conn) net.Conn {
	key := connKey(c.RemoteAddr(), c.LocalAddr())
	rec := &scalerConn{added: time.Now()}
	t := &trackedConn{Conn: c}
	t.done = func() { s.remove(key, rec) }
	rec.c = t
	s.mu.Lock()
	s.seq++
	rec.seq = s.seq
	s.conns[key] = rec
	s.mu.Unlock()
	return t
}

// remove forgets rec, closed.
func (s *scalerConns) remove(key string, rec *scalerConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns[key] == rec {
		delete(s.conns, key)
	}
	for ns := range rec.names {
		if s.byNS[ns]--; s.byNS[ns] <= 0 {
			delete(s.byNS, ns)
		}
	}
	rec.names, rec.gone = nil, true
}

// called records rec's call, whatever it names (and one refused before
// it is read: past the request's bound). Without the lock: it is on
// every call's path.
func (s *scalerConns) called(rec *scalerConn) {
	if rec.since.Load() == 0 {
		rec.since.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// charge records that rec's call named namespace ns.
func (s *scalerConns) charge(rec *scalerConn, ns string) {
	s.mu.Lock()
	_, known := rec.names[ns]
	s.mu.Unlock()
	if known || len(validation.IsDNS1123Label(ns)) > 0 {
		return // charged, or no namespace: the call is refused as such
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := rec.names[ns]; ok || rec.gone {
		return
	}
	if rec.names == nil {
		rec.names = map[string]struct{}{}
	}
	ns = strings.Clone(ns)
	rec.names[ns] = struct{}{}
	s.byNS[ns]++
}

// evict closes a connection of no namespace or whose namespaces are all
// past their share (scalerConns), and says whether it did.
func (s *scalerConns) evict() bool {
	s.mu.Lock()
	share := float64(s.most) / float64(len(s.byNS)+1)
	now := time.Now()
	settled, graced := now.Add(-s.settle), now.Add(-s.grace)
	var best candidate
	for _, rec := range s.conns {
		if c := s.rank(rec, share, settled, graced); c.rec != nil && c.before(best) {
			best = c
		}
	}
	logIt := best.rec != nil && time.Since(s.logged) >= time.Minute
	if logIt {
		s.logged = time.Now()
	}
	s.mu.Unlock()
	if best.rec == nil {
		return false
	}
	_ = best.rec.c.Close()
	s.evicted.Inc()
	if logIt {
		s.log.Warn("the scaler port is full: a connection is closed for a new one, its namespaces all past their share, or none named (logged once a minute)",
			logging.KeyNamespace, best.top, logging.KeyConns, best.most, logging.KeyNamespaces, best.names)
	}
	return true
}

// candidate is a connection that may be closed for room, and its rank.
type candidate struct {
	rec *scalerConn
	// class: 0, its calls named no namespace (settled); 1, settled; 2,
	// not yet settled; 3, its calls named no namespace, not yet settled;
	// 4, no call within the grace (KEDA connects again at once to an
	// address whose connection closed, and calls when a stream retries).
	class int
	most  int    // the connections of the namespace it names holding the most
	top   string // that namespace
	names int    // the namespaces it names
}

// rank is rec as a candidate (rec nil: it may not be closed for room).
func (s *scalerConns) rank(rec *scalerConn, share float64, settled, graced time.Time) candidate {
	since := rec.since.Load()
	switch {
	case rec.gone:
		return candidate{}
	case since == 0 && rec.added.After(graced):
		return candidate{} // a new connection, its first call to come
	case since == 0:
		return candidate{rec: rec, class: 4}
	}
	c := candidate{rec: rec, class: 1, names: len(rec.names)}
	if since > settled.UnixNano() {
		c.class = 2
	}
	if len(rec.names) == 0 {
		if c.class == 1 {
			c.class = 0
		} else {
			c.class = 3
		}
		return c
	}
	for ns := range rec.names {
		if float64(s.byNS[ns]) <= share {
			return candidate{}
		}
		if s.byNS[ns] > c.most {
			c.most, c.top = s.byNS[ns], ns
		}
	}
	return c
}

// before says whether c goes before o (o's rec nil: c goes).
func (c candidate) before(o candidate) bool {
	switch {
	case o.rec == nil:
		return true
	case c.class != o.class:
		return c.class < o.class
	case c.most != o.most:
		return c.most > o.most
	case c.names != o.names:
		return c.names < o.names
	case c.class >= 2:
		return c.rec.seq > o.rec.seq // not settled: the newest first
	}
	return c.rec.seq < o.rec.seq
}

// trackedConn is a scaler port's connection, forgotten at its first Close.
type trackedConn struct {
	net.Conn
	once sync.Once
	done func()
}

func (t *trackedConn) Close() error {
	err := t.Conn.Close()
	t.once.Do(t.done)
	return err
}

// Exempt is the bounded connection's (verifiedUnbound).
func (t *trackedConn) Exempt() {
	if e, ok := t.Conn.(exempter); ok {
		e.Exempt()
	}
}

// exempter is a connection that can be taken out of its address's bound
// (netbound.Conn).
type exempter interface{ Exempt() }

// connOf is the scaler port's record of the connection a call came on.
type connOf struct{}

// tagger is the scaler server's stats handler: it puts each connection's
// record in the context its calls' derive from.
type tagger struct{ conns *scalerConns }

func (g tagger) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	g.conns.mu.Lock()
	rec := g.conns.conns[connKey(info.RemoteAddr, info.LocalAddr)]
	g.conns.mu.Unlock()
	if rec == nil {
		return ctx
	}
	return context.WithValue(ctx, connOf{}, rec)
}

func (tagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (tagger) HandleConn(context.Context, stats.ConnStats)                     {}

// HandleRPC records each call's beginning on its connection, whatever it
// names: a call refused before it is read (past the request's bound) names
// none, and its connection goes first for room.
func (g tagger) HandleRPC(ctx context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.Begin); !ok {
		return
	}
	if rec, ok := ctx.Value(connOf{}).(*scalerConn); ok {
		g.conns.called(rec)
	}
}

// refNamespace is the namespace a KEDA call names ("" none: a health
// check).
func refNamespace(req any) string {
	switch r := req.(type) {
	case *externalscaler.ScaledObjectRef:
		return r.GetNamespace()
	case *externalscaler.GetMetricsRequest:
		return r.GetScaledObjectRef().GetNamespace()
	}
	return ""
}

// chargeUnary charges a call's connection to the namespace it names.
func (s *scalerConns) chargeUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if rec, ok := ctx.Value(connOf{}).(*scalerConn); ok {
		if ns := refNamespace(req); ns != "" {
			s.charge(rec, ns)
		}
	}
	return handler(ctx, req)
}

// chargeStream charges a stream's connection to the namespace its request
// names.
func (s *scalerConns) chargeStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if rec, ok := ss.Context().Value(connOf{}).(*scalerConn); ok {
		ss = &chargedStream{ServerStream: ss, charge: func(m any) {
			if ns := refNamespace(m); ns != "" {
				s.charge(rec, ns)
			}
		}}
	}
	return handler(srv, ss)
}

// chargedStream charges its connection at each message received.
type chargedStream struct {
	grpc.ServerStream
	charge func(any)
}

func (c *chargedStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if err == nil {
		c.charge(m)
	}
	return err
}
