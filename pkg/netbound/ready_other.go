//go:build !unix

package netbound

import (
	"net"
	"sync/atomic"
)

// newReadyConn: this wrapper reads Unix sockets only (gRPC gives any
// other connection a read buffer of its own).
func newReadyConn(net.Conn, *net.TCPConn, *atomic.Int64) net.Conn { return nil }

// Peek: this wrapper peeks at Unix sockets only.
func Peek(net.Conn, []byte) (int, error) { return 0, ErrNoPeek }
