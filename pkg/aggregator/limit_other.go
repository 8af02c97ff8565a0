//go:build !unix

package aggregator

import (
	"net"
	"sync/atomic"

	"github.com/pulse-io/pulse/pkg/netbound"
)

// newReadyConn: gRPC's pooled reads are for Unix sockets only.
func newReadyConn(*netbound.Conn, *atomic.Int64) net.Conn { return nil }
