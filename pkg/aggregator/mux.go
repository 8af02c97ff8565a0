package aggregator

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pulse-io/pulse/pkg/framed"
	"github.com/pulse-io/pulse/pkg/netbound"
)

// ingestMux serves the ingest port's two transports. A connection whose
// first byte is framed's (an agent with --transport=framed) is served in
// place by the framed server, in the goroutine that looked at it; any other
// (gRPC's, in plaintext or TLS: HTTP/2's preface or a TLS handshake) is
// handed, its bytes untouched, to the gRPC server through Accept.
//
// It looks without reading (netbound.Peek), so a gRPC connection keeps
// its pooled reads. A connection that sends nothing within
// handshakeTimeout is closed, as gRPC's ConnectionTimeout closes one that
// makes no handshake.
type ingestMux struct {
	ln     net.Listener // the bounded listener
	framed *framed.Server
	// conns counts the connections by transport (grpc, framed).
	conns *prometheus.CounterVec

	start     sync.Once
	grpc      chan net.Conn
	errc      chan error
	done      chan struct{}
	closeOnce sync.Once
	wait      time.Duration
}

func newIngestMux(ln net.Listener, fs *framed.Server, conns *prometheus.CounterVec) *ingestMux {
	for _, transport := range []string{"grpc", "framed"} {
		conns.WithLabelValues(transport) // at 0 from the start
	}
	return &ingestMux{ln: ln, framed: fs, conns: conns, grpc: make(chan net.Conn), errc: make(chan error), done: make(chan struct{}), wait: handshakeTimeout}
}

// Accept returns the next gRPC connection; the first call starts
// accepting.
func (m *ingestMux) Accept() (net.Conn, error) {
	m.start.Do(func() { go m.loop() })
	select {
	case c := <-m.grpc:
		return c, nil
	case err := <-m.errc:
		return nil, err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *ingestMux) Addr() net.Addr { return m.ln.Addr() }

// Close closes the listener and every framed connection, and waits for
// their handlers (an agent's stream cut loses nothing: it reconnects and
// lists its pods again).
func (m *ingestMux) Close() error {
	err := m.ln.Close()
	m.closeOnce.Do(func() {
		close(m.done)
		m.framed.Close()
	})
	return err
}

// loop accepts until the listener fails, handing its errors to Accept (a
// temporary one, such as too many open files, is retried by gRPC's Serve).
func (m *ingestMux) loop() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case m.errc <- err:
			case <-m.done:
				return
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				continue
			}
			return
		}
		go m.route(c)
	}
}

// route serves c with the transport its first byte names.
func (m *ingestMux) route(c net.Conn) {
	var b [1]byte
	// The wait is the handshake's: the framed one is due by its end too.
	by := time.Now().Add(m.wait)
	_ = c.SetReadDeadline(by)
	_, err := netbound.Peek(c, b[:])
	_ = c.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, netbound.ErrNoPeek):
		// Not a TCP connection this listener can look at: gRPC's.
	case err != nil:
		_ = c.Close() // nothing came in time, or the peer closed
		return
	case b[0] == framed.FirstByte:
		m.conns.WithLabelValues("framed").Inc()
		m.framed.ServeConnBy(c, by)
		return
	}
	m.conns.WithLabelValues("grpc").Inc()
	// gRPC's handshake is due by the wait's end too (its ConnectionTimeout
	// would start anew).
	netbound.DueBy(c, by)
	select {
	case m.grpc <- c:
	case <-m.done:
		_ = c.Close()
	}
}
