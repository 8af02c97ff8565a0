//go:build !unix

package netbound

import (
	"net"
	"sync/atomic"
)

// newReadyConn: gRPC's pooled reads are for Unix sockets only.
func newReadyConn(net.Conn, *net.TCPConn, *atomic.Int64) net.Conn { return nil }
