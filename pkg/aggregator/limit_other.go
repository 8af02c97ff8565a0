//go:build !unix

package aggregator

import (
	"net"
	"sync/atomic"
)

// newReadyConn: gRPC's pooled reads are for Unix sockets only.
func newReadyConn(*limitConn, *atomic.Int64) net.Conn { return nil }
