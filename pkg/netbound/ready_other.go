//go:build !unix

package netbound

import (
	"net"
	"sync/atomic"
	"time"
)

// newReadyConn: this wrapper reads Unix sockets only (gRPC gives any
// other connection a read buffer of its own).
func newReadyConn(net.Conn, *net.TCPConn, *atomic.Int64) net.Conn { return nil }

// Peek: this wrapper peeks at Unix sockets only.
func Peek(net.Conn, []byte) (int, error) { return 0, ErrNoPeek }

// DueBy: this wrapper holds the deadlines of Unix sockets only.
func DueBy(net.Conn, time.Time) bool { return false }
