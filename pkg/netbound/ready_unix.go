//go:build unix

package netbound

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/mem"
)

// newReadyConn reads tcp, the connection within c, for gRPC; nil where
// its socket cannot be reached.
func newReadyConn(c net.Conn, tcp *net.TCPConn, reads *atomic.Int64) net.Conn {
	raw, err := tcp.SyscallConn()
	if err != nil {
		return nil
	}
	rc := &readyConn{Conn: c, raw: raw, reads: reads}
	rc.doRead = rc.read
	return rc
}

// readyConn is a TCP connection that gRPC reads into pooled buffers. Only
// gRPC's transport reader calls ReadOnReady, from one goroutine, so the
// read's state lives in the struct (and doRead is bound once): a read
// allocates nothing.
type readyConn struct {
	net.Conn
	raw    syscall.RawConn
	reads  *atomic.Int64
	doRead func(fd uintptr) bool

	pool mem.BufferPool
	size int
	buf  *[]byte
	n    int
	err  error

	// due: Unix ns past which no deadline set on it reaches, until one is
	// cleared (0: none; DueBy).
	due atomic.Int64
}

// SetDeadline is the connection's, no later than its due time (DueBy)
// until a deadline is cleared: a server's handshake sets one, and clears
// it when the handshake is done.
func (c *readyConn) SetDeadline(t time.Time) error {
	if due := c.due.Load(); due != 0 {
		if t.IsZero() {
			c.due.Store(0)
		} else if d := time.Unix(0, due); t.After(d) {
			t = d
		}
	}
	return c.Conn.SetDeadline(t)
}

// DueBy holds c's deadlines to by until one is cleared, where c is a
// connection Ready wrapped (false otherwise): the ingest port waits for a
// connection's first byte within the handshake's time, then hands it to
// gRPC, whose ConnectionTimeout set a second handshake time from then (a
// byte at the end of the wait held the place twice as long).
func DueBy(c net.Conn, by time.Time) bool {
	rc, ok := c.(*readyConn)
	if ok {
		rc.due.Store(by.UnixNano())
	}
	return ok
}

// ReadOnReady waits until the socket is readable, then takes a buffer of
// size bytes from pool and reads into it. It returns the buffer (for the
// caller to put back) and the bytes read; on an error or EOF no buffer.
func (c *readyConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	c.reads.Add(1)
	c.pool, c.size, c.buf, c.n, c.err = pool, size, nil, 0, nil
	err := c.raw.Read(c.doRead)
	buf, n, rerr := c.buf, c.n, c.err
	c.pool, c.buf, c.err = nil, nil, nil
	switch {
	case err != nil:
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case rerr != nil:
		return nil, 0, rerr
	case n == 0:
		// read(2) returns 0 at the peer's close: io.Reader's EOF.
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

// read is the raw connection's read callback: false asks the poller to
// wait until the socket is readable and call it again.
func (c *readyConn) read(fd uintptr) bool {
	c.buf = c.pool.Get(c.size)
	for {
		n, err := syscall.Read(int(fd), *c.buf)
		switch err {
		case nil:
			c.n = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			c.pool.Put(c.buf)
			c.buf = nil
			return false
		}
		c.pool.Put(c.buf)
		c.buf = nil
		c.err = err
		return true
	}
}

// Peek reads into b what c has received without taking it: the next read
// reads it again. It waits, within c's read deadline, until something has
// come; io.EOF when the peer closed before sending anything. ErrNoPeek
// where c is not a TCP connection Ready wrapped.
func Peek(c net.Conn, b []byte) (int, error) {
	rc, ok := c.(*readyConn)
	if !ok {
		return 0, ErrNoPeek
	}
	var n int
	var rerr error
	err := rc.raw.Read(func(fd uintptr) bool {
		for {
			n, _, rerr = syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK)
			switch rerr {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}
