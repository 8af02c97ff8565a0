package agent

import (
	"net"
	"sync"
)

// The agent's HTTP port (/metrics, /livez, /readyz) is reachable from any
// pod of the cluster (the chart has no NetworkPolicy for it). Each
// connection held costs a goroutine and its buffers, about 19 KiB, for up to
// the server's IdleTimeout: one pod opening thousands took the agent past
// its 128Mi limit, and every tenant of the node lost its scraping with it.
// The port holds at most maxHTTPConns connections, and at most
// maxHTTPConnsPerIP from one address, so that one client cannot take the
// room of the kubelet's probes (from the node's address) or Prometheus's.
const (
	maxHTTPConns      = 256
	maxHTTPConnsPerIP = 16
)

// boundedListener accepts connections within the bounds above; past them
// a connection is closed at once (waiting would hold the probes behind it).
type boundedListener struct {
	net.Listener
	mu            sync.Mutex
	all           int
	byIP          map[string]int
	maxAll, maxIP int
}

func newBoundedListener(l net.Listener, maxAll, maxIP int) *boundedListener {
	return &boundedListener{Listener: l, byIP: map[string]int{}, maxAll: maxAll, maxIP: maxIP}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
		l.mu.Lock()
		ok := l.all < l.maxAll && l.byIP[ip] < l.maxIP
		if ok {
			l.all++
			l.byIP[ip]++
		}
		l.mu.Unlock()
		if !ok {
			_ = c.Close()
			continue
		}
		return &boundedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *boundedListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// boundedConn gives its room back once, at its first Close.
type boundedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
