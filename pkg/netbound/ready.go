package netbound

import (
	"errors"
	"net"
	"sync/atomic"
)

// Pooled is a listener whose TCP connections gRPC reads into pooled
// buffers. gRPC (v1.84 on) reads a connection that is a *net.TCPConn, or
// that has a ReadOnReady method, into a buffer it takes from a pool only
// once the socket is readable and gives back once the bytes are consumed;
// any other connection, a bounded listener's wrapper included, gets a
// buffer of grpc.ReadBufferSize (4 KiB on pulse's gRPC ports) of its own
// for its life, most of it idle: an agent's stream carries a few hundred
// bytes a second. Pooled's connections have ReadOnReady, which reads as
// gRPC's own does (google.golang.org/grpc/internal/transport/readyreader).
// A TLS port's connections are read through crypto/tls, which has buffers
// of its own, and are not affected.
type Pooled struct {
	net.Listener
	// Reads counts ReadOnReady calls: the test that gRPC takes the pooled
	// path reads it.
	Reads atomic.Int64
}

// NewPooled wraps l, a bounded listener (or any whose connections are
// *Conn or *net.TCPConn).
func NewPooled(l net.Listener) *Pooled { return &Pooled{Listener: l} }

// Accept returns the next connection, with ReadOnReady where it is TCP.
func (l *Pooled) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Ready(c, &l.Reads), nil
}

// Ready wraps c so that gRPC reads it into pooled buffers, counting each
// read in reads, where c is a TCP connection, bare or within *Conn (one or
// more: a listener's bound within another's); any other connection is
// returned as it is. Closing the result closes c (and gives its rooms
// back).
func Ready(c net.Conn, reads *atomic.Int64) net.Conn {
	tcp := tcpOf(c)
	if tcp == nil {
		return c
	}
	if rc := newReadyConn(c, tcp, reads); rc != nil {
		return rc
	}
	return c
}

// tcpOf is the TCP connection c is, bare or within *Conn (one or more);
// nil for any other.
func tcpOf(c net.Conn) *net.TCPConn {
	for {
		b, ok := c.(*Conn)
		if !ok {
			break
		}
		c = b.Conn
	}
	tcp, _ := c.(*net.TCPConn)
	return tcp
}

// ErrNoPeek: Peek cannot look at this connection's bytes.
var ErrNoPeek = errors.New("netbound: this connection cannot be peeked at")
