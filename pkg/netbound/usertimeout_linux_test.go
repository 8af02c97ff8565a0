//go:build linux

package netbound

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestABoundedConnectionHasItsUserTimeout: gRPC sets its keepalive's
// timeout as a connection's TCP_USER_TIMEOUT on a *net.TCPConn only, and
// a bounded listener's connections are wrapped: every ingest, scaler and
// relay connection had none (a dead peer's socket retransmitted for about
// 15 minutes). The bounded listener sets it.
func TestABoundedConnectionHasItsUserTimeout(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	for _, want := range []time.Duration{0, 10 * time.Second} {
		ln := New(raw, 10, 10)
		ln.UserTimeout = want
		d, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		sc, err := tcpOf(c).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		if err := sc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) }); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		if got != int(want.Milliseconds()) {
			t.Errorf("UserTimeout %s: the connection's TCP_USER_TIMEOUT is %d ms", want, got)
		}
		_, _ = c.Close(), d.Close()
	}
}
