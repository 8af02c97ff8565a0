//go:build linux

package netbound

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets tcp's TCP_USER_TIMEOUT to d: how long data it sent
// may stay unacknowledged before the kernel drops the connection.
func setUserTimeout(tcp *net.TCPConn, d time.Duration) error {
	raw, err := tcp.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}
