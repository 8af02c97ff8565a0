package aggregator

import (
	"math"
	"net"
	"sync"
	"sync/atomic"

	"github.com/pulse-io/pulse/pkg/netbound"
)

// limitListener accepts at most n connections at once, as
// golang.org/x/net/netutil.LimitListener does (past n, Accept waits for
// one to close; Close ends the wait). Unlike it, a plain TCP connection
// keeps its read buffer pooled (netbound.Ready: netutil's wrapper had
// every connection hold a 4 KiB read buffer of its own for its life).
//
// It also holds at most perIP connections from one remote address (its
// listener is a netbound.Listener of that bound alone): past it a new one
// from that address is closed at once (waiting would hold every agent
// behind one client's). The total alone let one client's connections,
// never authenticated (a stream's token is reviewed, a connection is
// not), take every place and hold the agents out.
type limitListener struct {
	net.Listener
	// byIP is the listener, bounding the connections of one address.
	byIP      *netbound.Listener
	sem       chan struct{}
	closeOnce sync.Once
	done      chan struct{}
	// readyReads counts ReadOnReady calls (gRPC's transport readers', and
	// the framed streams'): the tests that both take the pooled path read
	// it.
	readyReads atomic.Int64
}

func newLimitListener(l net.Listener, n, perIP int) *limitListener {
	byIP := netbound.New(l, math.MaxInt, perIP)
	return &limitListener{Listener: byIP, byIP: byIP, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		// Closed: the listener's own Accept fails at once. A connection it
		// hands over all the same is closed (netutil does the same).
		for {
			c, err := l.Listener.Accept()
			if err != nil {
				return nil, err
			}
			_ = c.Close()
		}
	case l.sem <- struct{}{}:
	}
	// A connection past its address's share is closed there, and the
	// place stays this one's, for the next.
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	lc := netbound.NewConn(c, func() { <-l.sem })
	return netbound.Ready(lc, &l.readyReads), nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}
