// Package netbound bounds the connections an HTTP port holds: in all, and
// from one address. A port reachable from any pod of a shared cluster (the
// agent's /metrics, /livez and /readyz; the aggregator's health, http and
// debug ports) held every connection for up to its server's IdleTimeout,
// about 10 to 19 KiB each: one pod opening thousands took the process past
// its memory limit, and every tenant's signal with it. It also resolves an
// aggregator's name into addresses: for the agent's streams (Resolve, one
// IP family) and the relay's allow-list (ResolveAll, both).
package netbound

import (
	"net"
	"sync"
	"time"
)

// Listener accepts connections within its bounds; past them a connection
// is closed at once (waiting would hold the kubelet's probes, from another
// address, behind a flood).
type Listener struct {
	net.Listener
	// OnRefuse, when set (before the first Accept), is called with the
	// address of each connection closed past a bound, and whether the
	// bound was the port's in all (else the address's share): a refusal
	// that nothing counted left a client that shares its address with
	// others (a sidecar's, a translated one) with no word of why.
	OnRefuse func(ip string, all bool)
	// UserTimeout, when set (before the first Accept), is each TCP
	// connection's TCP_USER_TIMEOUT: gRPC sets its keepalive's timeout so
	// on a *net.TCPConn only, and a bounded one is wrapped, so that a dead
	// peer's socket and its unacknowledged bytes stayed in the kernel,
	// retransmitted for about 15 minutes (tcp_retries2), where gRPC's own
	// listener would have dropped it after the timeout.
	UserTimeout time.Duration
	// Evict, when set (before the first Accept), is asked for room when
	// the port is full in all: it closes one connection it holds of less
	// worth than a new one (the scaler port's: one whose namespaces are
	// all past their share) and says whether it did; else the new one is
	// closed.
	Evict         func() bool
	mu            sync.Mutex
	all           int
	byIP          map[string]int
	maxAll, maxIP int
}

// New bounds l to maxAll connections held at once, maxIP of them from one
// address.
func New(l net.Listener, maxAll, maxIP int) *Listener {
	return &Listener{Listener: l, byIP: map[string]int{}, maxAll: maxAll, maxIP: maxIP}
}

// Accept returns the next connection within the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
		full, ipRoom, ok := l.take(ip)
		if !ok && full && ipRoom && l.Evict != nil && l.Evict() {
			full, _, ok = l.take(ip) // the evicted one's place
		}
		if !ok {
			_ = c.Close()
			if l.OnRefuse != nil {
				l.OnRefuse(ip, full)
			}
			continue
		}
		if tcp := tcpOf(c); tcp != nil && l.UserTimeout > 0 {
			_ = setUserTimeout(tcp, l.UserTimeout) // as gRPC: best effort
		}
		bc := NewConn(c, l.releaseAll)
		bc.byIP = func() { l.releaseIP(ip) }
		return bc, nil
	}
}

// take takes a place for a connection from ip (ok): full, the port's bound
// in all is met; ipRoom, the address's is not.
func (l *Listener) take(ip string) (full, ipRoom, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	full, ipRoom = l.all >= l.maxAll, l.byIP[ip] < l.maxIP
	if ok = !full && ipRoom; ok {
		l.all++
		l.byIP[ip]++
	}
	return full, ipRoom, ok
}

// HeldFrom is the number of connections held now from address ip.
func (l *Listener) HeldFrom(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byIP[ip]
}

// Held is the number of connections held now.
func (l *Listener) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all
}

// releaseAll gives back a connection's place in all.
func (l *Listener) releaseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all--
}

// releaseIP gives back a connection's place among its address's.
func (l *Listener) releaseIP(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// Conn is a connection that gives its room back once, at its first Close
// (a bounded listener's: this one's, and the aggregator's ingest port's).
type Conn struct {
	net.Conn
	mu      sync.Mutex
	closed  bool
	release func()
	// byIP, a Listener's connection's, gives back its place among its
	// address's: at Close, or at Exempt (nil after).
	byIP func()
}

// NewConn wraps c so that its first Close calls release.
func NewConn(c net.Conn, release func()) *Conn { return &Conn{Conn: c, release: release} }

// Exempt takes a Listener's connection out of its address's bound, its
// place in the Listener's bound in all kept: for a client the port has
// authenticated whose connections a tenant can multiply (KEDA's operator
// keeps one a scaler address, which a tenant's trigger writes: one
// tenant's spellings of the address took every place KEDA's address had
// on the scaler port, and the connection every other tenant's triggers
// share was closed at its next connect). Once, and nothing after Close.
func (c *Conn) Exempt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && c.byIP != nil {
		c.byIP()
		c.byIP = nil
	}
}

// Close closes the connection and gives its room back (once).
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.release()
		if c.byIP != nil {
			c.byIP()
		}
	}
	return err
}
